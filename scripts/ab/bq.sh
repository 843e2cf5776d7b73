#!/bin/bash
# Broadcast-Q backward A/B: main's tree (.snap/main: git archive main | tar -x -C
# .snap/main) against this one, then `harness profile` of B13 / B4 here with its replayed
# kernels. After the stacks' activation (CuteDSL / FA4: the second run call):
#   source .gpu2/activate.sh; bash scripts/ab/bq.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
f="Warning\|exe_args\|warn\|run_backward"
echo "== main:"; (cd .snap/main && PYTHONPATH=$PWD timeout 200 python3 ../../scripts/ab/bq_ab.py 3 2>&1 | grep -v "$f")
echo "== this tree:"; PYTHONPATH=$PWD timeout 200 python3 scripts/ab/bq_ab.py 3 pdl 2>&1 | grep -v "$f"
echo "== profile:"; timeout 150 python3 -m harness profile --suite fuzz --backends tlx,cute,fa4 \
  --match "broadcast_q B13|broadcast_q B4 " --passes bwd 2>&1 | grep -v "$f"
