"""`schedule`: the jagged tile list, built on the GPU from the offsets (no host sync).

A *pair* is (batch element b, query block m) for m < cdiv(max_seqlen_q, BLOCK_M); it is
valid when the block holds at least one query row. Valid pairs are ordered by
descending KV work (KV blocks the block visits, causal-aware), invalid ones go last,
and the count of valid pairs stays on the device. Heads are folded in by the kernel
(`tile_coords`): by default tiles walk the list in chunks of NBLK pairs, one head at a
time, so neighbouring SMs read the same head's K/V (PERF.md session 5: -12.7 % causal
time at B8 H16 8192); Config.head_chunk = 1 gives tile t = (pair t // H, head t % H).

Causal lists keep each sequence's tiles together (longest first within it, so one
(sequence, head)'s K/V serves the programs running at once; jagged.tiles.fwd_tile_order).
A persistent program p takes the p-th tile of every round of P tiles, in odd full rounds
counted from the right (boustrophedon): the program that took a round's longest tile
takes the next round's shortest, which keeps the per-sequence sawtooth of causal tiles
balanced.
"""
from __future__ import annotations

import triton
import triton.language as tl

from jagged.tiles import fwd_tiles as build_tiles  # shared by both styles

__all__ = ["build_tiles", "kv_block", "kv_steps", "tile_coords"]


@triton.jit
def tile_coords(tile, pairs_ptr, n_pairs, head_chunk, cu_q, cu_k, L_q, H, GROUP, NBLK,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                BROADCAST_Q: tl.constexpr):
    """Tile id -> where it lives: head h, kv head, first query row m0 (in-sequence),
    packed row bases of q / k / out, the lengths, and the KV block split:
    blocks [0, n_bulk) need no mask, blocks [n_bulk, n_end) are masked.
    BROADCAST_Q: q is one dense [L_q, H, D] for every sequence (cu_q unused).

    Tiles walk the list in chunks of `head_chunk` pairs, pairs fastest, then heads: 1
    gives tile t = (pair t // H, head t % H). A larger chunk puts more programs on one
    head's K/V at a time (L2 reuse) and keeps longest-first across chunks. 0 (the
    default) means NBLK, one sequence's query blocks."""
    # boustrophedon round-robin: odd full rounds run right to left, so the program that
    # took a round's longest tile takes the next round's shortest (session 16)
    P = tl.num_programs(0)
    k = tile // P
    flip = (k % 2) * tl.minimum(tl.maximum(n_pairs * H // P - k, 0), 1)  # odd and full
    tile = tile + flip * (P - 1 - 2 * (tile - k * P))
    chunk = tl.where(head_chunk == 0, NBLK, head_chunk)
    span = chunk * H
    first = tile // span * chunk
    chunk_len = tl.minimum(chunk, n_pairs - first)  # the last chunk may be short
    r = tile - tile // span * span
    h = r // chunk_len
    pair = (tl.load(pairs_ptr + first + r % chunk_len) & 0xFFFFFFFF).to(tl.int32)
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


@triton.jit
def kv_block(j, n_end, MASK_FIRST: tl.constexpr):
    """The KV block a tile's j-th step reads (the producer loads in this order).
    MASK_FIRST: the last block first (it holds the sequence end and the causal diagonal),
    then 0, 1, ...; so the peeled first step is the masked one and, without causal
    masking, every other block is bulk."""
    if MASK_FIRST:
        return (j + n_end - 1) % n_end
    else:
        return j


@triton.jit
def kv_steps(n_bulk, n_end, MASK_FIRST: tl.constexpr):
    """A tile's KV steps for n_end > 0: (first, bulk_lo, bulk_end, tail_end). The peeled
    first step reads block `first` (masked), steps [bulk_lo, bulk_end) read unmasked
    blocks, steps [max(bulk_end, bulk_lo), tail_end) masked ones; a step's block is its
    index, except under MASK_FIRST where the first block is the last one (kv_block)."""
    if MASK_FIRST:
        return n_end - 1, 0, tl.minimum(n_bulk, n_end - 1), n_end - 1
    else:
        return 0, 1, n_bulk, n_end
