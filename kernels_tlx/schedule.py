"""`schedule`: which tile a persistent program works on, for the forward and the backward.

Forward. The tile list is built on the GPU from the offsets (no host sync). A *pair* is
(batch element b, query block m) for m < cdiv(max_seqlen_q, BLOCK_M); it is valid when
the block holds at least one query row. Valid pairs are ordered by descending KV work
(KV blocks the block visits, causal-aware), invalid ones go last, and the count of valid
pairs stays on the device. Causal lists keep each sequence's tiles together (longest
first within it, so one (sequence, head)'s K/V serves the programs running at once;
jagged.tiles.fwd_tiles). Heads are folded in by the kernel (`tile_coords`): tiles walk
the list in chunks of NBLK pairs, pairs fastest, then heads, so neighbouring programs
read one head's K/V (chunked by head against heads fastest: llm -3.5 %, causal -12.7 %).
A persistent program p takes the p-th tile of every round of P tiles, in odd full rounds
counted from the right (boustrophedon): the program that took a round's longest tile
takes the next round's shortest. Causal packed lists are taken from a counter instead
(jagged.tiles.fwd_dynamic, tile_counter.py): the round-robin deals a sequence's sawtooth of
causal tiles unevenly wherever its period and the program count disagree.

Backward. The KV-tile list (jagged.tiles.kv_tiles) holds (sequence, KV block) tiles,
longest first; `kv_tile_coords` says where tile t lives, `tile_range` how a program walks
the list (packed: tiles x KV heads, the heads innermost or, on long non-causal calls, a
head's tiles in runs: `head_run_coords`; broadcast-Q: programs pinned to a KV
head). Packed lists are taken from a counter instead (tile_counter.py). Short keys
take key windows instead (`kv_window_coords`): whole sequences of at most BLOCK_N packed
key columns, or a block of a longer one (jagged.tiles.windows over cu_k), walked
statically.
"""
from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

from jagged.seqinfo import causal_kv_end, seq_range
from jagged.tiles import fwd_tiles as build_tiles  # shared by both styles

__all__ = ["KVTile", "KVTiles", "Tile", "build_tiles", "dq_slot_row", "head_run_coords",
           "kv_block", "kv_steps", "kv_tile_coords", "kv_window_coords", "part_steps",
           "tile_coords", "tile_range", "window_coords"]


class Tile(NamedTuple):
    """Where a forward tile lives: head h, KV head hk, first query row m0 (in-sequence),
    the packed row bases of q / k / out, the lengths, its KV blocks ([0, n_bulk) need no
    mask, [n_bulk, n_end) are masked) and its sequence b."""
    h: object
    hk: object
    m0: object
    q_start: object
    k_start: object
    out_start: object
    len_q: object
    len_k: object
    n_bulk: object
    n_end: object
    b: object
    s_last: object


@triton.jit
def _snake(tile, n_tiles):  # role: schedule
    """Boustrophedon round-robin: odd full rounds of num_programs tiles run right to left."""
    P = tl.num_programs(0)
    k = tile // P
    flip = (k % 2) * tl.minimum(tl.maximum(n_tiles // P - k, 0), 1)  # odd and full
    return tile + flip * (P - 1 - 2 * (tile - k * P))


@triton.jit
def tile_coords(tile, pairs_ptr, n_pairs, cu_q, cu_k, L_q, H, GROUP, NBLK,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                BROADCAST_Q: tl.constexpr, PACK: tl.constexpr = 1, DIRECT: tl.constexpr = False):
    """Forward tile id -> Tile. BROADCAST_Q: q is one dense [L_q, H, D] for every
    sequence (cu_q unused). PACK > 1 (jagged.tiles.gqa_pack): row r of a tile is query
    row r // PACK, of len_q // PACK, for the causal cut. DIRECT (jagged.tiles.fwd_direct):
    no list, the pairs in pair order (pairs_ptr unused, n_pairs all of them); a pair past
    its sequence's queries visits no KV block."""
    tile = _snake(tile, n_pairs * H)
    # chunks of NBLK pairs (the last may be short), pairs fastest, then heads
    span = NBLK * H
    first = tile // span * NBLK
    chunk_len = tl.minimum(NBLK, n_pairs - first)
    r = tile - tile // span * span
    h = r // chunk_len
    if DIRECT:
        pair = first + r % chunk_len
    else:
        pair = (tl.load(pairs_ptr + first + r % chunk_len) & 0xFFFFFFFF).to(tl.int32)
    b = pair // NBLK
    m0 = (pair % NBLK) * BLOCK_M
    k_start, len_k = seq_range(cu_k, b, 0, False)
    q_start, len_q = seq_range(cu_q, b, L_q, BROADCAST_Q)
    if BROADCAST_Q:
        out_start = b * L_q
    else:
        out_start = q_start
    if CAUSAL:
        kv_end = causal_kv_end((m0 + BLOCK_M - 1) // PACK + 1, len_q // PACK, len_k)
        # seen by every row of the block
        kv_full = causal_kv_end(m0 // PACK + 1, len_q // PACK, len_k)
    else:
        kv_end = len_k
        kv_full = len_k
    n_end = tl.cdiv(kv_end, BLOCK_N)
    n_bulk = kv_full // BLOCK_N
    if DIRECT:  # a pair past its queries: nothing to visit, nothing to store
        n_end = tl.where(m0 < len_q, n_end, 0)
        n_bulk = tl.minimum(n_bulk, n_end)
    return Tile(h, h // GROUP, m0, q_start, k_start, out_start, len_q, len_k, n_bulk, n_end, b,
                b)


@triton.jit
def window_coords(tile, order_ptr, n_live, win_ptr, n_win, cu_q, cu_k, H, GROUP,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Forward tile id over row windows (jagged.tiles.window_tiles: order, live count,
    each window's first / last sequence and first row) -> Tile: the window's packed rows
    from q_start (len_q <= BLOCK_M of them, up to its last sequence's end; m0 = 0), the
    keys of the sequences it spans from k_start, every block masked (n_bulk = 0: each row
    sees its own sequence's keys only)."""
    tile = _snake(tile, n_live * H)
    h = tile % H
    w = tl.load(order_ptr + tile // H)
    s_first = tl.load(win_ptr + w)
    s_last = tl.load(win_ptr + n_win + w)
    q_start = tl.load(win_ptr + 2 * n_win + w)
    q_end = tl.load(cu_q + s_last + 1)
    len_q = tl.minimum(q_end - q_start, BLOCK_M)
    k_start = tl.load(cu_k + s_first)
    kv_hi = tl.load(cu_k + s_last + 1)
    if CAUSAL:  # its last sequence's rows see up to the last real row's cut
        # (seqinfo.row_kv_range), the earlier sequences' rows all their keys
        kv_hi = tl.maximum(tl.load(cu_k + s_last),
                           tl.minimum(kv_hi, q_start + len_q + kv_hi - q_end))
    len_k = tl.maximum(kv_hi - k_start, 0)
    return Tile(h, h // GROUP, 0, q_start, k_start, q_start, len_q, len_k, 0,
                tl.cdiv(len_k, BLOCK_N), s_first, s_last)


@triton.jit
def kv_block(j, n_end, MASK_FIRST: tl.constexpr):  # role: schedule
    """The KV block a tile's j-th step reads (the producer loads in this order).
    MASK_FIRST: the last block first (it holds the sequence end and the causal diagonal),
    then 0, 1, ...; so the peeled first step is the masked one and, without causal
    masking, every other block is bulk."""
    if MASK_FIRST:
        return (j + n_end - 1) % n_end
    else:
        return j


@triton.jit
def kv_steps(n_bulk, n_end, MASK_FIRST: tl.constexpr):  # role: schedule
    """A tile's KV steps for n_end > 0: (first, bulk_lo, bulk_end, tail_end). The peeled
    first step reads block `first` (masked), steps [bulk_lo, bulk_end) read unmasked
    blocks, steps [max(bulk_end, bulk_lo), tail_end) masked ones; a step's block is its
    index, except under MASK_FIRST where the first block is the last one (kv_block)."""
    if MASK_FIRST:
        return n_end - 1, 0, tl.minimum(n_bulk, n_end - 1), n_end - 1
    else:
        return 0, 1, n_bulk, n_end


@triton.jit
def tile_range(pid, nprog, n_tiles_ptr, HKV: tl.constexpr, BROADCAST_Q: tl.constexpr,
               PARTS: tl.constexpr = 1):
    """Backward: (first tile, step, end) of program pid's static walk. Packed modes deal
    the list x HKV heads x PARTS parts (jagged.tiles.bwd_parts) round-robin; broadcast-Q
    programs are pinned to KV head pid % HKV (dQ slot: dq_slot_row) and deal the list
    only."""
    n_tiles = tl.load(n_tiles_ptr)
    if BROADCAST_Q:
        first = pid // HKV
        step = nprog // HKV
    else:
        first = pid
        step = nprog
        n_tiles = n_tiles * (HKV * PARTS)
    return first, step, n_tiles


@triton.jit
def dq_slot_row(pid, tiles, HKV: tl.constexpr, BROADCAST_Q: tl.constexpr):
    """The first dQ accumulator row of program pid's slot: broadcast-Q programs of a KV
    head share tiles.n_slots slots round-robin (jagged.tiles.dq_accumulator); 0 in the
    packed modes."""
    if BROADCAST_Q:
        return ((pid // HKV) % tiles.n_slots) * tiles.L_q
    else:
        return 0


class KVTiles(NamedTuple):
    """The backward's KV-tile list (jagged.tiles.kv_tiles: tile_b, tile_n, n_tiles), the
    offsets it indexes (cu_q, cu_k; L_q, broadcast-Q's query length) and the scheduling
    buffer (the tile counter and handoff slots, jagged.tiles.dq_accumulator). Key windows
    (kv_window_coords): tile_b the window order, n_tiles the live count, tile_n each
    window's first sequence and tile_n + L_q its last (`win`), L_q the window count."""
    tile_b: object
    tile_n: object
    n_tiles: object
    cu_q: object
    cu_k: object
    L_q: object
    sched: object
    n_slots: object = 1  # broadcast-Q: the dQ accumulator's slots (dq_slot_row)
    head_run: tl.constexpr = 1  # list entries a KV head in turn (head_run_coords)


class KVTile(NamedTuple):
    """Where a backward tile lives: sequence b, KV head hk, first key n0, the sequence's
    keys and queries, the token offsets of its k rows, q rows and dO / O / lse rows, and
    its Q blocks: n_m of BLOCK_M rows from row m_lo; s_last: the last sequence of a key
    window (b its first; b itself for a (sequence, KV block) tile)."""
    b: object
    hk: object
    n0: object
    len_k: object
    len_q: object
    k_start: object
    q_start: object
    o_start: object
    m_lo: object
    n_m: object
    s_last: object
    keys: object = 0     # key windows: the keys of sequences b..s_last


@triton.jit
def kv_tile_coords(t, pid, tiles, HKV: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr,
                   PARTS: tl.constexpr = 1):
    """Backward tile t of program pid (tiles: KVTiles) -> KVTile. Broadcast-Q: the
    program's pinned KV head, pid % HKV. PARTS > 1 (packed): t walks the list x HKV heads
    x PARTS parts; the whole tile's Q blocks here, its part's steps: part_steps."""
    if BROADCAST_Q:
        base = t
    else:
        base, hk = head_run_coords(t // PARTS, tiles, HKV)
    b = tl.load(tiles.tile_b + base)
    n0 = tl.load(tiles.tile_n + base) * BLOCK_N
    k_start, len_k = seq_range(tiles.cu_k, b, 0, False)
    k_start = k_start.to(tl.int64)  # row offsets: token * stride may pass 2^31
    q_start, len_q = seq_range(tiles.cu_q, b, tiles.L_q, BROADCAST_Q)
    if BROADCAST_Q:
        o_start = b.to(tl.int64) * tiles.L_q
    else:
        o_start = q_start.to(tl.int64)
    if CAUSAL:
        # the Q block of the first row that sees key n0: jagged.seqinfo.causal_q_start
        # without its clamp to len_q, which never binds (the last row sees every key
        # n0 < len_k); with it the compiler loses m_lo >= 0 and adds 13-30 integer
        # instructions a tile
        m_lo = tl.maximum(n0 - len_k + len_q, 0) // BLOCK_M * BLOCK_M
    else:
        m_lo = 0
    n_m = tl.maximum(tl.cdiv(len_q - m_lo, BLOCK_M), 0)
    if BROADCAST_Q:
        hk = pid % HKV
    return KVTile(b, hk, n0, len_k, len_q, k_start, q_start, o_start, m_lo, n_m, b)


@triton.jit
def head_run_coords(u, tiles, HKV: tl.constexpr):
    """Whole tile u of the packed list x HKV heads -> (list entry, KV head): runs of
    tiles.head_run entries (jagged.tiles.bwd_head_run), each run's entries for head 0,
    then head 1, ...; the last run is shorter. A run of 1: the heads innermost."""
    if tiles.head_run == 1:
        return u // HKV, u % HKV
    else:
        run: tl.constexpr = tiles.head_run
        chunk = u // (run * HKV)
        first = chunk * run
        g = tl.minimum(run, tl.load(tiles.n_tiles) - first)
        r = u - chunk * (run * HKV)
        return first + r % g, r // g


@triton.jit
def part_steps(t, steps, PARTS: tl.constexpr):
    """The steps [j0, j1) of tile t's part (t % PARTS) out of the tile's `steps` (G x n_m:
    step j is query head hk * G + j // n_m, Q block j % n_m): an even share, so a causal
    tile's parts differ by one step at most, and up to G x n_m programs can share it."""
    if PARTS > 1:
        part = t % PARTS
        return part * steps // PARTS, (part + 1) * steps // PARTS
    else:
        return 0, steps


@triton.jit
def kv_window_coords(t, tiles, HKV: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, PARTS: tl.constexpr = 1):
    """Backward tile t over key windows (tiles: KVTiles of a window list) -> KVTile: KV
    head t // PARTS % HKV of window order[t // (HKV PARTS)] (PARTS > 1: the window's steps
    shared by its parts, part_steps), its real key columns [k_start, k_start + len_k)
    (n0 = 0) and the query rows of the sequences b..s_last it spans, n_m blocks from
    q_start + m_lo. A window of whole sequences walks their rows (the owned dQ store
    writes each of them), a block of a longer one (more than BLOCK_N keys) its rows (their
    dQ reduce-added into the zeroed accumulator); causal, from the Q block of the first
    row of its first sequence that sees its first key, as kv_tile_coords' tiles (the rows
    before it see no key: the preprocess zeroes them, `_accumulated`)."""
    w = tl.load(tiles.tile_b + t // (HKV * PARTS))
    s_first = tl.load(tiles.tile_n + w)
    s_last = tl.load(tiles.tile_n + tiles.L_q + w)
    k_start = tl.load(tiles.tile_n + 2 * tiles.L_q + w)
    k_end = tl.load(tiles.cu_k + s_last + 1)
    len_k = tl.minimum(k_end - k_start, BLOCK_N)
    q_start = tl.load(tiles.cu_q + s_first)
    len_q = tl.load(tiles.cu_q + s_last + 1) - q_start
    keys = k_end - tl.load(tiles.cu_k + s_first)
    m_lo = 0
    if CAUSAL:  # s_first's first row seeing key k_start (bottom-right)
        first = (k_start - tl.load(tiles.cu_k + s_first + 1)
                 + tl.load(tiles.cu_q + s_first + 1) - q_start)
        m_lo = tl.maximum(first, 0) // BLOCK_M * BLOCK_M
    return KVTile(s_first, t // PARTS % HKV, 0, len_k, len_q, k_start.to(tl.int64), q_start,
                  q_start.to(tl.int64), m_lo, tl.cdiv(len_q - m_lo, BLOCK_M), s_last, keys)
