"""GPU check of kernels_tlx.bwd_hopper.backward: correctness on ~30 random problems
(every mode, zero-length and length-1 sequences, broadcast-Q at B=1152), then timing.

    python -m harness.gpu.tlx_bwd [--no-time] [--only-time] [--seed N] [--suites gem-jagged,llm-dense]

Timing runs only if every problem passed.

Correctness: out/lse come from the oracle (harness.oracle.reference at fp32, out cast
to the input dtype); dq/dk/dv are compared (harness.oracle.compare) with the fp32
reference gradients, with the tolerance set by the same gradients computed by PyTorch
in the input dtype. Timing: median of triton.testing.do_bench over the backward only,
with synthetic out/lse (the backward's cost does not depend on their values).
"""
from __future__ import annotations

import argparse
import math
import random
import time
import traceback

import torch

from harness.oracle import compare, poison, reference
from harness.problems import Problem
from kernels_tlx.bwd_hopper import backward


def random_problems(seed: int = 0) -> list[tuple[Problem, tuple | None]]:
    rng = random.Random(seed)
    out = []
    for i in range(24):
        mode = rng.choice(["self", "self", "cross", "broadcast_q"])
        d = rng.choice([64, 128])
        dt = rng.choice(["bf16", "fp16"])
        h, hkv = rng.choice([(2, 2), (4, 4), (4, 2), (4, 1), (3, 1)])
        b = rng.choice([1, 2, 3, 5, 8])
        mq = rng.choice([1, 7, 64, 100, 129, 200, 300])
        mk = rng.choice([1, 16, 63, 128, 190, 257]) if mode != "self" else None
        s = rng.choice([0.1, 0.5, 0.9, 1.0])
        causal = rng.random() < 0.5
        out.append((Problem(batch=b, heads=h, kv_heads=hkv, head_dim=d, max_seqlen_q=mq,
                            max_seqlen_k=mk, sparsity=s, mode=mode, causal=causal, dtype=dt,
                            seed=seed * 100 + i), None))
    L = torch.tensor
    # edge cases: zero-length and length-1 sequences, rows that see no key
    out += [
        (Problem(batch=5, heads=2, head_dim=64, max_seqlen_q=130, seed=1),
         (L([0, 1, 130, 0, 65]), L([0, 1, 130, 0, 65]))),
        (Problem(batch=5, heads=4, kv_heads=2, head_dim=128, max_seqlen_q=130, causal=True, seed=2),
         (L([1, 0, 129, 64, 2]), L([1, 0, 129, 64, 2]))),
        (Problem(batch=4, heads=2, head_dim=128, max_seqlen_q=150, max_seqlen_k=140, mode="cross",
                 causal=True, seed=3),  # len_q > len_k: early rows see nothing (lse -inf)
         (L([150, 5, 0, 70]), L([20, 140, 3, 0]))),
        (Problem(batch=4, heads=2, head_dim=64, max_seqlen_q=33, max_seqlen_k=200,
                 mode="broadcast_q", causal=True, seed=4),
         (L([33, 33, 33, 33]), L([0, 1, 200, 17]))),
        (Problem(batch=1152, heads=4, head_dim=128, max_seqlen_q=64, max_seqlen_k=96,
                 mode="broadcast_q", sparsity=0.5, seed=5), None),
        (Problem(batch=1152, heads=2, kv_heads=1, head_dim=64, max_seqlen_q=32, max_seqlen_k=80,
                 mode="broadcast_q", sparsity=0.9, causal=True, dtype="fp16", seed=6), None),
        # causal packed with ~3.6 KV tiles a program: the tile counter hands out second and
        # later tiles (every problem above fits in one round of programs)
        (Problem(batch=8, heads=8, kv_heads=4, head_dim=128, max_seqlen_q=2048, sparsity=0.9,
                 causal=True, seed=7), None),
    ]
    return out


def check_one(p: Problem, lengths) -> tuple[bool, str]:
    inp = p.build("cuda", lengths=lengths)
    bq = p.mode == "broadcast_q"
    kw = dict(causal=p.causal, broadcast_q=bq)
    ref = reference(inp, **kw)
    lowp = reference(inp, compute_dtype=inp.q.dtype, **kw)
    out = ref["out"].to(inp.q.dtype)
    lse = ref["lse"].contiguous()
    scale = 1.0 / math.sqrt(p.head_dim)
    poison(inp.q, inp.k, inp.v)
    dq, dk, dv = backward(inp.dout, inp.q, inp.k, inp.v, out, lse, inp.cu_seqlens_q,
                          inp.cu_seqlens_k, inp.max_seqlen_q, inp.max_seqlen_k, p.causal,
                          scale, bq)
    torch.cuda.synchronize()
    checks = [compare(n, g, ref[n], lowp[n], inp.q.dtype)
              for n, g in (("dq", dq), ("dk", dk), ("dv", dv))]
    ok = all(c.ok for c in checks)
    return ok, "; ".join(str(c) for c in checks)


def correctness(seed: int) -> int:
    fails = 0
    probs = random_problems(seed)
    for i, (p, lengths) in enumerate(probs):
        t0 = time.time()
        tag = p.label() + (f" lengths q={lengths[0].tolist()} k={lengths[1].tolist()}" if lengths else "")
        try:
            ok, msg = check_one(p, lengths)
        except Exception:
            ok, msg = False, "EXC " + traceback.format_exc(limit=4)
        fails += not ok
        print(f"[{i:2d}] {'PASS' if ok else 'FAIL'} {tag} ({time.time() - t0:.1f}s)")
        if not ok:
            print("     " + msg)
    print(f"correctness: {len(probs) - fails}/{len(probs)} passed", flush=True)
    return fails


def timing_problems() -> list[Problem]:
    gem = dict(batch=1152, heads=4, head_dim=128)
    probs = [Problem(max_seqlen_q=n, sparsity=s, suite="gem-jagged", **gem)
             for n in (256, 512, 1024, 2048) for s in (0.1, 0.5, 0.9)]
    probs += [Problem(batch=8, heads=16, head_dim=128, max_seqlen_q=8192, causal=c,
                      suite="llm-dense") for c in (False, True)]
    probs += [Problem(max_seqlen_q=lq, max_seqlen_k=1024, sparsity=0.5, mode="broadcast_q",
                      suite="gem-broadcast-q", **gem) for lq in (64, 256)]
    return probs


def timing(suites=None) -> list[str]:
    """Median backward time per timing problem (of `suites`, all if None)."""
    import triton
    rows = []
    for p in timing_problems():
        if suites and p.suite not in suites:
            continue
        try:
            inp = p.build("cuda")
            bq = p.mode == "broadcast_q"
            nq = inp.dout.shape[0]
            out = torch.randn_like(inp.dout)
            lse = torch.zeros(p.heads, nq, device="cuda", dtype=torch.float32)
            scale = 1.0 / math.sqrt(p.head_dim)
            fn = lambda: backward(inp.dout, inp.q, inp.k, inp.v, out, lse, inp.cu_seqlens_q,
                                  inp.cu_seqlens_k, inp.max_seqlen_q, inp.max_seqlen_k,
                                  p.causal, scale, bq)
            ms = triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median")
            tf = p.flops("bwd") / (ms * 1e-3) / 1e12
            rows.append(f"{p.suite:16s} {p.label():60s} {ms:9.3f} ms {tf:7.1f} TFLOP/s")
        except Exception as e:
            rows.append(f"{p.suite:16s} {p.label():60s} ERROR {type(e).__name__}: {str(e)[:120]}")
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--only-time", action="store_true")
    ap.add_argument("--suites", default=None,
                    help="comma list of timing suites (gem-jagged, llm-dense, gem-broadcast-q); all if unset")
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    suites = a.suites.split(",") if a.suites else None
    fails = 0 if a.only_time else correctness(a.seed)
    if not a.no_time:
        if fails:
            print(f"not timed: {fails} correctness failures")
        else:
            rows = timing(suites)
            print("\n=== backward timing (median, TFLOP/s = Problem.flops('bwd') / t) ===")
            print("\n".join(rows))
    raise SystemExit(1 if fails else 0)


if __name__ == "__main__":
    main()
