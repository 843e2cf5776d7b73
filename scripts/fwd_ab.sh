#!/bin/bash
# The forward A/B of PERF.md's plan in one GPU call: the oracle checks with every switch
# on (TLX `gpu_check_fwd`, CuteDSL `gpu_check`), then `harness profile --ab` (each
# variant gated by the oracle, then timed; a repeat of the default last) at the
# gem-jagged cells that miss 1.15x FA4 and at llm B8 H16. Logs in $OUT, packed into one
# tar (the device returns 8 files at most). Run from the repo root after activating the
# GPU stack in this shell (`source .gpuN/activate.sh`, never through a pipe).
#   TLX=... CUTE=... CELLS=... SUITES=... CHECK=0|1 bash scripts/fwd_ab.sh
# One device call runs at most 600 s: split by style and suite (TLX's gem cells with six
# rounds each take ~5 min), e.g. `CUTE= SUITES=gem-jagged`, then `CUTE= SUITES=llm-dense
# CHECK=0`, then `TLX=` (CuteDSL needs both GPU parcels).
set -u
OUT=${OUT:-/tmp/fwd_ab}
mkdir -p "$OUT"
R=${HARNESS_GIT_REV:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
R=${R//[^A-Za-z0-9._-]/_}  # the device returns no file whose name has other characters
export HARNESS_GIT_REV=$R JAGGED_ATTN_CHECK_OFFSETS=0 PYTHONUNBUFFERED=1 PYTHONPATH=.
TLX=${TLX-"mask_first=0 overlap=1"}
CUTE=${CUTE-"mask_first=0"}
CELLS=${CELLS:-"Lq256 Lk256 s0.5|Lq1024 Lk1024 s0.5|Lq1024 Lk1024 s0.9|Lq2048 Lk2048 s0.5"}
LLM=${LLM:-"B8 H16/16"}
SUITES=${SUITES:-"gem-jagged llm-dense"}
CHECK=${CHECK:-1}
have_cute() { [ -n "$CUTE" ] && python3 -c "import cutlass.cute" 2>/dev/null; }

ab() {  # variants -> --ab flags, then a repeat of the default
  local flags=""
  for v in $1; do flags="$flags --ab JAGGED_FWD_CONFIG=$v"; done
  echo "$flags --ab JAGGED_AB_REPEAT=1"
}
last() { echo "${1##* }"; }  # the last (combined) variant is the one checked

if [ "$CHECK" = 1 ] && [ -n "$TLX" ]; then
  JAGGED_FWD_CONFIG=$(last "$TLX") timeout -s ABRT 200 python3 -X faulthandler \
    -m harness.gpu.tlx_fwd --no-bench > "$OUT/tlx_check_$R.log" 2>&1
  echo "tlx check rc $? ($(grep -c '^PASS' "$OUT/tlx_check_$R.log") PASS, $(grep -c '^FAIL' "$OUT/tlx_check_$R.log") FAIL)"
fi
if [ "$CHECK" = 1 ] && have_cute; then
  JAGGED_FWD_CONFIG=$(last "$CUTE") timeout -s ABRT 200 python3 -X faulthandler \
    -m harness.gpu.cute_check --quick --no-bench > "$OUT/cute_check_$R.log" 2>&1
  echo "cute check rc $?"; tail -2 "$OUT/cute_check_$R.log"
fi
for suite in $SUITES; do
  match=$CELLS; [ $suite = llm-dense ] && match=$LLM
  if [ -n "$TLX" ]; then
    timeout -s ABRT 400 python3 -X faulthandler -m harness profile --backends tlx --passes fwd \
      --suite $suite --match "$match" --n 10 $(ab "$TLX") > "$OUT/profile_tlx_${suite}_$R.log" 2>&1
    echo "tlx $suite rc $?"
  fi
  if have_cute; then
    timeout -s ABRT 300 python3 -X faulthandler -m harness profile --backends cute --passes fwd \
      --suite $suite --match "$match" --n 10 $(ab "$CUTE") > "$OUT/profile_cute_${suite}_$R.log" 2>&1
    echo "cute $suite rc $?"
  fi
done
grep -h -A40 "A/B summary" "$OUT"/profile_*_"$R".log 2>/dev/null
(cd "$OUT" && tar czf "fwd_ab_$R.tgz" ./*_"$R".log && rm -f ./*_"$R".log)
