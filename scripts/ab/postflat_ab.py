"""PostFlat over (block, query head) CTAs (branch postflat-heads) against one CTA a block
with its heads in turn (main): CuteDSL backward, each variant oracle-gated, then timed
in rounds under graph replay with TLX / FA4 beside. Variants: the default call, and the
block-padded dQ forced on (what a relaxed jagged.tiles.takes_flat would take) on the
call of few blocks. Run in each tree (PYTHONPATH at the tree)."""
import sys
from dataclasses import replace

import torch

from harness import backends
from harness.bench import _bench_pass, call_kw
from harness.oracle import check
from harness.suites import suite
from kernels_cute import bwd_hopper as B

print(torch.cuda.get_device_name(), flush=True)
orig = B.pick_config
FLAT = {"default": orig, "flat": lambda *a, **k: replace(orig(*a, **k), dq_flat=True)}
SHAPES = [("fuzz", "cross B2 H16/8 D128 Lq1024", FLAT),
          ("fuzz", "self B62 H4/1 D128 Lq1024", {"default": orig}),
          ("llm-dense", "B8 H16/16 D128 Lq8192 Lk8192 s1 bf16", {"default": orig}),
          ("gem-jagged", "Lq1024 Lk1024 s0.9", {"default": orig})]
fns = {n: backends.get(n).fn() for n in ("tlx", "cute", "fa4")}
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
for name, match, variants in SHAPES:
    p = next(p for p in suite(name) if match in p.label())
    kw = call_kw(p)
    inp = p.build("cuda")
    for v, pc in variants.items():
        B.pick_config = pc
        rep = check(inp, fns["cute"], causal=p.causal, backward=True)
        print(f"{p.label()} {v}: gate {'ok' if rep.ok else 'FAIL'}", flush=True)
        if not rep.ok:
            print(rep)
    res = {}
    for _ in range(rounds):
        for v, pc in list(variants.items()) + [("tlx", None), ("fa4", None)]:
            B.pick_config = pc or orig
            fn = fns["cute"] if pc else fns[v]
            ms, host, graph, why, finite = _bench_pass(fn, inp, "bwd", kw, False)
            res.setdefault(v, []).append(graph)
    B.pick_config = orig
    print(p.label())
    for v, xs in res.items():
        print(f"  {v:8s} replayed " + " ".join(f"{x:.5f}" for x in xs), flush=True)
