"""Causal key windows cut at their first sequence's first seeing row (branch direct-acc):
oracle gates (the sweep's gate on fuzz cross B8 H1/1 D128 8192 / 128 causal and cross
B43 H16/4 D128 256 / 128 causal, and whole checks of cross causal problems whose windows
start past their first rows), then TLX / CuteDSL / FA4 timed in rounds on the fuzz shapes
(eager, replayed, host)."""
import torch

from harness import backends
from harness.bench import _bench_pass, call_kw, run_problem
from harness.oracle import check
from harness.problems import Problem
from harness.suites import suite

print(torch.cuda.get_device_name(), flush=True)
fns = {n: (backends.get(n), backends.get(n).fn()) for n in ("tlx", "cute", "fa4")}
shapes = [p for p in suite("fuzz")
          if any(m in p.label() for m in ("B8 H1/1 D128 Lq8192", "B43 H16/4 D128 Lq256"))]
whole = [(Problem(batch=8, heads=1, head_dim=128, max_seqlen_q=300, max_seqlen_k=120,
                  mode="cross", causal=True, dtype="fp16"),
          ([200, 150, 40, 7, 300, 0, 64, 90], [100, 90, 120, 5, 100, 0, 60, 120])),
         (Problem(batch=7, heads=2, kv_heads=1, head_dim=128, max_seqlen_q=100,
                  max_seqlen_k=60, mode="cross", causal=True),
          ([100, 20, 5, 80, 3, 60, 70], [10, 30, 50, 20, 40, 60, 5]))]
for name in ("tlx", "cute", "fa4"):
    b, fn = fns[name]
    for p in shapes:
        r = run_problem(b, fn, p, ["bwd"], timing=False)[0]
        print(f"gate {name} {p.label()}: {r['status']} {r['error'][:150]}", flush=True)
    if name != "fa4":
        for one, lengths in whole:
            rep = check(one.build("cuda", lengths=lengths), fn, causal=True, backward=True)
            print(f"check {name} {one.label()}: {'ok' if rep.ok else 'FAIL'}\n{rep}"[:600],
                  flush=True)
for p in shapes:
    kw = call_kw(p)
    inp = p.build("cuda")
    res = {}
    for r in range(3):
        for name in ("tlx", "cute", "fa4"):
            ms, host, graph, why, finite = _bench_pass(fns[name][1], inp, "bwd", kw, False)
            res.setdefault(name, []).append((ms, graph, host, finite))
    print(p.label())
    for name, xs in res.items():
        print(f"{name:4s} " + " | ".join(f"eager {a:.5f} replayed {g:.5f} host {h:.4f} finite {f}"
                                         for a, g, h, f in xs), flush=True)
