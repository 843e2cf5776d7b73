# bash scripts/ab/bwd2.sh (device, one call; source .gpu1/activate.sh first): matrix of wa and qe,
# gates, then bwd timing old / wa / qe / qe / wa / old (wa = tlx-dq-arrive, qe = tlx-q-early)
R=$PWD; S=$R/.snap; K=$(cd "$(dirname "$0")" && pwd)/arrive_cells.py
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
F="warn\|exe_args\|run_backward\|INTERNAL ASSERT"
arm() { (cd $R && PYTHONPATH=$S/$1:$R timeout ${TO:-200} python $K "$@" 2>&1 | grep -v -i "$F"); }
mtx() { rm -rf /tmp/m_$1 && mkdir -p /tmp/m_$1 && cp -r $R/tests $R/pyproject.toml /tmp/m_$1/
  for i in 0 1 2 3; do (cd /tmp/m_$1 && PYTHONPATH=$S/$1:$R JAGGED_MATRIX_N=${MN:-40} \
    JAGGED_MATRIX_SEED=${MS:-7} JAGGED_MATRIX_SHARD=$i/4 timeout ${MT:-200} python -m pytest -q \
    -m gpu -p no:cacheprovider tests/test_gpu_matrix.py -k tlx 2>&1 | tail -3 | sed "s/^/$1 $i: /") & done; }
T0=$SECONDS; echo "=== start $(date +%T)"
mtx wa; mtx qe
arm wa tlx bwd g 0 1 4 6 7; arm qe tlx bwd g 0 1 4 6 7
wait; echo "=== gated $(date +%T) $((SECONDS - T0)) s"
for a in old wa qe qe wa old; do arm $a tlx bwd t ${BCELLS:-0 1 2 6 7}; done
echo "=== end $(date +%T) $((SECONDS - T0)) s"
