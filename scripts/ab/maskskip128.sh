#!/bin/bash
# TLX stack only: D = 64 causal 128-row steps with the mask skip (tlx-maskskip128). 1) this
# tree gated on D = 64 causal problems; 2) main (.snap/main) and this tree alternating twice
export PYTHONUNBUFFERED=1
f="Warning\|exe_args\|warn\|run_backward"
export AB_CASES="llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16 causal$;varlen-llm:self B10 H32/8 D64;fuzz:B123 H32/8;fuzz:B24 H2/2"
echo "== gate:"; PYTHONPATH=$PWD timeout 60 python3 scripts/ab/suite_ab.py 1 2>&1 | grep -v "$f"
export AB_NOGATE=1 AB_CASES="llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16 causal$;varlen-llm:self B10 H32/8 D64;varlen-llm:self B20 H16/2 D64"
for r in 1 2; do
  echo "== main $r:"; (cd .snap/main && PYTHONPATH=$PWD timeout 35 python3 ../../scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f")
  echo "== skip $r:"; PYTHONPATH=$PWD timeout 35 python3 scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f"
done
