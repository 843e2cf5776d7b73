#!/bin/bash
# A/B of the windows of whole sequences (branch aligned-windows: jagged.tiles.windows
# packs short sequences greedily, both passes over them; key windows holding all their
# sequences' keys store dQ directly) on the H200, one device call each:
#   bash scripts/ab/windows.sh gate     # both styles, fwd + bwd, vs the oracle, ~4 min
#   bash scripts/ab/windows.sh new a|b  # this tree (tlx, cute, FA4): a: gem-jagged(-d64)
#                                       #   256 / 0.1 and 512 / 0.1; b: the fuzz shapes of
#                                       #   seeds 0-2 that take windows; ~5 min each
#   bash scripts/ab/windows.sh old a|b  # main's tree (.snap/base: git archive main harness
#                                       #   jagged kernels_tlx kernels_cute pyproject.toml |
#                                       #   tar -x -C .snap/base), the same shapes
#   bash scripts/ab/windows.sh kernels  # the list kernel alone and each kernel's time a
#                                       #   call (harness profile) at gem 256 / 512 / 0.1,
#                                       #   both trees, ~4 min
# Each: `source .gpu2/activate.sh; bash scripts/ab/windows.sh X` carrying .gpu2 and .snap,
# after a .gpu1 activation. CSVs land in $OUT, logs in /tmp.
export PYTHONUNBUFFERED=1
mkdir -p $OUT
SHORT="Lq256 Lk256 s0.1 bf16|Lq512 Lk512 s0.1 bf16"
FUZZ=("0|B300 H8/4|B394 H32/8|B43 H16/4|B986 H16/8|B300 H16/8" "1|B807 H32/8|B35 H4/1|B650 H16/8"
      "2|B84 H1/1|B311 H2/2|B115 H2/2|B929 H4/4")
run() {  # $1 tag, $2 root, then bench arguments
  local tag=$1 root=$2; shift 2
  (cd $root && timeout ${TIMEOUT:-140} python3 -m harness bench --backends tlx,cute,fa4 \
     --passes fwd,bwd --warm 6 --out $OUT/$tag "$@" > /tmp/$tag.log 2>&1); echo "$tag rc $?"
  python3 - "$OUT/$tag/results.csv" <<'PY'
import csv, os, sys
if os.path.exists(sys.argv[1]):
    for r in csv.DictReader(open(sys.argv[1])):
        print(r["backend"], r["pass"], r["mode"], r["batch"], r["heads"],
              r["kv_heads"], r["head_dim"], r["max_seqlen_q"], r["max_seqlen_k"], r["sparsity"],
              r["causal"], r["dtype"], r["status"], r["ms"], r["graph_ms"], r["error"][:120])
PY
}
shapes() {  # $1 tag, $2 root, $3 half
  if [ "$3" = a ]; then
    run $1_gem $2 --suite gem-jagged --match "$SHORT"
    run $1_gem64 $2 --suite gem-jagged-d64 --match "$SHORT"
  else
    for spec in "${FUZZ[@]}"; do
      run $1_fuzz${spec%%|*} $2 --suite fuzz --fuzz-seed ${spec%%|*} --match "${spec#*|}"
    done
  fi
}
case $1 in
  gate) timeout 300 python3 scripts/ab/gate_windows.py tlx,cute > /tmp/gate_windows.log 2>&1
        echo "gate rc $?"; cp /tmp/gate_windows.log $OUT/
        grep -E "BAD|GATE_WINDOWS|Error" /tmp/gate_windows.log | head -20
        timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_matrix.py tests/test_gpu_core.py \
          -k "test_windows or short-windows" > /tmp/gpu_windows.log 2>&1
        echo "gpu windows rc $?"; tail -3 /tmp/gpu_windows.log
        # fp8 forwards over row windows (each row its own sequence's descales)
        timeout 120 python3 -m pytest -q -m gpu tests/test_fp8_kernel.py -k short \
          > /tmp/gpu_fp8_windows.log 2>&1; echo "fp8 windows rc $?"; tail -3 /tmp/gpu_fp8_windows.log ;;
  kernels)
    for root in . .snap/base; do
      (cd $root && timeout 60 python3 $OLDPWD/scripts/ab/window_list_time.py $root)
      (cd $root && timeout 150 python3 -m harness profile --backends tlx,cute \
         --suite gem-jagged --match "$SHORT" > /tmp/profile_$(basename $root).log 2>&1)
      echo "profile $root rc $?"; grep -vE "^\s*$" /tmp/profile_$(basename $root).log | tail -40
    done ;;
  new) shapes new . $2 ;;
  old) shapes old .snap/base $2 ;;
esac
