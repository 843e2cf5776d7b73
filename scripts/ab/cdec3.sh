# CuteDSL decode, second round: cold / cw / cw / cold on the fp8 cells (e4m3 q),
R=$PWD; S=$R/.snap; K=$(cd "$(dirname "$0")" && pwd)/swap_cells.py
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True BACKEND=cute
F="warn\|exe_args\|INTERNAL ASSERT"
arm() { (cd /tmp && PYTHONPATH=$S/$1:$R timeout ${TO:-150} python $K "$@" 2>&1 | grep -v -i "$F"); }
T0=$SECONDS; echo "=== start $(date +%T)"
for a in cold cw cw cold; do QM=e4m3 arm $a; done
echo "=== cw $(date +%T) $((SECONDS - T0)) s"
echo "=== end $(date +%T) $((SECONDS - T0)) s"
