#!/bin/bash
# TLX stack only, a short run: this tree gated on two changed paths, then llm B8 H16 8192
# (lag2's loss) and B16 D64, main (.snap/main) and this tree alternating twice
export PYTHONUNBUFFERED=1
f="Warning\|exe_args\|warn\|run_backward"
export AB_CASES="llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16$;fuzz:B5 H8/4"
echo "== gate:"; PYTHONPATH=$PWD timeout 60 python3 scripts/ab/suite_ab.py 1 2>&1 | grep -v "$f"
export AB_NOGATE=1 AB_CASES="llm-dense:self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16$;llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16$"
for r in 1 2; do
  echo "== main $r:"; (cd .snap/main && PYTHONPATH=$PWD timeout 40 python3 ../../scripts/ab/suite_ab.py 3 2>&1 | grep -v "$f")
  echo "== lagrot $r:"; PYTHONPATH=$PWD timeout 40 python3 scripts/ab/suite_ab.py 3 2>&1 | grep -v "$f"
done
