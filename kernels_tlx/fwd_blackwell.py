"""Jagged (varlen) flash-attention forward for Blackwell (sm_100a) in Triton + TLX.

Compiled for sm_100a, not run: no B200 has run it (tests/test_fwd_blackwell_tlx.py
compiles every default variant on the CPU; its `-m gpu` test checks it against the
oracle on a B200).

Persistent (one program per SM) and warp-specialized. A tile is 256 query rows of one
(sequence, head), two groups of 128 (one tcgen05 M = 128 MMA each) that ping-pong: the
tensor core multiplies one group while the other's softmax runs. Per group g, in tensor
memory (TMEM, 512 columns): S_g = Q_g K^T (BLOCK_N fp32 columns), P_g (the dtype, in the
lower half of S_g's columns), O_g (HEAD_DIM fp32 columns): 2 * (BLOCK_N + HEAD_DIM) <=
512. P aliases S through `reuse=` with equal logical sizes (no storage_alias_spec). The
row statistics alpha, l and m go through shared memory (a float a row and group).

    load        (1 warp)   TMA: Q_0, Q_1 per tile (NUM_BUFFERS_Q deep), K_j and V_j into
                           one ring of NUM_BUFFERS_KV slots (K and V alternate)
    mma         (1 warp)   tcgen05: S_0 = Q_0 K_j^T, P_1 V_{j-1}, S_1 = Q_1 K_j^T,
                           P_0 V_j, ...; completions signalled by tcgen05.commit
    softmax     (2 x 4 warps, one a group; a thread a row) S_g from TMEM in two passes
                           of S_SLICE columns: the row max, then alpha to smem, then
                           exp2 -> P back to TMEM; KV loop peeled: the first (masked)
                           step, a branch-free bulk, a masked tail
    correction  (4 warps)  O_g *= alpha in TMEM between steps; the epilogue: O / l and
                           LSE (natural log) stored with per-row bounds
    schedule    (everyone) the core's tile list (jagged.tiles.fwd_tiles: longest first,
                           causal by sequence), walked by schedule.tile_coords; DYNAMIC:
                           the load task takes the next tile from a global counter and
                           hands it to the others (tile_counter.py), else the static
                           boustrophedon round-robin

Early TMEM release (Config.p_slices): P is published in p_slices parts, each on its own
barrier, so the P V of part 0 runs on the tensor core while the softmax still
exponentiates part 1; alpha is published before any P (after the max pass), so the
correction's rescale of O overlaps the exponentials too.

Registers: Triton 3.8's OptimizePartitionWarps pass (run for sm_100, not sm_90)
overwrites the tasks' requested registers (`registers=`, Config.softmax_regs) with a fixed
guess: 88 for a task with tensors, 24 without; the default task (correction) gets the
rest (256). The two-pass softmax holds one S slice of S_SLICE columns, not S, for that
budget; 31-101 spill instructions remain (tests/test_fwd_blackwell_tlx.py records them).

Cluster Launch Control would replace the counter: the hardware hands a finished CTA the
next tile id (no zeroed counter per launch, no global-memory handoff ring) and cancels
launches that no SM needs, so the grid need not be sized to the SM count; these pins do
not register `ttng.async_clc_try_cancel`, so the counter stands in.

Ordering invariants (barrier names below; "after" is issue order in the mma warp, and a
tcgen05.commit tracks every tcgen05 op the warp issued before it):
  * S_g of step j + 1 is issued after P_g V_j, which waited every p_full part (the
    softmax has read all of S_g(j)) and o_ready (the correction has read alpha_g(j)); so
    S_g, P_g and alpha_g are single-buffered. P chunk c is written after S columns
    [0, (c + 1) * S_SLICE) were read, and covers only [c, c + 1) * S_SLICE / 2.
  * s_full_g(j + 1) commits after P_g V_j completes, so the correction, which reads O_g
    only after alpha_full_g(j + 1), sees O_g with P_g V_j added.
  * P_g V_0 of a tile waits o_ready_g(0), which the correction arrives after it has read
    O_g of its previous tile (the epilogue); S_g(0) waits s_free_g, arrived once the
    correction has read l and m.
How the jagged layout meets TMA is as in fwd_hopper: a box may run past a sequence's end
(extra K columns are masked to -inf by the softmax, extra Q rows computed and dropped by
the store's row bound) or past the tensor (TMA fills zeros). Nothing is written by TMA.

The kernel is launched as a programmatic dependent of its tile-list kernel, as
fwd_hopper's: each task waits (gdc_wait) before it first reads global memory.

One wave without a list (DIRECT, jagged.tiles.fwd_direct), as fwd_hopper's: when every
(sequence, query block, head) tile has a program of its own, program p takes tile p
alone (the pairs in order: no counter, no handoff; a pair past its sequence's queries
visits no KV block and stores nothing), and the kernel ahead is the offsets check. Its
reads (offsets, TMA boxes, which the hardware bounds) run under the check; only the
correction's stores wait for it.

Broadcast-Q with a short L_q under GQA packs the group's heads into a tile's rows (PACK,
jagged.tiles.gqa_pack), as fwd_hopper does: q comes in packed, the correction's stores
map row r to query row r // PACK of head h * PACK + r % PACK (`out_rows_heads`), and the
causal cut is the query row's.
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
from jagged.tiles import fwd_bucket, fwd_direct, packed_query, pairs_per_sequence
from jagged.validate import forward_without_tiles

from jagged.launch import fast, tma_desc
from .fwd_hopper import Descs, causal_rows, out_rows_heads
from .schedule import build_tiles, kv_block, kv_steps, tile_coords
from .tile_counter import fetch_tile, next_tile, publish_tile

GROUP_M = tl.constexpr(128)   # query rows of a group (a tcgen05 MMA's M, a thread a row)
GROUPS = tl.constexpr(2)      # groups a tile (ping-pong)
BLOCK_M = tl.constexpr(GROUP_M.value * GROUPS.value)  # query rows a tile
READERS = tl.constexpr(4)     # tasks that read the tile handoff: mma, 2 softmax, correction
LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)
DTYPES = (torch.bfloat16, torch.float16)  # the element types these kernels are built for


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class Config:
    block_n: int          # keys per KV block (S's columns)
    num_buffers_kv: int   # slots of the K / V ring (K and V alternate: 6 = three of each)
    num_buffers_q: int    # Q buffers a group (2: the next tile's Q loads during this one)
    p_slices: int         # early TMEM release: P published in 1 or 2 column slices
    mask_first: bool      # the masked last KV block first (schedule.kv_block)
    dynamic: bool = True  # tiles from the counter (CLC's stand-in), else round-robin
    softmax_regs: int = 192  # requested; Triton 3.8 gives 88 on sm_100 (see above)
    small_regs: int = 24  # the load and mma warps
    o_slice: int = 32     # O columns a correction / epilogue step holds in registers
    s_slice: int = 16     # S columns a softmax pass holds in registers


# Defaults, keyed by (head_dim, length bucket, causal) as fwd_hopper's (jagged.tiles
# .fwd_bucket); not measured (no B200 here). Shared memory: Q 2 * 128 * D, K/V ring
# num_buffers_kv * block_n * D elements (2 bytes): D = 128, one Q buffer, five slots:
# 224 KB; D = 64, two Q buffers, six slots (three K, three V): 160 KB.
CONFIGS = {
    (64, "long", False): Config(block_n=128, num_buffers_kv=6, num_buffers_q=2, p_slices=2,
                                mask_first=True),
    (64, "long", True): Config(block_n=128, num_buffers_kv=6, num_buffers_q=2, p_slices=2,
                               mask_first=False),
    (64, "short", False): Config(block_n=64, num_buffers_kv=6, num_buffers_q=2, p_slices=1,
                                 mask_first=True),
    (64, "short", True): Config(block_n=64, num_buffers_kv=6, num_buffers_q=2, p_slices=1,
                                mask_first=False),
    (128, "long", False): Config(block_n=128, num_buffers_kv=4, num_buffers_q=1, p_slices=2,
                                 mask_first=True),
    (128, "long", True): Config(block_n=128, num_buffers_kv=4, num_buffers_q=1, p_slices=2,
                                mask_first=False),
    (128, "short", False): Config(block_n=64, num_buffers_kv=6, num_buffers_q=1, p_slices=1,
                                  mask_first=True),
    (128, "short", True): Config(block_n=64, num_buffers_kv=6, num_buffers_q=1, p_slices=1,
                                 mask_first=False),
}


def pick_config(head_dim: int, max_seqlen_k: int, causal: bool,
                mean_k: float | None = None) -> Config:
    """The default for a call (mean_k: total keys / batch, None if unknown)."""
    return CONFIGS[(head_dim, fwd_bucket(max_seqlen_k, mean_k, causal), bool(causal))]


# ----------------------------------------------------------------------------- bundles
class Smem(NamedTuple):
    """Q slots [buffer * GROUPS + group], the K / V ring, and a float a row of each group
    for alpha (per step), l and m (per tile)."""
    q: object
    kv: object
    alpha: object
    l: object
    m: object


class Tmem(NamedTuple):
    """S_g [g] (fp32); P in the lower half of S_g's columns, as the softmax writes it
    (chunks of S_SLICE keys, p [g * 2 * NS + c]) and as the MMA reads it (parts of
    BLOCK_N / P_SLICES keys, pv [g * 2 * P_SLICES + i]); alpha / l / m in S_g's last
    O_g [g]."""
    s: object
    p: object
    pv: object
    o: object


class Bars(NamedTuple):
    """mbarriers, named by what their completion says (producer -> consumer):
    q_full / q_empty [slot]   load -> mma (TMA bytes) / mma -> load (commit)
    kv_full / kv_empty [slot] load -> mma (TMA bytes) / mma -> load (commit)
    s_full [g]                mma -> softmax_g (commit after S_g = Q_g K^T)
    p_full [g * p_slices + i] softmax_g -> mma (P slice i in TMEM)
    alpha_full [g]            softmax_g -> correction (alpha in smem)
    o_ready [g]               correction -> mma (O_g rescaled, alpha read)
    o_full [g]                mma -> correction (commit after a tile's last P_g V)
    stats_full [g]            softmax_g -> correction (l, m in smem)
    s_free [g]                correction -> mma (l, m read: the next tile may start)
    tile_full / tile_empty    load -> readers (DYNAMIC tile handoff, tile_counter.py)
    sink                      completions nobody waits for (an MMA with no barrier
                              would be issued synchronously)"""
    q_full: object
    q_empty: object
    kv_full: object
    kv_empty: object
    s_full: object
    p_full: object
    alpha_full: object
    o_ready: object
    o_full: object
    stats_full: object
    s_free: object
    tile_full: object
    tile_empty: object
    sink: object


class Tiles(NamedTuple):
    """The tile list (schedule.build_tiles: pairs, a pointer to the count of valid ones),
    what `tile_coords` reads with it, and the scheduling buffer (DYNAMIC: [0] the counter,
    zeroed per launch; [4 + 2p, 4 + 2p + 2) program p's handoff slots)."""
    pairs: object
    count: object
    cu_q: object
    cu_k: object
    L_q: object
    H: object
    GROUP: object
    NBLK: object
    sched: object


class Out(NamedTuple):
    """O [n_out, H, D] and LSE [H, n_out]."""
    o: object
    lse: object
    H: object
    n_out: object


# ----------------------------------------------------------------------------- schedule
@triton.jit
def _buf_phase(count, NUM_BUFFERS: tl.constexpr):
    """Ring slot and mbarrier parity of the count-th use of a NUM_BUFFERS-deep ring."""
    return count % NUM_BUFFERS, (count // NUM_BUFFERS) & 1


@triton.jit
def _tile(t, tiles, n_pairs, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
          BROADCAST_Q: tl.constexpr, PACK: tl.constexpr, DIRECT: tl.constexpr):
    return tile_coords(t, tiles.pairs, n_pairs, tiles.cu_q, tiles.cu_k, tiles.L_q,
                       tiles.H, tiles.GROUP, tiles.NBLK, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q,
                       PACK, DIRECT)


@triton.jit
def _pairs(tiles, DIRECT: tl.constexpr):  # role: schedule
    """A task's pair count (per task: a value read before the split would spill), read
    once the list kernel ahead has finished. DIRECT: every pair, from the grid (a program
    a tile; an argument read in each task spilled more), and no wait: the kernel ahead is
    the offsets check, which only the stores wait for."""
    if DIRECT:
        return tl.num_programs(0) // tiles.H
    else:
        gdc_wait()  # a dependent launch: the list kernel's writes first (module docstring)
        return tl.load(tiles.count)


@triton.jit
def _fetch(tiles, bars, t, i, DYNAMIC: tl.constexpr):  # role: schedule
    """A reading task's i-th tile after tile t (its first: i = 0 after the program id
    minus the program count): the load task's handoff (DYNAMIC), else the round-robin's."""
    return fetch_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, tl.num_programs(0),
                      i, DYNAMIC)


# ----------------------------------------------------------------------------- roles
@triton.jit
def load(descs, smem, bars, tiles, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
         NUM_BUFFERS_Q: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, CAUSAL: tl.constexpr,
         BROADCAST_Q: tl.constexpr, MASK_FIRST: tl.constexpr, DYNAMIC: tl.constexpr,
         PACK: tl.constexpr, DIRECT: tl.constexpr):
    """Producer: per tile with keys, Q_0 and Q_1, then K_j, V_j for its blocks in
    kv_block order; takes (DYNAMIC) and publishes the next tile after issuing them."""
    ELT: tl.constexpr = tlx.size_of(tlx.dtype_of(descs.q))
    n_pairs = _pairs(tiles, DIRECT)
    total = n_pairs * tiles.H
    t = tl.program_id(0)
    if DYNAMIC:
        publish_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, 0)
    i = 0
    tw = 0      # tiles with keys so far (Q ring uses)
    kv_cnt = 0  # K / V ring uses
    while t < total:
        tile = _tile(t, tiles, n_pairs, BLOCK_N, CAUSAL, BROADCAST_Q, PACK, DIRECT)
        if tile.n_end > 0:
            qb, qph = _buf_phase(tw, NUM_BUFFERS_Q)
            for g in tl.static_range(GROUPS):
                slot = qb * GROUPS + g
                tlx.barrier_wait(bars.q_empty[slot], qph ^ 1)
                tlx.barrier_expect_bytes(bars.q_full[slot], ELT * GROUP_M * HEAD_DIM)
                tlx.async_descriptor_load(
                    descs.q, smem.q[slot],
                    [tile.q_start + tile.m0 + g * GROUP_M, tile.h * HEAD_DIM], bars.q_full[slot])
            for j in range(0, tile.n_end):
                row = tile.k_start + kv_block(j, tile.n_end, MASK_FIRST) * BLOCK_N
                kb, kph = _buf_phase(kv_cnt, NUM_BUFFERS_KV)
                tlx.barrier_wait(bars.kv_empty[kb], kph ^ 1)
                tlx.barrier_expect_bytes(bars.kv_full[kb], ELT * BLOCK_N * HEAD_DIM)
                tlx.async_descriptor_load(descs.k, smem.kv[kb], [row, tile.hk * HEAD_DIM],
                                          bars.kv_full[kb])
                vb, vph = _buf_phase(kv_cnt + 1, NUM_BUFFERS_KV)
                tlx.barrier_wait(bars.kv_empty[vb], vph ^ 1)
                tlx.barrier_expect_bytes(bars.kv_full[vb], ELT * BLOCK_N * HEAD_DIM)
                tlx.async_descriptor_load(descs.v, smem.kv[vb], [row, tile.hk * HEAD_DIM],
                                          bars.kv_full[vb])
                kv_cnt += 2
            tw += 1
        i += 1
        t = next_tile(t, tl.num_programs(0), tiles.sched, DYNAMIC)
        if DYNAMIC:
            publish_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, i)


@triton.jit
def _qk(smem, tmem, bars, q_slot, kb, g: tl.constexpr, RELEASE_K: tl.constexpr):
    """S_g = Q_g K^T; RELEASE_K (the last group): K's slot is free when it completes."""
    k_t = tlx.local_trans(smem.kv[kb])
    if RELEASE_K:
        tlx.async_dot(smem.q[q_slot], k_t, tmem.s[g], use_acc=False,
                      mBarriers=[bars.s_full[g], bars.kv_empty[kb]])
    else:
        tlx.async_dot(smem.q[q_slot], k_t, tmem.s[g], use_acc=False,
                      mBarriers=[bars.s_full[g]])


@triton.jit
def _pv(smem, tmem, bars, vb, step, use_acc, g: tl.constexpr, BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr, P_SLICES: tl.constexpr, RELEASE_V: tl.constexpr):
    """O_g (+)= P_g V, slice by slice as the softmax publishes P; RELEASE_V (the last
    group): V's slot is free when it completes."""
    ph = step & 1
    tlx.barrier_wait(bars.o_ready[g], ph)
    for i in tl.static_range(P_SLICES):
        tlx.barrier_wait(bars.p_full[g * P_SLICES + i], ph)
        v_i = tlx.local_slice(smem.kv[vb], [BLOCK_N * i // P_SLICES, 0],
                              [BLOCK_N // P_SLICES, HEAD_DIM])
        p_i = tmem.pv[g * 2 * P_SLICES + i]
        if i == 0:
            acc = use_acc
        else:
            acc = True
        if RELEASE_V and i == P_SLICES - 1:
            tlx.async_dot(p_i, v_i, tmem.o[g], use_acc=acc, mBarriers=[bars.kv_empty[vb]])
        else:
            tlx.async_dot(p_i, v_i, tmem.o[g], use_acc=acc, mBarriers=[bars.sink[0]])


@triton.jit
def mma(smem, tmem, bars, tiles, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
        NUM_BUFFERS_Q: tl.constexpr, NUM_BUFFERS_KV: tl.constexpr, CAUSAL: tl.constexpr,
        BROADCAST_Q: tl.constexpr, P_SLICES: tl.constexpr, DYNAMIC: tl.constexpr,
        PACK: tl.constexpr, DIRECT: tl.constexpr):
    """The tensor core's issue order per tile of n steps:
    S_0(0) S_1(0) PV_0(0) | S_0(j) PV_1(j-1) S_1(j) PV_0(j) for j in 1..n-1 | PV_1(n-1):
    one group's MMAs run while the other group's softmax does."""
    n_pairs = _pairs(tiles, DIRECT)
    total = n_pairs * tiles.H
    t = _fetch(tiles, bars, tl.program_id(0) - tl.num_programs(0), 0, DYNAMIC)
    i = 0
    tw = 0
    kv_cnt = 0
    step = 0    # KV steps so far (the phase of the per-step barriers)
    while t < total:
        tile = _tile(t, tiles, n_pairs, BLOCK_N, CAUSAL, BROADCAST_Q, PACK, DIRECT)
        n = tile.n_end
        if n > 0:
            qb, qph = _buf_phase(tw, NUM_BUFFERS_Q)
            kb, kph = _buf_phase(kv_cnt, NUM_BUFFERS_KV)
            tlx.barrier_wait(bars.kv_full[kb], kph)
            for g in tl.static_range(GROUPS):
                tlx.barrier_wait(bars.q_full[qb * GROUPS + g], qph)
                tlx.barrier_wait(bars.s_free[g], (tw & 1) ^ 1)
                _qk(smem, tmem, bars, qb * GROUPS + g, kb, g, g == GROUPS - 1)
            vb, vph = _buf_phase(kv_cnt + 1, NUM_BUFFERS_KV)
            tlx.barrier_wait(bars.kv_full[vb], vph)
            _pv(smem, tmem, bars, vb, step, False, 0, BLOCK_N, HEAD_DIM, P_SLICES, False)
            acc1 = False
            for j in range(1, n):
                vb_prev = vb
                kb, kph = _buf_phase(kv_cnt + 2 * j, NUM_BUFFERS_KV)
                vb, vph = _buf_phase(kv_cnt + 2 * j + 1, NUM_BUFFERS_KV)
                tlx.barrier_wait(bars.kv_full[kb], kph)
                _qk(smem, tmem, bars, qb * GROUPS, kb, 0, False)
                _pv(smem, tmem, bars, vb_prev, step + j - 1, acc1, 1, BLOCK_N, HEAD_DIM,
                    P_SLICES, True)
                acc1 = True
                _qk(smem, tmem, bars, qb * GROUPS + 1, kb, 1, True)
                tlx.barrier_wait(bars.kv_full[vb], vph)
                _pv(smem, tmem, bars, vb, step + j, True, 0, BLOCK_N, HEAD_DIM, P_SLICES,
                    False)
            # every QK of the tile is issued: Q is free once they complete
            for g in tl.static_range(GROUPS):
                tlx.tcgen05_commit(bars.q_empty[qb * GROUPS + g])
            tlx.tcgen05_commit(bars.o_full[0])
            _pv(smem, tmem, bars, vb, step + n - 1, acc1, 1, BLOCK_N, HEAD_DIM, P_SLICES,
                True)
            tlx.tcgen05_commit(bars.o_full[1])
            kv_cnt += 2 * n
            step += n
            tw += 1
        i += 1
        t = _fetch(tiles, bars, t, i, DYNAMIC)


@triton.jit
def _mask(s, c0, limit, MASKED: tl.constexpr):
    """Keys [n0 + c0, n0 + c0 + width) of a row past its limit -> -inf (MASKED)."""
    if MASKED:
        keep = (c0 + tl.arange(0, s.shape[1]))[None, :] < limit[:, None]
        s = tl.where(keep, s, float("-inf"))
    return s


@triton.jit
def _softmax_step(smem, tmem, bars, m_i, l_i, qk_scale, rows, n0, step, tile, g,
                  BLOCK_N: tl.constexpr, S_SLICE: tl.constexpr, P_SLICES: tl.constexpr,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """One KV block of group g in two passes over S_g in TMEM, S_SLICE columns at a time
    (the register budget Triton gives this task holds one slice, not S): the row max,
    alpha (to smem, so the correction rescales O during the second pass), then exp2 -> P
    (into the columns of slices already read: P chunk c covers S columns
    [c * S_SLICE / 2, (c + 1) * S_SLICE / 2)), published in P_SLICES parts. Log2
    domain. MASKED adds the sequence-end and causal (bottom-right) mask and the guard for
    rows that have seen no key (m = -inf)."""
    NS: tl.constexpr = BLOCK_N // S_SLICE
    PER_P: tl.constexpr = NS // P_SLICES
    tlx.barrier_wait(bars.s_full[g], step & 1)
    if MASKED:
        # keys [n0, n0 + limit) of this block are visible to a row
        if CAUSAL:
            limit = tl.minimum(rows + (tile.len_k - tile.len_q + 1), tile.len_k) - n0
        else:
            limit = tile.len_k - n0 + rows * 0
    else:
        limit = rows
    m_new = m_i
    for c in tl.static_range(NS):
        s = tlx.local_load(tlx.subslice(tmem.s[g], c * S_SLICE, S_SLICE))
        m_new = tl.maximum(m_new, tl.max(_mask(s, c * S_SLICE, limit, MASKED), 1) * qk_scale)
    if MASKED:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    alpha = tl.math.exp2(m_i - m_use)
    tlx.local_store(smem.alpha[g], alpha)
    tlx.barrier_arrive(bars.alpha_full[g], 1)
    l_new = tl.zeros_like(l_i)
    for c in tl.static_range(NS):
        s = tlx.local_load(tlx.subslice(tmem.s[g], c * S_SLICE, S_SLICE))
        s = _mask(s, c * S_SLICE, limit, MASKED)
        p = tl.math.exp2(s * qk_scale - m_use[:, None])
        l_new += tl.sum(p, 1)
        tlx.local_store(tmem.p[g * 2 * NS + c], p.to(tmem.p.dtype))
        if c % PER_P == PER_P - 1:
            tlx.barrier_arrive(bars.p_full[g * P_SLICES + c // PER_P], 1)
    return m_new, l_i * alpha + l_new


@triton.jit
def softmax(smem, tmem, bars, tiles, qk_scale, g, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
            BROADCAST_Q: tl.constexpr, MASK_FIRST: tl.constexpr, S_SLICE: tl.constexpr,
            P_SLICES: tl.constexpr, DYNAMIC: tl.constexpr, PACK: tl.constexpr,
            DIRECT: tl.constexpr):
    """Group g's 128 rows of each tile: the peeled first (masked) step, the branch-free
    bulk, the masked tail (none without causal masking under MASK_FIRST); then l and m
    to TMEM for the epilogue."""
    n_pairs = _pairs(tiles, DIRECT)
    total = n_pairs * tiles.H
    t = _fetch(tiles, bars, tl.program_id(0) - tl.num_programs(0), 0, DYNAMIC)
    i = 0
    tw = 0
    step = 0
    while t < total:
        tile = _tile(t, tiles, n_pairs, BLOCK_N, CAUSAL, BROADCAST_Q, PACK, DIRECT)
        if tile.n_end > 0:
            rows = causal_rows(tile.m0 + g * GROUP_M + tl.arange(0, GROUP_M), tile, PACK)
            first, bulk_lo, bulk_end, tail_end = kv_steps(tile.n_bulk, tile.n_end, MASK_FIRST)
            m_i = tl.full([GROUP_M], float("-inf"), tl.float32)
            l_i = tl.zeros([GROUP_M], tl.float32)
            m_i, l_i = _softmax_step(smem, tmem, bars, m_i, l_i, qk_scale, rows, first * BLOCK_N,
                                     step, tile, g, BLOCK_N, S_SLICE, P_SLICES, True, CAUSAL)
            step += 1
            for j in range(bulk_lo, bulk_end):
                m_i, l_i = _softmax_step(smem, tmem, bars, m_i, l_i, qk_scale, rows, j * BLOCK_N,
                                         step, tile, g, BLOCK_N, S_SLICE, P_SLICES, False, CAUSAL)
                step += 1
            if CAUSAL or not MASK_FIRST:
                for j in range(tl.maximum(bulk_end, bulk_lo), tail_end):
                    m_i, l_i = _softmax_step(smem, tmem, bars, m_i, l_i, qk_scale, rows,
                                             j * BLOCK_N, step, tile, g, BLOCK_N, S_SLICE, P_SLICES,
                                             True, CAUSAL)
                    step += 1
            # no S_g is pending (s_free holds the next tile's): l, m take its columns
            tlx.local_store(smem.l[g], l_i)
            tlx.local_store(smem.m[g], m_i)
            tlx.barrier_arrive(bars.stats_full[g], 1)
            tw += 1
        i += 1
        t = _fetch(tiles, bars, t, i, DYNAMIC)


@triton.jit
def correction(smem, tmem, bars, tiles, out, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, DYNAMIC: tl.constexpr,
               O_SLICE: tl.constexpr, PACK: tl.constexpr, DIRECT: tl.constexpr):
    """O_g *= alpha between steps (not at a tile's first: P V overwrites O then), and the
    epilogue: O = O / l and LSE for rows < len_q; rows with no key (and tiles with no
    keys at all, which touch no TMEM) get O = 0 and LSE = -inf. DIRECT: the epilogue
    waits for the offsets check ahead (no write before it has passed)."""
    n_pairs = _pairs(tiles, DIRECT)
    total = n_pairs * tiles.H
    t = _fetch(tiles, bars, tl.program_id(0) - tl.num_programs(0), 0, DYNAMIC)
    i = 0
    tw = 0
    step = 0
    while t < total:
        tile = _tile(t, tiles, n_pairs, BLOCK_N, CAUSAL, BROADCAST_Q, PACK, DIRECT)
        n = tile.n_end
        if n > 0:
            for g in tl.static_range(GROUPS):
                tlx.barrier_wait(bars.alpha_full[g], step & 1)
                tlx.barrier_arrive(bars.o_ready[g], 1)
            for j in range(1, n):
                for g in tl.static_range(GROUPS):
                    tlx.barrier_wait(bars.alpha_full[g], (step + j) & 1)
                    alpha = tlx.local_load(smem.alpha[g])[:, None]
                    for c in tl.static_range(HEAD_DIM // O_SLICE):
                        o_c = tlx.subslice(tmem.o[g], c * O_SLICE, O_SLICE)
                        tlx.local_store(o_c, tlx.local_load(o_c) * alpha)
                    tlx.barrier_arrive(bars.o_ready[g], 1)
            if DIRECT:  # after the rescales: the mma's P V never waits for the check
                gdc_wait()
            for g in tl.static_range(GROUPS):
                tlx.barrier_wait(bars.stats_full[g], tw & 1)
                l_i = tlx.local_load(smem.l[g])
                m_i = tlx.local_load(smem.m[g])
                tlx.barrier_arrive(bars.s_free[g], 1)
                empty = l_i == 0.0
                l_use = tl.where(empty, 1.0, l_i)
                inv_l = 1.0 / l_use
                lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_use)) * LN2)
                rows = tile.m0 + g * GROUP_M + tl.arange(0, GROUP_M)
                out_rows, heads = out_rows_heads(tile, rows, PACK)
                tl.store(out.lse + heads * out.n_out + out_rows, lse, mask=rows < tile.len_q)
                rows2 = tile.m0 + g * GROUP_M + tl.arange(0, GROUP_M)[:, None]
                out_rows2, heads2 = out_rows_heads(tile, rows2, PACK)
                tlx.barrier_wait(bars.o_full[g], tw & 1)
                for c in tl.static_range(HEAD_DIM // O_SLICE):
                    o_c = tlx.local_load(tlx.subslice(tmem.o[g], c * O_SLICE, O_SLICE))
                    cols = c * O_SLICE + tl.arange(0, O_SLICE)[None, :]
                    ptrs = out.o + (out_rows2 * out.H + heads2) * HEAD_DIM + cols
                    tl.store(ptrs, (o_c * inv_l[:, None]).to(out.o.dtype.element_ty),
                             mask=rows2 < tile.len_q)
            step += n
            tw += 1
        else:
            if DIRECT:
                gdc_wait()
            for g in tl.static_range(GROUPS):
                rows = tile.m0 + g * GROUP_M + tl.arange(0, GROUP_M)
                out_rows, heads = out_rows_heads(tile, rows, PACK)
                tl.store(out.lse + heads * out.n_out + out_rows,
                         tl.full([GROUP_M], float("-inf"), tl.float32),
                         mask=rows < tile.len_q)
                rows2 = tile.m0 + g * GROUP_M + tl.arange(0, GROUP_M)[:, None]
                out_rows2, heads2 = out_rows_heads(tile, rows2, PACK)
                for c in tl.static_range(HEAD_DIM // O_SLICE):
                    cols = c * O_SLICE + tl.arange(0, O_SLICE)[None, :]
                    ptrs = out.o + (out_rows2 * out.H + heads2) * HEAD_DIM + cols
                    tl.store(ptrs, tl.zeros([GROUP_M, O_SLICE], out.o.dtype.element_ty),
                             mask=rows2 < tile.len_q)
        i += 1
        t = _fetch(tiles, bars, t, i, DYNAMIC)


# ----------------------------------------------------------------------------- kernel
# runtime ints are not specialized (== 1, % 16): one compile per (D, dtype, causal, config)
@triton.jit(do_not_specialize=["L_q", "H", "GROUP", "NBLK", "n_out"])
def fwd_kernel(desc_q, desc_k, desc_v, out_ptr, lse_ptr, cu_q, cu_k, pairs_ptr, count_ptr,
               sched_ptr, L_q, H, GROUP, NBLK, n_out, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, NUM_BUFFERS_Q: tl.constexpr,
               NUM_BUFFERS_KV: tl.constexpr, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr,
               MASK_FIRST: tl.constexpr, P_SLICES: tl.constexpr, DYNAMIC: tl.constexpr,
               SOFTMAX_REGS: tl.constexpr, SMALL_REGS: tl.constexpr, O_SLICE: tl.constexpr,
               S_SLICE: tl.constexpr, PACK: tl.constexpr, DIRECT: tl.constexpr):
    dtype: tl.constexpr = tlx.dtype_of(desc_q)
    smem = Smem(q=tlx.local_alloc((GROUP_M, HEAD_DIM), dtype, NUM_BUFFERS_Q * GROUPS),
                kv=tlx.local_alloc((BLOCK_N, HEAD_DIM), dtype, NUM_BUFFERS_KV),
                alpha=tlx.local_alloc((GROUP_M,), tl.float32, GROUPS),
                l=tlx.local_alloc((GROUP_M,), tl.float32, GROUPS),
                m=tlx.local_alloc((GROUP_M,), tl.float32, GROUPS))
    s_tiles = tlx.local_alloc((GROUP_M, BLOCK_N), tl.float32, GROUPS, tlx.storage_kind.tmem)
    # P aliases S (views of equal logical size, as `reuse` requires)
    tmem = Tmem(s=s_tiles,
                p=tlx.local_alloc((GROUP_M, S_SLICE), dtype, GROUPS * 2 * (BLOCK_N // S_SLICE),
                                  tlx.storage_kind.tmem, reuse=s_tiles),
                pv=tlx.local_alloc((GROUP_M, BLOCK_N // P_SLICES), dtype,
                                   GROUPS * 2 * P_SLICES, tlx.storage_kind.tmem, reuse=s_tiles),
                o=tlx.local_alloc((GROUP_M, HEAD_DIM), tl.float32, GROUPS,
                                  tlx.storage_kind.tmem))
    NQ: tl.constexpr = NUM_BUFFERS_Q * GROUPS
    bars = Bars(q_full=tlx.alloc_barriers(NQ), q_empty=tlx.alloc_barriers(NQ),
                kv_full=tlx.alloc_barriers(NUM_BUFFERS_KV),
                kv_empty=tlx.alloc_barriers(NUM_BUFFERS_KV),
                s_full=tlx.alloc_barriers(GROUPS), p_full=tlx.alloc_barriers(GROUPS * P_SLICES),
                alpha_full=tlx.alloc_barriers(GROUPS), o_ready=tlx.alloc_barriers(GROUPS),
                o_full=tlx.alloc_barriers(GROUPS), stats_full=tlx.alloc_barriers(GROUPS),
                s_free=tlx.alloc_barriers(GROUPS),
                tile_full=tlx.alloc_barriers(2),
                tile_empty=tlx.alloc_barriers(2, arrive_count=READERS),
                sink=tlx.alloc_barriers(1))
    tiles = Tiles(pairs_ptr, count_ptr, cu_q, cu_k, L_q, H, GROUP, NBLK, sched_ptr)
    out = Out(out_ptr, lse_ptr, H * PACK, n_out)  # H: the tiles' heads (KV heads if packed)

    with tlx.async_tasks():
        with tlx.async_task("default"):
            correction(smem, tmem, bars, tiles, out, HEAD_DIM, BLOCK_N, CAUSAL, BROADCAST_Q,
                       DYNAMIC, O_SLICE, PACK, DIRECT)
        with tlx.async_task(num_warps=4, registers=SOFTMAX_REGS, replicate=GROUPS):
            softmax(smem, tmem, bars, tiles, qk_scale, tlx.async_task_replica_id(), BLOCK_N,
                    CAUSAL, BROADCAST_Q, MASK_FIRST, S_SLICE, P_SLICES, DYNAMIC, PACK, DIRECT)
        with tlx.async_task(num_warps=1, registers=SMALL_REGS):
            mma(smem, tmem, bars, tiles, HEAD_DIM, BLOCK_N, NUM_BUFFERS_Q, NUM_BUFFERS_KV,
                CAUSAL, BROADCAST_Q, P_SLICES, DYNAMIC, PACK, DIRECT)
        with tlx.async_task(num_warps=1, registers=SMALL_REGS):
            load(Descs(desc_q, desc_k, desc_v), smem, bars, tiles, HEAD_DIM, BLOCK_N,
                 NUM_BUFFERS_Q, NUM_BUFFERS_KV, CAUSAL, BROADCAST_Q, MASK_FIRST, DYNAMIC, PACK,
                 DIRECT)


# ----------------------------------------------------------------------------- host
def kernel_args(cfg: Config, head_dim: int, causal: bool, broadcast_q: bool,
                pack: int = 1, direct: bool = False) -> dict:
    """The constexpr arguments of `fwd_kernel` (shared with the compile checks); the GQA
    group is a runtime argument, so it costs no extra compile. pack: query heads a tile's
    rows hold (jagged.tiles.gqa_pack); direct: no tile list, a program a tile
    (jagged.tiles.fwd_direct: nothing to take from the counter; pairs_ptr, count_ptr and
    sched_ptr None)."""
    if cfg.p_slices not in (1, 2) or cfg.block_n % (16 * cfg.p_slices):
        raise ValueError(f"forward Config p_slices={cfg.p_slices}: 1 or 2, dividing "
                         f"block_n={cfg.block_n} into slices of a multiple of 16 keys")
    if (cfg.block_n // cfg.p_slices) % cfg.s_slice:
        raise ValueError(f"forward Config s_slice={cfg.s_slice}: must divide block_n / p_slices")
    if 2 * (cfg.block_n + head_dim) > 512:
        raise ValueError(f"forward Config block_n={cfg.block_n}: S and O of two groups need "
                         f"2 * (block_n + head_dim) <= 512 TMEM columns")
    return dict(HEAD_DIM=head_dim, BLOCK_N=cfg.block_n, NUM_BUFFERS_Q=cfg.num_buffers_q,
                NUM_BUFFERS_KV=cfg.num_buffers_kv, CAUSAL=causal, BROADCAST_Q=broadcast_q,
                MASK_FIRST=cfg.mask_first, P_SLICES=cfg.p_slices,
                DYNAMIC=cfg.dynamic and not direct, SOFTMAX_REGS=cfg.softmax_regs,
                SMALL_REGS=cfg.small_regs, O_SLICE=min(cfg.o_slice, head_dim),
                S_SLICE=cfg.s_slice, PACK=pack, DIRECT=direct)


def grid_size(n_sms: int, n_tiles: int) -> int:
    """Programs of a launch: one per SM, no more than the tiles (at least one)."""
    return max(1, min(n_sms, n_tiles))


def forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q):
    """(out [Nq, H, D], lse [H, Nq] fp32); the `fwd` of jagged.api.make_jagged_attention."""
    if q.dtype not in DTYPES:
        raise TypeError(f"the TLX Blackwell forward takes bf16 or fp16, got {q.dtype}")
    Nq_in, H, D = q.shape
    Nk, Hkv, _ = k.shape
    batch = cu_k.shape[0] - 1
    n_out = batch * Nq_in if broadcast_q else Nq_in
    out = torch.empty(n_out, H, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(H, n_out, dtype=torch.float32, device=q.device)
    check = (Nq_in, Nk, max_q, max_k)  # the offsets check: the tile-list kernel's, or alone
    if forward_without_tiles(out, lse, cu_q, cu_k, check):
        return out, lse
    cfg = pick_config(D, max_k, causal, Nk / batch)
    # the tiles' query rows, heads and GQA group: a packing tile holds `pack` heads
    q, pack = packed_query(q, broadcast_q, Hkv, BLOCK_M.value)
    Nq_t, H_t = q.shape[0], q.shape[1]
    L_t = Nq_t if broadcast_q else 0
    n_sms = num_sms(q.device)
    nblk = pairs_per_sequence(L_t if broadcast_q else max_q, BLOCK_M.value)
    direct = fwd_direct(batch * nblk * H_t, n_sms)
    # direct: no list (pairs None), the check queued alone ahead; the kernel counts the
    # pairs from its grid, a program a tile
    pairs, count, nblk = build_tiles(cu_q, cu_k, batch, L_t if broadcast_q else max_q,
                                     L_t if broadcast_q else None, BLOCK_M.value, cfg.block_n,
                                     causal, check, direct)
    grid = grid_size(n_sms, batch * nblk * H_t)
    if direct:
        count = sched = None
    else:
        sched = (torch.zeros if cfg.dynamic else torch.empty)(4 + 2 * grid, dtype=torch.int32,
                                                              device=q.device)
    desc_q = tma_desc(q, (Nq_t, H_t * D), (H_t * D, 1), (GROUP_M.value, D))
    desc_k = tma_desc(k, (Nk, Hkv * D), (Hkv * D, 1), (cfg.block_n, D))
    desc_v = tma_desc(v, (Nk, Hkv * D), (Hkv * D, 1), (cfg.block_n, D))
    fast(fwd_kernel)[(grid,)](
        desc_q, desc_k, desc_v, out, lse, cu_k if cu_q is None else cu_q, cu_k, pairs, count,
        sched, L_t, H_t, H_t // Hkv, nblk, n_out, scale * LOG2E,
        **kernel_args(cfg, D, causal, broadcast_q, pack, direct), num_warps=4, num_stages=1,
        launch_pdl=True)
    return out, lse


def signature(cfg: Config, head_dim: int, dtype: str = "bf16", direct: bool = False) -> dict:
    """Triton types of `fwd_kernel`'s runtime arguments (for compile-only checks); direct:
    no list, count or scheduling buffer (None)."""
    sig = {"desc_q": f"tensordesc<{dtype}[{GROUP_M.value},{head_dim}]>",
            "desc_k": f"tensordesc<{dtype}[{cfg.block_n},{head_dim}]>",
            "desc_v": f"tensordesc<{dtype}[{cfg.block_n},{head_dim}]>",
            "out_ptr": f"*{dtype}", "lse_ptr": "*fp32", "cu_q": "*i32", "cu_k": "*i32",
            "pairs_ptr": "*i64", "count_ptr": "*i32", "sched_ptr": "*i32", "L_q": "i32",
            "H": "i32", "GROUP": "i32", "NBLK": "i32", "n_out": "i32", "qk_scale": "fp32"}
    if direct:
        sig.update(pairs_ptr="constexpr", count_ptr="constexpr", sched_ptr="constexpr")
    return sig
