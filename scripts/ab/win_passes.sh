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
# The timed cells: gem-jagged 256 / 512 at 0.1 and 2048 / 0.9 (CuteDSL's row groups on a
# long call), D = 128 and 64, backward, both styles.
export PYTHONUNBUFFERED=1
mkdir -p $OUT
MATCH="Lq256 Lk256 s0.1 bf16|Lq512 Lk512 s0.1 bf16|Lq2048 Lk2048 s0.9 bf16"
bench() {  # $1 tree, $2 tag, $3 backends
  (cd $1 && timeout 200 python3 -m harness bench --backends $3 --passes bwd \
     --suite gem-jagged,gem-jagged-d64 --match "$MATCH" --warm 4 --out $OUT/$2 \
     > /tmp/$2.log 2>&1)
  echo "$2 rc $?"
  python3 - "$OUT/$2/results.csv" <<'PY'
import csv, os, sys
if os.path.exists(sys.argv[1]):
    for r in csv.DictReader(open(sys.argv[1])):
        print(r["backend"], r["head_dim"], r["max_seqlen_q"], r["sparsity"], r["status"],
              r["ms"], r["graph_ms"])
PY
}
case $1 in
  a) timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_matrix.py tests/test_gpu_core.py \
       -k "test_windows or short-windows" -p no:logging -rf > $OUT/tests.log 2>&1
     echo "tests rc $?"; tail -3 $OUT/tests.log
     bench . new tlx,cute,fa4 ;;
  b) bench .snap/wbase base tlx,cute
     for root in . .snap/wbase; do
       (cd $root && timeout 50 python3 -m harness profile --suite gem-jagged --backends tlx,cute \
          --passes bwd --match "Lq256 Lk256 s0.1 bf16" --n 20 2>&1 | tail -25)
       (cd $root && timeout 40 python3 $OLDPWD/scripts/ab/window_list.py \
          $([ $root = . ] && echo new || echo base) 2>&1 | grep -E "WINDOW_LIST|GRAPH|Error")
     done ;;
esac
