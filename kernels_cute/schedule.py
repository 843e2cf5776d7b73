"""`schedule`: the jagged tile list, built on the GPU from the offsets (no host sync).

The CuteDSL twin of `kernels_tlx/schedule.py` (same pair encoding, same order):

A *pair* is (batch element b, query block m) for m < cdiv(max_seqlen_q, BLOCK_M); it
is valid when the block holds at least one query row. Valid pairs are ordered by
descending KV work (KV blocks the block visits, causal-aware), invalid ones go last,
and the count of valid pairs stays on the device. Heads are folded in by the kernel
(`tile_coords`): by default tiles walk the list in chunks of NBLK pairs, one head at a
time, so neighbouring SMs read the same head's K/V (PERF.md session 5: -12.7 % causal
time at B8 H16 8192); Config.head_chunk = 1 gives tile t = (pair t // H, head t % H).

Causal lists keep a sequence's tiles together, and the programs walk the list in TLX's
boustrophedon round-robin (odd full rounds right to left; see its schedule.py).

`build_tiles` (`jagged.tiles.fwd_tiles`, shared by both styles) makes the list with
one small Triton key kernel that also sorts it. `tile_coords` is the device-side
decode every role of the kernel calls with the same tile id, so the `load` warp and
the `compute` warpgroups agree on every tile without talking.
"""

from jagged.tiles import fwd_tiles as build_tiles  # shared by both styles

__all__ = ["build_tiles", "kv_block", "kv_steps", "tile_coords"]


def tile_coords(tile, mPairs, n_pairs, head_chunk, mCuQ, mCuK, L_q, H, group, nblk,
                BLOCK_M: int, BLOCK_N: int, CAUSAL: bool, BROADCAST_Q: bool):
    """Tile id -> where it lives (device side, traced inside a @cute.jit role):
    head h, kv head, first query row m0 (in-sequence), packed row bases of q / k / out,
    the lengths, and the KV block split: blocks [0, n_bulk) need no mask, blocks
    [n_bulk, n_end) are masked. Tiles walk the list in chunks of `head_chunk` pairs,
    pairs fastest, then heads (1: tile t = (pair t // H, head t % H); 0: nblk), as in TLX."""
    import cutlass
    import cutlass.cute as cute

    # boustrophedon round-robin: odd full rounds run right to left, as in TLX
    P = cute.arch.grid_dim()[0]
    k = tile // P
    flip = (k % 2) * cutlass.min(cutlass.max(n_pairs * H // P - k, 0), 1)  # odd and full
    tile = tile + flip * (P - 1 - 2 * (tile - k * P))
    chunk = nblk if head_chunk == 0 else head_chunk  # head_chunk is compiled in
    span = chunk * H
    first = tile // span * chunk
    chunk_len = cutlass.min(chunk, n_pairs - first)  # the last chunk may be short
    r = tile - tile // span * span
    h = r // chunk_len
    pair = cutlass.Int32(mPairs[first + r % chunk_len] & 0xFFFFFFFF)
    b = pair // nblk
    m0 = (pair % nblk) * BLOCK_M
    k_start = mCuK[b]
    len_k = mCuK[b + 1] - k_start
    if cutlass.const_expr(BROADCAST_Q):
        q_start = b * 0
        len_q = L_q + b * 0
        out_start = b * L_q
    else:
        q_start = mCuQ[b]
        len_q = mCuQ[b + 1] - q_start
        out_start = q_start
    if cutlass.const_expr(CAUSAL):
        diag = len_k - len_q
        kv_end = cutlass.min(cutlass.max(m0 + BLOCK_M + diag, 0), len_k)
        kv_full = cutlass.min(cutlass.max(m0 + 1 + diag, 0), len_k)  # seen by every row
    else:
        kv_end = len_k
        kv_full = len_k
    n_end = (kv_end + BLOCK_N - 1) // BLOCK_N
    n_bulk = kv_full // BLOCK_N
    return h, h // group, m0, q_start, k_start, out_start, len_q, len_k, n_bulk, n_end


def kv_block(j, n_end, mask_first: bool):
    """The KV block a tile's j-th step reads (the load warp loads in this order), as in
    TLX: with mask_first the last block first (the sequence end, the causal diagonal),
    then 0, 1, ..."""
    return (j + n_end - 1) % n_end if mask_first else j


def kv_steps(n_bulk, n_end, mask_first: bool):
    """A tile's KV steps for n_end > 0, as TLX's: (first, bulk_lo, bulk_end, tail_end);
    the first step reads block `first`, steps [bulk_lo, bulk_end) unmasked blocks, steps
    [max(bulk_end, bulk_lo), tail_end) masked ones (traced inside a @cute.jit role)."""
    import cutlass

    if mask_first:
        return n_end - 1, 0, cutlass.min(n_bulk, n_end - 1), n_end - 1
    return 0, 1, n_bulk, n_end
