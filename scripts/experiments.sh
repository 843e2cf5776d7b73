#!/bin/bash
# The A/B of each experiment on main against the default path, on one H200, from the
# repo root after `source .gpuN/activate.sh` (CuteDSL and FA4: .gpu2). An experiment
# leaves main when it loses, or becomes the default when it wins (PERF.md says which).
#   bash scripts/experiments.sh [decode-overlap|all]     (~4-5 min each)
# Results under $OUT (default reports/experiments), one folder per experiment.
set -u
what=${1:-all}
OUT=${OUT:-reports/experiments}
PY=${PY:-python}
mkdir -p "$OUT"

if [ "$what" = all ] || [ "$what" = decode-overlap ]; then
  # TLX decode's Config.overlap twins against the default configs, fp8 cache
  d="$OUT/decode_overlap"; mkdir -p "$d"
  timeout 150 $PY -m pytest -q -m gpu tests/test_decode_tlx.py -k overlap_oracle \
      -p no:cacheprovider > "$d/pytest.log" 2>&1; echo "overlap oracle rc=$?"
  tail -2 "$d/pytest.log"
  timeout 240 $PY -m harness.gpu.decode_tune --styles tlx --dtype fp8 --quick \
      --alternatives --budget-s 150 --out "$d/tune.csv" > "$d/tune.log" 2>&1
  echo "decode_tune rc=$?"; tail -12 "$d/tune.log"
fi
