#!/bin/bash
# A/B of the block-padded dQ accumulator (branches dq-flat: CuteDSL, tlx-flat: TLX) on
# the H200, one device call each, in this tree (tlx / cute: the defaults,
# dq_flat from jagged.tiles.FLAT_MEAN_Q rows a sequence; -rows: the row accumulator; FA4
# in the same run):
#   bash scripts/ab/dq_flat.sh gate      # both styles, dq_flat forced, vs the oracle, ~4 min
#   bash scripts/ab/dq_flat.sh time a|b|c  # a: llm-dense D = 128, both styles; b: gem-jagged
#                                        #   2048 / 0.9, varlen-llm B10 D128, fuzz B5 H8/4,
#                                        #   both; c: D = 64, both; ~6 min each
#   bash scripts/ab/dq_flat.sh ds       # branch ds2: the 80-row step's two dS^T stages
#                                       #   (cute) against one (cute-ds1), ~5 min
# Each: `source .gpu2/activate.sh; bash scripts/ab/dq_flat.sh X` carrying .gpu2, after a
# .gpu1 activation. CSVs land in $OUT, logs in /tmp.
# On flat-next-ab, one session's order (each a device call, ~22 min in all): windows_next.sh
# parts; dq_flat.sh gate; dq_flat.sh time a; windows_next.sh split (.snap/base = main's tree);
# then, if time is left, dq_flat.sh time b and windows_next.sh tests.
export PYTHONUNBUFFERED=1
mkdir -p $OUT
run() {  # $1 tag, then bench arguments
  local tag=$1; shift
  timeout ${TIMEOUT:-240} python3 -m harness bench --backends ${BACKENDS:-cute,cute-rows,fa4} --passes bwd \
    --warm 6 --out $OUT/$tag "$@" > /tmp/$tag.log 2>&1; echo "$tag rc $?"
  python3 - "$OUT/$tag/results.csv" <<'PY'
import csv, os, sys
if os.path.exists(sys.argv[1]):
    for r in csv.DictReader(open(sys.argv[1])):
        print(r["backend"], r["mode"], r["batch"], r["heads"], r["kv_heads"], r["head_dim"],
              r["max_seqlen_q"], r["sparsity"], r["causal"], r["dtype"], r["status"],
              r["ms"], r["graph_ms"], r["error"][:120])
PY
}
case $1 in
  gate) timeout 420 python3 scripts/ab/gate_flat.py tlx,cute > /tmp/gate_flat.log 2>&1
        echo "gate rc $?"; cp /tmp/gate_flat.log $OUT/
        grep -E "BAD|GATE_FLAT|Error" /tmp/gate_flat.log | head -20 ;;
  time) export TIMEOUT=540 BACKENDS=tlx,tlx-rows,cute,cute-rows,fa4
        case $2 in
          a) run llm --suite llm-dense --match "D128 Lq8192 Lk8192 s1 bf16|D128 Lq4096 Lk4096 s1 bf16" ;;
          b) export TIMEOUT=170
             run gem --suite gem-jagged --match "Lq2048 Lk2048 s0.9 bf16"
             run varlen --suite varlen-llm --match "B10 H32/8 D128"
             run fuzz0 --suite fuzz --fuzz-seed 0 --match "B5 H8/4 D128" ;;
          c) export TIMEOUT=270
             run llm64 --suite llm-dense --match "D64 Lq2048 Lk2048 s1 bf16"
             run fuzz64 --suite fuzz --fuzz-seed 0 --match "B2 H8/2 D64" ;;
        esac ;;
  ds) export BACKENDS=cute,cute-ds1,fa4
      run ds_llm --suite llm-dense --match "B8 H16/16 D128 Lq8192 Lk8192 s1 bf16"
      run ds_gem --suite gem-jagged --match "Lq2048 Lk2048 s0.9 bf16"
      run ds_fuzz --suite fuzz --fuzz-seed 0 --match "B5 H8/4 D128|B21 H1/1 D128" ;;
esac
