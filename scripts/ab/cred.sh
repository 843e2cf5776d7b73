#!/bin/bash
# TLX stack only. 1) this tree gated (whole problem, backward) on the 64- and 128-row
# steps' paths (D = 128 column halves, D = 64 row halves and summed boxes, GQA, causal,
# broadcast-Q slots, split tiles); 2) main (.snap/main), tlx-lag2 (.snap/lag2) and this
# tree alternating twice on the long cells, the SM clock and throttle reasons beside
export PYTHONUNBUFFERED=1
f="Warning\|exe_args\|warn\|run_backward"
export AB_CASES="llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal$;llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16 causal$;fuzz:B48 H8/1 D64;fuzz:B13 H2/2;fuzz:B4 H32/4;fuzz:B2 H8/2 D64;fuzz:B2 H16/8;fuzz:B32 H4/4;fuzz:B21 H1/1;fuzz:B3 H16/8;fuzz:B62 H4/1;fuzz:B230 H2/1;fuzz:B27 H16/8"
echo "== cred gate:"; PYTHONPATH=$PWD timeout 200 python3 scripts/ab/suite_ab.py 1 2>&1 | grep -v "$f"
export AB_NOGATE=1
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader -lms 500 > /tmp/smi.log &
export AB_CASES="llm-dense:self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16$;llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal$;llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16$;llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16$;fuzz:B2 H8/2 D64;fuzz:B5 H8/4;fuzz:B13 H2/2"
for r in 1 2; do
  for t in main lag2; do
    echo "== $t $r:"; (cd .snap/$t && PYTHONPATH=$PWD timeout 100 python3 ../../scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f")
  done
  echo "== cred $r:"; PYTHONPATH=$PWD timeout 100 python3 scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f"
done
kill %1; awk -F, '{print $1}' /tmp/smi.log | sort | uniq -c | sort -rn | head -6; awk -F, '{print $4}' /tmp/smi.log | sort | uniq -c
