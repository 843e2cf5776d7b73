#!/bin/bash
# The backward stack over main, backward, a few cells of each class the stack changes: this
# tree (tag new, FA4 beside), then the tree before it (.snap/base, tag base: git archive
# 81bcc88 harness jagged kernels_tlx kernels_cute pyproject.toml tests scripts | tar -x -C
# .snap/base), one call (~8 min; T1 / T2 the grid's and the fuzz cell's time limits):
#   source .gpu3/activate.sh; [TAGS=new] bash scripts/ab/land_ab.sh
export PYTHONUNBUFFERED=1
mkdir -p $OUT
M=${M:-"Lq256 Lk256 s0.1 bf16|Lq512 Lk512 s0.1 bf16|Lq1024 Lk1024 s0.1 bf16|Lq1024 Lk1024 s0.9 bf16|Lq2048 Lk2048 s0.9 bf16|B8 H16/16 D128 Lq8192 Lk8192 s1 bf16"}
show() {
python3 - "$1" <<'PY'
import csv, os, sys
if os.path.exists(sys.argv[1]):
    for r in csv.DictReader(open(sys.argv[1])):
        print(r["backend"], r["suite"], r["batch"], r["heads"], r["kv_heads"], r["head_dim"],
              r["max_seqlen_q"], r["sparsity"], r["causal"], r["status"], r["ms"], r["graph_ms"],
              r["error"][:80])
PY
}
for tag in ${TAGS:-new base}; do
root=$([ $tag = new ] && echo . || echo .snap/base)
be=$([ $tag = new ] && echo tlx,cute,fa4 || echo tlx,cute)
(cd $root && timeout ${T2:-90} python3 -m harness bench --backends $be --passes bwd --warm 8 \
   --suite fuzz --fuzz-seed 15 --match "B8 H8/1 D128 Lq512" --out $OUT/${tag}_f15 \
   > $OUT/${tag}_f15.log 2>&1)
echo "$tag fuzz rc $?"; show $OUT/${tag}_f15/results.csv
(cd $root && timeout ${T1:-420} python3 -m harness bench --backends $be --passes bwd --warm 8 \
   --suite gem-jagged,llm-dense,varlen-llm --match "$M" --out $OUT/${tag}_grid \
   > $OUT/${tag}_grid.log 2>&1)
echo "$tag grid rc $?"; show $OUT/${tag}_grid/results.csv
done
