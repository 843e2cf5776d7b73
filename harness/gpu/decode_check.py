"""GPU check of KV-cache decode:  python -m harness.gpu.decode_check --backends tlx,cute

1. the oracle (`harness.decode.check`: fp32 on the gathered cache, 2x PyTorch's own
   error in the input dtype plus a floor, outputs NaN-poisoned first) on every mode:
   contiguous and paged caches (page sizes 1, 7, 16, 64, 128, 256, pages shuffled in a
   pool larger than needed), split and unsplit (num_splits 1, several, chosen), MHA and
   pack-GQA (groups 4 and 8), L_q > 1 causal and not, packed q with different row counts,
   jagged cache lengths, zero-length caches, cache length 1 (rows that see no key), fp16
   and bf16, fp8 (e4m3 q and cache with descales per (sequence, KV head), and a bf16 q
   over an e4m3 cache: the oracle on the dequantized values, out bf16), D 64 and 128,
   one 32k-key sequence, and NaN in every cache slot past a
   sequence's length and in unused pages (a kernel that reads one, even under a zero
   probability, shows it). Out and lse (ours), and a second call
   after poisoning again must give the same bits (`same`). One PASS / FAIL line a case
   with each check's error against its allowance;
2. bad input (ours only): a page table past the pool, cache lengths beyond the table or
   the cache, heads not divisible, wrong dtypes (also fp8 q over a bf16 cache, fp16 q
   over an fp8 cache), non-monotone cu_seqlens_q, an unsupported head dim, descales of
   the wrong dtype, shape or device or given where nothing is fp8; each must raise
   ValueError / TypeError naming the argument (`check_inputs=True` for the value
   errors: synchronous).
Any decode backend of harness.backends runs part 1 (`--backends fa4,sdpa` checks the
baselines the bench times). Exit code 1 if anything failed. Each style well under
3 minutes on an H200, most of it compiling.
"""
import argparse
import re
import sys
import time
import traceback

import torch

from harness import backends, decode
from harness.decode import DecodeProblem

G4 = dict(heads=8, kv_heads=2, head_dim=128)


NAN_PAST_END = "NaN past the ends"
BF16_Q = "bf16 q over fp8"  # an fp8 problem with q dequantized to bf16 (no q_descale)


def cases() -> list[tuple[str, DecodeProblem, tuple | None]]:
    """(name, problem, (n_q, n_k) override or None). Cases named NAN_PAST_END hold NaN
    in every cache slot past a sequence's length and in the unused pages; those naming
    BF16_Q take a bf16 q over their e4m3 cache."""
    P = lambda **kw: DecodeProblem(**{**G4, "batch": 3, "cache_len": 1000, **kw})
    out = [
        ("contiguous, unsplit", P(num_splits=1), None),
        ("contiguous, 4 splits", P(num_splits=4), None),
        ("contiguous, splits chosen", P(batch=2, cache_len=5000), None),
        ("non-causal L_q 1", P(causal=False, num_splits=2), None),
    ]
    for i, ps in enumerate((1, 16, 64, 128)):
        out += [(f"page {ps}, unsplit", P(page_size=ps, num_splits=1), None),
                (f"page {ps}, {3 + i} splits", P(page_size=ps, num_splits=3 + i, sparsity=0.7,
                                                 seed=i), None)]
    out += [
        ("page 7, splits chosen, jagged lengths", P(page_size=7, sparsity=0.5, batch=5), None),
        ("page 256, 2 splits", P(page_size=256, num_splits=2, cache_len=1500), None),
        ("MHA 4/4, 2 splits", P(heads=4, kv_heads=4, num_splits=2), None),
        ("GQA 16/2, page 16", P(heads=16, kv_heads=2, page_size=16, num_splits=2), None),
        ("L_q 4 causal", P(len_q=4, num_splits=1), None),
        ("L_q 4 non-causal, page 16, 3 splits", P(len_q=4, causal=False, page_size=16,
                                                  num_splits=3), None),
        ("L_q 16 causal, page 16, 4 splits", P(len_q=16, page_size=16, num_splits=4), None),
        ("L_q 16 non-causal, contiguous", P(len_q=16, causal=False), None),
        ("packed q (1..16 rows), page 16, 2 splits",
         P(len_q=16, packed_q=True, sparsity=0.5, page_size=16, num_splits=2, batch=5), None),
        ("packed q (1..5 rows), contiguous, non-causal",
         P(len_q=5, packed_q=True, causal=False, batch=4), None),
        ("zero-length caches, page 16, 4 splits", P(page_size=16, num_splits=4, batch=4),
         ([1] * 4, [0, 37, 0, 300])),
        ("zero-length caches, contiguous, unsplit", P(num_splits=1, batch=4),
         ([1] * 4, [0, 5, 0, 1000])),
        ("cache length 1", P(num_splits=1), ([1] * 3, [1] * 3)),
        ("cache length 1, 3 splits, page 1", P(num_splits=3, page_size=1), ([1] * 3, [1] * 3)),
        ("L_q 4 causal, rows that see no key", P(len_q=4, page_size=16, num_splits=2),
         ([4] * 3, [1, 4, 2])),
        ("fp16, contiguous, 3 splits", P(dtype="fp16", num_splits=3), None),
        ("fp16, page 16, L_q 4", P(dtype="fp16", page_size=16, len_q=4), None),
        ("D 64, contiguous, unsplit", P(head_dim=64, num_splits=1), None),
        ("D 64, page 16, 4 splits", P(head_dim=64, page_size=16, num_splits=4), None),
        ("D 64, page 1, splits chosen", P(head_dim=64, page_size=1), None),
        ("D 64, packed q, page 64", P(head_dim=64, len_q=16, packed_q=True, page_size=64,
                                      batch=4), None),
        ("D 64 fp16 MHA, L_q 4", P(head_dim=64, dtype="fp16", heads=4, kv_heads=4, len_q=4,
                                   num_splits=2), None),
        (f"{NAN_PAST_END}, contiguous, 2 splits", P(num_splits=2, sparsity=0.6), None),
        (f"{NAN_PAST_END}, page 16, L_q 4", P(page_size=16, len_q=4, sparsity=0.6), None),
        (f"{NAN_PAST_END}, page 64, 3 splits", P(page_size=64, num_splits=3, sparsity=0.6),
         None),
        (f"{NAN_PAST_END}, page 7", P(page_size=7, num_splits=1, sparsity=0.6), None),
        ("B 1, 32k keys, splits chosen", P(batch=1, heads=32, kv_heads=8, cache_len=32768), None),
        ("B 1, 32k keys, page 16, splits chosen",
         P(batch=1, heads=32, kv_heads=8, cache_len=32768, page_size=16), None),
    ]
    F = lambda **kw: P(dtype="fp8", **kw)
    out += [
        ("fp8, contiguous, unsplit", F(num_splits=1), None),
        ("fp8, contiguous, 4 splits", F(num_splits=4), None),
        ("fp8, page 16, 3 splits, jagged lengths", F(page_size=16, num_splits=3, sparsity=0.6),
         None),
        ("fp8, page 1, splits chosen", F(page_size=1), None),
        ("fp8, page 64, unsplit", F(page_size=64, num_splits=1), None),
        ("fp8, page 128, 2 splits", F(page_size=128, num_splits=2), None),
        ("fp8 GQA 16/2, page 16, 2 splits", F(heads=16, kv_heads=2, page_size=16, num_splits=2),
         None),
        ("fp8 MHA 4/4, contiguous, 2 splits", F(heads=4, kv_heads=4, num_splits=2), None),
        ("fp8, L_q 4 causal, page 16", F(len_q=4, page_size=16), None),
        ("fp8, L_q 16 causal, contiguous, 2 splits", F(len_q=16, num_splits=2), None),
        ("fp8, L_q 4 non-causal, page 7", F(len_q=4, causal=False, page_size=7), None),
        ("fp8, packed q (1..16 rows), page 16, 2 splits",
         F(len_q=16, packed_q=True, sparsity=0.5, page_size=16, num_splits=2, batch=5), None),
        ("fp8, zero-length caches, page 16, 4 splits", F(page_size=16, num_splits=4, batch=4),
         ([1] * 4, [0, 37, 0, 300])),
        ("fp8 D 64, contiguous, unsplit", F(head_dim=64, num_splits=1), None),
        ("fp8 D 64, page 16, L_q 16, 3 splits", F(head_dim=64, page_size=16, len_q=16,
                                                  num_splits=3), None),
        (f"{BF16_Q}, contiguous, unsplit", F(num_splits=1), None),
        (f"{BF16_Q}, page 16, 3 splits", F(page_size=16, num_splits=3, sparsity=0.6), None),
        (f"{BF16_Q}, L_q 4 causal, page 64", F(len_q=4, page_size=64), None),
        (f"{BF16_Q}, D 64, page 1, packed q", F(head_dim=64, page_size=1, len_q=5,
                                                packed_q=True, batch=4), None),
        (f"{NAN_PAST_END}, fp8, page 16, 2 splits", F(page_size=16, num_splits=2,
                                                      sparsity=0.6), None),
        (f"{NAN_PAST_END}, fp8, contiguous, L_q 4", F(len_q=4, sparsity=0.6), None),
        ("fp8, B 1, 32k keys, splits chosen",
         F(batch=1, heads=32, kv_heads=8, cache_len=32768), None),
        ("fp8, B 1, 32k keys, page 16, splits chosen",
         F(batch=1, heads=32, kv_heads=8, cache_len=32768, page_size=16), None),
    ]
    return out


def check_case(b, fn, name, p, lengths) -> bool:
    t0 = time.perf_counter()
    try:
        inp = p.build("cuda", lengths=lengths,
                      unused=float("nan") if name.startswith(NAN_PAST_END) else None)
        if BF16_Q in name:
            inp = decode.with_bf16_q(inp)
        rep = decode.check(inp, p, fn, check_lse=b.own, repeat=b.own)
        ok = rep.ok
        detail = "  ".join(f"{c.name} {c.max_err:.2e} <= {c.tol:.2e}" + ("" if c.ok else " BAD")
                           for c in rep.checks)
    except decode.Unsupported as e:
        ok, detail = True, f"unsupported: {e}"
    except Exception as e:
        ok, detail = False, f"raised {type(e).__name__}: {str(e)[:300]}"
        traceback.print_exc(file=sys.stderr)
    print(f"{'PASS' if ok else 'FAIL'} {b.name:5s} {name:44s} {detail}  "
          f"[{p.label()}; {time.perf_counter() - t0:.1f} s]", flush=True)
    return ok


def bad_inputs(style: str, device="cuda") -> list[tuple[str, tuple[str, ...], callable]]:
    """(case, argument names the error may name, call) for bad input; value errors go
    through check_inputs=True."""
    import jagged
    p = DecodeProblem(**G4, batch=3, cache_len=100, page_size=16)
    good = p.build(device)
    contig = p.replace(page_size=0).build(device)

    def run(inp=good, check=False, **over):
        kw = dict(page_table=inp.page_table, cu_seqlens_q=inp.cu_seqlens_q,
                  max_seqlen_q=inp.max_seqlen_q)
        a = dict(q=inp.q, k_cache=inp.k_cache, v_cache=inp.v_cache,
                 cache_seqlens=inp.cache_seqlens)
        for k, v in over.items():
            (a if k in a else kw)[k] = v
        return lambda: jagged.kvcache_attention(a["q"], a["k_cache"], a["v_cache"],
                                                a["cache_seqlens"], **kw, backend=style,
                                                check_inputs=check)

    pages, ps = good.k_cache.shape[:2]
    past, neg = good.page_table.clone(), good.page_table.clone()
    past[0, 0] = pages
    neg[1, 0] = -1
    long_ = good.cache_seqlens.clone()
    long_[0] = good.page_table.shape[1] * ps + 1
    deep = contig.cache_seqlens.clone()
    deep[2] = contig.k_cache.shape[1] + 1
    q3 = torch.randn(3, 1, 3, 128, device=device, dtype=good.q.dtype)
    packed = DecodeProblem(**G4, batch=3, cache_len=100, len_q=4, packed_q=True).build(device)
    c = packed.cu_seqlens_q.tolist()
    cu = torch.tensor([c[0], c[2], c[1] - 1, c[3]], dtype=torch.int32, device=device)
    q96 = torch.randn(3, 1, 8, 96, device=device, dtype=good.q.dtype)
    kv96 = torch.randn(3, 100, 2, 96, device=device, dtype=good.q.dtype)
    f8 = p.replace(dtype="fp8").build(device)
    bf16_q = decode.with_bf16_q(f8)
    ds = f8.k_descale
    elsewhere = "meta" if torch.device(device).type == "cpu" else "cpu"
    return [
        ("page table past the pool", ("page_table",), run(page_table=past, check=True)),
        ("negative page index", ("page_table",), run(page_table=neg, check=True)),
        ("cache_seqlens beyond the page table", ("cache_seqlens",),
         run(cache_seqlens=long_, check=True)),
        ("cache_seqlens beyond the contiguous cache", ("cache_seqlens",),
         run(contig, cache_seqlens=deep, check=True)),
        ("cu_seqlens_q not monotone", ("cu_seqlens_q",), run(packed, cu_seqlens_q=cu, check=True)),
        ("heads 3 over kv heads 2", ("q", "k_cache", "v_cache", "heads"), run(q=q3)),
        ("q fp32", ("q",), run(q=good.q.float())),
        ("k_cache fp16 beside bf16 q", ("k_cache", "v_cache"), run(k_cache=good.k_cache.half())),
        ("cache_seqlens int64", ("cache_seqlens",), run(cache_seqlens=good.cache_seqlens.long())),
        ("page_table int64", ("page_table",), run(page_table=good.page_table.long())),
        ("head dim 96", ("q", "head_dim", "k_cache"),
         run(contig, q=q96, k_cache=kv96, v_cache=kv96.clone())),
        ("fp8 q over a bf16 cache", ("q",), run(q=f8.q)),
        ("fp16 q over an fp8 cache", ("q",), run(f8, q=good.q.half())),
        ("v_cache bf16 beside an fp8 k_cache", ("v_cache", "k_cache"),
         run(f8, v_cache=good.v_cache)),
        ("q_descale with a bf16 q", ("q_descale",), run(bf16_q, q_descale=f8.q_descale)),
        ("k_descale with a bf16 cache", ("k_descale",), run(k_descale=ds)),
        ("v_descale float16", ("v_descale",), run(f8, v_descale=ds.half())),
        ("k_descale [B] only", ("k_descale",), run(f8, k_descale=ds[:, 0].contiguous())),
        ("q_descale [B, H] (not H_kv)", ("q_descale",),
         run(f8, q_descale=ds.repeat_interleave(4, 1))),
        ("v_descale not contiguous", ("v_descale",), run(f8, v_descale=ds.t().contiguous().t())),
        ("k_descale on another device", ("k_descale",), run(f8, k_descale=ds.to(elsewhere))),
    ]


def names_argument(e: Exception, args) -> bool:
    """The error is a ValueError / TypeError whose message names one of `args`."""
    return isinstance(e, (ValueError, TypeError)) and any(
        re.search(rf"(?<![\w.]){re.escape(a)}(?!\w)", str(e)) for a in args)


def check_bad(style: str) -> bool:
    ok_all = True
    for name, args, fn in bad_inputs(style):
        try:
            fn()
            torch.cuda.synchronize()
            ok, detail = False, "no error"
        except Exception as e:
            ok = names_argument(e, args)
            detail = f"{type(e).__name__}: {str(e)[:200]}" + (
                "" if ok else f"  (want a ValueError/TypeError naming one of {args})")
        ok_all &= ok
        print(f"{'PASS' if ok else 'FAIL'} {style:5s} bad input: {name:40s} {detail}", flush=True)
    return ok_all


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m harness.gpu.decode_check")
    ap.add_argument("--backends", default="tlx,cute",
                    help=f"comma list of: {', '.join(backends.names('decode'))}")
    ap.add_argument("--match", default="", help="only cases whose name contains this")
    ap.add_argument("--no-bad", action="store_true", help="skip the bad-input checks")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("decode_check needs a CUDA GPU")
    fails = 0
    for name in [n for n in a.backends.split(",") if n]:
        b = backends.get(name, kind="decode")
        ok, why = b.available()
        if not ok:
            print(f"FAIL {name:5s} not available: {why}")
            fails += 1
            continue
        t0 = time.perf_counter()
        fn = b.fn()
        # NaN past the ends: ours only (a masked baseline computes 0 x NaN; FA4 asks for
        # finite rows in a partly used page)
        todo = [c for c in cases() if a.match in c[0]
                and (b.own or not c[0].startswith(NAN_PAST_END))]
        bad = sum(not check_case(b, fn, *c) for c in todo)
        if b.own and not a.no_bad:
            bad += not check_bad(name)
        print(f"== {name}: {'all passed' if not bad else f'{bad} FAILED'} "
              f"({len(todo)} cases, {time.perf_counter() - t0:.0f} s)", flush=True)
        fails += bad
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
