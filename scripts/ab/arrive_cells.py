"""A/B cells of the TLX kernels: python arrive_cells.py <tag> <backend> <fwd|bwd> <g|t> [cell ...]
(g: oracle gate of the pass, outputs NaN-poisoned; t: eager timing of the pass)."""
import sys, time
from harness import backends
from harness.bench import _bench_pass, _free, call_kw
from harness.oracle import check
from harness.problems import fuzz_problems, suites

CELLS = [("llm-dense", "self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16"),
         ("llm-dense", "self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16 causal"),
         ("llm-dense", "self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16"),
         ("llm-dense", "self B4 H32/8 D128 Lq4096 Lk4096 s1 bf16 causal"),
         ("llm-dense", "self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16"),
         ("llm-dense", "self B16 H16/16 D64 Lq2048 Lk2048 s1 bf16 causal"),
         ("fuzz", "self B2 H8/2 D64 Lq16384 Lk16384 s0.9 bf16"),
         ("fuzz", "self B5 H8/4 D128 Lq16384 Lk16384 s0.5 bf16"),
         ("fuzz", "self B3 H16/8 D128 Lq16384 Lk16384 s0.75 bf16 causal"),
         ("fuzz", "self B21 H1/1 D128 Lq2048 Lk2048 s0.9 bf16")]


def main():
    tag, be, pass_, mode = sys.argv[1:5]
    only = [CELLS[int(i)] for i in sys.argv[5:]]
    fn = backends.get(be).fn()
    import kernels_tlx
    print(tag, "kernels_tlx from", kernels_tlx.__file__, flush=True)
    pool = {"fuzz": fuzz_problems(40, 0), **suites()}
    for suite, m in only or CELLS:
        t0 = time.time()
        p = next(p for p in pool[suite] if p.label() == m)
        kw = call_kw(p)
        if mode == "g":
            rep = check(p.replace(batch=min(p.batch, 64)).build("cuda"), fn,
                        backward=pass_ == "bwd", check_lse=True, **kw)
            _free()
            print(f"{tag:4s} {pass_} {m:55s} gate {'ok' if rep.ok else 'FAIL'} "
                  f"({time.time() - t0:.0f}s)", flush=True)
            if not rep.ok:
                print(rep, flush=True)
            continue
        ms, host, graph, why, finite = _bench_pass(fn, p.build("cuda"), pass_, kw, False)
        _free()
        print(f"{tag:4s} {pass_} {m:55s} finite {finite} eager {ms:.4f} "
              f"({time.time() - t0:.0f}s)", flush=True)


if __name__ == "__main__":
    main()
