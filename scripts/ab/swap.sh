# bash .snap/kit/swap.sh (device, one call of ~300-400 s; source .gpu1/activate.sh first).
# dmain = main's kernels_tlx, dswap = exp-decode-swap's (fp8 caches at 16 / 32 rows: keys
# as the wgmma's M, an e4m3 q straight into an fp8 wgmma). GPU tests and decode_check of
# dswap, then graph-replayed fp8 cells (16, 32, 64 rows), e4m3 and bf16 q: dmain / dswap / dswap / dmain.
R=$PWD; S=$R/.snap; K=$(cd "$(dirname "$0")" && pwd)/swap_cells.py
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
F="warn\|exe_args\|INTERNAL ASSERT"
arm() { (cd /tmp && PYTHONPATH=$S/$1:$R timeout ${TO:-200} python $K "$@" 2>&1 | grep -v -i "$F"); }
T0=$SECONDS; echo "=== start $(date +%T)"; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
rm -rf /tmp/ts && mkdir /tmp/ts && cp -r $R/tests $R/pyproject.toml /tmp/ts/
(cd /tmp/ts && PYTHONPATH=$S/dswap:$R timeout 200 python -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_decode_tlx.py -k fp8 2>&1 | tail -3 | sed "s/^/dswap pytest: /") &
(cd /tmp && PYTHONPATH=$S/dswap:$R timeout 200 python -m harness.gpu.decode_check --backends tlx \
  --match fp8 --no-bad 2>&1 | grep -v -i "$F" | grep -v PASS | tail -8 | sed "s/^/dswap /") &
wait; echo "=== checked $(date +%T) $((SECONDS - T0)) s"
for a in dmain dswap dswap dmain; do arm $a; done
echo "=== end $(date +%T) $((SECONDS - T0)) s"
