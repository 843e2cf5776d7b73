#!/bin/bash
# The illegal memory access gates.sh met in its CuteDSL + portable process (first reported
# at the portable backward of test_windows[4-triton], a cross causal D = 128 window
# problem, its draw's seed lost): the window tests of both styles over fixed seeds, this
# tree (land-stack's kernels) and main's (.snap/base: git archive main harness jagged
# kernels_tlx kernels_cute pyproject.toml tests | tar -x -C .snap/base), then the first
# failing test again under compute-sanitizer's memcheck. One device call after a .gpu1
# activation, carrying .gpu2 and .snap (~6 min):
#   source .gpu2/activate.sh; bash scripts/ab/land_fault.sh [seeds, default "1 2 3 4"]
export PYTHONUNBUFFERED=1
mkdir -p $OUT
K="test_windows and (cute or triton)"
first=""
for seed in ${1:-1 2 3 4}; do
  for root in . .snap/base; do
    tag=$([ $root = . ] && echo land || echo main)_s$seed
    (cd $root && JAGGED_MATRIX_SEED=$seed timeout 100 python3 -m pytest -q -m gpu \
       tests/test_gpu_matrix.py -k "$K" -x -p no:cacheprovider -rf > $OUT/$tag.log 2>&1)
    echo "$tag rc $?"; grep -E "^FAILED|passed|failed" $OUT/$tag.log | head -3
    f=$(grep -m1 -oE "^FAILED tests/test_gpu_matrix.py::test_windows\[[^]]+\]" $OUT/$tag.log)
    if [ -z "$first" ] && [ -n "$f" ]; then first="$root|$seed|${f#FAILED }"; fi
  done
done
if [ -n "$first" ]; then
  IFS="|" read -r root seed test <<< "$first"
  echo "memcheck: $root seed $seed $test"
  (cd $root && JAGGED_MATRIX_SEED=$seed timeout 240 compute-sanitizer --tool memcheck \
     --print-limit 5 python3 -m pytest -q -m gpu "$test" -p no:cacheprovider \
     > $OUT/memcheck.log 2>&1); echo "memcheck rc $?"
  grep -E "Invalid|at 0x|by thread|Address|kernel" $OUT/memcheck.log | head -30
fi
