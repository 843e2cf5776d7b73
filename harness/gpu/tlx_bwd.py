"""GPU check of kernels_tlx.bwd_hopper.backward: correctness on ~30 random problems
(every mode, zero-length and length-1 sequences, broadcast-Q at B=1152), then timing.

    python -m harness.gpu.tlx_bwd [--impl triton,ws] [--no-time] [--only-time] [--seed N]
    python -m harness.gpu.tlx_bwd --impl triton --configs base,m16n128,m64n64 [--suites gem-jagged,llm-dense]

--configs: bwd_hopper.CONFIGS names (impl "triton" only; "default" = pick_config's
choice per problem): each config is checked on the random problems first and timed only
if every problem passed. Timing rows carry the config name; a summary table with one
column per config closes the run.

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
from kernels_tlx.bwd_hopper import CONFIGS, backward


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


def check_one(p: Problem, lengths, impl: str, config=None) -> tuple[bool, str]:
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
                          scale, bq, impl=impl, config=config)
    torch.cuda.synchronize()
    checks = [compare(n, g, ref[n], lowp[n], inp.q.dtype)
              for n, g in (("dq", dq), ("dk", dk), ("dv", dv))]
    ok = all(c.ok for c in checks)
    return ok, "; ".join(str(c) for c in checks)


def _tag(impl: str, config) -> str:
    return impl if config is None else f"{impl}:{config}"


def correctness(seed: int, impl: str, config=None) -> int:
    fails = 0
    probs = random_problems(seed)
    tag0 = _tag(impl, config)
    for i, (p, lengths) in enumerate(probs):
        t0 = time.time()
        tag = p.label() + (f" lengths q={lengths[0].tolist()} k={lengths[1].tolist()}" if lengths else "")
        try:
            ok, msg = check_one(p, lengths, impl, config)
        except Exception:
            ok, msg = False, "EXC " + traceback.format_exc(limit=4)
        fails += not ok
        print(f"[{tag0} {i:2d}] {'PASS' if ok else 'FAIL'} {tag} ({time.time() - t0:.1f}s)")
        if not ok:
            print("     " + msg)
    print(f"correctness [{tag0}]: {len(probs) - fails}/{len(probs)} passed", flush=True)
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


def timing(impl: str, config=None, suites=None, results=None) -> list[str]:
    """Median backward time per timing problem (of `suites`, all if None); `results`
    (a dict) collects {(suite, label): TFLOP/s} for the summary table."""
    import triton
    rows = []
    tag = _tag(impl, config)
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
                                  p.causal, scale, bq, impl=impl, config=config)
            ms = triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median")
            tf = p.flops("bwd") / (ms * 1e-3) / 1e12
            rows.append(f"{tag:16s} {p.suite:16s} {p.label():60s} {ms:9.3f} ms {tf:7.1f} TFLOP/s")
            if results is not None:
                results[(p.suite, p.label())] = tf
        except Exception as e:
            rows.append(f"{tag:16s} {p.suite:16s} {p.label():60s} ERROR {type(e).__name__}: {str(e)[:120]}")
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    return rows


def summary(results: dict) -> str:
    """One row per problem, one TFLOP/s column per config; best marked with *."""
    tags = list(results)
    keys = []
    for r in results.values():
        keys += [k for k in r if k not in keys]
    lines = ["| suite | problem | " + " | ".join(tags) + " |", "|---|---|" + "---|" * len(tags)]
    for suite, label in keys:
        vals = [results[t].get((suite, label)) for t in tags]
        best = max((v for v in vals if v is not None), default=None)
        cells = ["–" if v is None else f"{v:.1f}{'*' if v == best else ''}" for v in vals]
        lines.append(f"| {suite} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--only-time", action="store_true")
    ap.add_argument("--impl", default=None,
                    help="comma list of triton, ws (default: ws, the library's default on "
                         "the GPU; with --configs: triton)")
    ap.add_argument("--configs", default=None,
                    help=f"comma list of bwd_hopper.CONFIGS names ({','.join(CONFIGS)}) or 'default'; "
                         "impl triton only")
    ap.add_argument("--suites", default=None,
                    help="comma list of timing suites (gem-jagged, llm-dense, gem-broadcast-q); all if unset")
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    impls = (a.impl or ("triton" if a.configs else "ws")).split(",")
    runs = [(im, None) for im in impls]
    if a.configs:
        names = a.configs.split(",")
        bad = [n for n in names if n != "default" and n not in CONFIGS]
        if bad:
            raise SystemExit(f"unknown configs {bad}; known: {sorted(CONFIGS)}")
        runs = [("triton", None if n == "default" else n) for n in names]
        runs += [(im, None) for im in impls if im != "triton"]
    suites = a.suites.split(",") if a.suites else None
    fails = 0
    rows, results = [], {}
    for im, cfg in runs:  # per config: oracle first, timing only if it passed
        f = 0 if a.only_time else correctness(a.seed, im, cfg)
        fails += f
        if not a.no_time:
            if f:
                print(f"[{_tag(im, cfg)}] not timed: {f} correctness failures")
                continue
            results[_tag(im, cfg)] = {}
            rows += timing(im, cfg, suites, results[_tag(im, cfg)])
    if rows:
        print("\n=== backward timing (median, TFLOP/s = Problem.flops('bwd') / t) ===")
        print("\n".join(rows))
        print("\n=== TFLOP/s per config (* = best) ===")
        print(summary(results))
    raise SystemExit(1 if fails else 0)


if __name__ == "__main__":
    main()
