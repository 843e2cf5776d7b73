#!/bin/bash
# A/B of bwd_parts without the causal last round's idle part (tlx / cute, this tree)
# against main's rule (tlx-x / cute-x, scripts/ab/tiles_base.py), FA4 beside, every row
# through the oracle gate: seven causal fuzz shapes whose parts it changes (seeds 1, 3, 4,
# 10, 15, 17, 28: 1 -> 2, 2 -> 1, 2 -> 4, 2 -> 4, 2 -> 1, 2 -> 1, 1 -> 4).
#   source .gpu2/activate.sh; bash scripts/ab/parts_idle.sh $OUT/idle
out=${1:-reports/ab-parts-idle}
python -m harness bench --suite fuzz --fuzz-seed 1,3,4,10,15,17,28 --passes bwd \
  --backends tlx,tlx-x,cute,cute-x,fa4 --warm 12 --out "$out" \
  --match "self B4 H2/1 D128 Lq8192 Lk8192 s0.9|self B3 H1/1 D128 Lq16384 Lk16384 s0.5|self B1 H1/1 D64 Lq16384|self B1 H8/1 D128 Lq16384|self B4 H4/1 D128 Lq16384|self B7 H16/2 D64 Lq16384|cross B3 H16/8 D128 Lq8192 Lk1024"
