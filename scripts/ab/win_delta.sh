#!/bin/bash
# A/B of branch win-delta-cute on the H200: whole key windows form their delta from P^T
# and dP^T (TLX kernels_tlx.bwd_hopper._window_delta; CuteDSL BwdMain.window_delta, at
# D = 128's 64-row step only), so the preprocess writes the delta of long sequences' rows
# only, against land-stack's tree (every row's delta in the preprocess). One device call
# after a .gpu1 activation, carrying .gpu2 and .snap (.snap/land: git archive land-stack
# harness jagged kernels_tlx kernels_cute pyproject.toml | tar -x -C .snap/land):
#   source .gpu2/activate.sh; bash scripts/ab/win_delta.sh   (~6 min) the GPU tests of the
#       windows (oracle, poisoned outputs), then gem-jagged at sparsity 0.1 (256, 512,
#       1024; D = 128 and 64) backward in both trees, FA4 in this tree's run
# Read: graph_ms of tlx / cute new against base. Compiled on the CPU, a step loop's SASS:
# TLX +24-27 %, CuteDSL (D = 128) +12 %, for a pass of O and dO less (62 MB at 256 / 0.1).
export PYTHONUNBUFFERED=1
mkdir -p $OUT
MATCH="Lq256 Lk256 s0.1 bf16|Lq512 Lk512 s0.1 bf16|Lq1024 Lk1024 s0.1 bf16"
bench() {  # $1 tree, $2 tag, $3 backends
  (cd $1 && timeout 240 python3 -m harness bench --backends $3 --passes bwd --warm 4 \
     --suite gem-jagged,gem-jagged-d64 --match "$MATCH" --out $OUT/$2 > /tmp/$2.log 2>&1)
  echo "$2 rc $?"
  python3 - "$OUT/$2/results.csv" <<'PY'
import csv, os, sys
if os.path.exists(sys.argv[1]):
    for r in csv.DictReader(open(sys.argv[1])):
        print(r["backend"], r["head_dim"], r["max_seqlen_q"], r["sparsity"], r["status"],
              r["ms"], r["graph_ms"])
PY
}
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_matrix.py tests/test_gpu_core.py \
  -k "(tlx or cute) and windows" -p no:logging -p no:cacheprovider -rf > $OUT/tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/tests.log
bench . new tlx,cute,fa4
bench .snap/land base tlx,cute
