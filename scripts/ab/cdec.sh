# bash scripts/ab/cdec.sh (device; CuteDSL: a first call carrying .gpu1 with just
# `source .gpu1/activate.sh`, then this one carrying .gpu2 and .snap, starting
# `source .gpu2/activate.sh;`). Arms in .snap/<arm>/kernels_cute (git archive <branch>
# kernels_cute): cold = main, cw = exp-cute-decode-warp (key groups sync themselves, no
# CTA barrier in the KV loop at 16 / 32 rows), cc = exp-cute-decode-conv (bf16 q over an
# fp8 cache: the f32 -> bf16 pack a byte permute). GPU tests and decode_check of cw and
# cc, then graph-replayed cells (fp8 sweep + bf16 twins) cold / cw / cc / cc / cw / cold.
R=$PWD; S=$R/.snap; K=$(cd "$(dirname "$0")" && pwd)/dec_cells.py
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True BACKEND=cute
F="warn\|exe_args\|INTERNAL ASSERT"
arm() { (cd /tmp && PYTHONPATH=$S/$1:$R timeout ${TO:-200} python $K "$@" 2>&1 | grep -v -i "$F"); }
T0=$SECONDS; echo "=== start $(date +%T)"
rm -rf /tmp/tc && mkdir /tmp/tc && cp -r $R/tests $R/pyproject.toml /tmp/tc/
(cd /tmp/tc && PYTHONPATH=$S/cw:$R timeout 240 python -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_decode_cute_compile.py 2>&1 | tail -3 | sed "s/^/cw pytest: /")
for a in cw cc; do (cd /tmp && PYTHONPATH=$S/$a:$R timeout 200 python -m harness.gpu.decode_check \
  --backends cute --no-bad 2>&1 | grep -v -i "$F" | grep -v PASS | tail -8 | sed "s/^/$a /"); done
echo "=== checked $(date +%T) $((SECONDS - T0)) s"
for a in cold cw cc cc cw cold; do arm $a bf16; done
echo "=== end $(date +%T) $((SECONDS - T0)) s"
