"""Portable jagged flash attention in plain Triton (no TLX): forward and backward.

The reference implementation of the algorithm the TLX/CuteDSL kernels specialize:
it runs anywhere Triton runs (any CUDA GPU with tensor cores via `tl.dot`, and the
CPU interpreter, TRITON_INTERPRET=1, which the tests use).

Forward   grid (q block, batch, head): online softmax in fp32 with exp2 on
          log2(e)-scaled scores; causal KV blocks past the diagonal are skipped.
Backward  `preprocess`: delta = rowsum(dO * O);
          `dkdv` kernel, grid (KV block, batch, kv head): loops over the group's query
          heads and the q blocks, recomputing P from the saved lse, so GQA's dK/dV sum
          needs no atomics;
          `dq` kernel, grid (q block, batch, head): loops over KV blocks (deterministic).
          broadcast_q: every batch element adds into the one shared dq, so the dq kernel
          atomically adds into an fp32 [L_q, H, D] buffer (cast at the end): no
          [B, L_q, H, D] partials to hold, at the price of a nondeterministic sum order.

Layouts: q/out/dout [tokens, H, D], k/v [tokens, H_kv, D], lse/delta [H, Nq] fp32.
Causal is bottom-right aligned (jagged.seqinfo): query i of a sequence sees key j iff
j <= i + len_k - len_q. Rows that see no key get out = 0, lse = -inf, dq = 0.
Limits: batch <= 65535 (a grid axis), head_dim a power of two (64, 128).

fp8 (forward only): q, k, v are dequantized to bf16 by `jagged.fp8.dequantize_rows`
(q with q_descale per sequence and KV head, its query heads sharing their KV head's
descale), then the bf16 forward runs; out is bf16. broadcast_q: q's real values differ
per sequence (q_descale[b]), so q is expanded over the batch first and the call runs
as a cross attention with L_q rows a sequence: the same out and lse layout.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from jagged.api import make_jagged_attention
from jagged.tiles import windowed, windows
from jagged.seqinfo import (causal_kv_end, causal_q_start, causal_visible, col_q_range,
                            row_kv_range, row_seq, seq_range)

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
# Triton 3.8's interpreter keeps bf16 as raw uint16 and its tl.dot multiplies those
# integers; widening the operands there (exact) keeps the CPU tests meaningful.
INTERPRET: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


# ----------------------------------------------------------------------------- helpers

@triton.jit
def out_start(b, q_start, L_q, DENSE_Q: tl.constexpr):
    """First row of sequence b in out/dout/lse: with a dense q, batch-major copies."""
    if DENSE_Q:
        return b * L_q
    return q_start


@triton.jit
def load(base, rows, n_rows, stride, D: tl.constexpr):
    """A [len(rows), D] tile of a [tokens, heads, D] tensor; rows >= n_rows read 0."""
    ptrs = base + rows.to(tl.int64)[:, None] * stride + tl.arange(0, D)[None, :]
    return tl.load(ptrs, mask=(rows < n_rows)[:, None], other=0.0)


@triton.jit
def store(base, rows, n_rows, stride, tile, D: tl.constexpr, ATOMIC: tl.constexpr = False):
    ptrs = base + rows.to(tl.int64)[:, None] * stride + tl.arange(0, D)[None, :]
    mask = (rows < n_rows)[:, None]
    if ATOMIC:
        tl.atomic_add(ptrs, tile, mask=mask)
    else:
        tl.store(ptrs, tile.to(base.dtype.element_ty), mask=mask)


@triton.jit
def mma(a, b):
    """a @ b with fp32 accumulation (tensor cores on a GPU)."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b)


@triton.jit
def visible(i, j, len_q, len_k, CAUSAL: tl.constexpr):
    """Which (query i, key j) pairs exist; i and j broadcast against each other."""
    ok = (i < len_q) & (j < len_k)
    if CAUSAL:
        ok = ok & causal_visible(i, j, len_q, len_k)
    return ok


@triton.jit
def kv_end(m_start, len_q, len_k, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """One past the last key any query of [m_start, m_start + BLOCK_M) sees."""
    if CAUSAL:
        return causal_kv_end(m_start + BLOCK_M, len_q, len_k)
    return len_k


@triton.jit
def probs(s, lse2, ok):
    """P = exp2(s - lse2) on visible pairs, 0 elsewhere. Rows with lse = -inf see no
    key: they subtract 0 instead, so no -inf - -inf NaN can appear."""
    lse2 = tl.where(lse2 == float("-inf"), 0.0, lse2)
    return tl.math.exp2(tl.where(ok, s, float("-inf")) - lse2)


# ----------------------------------------------------------------------------- forward

@triton.jit
def fwd_kernel(Q, K, V, O, LSE, CU_Q, CU_K, qk_scale, n_out, L_q,
               stride_qt, stride_qh, stride_kt, stride_kh, stride_ot, stride_oh,
               GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DENSE_Q: tl.constexpr):
    m_start, b, h = tl.program_id(0) * BLOCK_M, tl.program_id(1), tl.program_id(2)
    q_start, len_q = seq_range(CU_Q, b, L_q, DENSE_Q)
    k_start, len_k = seq_range(CU_K, b, 0, False)
    if m_start >= len_q:
        return
    o_start = out_start(b, q_start, L_q, DENSE_Q)
    rows = m_start + tl.arange(0, BLOCK_M)
    Kh, Vh = K + (h // GROUP) * stride_kh, V + (h // GROUP) * stride_kh

    q = load(Q + h * stride_qh + q_start * stride_qt, rows, len_q, stride_qt, D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, log2 units
    l_i = tl.zeros([BLOCK_M], tl.float32)                # running sum of exp2
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for n_start in range(0, kv_end(m_start, len_q, len_k, BLOCK_M, CAUSAL), BLOCK_N):
        cols = n_start + tl.arange(0, BLOCK_N)
        k = load(Kh + k_start * stride_kt, cols, len_k, stride_kt, D)
        v = load(Vh + k_start * stride_kt, cols, len_k, stride_kt, D)
        # compute: S, online softmax, PV
        s = mma(q, tl.trans(k)) * qk_scale
        s = tl.where(visible(rows[:, None], cols[None, :], len_q, len_k, CAUSAL), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # all-masked row so far
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + mma(p.to(v.dtype), v)
        m_i = m_new

    empty = l_i == 0.0  # no visible key: out 0, lse -inf
    l_i = tl.where(empty, 1.0, l_i)
    out = acc / l_i[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_i)) * LN2)
    store(O + h * stride_oh + o_start * stride_ot, rows, len_q, stride_ot, out, D)
    tl.store(LSE + h * n_out + o_start + rows, lse, mask=rows < len_q)


ROW_SEQ_CHUNK: tl.constexpr = tl.constexpr(16)  # offsets a pass of row_seq compares


@triton.jit
def query_window(CU_Q, CU_K, WIN, n_win, w, s_first, BLOCK_M: tl.constexpr,
                 CAUSAL: tl.constexpr):
    """Live window w of at most BLOCK_M packed query rows (tiles.windows; s_first its first
    sequence): (its first row, its rows counted from there, their count, each row's keys
    [lo, hi) (rows past the window's sequences see none), and the key range the window
    reads). Rows counted from the first keep the block's alignment: the masks' register
    cost stays that of a block-aligned window (the D = 128 forward spills otherwise)."""
    s_last = tl.load(WIN + n_win + w)
    start = tl.load(WIN + 2 * n_win + w)
    n_rows = tl.load(CU_Q + s_last + 1) - start
    rows = tl.arange(0, BLOCK_M)
    seq = row_seq(CU_Q, s_first, s_last, start + rows, ROW_SEQ_CHUNK)
    lo, hi = row_kv_range(CU_Q, CU_K, seq, start + rows, CAUSAL)
    hi = tl.where(rows < n_rows, hi, lo)
    return start, rows, n_rows, lo, hi, tl.load(CU_K + s_first), tl.max(hi, 0)


@triton.jit
def fwd_window_kernel(Q, K, V, O, LSE, CU_Q, CU_K, WIN, qk_scale, n_out, n_win, L_q,
                      stride_qt, stride_qh, stride_kt, stride_kh, stride_ot, stride_oh,
                      GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DENSE_Q: tl.constexpr):
    """The forward over windows of at most BLOCK_M packed query rows (tiles.windows): a
    window may hold several short sequences; each row sees its own sequence's keys
    (seqinfo.row_kv_range), and the window reads the keys of the sequences it spans."""
    w, h = tl.program_id(0), tl.program_id(1)
    s_first = tl.load(WIN + w)
    if s_first < 0:
        return
    start, rows, n_rows, lo, hi, kv_lo, kv_hi = query_window(CU_Q, CU_K, WIN, n_win, w,
                                                             s_first, BLOCK_M, CAUSAL)
    Kh, Vh = K + (h // GROUP) * stride_kh, V + (h // GROUP) * stride_kh

    q = load(Q + h * stride_qh + start * stride_qt, rows, n_rows, stride_qt, D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for n_start in range(kv_lo, kv_hi, BLOCK_N):
        cols = n_start + tl.arange(0, BLOCK_N)
        k = load(Kh, cols, kv_hi, stride_kt, D)
        v = load(Vh, cols, kv_hi, stride_kt, D)
        s = mma(q, tl.trans(k)) * qk_scale
        ok = (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + mma(p.to(v.dtype), v)
        m_i = m_new

    empty = l_i == 0.0
    l_i = tl.where(empty, 1.0, l_i)
    out = acc / l_i[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_i)) * LN2)
    store(O + h * stride_oh + start * stride_ot, rows, n_rows, stride_ot, out, D)
    tl.store(LSE + h * n_out + start + rows, lse, mask=rows < n_rows)


# ----------------------------------------------------------------------------- backward

@triton.jit
def preprocess_kernel(O, DO, DELTA, n_out, stride_t, stride_h,
                      D: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta = rowsum(dO * O) in fp32: the softmax-backward row term."""
    rows, h = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M), tl.program_id(1)
    o = load(O + h * stride_h, rows, n_out, stride_t, D).to(tl.float32)
    do = load(DO + h * stride_h, rows, n_out, stride_t, D).to(tl.float32)
    tl.store(DELTA + h * n_out + rows, tl.sum(o * do, 1), mask=rows < n_out)


@triton.jit
def dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K, scale, qk_scale, n_out,
                L_q, stride_qt, stride_qh, stride_kt, stride_kh, stride_ot, stride_oh,
                GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DENSE_Q: tl.constexpr):
    n_start, b, hkv = tl.program_id(0) * BLOCK_N, tl.program_id(1), tl.program_id(2)
    q_start, len_q = seq_range(CU_Q, b, L_q, DENSE_Q)
    k_start, len_k = seq_range(CU_K, b, 0, False)
    if n_start >= len_k:
        return
    o_start = out_start(b, q_start, L_q, DENSE_Q)
    cols = n_start + tl.arange(0, BLOCK_N)
    koff = hkv * stride_kh + k_start * stride_kt
    k = load(K + koff, cols, len_k, stride_kt, D)
    v = load(V + koff, cols, len_k, stride_kt, D)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    # causal: the first query that sees key n_start, rounded down to a q block
    m_lo = 0
    if CAUSAL:
        m_lo = causal_q_start(n_start, len_q, len_k) // BLOCK_M * BLOCK_M
    for g in range(GROUP):  # the query heads sharing this kv head: dK/dV sum in registers
        h = hkv * GROUP + g
        Qh, DOh = Q + h * stride_qh + q_start * stride_qt, DO + h * stride_oh + o_start * stride_ot
        for m_start in range(m_lo, len_q, BLOCK_M):
            rows = m_start + tl.arange(0, BLOCK_M)
            q = load(Qh, rows, len_q, stride_qt, D)
            do = load(DOh, rows, len_q, stride_ot, D)
            lse2 = tl.load(LSE + h * n_out + o_start + rows, mask=rows < len_q, other=0.0) * LOG2E
            delta = tl.load(DELTA + h * n_out + o_start + rows, mask=rows < len_q, other=0.0)
            # compute, transposed ([keys, queries]) so P^T and dS^T feed the dots directly
            ok = visible(rows[None, :], cols[:, None], len_q, len_k, CAUSAL)
            pT = probs(mma(k, tl.trans(q)) * qk_scale, lse2[None, :], ok)
            dv += mma(pT.to(do.dtype), do)
            dpT = mma(v, tl.trans(do))
            dsT = pT * (dpT - delta[None, :])
            dk += mma(dsT.to(q.dtype), q)
    store(DK + koff, cols, len_k, stride_kt, dk * scale, D)
    store(DV + koff, cols, len_k, stride_kt, dv, D)


@triton.jit
def dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K, scale, qk_scale, n_out, L_q,
              stride_qt, stride_qh, stride_kt, stride_kh, stride_ot, stride_oh,
              GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DENSE_Q: tl.constexpr):
    m_start, b, h = tl.program_id(0) * BLOCK_M, tl.program_id(1), tl.program_id(2)
    q_start, len_q = seq_range(CU_Q, b, L_q, DENSE_Q)
    k_start, len_k = seq_range(CU_K, b, 0, False)
    if m_start >= len_q:
        return
    o_start = out_start(b, q_start, L_q, DENSE_Q)
    rows = m_start + tl.arange(0, BLOCK_M)
    Kh, Vh = K + (h // GROUP) * stride_kh, V + (h // GROUP) * stride_kh
    qoff = h * stride_qh + q_start * stride_qt
    q = load(Q + qoff, rows, len_q, stride_qt, D)
    do = load(DO + h * stride_oh + o_start * stride_ot, rows, len_q, stride_ot, D)
    lse2 = tl.load(LSE + h * n_out + o_start + rows, mask=rows < len_q, other=0.0) * LOG2E
    delta = tl.load(DELTA + h * n_out + o_start + rows, mask=rows < len_q, other=0.0)
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    for n_start in range(0, kv_end(m_start, len_q, len_k, BLOCK_M, CAUSAL), BLOCK_N):
        cols = n_start + tl.arange(0, BLOCK_N)
        k = load(Kh + k_start * stride_kt, cols, len_k, stride_kt, D)
        v = load(Vh + k_start * stride_kt, cols, len_k, stride_kt, D)
        ok = visible(rows[:, None], cols[None, :], len_q, len_k, CAUSAL)
        p = probs(mma(q, tl.trans(k)) * qk_scale, lse2[:, None], ok)
        ds = p * (mma(do, tl.trans(v)) - delta[:, None])
        dq += mma(ds.to(k.dtype), k)
    # reduce_dq: broadcast_q sums every batch element into one fp32 dq (atomics)
    store(DQ + qoff, rows, len_q, stride_qt, dq * scale, D, ATOMIC=DENSE_Q)


@triton.jit
def dkdv_window_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K, WIN, scale, qk_scale,
                       n_out, n_win, L_q, stride_qt, stride_qh, stride_kt, stride_kh,
                       stride_ot, stride_oh, GROUP: tl.constexpr, D: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                       DENSE_Q: tl.constexpr):
    """dK, dV over windows of at most BLOCK_N packed key columns (tiles.windows over
    cu_k): each column meets the query rows of its own sequence (seqinfo.col_q_range)."""
    w, hkv = tl.program_id(0), tl.program_id(1)
    s_first = tl.load(WIN + w)
    if s_first < 0:
        return
    s_last = tl.load(WIN + n_win + w)
    n_cols = tl.load(CU_K + s_last + 1)
    cols = tl.load(WIN + 2 * n_win + w) + tl.arange(0, BLOCK_N)
    seq = row_seq(CU_K, s_first, s_last, cols, ROW_SEQ_CHUNK)
    lo, hi = col_q_range(CU_Q, CU_K, seq, cols, CAUSAL)
    hi = tl.where(cols < n_cols, hi, lo)  # columns past the window's keys meet no row
    q_lo = tl.min(tl.where(hi > lo, lo, 2147483647), 0) // BLOCK_M * BLOCK_M
    q_hi = tl.load(CU_Q + s_last + 1)
    koff = hkv * stride_kh
    k = load(K + koff, cols, n_cols, stride_kt, D)
    v = load(V + koff, cols, n_cols, stride_kt, D)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    for g in range(GROUP):
        h = hkv * GROUP + g
        Qh, DOh = Q + h * stride_qh, DO + h * stride_oh
        for m_start in range(q_lo, q_hi, BLOCK_M):
            rows = m_start + tl.arange(0, BLOCK_M)
            q = load(Qh, rows, q_hi, stride_qt, D)
            do = load(DOh, rows, q_hi, stride_ot, D)
            lse2 = tl.load(LSE + h * n_out + rows, mask=rows < q_hi, other=0.0) * LOG2E
            delta = tl.load(DELTA + h * n_out + rows, mask=rows < q_hi, other=0.0)
            ok = (rows[None, :] >= lo[:, None]) & (rows[None, :] < hi[:, None])
            pT = probs(mma(k, tl.trans(q)) * qk_scale, lse2[None, :], ok)
            dv += mma(pT.to(do.dtype), do)
            dsT = pT * (mma(v, tl.trans(do)) - delta[None, :])
            dk += mma(dsT.to(q.dtype), q)
    store(DK + koff, cols, n_cols, stride_kt, dk * scale, D)
    store(DV + koff, cols, n_cols, stride_kt, dv, D)


@triton.jit
def dq_window_kernel(Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K, WIN, scale, qk_scale, n_out,
                     n_win, L_q, stride_qt, stride_qh, stride_kt, stride_kh, stride_ot,
                     stride_oh, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DENSE_Q: tl.constexpr):
    """dQ over windows of at most BLOCK_M packed query rows, as fwd_window_kernel."""
    w, h = tl.program_id(0), tl.program_id(1)
    s_first = tl.load(WIN + w)
    if s_first < 0:
        return
    start, rows, n_rows, lo, hi, kv_lo, kv_hi = query_window(CU_Q, CU_K, WIN, n_win, w,
                                                             s_first, BLOCK_M, CAUSAL)
    Kh, Vh = K + (h // GROUP) * stride_kh, V + (h // GROUP) * stride_kh
    q = load(Q + h * stride_qh + start * stride_qt, rows, n_rows, stride_qt, D)
    do = load(DO + h * stride_oh + start * stride_ot, rows, n_rows, stride_ot, D)
    lse2 = tl.load(LSE + h * n_out + start + rows, mask=rows < n_rows, other=0.0) * LOG2E
    delta = tl.load(DELTA + h * n_out + start + rows, mask=rows < n_rows, other=0.0)
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    for n_start in range(kv_lo, kv_hi, BLOCK_N):
        cols = n_start + tl.arange(0, BLOCK_N)
        k = load(Kh, cols, kv_hi, stride_kt, D)
        v = load(Vh, cols, kv_hi, stride_kt, D)
        ok = (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])
        p = probs(mma(q, tl.trans(k)) * qk_scale, lse2[:, None], ok)
        ds = p * (mma(do, tl.trans(v)) - delta[:, None])
        dq += mma(ds.to(k.dtype), k)
    store(DQ + h * stride_qh + start * stride_qt, rows, n_rows, stride_qt, dq * scale, D)


# ----------------------------------------------------------------------------- host side

def _config(kernel: str, D: int, device: torch.device):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): tiny tiles for the CPU interpreter,
    tensor-core-sized ones on a GPU (fixed, no autotuning)."""
    if device.type != "cuda":
        return 16, 16, 4, 1
    return {
        "fwd": (128, 64, 4 if D == 64 else 8, 3),
        "fwd_window": (128, 32, 4 if D == 64 else 8, 3),  # 64-key blocks spill at D = 128
        "dkdv": (32, 128, 4 if D == 64 else 8, 3),
        "dq": (128, 32, 4 if D == 64 else 8, 3),
    }[kernel]


def _common(q, k, cu_q, cu_k, broadcast_q):
    B, H = cu_k.shape[0] - 1, q.shape[1]
    n_out = B * q.shape[0] if broadcast_q else q.shape[0]
    return B, H, n_out, dict(
        CU_Q=cu_k if cu_q is None else cu_q, CU_K=cu_k, n_out=n_out,
        L_q=q.shape[0] if broadcast_q else 0,
        stride_qt=q.stride(0), stride_qh=q.stride(1), stride_kt=k.stride(0),
        stride_kh=k.stride(1), stride_ot=H * q.shape[2], stride_oh=q.shape[2],
        GROUP=H // k.shape[1], D=q.shape[2], DENSE_Q=broadcast_q)


def fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q, descale=None):
    if descale is not None:
        q, k, v, cu_q = dequantize(q, k, v, cu_q, cu_k, broadcast_q, *descale)
        broadcast_q = False
    B, H, n_out, args = _common(q, k, cu_q, cu_k, broadcast_q)
    out = q.new_empty(n_out, H, q.shape[2])
    lse = torch.empty(H, n_out, dtype=torch.float32, device=q.device)
    BM, BN, warps, stages = _config("fwd", q.shape[2], q.device)
    if not (B and H and max_q):
        return out, lse
    meta = dict(qk_scale=scale * LOG2E.value, **args, BLOCK_M=BM, BLOCK_N=BN, CAUSAL=causal,
                num_warps=warps, num_stages=stages)
    if windowed(q.shape[0], B, max_q, BM, broadcast_q):
        BM, BN, warps, stages = _config("fwd_window", q.shape[2], q.device)
        win = windows(args["CU_Q"], q.shape[0], max_q, BM)
        meta.update(BLOCK_M=BM, BLOCK_N=BN, num_warps=warps, num_stages=stages)
        fwd_window_kernel[(win.shape[1], H)](q, k, v, out, lse, WIN=win, n_win=win.shape[1],
                                             **meta)
    else:
        fwd_kernel[(triton.cdiv(max_q, BM), B, H)](q, k, v, out, lse, **meta)
    return out, lse


def dequantize(q, k, v, cu_q, cu_k, broadcast_q, q_descale, k_descale, v_descale):
    """fp8 q, k, v (e4m3) -> bf16 with their descales applied, and q's offsets;
    broadcast_q: q expanded over the batch with offsets b * L_q."""
    from jagged.fp8 import dequantize_rows
    B, G = cu_k.shape[0] - 1, q.shape[1] // k.shape[1]
    if broadcast_q:
        L = q.shape[0]
        q = q.unsqueeze(0).expand(B, *q.shape).reshape(B * L, *q.shape[1:])
        cu_q = torch.arange(B + 1, dtype=torch.int32, device=q.device) * L
    qd = q_descale.repeat_interleave(G, 1) if G > 1 else q_descale  # [B, H]: per query head
    return (dequantize_rows(q, qd, cu_q), dequantize_rows(k, k_descale, cu_k),
            dequantize_rows(v, v_descale, cu_k), cu_q)


def bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q,
        dlse=None):
    B, H, n_out, args = _common(q, k, cu_q, cu_k, broadcast_q)
    D, Hkv = q.shape[2], k.shape[1]
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    # broadcast_q: fp32 buffer the dq kernel atomically adds into (zeroed; cast below)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if broadcast_q \
        else torch.empty_like(q)
    if not (B and H):
        return dq.to(q.dtype), dk.zero_(), dv.zero_()
    delta = torch.empty(H, n_out, dtype=torch.float32, device=q.device)
    kw = dict(qk_scale=scale * LOG2E.value, scale=scale, CAUSAL=causal)
    if n_out:
        BM = _config("fwd", D, q.device)[0]
        preprocess_kernel[(triton.cdiv(n_out, BM), H)](
            out, dout, delta, n_out, H * D, D, D=D, BLOCK_M=BM)
        if dlse is not None:  # the gradient on lse (jagged.api)
            delta -= dlse
    if max_k:  # key windows where the keys are short, as the queries' for the forward
        BM, BN, warps, stages = _config("dkdv", D, q.device)
        meta = dict(**args, **kw, BLOCK_M=BM, BLOCK_N=BN, num_warps=warps, num_stages=stages)
        if windowed(k.shape[0], B, max_k, BN, broadcast_q):
            win = windows(cu_k, k.shape[0], max_k, BN)
            dkdv_window_kernel[(win.shape[1], Hkv)](q, k, v, dout, lse, delta, dk, dv,
                                                    WIN=win, n_win=win.shape[1], **meta)
        else:
            dkdv_kernel[(triton.cdiv(max_k, BN), B, Hkv)](q, k, v, dout, lse, delta, dk, dv,
                                                          **meta)
    if max_q:
        BM, BN, warps, stages = _config("dq", D, q.device)
        meta = dict(**args, **kw, BLOCK_M=BM, BLOCK_N=BN, num_warps=warps, num_stages=stages)
        if windowed(q.shape[0], B, max_q, BM, broadcast_q):
            win = windows(args["CU_Q"], q.shape[0], max_q, BM)
            dq_window_kernel[(win.shape[1], H)](q, k, v, dout, lse, delta, dq, WIN=win,
                                                n_win=win.shape[1], **meta)
        else:
            dq_kernel[(triton.cdiv(max_q, BM), B, H)](q, k, v, dout, lse, delta, dq, **meta)
    return dq.to(q.dtype), dk, dv


jagged_attention = make_jagged_attention("portable", fwd, bwd)
