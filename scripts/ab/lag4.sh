#!/bin/bash
# TLX stack only: tlx-lag2 (.snap/lag2) against main (.snap/main) on llm B8 H16 8192
# (non-causal), where lag2 had slow samples, and B4 H32/8 causal; the trees alternating
# four times, 3 rounds each, the SM clock and its event reasons sampled with timestamps
export PYTHONUNBUFFERED=1 AB_NOGATE=1
f="Warning\|exe_args\|warn\|run_backward"
export AB_CASES="llm-dense:self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16$;llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal$"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader -lms 250 > /tmp/smi.log &
for r in 1 2 3 4; do
  for t in main lag2; do
    echo "== $t $r $(date +%T.%N | cut -c1-12):"; (cd .snap/$t && PYTHONPATH=$PWD timeout 100 python3 ../../scripts/ab/suite_ab.py 3 2>&1 | grep -v "$f")
  done
done
kill %1; cp /tmp/smi.log $OUT/smi.log; awk -F, '{print $4}' /tmp/smi.log | sort | uniq -c
