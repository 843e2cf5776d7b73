#!/bin/bash
# A/B of branches windows-next and split-fused on the H200: key windows split over
# programs where a call has few (jagged.tiles.window_parts), the causal row cut of a
# longer sequence's blocks over key windows, and (split-fused) the split calls' fp32
# dK / dV zeroed by the preprocess and converted by the postprocess. One device call
# each, after a .gpu1 activation, carrying .gpu2 and .snap:
# `source .gpu2/activate.sh; bash scripts/ab/windows_next.sh X`
#   parts   the split windows against the oracle, then replayed against whole windows
#           (window_parts forced to 1: main's path) and FA4, in one process (~4 min)
#   cut     the row cut's gate and replayed backward, this tree and main's (.snap/base:
#           git archive main harness jagged kernels_tlx kernels_cute pyproject.toml |
#           tar -x -C .snap/base) (~6 min)
#   tests   tests/test_gpu_matrix.py and test_gpu_core.py's window cases (~3 min)
#   split   the split fuzz shapes (seeds 2, 9, 15), this tree (tlx, cute, FA4) and main's
#           (.snap/base, tlx, cute) (~8 min)
export PYTHONUNBUFFERED=1
mkdir -p $OUT
case $1 in
  parts) timeout 540 python3 scripts/ab/window_parts.py > $OUT/window_parts.log 2>&1
         echo "parts rc $?"; grep -E "GATE|WPARTS|Error|BAD" $OUT/window_parts.log | head -30 ;;
  cut) timeout 270 python3 scripts/ab/row_cut.py new 2>&1 | grep -E "ROW_CUT|Error"
       (cd .snap/base && timeout 270 python3 ../../scripts/ab/row_cut.py main 2>&1 |
          grep -E "ROW_CUT|Error") ;;
  tests) timeout 540 python3 -m pytest -q -m gpu tests/test_gpu_matrix.py tests/test_gpu_core.py \
           -k "test_windows or short-windows" -p no:logging -rf > $OUT/tests.log 2>&1
         echo "tests rc $?"; tail -5 $OUT/tests.log ;;
  split)
    SPECS=("2|self B5 H8/1 D128" "9|self B1 H8/1 D128" "15|cross B6 H8/1")
    for root in . .snap/base; do
      tag=$([ $root = . ] && echo new || echo main)
      backends=$([ $root = . ] && echo tlx,cute,fa4 || echo tlx,cute)
      for spec in "${SPECS[@]}"; do
        seed=${spec%%|*}
        (cd $root && timeout 120 python3 -m harness bench --backends $backends --passes bwd \
           --suite fuzz --fuzz-seed $seed --match "${spec#*|}" --warm 8 \
           --out $OUT/${tag}_s$seed > /tmp/${tag}_s$seed.log 2>&1)
        echo "$tag seed $seed rc $?"
        python3 - "$OUT/${tag}_s$seed/results.csv" <<'PY'
import csv, os, sys
if os.path.exists(sys.argv[1]):
    for r in csv.DictReader(open(sys.argv[1])):
        print(r["backend"], r["mode"], r["batch"], r["heads"], r["kv_heads"], r["head_dim"],
              r["max_seqlen_q"], r["causal"], r["status"], r["ms"], r["graph_ms"])
PY
      done
    done ;;
esac
