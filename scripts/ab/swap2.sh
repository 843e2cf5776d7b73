# bash .snap/kit/swap2.sh: the fp8 GPU tests of dswap (their errors), then CELLS2 dmain / dswap / dswap / dmain
R=$PWD; S=$R/.snap; K=$(cd "$(dirname "$0")" && pwd)/swap_cells.py
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True CELLS2=1
F="warn\|exe_args\|INTERNAL ASSERT"
arm() { (cd /tmp && PYTHONPATH=$S/$1:$R timeout ${TO:-120} python $K "$@" 2>&1 | grep -v -i "$F"); }
T0=$SECONDS; echo "=== start $(date +%T)"; nvidia-smi --query-gpu=name --format=csv,noheader
rm -rf /tmp/ts && mkdir /tmp/ts && cp -r $R/tests $R/pyproject.toml /tmp/ts/
(cd /tmp/ts && PYTHONPATH=$S/dswap:$R timeout 150 python -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_decode_tlx.py -k "fp8_gpu" --tb=short 2>&1 | grep -i "mismatch\|greatest\|^FAILED\|passed\|_ test_" | head -40)
echo "=== tested $(date +%T) $((SECONDS - T0)) s"
for a in dmain dswap dswap dmain; do arm $a; done
echo "=== end $(date +%T) $((SECONDS - T0)) s"
