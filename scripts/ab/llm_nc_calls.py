"""Per-call times (CUDA events, L2 flushed before each call) of the llm-dense B8 H16 8192
non-causal backward, per backend given, in one process: a bimodal spread shows as two
clusters."""
import sys, time
import torch
from harness import backends
from harness.bench import call_kw, pass_call, _free
from harness.problems import suites

label = "self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16"
p = next(p for p in suites()["llm-dense"] if p.label() == label)
flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
for be in sys.argv[1].split(","):
    t0 = time.time()
    fn = backends.get(be).fn()
    call, outs = pass_call(fn, p.build("cuda"), "bwd", call_kw(p))
    call(); torch.cuda.synchronize()
    ms = []
    for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 24):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); call(); b.record(); torch.cuda.synchronize()
        ms.append(a.elapsed_time(b))
    s = sorted(ms)
    print(f"{be:5s} calls in order: " + " ".join(f"{x:.1f}" for x in ms), flush=True)
    print(f"{be:5s} min {s[0]:.2f} median {s[len(s)//2]:.2f} max {s[-1]:.2f} "
          f"({time.time() - t0:.0f}s)", flush=True)
    del call, outs
    _free()
