"""Kernel times (torch.profiler) of one backward cell, per backend given."""
import sys
from harness import backends
from harness.bench import call_kw, pass_call, _time, _free
from harness.gpu.profile import kernel_times
from harness.problems import suites

label = "self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16"
p = next(p for p in suites()["llm-dense"] if p.label() == label)
for be in sys.argv[1].split(","):
    fn = backends.get(be).fn()
    kw = call_kw(p)
    call, outs = pass_call(fn, p.build("cuda"), "bwd", kw)
    ms = _time(call, False)
    kt = kernel_times(call, 5)
    print(f"== {be} {label}: do_bench {ms:.3f} ms; kernels ms/call:", flush=True)
    for k, v in list(kt.items())[:8]:
        print(f"   {v:8.3f}  {k[:110]}", flush=True)
    del call, outs
    _free()
