#!/bin/bash
# Every oracle gate of the waiting stack (split-fused, flat-next, win-passes, win-tile,
# list-loads) in one device call, no timing: the gates run as parallel processes on the
# one GPU, so their compiles overlap (~4 min). After a .gpu1 activation, carrying .gpu2:
#   source .gpu2/activate.sh; bash scripts/ab/gates.sh
export PYTHONUNBUFFERED=1
mkdir -p $OUT
K="windows or split or flat"
gate() {  # $1 tag, then the command
  local tag=$1; shift
  timeout ${TIMEOUT:-520} "$@" > $OUT/$tag.log 2>&1; echo "$tag rc $?"
}
gate flat_tlx python3 scripts/ab/gate_flat.py tlx &
gate flat_cute python3 scripts/ab/gate_flat.py cute &
gate split python3 scripts/ab/gate_split.py &
gate tests_tlx python3 -m pytest -q -m gpu tests/test_gpu_matrix.py tests/test_gpu_core.py \
  -k "tlx and ($K)" -p no:logging -p no:cacheprovider -rf &
gate tests_other python3 -m pytest -q -m gpu tests/test_gpu_matrix.py tests/test_gpu_core.py \
  -k "not tlx and ($K)" -p no:logging -p no:cacheprovider -rf &
wait
grep -hE "GATE_|BAD|Error" $OUT/flat_*.log $OUT/split.log | head -20
for t in tlx other; do tail -2 $OUT/tests_$t.log; done
