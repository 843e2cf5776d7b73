#!/bin/bash
# A/B of the even step shares (branch bwd-steps) on the H200, one device call each:
#   bash scripts/ab/bwd_steps.sh gate        # forced 2 / 4 / 8 parts, both styles, oracle
#   bash scripts/ab/bwd_steps.sh new a|b     # this tree's default path + FA4 (half a / b
#                                            #   of the shapes: one device call each)
#   bash scripts/ab/bwd_steps.sh forced a|b  # every tile in 4 parts (where the rule takes 8)
# (order of value: gate, new, old, forced; ~3, 7, 7, 5 minutes of device time)
#   bash scripts/ab/bwd_steps.sh old a|b     # main's tree (.snap/base: git archive main
#                                            #   harness jagged kernels_tlx kernels_cute
#                                            #   pyproject.toml | tar -x -C .snap/base)
# Each: `source .gpu2/activate.sh; bash scripts/ab/bwd_steps.sh X` carrying .gpu2 and
# .snap, after a .gpu1 activation. CSVs land in $OUT, logs in /tmp.
export PYTHONUNBUFFERED=1
mkdir -p $OUT
# the shapes whose parts change (bwd_parts) or whose parts' steps do (flat against Q-block
# runs), by the host simulation's predicted change, largest first
SPECS=("2|self B5 H8/1 D128|self B8 H2/1 D64" "9|self B1 H8/1 D128" "1|cross B1 H32/4|self B17 H4/1"
       "15|cross B6 H8/1|self B8 H8/1" "13|cross B2 H8/8" "7|cross B3 H32/4"
       "17|self B2 H8/2 D64|self B7 H8/1" "3|self B3 H4/1 D128")
shapes() {  # $1 backends, $2 tag, $3 root, $4 half (a: the first four shapes' seeds, b: the rest)
  local part=("${SPECS[@]:0:4}")
  [ "$4" = b ] && part=("${SPECS[@]:4}")
  for spec in "${part[@]}"; do
    seed=${spec%%|*}; match=${spec#*|}
    (cd $3 && timeout ${TIMEOUT:-100} python3 -m harness bench --backends $1 --passes bwd \
       --suite fuzz --fuzz-seed $seed --match "$match" --warm 8 --out $OUT/$2_s$seed \
       > /tmp/$2_s$seed.log 2>&1); echo "$2 seed $seed rc $?"
    python3 - "$OUT/$2_s$seed/results.csv" <<'PY'
import csv, os, sys
if os.path.exists(sys.argv[1]):
    for r in csv.DictReader(open(sys.argv[1])):
        print(r["backend"], r["mode"], r["batch"], r["heads"], r["kv_heads"], r["head_dim"],
              r["max_seqlen_q"], r["max_seqlen_k"], r["sparsity"], r["causal"], r["dtype"],
              r["status"], r["ms"], r["graph_ms"], r["error"][:120])
PY
  done
}
case $1 in
  gate) timeout 300 python3 scripts/ab/gate_parts.py tlx,cute > /tmp/gate.log 2>&1
        echo "gate rc $?"; cp /tmp/gate.log $OUT/
        grep -E "BAD|GATE_PARTS|Error" /tmp/gate.log | head -20 ;;
  new) shapes tlx,cute-rows,fa4 new . $2 ;;   # cute-rows: without dq-flat's accumulator
  forced) shapes tlx-p4,cute-p4 p4 . $2 ;;
  old) shapes tlx,cute,fa4 old .snap/base $2 ;;
esac
