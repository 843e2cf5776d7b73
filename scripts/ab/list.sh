#!/bin/bash
# The list kernels alone, main's tree (.snap/main: git archive main | tar -x -C .snap/main,
# reports/ and tests/ left out to stay under the send limit) against this one, two rounds;
# TLX stack only:   source .gpu1/activate.sh >/dev/null; bash scripts/ab/list.sh
export PYTHONUNBUFFERED=1
for r in 1 2; do
  echo "== main $r"; (cd .snap/main && PYTHONPATH=$PWD timeout 60 python3 ../../scripts/ab/list_ab.py 2>&1 | grep -v Warn)
  echo "== this tree $r"; PYTHONPATH=$PWD timeout 60 python3 scripts/ab/list_ab.py 2>&1 | grep -v Warn
done
