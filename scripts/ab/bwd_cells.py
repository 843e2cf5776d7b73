"""A/B of one backend's backward over fixed cells, one tree a process.

    python scripts/ab/bwd_cells.py <tag> <backend> <mode>

mode letters: c the causal cells, f only the three short causal fuzz cells, n the
non-causal ones; g gate only (oracle, fresh random inputs, NaN-poisoned grads), t time
only (eager and replayed, harness.bench's timing), neither: both. scripts/ab/bwd_cells.sh
runs the trees (main = the checkout, others = .snap/<tag>/kernels_* over it): gates in
parallel, then timed rounds in turn."""
import sys, time
from harness import backends
from harness.bench import _bench_pass, _free, call_kw
from harness.oracle import check
from harness.problems import fuzz_problems, suites

CAUSAL = [("llm-dense", "B8 H16/16 D128 Lq8192 Lk8192 s1 bf16 causal"),
          ("llm-dense", "B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal"),
          ("llm-dense", "B16 H16/16 D64 Lq2048 Lk2048 s1 bf16 causal"),
          ("varlen-llm", "B10 H16/2 D64 Lq8192"),
          ("fuzz", "B3 H16/8 D128"), ("fuzz", "B385 H32/8"), ("fuzz", "B115 H4/2"),
          ("fuzz", "B123 H32/8"), ("fuzz", "broadcast_q B76")]
NONCAUSAL = [("llm-dense", "B8 H16/16 D128 Lq8192 Lk8192 s1 bf16"),
             ("llm-dense", "B16 H16/16 D64 Lq2048 Lk2048 s1 bf16"),
             ("gem-jagged", "GEMNC")]


def pick(pool, suite, m):
    if m == "GEMNC":
        ps = [p for p in pool[suite] if "Lq2048" in p.label() and "s0.9" in p.label()
              and not p.causal]
        return ps[0]
    want_causal = m.endswith("causal")
    return next(p for p in pool[suite] if m in p.label() and
                (p.causal == want_causal or suite == "fuzz" or suite == "varlen-llm"))


def main():
    tag, be, which = sys.argv[1], sys.argv[2], sys.argv[3]
    fn = backends.get(be).fn()
    pool = {"fuzz": fuzz_problems(40, 0), **suites()}
    cells = ((CAUSAL if "c" in which else CAUSAL[5:8] if "f" in which else [])
             + (NONCAUSAL if "n" in which else []))
    for suite, m in cells:
        t0 = time.time()
        p = pick(pool, suite, m)
        kw = call_kw(p)
        gp = p.replace(batch=min(p.batch, 64))
        if "t" not in which:
            rep = check(gp.build("cuda"), fn, backward=True, check_lse=True, **kw)
            _free()
            print(f"{tag:5s} {p.label():58s} gate {'ok' if rep.ok else 'FAIL'} "
                  f"({time.time() - t0:.0f}s)", flush=True)
            if not rep.ok:
                print(rep, flush=True)
        if "g" in which:
            continue
        ms, host, graph, why, finite = _bench_pass(fn, p.build("cuda"), "bwd", kw, False)
        _free()
        print(f"{tag:5s} {p.label():58s} finite {finite} eager {ms:.4f} graph {graph if graph is None else f'{graph:.4f}'} "
              f"({time.time() - t0:.0f}s)", flush=True)
        if why:  # on the H100 only each process's first cell was captured
            print(f"      {why}", flush=True)


if __name__ == "__main__":
    main()
