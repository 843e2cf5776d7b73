#!/bin/bash
# TLX stack only (source .gpu1/activate.sh): branch round1 (list-pdl + win-runs over main)
# against main's tree in .snap/main: the KV list as the preprocess's dependent (seven fuzz
# backwards, replayed, gated), then the list kernels alone (win-runs)
export PYTHONUNBUFFERED=1 AB_BACKENDS=tlx
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
f="Warning\|exe_args\|warn\|run_backward"
echo "== main:"; (cd .snap/main && PYTHONPATH=$PWD timeout 200 python3 ../../scripts/ab/pdl_ab.py 3 2>&1 | grep -v "$f")
echo "== round1:"; PYTHONPATH=$PWD timeout 200 python3 scripts/ab/pdl_ab.py 3 2>&1 | grep -v "$f"
bash scripts/ab/list.sh
