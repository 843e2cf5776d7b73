"""The backward's KV list as the preprocess's programmatic dependent (branch list-pdl)
against a plain launch after it (main): run in each tree (PYTHONPATH at it), fuzz seed 0
shapes whose backward builds a KV list; every backend oracle-gated on the whole problem,
then timed in rounds (eager and replayed, the sweep's _bench_pass), FA4 beside."""
import sys

from harness import backends
from harness.bench import _bench_pass, call_kw
from harness.oracle import check
from harness.suites import suite

MATCH = ["broadcast_q B13", "broadcast_q B4 ", "cross B24 H2/2 D64", "self B62 H4/1",
         "cross B2 H16/8 D128", "self B40 H8/8 D64", "self B136"]
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
import os
fns = {n: backends.get(n).fn() for n in os.environ.get("AB_BACKENDS", "tlx,cute,fa4").split(",")}
for p in (p for p in suite("fuzz") if any(m in p.label() for m in MATCH)):
    kw = call_kw(p)
    inp = p.build("cuda")
    for b, fn in fns.items():
        rep = check(inp, fn, backward=True, check_lse=b != "fa4", **kw)
        if not rep.ok:
            print(f"{p.label()} {b}: gate FAIL\n{rep}", flush=True)
    res = {}
    for _ in range(rounds):
        for b, fn in fns.items():
            ms, host, graph, why, finite = _bench_pass(fn, inp, "bwd", kw, False)
            res.setdefault(b, []).append(graph)
    print(p.label(), flush=True)
    for b, xs in res.items():
        print(f"  {b:5s} replayed " + " ".join(f"{g:.5f}" for g in xs), flush=True)
