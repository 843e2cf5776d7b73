"""Broadcast-Q backward: this tree against another (run in each, PYTHONPATH at the tree),
over the fuzz seed 0 broadcast-Q shapes: every backend oracle-gated, then timed in rounds
(eager and replayed, the sweep's _bench_pass), FA4 beside. argv: rounds, then "pdl" to
also time TLX with the main kernel and postprocess launched as dependents in broadcast-Q."""
import sys

from harness import backends
from harness.bench import _bench_pass, call_kw
from harness.oracle import check
from harness.suites import suite
import kernels_tlx.bwd_hopper as TB

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
pdl = "pdl" in sys.argv[2:]
orig = TB.bwd_dependent
fns = {n: backends.get(n).fn() for n in ("tlx", "cute", "fa4")}
variants = [("tlx", "tlx", orig), ("cute", "cute", orig), ("fa4", "fa4", orig)]
if pdl:
    variants.insert(1, ("tlx-pdl", "tlx", lambda bq: True))
for p in (p for p in suite("fuzz") if p.mode == "broadcast_q"):
    kw = call_kw(p)
    inp = p.build("cuda")
    for v, b, dep in variants:
        TB.bwd_dependent = dep
        rep = check(inp, fns[b], backward=True, check_lse=b != "fa4", **kw)
        if not rep.ok:
            print(f"{p.label()} {v}: gate FAIL\n{rep}", flush=True)
    res = {}
    for _ in range(rounds):
        for v, b, dep in variants:
            TB.bwd_dependent = dep
            ms, host, graph, why, finite = _bench_pass(fns[b], inp, "bwd", kw, False)
            res.setdefault(v, []).append((ms, graph))
    TB.bwd_dependent = orig
    print(p.label(), flush=True)
    for v, xs in res.items():
        print(f"  {v:8s} eager " + " ".join(f"{a:.5f}" for a, _ in xs)
              + "  replayed " + " ".join(f"{g:.5f}" for _, g in xs), flush=True)
