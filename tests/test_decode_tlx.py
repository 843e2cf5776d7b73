"""kernels_tlx.decode_hopper: the KV-cache (decode) kernel against a float64 reference on
the gathered cache, in the Triton interpreter (CPU), every mode: contiguous and paged
(page sizes 1, 3, 16 with shuffled pages; 64: whole-page TMA boxes), dense and packed q,
causal and not, one split and three (the partials combined here with logsumexp, and once
by the core's combine), empty caches and caches of one key, GQA group 1, 3, 4 and 8, M
tiles of 16 .. 128 rows and two row blocks a sequence, D 64 and 128, fp16 and bf16. Cache
rows past a sequence's length and unused pages hold NaN: a read of any of them shows.

The default builds are compile-checked for sm_90a (two in CI, the rest under `-m matrix`):
no spills, shared memory within the limit, two programs an SM below 128 rows, K / V rings
of the table's depth.

`-m gpu` (on the H200): the same check compiled, at lengths that run the pipelined bulk;
bandwidth at B = 1, 32k keys (`-s` prints it); the config sweep behind the table.
"""
import math
import os
import re

import pytest
import torch

from harness.compile_check import SMEM_LIMIT, compile_kernel
from harness.problems import offsets
from kernels_tlx import decode_hopper as dh

interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="CPU interpreter test (TRITON_INTERPRET=1)")


def build(n_q, n_k, H, H_kv, D, page_size, dtype, dense, seed):
    """Inputs as jagged.kvcache passes them to `forward` (q 3-D) and the per-sequence
    gathered K / V [n_k, H_kv, D] for the reference."""
    g = torch.Generator().manual_seed(seed)
    B = len(n_k)
    q = torch.randn(sum(n_q), H, D, generator=g).to(dtype)
    cu_q = None if dense else offsets(torch.tensor(n_q))
    ks = [torch.randn(n, H_kv, D, generator=g).to(dtype) for n in n_k]
    vs = [torch.randn(n, H_kv, D, generator=g).to(dtype) for n in n_k]
    L_max = max(max(n_k), 1) + 2
    if page_size is None:
        k_cache = torch.full((B, L_max, H_kv, D), float("nan"), dtype=dtype)
        v_cache = k_cache.clone()
        for b in range(B):
            k_cache[b, :n_k[b]] = ks[b]
            v_cache[b, :n_k[b]] = vs[b]
        page_table = None
    else:
        max_pages = -(-L_max // page_size)
        n_pages = B * max_pages + 1
        perm = torch.randperm(n_pages, generator=g)  # pages in any order; perm[-1] unused
        k_cache = torch.full((n_pages, page_size, H_kv, D), float("nan"), dtype=dtype)
        v_cache = k_cache.clone()
        page_table = torch.full((B, max_pages), int(perm[-1]), dtype=torch.int32)
        for b in range(B):
            for p in range(-(-n_k[b] // page_size)):
                page = int(perm[b * max_pages + p])
                page_table[b, p] = page
                rows = slice(p * page_size, min((p + 1) * page_size, n_k[b]))
                n = rows.stop - rows.start
                k_cache[page, :n] = ks[b][rows]
                v_cache[page, :n] = vs[b][rows]
    seqlens = torch.tensor(n_k, dtype=torch.int32)
    return q, k_cache, v_cache, seqlens, page_table, cu_q, ks, vs


def reference(q, ks, vs, n_q, H, causal, scale):
    """(out [Nq, H, D], lse [H, Nq]) in float64; a row that sees no key: 0 and -inf."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((H, q.shape[0]), float("-inf"), dtype=torch.float64)
    start = 0
    for b, (k, v) in enumerate(zip(ks, vs)):
        nq, nk = n_q[b], k.shape[0]
        group = H // k.shape[1]
        qb = q[start:start + nq].double().transpose(0, 1)                  # [H, nq, D]
        kb = k.double().repeat_interleave(group, 1).transpose(0, 1)       # [H, nk, D]
        vb = v.double().repeat_interleave(group, 1).transpose(0, 1)
        s = qb @ kb.transpose(1, 2) * scale
        i = torch.arange(nq)[:, None]
        j = torch.arange(nk)[None, :]
        keep = (j <= i + nk - nq) if causal else torch.ones(nq, nk, dtype=torch.bool)
        s = s.masked_fill(~keep, float("-inf"))
        l = torch.logsumexp(s, -1)                                         # [H, nq]
        p = torch.exp(s - l[..., None]).nan_to_num(0.0)
        out[start:start + nq] = (p @ vb).transpose(0, 1)
        lse[:, start:start + nq] = l
        start += nq
    return out, lse


def run(q, k_cache, v_cache, seqlens, page_table, cu_q, len_q, causal, scale, splits,
        config=None, descale=None):
    """`forward` with NaN-poisoned outputs; splits > 1 combined as the core does.
    descale: an fp8 call's three descales (out bf16)."""
    Nq, H, D = q.shape
    nan = dict(fill_value=float("nan"), device=q.device)
    out = torch.full(q.shape, dtype=torch.bfloat16 if descale is not None else q.dtype, **nan)
    lse = torch.full((H, Nq), **nan)
    o_part = lse_part = None
    if splits > 1:
        o_part = torch.full((splits, Nq, H, D), **nan)
        lse_part = torch.full((splits, H, Nq), **nan)
    dh.forward(q, k_cache, v_cache, seqlens, page_table, cu_q,
               out if splits == 1 else None, lse if splits == 1 else None, o_part, lse_part,
               len_q=len_q, causal=causal, scale=scale, num_splits=splits, config=config,
               **({} if descale is None else {"descale": descale}))
    if splits == 1:
        return out.double().cpu(), lse.double().cpu()
    o_part, lse_part = o_part.cpu(), lse_part.cpu()
    assert not o_part.isnan().any() and not lse_part.isnan().any()
    lse = torch.logsumexp(lse_part.double(), 0)                           # [H, Nq]
    w = torch.exp(lse_part.double() - lse).nan_to_num(0.0)                # -inf - -inf
    out = (w.permute(0, 2, 1)[..., None] * o_part.double()).sum(0)
    return out, lse


# (id, n_q per sequence (None: dense, len_q given), len_q, n_k, H, H_kv, D, page, dtype, causal)
CASES = [
    ("contig-decode-gqa4-d128", None, 1, [37, 1, 0], 8, 2, 128, None, torch.float16, True),
    ("contig-dense-lq3-d64", None, 3, [70, 2, 5], 4, 1, 64, None, torch.bfloat16, True),
    ("contig-noncausal-gqa3", None, 2, [33, 0, 9], 6, 2, 64, None, torch.float16, False),
    ("page1-packed-gqa4", [1, 3, 0], 3, [40, 5, 7], 8, 2, 64, 1, torch.float16, True),
    ("page3-packed-mha-d128", [2, 1, 4], 4, [29, 1, 0], 2, 2, 128, 3, torch.bfloat16, True),
    ("page16-dense-noncausal", None, 2, [75, 16, 1], 4, 2, 64, 16, torch.float16, False),
    ("page16-packed-causal-lq>lk", [6, 2], 6, [3, 40], 4, 1, 64, 16, torch.float16, True),
    ("page64-whole-pages", [1, 2], 2, [200, 64], 8, 2, 128, 64, torch.float16, True),
    ("contig-m64-gqa4", None, 12, [50, 12], 8, 2, 64, None, torch.bfloat16, True),
    ("page16-two-row-blocks-gqa8", [20, 7, 0], 20, [60, 30, 5], 16, 2, 64, 16, torch.float16,
     True),
]


# 16-key blocks: several blocks a split, the pipelined bulk, TMA boxes in the contiguous
# cache and in 16- and 64-key pages, split boundaries inside a sequence
SMALL = dh.Config(block_n=16, num_stages=2, num_warps=4)
SMALL_SWAP = dh.Config(block_n=16, num_stages=2, num_warps=4, swap=True)  # many blocks


@interp
@pytest.mark.parametrize("config", [None, SMALL], ids=["default", "bn16"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_decode(case, splits, config):
    _, n_q, len_q, n_k, H, H_kv, D, page, dtype, causal = case
    dense = n_q is None
    n_q = [len_q] * len(n_k) if dense else n_q
    scale = 1.0 / math.sqrt(D)
    q, k_cache, v_cache, seqlens, pt, cu_q, ks, vs = build(n_q, n_k, H, H_kv, D, page, dtype,
                                                           dense, seed=len(case[0]) + splits)
    out, lse = run(q, k_cache, v_cache, seqlens, pt, cu_q, len_q, causal, scale, splits, config)
    want_out, want_lse = reference(q, ks, vs, n_q, H, causal, scale)
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    torch.testing.assert_close(out, want_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-4)


# fp8 caches: (id, n_q (None: dense), len_q, n_k, H, H_kv, D, page, q dtype, causal)
FP8_CASES = [
    ("contig-decode-gqa4-d128", None, 1, [37, 1, 0], 8, 2, 128, None, torch.float8_e4m3fn, True),
    ("page16-packed-bf16q", [1, 3, 2], 3, [40, 5, 0], 8, 2, 64, 16, torch.bfloat16, True),
    ("page3-dense-noncausal-mha", None, 2, [29, 2], 2, 2, 64, 3, torch.float8_e4m3fn, False),
    ("contig-m64-bf16q-lq12", None, 12, [50, 12], 8, 2, 64, None, torch.bfloat16, True),
]


def descales(B, H_kv, seed):
    """fp32 [B, H_kv] descales away from 1 (so a missed or swapped one shows)."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.rand(B, H_kv, generator=g) * 1.5 + 0.25 for _ in range(3))


def dequantized(q, ks, vs, n_q, H, qd, kd, vd):
    """The real values of an fp8 call (float64): q rows times their (sequence, kv head)
    q descale, each sequence's K / V times its k / v descale."""
    H_kv = ks[0].shape[1]
    seq = torch.repeat_interleave(torch.arange(len(n_q)), torch.tensor(n_q))
    qx = q.double() * qd[seq].double().repeat_interleave(H // H_kv, 1)[..., None]
    kx = [k.double() * kd[b].double()[None, :, None] for b, k in enumerate(ks)]
    vx = [v.double() * vd[b].double()[None, :, None] for b, v in enumerate(vs)]
    return qx, kx, vx


@interp
@pytest.mark.parametrize("config", [None, SMALL, SMALL_SWAP], ids=["default", "bn16", "bn16-swap"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("case", FP8_CASES, ids=[c[0] for c in FP8_CASES])
def test_decode_fp8(case, splits, config):
    """An e4m3 cache (NaN past the ends) with descales per (sequence, kv head), an e4m3 or
    a bf16 q: out bf16 against float64 on the dequantized values."""
    _, n_q, len_q, n_k, H, H_kv, D, page, q_dtype, causal = case
    dense = n_q is None
    n_q = [len_q] * len(n_k) if dense else n_q
    scale = 1.0 / math.sqrt(D)
    q, k_cache, v_cache, seqlens, pt, cu_q, ks, vs = build(
        n_q, n_k, H, H_kv, D, page, torch.float8_e4m3fn, dense, seed=len(case[0]) + splits)
    q = (q.float() * 2).to(q_dtype)
    qd, kd, vd = descales(len(n_k), H_kv, splits)
    if q_dtype != torch.float8_e4m3fn:
        qd = torch.ones_like(qd)  # what the core passes for a bf16 q
    out, lse = run(q, k_cache, v_cache, seqlens, pt, cu_q, len_q, causal, scale, splits, config,
                   descale=(qd, kd, vd))
    want_out, want_lse = reference(*dequantized(q, ks, vs, n_q, H, qd, kd, vd), n_q, H,
                                   causal, scale)
    torch.testing.assert_close(out, want_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-4)


@interp
@pytest.mark.parametrize("magnitude", [3e5, 2e-6])
def test_decode_fp8_bf16_q_range(magnitude):
    """A bf16 q beyond f16's range or below its normal range over an e4m3 cache (the
    kernel computes in f16): softmax_scale brings the logits back to O(1)."""
    n_q, n_k, H, H_kv, D = [1, 1], [45, 20], 8, 2, 64
    q, k_cache, v_cache, seqlens, _, cu_q, ks, vs = build(
        n_q, n_k, H, H_kv, D, None, torch.float8_e4m3fn, True, seed=11)
    q = (q.float() * magnitude).to(torch.bfloat16)
    scale = 1.0 / (magnitude * math.sqrt(D))
    qd, kd, vd = descales(len(n_k), H_kv, 4)
    qd = torch.ones_like(qd)
    out, lse = run(q, k_cache, v_cache, seqlens, None, cu_q, 1, True, scale, 1,
                   descale=(qd, kd, vd))
    want_out, want_lse = reference(*dequantized(q, ks, vs, n_q, H, qd, kd, vd), n_q, H,
                                   True, scale)
    torch.testing.assert_close(out, want_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-4)


@interp
@pytest.mark.parametrize("config", [None, SMALL], ids=["default", "bn16"])
def test_decode_unaligned_contiguous(config):
    """A contiguous cache whose base is not 16-byte aligned: no TMA, the bulk gathered."""
    n_q, n_k, H, H_kv, D = [2, 1], [150, 40], 4, 2, 64
    q, k_cache, v_cache, seqlens, _, cu_q, ks, vs = build(n_q, n_k, H, H_kv, D, None,
                                                          torch.float16, False, seed=5)
    shifted = [torch.empty(c.numel() + 1, dtype=c.dtype)[1:].view(c.shape) for c in
               (k_cache, v_cache)]
    for dst, src in zip(shifted, (k_cache, v_cache)):
        dst.copy_(src)
    assert shifted[0].data_ptr() % 16 != 0
    out, lse = run(q, *shifted, seqlens, None, cu_q, 2, True, 0.125, 3, config)
    want_out, want_lse = reference(q, ks, vs, n_q, H, True, 0.125)
    torch.testing.assert_close(out, want_out, atol=3e-3, rtol=3e-3)
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-4)


@interp
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_cache_without_rows(splits):
    """A contiguous cache of capacity 0 (every sequence empty): out 0, lse -inf."""
    q = torch.randn(4, 4, 64).half()
    cache = torch.empty(2, 0, 2, 64, dtype=torch.float16)
    out, lse = run(q, cache, cache, torch.zeros(2, dtype=torch.int32), None, None, 2, True,
                   0.125, splits)
    assert (out == 0).all() and (lse == float("-inf")).all()


@interp
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_with_core_combine(splits):
    """`forward` through the core's call (jagged.kvcache.run: outputs, partials and the
    combine kernel), paged, packed, causal."""
    kvcache = pytest.importorskip("jagged.kvcache")
    n_q, n_k, H, H_kv, D = [3, 0, 1], [50, 9, 0], 8, 2, 64
    q, k_cache, v_cache, seqlens, pt, cu_q, ks, vs = build(n_q, n_k, H, H_kv, D, 3,
                                                           torch.float16, False, seed=9)
    out, lse = kvcache.run(dh.forward, q, k_cache, v_cache, seqlens, pt, cu_q, 3, True,
                           0.125, splits)
    want_out, want_lse = reference(q, ks, vs, n_q, H, True, 0.125)
    torch.testing.assert_close(out.double(), want_out, atol=3e-3, rtol=3e-3)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-4)


def test_tiles_and_kinds():
    """The M tile holds group * len_q rows (>= 16); TMA boxes only inside a page."""
    assert dh.rows_per_tile(1, 1) == 16 and dh.rows_per_tile(4, 5) == 32
    assert dh.rows_per_tile(8, 8) == 64 and dh.rows_per_tile(8, 16) == 128
    assert dh.rows_per_tile(8, 64) == 128
    pt = torch.zeros(1, 1, dtype=torch.int32)
    bn = dh.CONFIGS[(128, 16, "page", 2)].block_n
    assert dh.pick_config(128, 16, None, 1)[1] == "contig"
    assert dh.pick_config(128, 16, pt, bn)[1] == "page"
    assert dh.pick_config(128, 16, pt, 2 * bn)[1] == "page"
    assert dh.pick_config(128, 16, pt, 16) == (dh.CONFIGS[(128, 16, "gather", 2)], "gather")
    assert dh.pick_config(128, 16, pt, bn + 1)[1] == "gather"


# default builds: (head_dim, rows per tile, kind, page size, dtype, split, causal, the K / V
# ring depth, or (K's, V's) where they differ); every entry of dh.CONFIGS compiles
# spill-free (resources: the table's note)
# dtype "fp8": q and cache e4m3; "fp8-bf16": a bf16 q over an e4m3 cache
BUILDS = [
    (128, 16, "gather", 1, "bf16", True, True, 3),
    (128, 16, "contig", 1, "fp8", True, True, (2, 1)),
    (128, 16, "page", 64, "fp16", False, False, 3),
    (128, 16, "page", 128, "fp8-bf16", False, True, 2),
    (64, 32, "contig", 1, "bf16", False, True, 3),
    (128, 64, "gather", 16, "bf16", True, True, 5),
    (128, 16, "gather", 16, "fp8", True, True, 2),
    (64, 16, "contig", 1, "fp8-bf16", True, True, 5),
    (64, 16, "gather", 1, "fp8", False, True, (8, 7)),
    (64, 16, "page", 128, "fp8-bf16", False, True, 4),
    (128, 32, "page", 64, "fp8", False, True, (4, 3)),
    (128, 32, "gather", 16, "fp8", True, True, (5, 4)),
    (64, 32, "contig", 1, "fp8", True, False, (9, 8)),
    (64, 32, "page", 64, "fp8-bf16", False, True, 4),
    (128, 64, "gather", 16, "fp8", True, True, (4, 3)),
    (128, 64, "contig", 1, "fp8-bf16", False, True, 3),
    (64, 64, "page", 128, "fp8", True, True, (5, 4)),
    (128, 128, "page", 128, "fp8", True, True, (4, 3)),
    (64, 128, "contig", 1, "fp8", True, True, (4, 3)),
]
QUICK_BUILDS = 2  # the first ones (row gather, TMA) run by default, the rest with the matrix


@pytest.mark.parametrize("build_", BUILDS[:QUICK_BUILDS] + [
    pytest.param(b, marks=pytest.mark.matrix) for b in BUILDS[QUICK_BUILDS:]],
    ids=["-".join(map(str, b[:7])) for b in BUILDS])
def test_compile_sm90(build_):
    """No spills, shared memory within the limit (two programs an SM below 128 rows),
    and the bulk loop pipelined into K and V rings of the stated depth."""
    d, m, kind, page, dt, split, causal, ring = build_
    fp8 = dt.startswith("fp8")
    cache_dt, q_dt = ("fp8e4nv", dt[4:] or "fp8e4nv") if fp8 else (dt, dt)
    cfg = dh.CONFIGS[(d, m, kind, 1 if fp8 else 2)]
    rep = compile_kernel(dh.decode_kernel, dh.signature(cfg, d, kind, cache_dt, split, q_dt),
                         dh.kernel_args(cfg, d, 4, m, page, kind, False, causal, split,
                                        fp8=fp8, q8=q_dt == "fp8e4nv"),
                         arch=90, num_warps=cfg.num_warps, num_stages=1,
                         name=f"decode D{d} M{m} {kind} p{page} {dt}")
    print(rep.row())
    assert not rep.spills, f"spills / local memory: {rep.row()}"
    assert rep.total_smem <= SMEM_LIMIT[90], rep.row()
    if m < 128:  # shared memory (1 KB a CTA reserved) and registers (8-register units)
        assert 2 * (rep.total_smem + 1024) <= 228 * 1024, f"two programs an SM: {rep.row()}"
        regs = -(-rep.registers // 8) * 8
        assert 2 * rep.num_warps * 32 * regs <= 65536, f"two programs an SM: {rep.row()}"
    ty = {"fp16": "f16", "bf16": "bf16"}.get(dt, "f8E4M3FN")
    for depth in (ring if isinstance(ring, tuple) else (ring, ring)):
        assert f"memdesc<{depth}x{cfg.block_n}x{d}x{ty}, #shared" in rep.ttgir, \
            f"K / V not in rings of {ring}: {rep.row()}"
    if kind != "gather":
        assert "async_tma_copy_global_to_local" in rep.ttgir, "bulk K / V not through TMA"
    q8 = q_dt == "fp8e4nv"
    if fp8:  # an e4m3 q meets e4m3 K in an fp8 wgmma (no conversion) where the tile is a
        # wgmma one (64+ rows, or swapped), a bf16 q never
        assert (".e4m3.e4m3" in rep.ptx) == (q8 and (m >= 64 or cfg.swap)), rep.row()
    if fp8 and m < 64:  # e4m3 V converted in its load layout (_v_f16), then read as an
        # f16 tile by ldmatrix, never byte by byte; swapped: wgmma over the keys
        assert re.search(r"ldmatrix[^;]*\.trans", rep.ptx), rep.row()
        assert not re.search(r"ld\.shared\.[ub]8", rep.ptx), "V read from smem by bytes"
        swapped = cfg.swap and q8
        assert ("mma.sync" not in rep.ptx and f"n{m}k" in rep.ptx) == swapped, rep.row()


# ----------------------------------------------------------------------------- GPU
# (n_q per sequence (None: dense), len_q, n_k, H, H_kv, D, page, dtype, causal): the
# default configs over whole pipelined bulks, every cache kind, M tiles 16 .. 128
GPU_CASES = [
    (None, 1, [3000, 1, 0, 777], 32, 8, 128, None, torch.bfloat16, True),
    (None, 1, [2049, 130, 1], 32, 8, 128, 1, torch.bfloat16, True),
    (None, 4, [1500, 4, 2], 32, 8, 128, 16, torch.float16, True),
    ([16, 3, 0], 16, [1024, 17, 5], 8, 1, 128, 64, torch.bfloat16, True),
    ([5, 1], 5, [900, 300], 64, 8, 128, 128, torch.bfloat16, False),
    (None, 16, [1300, 20], 64, 8, 64, 16, torch.float16, True),
    (None, 2, [2500, 0], 16, 16, 64, None, torch.bfloat16, False),
    ([12, 1], 12, [640, 12], 16, 4, 64, 256, torch.float16, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3, 16])
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"gpu{i}" for i in range(len(GPU_CASES))])
def test_decode_gpu(case, splits):
    n_q, len_q, n_k, H, H_kv, D, page, dtype, causal = case
    dense = n_q is None
    n_q = [len_q] * len(n_k) if dense else n_q
    scale = 1.0 / math.sqrt(D)
    inp = build(n_q, n_k, H, H_kv, D, page, dtype, dense, seed=splits)
    q, k_cache, v_cache, seqlens, pt, cu_q, ks, vs = inp
    dev = [None if t is None else t.cuda() for t in (q, k_cache, v_cache, seqlens, pt, cu_q)]
    out, lse = run(*dev, len_q, causal, scale, splits)
    want_out, want_lse = reference(q, ks, vs, n_q, H, causal, scale)
    tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    torch.testing.assert_close(out.cpu(), want_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.cpu(), want_lse, atol=1e-4, rtol=1e-4)


def _bench_cache(B, n_k, H_kv, D, page, dtype=torch.bfloat16):
    """A full cache of n_k keys a sequence on the GPU: contiguous, or shuffled pages."""
    g = torch.Generator(device="cuda").manual_seed(0)
    if page is None:
        shape, pt = (B, n_k, H_kv, D), None
    else:
        per = -(-n_k // page)
        shape = (B * per, page, H_kv, D)
        pt = torch.randperm(B * per, device="cuda", generator=g).to(torch.int32).view(B, per)
    k = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g).to(dtype)
    v = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g).to(dtype)
    return k, v, pt


def _tbps(B, n_k, H, H_kv, D, page, splits, config=None, len_q=1, dtype=torch.bfloat16):
    """K + V bytes read per second (TB/s) of `forward` alone (no combine); dtype fp8:
    an e4m3 cache and q, descales of ones."""
    from triton.testing import do_bench
    k, v, pt = _bench_cache(B, n_k, H_kv, D, page, dtype)
    fp8 = dtype == torch.float8_e4m3fn
    q = torch.randn(B * len_q, H, D, device="cuda").to(k.dtype)
    seqlens = torch.full((B,), n_k, device="cuda", dtype=torch.int32)
    Nq = q.shape[0]
    ones = torch.ones(B, H_kv, device="cuda")
    extra = {"descale": (ones, ones, ones)} if fp8 else {}
    out = torch.empty(q.shape, device="cuda", dtype=torch.bfloat16 if fp8 else q.dtype)
    lse = torch.empty(H, Nq, device="cuda")
    o_part = torch.empty(splits, Nq, H, D, device="cuda")
    lse_part = torch.empty(splits, H, Nq, device="cuda")
    parts = (None, None, o_part, lse_part) if splits > 1 else (out, lse, None, None)

    def call():
        dh.forward(q, k, v, seqlens, pt, None, *parts, len_q=len_q, causal=True,
                   scale=D ** -0.5, num_splits=splits, config=config, **extra)

    ms = do_bench(call, warmup=25, rep=100, return_mode="median")
    return 2 * k.numel() * k.element_size() / (ms * 1e-3) / 1e12


BANDWIDTH = [(None, 1), (1, 1), (16, 1), (64, 1), (128, 1), (None, 16), (16, 16)]


@pytest.mark.gpu
@pytest.mark.parametrize("page,len_q", BANDWIDTH, ids=[f"page{p}-lq{n}" for p, n in BANDWIDTH])
def test_decode_bandwidth(page, len_q):
    """Prints TB/s of K + V at the issue's headline shape (B = 1, 32k keys, GQA 32/8,
    D = 128; one query row, or 16: 64-row tiles) for a few split counts; run with -s."""
    for splits in (16, 33, 66):
        tbps = _tbps(1, 32768, 32, 8, 128, page, splits, len_q=len_q)
        print(f"\ndecode B1 32k GQA32/8 D128 L_q {len_q} page {page} splits {splits}: "
              f"{tbps:.2f} TB/s", end="")


# candidate configs at D = 128, 16 rows: (block_n, num_stages, num_warps). The stages
# mean different ring depths behind a page-table load and without one (dh.CONFIGS)
SWEEP = {"paged": [(64, 7, 4), (64, 9, 4), (64, 5, 4), (64, 7, 8), (64, 7, 2), (128, 7, 4)],
         "contig": [(64, 4, 4), (64, 3, 4), (64, 5, 4), (64, 4, 8), (64, 4, 2), (128, 4, 4)]}


@pytest.mark.gpu
@pytest.mark.parametrize("page", [None, 1, 16, 64], ids=lambda p: f"page{p}")
def test_decode_config_sweep(page):
    """Prints TB/s of each candidate config (B = 1, 32k, GQA 32/8, D = 128, 33 splits;
    B = 64, 4k, 2 splits): the table's entries come from here; run with -s."""
    for bn, st, w in SWEEP["contig" if page is None else "paged"]:
        cfg = dh.Config(block_n=bn, num_stages=st, num_warps=w)
        a = _tbps(1, 32768, 32, 8, 128, page, 33, cfg)
        b = _tbps(64, 4096, 32, 8, 128, page, 2, cfg)
        kind = "contig" if page is None else dh.cache_kind(True, page, bn)
        print(f"\npage {page} {kind:6s} {cfg}: B1 32k {a:.2f} TB/s, B64 4k {b:.2f} TB/s", end="")


@pytest.mark.parametrize("split", [True, pytest.param(False, marks=pytest.mark.matrix)],
                         ids=["split", "unsplit"])
def test_compile_with_unit_ints(split):
    """Triton specializes an integer argument equal to 1 into a constant (one query row,
    one KV head, pages of one row, a one-entry page table): the kernel must compile
    with each such argument a plain int."""
    cfg = dh.CONFIGS[(128, 16, "gather", 2)]
    sig = dh.signature(cfg, 128, "gather", "bf16", split)
    ones = {n: 1 for n in ("Nq", "H_kv", "max_pages", "len_q", "L_max")}
    for n in ones:
        sig[n] = "constexpr"
    rep = compile_kernel(dh.decode_kernel, sig,
                         {**dh.kernel_args(cfg, 128, 4, 16, 1, "gather", True, True, split),
                          **ones},
                         arch=90, num_warps=cfg.num_warps, num_stages=1, name="decode unit ints")
    assert not rep.spills, rep.row()


# ----------------------------------------------------------------------------- GPU, fp8
@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3, 16])
@pytest.mark.parametrize("case", GPU_CASES, ids=[f"gpu{i}" for i in range(len(GPU_CASES))])
def test_decode_fp8_gpu(case, splits):
    """GPU_CASES on an e4m3 cache with descales: an e4m3 q in even cases, bf16 in odd. An
    e4m3 q's scores come from an fp8 wgmma, whose accumulation keeps fewer bits than fp32
    (lse within 3.8e-3 of float64 on an H100, 1e-4 with the f16 products): far below what
    quantizing q to e4m3 costs (3 mantissa bits)."""
    n_q, len_q, n_k, H, H_kv, D, page, _, causal = case
    dense = n_q is None
    n_q = [len_q] * len(n_k) if dense else n_q
    scale = 1.0 / math.sqrt(D)
    q, k_cache, v_cache, seqlens, pt, cu_q, ks, vs = build(
        n_q, n_k, H, H_kv, D, page, torch.float8_e4m3fn, dense, seed=splits)
    fp8_q = GPU_CASES.index(case) % 2 == 0
    q = (q.float() * 2).to(torch.float8_e4m3fn if fp8_q else torch.bfloat16)
    qd, kd, vd = descales(len(n_k), H_kv, splits)
    qd = qd if fp8_q else torch.ones_like(qd)
    dev = [None if t is None else t.cuda() for t in (q, k_cache, v_cache, seqlens, pt, cu_q)]
    out, lse = run(*dev, len_q, causal, scale, splits,
                   descale=tuple(t.cuda() for t in (qd, kd, vd)))
    want_out, want_lse = reference(*dequantized(q, ks, vs, n_q, H, qd, kd, vd), n_q, H,
                                   causal, scale)
    torch.testing.assert_close(out.cpu(), want_out, atol=2e-2, rtol=2e-2)
    tol = 1e-2 if fp8_q else 1e-4
    torch.testing.assert_close(lse.cpu(), want_lse, atol=tol, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("page,len_q", BANDWIDTH, ids=[f"page{p}-lq{n}" for p, n in BANDWIDTH])
def test_decode_bandwidth_fp8(page, len_q):
    """Prints TB/s of an e4m3 cache beside bf16 at the headline shape (B = 1, 32k keys,
    GQA 32/8, D = 128) and the speedup in tokens a second (issue 33: 1.8x); run with -s."""
    for splits in (16, 33, 66):
        f8 = _tbps(1, 32768, 32, 8, 128, page, splits, len_q=len_q, dtype=torch.float8_e4m3fn)
        bf = _tbps(1, 32768, 32, 8, 128, page, splits, len_q=len_q)
        print(f"\ndecode B1 32k GQA32/8 D128 L_q {len_q} page {page} splits {splits}: fp8 "
              f"{f8:.2f} TB/s, bf16 {bf:.2f} TB/s, speedup {2 * f8 / bf:.2f}x", end="")


# fp8 candidates at D = 128, 16 rows: (block_n, num_stages, num_warps)
SWEEP_FP8 = {"paged": [(128, 7, 4), (128, 9, 4), (64, 9, 4), (64, 11, 4), (128, 7, 8)],
             "contig": [(128, 4, 4), (128, 5, 4), (64, 5, 4), (64, 7, 4), (256, 4, 4)]}


@pytest.mark.gpu
@pytest.mark.parametrize("page", [None, 1, 16, 128], ids=lambda p: f"page{p}")
def test_decode_fp8_config_sweep(page):
    """Prints TB/s of each fp8 candidate (B = 1, 32k, GQA 32/8, D = 128, 33 splits;
    B = 64, 4k, 2 splits): FP8_CONFIGS' 16-row entries come from here; run with -s. A
    candidate that does not fit prints its error."""
    f8 = torch.float8_e4m3fn
    for bn, st, w in SWEEP_FP8["contig" if page is None else "paged"]:
        cfg = dh.Config(block_n=bn, num_stages=st, num_warps=w)
        kind = "contig" if page is None else dh.cache_kind(True, page, bn)
        try:
            a = _tbps(1, 32768, 32, 8, 128, page, 33, cfg, dtype=f8)
            b = _tbps(64, 4096, 32, 8, 128, page, 2, cfg, dtype=f8)
            res = f"B1 32k {a:.2f} TB/s, B64 4k {b:.2f} TB/s"
        except Exception as e:  # out of shared memory / registers
            res = f"{type(e).__name__}: {str(e)[:120]}"
        print(f"\nfp8 page {page} {kind:6s} {cfg}: {res}", end="")


def test_forward_wants_descales_exactly_for_fp8():
    """An e4m3 cache without descales (or descales for a bf16 cache) is an error, not a
    silent launch of the wrong build."""
    q, k, v, n, pt, cu, _, _ = build([1], [5], 4, 2, 64, None, torch.float8_e4m3fn, True, 0)
    with pytest.raises(ValueError, match="descale must be given exactly"):
        run(q.bfloat16(), k, v, n, pt, cu, 1, True, 0.125, 1)
    ones = torch.ones(1, 2)
    with pytest.raises(ValueError, match="descale must be given exactly"):
        run(q.bfloat16(), k.bfloat16(), v.bfloat16(), n, pt, cu, 1, True, 0.125, 1,
            descale=(ones, ones, ones))
