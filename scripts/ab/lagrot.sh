#!/bin/bash
# TLX stack only: tlx-lag2 with tlx-rot's Q walk (non-causal tiles of a head start at their
# own block). 1) this tree oracle-gated on the changed paths; 2) main (.snap/main) and this
# tree alternating twice on the long cells, the clock's event reasons beside
export PYTHONUNBUFFERED=1
f="Warning\|exe_args\|warn\|run_backward"
export AB_CASES="llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16$;llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16$;fuzz:B5 H8/4;fuzz:B2 H8/2 D64"
echo "== lagrot gate:"; PYTHONPATH=$PWD timeout 150 python3 scripts/ab/suite_ab.py 1 2>&1 | grep -v "$f"
export AB_NOGATE=1
nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv,noheader -lms 500 > /tmp/smi.log &
export AB_CASES="llm-dense:self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16$;llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal$;llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16$;fuzz:B2 H8/2 D64"
for r in 1 2; do
  echo "== main $r:"; (cd .snap/main && PYTHONPATH=$PWD timeout 100 python3 ../../scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f")
  echo "== lagrot $r:"; PYTHONPATH=$PWD timeout 100 python3 scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f"
done
kill %1; sort /tmp/smi.log | uniq -c
