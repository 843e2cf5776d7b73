#!/bin/bash
# The backward stack over main (this tree) in one device call, parallel processes, no
# timing: the CuteDSL + portable window / split / flat tests under compute-sanitizer's
# memcheck (seed 1) and without it (seeds 1-3), main's tree beside (.snap/base, seed 1:
# git archive main harness jagged kernels_tlx kernels_cute pyproject.toml tests scripts |
# tar -x -C .snap/base), the portable window tests over seeds 5-12, the TLX tests and the
# forward counter's, and the flat-dQ and split gates. After a .gpu1 activation, carrying
# .gpu2 and .snap (~8 min):
#   source .gpu2/activate.sh; bash scripts/ab/land_gates.sh
export PYTHONUNBUFFERED=1
mkdir -p $OUT
K="windows or split or flat"
T="tests/test_gpu_matrix.py tests/test_gpu_core.py"
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
echo "sanitizer: ${SAN:-none}"
summary() { grep -E "^FAILED|^ERROR|passed|failed|GATE_|BAD" $1 | head -4 | tr '\n' ' '; }
run() {  # tag root seed timeout -k [wrapper...]
  local tag=$1 root=$2 seed=$3 tmo=$4 k=$5; shift 5
  (cd $root && JAGGED_MATRIX_SEED=$seed timeout $tmo "$@" python3 -m pytest -q -m gpu $T \
     -k "$k" -x -p no:cacheprovider -p no:logging -rf > $OUT/$tag.log 2>&1)
  echo "$tag rc $?: $(summary $OUT/$tag.log)"
}
gate() {  # tag, then the command
  local tag=$1; shift
  timeout ${TMO:-420} "$@" > $OUT/$tag.log 2>&1; echo "$tag rc $?: $(summary $OUT/$tag.log)"
}
[ -n "$SAN" ] && run san_s1 . 1 ${TSAN:-540} "not tlx and ($K)" $SAN --tool memcheck --print-limit 10 &
for s in ${SEEDS:-1 2 3}; do run other_s$s . $s ${TMO:-420} "not tlx and ($K)" & done
[ -n "${MAIN-1}" ] && run main_s1 .snap/base 1 ${TMO:-420} "not tlx and ($K)" &
run tlx_s1 . 1 ${TMO:-420} "tlx and ($K)" &
(for s in $(seq 5 ${LAST:-12}); do
   JAGGED_MATRIX_SEED=$s timeout 60 python3 -m pytest -q -m gpu tests/test_gpu_matrix.py \
     -k "test_windows and triton" -x -p no:cacheprovider -rf > $OUT/triton_s$s.log 2>&1
   echo "triton_s$s rc $?: $(summary $OUT/triton_s$s.log)"
 done) &
gate counter python3 -m pytest -q -m gpu tests/test_gpu_fwd_counter.py -p no:cacheprovider -rf &
gate flat_tlx python3 scripts/ab/gate_flat.py tlx &
gate flat_cute python3 scripts/ab/gate_flat.py cute &
gate split python3 scripts/ab/gate_split.py &
wait
grep -hE "Invalid|at 0x|by thread|Address|Saved host|ERROR SUMMARY" $OUT/san_s1.log 2>/dev/null | head -40
