# bash .snap/kit/c64.sh (device; source .gpu2/activate.sh first, after a .gpu1 call).
# cmain = main's kernels_cute, c64 = exp-cute-decode-s64's (an e4m3 q at 64 rows: S = Q K^T
# an e4m3 wgmma, P V an f16 wgmma, P from registers). c64's GPU tests and decode_check,
# then graph-replayed cells cmain / c64 / c64 / cmain.
R=$PWD; S=$R/.snap; K=$S/kit/c64_cells.py
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
F="warn\|exe_args\|INTERNAL ASSERT"
arm() { (cd /tmp && PYTHONPATH=$S/$1:$R timeout ${TO:-150} python $K "$@" 2>&1 | grep -v -i "$F"); }
T0=$SECONDS; echo "=== start $(date +%T)"; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
rm -rf /tmp/tc && mkdir /tmp/tc && cp -r $S/c64tests/* /tmp/tc/
(cd /tmp/tc && PYTHONPATH=$S/c64:$R timeout 200 python -m pytest -q -m gpu -p no:cacheprovider \
  --tb=line tests/test_decode_cute_compile.py 2>&1 | grep -i "failed\|passed\|error" | tail -8 | sed "s/^/c64 pytest: /") &
(cd /tmp && PYTHONPATH=$S/c64:$R timeout 200 python -m harness.gpu.decode_check \
  --backends cute --no-bad 2>&1 | grep -v -i "$F" | grep -v PASS | tail -8 | sed "s/^/c64 check: /") &
wait; echo "=== checked $(date +%T) $((SECONDS - T0)) s"
for a in cmain c64 c64 cmain; do arm $a; done
echo "=== end $(date +%T) $((SECONDS - T0)) s"
