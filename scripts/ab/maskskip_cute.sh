#!/bin/bash
# CuteDSL stack (.gpu2), after a first call that sourced .gpu1: this tree's CuteDSL
# backward gated on causal problems (D = 128's 64-row and, on cute-maskskip-split, D =
# 64's 128-row steps skip the mask), then main (.snap/main) and this tree alternating
# twice, CuteDSL and FA4 in each round
export PYTHONUNBUFFERED=1
f="Warning\|exe_args\|warn\|run_backward"
export AB_BACKENDS=cute
export AB_CASES="llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal$;llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16 causal$;varlen-llm:self B10 H32/8 D64;fuzz:B3 H16/8;fuzz:cross B2 H2/2;fuzz:B76 H2/1;fuzz:B385 H32/8"
echo "== gate:"; PYTHONPATH=$PWD timeout 150 python3 scripts/ab/suite_ab.py 1 2>&1 | grep -v "$f"
export AB_NOGATE=1 AB_BACKENDS=cute,fa4 AB_CASES="llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal$;llm-dense:self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16 causal$;varlen-llm:self B10 H32/8 D128;llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16 causal$;varlen-llm:self B10 H32/8 D64"
for r in 1 2; do
  echo "== main $r:"; (cd .snap/main && PYTHONPATH=$PWD timeout 100 python3 ../../scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f")
  echo "== skip $r:"; PYTHONPATH=$PWD timeout 100 python3 scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f"
done
