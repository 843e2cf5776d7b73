#!/bin/bash
# TLX stack only, one short run. 1) this tree gated (whole problem, backward) on causal,
# cross-causal, broadcast-Q causal and partial-tile problems; 2) main (.snap/main) and this
# tree alternating twice on causal and non-causal long cells
export PYTHONUNBUFFERED=1
f="Warning\|exe_args\|warn\|run_backward"
export AB_CASES="llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal$;fuzz:B3 H16/8;fuzz:cross B2 H2/2;fuzz:B115 H4/2;fuzz:B76 H2/1;fuzz:B62 H4/1;fuzz:B385 H32/8"
echo "== gate:"; PYTHONPATH=$PWD timeout 60 python3 scripts/ab/suite_ab.py 1 2>&1 | grep -v "$f"
export AB_NOGATE=1 AB_CASES="llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal$;llm-dense:self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16 causal$;varlen-llm:self B10 H32/8 D128;llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16$"
for r in 1 2; do
  echo "== main $r:"; (cd .snap/main && PYTHONPATH=$PWD timeout 35 python3 ../../scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f")
  echo "== skip $r:"; PYTHONPATH=$PWD timeout 35 python3 scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f"
done
