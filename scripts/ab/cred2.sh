export PYTHONUNBUFFERED=1 AB_NOGATE=1
f="Warning\|exe_args\|warn\|run_backward"
export AB_CASES="llm-dense:self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16$;llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal$;llm-dense:self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16$;llm-dense:self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16$"
nvidia-smi --query-gpu=clocks.sm,clocks_event_reasons.active --format=csv,noheader -lms 500 > /tmp/smi.log &
for r in 1 2; do
  for t in main lag2; do
    echo "== $t $r:"; (cd .snap/$t && PYTHONPATH=$PWD timeout 100 python3 ../../scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f")
  done
  echo "== cred $r:"; PYTHONPATH=$PWD timeout 100 python3 scripts/ab/suite_ab.py 2 2>&1 | grep -v "$f"
done
kill %1; awk -F, '{print $1}' /tmp/smi.log | sort | uniq -c | sort -rn | head -4; awk -F, '{print $2}' /tmp/smi.log | sort | uniq -c
