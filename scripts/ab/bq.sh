#!/bin/bash
# Broadcast-Q backward A/B, after the stacks' activation (CuteDSL / FA4: the second run
# call): PART=ab main's tree (.snap/main: git archive main | tar -x -C .snap/main) against
# this one over the fuzz broadcast-Q shapes; PART=prof `harness profile` of B13 here
# with its replayed kernels, then the random GPU matrix's first problems and the packed
# broadcast-Q cases.
#   source .gpu2/activate.sh; PART=ab bash scripts/ab/bq.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
f="Warning\|exe_args\|warn\|run_backward"
case ${PART:-ab} in
ab)
  echo "== main:"; (cd .snap/main && PYTHONPATH=$PWD timeout 280 python3 ../../scripts/ab/bq_ab.py 3 2>&1 | grep -v "$f")
  echo "== this tree:"; PYTHONPATH=$PWD timeout 290 python3 scripts/ab/bq_ab.py 3 pdl 2>&1 | grep -v "$f" ;;
prof)
  timeout 130 python3 -m harness profile --suite fuzz --backends tlx,cute \
    --match "broadcast_q B13" --passes bwd 2>&1 | grep -v "$f"
  JAGGED_MATRIX_N=16 timeout 170 python3 -m pytest -q -m gpu tests/test_gpu_matrix.py \
    -k "(test_matrix and (tlx or cute)) or (broadcast_q_packed and tlx)" -p no:cacheprovider 2>&1 | tail -15 ;;
esac
