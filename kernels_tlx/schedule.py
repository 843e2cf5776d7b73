"""`schedule`: the jagged tile list, built on the GPU from the offsets (no host sync).

A *pair* is (batch element b, query block m) for m < cdiv(max_seqlen_q, BLOCK_M); it is
valid when the block holds at least one query row. Valid pairs are ordered by
descending KV work (KV blocks the block visits, causal-aware), invalid ones go last,
and the count of valid pairs stays on the device. Heads are folded in by the kernel:
tile t is (pair t // H, head t % H), so the H tiles of one pair (and the query heads
sharing a KV head under GQA) run side by side on neighbouring SMs.

A persistent program p takes tiles p, p + P, p + 2P, ... of this longest-first list:
the round-robin over a sorted list keeps every SM's total work within one tile of
the others' (list scheduling, longest processing time first).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from harness.tiles import seq_lens, sort_launch


@triton.jit
def _pair_keys(pair, inb, cu_q, cu_k, NBLK, L_q, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr):
    """Sort key of (sequence, query block) pairs: -work in the high 32 bits, the pair in
    the low (ascending order = longest first); LAST_KEY for invalid pairs and past
    n_pairs. And whether the pair is valid."""
    b = pair // NBLK
    m0 = (pair % NBLK) * BLOCK_M
    len_q, len_k = seq_lens(cu_q, cu_k, b, inb, L_q, BROADCAST_Q)
    valid = inb & (m0 < len_q)
    if CAUSAL:
        kv_end = tl.minimum(tl.maximum(m0 + BLOCK_M + len_k - len_q, 0), len_k)
    else:
        kv_end = len_k
    work = (kv_end + BLOCK_N - 1) // BLOCK_N + 1
    key = ((-work).to(tl.int64) << 32) | pair.to(tl.int64)
    return tl.where(valid, key, 0x7FFFFFFFFFFFFFFF), valid


@triton.jit
def _tile_keys_kernel(cu_q, cu_k, keys_ptr, count_ptr, n_pairs, NBLK, L_q,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                      BROADCAST_Q: tl.constexpr, BLOCK: tl.constexpr, SORT: tl.constexpr):
    """One program. SORT (n_pairs <= BLOCK): the keys, sorted here. Else the unsorted
    keys of every pair, 1024 at a time. Both store the count of valid pairs (no zeroed
    buffer, no atomics: a torch.zeros cost ~0.1 ms of host time per call on the H200
    node)."""
    if SORT:
        pair = tl.arange(0, BLOCK)
        inb = pair < n_pairs
        key, valid = _pair_keys(pair, inb, cu_q, cu_k, NBLK, L_q, BLOCK_M, BLOCK_N, CAUSAL,
                                BROADCAST_Q)
        tl.store(keys_ptr + pair, tl.sort(key), mask=inb)
        total = tl.sum(valid.to(tl.int32), 0)
    else:
        total = 0
        for start in range(0, n_pairs, BLOCK):
            pair = start + tl.arange(0, BLOCK)
            inb = pair < n_pairs
            key, valid = _pair_keys(pair, inb, cu_q, cu_k, NBLK, L_q, BLOCK_M, BLOCK_N, CAUSAL,
                                    BROADCAST_Q)
            tl.store(keys_ptr + pair, key, mask=inb)
            total += tl.sum(valid.to(tl.int32), 0)
    tl.store(count_ptr, total)


def build_tiles(cu_q, cu_k, batch: int, max_seqlen_q: int, len_q_dense: int | None,
                block_m: int, block_n: int, causal: bool):
    """-> (pairs int64 [batch * nblk], longest first, the pair b * nblk + m in the low 32
    bits; count int32 [1] of valid pairs; nblk). One small Triton kernel makes and sorts
    the keys (torch.sort sorts them past harness.tiles.SORT_MAX pairs): no host sync, two
    host operations.

    `len_q_dense` is L_q in broadcast-Q mode (cu_q is None), else None."""
    nblk = max(1, triton.cdiv(max_seqlen_q, block_m))
    n_pairs = batch * nblk
    # keys, then the count at a 16-byte aligned offset (Triton specializes kernels on
    # pointer alignment: a shifting one would recompile them)
    n2 = n_pairs + n_pairs % 2
    buf = torch.empty(n2 + 2, dtype=torch.int64, device=cu_k.device)
    keys, count = buf[:n_pairs], buf[n2:n2 + 1].view(torch.int32)[:1]
    opts = sort_launch(n_pairs)
    _tile_keys_kernel[(1,)](
        cu_k if cu_q is None else cu_q, cu_k, keys, count, n_pairs, nblk,
        len_q_dense or 0, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
        BROADCAST_Q=len_q_dense is not None, **opts)
    return (keys if opts["SORT"] else torch.sort(keys).values), count, nblk


@triton.jit
def tile_coords(tile, pairs_ptr, cu_q, cu_k, L_q, H, GROUP, NBLK,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                BROADCAST_Q: tl.constexpr):
    """Tile id -> where it lives: head h, kv head, first query row m0 (in-sequence),
    packed row bases of q / k / out, the lengths, and the KV block split:
    blocks [0, n_bulk) need no mask, blocks [n_bulk, n_end) are masked.
    BROADCAST_Q: q is one dense [L_q, H, D] for every sequence (cu_q unused)."""
    pair = (tl.load(pairs_ptr + tile // H) & 0xFFFFFFFF).to(tl.int32)
    h = tile % H
    b = pair // NBLK
    m0 = (pair % NBLK) * BLOCK_M
    k_start = tl.load(cu_k + b)
    len_k = tl.load(cu_k + b + 1) - k_start
    if BROADCAST_Q:
        q_start = b * 0
        len_q = L_q + b * 0
        out_start = b * L_q
    else:
        q_start = tl.load(cu_q + b)
        len_q = tl.load(cu_q + b + 1) - q_start
        out_start = q_start
    if CAUSAL:
        diag = len_k - len_q
        kv_end = tl.minimum(tl.maximum(m0 + BLOCK_M + diag, 0), len_k)
        kv_full = tl.minimum(tl.maximum(m0 + 1 + diag, 0), len_k)  # seen by every row
    else:
        kv_end = len_k
        kv_full = len_k
    n_end = tl.cdiv(kv_end, BLOCK_N)
    n_bulk = kv_full // BLOCK_N
    return h, h // GROUP, m0, q_start, k_start, out_start, len_q, len_k, n_bulk, n_end
