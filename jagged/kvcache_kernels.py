"""The core's own small kernels around a KV-cache call: the device-side check of the
input values (before the decode), which also ranks the sequences for the decode's
launch order, and the merge of split-KV partials (after it). Both are short and
latency-bound, so each spreads its work over many programs and issues its loads at once
instead of looping over them.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .launch import cdiv, fast, next_pow2
from .offsets import offsets_ok

CHECK_BLOCK = 1024  # page-table entries one check program reads
RANK_BLOCK = 1024   # cache lengths one step of a rank compares


# ------------------------------------------------------------------ launch order
@triton.jit
def _rank_longest_first(cache_seqlens, order, b, n_k, batch, BLOCK: tl.constexpr):
    # role: schedule
    # order[rank(b)] = b, rank(b) = how many sequences come before b, longest first, ties
    # by index: a strict total order, so each rank 0 .. batch - 1 is taken once and
    # `order` is a permutation whatever the values (a bad length fails the check, never
    # the decode's indexing). The decode's programs at batch coordinate p take sequence
    # order[p]: the hardware issues programs in index order, so the longest start first
    # and the last wave's tail is short.
    rank = 0
    for s in range(0, batch, BLOCK):
        j = s + tl.arange(0, BLOCK)
        n = tl.load(cache_seqlens + j, mask=j < batch, other=0)
        before = (j < batch) & ((n > n_k) | ((n == n_k) & (j < b)))
        rank += tl.sum(before.to(tl.int32), 0)
    tl.store(order + rank, b)


# ------------------------------------------------------------------ device check (default)
@triton.jit(debug=True)  # debug: device_assert is compiled in (this kernel only)
def _inputs_check_kernel(cache_seqlens, page_table, cu_q, order, batch, capacity, max_pages,
                         num_pages, page_size, n_q, max_q, PAGED: tl.constexpr,
                         CHECK_Q: tl.constexpr, ORDER: tl.constexpr, BLOCK: tl.constexpr,
                         RANK: tl.constexpr):
    # program (sequence b, chunk c): chunk 0 checks n_k(b) (ORDER: and writes b's place in
    # the launch order); chunk c checks the page-table entries [c * BLOCK, (c + 1) * BLOCK)
    # of the pages n_k(b) uses
    b = tl.program_id(0)
    c = tl.program_id(1)
    n_k = tl.load(cache_seqlens + b)
    if c == 0:
        tl.device_assert(n_k >= 0, "cache_seqlens must not be negative")
        tl.device_assert(n_k <= capacity, "cache_seqlens exceeds the cache capacity "
                                          "(page_table.shape[1] * page_size, or k_cache.shape[1])")
        if ORDER:
            _rank_longest_first(cache_seqlens, order, b, n_k, batch, RANK)
    if PAGED:
        used = tl.minimum((tl.maximum(n_k, 0) + page_size - 1) // page_size, max_pages)
        p = c * BLOCK + tl.arange(0, BLOCK)
        idx = tl.load(page_table + b.to(tl.int64) * max_pages + p, mask=p < used, other=0)
        tl.device_assert((idx >= 0) & (idx < num_pages),
                         "page_table points outside the page pool (k_cache.shape[0])")
    if CHECK_Q:
        if (b == 0) & (c == 0):
            offsets_ok(cu_q, batch, n_q, max_q, BLOCK, "cu_seqlens_q", "max_seqlen_q",
                       "q.shape[0]")


def check_inputs_async(q_rows, k_cache, cache_seqlens, page_table, cu_seqlens_q, max_seqlen_q,
                       capacity, order=None):
    """Queue the device-side check of the values (no host sync): one program per
    (sequence, CHECK_BLOCK page-table entries), the grid from the shapes alone. order:
    None, or int32 [B] that receives the decode's launch order (the sequences longest
    first, ties by index)."""
    B = cache_seqlens.shape[0]
    if B == 0:
        return
    paged = page_table is not None
    chunks = cdiv(page_table.shape[1], CHECK_BLOCK) if paged else 1
    fast(_inputs_check_kernel)[(B, max(chunks, 1))](
        cache_seqlens, page_table if paged else cache_seqlens,
        cu_seqlens_q if cu_seqlens_q is not None else cache_seqlens,
        order if order is not None else cache_seqlens, B, capacity,
        page_table.shape[1] if paged else 0, k_cache.shape[0], k_cache.shape[1], q_rows,
        max_seqlen_q, PAGED=paged, CHECK_Q=cu_seqlens_q is not None, ORDER=order is not None,
        BLOCK=CHECK_BLOCK, RANK=RANK_BLOCK, num_warps=4)


# ------------------------------------------------------------------ combine
@triton.jit
def _combine_kernel(o_part, lse_part, out, lse, n_rows, n_splits, H: tl.constexpr,
                    D: tl.constexpr, S_POW2: tl.constexpr):
    # role: combine
    # program (row, head): lse = logsumexp_s lse_s; out = sum_s exp(lse_s - lse) o_s. All
    # splits are loaded at once ([S_POW2, D]: one memory round trip, not one per split)
    # and summed by a reduction tree fixed at compile time, so the result does not
    # depend on timing. A row no split saw (every lse_s = -inf): out 0, lse -inf.
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, S_POW2)
    d = tl.arange(0, D)
    live = s < n_splits
    ls = tl.load(lse_part + s.to(tl.int64) * (H * n_rows) + h * n_rows + row, mask=live,
                 other=float("-inf"))
    o = tl.load(o_part + (s[:, None].to(tl.int64) * n_rows + row) * (H * D) + h * D + d[None, :],
                mask=live[:, None], other=0.0)
    m = tl.max(ls, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(ls - m)
    total = tl.sum(w, 0)  # 0 (no split saw the row) or >= 1
    acc = tl.sum(w[:, None] * o, 0) / tl.maximum(total, 1.0)
    tl.store(out + row * (H * D) + h * D + d, acc.to(out.dtype.element_ty))
    tl.store(lse + h * n_rows + row,
             tl.where(total > 0, m + tl.log(tl.maximum(total, 1.0)), float("-inf")))


def combine(o_part, lse_part, out, lse):
    """Merge the splits' partials (o_part fp32 [S, Nq, H, D], lse_part fp32 [S, H, Nq])
    into out [Nq, H, D] and lse [H, Nq]."""
    S, n_rows, H, D = o_part.shape
    if n_rows == 0:
        return
    s_pow2 = next_pow2(S)
    fast(_combine_kernel)[(n_rows, H)](
        o_part, lse_part, out, lse, n_rows, S, H=H, D=D, S_POW2=s_pow2,
        num_warps=4 if s_pow2 * D <= 4096 else 8)
