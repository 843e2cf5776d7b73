# part 2: cc / cw / cold again (their builds cached), then TLX main's decode rows (fp8 + bf16)
R=$PWD; S=$R/.snap; K=$(cd "$(dirname "$0")" && pwd)/dec_cells.py
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
F="warn\|exe_args\|INTERNAL ASSERT"
arm() { (cd /tmp && PYTHONPATH=$S/$1:$R BACKEND=$B timeout ${TO:-150} python $K "$@" 2>&1 | grep -v -i "$F"); }
T0=$SECONDS; echo "=== start $(date +%T)"
B=cute; for a in cc cw cold; do arm $a bf16; done
echo "=== cute end $(date +%T) $((SECONDS - T0)) s"
B=tlx; (cd /tmp && PYTHONPATH=$R BACKEND=tlx timeout 150 python $K main bf16 2>&1 | grep -v -i "$F")
echo "=== end $(date +%T) $((SECONDS - T0)) s"
