"""Where a fuzz shape's TLX backward spends its host time on a GPU: host us a call, the launches of each
kernel by path (plan key, site, recorded, Triton's path) over those calls, and a cProfile of 50 calls on
the calling thread.  PYTHONPATH=. python scripts/ab/b7_host.py "B7 H8/1 D64" "B13 H2/2"  (fuzz seed 0)"""
import cProfile, pstats, sys
import torch
from harness import backends
from harness.bench import call_kw, host_ms, pass_call
from harness.problems import fuzz_problems
from jagged import launch

fn = backends.get("tlx").fn()
ps = fuzz_problems(40, 0)
for m in sys.argv[1:]:
    p = next(p for p in ps if m in p.label())
    kw = call_kw(p)
    inp = p.build("cuda")
    call = pass_call(fn, inp, "bwd", kw)[0]
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    before = {f.fn.__name__: (f.launches, f.site_launches, f.records, f.fallbacks) for f in launch._FAST.values()}
    print(p.label(), "host us", [round(host_ms(call, 50) * 1e3, 1) for _ in range(3)], flush=True)
    after = {f.fn.__name__: (f.launches, f.site_launches, f.records, f.fallbacks) for f in launch._FAST.values()}
    print({k: tuple(a - b for a, b in zip(v, before.get(k, (0, 0, 0, 0)))) for k, v in after.items()}, flush=True)
    with torch.autograd.set_multithreading_enabled(False):
        call(); torch.cuda.synchronize()
        pr = cProfile.Profile(); pr.enable()
        for _ in range(50):
            call()
        pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(12)
