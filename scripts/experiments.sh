#!/bin/bash
# The A/B of each experiment on main against the default path, on one H200, from the
# repo root after `source .gpuN/activate.sh` (CuteDSL and FA4: .gpu2). An experiment
# leaves main when it loses, or becomes the default when it wins (PERF.md says which).
#   bash scripts/experiments.sh [fp8-v-tiles|decode-overlap|all]     (~4-5 min each)
# Results under $OUT (default reports/experiments), one folder per experiment.
set -u
what=${1:-all}
OUT=${OUT:-reports/experiments}
PY=${PY:-python}
mkdir -p "$OUT"

if [ "$what" = all ] || [ "$what" = fp8-v-tiles ]; then
  # the fp8 forward's V converted tile by tile (`--fp8-v-tiles`) against the V pass
  d="$OUT/fp8_v_tiles"; mkdir -p "$d"
  timeout 240 $PY -m pytest -q -m gpu -n 4 tests/test_fp8_kernel.py -p no:cacheprovider \
      > "$d/pytest.log" 2>&1; echo "fp8 oracle tests rc=$?"; tail -2 "$d/pytest.log"
  jag="Lq256 Lk256 s0.5|Lq1024 Lk1024 s0.5|Lq2048 Lk2048 s0.9"
  llm="B4 H32/8 D128 Lq4096"
  for run in base tiles; do
    opt=""; [ $run = tiles ] && opt="--fp8-v-tiles"
    timeout 300 $PY -m harness bench --suite gem-jagged,llm-dense --match "$jag|$llm" \
        --backends tlx,cute --passes fwd --warm 4 $opt --out "$d/$run" > "$d/$run.log" 2>&1
    echo "bench $run rc=$?"
  done
  $PY -m harness compare "$d/base" "$d/tiles" | tee "$d/compare.txt"
fi

if [ "$what" = all ] || [ "$what" = decode-overlap ]; then
  # TLX decode's Config.overlap twins against the default configs, fp8 cache
  d="$OUT/decode_overlap"; mkdir -p "$d"
  timeout 150 $PY -m pytest -q -m gpu tests/test_decode_tlx.py -k overlap_oracle \
      -p no:cacheprovider > "$d/pytest.log" 2>&1; echo "overlap oracle rc=$?"
  tail -2 "$d/pytest.log"
  timeout 240 $PY -m harness.gpu.decode_tune --styles tlx --dtype fp8 --quick \
      --alternatives --budget-s 200 --out "$d/tune.csv" > "$d/tune.log" 2>&1
  echo "decode_tune rc=$?"; tail -12 "$d/tune.log"
fi
