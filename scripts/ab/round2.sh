#!/bin/bash
# After both stacks' activation (source .gpu2/activate.sh): branch list-pdl against main's
# tree (.snap/main) for CuteDSL on four fuzz backwards (TLX ran in round1.sh), FA4 and TLX
# beside in this tree; then ncu of the three main kernels at llm GQA causal (gap 3)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
f="Warning\|exe_args\|warn\|run_backward"
export AB_MATCH="broadcast_q B13|broadcast_q B4 |cross B2 H16/8 D128|self B40 H8/8 D64"
echo "== main:"; (cd .snap/main && AB_BACKENDS=cute PYTHONPATH=$PWD timeout 220 python3 ../../scripts/ab/pdl_ab.py 3 2>&1 | grep -v "$f")
echo "== list-pdl:"; AB_BACKENDS=cute,tlx,fa4 PYTHONPATH=$PWD timeout 220 python3 scripts/ab/pdl_ab.py 3 2>&1 | grep -v "$f"
