# bash .snap/kit/list3.sh (device; .gpu2 active): the window list under CuteDSL (l512 gated, lold), FA4 once
R=$PWD; S=$R/.snap; KD=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
F="warn\|exe_args\|run_backward\|INTERNAL ASSERT"
T0=$SECONDS; echo "=== start $(date +%T)"
larm() { (cd $R && PYTHONPATH=$S/$1:$R timeout ${TO:-200} python $KD/list_cells.py "$@" 2>&1 | grep -v -i "$F"); }
larm l512 cute g; larm lold cute; larm lold fa4
echo "=== end $(date +%T) $((SECONDS - T0)) s"
