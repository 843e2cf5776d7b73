# bash .snap/kit/list.sh (device; source .gpu1/activate.sh first, .gpu2 for cute): the
# window list's counting sort (l512, l1k) against main's bitonic sort (lold)
R=$PWD; S=$R/.snap; K=$(cd "$(dirname "$0")" && pwd)/list_cells.py
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
F="warn\|exe_args\|run_backward\|INTERNAL ASSERT"
arm() { (cd $R && PYTHONPATH=$S/$1:$R timeout ${TO:-150} python $K "$@" 2>&1 | grep -v -i "$F"); }
T0=$SECONDS; echo "=== start $(date +%T)"; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
BE=${BE:-tlx}
arm l512 $BE g; arm l1k $BE g
echo "=== gated $(date +%T) $((SECONDS - T0)) s"
for a in lold l512 l1k l1k l512 lold; do arm $a $BE; done
echo "=== end $(date +%T) $((SECONDS - T0)) s"
