#!/bin/bash
# TLX stack only: branch tlx-rot (non-causal tiles of a head start their Q walk at their own
# block) against main's tree in .snap/main, long non-causal backwards; main, this tree
# (gated), main, this tree
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
f="Warning\|exe_args\|warn\|run_backward"
export AB_CASES="llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16$;llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16$;gem-jagged:self B1152 H4/4 D128 Lq2048 Lk2048 s0.9 bf16$;llm-dense:self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16$"
echo "== main 1:"; (cd .snap/main && AB_NOGATE=1 PYTHONPATH=$PWD timeout 90 python3 ../../scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f")
echo "== rot 1:"; PYTHONPATH=$PWD timeout 130 python3 scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f"
