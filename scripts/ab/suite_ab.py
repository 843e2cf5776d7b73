"""One tree's side of an A/B (PYTHONPATH at the tree): AB_BACKENDS (default tlx) on the
problems of AB_CASES ("suite:label substring;...", "suite:label$" for one label), each oracle-gated on the whole problem
(backward), then timed in rounds (argv[1], default 3) by the sweep's _bench_pass: eager
and replayed ms of the backward."""
import os
import sys

from harness import backends
from harness.bench import _bench_pass, call_kw
from harness.oracle import check
from harness.suites import suite

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
names = os.environ.get("AB_BACKENDS", "tlx").split(",")
fns = {n: backends.get(n).fn() for n in names}
for case in os.environ["AB_CASES"].split(";"):
    sname, match = case.split(":", 1)
    exact = match.endswith("$")  # "label$": that label only
    for p in (p for p in suite(sname)
              if (p.label() == match[:-1] if exact else match in p.label())):
        kw = call_kw(p)
        inp = p.build("cuda")
        for b, fn in fns.items() if "AB_NOGATE" not in os.environ else ():
            rep = check(inp, fn, backward=True, check_lse=b != "fa4", **kw)
            if not rep.ok:
                print(f"{p.label()} {b}: gate FAIL\n{rep}", flush=True)
        res = {}
        for _ in range(rounds):
            for b, fn in fns.items():
                ms, host, graph, why, finite = _bench_pass(fn, inp, "bwd", kw, False)
                res.setdefault(b, []).append((ms, graph))
        print(f"{sname} {p.label()}", flush=True)
        for b, xs in res.items():
            print(f"  {b:5s} eager " + " ".join(f"{m:.4f}" for m, _ in xs)
                  + "  replayed " + " ".join(f"{g:.4f}" for _, g in xs), flush=True)
        del inp
