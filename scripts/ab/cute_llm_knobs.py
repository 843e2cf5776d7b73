"""CuteDSL backward, llm-dense B8 H16 8192 non-causal D128, one config variant a process
(dQ form and step rows forced), gated on B2 with the same forced config, then timed in
turn with the other processes (files .snap/turn)."""
import os, sys, time
import kernels_cute.bwd_hopper as bh
from harness import backends
from harness.bench import call_kw, pass_call, _time, _free
from harness.gpu.profile import kernel_times
from harness.oracle import check
from harness.problems import suites

var, idx, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
flat = var in ("plain+flat", "long+flat")
plain = var.startswith("plain")
bh.takes_flat = lambda *a, **k: flat
bh.takes_plain = lambda *a, **k: plain
label = "self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16"
p = next(p for p in suites()["llm-dense"] if p.label() == label)
fn = backends.get("cute").fn()
kw = call_kw(p)
t0 = time.time()
rep = check(p.replace(batch=2).build("cuda"), fn, backward=True, check_lse=True, **kw)
print(f"{var}: gate {'ok' if rep.ok else 'FAIL'} ({time.time() - t0:.0f}s)", flush=True)
_free()
call, outs = pass_call(fn, p.build("cuda"), "bwd", kw)
call(); import torch; torch.cuda.synchronize()
while int(open(".snap/turn").read() or 0) != idx:
    time.sleep(0.2)
ms = _time(call, False)
kt = kernel_times(call, 3)
print(f"{var}: do_bench {ms:.3f} ms; " + "; ".join(f"{k[48:80]} {v:.3f}" for k, v in
      list(kt.items())[:3]), flush=True)
open(".snap/turn", "w").write(str(idx + 1))
