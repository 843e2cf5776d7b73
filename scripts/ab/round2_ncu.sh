#!/bin/bash
# source .gpu2/activate.sh; ncu of the three main kernels at llm GQA causal (gap 3)
export PYTHONUNBUFFERED=1
f="Warning\|exe_args\|warn\|run_backward"
timeout 500 python3 -m harness.gpu.ncu_sass run --backends tlx,cute,fa4 --passes bwd --suite llm-dense --match "B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal" --out $OUT/ncu 2>&1 | grep -v "$f" | tail -200
