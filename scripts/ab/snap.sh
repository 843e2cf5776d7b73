#!/bin/bash
# On the CPU machine, before a device call: .snap/<branch> holds each named branch's
# tree (code only: no reports, tests or scripts), so one run can time several trees.
# Usage: bash scripts/ab/snap.sh main tlx-maskskip ...
set -e
rm -rf .snap
for b in "$@"; do
  mkdir -p ".snap/$b"
  git archive "$b" | tar -x -C ".snap/$b"
  rm -rf ".snap/$b/reports" ".snap/$b/tests" ".snap/$b/scripts"
done
du -sh .snap
