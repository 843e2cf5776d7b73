# (The head-runs tree now is main; its snap phase read the branch head-runs.)
# A/B of branch head-runs against main (PERF gap 16), with the per-call times first.
#   here, from main's checkout:  bash <(git show ab-bwd-cells:scripts/ab/head_runs.sh) snap
#   device call 1 (carry .gpu1 .snap):  source .gpu1/activate.sh; bash .snap/kit/scripts/ab/head_runs.sh tlx
#   device call 2 at once (carry .gpu2 .snap):  source .gpu2/activate.sh; bash .snap/kit/scripts/ab/head_runs.sh cute
#   then, on the same warm machine (no carry; export TRITON_PTXAS_PATH):  ... head_runs.sh cutet,
#   ... head_runs.sh ncu (L2 hit rates; harness.gpu.ncu_sass)
# Trees: main = the checkout, hr = .snap/hr (jagged, kernels_tlx, kernels_cute of head-runs)
# over it. Gates run two processes at a time (five at once ran an H100 out of memory).
R=$PWD; export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
K=$R/.snap/kit/scripts/ab
arm() {  # arm <tag> <backend> <mode>: bwd_cells.py in tree <tag>
  local pp=$R; [ $1 = hr ] && pp=$R/.snap/hr:$R
  (cd $R && PYTHONPATH=$pp timeout ${T:-200} python $K/bwd_cells.py $1 $2 $3 2>&1 | grep -v -i "warn\|exe_args\|run_backward")
}
calls() {  # calls <tag> <backends>: per-call times of llm B8 H16 8192 non-causal
  local pp=$R; [ $1 = hr ] && pp=$R/.snap/hr:$R
  (cd $R && PYTHONPATH=$pp timeout 150 python $K/llm_nc_calls.py $2 24 2>&1 | grep -v -i "warn\|exe_args\|run_backward" | sed "s/^/$1 /")
}
case $1 in
snap) rm -rf .snap/kit .snap/hr; mkdir -p .snap/kit .snap/hr
      git archive ab-bwd-cells scripts/ab | tar x -C .snap/kit
      git archive head-runs jagged kernels_tlx kernels_cute | tar x -C .snap/hr
      du -sb .snap;;
tlx) calls main tlx; calls hr tlx
     arm main tlx cg & arm hr tlx cg & wait; arm main tlx ng & arm hr tlx ng & wait
     for t in main hr hr main; do arm $t tlx cnt; done;;
cute) calls main cute,fa4; calls hr cute
      arm main cute cg & arm hr cute cg & wait; arm main cute ng & arm hr cute ng & wait;;
cutet) for t in main hr fa4 hr main; do b=cute; [ $t = fa4 ] && b=fa4; arm $t $b cnt; done;;
ncu) # after `cute` on the same machine (.gpu2): the L2 hit rate of each main kernel
     (cd $R && timeout 500 python -m harness.gpu.ncu_sass run --backends cute,fa4,tlx \
        --passes bwd --suite llm-dense --match "B8 H16/16 D128 Lq8192 Lk8192 s1 bf16" \
        --out $OUT/ncu 2>&1 | grep -v -i "warn\|exe_args\|run_backward");;
esac
