# runs.sh <backend> [fa4]: gate the checkout (new) on the run cells, then time old / new / new / old
# (old = .snap/old: jagged, kernels_tlx, kernels_cute of the tree before the head runs, 659528e;
#  device call 1 carries .gpu1 .snap, call 2 .gpu2 .snap: source .gpuN/activate.sh first)
R=$PWD; export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
K=$R/.snap/kit/scripts/ab
arm() { local pp=$R; [ $1 = old ] && pp=$R/.snap/old:$R
  (cd $R && PYTHONPATH=$pp timeout ${T:-120} python $K/runs_cells.py $1 $2 $3 2>&1 | grep -v -i "warn\|exe_args\|run_backward\|INTERNAL ASSERT"); }
arm new $1 g
for t in old new new old; do arm $t $1 t; done
[ -n "$2" ] && arm new fa4 t
