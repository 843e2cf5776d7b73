#!/bin/bash
# Branch list-pdl against main (.snap/main: git archive main | tar -x -C .snap/main, reports/
# and tests/ left out), after the stacks' activation (CuteDSL / FA4: the second run call):
#   source .gpu2/activate.sh; bash scripts/ab/pdl.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
f="Warning\|exe_args\|warn\|run_backward"
echo "== main:"; (cd .snap/main && PYTHONPATH=$PWD timeout 280 python3 ../../scripts/ab/pdl_ab.py 3 2>&1 | grep -v "$f")
echo "== list-pdl:"; PYTHONPATH=$PWD timeout 280 python3 scripts/ab/pdl_ab.py 3 2>&1 | grep -v "$f"
