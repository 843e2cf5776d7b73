"""GPU check of the TLX Hopper forward: correctness against the oracle, then speed.

    python -m harness.gpu.tlx_fwd [--quick] [--no-bench] [--no-fa4]

Part 1 runs harness.oracle.check (backward=False, with LSE) on ~30 problems across
every mode (self / cross / broadcast_q, causal, GQA, D 64/128, bf16/fp16, zero-length
and length-1 sequences, B=1152 GEM shapes). Part 2 times the forward (median of
triton.testing.do_bench) on gem-jagged and llm-dense shapes, next to FA4 when it is
installed, and prints a TFLOP/s table last. A failing config prints its exception and
the run goes on.
"""
from __future__ import annotations

import argparse
import functools
import math
import sys
import time
import traceback

import torch

from harness.oracle import check
from harness.problems import Problem

from kernels_tlx import fwd_hopper


def jagged_attention():
    from kernels_tlx import jagged_attention as fn
    return functools.partial(fn, return_lse=True)


def correctness_problems():
    P = Problem
    probs = [
        # (problem, lengths override or None)
        (P(batch=3, heads=2, head_dim=64, max_seqlen_q=40, sparsity=0.5), None),
        (P(batch=4, heads=2, head_dim=128, max_seqlen_q=300, sparsity=0.7, seed=1), None),
        (P(batch=4, heads=2, head_dim=128, max_seqlen_q=300, sparsity=0.7, causal=True, seed=2), None),
        (P(batch=5, heads=4, kv_heads=2, head_dim=64, max_seqlen_q=257, causal=True, seed=3), None),
        (P(batch=5, heads=4, kv_heads=1, head_dim=128, max_seqlen_q=200, dtype="fp16", seed=4), None),
        (P(batch=3, heads=2, head_dim=64, max_seqlen_q=129, dtype="fp16", causal=True, seed=5), None),
        # zero-length and length-1 sequences
        (P(batch=6, heads=2, head_dim=128, max_seqlen_q=130, seed=6),
         ([0, 1, 130, 0, 64, 1], [0, 1, 130, 0, 64, 1])),
        (P(batch=6, heads=2, head_dim=64, max_seqlen_q=130, causal=True, seed=7),
         ([1, 0, 129, 2, 128, 0], [1, 0, 129, 2, 128, 0])),
        (P(batch=5, heads=2, head_dim=128, max_seqlen_q=100, max_seqlen_k=70, mode="cross", seed=8),
         ([0, 1, 100, 5, 33], [3, 0, 70, 1, 0])),
        (P(batch=5, heads=2, head_dim=64, max_seqlen_q=100, max_seqlen_k=70, mode="cross",
           causal=True, seed=9), ([0, 1, 100, 5, 33], [3, 0, 70, 1, 40])),
        # cross attention (short KV, long KV), causal with len_q > len_k and < len_k
        (P(batch=4, heads=4, head_dim=128, max_seqlen_q=512, max_seqlen_k=64, mode="cross",
           sparsity=0.5, seed=10), None),
        (P(batch=4, heads=4, head_dim=128, max_seqlen_q=200, max_seqlen_k=700, mode="cross",
           sparsity=0.6, causal=True, seed=11), None),
        (P(batch=4, heads=2, head_dim=64, max_seqlen_q=64, max_seqlen_k=256, mode="cross",
           sparsity=0.9, seed=12), None),
        (P(batch=3, heads=4, kv_heads=2, head_dim=128, max_seqlen_q=333, max_seqlen_k=190,
           mode="cross", causal=True, dtype="fp16", seed=13), None),
        # broadcast_q
        (P(batch=3, heads=2, head_dim=64, max_seqlen_q=16, max_seqlen_k=30, mode="broadcast_q",
           sparsity=0.5, seed=14), None),
        (P(batch=8, heads=4, head_dim=128, max_seqlen_q=64, max_seqlen_k=1024, mode="broadcast_q",
           sparsity=0.5, seed=15), None),
        (P(batch=8, heads=4, head_dim=128, max_seqlen_q=256, max_seqlen_k=300, mode="broadcast_q",
           sparsity=0.5, causal=True, seed=16), None),
        (P(batch=5, heads=4, kv_heads=2, head_dim=64, max_seqlen_q=100, max_seqlen_k=200,
           mode="broadcast_q", dtype="fp16", seed=17), ([100] * 5, [0, 1, 200, 150, 99])),
        # longer and multi-block
        (P(batch=2, heads=2, head_dim=128, max_seqlen_q=1500, sparsity=0.8, seed=18), None),
        (P(batch=2, heads=2, head_dim=128, max_seqlen_q=1500, sparsity=0.8, causal=True, seed=19), None),
        (P(batch=2, heads=8, kv_heads=2, head_dim=64, max_seqlen_q=1024, causal=True, seed=20), None),
        (P(batch=7, heads=3, head_dim=64, max_seqlen_q=777, sparsity=0.3, seed=21), None),
        (P(batch=1, heads=1, head_dim=128, max_seqlen_q=1, seed=22), None),
        (P(batch=1, heads=2, head_dim=64, max_seqlen_q=5, max_seqlen_k=0, mode="cross", seed=23),
         ([5], [0])),
        (P(batch=3, heads=2, head_dim=128, max_seqlen_q=20, causal=True, seed=24),
         ([0, 0, 0], [0, 0, 0])),
        (P(batch=4, heads=2, head_dim=128, max_seqlen_q=256, dtype="fp16", sparsity=1.0, seed=25), None),
        # GEM shapes (B=1152)
        (P(batch=1152, heads=4, head_dim=128, max_seqlen_q=256, sparsity=0.1, seed=26), None),
        (P(batch=1152, heads=4, head_dim=128, max_seqlen_q=256, sparsity=0.9, seed=27), None),
        (P(batch=1152, heads=4, head_dim=128, max_seqlen_q=128, sparsity=0.5, causal=True, seed=28), None),
        (P(batch=1152, heads=4, head_dim=128, max_seqlen_q=32, max_seqlen_k=128,
           mode="broadcast_q", sparsity=0.5, seed=29), None),
    ]
    return probs


def _variant(p: Problem) -> tuple:
    """What selects a compiled kernel: head dim, dtype, causal, broadcast-Q, KV bucket."""
    short = p.max_k <= 64
    return (p.head_dim, p.dtype, p.causal, p.mode == "broadcast_q", short)


def _warm_one(variant) -> str:
    """Compile one kernel variant (in a worker process) by running a tiny forward."""
    d, dt, causal, bq, short = variant
    try:
        lk = [40, 33] if short else [100, 77]
        p = Problem(batch=2, heads=2, head_dim=d, max_seqlen_q=30 if bq else max(lk),
                    max_seqlen_k=max(lk), mode="broadcast_q" if bq else "cross",
                    causal=causal, dtype=dt)
        inp = p.build("cuda", lengths=([30, 30] if bq else lk, lk))
        fwd_hopper.forward(inp.q, inp.k, inp.v, inp.cu_seqlens_q, inp.cu_seqlens_k,
                           inp.max_seqlen_q, inp.max_seqlen_k, causal, 0.1, bq)
        torch.cuda.synchronize()
        return f"ok {variant}"
    except Exception as e:  # reported, the main run shows the real error
        return f"warm-up failed {variant}: {type(e).__name__}: {e}"


def prewarm(problems, workers=8):
    """Compile every variant in parallel processes; they fill Triton's disk cache, so
    the checks and timings that follow do not wait for compiles one by one."""
    import concurrent.futures as cf
    import multiprocessing as mp
    variants = sorted({_variant(p) for p in problems})
    t0 = time.time()
    with cf.ProcessPoolExecutor(min(workers, len(variants)), mp_context=mp.get_context("spawn")) as ex:
        for msg in ex.map(_warm_one, variants):
            if not msg.startswith("ok"):
                print("   ", msg, flush=True)
    print(f"(compiled {len(variants)} kernel variants in parallel in {time.time() - t0:.1f}s)",
          flush=True)


def run_correctness(fn) -> tuple[int, int]:
    n_ok = 0
    probs = correctness_problems()
    print(f"== correctness: {len(probs)} problems (oracle, forward + LSE)", flush=True)
    for p, lengths in probs:
        label = p.label() + (f" lengths={lengths}" if lengths else "")
        try:
            inp = p.build("cuda", lengths=lengths)
            rep = check(inp, fn, causal=p.causal, broadcast_q=p.mode == "broadcast_q",
                        backward=False)
            n_ok += rep.ok
            print(f"{'PASS' if rep.ok else 'FAIL'}  {label}\n      " + str(rep).replace("\n", "\n      "),
                  flush=True)
        except Exception as e:
            print(f"ERROR {label}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(limit=4)
    print(f"== correctness: {n_ok}/{len(probs)} passed", flush=True)
    return n_ok, len(probs)


def fast_inputs(p: Problem):
    """Packed tensors made on the GPU (the CPU generator is slow at these sizes)."""
    lq, lk = p.lengths()
    dev, dt = "cuda", p.torch_dtype
    g = torch.Generator(device=dev).manual_seed(p.seed)
    bq = p.mode == "broadcast_q"
    nq = p.max_seqlen_q if bq else int(lq.sum())
    nk = int(lk.sum())
    q = torch.randn(nq, p.heads, p.head_dim, device=dev, dtype=dt, generator=g)
    k = torch.randn(nk, p.hkv, p.head_dim, device=dev, dtype=dt, generator=g)
    v = torch.randn(nk, p.hkv, p.head_dim, device=dev, dtype=dt, generator=g)
    cu = lambda x: torch.nn.functional.pad(torch.cumsum(x, 0), (1, 0)).to(torch.int32).to(dev)
    cu_q = None if bq else cu(lq)
    return q, k, v, cu_q, cu(lk), int(p.max_seqlen_q), int(max(p.max_k, int(lk.max())))


def bench_problems(quick: bool):
    gem = [Problem(batch=1152, heads=4, head_dim=128, max_seqlen_q=n, sparsity=s, suite="gem-jagged")
           for n in ((512, 2048) if quick else (256, 512, 1024, 2048)) for s in (0.1, 0.5, 0.9)]
    llm = [Problem(batch=8, heads=16, head_dim=128, max_seqlen_q=8192, causal=c, suite="llm-dense")
           for c in (False, True)]
    return gem + llm


def fa4_fn():
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except Exception:
        return None

    def fn(q, k, v, cu_q, cu_k, max_q, max_k, causal):
        return flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                      max_seqlen_q=max_q, max_seqlen_k=max_k, causal=causal)
    return fn


def run_bench(quick: bool, with_fa4: bool):
    from triton.testing import do_bench
    fa4 = fa4_fn() if with_fa4 else None
    rows = []
    print("== bench (median ms, do_bench warmup 25 / rep 100)", flush=True)
    for p in bench_problems(quick):
        row = [p.suite, p.max_seqlen_q, p.sparsity, p.causal]
        try:
            q, k, v, cu_q, cu_k, mq, mk = fast_inputs(p)
            flops = p.flops("fwd")
            scale = 1.0 / math.sqrt(p.head_dim)
            f = lambda: fwd_hopper.forward(q, k, v, cu_q, cu_k, mq, mk, p.causal, scale, False)
            ms = do_bench(f, warmup=25, rep=100, return_mode="median")
            row += [ms, flops / ms * 1e-9]
        except Exception as e:
            print(f"ERROR bench {p.label()}: {type(e).__name__}: {e}", flush=True)
            row += [float("nan"), float("nan")]
        if fa4 is not None:
            try:
                g = lambda: fa4(q, k, v, cu_q, cu_k, mq, mk, p.causal)
                ms4 = do_bench(g, warmup=25, rep=100, return_mode="median")
                row += [ms4, flops / ms4 * 1e-9]
            except Exception as e:
                print(f"ERROR fa4 {p.label()}: {type(e).__name__}: {e}", flush=True)
                row += [float("nan"), float("nan")]
        rows.append(row)
        print("   ", row, flush=True)
        q = k = v = None
        torch.cuda.empty_cache()
    hdr = f"{'suite':11s} {'max_len':>7s} {'spars':>5s} {'causal':>6s} {'ms':>8s} {'TFLOP/s':>8s}"
    if fa4 is not None:
        hdr += f" {'fa4 ms':>8s} {'fa4 TF/s':>8s} {'speedup':>7s}"
    print("\n== TFLOP/s (H200 target: gem-jagged >= 1.15x FA4, llm-dense non-causal >= 700)")
    print(hdr)
    for r in rows:
        line = f"{r[0]:11s} {r[1]:7d} {r[2]:5.1f} {str(r[3]):>6s} {r[4]:8.3f} {r[5]:8.1f}"
        if fa4 is not None:
            line += f" {r[6]:8.3f} {r[7]:8.1f} {r[6] / r[4]:7.2f}x"
        print(line)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer bench shapes")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--no-correctness", action="store_true")
    ap.add_argument("--no-fa4", action="store_true")
    a = ap.parse_args(argv)
    import kernels_tlx
    ok, why = kernels_tlx.available()
    print(f"device: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}; "
          f"tlx available: {ok} {why}", flush=True)
    if not ok:
        sys.exit(1)
    t0 = time.time()
    todo = ([p for p, _ in correctness_problems()] if not a.no_correctness else []) + \
        (bench_problems(a.quick) if not a.no_bench else [])
    try:
        prewarm(todo)
    except Exception as e:
        print(f"(parallel warm-up skipped: {type(e).__name__}: {e})", flush=True)
    if not a.no_correctness:
        run_correctness(jagged_attention())
    print(f"(correctness took {time.time() - t0:.1f}s)", flush=True)
    if not a.no_bench:
        run_bench(a.quick, not a.no_fa4)
    print(f"(total {time.time() - t0:.1f}s)")


if __name__ == "__main__":
    main()
