#!/bin/bash
# A/B of branch win-passes on the H200: the key windows' preprocess zeroing and rows
# postprocess by blocks of WIN_TOK tokens (one search a token; the post's ahead of its
# wait) and CuteDSL's preprocess in PRE_GROUPS row groups, against flat-next's tree. Two
# device calls, after a .gpu1 activation, carrying .gpu2 and .snap (.snap/wbase: git
# archive flat-next harness jagged kernels_tlx kernels_cute pyproject.toml | tar -x -C
# .snap/wbase):
#   source .gpu2/activate.sh; bash scripts/ab/win_passes.sh a   (~5 min) the GPU tests of
#       the windows (oracle, poisoned outputs), then this tree with FA4
#   source .gpu2/activate.sh; bash scripts/ab/win_passes.sh b   (~4 min) the base tree;
#       the kernels' own times (torch.profiler, D = 128, 256 / 0.1) in both trees; the
#       window list kernel alone (window_list.py: list-loads' search and check) in both
#   source .gpu2/activate.sh; bash scripts/ab/win_passes.sh c   (~8 min) tlx-win1 /
#       cute-win1: the backward over key windows up to a mean of a whole tile of keys
#       (128; the default 64), its windows of sequences of at most 128 keys owned, their dQ
#       stored whole (no fp32 accumulator rows): fuzz shapes of seeds 0-2 with a mean of
#       65-128 keys and gem-jagged 1024 / 0.1, against tlx / cute and FA4 in one run
#   source .gpu2/activate.sh; bash scripts/ab/win_passes.sh d   (~5 min) tlx-nosort /
#       cute-nosort: the window lists in row order, no sort (its ~5 us of the forward's
#       13.6 us list at 256 / 0.1) against the balance it buys, both passes, gem 256 / 512
#       at 0.1, D = 128 and 64
# The timed cells of a and b: gem-jagged 256 / 512 at 0.1 and 2048 / 0.9 (CuteDSL's row
# groups on a long call), D = 128 and 64, backward, both styles.
export PYTHONUNBUFFERED=1
mkdir -p $OUT
W=tlx,tlx-win1,cute,cute-win1,fa4  # c, c1
MATCH="Lq256 Lk256 s0.1 bf16|Lq512 Lk512 s0.1 bf16|Lq2048 Lk2048 s0.9 bf16"
bench() {  # $1 tree, $2 tag, $3 backends, then more bench arguments
  local root=$1 tag=$2 backends=$3; shift 3
  (cd $root && timeout ${TIMEOUT:-200} python3 -m harness bench --backends $backends \
     --passes bwd --warm 4 --out $OUT/$tag "$@" > /tmp/$tag.log 2>&1)
  echo "$tag rc $?"
  python3 - "$OUT/$tag/results.csv" <<'PY'
import csv, os, sys
if os.path.exists(sys.argv[1]):
    for r in csv.DictReader(open(sys.argv[1])):
        print(r["backend"], r["pass"], r["batch"], r["heads"], r["kv_heads"], r["head_dim"],
              r["max_seqlen_q"], r["max_seqlen_k"], r["sparsity"], r["causal"], r["status"],
              r["ms"], r["graph_ms"])
PY
}
case $1 in
  a) timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_matrix.py tests/test_gpu_core.py \
       -k "test_windows or short-windows" -p no:logging -rf > $OUT/tests.log 2>&1
     echo "tests rc $?"; tail -3 $OUT/tests.log
     bench . new tlx,cute,fa4 --suite gem-jagged,gem-jagged-d64 --match "$MATCH" ;;
  b) bench .snap/wbase base tlx,cute --suite gem-jagged,gem-jagged-d64 --match "$MATCH"
     for root in . .snap/wbase; do
       (cd $root && timeout 50 python3 -m harness profile --suite gem-jagged --backends tlx,cute \
          --passes bwd --match "Lq256 Lk256 s0.1 bf16" --n 20 2>&1 | tail -25)
       (cd $root && timeout 40 python3 $OLDPWD/scripts/ab/window_list.py \
          $([ $root = . ] && echo new || echo base) 2>&1 | grep -E "WINDOW_LIST|GRAPH|Error")
     done ;;
  c) export TIMEOUT=130
     bench . win_s0 $W --suite fuzz --fuzz-seed 0 --match "B24 H2/2 D128|B385 H32/8|B395 H1/1"
     bench . win_s2 $W --suite fuzz --fuzz-seed 2 --match "B53 H16/2|B119 H8/4" ;&
  c1) export TIMEOUT=130  # c's seed 1 shapes and gem 1024 / 0.1 alone (~4 min)
     bench . win_s1 $W --suite fuzz --fuzz-seed 1 --match "B457 H8/1|B222 H4/4|B23 H8/8"
     bench . win_gem $W --suite gem-jagged --match "Lq1024 Lk1024 s0.1 bf16" ;;
  d) export TIMEOUT=280
     bench . nosort tlx,tlx-nosort,cute,cute-nosort --suite gem-jagged,gem-jagged-d64 \
       --match "Lq256 Lk256 s0.1 bf16|Lq512 Lk512 s0.1 bf16" --passes fwd,bwd ;;
esac
