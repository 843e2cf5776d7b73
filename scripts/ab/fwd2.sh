# bash scripts/ab/fwd2.sh (device, one call; source .gpu1/activate.sh first): matrix of fw,
# gates, then fwd timing old / fw / fw / old (fw = tlx-fwd-arrive)
R=$PWD; S=$R/.snap; K=$(cd "$(dirname "$0")" && pwd)/arrive_cells.py
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
F="warn\|exe_args\|run_backward\|INTERNAL ASSERT"
arm() { (cd $R && PYTHONPATH=$S/$1:$R timeout ${TO:-200} python $K "$@" 2>&1 | grep -v -i "$F"); }
mtx() { rm -rf /tmp/m_$1 && mkdir -p /tmp/m_$1 && cp -r $R/tests $R/pyproject.toml /tmp/m_$1/
  for i in 0 1 2 3; do (cd /tmp/m_$1 && PYTHONPATH=$S/$1:$R JAGGED_MATRIX_N=${MN:-40} \
    JAGGED_MATRIX_SEED=${MS:-7} JAGGED_MATRIX_SHARD=$i/4 timeout ${MT:-200} python -m pytest -q \
    -m gpu -p no:cacheprovider tests/test_gpu_matrix.py -k tlx 2>&1 | tail -3 | sed "s/^/$1 $i: /") & done; }
T0=$SECONDS; echo "=== start $(date +%T)"
mtx fw
arm fw tlx fwd g 0 1 4 6 8
wait; echo "=== gated $(date +%T) $((SECONDS - T0)) s"
for a in old fw fw old; do arm $a tlx fwd t ${FCELLS:-0 1 2 4 8}; done
echo "=== end $(date +%T) $((SECONDS - T0)) s"
