#!/bin/bash
# TLX stack only: branch tlx-q3 (a 3-deep Q/dO ring at D = 128's 64-row step) against main's
# tree in .snap/main, long D = 128 backwards, the trees alternating (the first round gated)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
f="Warning\|exe_args\|warn\|run_backward"
export AB_CASES="llm-dense:B4 H32/8 D128 Lq4096 Lk4096 s1 bf16;fuzz:B5 H8/4 D128;llm-dense:B8 H16/16 D128 Lq8192 Lk8192 s1 bf16"
for r in 1 2; do
echo "== main $r:"; (cd .snap/main && PYTHONPATH=$PWD timeout 130 python3 ../../scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f")
echo "== q3 $r:"; PYTHONPATH=$PWD timeout 130 python3 scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f"
export AB_NOGATE=1
done
