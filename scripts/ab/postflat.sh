#!/bin/bash
# PostFlat over (block, query head) CTAs, this branch against main, one call after the
# stacks' activation (CuteDSL / FA4: the second run call); main's tree first extracted
# beside it (git archive main | tar -x -C .snap/main) and carried:
#   source .gpu2/activate.sh; bash scripts/ab/postflat.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== main:"; (cd .snap/main && PYTHONPATH=$PWD timeout 280 python3 ../../scripts/ab/postflat_ab.py 2>&1 | grep -v "Warning\|exe_args\|warn")
echo "== postflat-heads:"; PYTHONPATH=$PWD timeout 280 python3 scripts/ab/postflat_ab.py 2>&1 | grep -v "Warning\|exe_args\|warn"
