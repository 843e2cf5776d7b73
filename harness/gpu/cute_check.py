"""GPU check of the CuteDSL Hopper forward:  python -m harness.gpu.cute_check [--quick]

1. correctness: ~20 random problems across modes (self / cross / broadcast_q, causal,
   GQA, D 64 / 128, bf16 / fp16, empty and length-1 sequences) against
   harness.oracle (forward only, out and lse); every problem runs even if one raises.
2. speed: forward median time (triton.testing.do_bench) on gem-jagged (B=1152, H=4,
   D=128, max_len 256..2048, sparsity 0.1 / 0.5 / 0.9) and llm-dense (B=8, H=16,
   N=8192, D=128), printed as a TFLOP/s table last (Problem.flops('fwd') / t).
Takes well under 3 minutes on an H200 (most of it compiling the configs).

--bwd: the CuteDSL Hopper backward (kernels_cute/bwd_hopper.py) instead: dq/dk/dv of
~20 problems across modes (plus the edge cases) against
harness.oracle.check(backward=True), run through kernels_cute.jagged_attention
(the CuteDSL forward, then the CuteDSL backward), every problem runs even if one raises;
then the backward alone timed (synthetic out/lse) on gem-jagged, llm-dense and
broadcast-Q GEM shapes, TFLOP/s = Problem.flops('bwd') / t.
"""
import argparse
import random
import sys
import time
import traceback

import torch

from harness import oracle
from harness.problems import Problem, offsets


def _fn():
    from kernels_cute import jagged_attention

    def fn(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, softmax_scale=None,
           broadcast_q=False):
        return jagged_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                                softmax_scale=softmax_scale, broadcast_q=broadcast_q,
                                return_lse=True)
    return fn


def random_problems(n: int, seed: int = 0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        mode = ("self", "cross", "broadcast_q")[i % 3]
        heads = rng.choice((2, 4, 6))
        kv_heads = rng.choice([h for h in (1, 2, heads) if heads % h == 0])
        mq = rng.choice((1, 17, 64, 127, 128, 200, 300))
        mk = mq if mode == "self" else rng.choice((1, 33, 64, 129, 256, 400))
        out.append(Problem(batch=rng.choice((1, 3, 5, 9)), heads=heads, kv_heads=kv_heads,
                           head_dim=rng.choice((64, 128)), max_seqlen_q=mq,
                           max_seqlen_k=None if mode == "self" else mk,
                           sparsity=rng.choice((0.3, 0.7, 1.0)), mode=mode,
                           causal=bool(i % 2), dtype=rng.choice(("bf16", "fp16")),
                           seed=seed + i))
    return out


def edge_cases():
    """Empty sequences, length 1, len_q > len_k under causal (rows that see no key)."""
    p = Problem(batch=4, heads=2, head_dim=64, max_seqlen_q=150, max_seqlen_k=150,
                mode="cross", causal=True)
    yield p, (torch.tensor([0, 1, 150, 77]), torch.tensor([5, 0, 20, 1]))
    p = Problem(batch=3, heads=4, kv_heads=1, head_dim=128, max_seqlen_q=130, causal=False)
    yield p, (torch.tensor([130, 0, 1]), torch.tensor([130, 0, 1]))
    p = Problem(batch=3, heads=2, head_dim=128, max_seqlen_q=70, max_seqlen_k=260,
                mode="broadcast_q", causal=True, dtype="fp16")
    yield p, (torch.tensor([70, 70, 70]), torch.tensor([0, 260, 33]))
    # causal packed with ~3.6 KV tiles a program: the backward's tile counter hands out second
    # and later tiles (every problem above fits in one round of programs)
    yield Problem(batch=8, heads=8, kv_heads=4, head_dim=128, max_seqlen_q=2048, sparsity=0.9,
                  causal=True, seed=7), None


def check_schedule() -> int:
    """The key kernel + device sort gives the torch reference's order and count."""
    from jagged.tiles import longest_first_tiles
    from kernels_cute.schedule import build_tiles
    bad = 0
    for i, (B, mq, causal, bq) in enumerate([(7, 300, False, False), (50, 700, True, False),
                                             (5, 129, True, True), (1152, 1024, False, False)]):
        g = torch.Generator().manual_seed(i)
        lq = torch.randint(0, mq + 1, (B,), generator=g)
        lk = torch.randint(0, mq + 1, (B,), generator=g)
        cu_q, cu_k = offsets(lq).cuda(), offsets(lk).cuda()
        args = (None if bq else cu_q, cu_k, B, mq, mq if bq else None, 128, 128, causal)
        pairs, count, nblk = build_tiles(*args)
        ref, ref_count, ref_nblk = longest_first_tiles(*args)
        n = int(ref_count)
        ok = (int(count) == n and nblk == ref_nblk
              and torch.equal((pairs[:n] & 0xFFFFFFFF).int().cpu(), ref[:n].cpu()))
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} schedule B={B} max_q={mq} causal={causal} "
              f"broadcast_q={bq}: {int(count)} / {n} valid pairs")
    return bad


def check_correctness(n: int, backward: bool = False) -> int:
    fn = _fn()
    cases = [(p, None) for p in random_problems(n)] + list(edge_cases())
    bad = 0
    for p, lengths in cases:
        t0 = time.time()
        try:
            inp = p.build("cuda", lengths=lengths)
            rep = oracle.check(inp, fn, causal=p.causal, broadcast_q=p.mode == "broadcast_q",
                               backward=backward)
            ok = rep.ok
            msg = rep.summary() if not ok else " ".join(
                f"{c.name} {c.max_err:.1e}/{c.tol:.1e}" for c in rep.checks)
        except Exception as e:
            ok, msg = False, f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc(limit=4)
        bad += not ok
        tag = " lengths=" + str([x.tolist() for x in lengths]) if lengths is not None else ""
        print(f"{'ok  ' if ok else 'FAIL'} {p.label()}{tag}  {msg}  ({time.time() - t0:.1f}s)",
              flush=True)
    print(f"correctness{' (fwd+bwd)' if backward else ''}: {len(cases) - bad}/{len(cases)} ok",
          flush=True)
    return bad


def _device_inputs(p: Problem):
    """Random packed tensors built on the GPU (the CPU generator is slow at GEM sizes)."""
    lq, lk = p.lengths()
    dt, dev = p.torch_dtype, "cuda"
    bq = p.mode == "broadcast_q"
    nq = p.max_seqlen_q if bq else int(lq.sum())
    nk = int(lk.sum())
    q = torch.randn(nq, p.heads, p.head_dim, device=dev, dtype=dt)
    k = torch.randn(nk, p.hkv, p.head_dim, device=dev, dtype=dt)
    v = torch.randn(nk, p.hkv, p.head_dim, device=dev, dtype=dt)
    cu_q = None if bq else offsets(lq).to(dev)
    cu_k = offsets(lk).to(dev)
    return q, k, v, cu_q, cu_k, int(lq.max()), int(lk.max())


GEM = dict(batch=1152, heads=4, head_dim=128)


def _timing_problems(quick: bool) -> list[Problem]:
    """gem-jagged (max 256 and 1024 with `quick`, else 256-2048; sparsity 0.1 / 0.5 /
    0.9) and llm-dense B8 H16 8192, non-causal and causal."""
    probs = [Problem(max_seqlen_q=n, sparsity=s, suite="gem-jagged", **GEM)
             for n in ((256, 1024) if quick else (256, 512, 1024, 2048))
             for s in (0.1, 0.5, 0.9)]
    return probs + [Problem(batch=8, heads=16, head_dim=128, max_seqlen_q=8192, causal=c,
                            suite="llm-dense") for c in (False, True)]


def bench(quick: bool):
    import triton
    from kernels_cute import fwd_hopper

    probs = _timing_problems(quick) + [
        Problem(max_seqlen_q=1024, max_seqlen_k=kv, sparsity=0.5, mode="cross",
                suite="gem-cross", **GEM) for kv in (64, 256)]
    rows = []
    for p in probs:
        try:
            q, k, v, cu_q, cu_k, mq, mk = _device_inputs(p)
            scale = p.head_dim ** -0.5
            f = lambda: fwd_hopper.forward(q, k, v, cu_q, cu_k, mq, mk, p.causal, scale,
                                           p.mode == "broadcast_q")
            f()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median")
            rows.append((p, ms, p.flops("fwd") / ms * 1e-9, ""))
            del q, k, v
        except Exception as e:
            rows.append((p, float("nan"), float("nan"), f"{type(e).__name__}: {str(e)[:120]}"))
        torch.cuda.empty_cache()
    print(f"\n{'suite':11s} {'max_len':>7s} {'sparsity':>8s} {'causal':>6s} "
          f"{'ms':>9s} {'TFLOP/s':>8s}")
    for p, ms, tf, err in rows:
        print(f"{p.suite:11s} {p.max_seqlen_q:7d} {p.sparsity:8.1f} {str(p.causal):>6s} "
              f"{ms:9.3f} {tf:8.1f} {err}")


def bench_bwd(quick: bool):
    """The CuteDSL Hopper backward alone (out / lse synthetic: its cost does not depend
    on their values), median of do_bench."""
    import math
    import triton
    from kernels_cute import bwd_hopper

    probs = _timing_problems(quick) + [
        Problem(max_seqlen_q=lq, max_seqlen_k=1024, sparsity=0.5, mode="broadcast_q",
                suite="gem-bcast-q", **GEM) for lq in (64, 256)]
    rows = []
    for p in probs:
        try:
            q, k, v, cu_q, cu_k, mq, mk = _device_inputs(p)
            bq = p.mode == "broadcast_q"
            nq = q.shape[0] * (cu_k.shape[0] - 1) if bq else q.shape[0]
            dout = torch.randn(nq, p.heads, p.head_dim, device="cuda", dtype=q.dtype)
            out = torch.randn_like(dout)
            lse = torch.zeros(p.heads, nq, device="cuda", dtype=torch.float32)
            scale = 1.0 / math.sqrt(p.head_dim)
            f = lambda: bwd_hopper.backward(dout, q, k, v, out, lse, cu_q, cu_k, mq, mk,
                                            p.causal, scale, bq)
            f()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(f, warmup=5, rep=30, return_mode="median")
            rows.append((p, ms, p.flops("bwd") / ms * 1e-9, ""))
            del q, k, v, dout, out
        except Exception as e:
            rows.append((p, float("nan"), float("nan"), f"{type(e).__name__}: {str(e)[:120]}"))
        torch.cuda.empty_cache()
    print(f"\nbackward (CuteDSL bwd_hopper)\n{'suite':11s} {'mode':11s} {'max_len':>7s} "
          f"{'sparsity':>8s} {'causal':>6s} {'ms':>9s} {'TFLOP/s':>8s}")
    for p, ms, tf, err in rows:
        print(f"{p.suite:11s} {p.mode:11s} {p.max_seqlen_q:7d} {p.sparsity:8.1f} "
              f"{str(p.causal):>6s} {ms:9.3f} {tf:8.1f} {err}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer problems")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--n", type=int, default=18, help="random correctness problems")
    ap.add_argument("--bwd", action="store_true",
                    help="check and time the CuteDSL Hopper backward")
    a = ap.parse_args(argv)
    from kernels_cute import available
    ok, why = available()
    if not ok:
        print(f"kernels_cute not available here: {why}")
        return 2
    print(torch.cuda.get_device_name(), flush=True)
    t0 = time.time()
    if a.bwd:
        bad = check_correctness(6 if a.quick else a.n, backward=True)
        print(f"[{time.time() - t0:.0f}s]", flush=True)
        if not a.no_bench:
            bench_bwd(a.quick)
        print(f"[{time.time() - t0:.0f}s total]")
        return 1 if bad else 0
    bad = check_schedule()
    bad += check_correctness(6 if a.quick else a.n)
    print(f"[{time.time() - t0:.0f}s]", flush=True)
    if not a.no_bench:
        bench(a.quick)
    print(f"[{time.time() - t0:.0f}s total]")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
