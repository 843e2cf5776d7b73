"""A/B of a backend's backward (TLX by default, or cute) on causal problems, one tree a
process: each problem gated by the oracle (fresh random inputs, NaN-poisoned grads), then
timed eager and replayed (harness.bench's timing). Run it in each tree alternately and
compare the lines.

    source .gpu1/activate.sh; for t in main mask-lean main mask-lean; do
        (cd .snap/$t && PYTHONPATH=. python scripts/ab/causal_bwd.py $t tlx); done
"""
from __future__ import annotations

import sys

from harness import backends
from harness.bench import _bench_pass, _free, call_kw
from harness.oracle import check
from harness.problems import fuzz_problems, suites

CELLS = [("llm-dense", "B8 H16/16 D128 Lq8192 Lk8192 s1 bf16 causal"),
         ("llm-dense", "B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal"),
         ("llm-dense", "B16 H16/16 D64 Lq2048 Lk2048 s1 bf16 causal"),
         ("varlen-llm", "B10 H16/2 D64 Lq8192"),
         ("fuzz", "B3 H16/8 D128"), ("fuzz", "B385 H32/8"), ("fuzz", "B115 H4/2"),
         ("fuzz", "B123 H32/8"), ("fuzz", "broadcast_q B76")]


def main():
    tag = sys.argv[1] if len(sys.argv) > 1 else "?"
    fn = backends.get(sys.argv[2] if len(sys.argv) > 2 else "tlx").fn()
    pool = {"fuzz": fuzz_problems(40, 0), **suites()}
    for suite, m in CELLS:
        p = next(p for p in pool[suite] if m in p.label())
        kw = call_kw(p)
        gp = p.replace(batch=min(p.batch, 64))
        rep = check(gp.build("cuda"), fn, backward=True, check_lse=True, **kw)
        _free()
        ms, host, graph, why, finite = _bench_pass(fn, p.build("cuda"), "bwd", kw, False)
        _free()
        print(f"{tag:6s} {p.label():55s} gate {'ok' if rep.ok else 'FAIL'} finite {finite} "
              f"eager {ms:.4f} replayed {graph if graph is None else f'{graph:.4f}'}",
              flush=True)
        if not rep.ok:
            print(rep, flush=True)


if __name__ == "__main__":
    main()
