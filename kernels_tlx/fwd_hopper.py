"""Jagged (varlen) flash-attention forward for Hopper (sm_90a) in Triton + TLX.

Persistent (one program per SM) and warp-specialized:

    load     (producer warpgroup)  TMA loads of Q (64 rows a consumer) and K/V into a
                                   NUM_BUFFERS_KV-deep ring, mbarrier-tracked
    compute  (block_m // 64 consumer warpgroups, taking turns to issue wgmmas)
                                   S = Q K^T, online softmax (exp2, rescale), O += P V;
                                   KV loop peeled: first block masked, a branch-free
                                   bulk, then a masked tail (sequence end / diagonal)
    store    (each consumer)       O / l and LSE with per-row bounds: never a row
                                   outside the sequence
    schedule (everyone)            tile id -> (sequence, query block, head), from a
                                   longest-first list built on the GPU (causal: by
                                   sequence), walked round by round (schedule.py);
                                   DYNAMIC (jagged.tiles.fwd_dynamic): the producer
                                   takes the next tile from a counter and hands it to
                                   the consumers (tile_counter.py)

How the jagged layout meets TMA: Q, K and V are viewed as 2-D tensors [tokens, heads*D]
and described once on the host; a tile's box starts at its sequence's first row
(cu_seqlens[b] + block offset) and column head*D. A box may run past the sequence end
into the next sequence (or past the tensor, where TMA fills zeros): extra K columns are
masked to -inf by the tail's softmax mask (so their V rows get P = 0), extra Q rows are
computed and dropped by the store's row bound. Nothing is ever written through TMA.

The kernel is launched as a programmatic dependent of its tile-list kernel (launch_pdl;
the list kernels call griddepcontrol.launch_dependents first): its launch and barrier
setup run under the list kernel, and each role waits (gdc_wait) before it touches
global memory.

Broadcast-Q with a short L_q under GQA packs the group's heads into a tile's rows (PACK,
jagged.tiles.gqa_pack): q comes in packed, the store maps row r to query row r // PACK
of head h * PACK + r % PACK, and the causal cut is the query row's.

fp8 (FP8, `forward(..., descale=)`): Q and K in e4m3, S = Q K^T an e4m3 wgmma (both
operands K-major as laid out: no transpose) with the tile's q_descale * k_descale of its
(sequence, KV head) folded into the qk scale; V dequantized to bf16 once a call
(jagged.fp8.dequantize_rows, v_descale folded in), so P V is the bf16 path. Out bf16,
staged in a bf16 buffer a consumer (the e4m3 Q slot holds half of O's bytes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx
from triton.language.extra.cuda import gdc_wait

from jagged.arch import num_sms
from jagged.fp8 import dequantize_rows
from jagged.seqinfo import row_kv_range, row_seq
from jagged.tiles import (FWD_SHORT_MEAN_K, fwd_bucket, fwd_consumers, fwd_direct,
                          fwd_dynamic, packed_query, pairs_per_sequence, window_tiles,
                          windowed)
from jagged.validate import forward_without_tiles

from jagged.launch import fast_at, tma_desc
from .schedule import build_tiles, kv_block, kv_steps, tile_coords, window_coords
from .tile_counter import fetch_tile, finish_tiles, next_tile, publish_tile

SPLIT_M = tl.constexpr(64)        # query rows of one consumer warpgroup (a wgmma's M)
ROW_SEQ_CHUNK = tl.constexpr(16)  # offsets a pass of seqinfo.row_seq compares (windows)
PINGPONG_BAR = tl.constexpr(9)    # named barriers 9, 10, (11): consumer c's issue turn
LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class Config:
    block_m: int          # query rows per tile: block_m // 64 consumer warpgroups (2, or 3
                          # at 192, FA4's D = 64 tile, consumers at 160 registers)
    block_n: int          # keys per KV block
    num_buffers_kv: int   # depth of the K/V ring
    overlap: bool         # S_j and P_{j-1} V_{j-1} in flight together (KV loops outside
                          # Triton's pipeliner: `compute`)
    mask_first: bool      # the masked last KV block first (schedule.kv_block): a
                          # non-causal tile runs one masked softmax, not two
    num_buffers_q: int = 2    # Q double buffer: the next tile's Q loads during this one
    consumer_regs: int = 240  # at most what the register file leaves (kernel_args)
    producer_regs: int = 24


# The measured defaults, keyed by (head_dim, length bucket, causal); the bucket is
# "short" (64-key blocks) for short sequences, by max or mean KV length, else "long"
# (jagged.tiles.fwd_bucket). Broadcast-Q and packed share them.
#   overlap on the long buckets: causal llm B8 H16 8192 -5..-6 % at D = 128, -3.8 % at
#     D = 64; non-causal gem 2048 / 0.5 -4.3 %, 2048 / 0.9 -5.3 %, llm -3.1 %, GQA -4.2 %,
#     D = 64 -4.9 %.
#   mask_first non-causal: gem 256..2048 / 0.5-0.9 -1.7..-5.7 %; causal llm +2.8 % (a
#     causal tile's diagonal steps are masked either way).
#   192-row tiles at D = 64, long, non-causal: llm B16 H16 2048 -7.7 %; causal they ran
#     +21.5 % (their masked steps spill at 160 registers).
CONFIGS = {
    (64, "long", False): Config(block_m=192, block_n=128, num_buffers_kv=3, overlap=True,
                                mask_first=True),
    (64, "long", True): Config(block_m=128, block_n=128, num_buffers_kv=3, overlap=True,
                               mask_first=False),
    (64, "short", False): Config(block_m=128, block_n=64, num_buffers_kv=3, overlap=False,
                                 mask_first=True),
    (64, "short", True): Config(block_m=128, block_n=64, num_buffers_kv=3, overlap=False,
                                mask_first=False),
    (128, "long", False): Config(block_m=128, block_n=128, num_buffers_kv=2, overlap=True,
                                 mask_first=True),
    (128, "long", True): Config(block_m=128, block_n=128, num_buffers_kv=2, overlap=True,
                                mask_first=False),
    (128, "short", False): Config(block_m=128, block_n=64, num_buffers_kv=3, overlap=False,
                                  mask_first=True),
    (128, "short", True): Config(block_m=128, block_n=64, num_buffers_kv=3, overlap=False,
                                 mask_first=False),
}


def pick_config(head_dim: int, max_seqlen_k: int, causal: bool,
                mean_k: float | None = None) -> Config:
    """The measured default for a call (mean_k: total keys / batch, None if unknown)."""
    return CONFIGS[(head_dim, fwd_bucket(max_seqlen_k, mean_k, causal), bool(causal))]


# Row windows (short queries, jagged.tiles.windowed): whole sequences of at most 128 packed
# rows a tile (jagged.tiles.windows); every KV block is masked (each row to its own sequence's keys), so
# no masked block goes first and nothing overlaps across steps.
WINDOW_CONFIG = Config(block_m=128, block_n=64, num_buffers_kv=3, overlap=False,
                       mask_first=False)


def takes_windows(n_rows: int, n_keys: int, batch: int, max_q: int,
                  broadcast_q: bool) -> bool:
    """Whether a forward runs over row windows: packed queries, short on average, over
    short keys (mean at most FWD_SHORT_MEAN_K). Over long keys a window's rows would
    skip most of the keys it reads, as many as a per-sequence tile's empty rows compute,
    and every step would be masked. fp8 too: each row takes its own sequence's descales
    (_row_bounds)."""
    return (n_keys <= FWD_SHORT_MEAN_K * batch
            and windowed(n_rows, batch, max_q, WINDOW_CONFIG.block_m, broadcast_q))


# ----------------------------------------------------------------------------- bundles
class Descs(NamedTuple):
    """TMA descriptors of Q, K and V (2-D views [tokens, heads * D])."""
    q: object
    k: object
    v: object


class Smem(NamedTuple):
    """Shared memory: Q slots [buffer * NUM_CONSUMERS + consumer] and the K / V rings."""
    q: object
    k: object
    v: object


class Scales(NamedTuple):
    """fp8: the descales fp32 [B, H_kv] the qk scale of a tile takes (None otherwise)."""
    q: object
    k: object


class Bars(NamedTuple):
    """mbarriers, a full / empty pair per Q slot and per K and V ring stage; DYNAMIC: the
    tile handoff's two slots (producer -> consumers)."""
    q_full: object
    q_empty: object
    k_full: object
    k_empty: object
    v_full: object
    v_empty: object
    tile_full: object
    tile_empty: object


class Tiles(NamedTuple):
    """The forward tile list (schedule.build_tiles: pairs, the count of valid ones) and
    what `tile_coords` reads with it: offsets, broadcast-Q's query length L_q, heads, the
    GQA group and the query blocks per sequence. Row windows (window_coords): the window
    order, the live count, each window's sequences `win` and the window count in NBLK.
    DYNAMIC: the scheduling buffer after the count (jagged.tiles.fwd_sched)."""
    pairs: object
    n_pairs: object
    cu_q: object
    cu_k: object
    L_q: object
    H: object
    GROUP: object
    NBLK: object
    win: object
    sched: object = None


class Out(NamedTuple):
    """O [n_out, H, D] and LSE [H, n_out] (H: every query head, packed ones included)."""
    o: object
    lse: object
    H: object
    n_out: object


# ----------------------------------------------------------------------------- helpers
@triton.jit
def _buf_phase(count, NUM_BUFFERS: tl.constexpr):
    """Ring slot and mbarrier parity of the count-th use of a NUM_BUFFERS-deep ring."""
    return count % NUM_BUFFERS, (count // NUM_BUFFERS) & 1


@triton.jit
def _issue_qk(q_buf, k_bufs, k_fulls, kv_cnt, cid: tl.constexpr, NUM_CONSUMERS: tl.constexpr,
              NUM_BUFFERS_KV: tl.constexpr, HAND_OVER: tl.constexpr = True):
    """Wait for K, then issue S = Q K^T; the consumers take turns issuing (0, 1, ..).
    HAND_OVER: pass the turn right after S (else the caller passes it, after its P V)."""
    kb, kph = _buf_phase(kv_cnt, NUM_BUFFERS_KV)
    tlx.barrier_wait(k_fulls[kb], kph)
    tlx.named_barrier_wait(PINGPONG_BAR + cid, 256)
    qk = tlx.async_dot(q_buf, tlx.local_trans(k_bufs[kb]))
    if HAND_OVER:
        _hand_over(cid, NUM_CONSUMERS)
    return qk


@triton.jit
def _hand_over(cid: tl.constexpr, NUM_CONSUMERS: tl.constexpr):  # role: compute
    """Let the next consumer issue its wgmmas (each turn barrier joins two warpgroups)."""
    tlx.named_barrier_arrive(PINGPONG_BAR + (cid + 1) % NUM_CONSUMERS, 256)


@triton.jit
def _coords(t, tiles, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
            BROADCAST_Q: tl.constexpr, WINDOWS: tl.constexpr,
            PACK: tl.constexpr = 1, DIRECT: tl.constexpr = False):  # role: schedule
    """Tile id t -> Tile, from the (sequence, block) list (DIRECT: the pairs in order,
    no list) or the row-window list."""
    if WINDOWS:
        return window_coords(t, tiles.pairs, tiles.n_pairs, tiles.win, tiles.NBLK, tiles.cu_q,
                             tiles.cu_k, tiles.H, tiles.GROUP, BLOCK_M, BLOCK_N, CAUSAL)
    else:
        return tile_coords(t, tiles.pairs, tiles.n_pairs, tiles.cu_q, tiles.cu_k, tiles.L_q,
                           tiles.H, tiles.GROUP, tiles.NBLK, BLOCK_M, BLOCK_N, CAUSAL,
                           BROADCAST_Q, PACK, DIRECT)


@triton.jit
def _row_bounds(tiles, tile, qk_scale, scales, cid: tl.constexpr, CAUSAL: tl.constexpr,
                FP8: tl.constexpr):  # role: compute
    """A window consumer's rows: (lo, width, scale), the keys [lo, lo + width) of the
    tile's K/V blocks (from tile.k_start) each row sees, its own sequence's
    (seqinfo.row_seq, row_kv_range), and its qk scale (fp8: with q_descale * k_descale
    of its own sequence, as _tile_scale's); rows past the window's sequences, and causal
    rows before their sequence's first key, see none (width 0)."""
    rows = tile.q_start + cid * SPLIT_M + tl.arange(0, SPLIT_M)
    seq = row_seq(tiles.cu_q, tile.b, tile.s_last, rows, ROW_SEQ_CHUNK)
    lo, hi = row_kv_range(tiles.cu_q, tiles.cu_k, seq, rows, CAUSAL)
    width = tl.where(rows < tile.q_start + tile.len_q, tl.maximum(hi - lo, 0), 0)
    if FP8:
        scale = _tile_scale(qk_scale, scales, tiles, seq, tile.hk, FP8)
    else:
        scale = tl.full([SPLIT_M], qk_scale, tl.float32)
    return lo - tile.k_start, width, scale


@triton.jit
def _softmax(qk, m_i, l_i, qk_scale, rows, n0, len_q, len_k,
             BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
             WINDOWS: tl.constexpr = False):
    """Online softmax of one KV block in the log2 domain -> (p fp32, alpha, m, l).
    MASKED adds the sequence-end and causal (bottom-right) mask and the guard for
    rows that have seen no key yet (m = -inf); WINDOWS: `rows` is each row's key range
    and qk scale (lo, width, scale) (_row_bounds), the mask keeps the range and the
    scale replaces qk_scale. The mask applies to the raw scores
    and the scale enters with the row max (qk_scale > 0), so each score takes one FFMA.
    alpha's exp2 comes last: issued first (so the O rescale runs under the others) it
    measured causal llm +5.8 %."""
    if MASKED:
        if WINDOWS:  # each row its own sequence's keys: one unsigned compare
            cols = n0 + tl.arange(0, BLOCK_N)[None, :] - rows[0][:, None]
            keep = cols.to(tl.uint32) < rows[1][:, None].to(tl.uint32)
            row_scale = rows[2]
            score_scale = rows[2][:, None]
        else:
            # keys [n0, n0 + limit) of this block are visible to a row
            if CAUSAL:
                # jagged.seqinfo.causal_kv_end(rows + 1) without its clamp at 0 (a
                # negative limit keeps no key either): two max a masked step fewer
                limit = tl.minimum(rows + (len_k - len_q + 1), len_k) - n0
            else:
                limit = len_k - n0 + rows * 0
            keep = tl.arange(0, BLOCK_N)[None, :] < limit[:, None]
            row_scale = qk_scale
            score_scale = qk_scale
        s = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * row_scale)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s * score_scale - m_use[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_use = m_new
        p = tl.math.exp2(qk * qk_scale - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new


@triton.jit
def _kv_step(q_buf, smem, bars, kv_cnt, p, acc, m_i, l_i, qk_scale, rows, n0, tile,
             cid: tl.constexpr, NUM_CONSUMERS: tl.constexpr, BLOCK_N: tl.constexpr,
             NUM_BUFFERS_KV: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
             OVERLAP: tl.constexpr, WINDOWS: tl.constexpr):
    """One KV block after the first: S_j = Q K_j^T overlaps O += P_{j-1} V_{j-1}."""
    qk = _issue_qk(q_buf, smem.k, bars.k_full, kv_cnt, cid, NUM_CONSUMERS, NUM_BUFFERS_KV,
                   not OVERLAP)
    vb, vph = _buf_phase(kv_cnt - 1, NUM_BUFFERS_KV)
    tlx.barrier_wait(bars.v_full[vb], vph)
    acc = tlx.async_dot(p, smem.v[vb], acc)
    if OVERLAP:  # both wgmmas of this consumer issue before the next's (QK0 PV0 QK1 PV1)
        _hand_over(cid, NUM_CONSUMERS)
    qk = tlx.async_dot_wait(1, qk)
    kb = kv_cnt % NUM_BUFFERS_KV
    tlx.barrier_arrive(bars.k_empty[kb], 1)
    p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, qk_scale, rows, n0, tile.len_q, tile.len_k,
                                  BLOCK_N, MASKED, CAUSAL, WINDOWS)
    acc = tlx.async_dot_wait(0, acc)
    tlx.barrier_arrive(bars.v_empty[vb], 1)
    # P_j goes into the registers P_{j-1} V_{j-1} reads: convert after its wait, or
    # ptxas hoists that wait above the softmax to make room
    p = _pack_p(p, smem.v.dtype)
    acc = acc * alpha[:, None]
    return p, acc, m_i, l_i


@triton.jit
def _pack_p(p, dtype: tl.constexpr):  # role: compute
    """P fp32 -> the P V operand, two neighbours (one register of the wgmma A fragment)
    per cvt.rn.{bf16,f16}x2. Triton's per-element cvt leaves ptxas packing the halves with
    PRMT: 32 a bulk step, 64 a masked one (SASS, D = 128 causal: bulk 489 -> 471, masked
    722 -> 667); 192-row tiles are spill-free only this way. Per element: llm D = 64
    2048 +6.6 % (192 rows), +2.9 % causal."""
    if dtype == tl.bfloat16:
        return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [p],
                                         dtype=tl.bfloat16, is_pure=True, pack=2)
    else:
        return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [p],
                                         dtype=tl.float16, is_pure=True, pack=2)


# ----------------------------------------------------------------------------- roles
@triton.jit
def load(descs, smem, bars, tiles, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
         BLOCK_N: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr,
         CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, MASK_FIRST: tl.constexpr,
         WINDOWS: tl.constexpr, PACK: tl.constexpr, DIRECT: tl.constexpr,
         DYNAMIC: tl.constexpr):
    """Producer: for each of this program's tiles, Q (a block per consumer) then its K/V
    blocks; takes (DYNAMIC) and publishes the next tile once they are issued."""
    NUM_CONSUMERS: tl.constexpr = BLOCK_M // SPLIT_M
    Q_BYTES: tl.constexpr = SPLIT_M * HEAD_DIM * tlx.size_of(tlx.dtype_of(descs.q))
    K_BYTES: tl.constexpr = BLOCK_N * HEAD_DIM * tlx.size_of(tlx.dtype_of(descs.k))
    V_BYTES: tl.constexpr = BLOCK_N * HEAD_DIM * tlx.size_of(tlx.dtype_of(descs.v))
    kv_cnt = 0
    i = 0
    n_tiles = tiles.n_pairs * tiles.H
    t = tl.program_id(0)
    if DYNAMIC:
        publish_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, 0)
    while t < n_tiles:
        tile = _coords(t, tiles, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q, WINDOWS, PACK, DIRECT)
        qb, qph = _buf_phase(i, NUM_BUFFERS_Q)
        for c in tl.static_range(NUM_CONSUMERS):
            slot = qb * NUM_CONSUMERS + c
            tlx.barrier_wait(bars.q_empty[slot], qph ^ 1)
            tlx.barrier_expect_bytes(bars.q_full[slot], Q_BYTES)
            tlx.async_descriptor_load(descs.q, smem.q[slot],
                                      [tile.q_start + tile.m0 + c * SPLIT_M, tile.h * HEAD_DIM],
                                      bars.q_full[slot])
        for j in range(0, tile.n_end):
            kb, kph = _buf_phase(kv_cnt, NUM_BUFFERS_KV)
            row = tile.k_start + kv_block(j, tile.n_end, MASK_FIRST) * BLOCK_N
            tlx.barrier_wait(bars.k_empty[kb], kph ^ 1)
            tlx.barrier_expect_bytes(bars.k_full[kb], K_BYTES)
            tlx.async_descriptor_load(descs.k, smem.k[kb], [row, tile.hk * HEAD_DIM],
                                      bars.k_full[kb])
            tlx.barrier_wait(bars.v_empty[kb], kph ^ 1)
            tlx.barrier_expect_bytes(bars.v_full[kb], V_BYTES)
            tlx.async_descriptor_load(descs.v, smem.v[kb], [row, tile.hk * HEAD_DIM],
                                      bars.v_full[kb])
            kv_cnt += 1
        i += 1
        t = next_tile(t, tl.num_programs(0), tiles.sched, DYNAMIC)
        if DYNAMIC:
            publish_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, i)
    if DYNAMIC:
        finish_tiles(tiles.sched)


@triton.jit
def compute(q_buf, smem, bars, kv_cnt, qk_scale, rows, tile, cid: tl.constexpr,
            NUM_CONSUMERS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
            NUM_BUFFERS_KV: tl.constexpr, CAUSAL: tl.constexpr, OVERLAP: tl.constexpr,
            MASK_FIRST: tl.constexpr, WINDOWS: tl.constexpr):
    """One consumer's share of a tile: its 64 query rows against blocks [0, n_end)
    (`rows`: their in-sequence indices, or under WINDOWS their key ranges).
    Returns the unnormalized O, the running max m (log2 domain) and sum l.

    Triton 3.8's pipeliner (its wgmma pass runs on loops at num_stages=1 too) puts a
    wait-0 right after each dot of the KV loops, so S_j = Q K_j^T finishes before
    O += P_{j-1} V_{j-1} is issued and that finishes before the softmax: _kv_step's own
    wait(1) overlap does not happen (TTGIR). OVERLAP puts the loops at num_stages=0,
    which that pass skips, and hands the issue turn to the other consumer after P V
    rather than after S (handed over after S, the tensor pipe ran S0 S1 PV0 PV1 and
    gem-jagged was 5-18 % slower). ptxas places the P V wait before the exp2s (SASS), so
    the softmax overlaps the other consumer's wgmmas, not this one's."""
    STAGES: tl.constexpr = 0 if OVERLAP else 1  # 0: the pipeliner leaves the loop alone
    first, bulk_lo, bulk_end, tail_end = kv_steps(tile.n_bulk, tile.n_end, MASK_FIRST)
    m_i = tl.full([SPLIT_M], float("-inf"), tl.float32)
    l_i = tl.zeros([SPLIT_M], tl.float32)
    acc = tl.zeros([SPLIT_M, HEAD_DIM], tl.float32)
    if tile.n_end > 0:
        # first block (masked: it may be the only one, cut by the diagonal or the end)
        qk = _issue_qk(q_buf, smem.k, bars.k_full, kv_cnt, cid, NUM_CONSUMERS, NUM_BUFFERS_KV)
        qk = tlx.async_dot_wait(0, qk)
        tlx.barrier_arrive(bars.k_empty[kv_cnt % NUM_BUFFERS_KV], 1)
        p, alpha, m_i, l_i = _softmax(qk, m_i, l_i, qk_scale, rows, first * BLOCK_N,
                                      tile.len_q, tile.len_k, BLOCK_N, True, CAUSAL, WINDOWS)
        p = _pack_p(p, smem.v.dtype)
        kv_cnt += 1
        # bulk: every row sees every key, no mask, no branch (windows: none)
        if not WINDOWS:
            for j in tl.range(bulk_lo, bulk_end, num_stages=STAGES):
                p, acc, m_i, l_i = _kv_step(q_buf, smem, bars, kv_cnt, p, acc, m_i, l_i,
                                            qk_scale, rows, j * BLOCK_N, tile, cid,
                                            NUM_CONSUMERS, BLOCK_N, NUM_BUFFERS_KV, False,
                                            CAUSAL, OVERLAP, WINDOWS)
                kv_cnt += 1
        # tail: the sequence end and the causal diagonal. Non-causal under MASK_FIRST the
        # first step took the one masked block: no tail, and no code for it
        if CAUSAL or not MASK_FIRST:
            for j in tl.range(tl.maximum(bulk_end, bulk_lo), tail_end, num_stages=STAGES):
                p, acc, m_i, l_i = _kv_step(q_buf, smem, bars, kv_cnt, p, acc, m_i, l_i,
                                            qk_scale, rows, j * BLOCK_N, tile, cid,
                                            NUM_CONSUMERS, BLOCK_N, NUM_BUFFERS_KV, True,
                                            CAUSAL, OVERLAP, WINDOWS)
                kv_cnt += 1
        # the last block's P V
        vb, vph = _buf_phase(kv_cnt - 1, NUM_BUFFERS_KV)
        tlx.barrier_wait(bars.v_full[vb], vph)
        acc = tlx.async_dot(p, smem.v[vb], acc)
        acc = tlx.async_dot_wait(0, acc)
        tlx.barrier_arrive(bars.v_empty[vb], 1)
    return acc, m_i, l_i, kv_cnt


@triton.jit
def causal_rows(rows, tile, PACK: tl.constexpr):  # role: compute
    """The rows the causal mask aligns bottom right: a packed tile's row r
    (jagged.tiles.gqa_pack) is query row r // PACK, of len_q // PACK."""
    if PACK > 1:
        return rows // PACK + (tile.len_q - tile.len_q // PACK)
    else:
        return rows


@triton.jit
def out_rows_heads(tile, rows, PACK: tl.constexpr):  # role: store
    """Rows of O (int64) and heads of tile rows `rows`: a packed tile's row r is query
    row r // PACK of head h * PACK + r % PACK (jagged.tiles.gqa_pack)."""
    packed = tile.out_start + rows  # out_start is a multiple of PACK
    return (packed // PACK).to(tl.int64), (tile.h * PACK + packed % PACK).to(tl.int64)


@triton.jit
def store(acc, m_i, l_i, o_buf, out, tile, row0, HEAD_DIM: tl.constexpr, PACK: tl.constexpr):
    """O = acc / l and LSE (natural log) for rows < len_q only; rows with no key get
    O = 0 and LSE = -inf. O goes registers -> smem (the consumer's spent Q slot) ->
    coalesced rows, so the row bound costs one predicate per 16-byte vector. PACK > 1
    (jagged.tiles.gqa_pack): tile row r is query row r // PACK of head h * PACK + r % PACK."""
    empty = l_i == 0.0
    l_use = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_use)) * LN2)
    o = acc / l_use[:, None]  # one reciprocal a row instead: null (-0.4..+1.5 %)
    tlx.local_store(o_buf, o.to(o_buf.dtype))
    o = tlx.local_load(o_buf)
    rows = row0 + tl.arange(0, SPLIT_M)
    out_rows, heads = out_rows_heads(tile, rows, PACK)
    cols = tl.arange(0, HEAD_DIM)
    o_ptrs = out.o + (out_rows * out.H + heads)[:, None] * HEAD_DIM + cols[None, :]
    tl.store(o_ptrs, o, mask=(rows < tile.len_q)[:, None])
    tl.store(out.lse + heads * out.n_out + out_rows, lse, mask=rows < tile.len_q)


@triton.jit
def _count(count_ptr, DIRECT: tl.constexpr):  # role: schedule
    """The pairs to walk: the list's count of valid ones, or (DIRECT) every pair, an int."""
    if DIRECT:
        return count_ptr
    else:
        return tl.load(count_ptr)


@triton.jit
def _sched(count_ptr, DYNAMIC: tl.constexpr):  # role: schedule
    """DYNAMIC: the scheduling buffer after the pair count (jagged.tiles.fwd_sched), per
    task: a pointer made before the task split would be carried into every task."""
    if DYNAMIC:
        return count_ptr + 1
    else:
        return None


@triton.jit
def _tile_scale(qk_scale, scales, tiles, b, hk, FP8: tl.constexpr):  # role: compute
    """The qk scale of a tile of sequence b (or of rows of sequences b, a block) and KV
    head hk: fp8 folds in their q_descale * k_descale (fp32 [B, H_kv])."""
    if FP8:
        at = b * (tiles.H // tiles.GROUP) + hk
        return qk_scale * tl.load(scales.q + at) * tl.load(scales.k + at)
    else:
        return qk_scale


# ----------------------------------------------------------------------------- kernel
# runtime ints are not specialized (== 1, % 16): one compile per (D, dtype, causal, config);
# count_ptr is the pair count itself in a DIRECT build
@triton.jit(do_not_specialize=["count_ptr", "L_q", "H", "GROUP", "NBLK", "n_out"])
def fwd_kernel(desc_q, desc_k, desc_v, out_ptr, lse_ptr, cu_q, cu_k, pairs_ptr, count_ptr,
               L_q, H, GROUP, NBLK, n_out, qk_scale, q_descale, k_descale, win_ptr,
               FP8: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr,
               NUM_BUFFERS_KV: tl.constexpr, CAUSAL: tl.constexpr,
               BROADCAST_Q: tl.constexpr, CONSUMER_REGS: tl.constexpr,
               PRODUCER_REGS: tl.constexpr, OVERLAP: tl.constexpr, MASK_FIRST: tl.constexpr,
               WINDOWS: tl.constexpr, PACK: tl.constexpr, DIRECT: tl.constexpr,
               DYNAMIC: tl.constexpr):
    NUM_CONSUMERS: tl.constexpr = BLOCK_M // SPLIT_M
    dtype: tl.constexpr = tlx.dtype_of(desc_q)
    smem = Smem(q=tlx.local_alloc((SPLIT_M, HEAD_DIM), dtype, NUM_BUFFERS_Q * NUM_CONSUMERS),
                k=tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, NUM_BUFFERS_KV),
                v=tlx.local_alloc((BLOCK_N, HEAD_DIM), tlx.dtype_of(desc_v), NUM_BUFFERS_KV))
    if FP8:  # O in bf16 needs twice an e4m3 Q slot: a staging buffer a consumer
        o_stage = tlx.local_alloc((SPLIT_M, HEAD_DIM), tl.bfloat16, NUM_CONSUMERS)
    NQ: tl.constexpr = NUM_BUFFERS_Q * NUM_CONSUMERS  # a Q slot per (buffer, consumer)
    bars = Bars(q_full=tlx.alloc_barriers(num_barriers=NQ, arrive_count=1),
                q_empty=tlx.alloc_barriers(num_barriers=NQ, arrive_count=1),
                k_full=tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1),
                # every consumer thread arrives on its own, after its own wgmma wait
                k_empty=tlx.alloc_warp_barrier(num_barriers=NUM_BUFFERS_KV,
                                               num_warps=4 * NUM_CONSUMERS),
                v_full=tlx.alloc_barriers(num_barriers=NUM_BUFFERS_KV, arrive_count=1),
                v_empty=tlx.alloc_warp_barrier(num_barriers=NUM_BUFFERS_KV,
                                               num_warps=4 * NUM_CONSUMERS),
                tile_full=tlx.alloc_barriers(num_barriers=2, arrive_count=1),
                tile_empty=tlx.alloc_barriers(num_barriers=2, arrive_count=NUM_CONSUMERS))
    tl.static_assert(not DYNAMIC or not (WINDOWS or DIRECT), "the counter walks a list")
    out = Out(out_ptr, lse_ptr, H * PACK, n_out)  # H: the tiles' heads (KV heads if packed)

    # Launched as a programmatic dependent of the kernel ahead (jagged.tiles PDL): the
    # tile-list kernel, whose list each role reads only after its gdc_wait. DIRECT
    # (jagged.tiles.fwd_direct): no list, the kernel ahead is the offsets check, and only
    # the stores wait for it; the reads before it touch the offsets and TMA boxes, which
    # the hardware bounds, so the tiles run under the check
    with tlx.async_tasks():
        with tlx.async_task("default", registers=PRODUCER_REGS):
            if not DIRECT:
                gdc_wait()
            tiles = Tiles(pairs_ptr, _count(count_ptr, DIRECT), cu_q, cu_k, L_q, H, GROUP,
                          NBLK, win_ptr, _sched(count_ptr, DYNAMIC))
            load(Descs(desc_q, desc_k, desc_v), smem, bars, tiles, HEAD_DIM, BLOCK_M, BLOCK_N,
                 NUM_BUFFERS_Q, NUM_BUFFERS_KV, CAUSAL, BROADCAST_Q, MASK_FIRST, WINDOWS, PACK,
                 DIRECT, DYNAMIC)
        with tlx.async_task(num_warps=4, registers=CONSUMER_REGS, replicate=NUM_CONSUMERS):
            cid: tl.constexpr = tlx.async_task_replica_id()
            if not DIRECT:
                gdc_wait()
            tiles = Tiles(pairs_ptr, _count(count_ptr, DIRECT), cu_q, cu_k, L_q, H, GROUP,
                          NBLK, win_ptr, _sched(count_ptr, DYNAMIC))
            if cid == NUM_CONSUMERS - 1:  # let consumer 0 issue first
                _hand_over(cid, NUM_CONSUMERS)
            kv_cnt = 0
            i = 0
            n_tiles = tiles.n_pairs * H
            t = tl.program_id(0)
            if DYNAMIC:
                t = fetch_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, 0, 0, DYNAMIC)
            while t < n_tiles:
                tile = _coords(t, tiles, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q, WINDOWS, PACK,
                               DIRECT)
                scales = Scales(q_descale, k_descale)
                if WINDOWS:  # each row its own sequence's keys and (fp8) descales
                    rows = _row_bounds(tiles, tile, qk_scale, scales, cid, CAUSAL, FP8)
                    tile_scale = qk_scale
                else:
                    rows = causal_rows(tile.m0 + cid * SPLIT_M + tl.arange(0, SPLIT_M), tile,
                                       PACK)
                    tile_scale = _tile_scale(qk_scale, scales, tiles, tile.b, tile.hk, FP8)
                qb, qph = _buf_phase(i, NUM_BUFFERS_Q)
                slot = qb * NUM_CONSUMERS + cid
                tlx.barrier_wait(bars.q_full[slot], qph)
                acc, m_i, l_i, kv_cnt = compute(
                    smem.q[slot], smem, bars, kv_cnt, tile_scale, rows, tile, cid,
                    NUM_CONSUMERS, HEAD_DIM, BLOCK_N, NUM_BUFFERS_KV, CAUSAL, OVERLAP,
                    MASK_FIRST, WINDOWS)
                if FP8:
                    o_buf = o_stage[cid]
                else:
                    o_buf = smem.q[slot]
                if DIRECT:  # no write before the offsets check has passed
                    gdc_wait()
                store(acc, m_i, l_i, o_buf, out, tile, tile.m0 + cid * SPLIT_M, HEAD_DIM, PACK)
                tlx.fence("async_shared")  # our generic smem writes before the next TMA write
                tlx.barrier_arrive(bars.q_empty[slot], 1)
                i += 1
                t = fetch_tile(tiles.sched, bars.tile_full, bars.tile_empty, t,
                               tl.num_programs(0), i, DYNAMIC)


# ----------------------------------------------------------------------------- host
def kernel_args(cfg: Config, head_dim: int, causal: bool, broadcast_q: bool,
                fp8: bool = False, windows: bool = False, pack: int = 1,
                direct: bool = False, dynamic: bool = False) -> dict:
    """The constexpr arguments of `fwd_kernel` (shared with compile checks); the GQA
    group is a runtime argument, so it costs no extra compile. windows: over row windows
    (with WINDOW_CONFIG); pack: query heads a tile's rows hold (jagged.tiles.gqa_pack);
    direct: no tile list (jagged.tiles.fwd_direct); dynamic: tiles from the counter
    (jagged.tiles.fwd_dynamic)."""
    consumer_regs = min(cfg.consumer_regs, fwd_consumers(cfg.block_m, cfg.producer_regs)[1])
    return dict(FP8=fp8, BROADCAST_Q=broadcast_q, HEAD_DIM=head_dim, BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n, NUM_BUFFERS_Q=cfg.num_buffers_q,
                NUM_BUFFERS_KV=cfg.num_buffers_kv,
                CAUSAL=causal, CONSUMER_REGS=consumer_regs, PRODUCER_REGS=cfg.producer_regs,
                OVERLAP=cfg.overlap, MASK_FIRST=cfg.mask_first, WINDOWS=windows, PACK=pack,
                DIRECT=direct, DYNAMIC=dynamic)


def forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q, descale=None):
    """(out [Nq, H, D], lse [H, Nq] fp32); the `fwd` of jagged.api.make_jagged_attention.
    descale: None (16-bit q, k, v) or (q_descale, k_descale, v_descale), fp32 [B, H_kv]
    each, for e4m3 q, k, v (out bf16)."""
    Nq_in, H, D = q.shape
    Nk, Hkv, _ = k.shape
    batch = cu_k.shape[0] - 1
    n_out = batch * Nq_in if broadcast_q else Nq_in
    fp8 = descale is not None
    out = torch.empty(n_out, H, D, dtype=torch.bfloat16 if fp8 else q.dtype, device=q.device)
    lse = torch.empty(H, n_out, dtype=torch.float32, device=q.device)
    check = (Nq_in, Nk, max_q, max_k)  # the offsets check, run by the tile-list kernel
    if forward_without_tiles(out, lse, cu_q, cu_k, check):
        return out, lse
    windows = takes_windows(Nq_in, Nk, batch, max_q, broadcast_q)
    cfg = WINDOW_CONFIG if windows else pick_config(D, max_k, causal, Nk / batch)
    # the tiles' query rows, heads and GQA group: a packing tile holds `pack` heads
    q, pack = packed_query(q, broadcast_q, Hkv, cfg.block_m)
    Nq_t, H_t = q.shape[0], q.shape[1]
    L_t = Nq_t if broadcast_q else 0
    nblk = pairs_per_sequence(L_t if broadcast_q else max_q, cfg.block_m)
    direct = fwd_direct(batch * nblk * H_t, num_sms(q.device), windows or fp8)
    dynamic = fwd_dynamic(bool(causal), bool(broadcast_q), windows, direct)
    if windows:  # NBLK carries the window count
        pairs, count, win = window_tiles(cu_q, cu_k, Nq_in, max_q, cfg.block_m,
                                         cfg.block_n, check)
        nblk, n_tiles = win.shape[1], win.shape[1] * H
    else:  # direct: no list (pairs None), the kernel waits for the check before it stores
        pairs, count, nblk = build_tiles(cu_q, cu_k, batch, L_t if broadcast_q else max_q,
                                         L_t if broadcast_q else None, cfg.block_m,
                                         cfg.block_n, causal, check, direct, dynamic)
        win, n_tiles = None, batch * nblk * H_t
    if fp8:  # after the check: the V pass reads the key offsets
        q_descale, k_descale, v_descale = descale
        v = dequantize_rows(v, v_descale, cu_k)
    else:
        q_descale = k_descale = None
    desc_q = tma_desc(q, (Nq_t, H_t * D), (H_t * D, 1), (SPLIT_M.value, D))
    desc_k = tma_desc(k, (Nk, Hkv * D), (Hkv * D, 1), (cfg.block_n, D))
    desc_v = tma_desc(v, (Nk, Hkv * D), (Hkv * D, 1), (cfg.block_n, D))
    grid = (min(num_sms(q.device), n_tiles),)
    # every argument's specialization follows from the shapes, dtypes, flags and bounds
    # (jagged.launch.fast_at): the launch skips the plan key
    site = (Nq_in, H, D, Nk, Hkv, q.dtype, k.dtype, int(max_q), int(max_k), bool(causal),
            bool(broadcast_q), cu_q is None, batch)
    fast_at(fwd_kernel, site)[grid](
        desc_q, desc_k, desc_v, out, lse, cu_k if cu_q is None else cu_q, cu_k, pairs, count,
        L_t, H_t, H_t // Hkv, nblk, n_out, scale * LOG2E, q_descale, k_descale, win,
        **kernel_args(cfg, D, causal, broadcast_q, fp8, windows, pack, direct, dynamic),
        num_warps=4, num_stages=1, launch_pdl=True)
    return out, lse


def signature(cfg: Config, head_dim: int, dtype: str = "bf16", windows: bool = False) -> dict:
    """Triton types of `fwd_kernel`'s runtime arguments (for compile-only checks). dtype
    "fp8e4nv": e4m3 q and k, bf16 v and out, the descales fp32 pointers (with
    kernel_args(..., fp8=True)); windows: the row-window list (int32) and `win`."""
    fp8 = dtype == "fp8e4nv"
    io = "bf16" if fp8 else dtype
    return {"desc_q": f"tensordesc<{dtype}[{SPLIT_M.value},{head_dim}]>",
            "desc_k": f"tensordesc<{dtype}[{cfg.block_n},{head_dim}]>",
            "desc_v": f"tensordesc<{io}[{cfg.block_n},{head_dim}]>",
            "out_ptr": f"*{io}", "lse_ptr": "*fp32", "cu_q": "*i32", "cu_k": "*i32",
            "pairs_ptr": "*i32" if windows else "*i64", "count_ptr": "*i32", "L_q": "i32", "H": "i32", "GROUP": "i32",
            "NBLK": "i32", "n_out": "i32", "qk_scale": "fp32",
            "q_descale": "*fp32" if fp8 else "constexpr",
            "k_descale": "*fp32" if fp8 else "constexpr",
            "win_ptr": "*i32" if windows else "constexpr"}
