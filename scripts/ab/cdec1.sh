# part 1 of cdec.sh: the checks of cw and cc, then cold / cw / cc (fp8 + bf16 cells)
R=$PWD; S=$R/.snap; K=$(cd "$(dirname "$0")" && pwd)/dec_cells.py
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True BACKEND=cute
F="warn\|exe_args\|INTERNAL ASSERT"
arm() { (cd /tmp && PYTHONPATH=$S/$1:$R timeout ${TO:-150} python $K "$@" 2>&1 | grep -v -i "$F"); }
T0=$SECONDS; echo "=== start $(date +%T)"; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
rm -rf /tmp/tc && mkdir /tmp/tc && cp -r $R/tests $R/pyproject.toml /tmp/tc/
(cd /tmp/tc && PYTHONPATH=$S/cw:$R timeout 150 python -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_decode_cute_compile.py 2>&1 | tail -3 | sed "s/^/cw pytest: /") &
for a in cw cc; do (cd /tmp && PYTHONPATH=$S/$a:$R timeout 150 python -m harness.gpu.decode_check \
  --backends cute --no-bad 2>&1 | grep -v -i "$F" | grep -v PASS | tail -8 | sed "s/^/$a /") & done; wait
echo "=== checked $(date +%T) $((SECONDS - T0)) s"
for a in cold cw cc; do arm $a bf16; done
echo "=== end $(date +%T) $((SECONDS - T0)) s"
