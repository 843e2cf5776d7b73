#!/bin/bash
# A/B of the TLX backward's dQ-before-dK step (tlx) against dK first (tlx-x), FA4 beside,
# every row through the oracle gate: the 64-row D = 128 paths (llm, varlen-llm, gem 2048 /
# 0.9, fuzz B5), the 32-row windows (gem 256 / 0.1) and D = 64's 64-row step (fuzz B48).
#   source .gpu2/activate.sh; bash scripts/ab/dqfirst.sh $OUT/dqf
out=${1:-reports/ab-dqfirst}
python -m harness bench --suite llm-dense,varlen-llm,gem-jagged,fuzz --passes bwd \
  --backends tlx,tlx-x,fa4 --warm 12 --out "$out" \
  --match "B8 H16/16 D128 Lq8192 Lk8192 s1 bf16 causal|B4 H32/8 D128 Lq4096 Lk4096 s1 bf16|B10 H32/8 D128 Lq8192|B1152 H4/4 D128 Lq2048 Lk2048 s0.9 bf16|B1152 H4/4 D128 Lq256 Lk256 s0.1 bf16|B5 H8/4 D128|B48 H8/1 D64"
