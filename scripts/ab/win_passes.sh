#!/bin/bash
# A/B of branch win-passes on the H200: the key windows' preprocess zeroing and rows
# postprocess by blocks of WIN_TOK tokens (one search a token; the post's ahead of its
# wait) against flat-next's per-row searches. One device call, after a .gpu1 activation,
# carrying .gpu2 and .snap (.snap/wbase: git archive flat-next harness jagged kernels_tlx
# kernels_cute pyproject.toml | tar -x -C .snap/wbase):
#   source .gpu2/activate.sh; bash scripts/ab/win_passes.sh        (~9 min)
# The GPU tests of the windows first (oracle, poisoned outputs), then gem-jagged 256 / 512
# at 0.1 and 2048 / 0.9 (CuteDSL's preprocess in PRE_GROUPS row groups on every call; D =
# 128 and 64) backward, both styles, this tree with FA4 and the base tree, and
# the kernels' own times (torch.profiler) at D = 128 in both trees; then the window list
# kernel alone (window_list.py: the search by loads of branch list-loads) in both trees.
export PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_matrix.py tests/test_gpu_core.py \
  -k "test_windows or short-windows" -p no:logging -rf > $OUT/tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/tests.log
for root in . .snap/wbase; do
  tag=$([ $root = . ] && echo new || echo base)
  backends=$([ $root = . ] && echo tlx,cute,fa4 || echo tlx,cute)
  (cd $root && timeout 200 python3 -m harness bench --backends $backends --passes bwd \
     --suite gem-jagged,gem-jagged-d64 \
     --match "Lq256 Lk256 s0.1 bf16|Lq512 Lk512 s0.1 bf16|Lq2048 Lk2048 s0.9 bf16" \
     --warm 4 --out $OUT/$tag > /tmp/$tag.log 2>&1)
  echo "$tag rc $?"
  python3 - "$OUT/$tag/results.csv" <<'PY'
import csv, os, sys
if os.path.exists(sys.argv[1]):
    for r in csv.DictReader(open(sys.argv[1])):
        print(r["backend"], r["head_dim"], r["max_seqlen_q"], r["status"], r["ms"],
              r["graph_ms"], r["copy_tbps"])
PY
  (cd $root && timeout 60 python3 -m harness profile --suite gem-jagged --backends tlx,cute \
     --passes bwd --match "Lq256 Lk256 s0.1 bf16" --n 20 2>&1 | grep -iE "pre|post|kernel|us" |
     head -20)
done
for root in . .snap/wbase; do
  (cd $root && timeout 40 python3 $OLDPWD/scripts/ab/window_list.py \
     $([ $root = . ] && echo new || echo base) 2>&1 | grep -E "WINDOW_LIST|GRAPH|Error")
done
