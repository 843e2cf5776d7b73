# bash scripts/ab/dec.sh (device, one call of ~300 s; source .gpu1/activate.sh first)
# arms in .snap/<arm>/kernels_tlx (git archive <branch> kernels_tlx): old = the tree
# before 612114f, dv = exp-decode-vconv (fp8 V converted to f16 in its load layout, staged through shared
# memory for ldmatrix.trans); dv2 = dv with 64-key blocks in 5-deep rings at 16 rows D 128
# contiguous. decode_check fp8 cases on dv and dv2, then old / dv / dv2 / dv2 / dv / old.
R=$PWD; S=$R/.snap; K=$(cd "$(dirname "$0")" && pwd)/dec_cells.py
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
F="warn\|exe_args\|INTERNAL ASSERT"
arm() { (cd /tmp && PYTHONPATH=$S/$1:$R timeout ${TO:-150} python $K "$@" 2>&1 | grep -v -i "$F"); }
T0=$SECONDS; echo "=== start $(date +%T)"
for a in dv dv2; do (cd /tmp && PYTHONPATH=$S/$a:$R timeout 150 python -m harness.gpu.decode_check \
  --backends tlx --match fp8 --no-bad 2>&1 | grep -v -i "$F" | tail -25 | sed "s/^/$a /") & done; wait
echo "=== checked $(date +%T) $((SECONDS - T0)) s"
arm old bf16; arm dv; arm dv2; arm old
echo "=== end $(date +%T) $((SECONDS - T0)) s"
