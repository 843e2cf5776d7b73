"""`schedule`: which tile a persistent CTA works on, for the forward and the backward.
The CuteDSL twin of `kernels_tlx/schedule.py` (same names, same order, same arithmetic).

Forward. The tile list is built on the GPU from the offsets (no host sync). A *pair* is
(batch element b, query block m) for m < cdiv(max_seqlen_q, BLOCK_M); it is valid when
the block holds at least one query row. Valid pairs are ordered by descending KV work
(KV blocks the block visits, causal-aware), invalid ones go last, and the count of valid
pairs stays on the device. Causal lists keep each sequence's tiles together
(jagged.tiles.fwd_tiles). Heads are folded in by the kernel (`tile_coords`): tiles walk
the list in chunks of NBLK pairs, pairs fastest, then heads, so neighbouring CTAs read
one head's K/V. CTA p takes the p-th tile of every round of P tiles, in odd full rounds
counted from the right (boustrophedon). Causal packed lists are taken from a counter
instead (jagged.tiles.fwd_dynamic, tile_counter.py), as TLX's.

Row windows (short sequences, `window_coords`): a tile is a window of whole sequences of
at most BLOCK_M packed query rows, or a block of a longer one (jagged.tiles.windows /
window_tiles: live windows longest first), times the heads; each row sees its own
sequence's keys, the window reads its sequences' keys.

Backward. The KV-tile list (jagged.tiles.kv_tiles) holds (sequence, KV block) tiles,
longest first; `kv_tile_coords` says where tile t lives, `tile_range` how a CTA walks the
list (packed: tiles x KV heads, the heads innermost or, on long non-causal calls, a
head's tiles in runs: `head_run_coords`; broadcast-Q: CTAs pinned to a KV head). Packed
lists are taken from a counter instead (tile_counter.py).

Key windows (short sequences, `kv_window_coords`): a tile is a window of whole sequences
of at most BLOCK_N packed key columns, or a block of a longer one (jagged.tiles.windows /
window_tiles over the key offsets: live windows longest first), times the KV heads,
dealt by the same static round-robin (`tile_range`; never from the counter, causal or
not); each column meets its own sequence's query rows, the window reads its sequences'
rows.

Every role of a kernel decodes the same tile ids with these, so the `load` warp and the
`compute` warpgroups agree on every tile without talking. The device-side helpers are
traced inside a @cute.jit role; importing this module does not load the DSL.
"""

from jagged.tiles import fwd_tiles as build_tiles  # shared by both styles

from .seqinfo import SeqlenInfo

__all__ = ["boustrophedon", "build_tiles", "head_run_coords", "kv_block", "kv_steps",
           "kv_tile_coords", "kv_window_coords", "tile_coords", "tile_range", "window_coords"]


def tile_coords(tile, mPairs, n_pairs, mCuQ, mCuK, L_q, H, group, nblk,
                BLOCK_M: int, BLOCK_N: int, CAUSAL: bool, BROADCAST_Q: bool, PACK: int = 1,
                DIRECT: bool = False):
    """Forward tile id -> where it lives: head h, kv head, first query row m0
    (in-sequence), its sequence (SeqlenInfo), the KV block split (blocks [0, n_bulk)
    need no mask, blocks [n_bulk, n_end) are masked) and its sequence b. BROADCAST_Q: q
    is one dense [L_q, H, D] for every sequence (mCuQ unused). PACK > 1
    (jagged.tiles.gqa_pack): row r of a tile is query row r // PACK, of len_q // PACK,
    for the causal cut. DIRECT (jagged.tiles.fwd_direct): no list, the pairs in pair
    order (mPairs unused, n_pairs all of them); a pair past its sequence's queries visits
    no KV block."""
    import cutlass

    tile = boustrophedon(tile, n_pairs * H)
    # chunks of nblk pairs (the last may be short), pairs fastest, then heads
    span = nblk * H
    first = tile // span * nblk
    chunk_len = cutlass.min(nblk, n_pairs - first)
    r = tile - tile // span * span
    h = r // chunk_len
    if cutlass.const_expr(DIRECT):
        pair = first + r % chunk_len
    else:
        pair = cutlass.Int32(mPairs[first + r % chunk_len] & 0xFFFFFFFF)
    b = pair // nblk
    m0 = (pair % nblk) * BLOCK_M
    seq = SeqlenInfo.of(b, mCuQ, mCuK, L_q, BROADCAST_Q)
    if cutlass.const_expr(CAUSAL):
        kv_end = seq.row_kv_end(m0 + BLOCK_M - 1, PACK)
        kv_full = seq.row_kv_end(m0, PACK)  # seen by every row
    else:
        kv_end = seq.len_k
        kv_full = seq.len_k
    n_end = (kv_end + BLOCK_N - 1) // BLOCK_N
    n_bulk = kv_full // BLOCK_N
    if cutlass.const_expr(DIRECT):  # a pair past its queries: nothing to visit or store
        n_end = cutlass.min(cutlass.max(seq.len_q - m0, 0), 1) * n_end
        n_bulk = cutlass.min(n_bulk, n_end)
    return h, h // group, m0, seq, n_bulk, n_end, b


def boustrophedon(tile, n_tiles):
    """The tile CTA slot `tile` takes when CTA p takes the p-th tile of each round of P:
    odd full rounds run right to left (P: the grid)."""
    import cutlass
    import cutlass.cute as cute

    P = cute.arch.grid_dim()[0]
    k = tile // P
    flip = (k % 2) * cutlass.min(cutlass.max(n_tiles // P - k, 0), 1)  # odd and full
    return tile + flip * (P - 1 - 2 * (tile - k * P))


def window_coords(tile, mOrder, n_live, mWin, mCuQ, mCuK, H, group, BLOCK_M: int,
                  BLOCK_N: int, CAUSAL: bool):
    """Forward tile id over row windows -> tile_coords' tuple and the window's last
    sequence: (h, kv head, m0 = 0, the window as a SeqlenInfo, n_bulk = 0 (every KV block
    masked), n_end, its first sequence, its last sequence).

    A window w is the packed query rows from mWin[2, w], at most BLOCK_M, up to its last
    sequence's end (jagged.tiles.windows: whole sequences, or a block of a longer one;
    window_tiles: mOrder the live windows longest first, n_live of them, mWin [3, n_win]
    their first and last sequence and first row). Its SeqlenInfo: q_start = out_start the first row,
    len_q the real rows, k_start its first sequence's first key, len_k up to the last key
    any of its rows sees. Tiles walk the list heads fastest, in boustrophedon rounds."""
    import cutlass

    tile = boustrophedon(tile, n_live * H)
    idx = tile // H
    h = tile - idx * H
    w = mOrder[idx]
    s_first = mWin[0, w]
    s_last = mWin[1, w]
    q_start = mWin[2, w]
    k_start = mCuK[s_first]
    rows_end = mCuQ[s_last + 1]                   # one past the last sequence's rows
    len_q = cutlass.min(rows_end - q_start, BLOCK_M)
    kv_end = mCuK[s_last + 1]
    if cutlass.const_expr(CAUSAL):
        # the last row's bottom-right cut; the earlier sequences' rows see keys up to
        # cu_k[s_last] (a last sequence cut short by the window may see none of its own)
        kv_end = cutlass.min(kv_end, cutlass.max(q_start + len_q + kv_end - rows_end,
                                                 mCuK[s_last]))
    len_k = cutlass.max(kv_end - k_start, 0)
    seq = SeqlenInfo(q_start, q_start, k_start, len_q, len_k)
    n_end = (len_k + BLOCK_N - 1) // BLOCK_N
    return h, h // group, 0, seq, 0, n_end, s_first, s_last


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


def tile_range(sched, BROADCAST_Q: bool):
    """Backward: (first tile, step, tile count, dQ slot row, pinned KV head) of this CTA's
    static walk. Packed modes deal the list x H_kv heads x sched.parts parts
    (jagged.tiles.bwd_parts) round-robin; broadcast-Q CTAs are
    pinned to KV head p % H_kv (and dQ slot (p // H_kv) % n_slots, rows slot * L_q:
    jagged.tiles.dq_accumulator) and deal the list only. sched: the kernel's `Sched`."""
    import cutlass
    import cutlass.cute as cute

    HKV = sched.HKV
    pid = cute.arch.block_idx()[0]
    nprog = cute.arch.grid_dim()[0]
    n_tiles = sched.mNTiles[0]
    first, step, slot_row, pinned = pid, nprog, pid * 0, pid * 0
    if cutlass.const_expr(BROADCAST_Q):
        first = pid // HKV
        step = nprog // HKV
        slot_row = (pid // HKV) % sched.n_slots * sched.L_q
        pinned = pid % HKV
    else:
        n_tiles = n_tiles * (HKV * sched.parts)
    return first, step, n_tiles, slot_row, pinned


def kv_tile_coords(t, pinned, sched, BLOCK_M: int, BLOCK_N: int, CAUSAL: bool,
                   BROADCAST_Q: bool):
    """Backward tile t -> (batch b, KV head hk, first key n0, its sequence (SeqlenInfo),
    first Q row m_lo, number of Q blocks n_m). Broadcast-Q: hk is the pinned head.
    sched.parts > 1 (packed): t walks the list x H_kv heads x parts; the whole tile's Q
    blocks here, its part's steps: part_steps."""
    import cutlass

    base, hk = t, pinned
    if cutlass.const_expr(not BROADCAST_Q):
        base, hk = head_run_coords(t // sched.parts, sched)
    b = sched.mTileB[base]
    n0 = sched.mTileN[base] * BLOCK_N
    seq = SeqlenInfo.of(b, sched.mCuQ, sched.mCuK, sched.L_q, BROADCAST_Q)
    m_lo = b * 0
    if cutlass.const_expr(CAUSAL):
        m_lo = seq.causal_q_start(n0) // BLOCK_M * BLOCK_M   # the block of the first row
    n_m = cutlass.max((seq.len_q - m_lo + BLOCK_M - 1) // BLOCK_M, 0)
    return b, hk, n0, seq, m_lo, n_m


def head_run_coords(u, sched):
    """Whole tile u of the packed list x H_kv heads -> (list entry, KV head): runs of
    sched.head_run entries (jagged.tiles.bwd_head_run), each run's entries for head 0,
    then head 1, ...; the last run is shorter. A run of 1: the heads innermost."""
    import cutlass

    HKV, run = sched.HKV, sched.head_run
    if cutlass.const_expr(run == 1):
        return u // HKV, u % HKV
    chunk = u // (run * HKV)
    first = chunk * run
    g = cutlass.min(run, sched.mNTiles[0] - first)
    r = u - chunk * (run * HKV)
    return first + r % g, r // g


def part_steps(t, steps, parts: int):
    """The steps [j0, j1) of tile t's part (t % parts) out of the tile's `steps` (group x
    n_m: step j is query head hk * group + j // n_m, Q block j % n_m): an even share, so a
    causal tile's parts differ by one step at most, and up to group x n_m CTAs can share
    it."""
    import cutlass

    if cutlass.const_expr(parts > 1):
        part = t % parts
        return part * steps // parts, (part + 1) * steps // parts
    return steps * 0, steps


def kv_window_coords(t, sched, BLOCK_M: int, BLOCK_N: int, CAUSAL: bool):
    """Backward tile t over key windows -> kv_tile_coords' tuple and the window's last
    sequence: (first sequence, KV head hk, n0 = 0, the window as a SeqlenInfo, first Q row
    m_lo, number of Q blocks n_m, last sequence).

    A window w is the packed key columns from sched.mTileN[2, w], at most BLOCK_N, up to
    its last sequence's end (jagged.tiles.windows over the keys: whole sequences, or a
    block of a longer one; sched.mTileB: the live windows longest first, sched.mNTiles of
    them; sched.mTileN [3, n_win]: each one's first and last sequence and first key). Its
    SeqlenInfo: k_start the first column, len_k its real columns; q_start = out_start the
    first sequence's first query row, len_q every row up to the last sequence's end. A
    window of whole sequences walks their rows (the owned dQ store writes each of them), a
    block of a longer one (more than BLOCK_N keys) its rows (their dQ reduce-added into
    the zeroed accumulator); causal, from the Q block of the first row of its first
    sequence that sees its first key, as kv_tile_coords' tiles (the rows before it see no
    key: the preprocess zeroes them, `accumulated`). Tiles walk the list x KV heads x
    sched.parts parts, parts fastest (a part's steps: part_steps)."""
    import cutlass

    HKV, parts = sched.HKV, sched.parts
    idx = t // (HKV * parts)
    hk = t // parts % HKV
    w = sched.mTileB[idx]
    s_first = sched.mTileN[0, w]
    s_last = sched.mTileN[1, w]
    k_start = sched.mTileN[2, w]
    k_end = sched.mCuK[s_last + 1]
    len_k = cutlass.min(k_end - k_start, BLOCK_N)
    q_start = sched.mCuQ[s_first]
    len_q = sched.mCuQ[s_last + 1] - q_start
    seq = SeqlenInfo(q_start, q_start, k_start, len_q, len_k)
    m_lo = w * 0
    if cutlass.const_expr(CAUSAL):  # s_first's first row seeing key k_start (bottom-right)
        first = k_start - sched.mCuK[s_first + 1] + sched.mCuQ[s_first + 1] - q_start
        m_lo = cutlass.max(first, 0) // BLOCK_M * BLOCK_M
    n_m = (len_q - m_lo + BLOCK_M - 1) // BLOCK_M
    return s_first, hk, w * 0, seq, m_lo, n_m, s_last
