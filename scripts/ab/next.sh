#!/bin/bash
# The next device round's measurements, one call each (PART=f|c|e2), H200 or H100 named in
# the output; CuteDSL / FA4 need both stacks (two run calls in one message):
#   source .gpu2/activate.sh; PART=c bash scripts/ab/next.sh
# (run from main's tree, this file copied beside it: git show next-gpu:scripts/ab/next.sh)
# c: the forward counter cells not yet timed (varlen-llm B20, D = 64; CuteDSL llm B8
#    causal) and the fuzz seed 0 short windowed backwards eager (TLX window_lists)
# f: the fuzz backwards' worst shapes end to end after the list runs and the
#    preprocess's broadcast-Q zeroing (harness profile: eager, replayed and the replayed
#    graph's kernels), TLX / CuteDSL / FA4; then the list kernels alone against main's
#    tree before them (branch win-runs' scripts/ab/list.sh, .snap/main of d453c91~1);
#    then ncu of TLX's and CuteDSL's broadcast-Q B13 main kernels
# e2: the fuzz backward of seed 0's shapes of 2048 query rows and more, TLX / CuteDSL /
#    FA4, eager and replayed (their rows predate the launch plans' and windows' host
#    work; the shapes of up to 1024 rows ran on an H100 at cf44df5, reports/h100)
export PYTHONUNBUFFERED=1
mkdir -p $OUT
show() {
python3 - "$1" <<'PY'
import csv, os, sys
if os.path.exists(sys.argv[1]):
    for r in csv.DictReader(open(sys.argv[1])):
        print(r["backend"], r["pass"], r["suite"], r["batch"], r["heads"], r["kv_heads"],
              r["head_dim"], r["max_seqlen_q"], r["max_seqlen_k"], r["sparsity"], r["causal"],
              r["status"], r["ms"], r["graph_ms"], r["tflops"], r["error"][:60])
PY
}
nvidia-smi --query-gpu=name --format=csv,noheader
case ${PART:-f} in
f)
  timeout 300 python3 -m harness profile --suite fuzz --backends tlx,cute,fa4 --passes bwd \
    --match "broadcast_q B13|cross B24 H2/2 D64|self B24 H2/2 D128|broadcast_q B4 " 2>&1 \
    | grep -v "Warning\|exe_args\|warn\|run_backward"
  # CuteDSL's broadcast-Q main kernel took ~10 % longer than TLX's at B13: where its warps wait
  timeout 280 python3 -m harness.gpu.ncu_sass run --backends tlx,cute --passes bwd --suite fuzz \
    --match "broadcast_q B13" --out $OUT/ncu 2>&1 | grep -v "Warning\|exe_args\|warn" | tail -60 ;;
c)
  (timeout 300 python3 -m harness bench --backends tlx,cute,fa4 --passes fwd --warm 8 \
     --suite varlen-llm,llm-dense --match "B20 |D64 Lq16384|D64 Lq8192|H16/16 D64 Lq2048 Lk2048 s1 bf16|B8 H16/16 D128 Lq8192 Lk8192 s1 bf16 causal" \
     --out $OUT/fwd > $OUT/fwd.log 2>&1)
  echo "fwd rc $?"; show $OUT/fwd/results.csv
  (timeout 240 python3 -m harness bench --backends tlx,cute,fa4 --passes bwd --warm 8 \
     --suite fuzz --match "Lq128 |Lq256 |Lq512 " --out $OUT/short > $OUT/short.log 2>&1)
  echo "short rc $?"; show $OUT/short/results.csv ;;
e2)
  (timeout 560 python3 -m harness bench --backends tlx,cute,fa4 --passes bwd --warm 8 \
     --suite fuzz --match "Lq2048 |Lq4096 |Lq8192 |Lq16384 " --out $OUT/fz2 > $OUT/fz2.log 2>&1)
  echo "fuzz long rc $?"; show $OUT/fz2/results.csv ;;
esac
