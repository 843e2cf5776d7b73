#!/bin/bash
# The next device round's measurements, one call each (PART=a|b|c), H200 or H100 named
# in the output; CuteDSL / FA4 need both stacks (two run calls in one message):
#   source .gpu2/activate.sh; PART=a bash scripts/ab/next.sh
# a: CuteDSL's D = 64 block-padded dQ (on by default, not yet timed) against the row
#    accumulator, same call, FA4 beside: llm-dense B16 H16 D64 2048 (both) and
#    varlen-llm's D = 64 problems of 8192 and 4096 tokens
# b: gem-cross, both passes, TLX / CuteDSL / FA4 (no rows yet)
# c: the forward counter cells not yet timed (varlen-llm B20, D = 64; CuteDSL llm B8
#    causal) and the fuzz seed 0 short windowed backwards eager (TLX window_lists)
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
case ${PART:-a} in
a)
  M="H16/16 D64 Lq2048 Lk2048 s1 bf16|D64 Lq8192|D64 Lq4096"
  (timeout 260 python3 -m harness bench --backends cute,fa4 --passes bwd --warm 8 \
     --suite llm-dense,varlen-llm --match "$M" --out $OUT/flat > $OUT/flat.log 2>&1)
  echo "flat rc $?"; show $OUT/flat/results.csv
  rm -rf /tmp/nf64 && mkdir -p /tmp/nf64 && cp -r harness jagged kernels_tlx kernels_cute pyproject.toml /tmp/nf64/
  sed -i 's/    return replace(cfg, dq_flat=True) if takes_flat(mean_q, broadcast_q) else cfg/    return replace(cfg, dq_flat=True) if takes_flat(mean_q, broadcast_q) and head_dim != 64 else cfg/' \
     /tmp/nf64/kernels_cute/bwd_hopper.py
  grep -c "head_dim != 64 else cfg" /tmp/nf64/kernels_cute/bwd_hopper.py
  (cd /tmp/nf64 && timeout 200 python3 -m harness bench --backends cute --passes bwd --warm 8 \
     --suite llm-dense,varlen-llm --match "$M" --out $OUT/rows > $OUT/rows.log 2>&1)
  echo "rows rc $?"; show $OUT/rows/results.csv ;;
b)
  (timeout 540 python3 -m harness bench --backends tlx,cute,fa4 --passes fwd,bwd --warm 8 \
     --suite gem-cross --out $OUT/cross > $OUT/cross.log 2>&1)
  echo "cross rc $?"; show $OUT/cross/results.csv ;;
c)
  (timeout 300 python3 -m harness bench --backends tlx,cute,fa4 --passes fwd --warm 8 \
     --suite varlen-llm,llm-dense --match "B20 |D64 Lq16384|D64 Lq8192|H16/16 D64 Lq2048 Lk2048 s1 bf16|B8 H16/16 D128 Lq8192 Lk8192 s1 bf16 causal" \
     --out $OUT/fwd > $OUT/fwd.log 2>&1)
  echo "fwd rc $?"; show $OUT/fwd/results.csv
  (timeout 240 python3 -m harness bench --backends tlx,cute,fa4 --passes bwd --warm 8 \
     --suite fuzz --match "Lq128 |Lq256 |Lq512 " --out $OUT/short > $OUT/short.log 2>&1)
  echo "short rc $?"; show $OUT/short/results.csv ;;
esac
