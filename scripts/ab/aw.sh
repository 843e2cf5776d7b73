# bash .snap/kit/aw.sh (device, one call; TLX). aw = main's kernels_tlx with tlx-fwd-arrive's
# forward (k_empty / v_empty warp barriers) and tlx-dq-arrive's backward (dq_full a warp
# barrier). GPU matrix of aw and its gates, then eager timing old / aw / aw / old, fwd and bwd.
R=$PWD; S=$R/.snap; K=$S/kit/arrive_cells.py
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
F="warn\|exe_args\|run_backward\|INTERNAL ASSERT"
arm() { (cd $R && PYTHONPATH=$S/$1:$R timeout ${TO:-120} python $K "$@" 2>&1 | grep -v -i "$F"); }
T0=$SECONDS; echo "=== start $(date +%T)"; nvidia-smi --query-gpu=name --format=csv,noheader
rm -rf /tmp/m_aw && mkdir -p /tmp/m_aw && cp -r $R/tests $R/pyproject.toml /tmp/m_aw/
for i in 0 1 2; do (cd /tmp/m_aw && PYTHONPATH=$S/aw:$R JAGGED_MATRIX_N=${MN:-30} \
  JAGGED_MATRIX_SEED=${MS:-11} JAGGED_MATRIX_SHARD=$i/3 timeout ${MT:-170} python -m pytest -q \
  -m gpu -p no:cacheprovider tests/test_gpu_matrix.py -k tlx 2>&1 | tail -2 | sed "s/^/aw $i: /") & done
(arm aw tlx fwd g 0 1 8; arm aw tlx bwd g 0 1 6) &
wait; echo "=== gated $(date +%T) $((SECONDS - T0)) s"
for a in old aw aw old; do arm $a tlx fwd t ${FCELLS:-0 1 8}; arm $a tlx bwd t ${BCELLS:-0 1 6}; done
echo "=== end $(date +%T) $((SECONDS - T0)) s"
