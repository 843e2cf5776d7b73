#!/bin/bash
# TLX stack only: is tlx-lag2's llm B8 H16 8192 (non-causal) loss a bimodal run-to-run
# outlier? main's tree (.snap/main) and this one alternating four times, 3 timed rounds
# each (no gate: lag.sh gated them), the SM clock and power sampled beside; then B4 H32/8
# causal, which it took 4 % off, the same way
export PYTHONUNBUFFERED=1 AB_NOGATE=1
f="Warning\|exe_args\|warn\|run_backward"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader -lms 500 > /tmp/smi.log &
for cases in "llm-dense:self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16$" "llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal$"; do
  export AB_CASES="$cases"
  for r in 1 2 3 4; do
    echo "== main $r:"; (cd .snap/main && PYTHONPATH=$PWD timeout 60 python3 ../../scripts/ab/suite_ab.py 3 2>&1 | grep -v "$f")
    echo "== lag2 $r:"; PYTHONPATH=$PWD timeout 60 python3 scripts/ab/suite_ab.py 3 2>&1 | grep -v "$f"
  done
done
kill %1; awk -F, '{print $1}' /tmp/smi.log | sort | uniq -c | sort -rn | head; awk -F, '{print $4}' /tmp/smi.log | sort | uniq -c
