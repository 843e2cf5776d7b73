# bash .snap/kit/dq.sh <phase> ...  (device; source .gpu1/activate.sh first)
# (the kit: scripts/ab/dq.sh and dq_cells.py copied into .snap/kit, the arms into .snap/<arm>/kernels_tlx)
# arms: old = main's kernels_tlx, dq = branch dq-rows's, dk = dq-rows-dk's (.snap/<arm>)
R=$PWD; S=$R/.snap; export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
F="warn\|exe_args\|run_backward\|INTERNAL ASSERT"
arm() { (cd $R && PYTHONPATH=$S/$1:$R timeout ${TO:-200} python $S/kit/dq_cells.py "$@" 2>&1 | grep -v -i "$F"); }
mtx() { rm -rf /tmp/m_$1 && mkdir -p /tmp/m_$1 && cp -r $R/tests $R/pyproject.toml /tmp/m_$1/
  for i in 0 1 2 3; do (cd /tmp/m_$1 && PYTHONPATH=$S/$1:$R JAGGED_MATRIX_N=${MN:-60} JAGGED_MATRIX_SEED=${MS:-7} JAGGED_MATRIX_SHARD=$i/4 \
       timeout ${MT:-240} python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_matrix.py -k tlx 2>&1 | tail -2 | sed "s/^/$1 $i: /") & done; }
for ph in "$@"; do echo "=== $ph $(date +%T)"; case $ph in
mtx) mtx dq; mtx dk; wait;;
gate) for a in ${ARMS:-dq dk}; do arm $a tlx g $CELLS; done;;
time) for a in ${ORDER:-old dq dk dk dq old}; do arm $a tlx t $CELLS; done;;
all) T0=$SECONDS; MN=${MN:-40}; mtx dq; mtx dk
    for a in dq dk; do arm $a tlx g; done; wait; echo "=== gated $(date +%T)"
    for a in ${ORDER:-old dq dk dk dq old}; do arm $a tlx t $TCELLS; done
    [ $((SECONDS - T0)) -lt ${B7AT:-500} ] && bash $0 b7;;
b7) (cd $R && PYTHONPATH=$R timeout 150 python $S/kit/b7_host.py "B7 H8/1 D64" "B13 H2/2 D128" 2>&1 | grep -v -i "$F");;
esac; done; echo "=== end $(date +%T)"
