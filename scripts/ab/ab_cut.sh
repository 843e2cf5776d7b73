#!/bin/bash
# Causal key windows cut at their first sequence's first seeing row (this branch), one call on
# the device after the stacks' activation (CuteDSL / FA4: the second run call):
#   source .gpu2/activate.sh; bash scripts/ab/ab_cut.sh
# Gates TLX / CuteDSL / FA4 on fuzz cross B8 H1/1 D128 8192 / 128 causal and checks a cross
# causal problem of one-sequence windows whole, then times the fuzz shape in 3 rounds. The
# tree before it (main at the branch point) timed the same shape on an H100 at replayed
# TLX 0.0887 ms, CuteDSL 0.0896, FA4 0.0545: rerun it beside (git worktree) for the A/B.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 500 python3 scripts/ab/ab_cut.py 2>&1 | grep -v "Warning\|exe_args"
