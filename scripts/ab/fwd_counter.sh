#!/bin/bash
# A/B of branch fwd-counter on the H200: causal packed forward lists from the tile counter
# (jagged.tiles.fwd_dynamic, both styles) against the static round-robin (tlx-fstatic /
# cute-fstatic), FA4 in the same run. One device call after a .gpu1 activation, carrying
# .gpu2 (~6 min): `source .gpu2/activate.sh; bash scripts/ab/fwd_counter.sh`
#   the GPU test of the counter (calls repeated on one list, other heads, a second
#   stream; the counter zeroed after each), then the forward of varlen-llm D = 128 / 64,
#   llm B8 H16 8192 causal and fuzz seed 0's B3 H16/8 16384 causal.
# Read: graph_ms of tlx / cute against their -fstatic twins. Host model (max/mean program
# load, static -> counter): B3 1.130 -> 1.019, varlen-llm 1.078-1.137 -> 1.003-1.007,
# llm B8 1.030 -> 1.014.
export PYTHONUNBUFFERED=1
mkdir -p $OUT
B=tlx,tlx-fstatic,cute,cute-fstatic,fa4
timeout 100 python3 -m pytest -q -m gpu tests/test_gpu_fwd_counter.py -p no:cacheprovider \
  -rf > $OUT/tests.log 2>&1; echo "tests rc $?"; tail -3 $OUT/tests.log
bench() {  # $1 tag, then bench arguments
  local tag=$1; shift
  timeout ${TIMEOUT:-200} python3 -m harness bench --backends $B --passes fwd --warm 8 \
    --out $OUT/$tag "$@" > /tmp/$tag.log 2>&1; echo "$tag rc $?"
  python3 - "$OUT/$tag/results.csv" <<'PY'
import csv, os, sys
if os.path.exists(sys.argv[1]):
    for r in csv.DictReader(open(sys.argv[1])):
        print(r["backend"], r["suite"], r["batch"], r["heads"], r["kv_heads"], r["head_dim"],
              r["max_seqlen_q"], r["causal"], r["status"], r["ms"], r["graph_ms"],
              r["error"][:80])
PY
}
bench grid --suite varlen-llm,llm-dense \
  --match "B10 H32/8 D128|B20 H32/8 D128|B5 H32/8 D128|B10 H32/8 D64|B8 H16/16 D128 Lq8192 Lk8192 s1 bf16 causal"
TIMEOUT=120 bench fuzz0 --suite fuzz --fuzz-seed 0 --match "B3 H16/8 D128"
