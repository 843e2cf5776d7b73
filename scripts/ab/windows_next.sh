#!/bin/bash
# A/B of branch windows-next on the H200: key windows split over programs where a call
# has few (jagged.tiles.window_parts) and the causal row cut of a longer sequence's blocks
# over key windows. One device call each, after a .gpu1 activation, carrying .gpu2 and
# .snap: `source .gpu2/activate.sh; bash scripts/ab/windows_next.sh X`
#   parts   the split windows against the oracle, then replayed against whole windows
#           (window_parts forced to 1: main's path) and FA4, in one process (~4 min)
#   cut     the row cut's gate and replayed backward, this tree and main's (.snap/base:
#           git archive main harness jagged kernels_tlx kernels_cute pyproject.toml |
#           tar -x -C .snap/base) (~6 min)
#   tests   tests/test_gpu_matrix.py and test_gpu_core.py's window cases (~3 min)
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
esac
