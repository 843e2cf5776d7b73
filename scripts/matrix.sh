#!/bin/bash
# The 200-problem GPU matrix of one style (tests/test_gpu_matrix.py) as parallel shards
# with one seed, in one device call; logs packed into one tar in $OUT. Run from the repo
# root after `source .gpuN/activate.sh` in this shell (never through a pipe).
#   K=tlx|cute SHARDS=4 SEED=... N=200 bash scripts/matrix.sh
set -u
OUT=${OUT:-/tmp/matrix}
mkdir -p "$OUT"
K=${K:-tlx}; SHARDS=${SHARDS:-4}; N=${N:-200}
SEED=${SEED:-$(python3 -c "import random; print(random.SystemRandom().randrange(1 << 30))")}
R=${HARNESS_GIT_REV:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
R=${R//[^A-Za-z0-9._-]/_}  # the device returns no file whose name has other characters
export HARNESS_GIT_REV=$R PYTHONUNBUFFERED=1 PYTHONPATH=.
export JAGGED_MATRIX_SEED=$SEED JAGGED_MATRIX_N=$N
for i in $(seq 0 $((SHARDS - 1))); do
  JAGGED_MATRIX_SHARD=$i/$SHARDS timeout -s ABRT 500 python3 -m pytest -m gpu \
    tests/test_gpu_matrix.py -k "$K" -v -p no:cacheprovider > "$OUT/matrix_${K}_${R}_$i.log" 2>&1 &
done
wait
echo "matrix $K seed $SEED: $(cat "$OUT"/matrix_${K}_${R}_*.log | grep -c ' PASSED') passed," \
  "$(cat "$OUT"/matrix_${K}_${R}_*.log | grep -c ' FAILED') failed"
grep -h "FAILED\|Error" "$OUT"/matrix_${K}_${R}_*.log | head -20
(cd "$OUT" && tar czf "matrix_${K}_$R.tgz" ./matrix_${K}_"$R"_*.log && rm -f ./matrix_${K}_"$R"_*.log)
