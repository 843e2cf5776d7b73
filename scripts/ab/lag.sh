#!/bin/bash
# TLX stack only (source .gpu1/activate.sh): branch tlx-lag2 (the load task's dQ reduce two
# steps behind its Q/dO loads) against main's tree in .snap/main, long backwards; then the
# TLX GPU matrix's first problems on this tree
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
f="Warning\|exe_args\|warn\|run_backward"
export AB_CASES="llm-dense:B4 H32/8 D128 Lq4096 Lk4096 s1 bf16;llm-dense:B16 H16/16 D64 Lq2048 Lk2048 s1 bf16;fuzz:broadcast_q B13;fuzz:B5 H8/4 D128;fuzz:B2 H8/2 D64 Lq16384;llm-dense:B8 H16/16 D128 Lq8192 Lk8192 s1 bf16"
echo "== main:"; (cd .snap/main && PYTHONPATH=$PWD timeout 230 python3 ../../scripts/ab/suite_ab.py 3 2>&1 | grep -v "$f")
echo "== lag2:"; PYTHONPATH=$PWD timeout 230 python3 scripts/ab/suite_ab.py 3 2>&1 | grep -v "$f"
timeout 100 python3 -m pytest -q -x tests/test_gpu_matrix.py -k "tlx" -p no:cacheprovider 2>&1 | tail -3
