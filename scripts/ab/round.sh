#!/bin/bash
# TLX stack only, one device call for the backward experiments built but not run, in the
# order they matter (each part stops at its own timeout; every tree is oracle-gated on
# the problems of its change before it is timed against main's, the trees alternating):
#   1. tlx-maskskip    causal packed 64-row steps mask only the steps that need it
#   2. land-lagrot     load task's reduce two steps behind + per-tile Q walk start (B8!)
#   3. tlx-maskskip-split  1 + D = 64's causal 128-row steps in a masked and an unmasked
#      loop (tlx-maskskip128: the same by a branch, 41 spill instructions a step)
# Setup on the CPU machine: bash scripts/ab/snap.sh main tlx-maskskip land-lagrot
# tlx-maskskip-split, move reports/ out of the tree (64 MiB per send), carry .gpu1, .snap
export PYTHONUNBUFFERED=1
f="Warning\|exe_args\|warn\|run_backward"
S=$PWD/scripts/ab/suite_ab.py
tree() {  # tree NAME ROUNDS: run suite_ab.py in .snap/NAME
  (cd ".snap/$1" && PYTHONPATH=$PWD timeout "${T:-60}" python3 "$S" "$2" 2>&1 | grep -v "$f")
}
ab() {  # ab BRANCH GATE_CASES TIME_CASES
  echo "=== $1 gate"; AB_CASES="$2" T=90 tree "$1" 1
  for r in 1 2; do
    for t in main "$1"; do echo "== $t $r"; AB_NOGATE=1 AB_CASES="$3" tree "$t" 2; done
  done
}
parts=" ${*:-1 2 3} "  # which parts to run, e.g. `round.sh 1 3`
C4="llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal$"
[[ $parts == *" 1 "* ]] && ab tlx-maskskip "$C4;fuzz:B3 H16/8;fuzz:cross B2 H2/2;fuzz:B115 H4/2;fuzz:B76 H2/1;fuzz:B62 H4/1;fuzz:B385 H32/8" \
   "$C4;llm-dense:self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16 causal$;varlen-llm:self B10 H32/8 D128"
[[ $parts == *" 2 "* ]] && ab land-lagrot "llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16$;fuzz:B5 H8/4;fuzz:B2 H8/2 D64" \
   "llm-dense:self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16$;llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16$"
[[ $parts == *" 3 "* ]] && ab tlx-maskskip-split "llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16 causal$;varlen-llm:self B10 H32/8 D64;fuzz:B123 H32/8" \
   "llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16 causal$;varlen-llm:self B10 H32/8 D64"
