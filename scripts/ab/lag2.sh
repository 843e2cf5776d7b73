#!/bin/bash
# TLX stack only: the long cells of lag.sh again, the trees alternating (main, lag2, main,
# lag2; gated in lag.sh's run), with the SM clock and power sampled beside
export PYTHONUNBUFFERED=1 AB_NOGATE=1
f="Warning\|exe_args\|warn\|run_backward"
export AB_CASES="llm-dense:B8 H16/16 D128 Lq8192 Lk8192 s1 bf16;llm-dense:B4 H32/8 D128 Lq4096 Lk4096 s1 bf16"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 2000 > /tmp/smi.log &
for r in 1 2; do
echo "== main $r:"; (cd .snap/main && PYTHONPATH=$PWD timeout 120 python3 ../../scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f")
echo "== lag2 $r:"; PYTHONPATH=$PWD timeout 120 python3 scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f"
done
kill %1; awk -F, '{print $1,$2,$3}' /tmp/smi.log | sort | uniq -c | sort -rn | head -12
