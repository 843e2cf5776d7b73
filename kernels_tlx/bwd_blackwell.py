"""Jagged (varlen, packed) flash-attention backward for Blackwell (sm_100a) in Triton + TLX.

    backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale,
             broadcast_q, dlse=None) -> (dq, dk, dv)          # in q's dtype

Compiled for sm_100a, not run: no B200 has run it (tests/test_bwd_blackwell_tlx.py
compiles it on the CPU; its `-m gpu` test checks it against the oracle on a B200).

Three kernels, as bwd_hopper: its architecture-neutral `_bwd_preprocess` (delta =
rowsum(dO * O) - dlse, the fp32 dQ accumulator and the tile counter zeroed) and
`_bwd_postprocess` (dQ = scale * the sum of the accumulator's slots), launched by its host
steps `_prepare` / `_preprocess` / `_postprocess`, and `bwd_kernel` below; in the packed
modes they chain as programmatic dependent launches, as there (each task of `bwd_kernel`
waits before its first global access, jagged.tiles.bwd_dependent). One
persistent program per SM walks the core's KV-tile list (jagged.tiles.kv_tiles, longest
first; schedule.tile_range / kv_tile_coords; packed lists from the tile counter,
tile_counter.py). A tile is BLOCK_N = 128 keys of one (sequence, KV head); it
loops over the Q steps (BLOCK_M = 128 query rows) of every query head of its GQA group.
Transposed form, a thread a key row (TMEM lane); in tensor memory:

    S^T  = K Q^T       [BLOCK_N, BLOCK_M] fp32     P^T (the dtype) in S^T's lower columns
    dP^T = V dO^T      [BLOCK_N, BLOCK_M] fp32     D = 128: dQ (fp32) in dP^T's columns
    dV  += P^T dO      [BLOCK_N, D] fp32           A operand P^T from TMEM
    dK  += dS^T Q      [BLOCK_N, D] fp32           A operand dS^T from smem
    dQ   = dS K        [BLOCK_M, D] fp32           A = dS^T transposed in smem; D = 64:
                                                   two buffers of their own
    columns: 2 * 128 + 2 * D (+ 2 * D at D = 64) <= 512.

Roles (tlx.async_task), each its own helper:
    compute     (default, 4 warps) P^T = exp2(S^T * scale * log2 e - lse * log2 e) masked,
                dS^T = P^T (dP^T - delta), S_SLICE columns at a time: P^T back to TMEM,
                dS^T to smem
    mma         (1 warp) tcgen05 in the order S^T, dP^T, dV, dK, dQ a step; completions
                by the MMAs' barriers / tcgen05.commit
    load        (1 warp) TMA: K, V per tile (KV_STAGES), Q, dO per step (Q_STAGES);
                the next tile from the counter (DYNAMIC), handed to the others
    reduce_dq   (4 warps) dQ out of TMEM DQ_SLICE columns at a time into two fp32 smem
                stages, each TMA reduce-added (cp.reduce.async.bulk .add.f32) into the
                accumulator; a stage is rewritten after its store has read it
    store       (4 warps) at a tile's end dK (times scale) and dV from TMEM to global
    GQA: dK / dV accumulate over the group's query heads in TMEM, stored once.

Barrier protocol (producer -> consumer, arrive count 1 unless said; a tcgen05 commit,
or an MMA's barrier, arrives when every tcgen05 op the mma warp issued before completes):
    q_full / q_empty [Q_STAGES]    load (TMA bytes) -> mma / mma (commit after dK) -> load
    kv_full / kv_empty [KV_STAGES] load (TMA bytes) -> mma / mma (commit after the tile's
                                   last dQ) -> load
    s_full, dp_full                mma (S^T / dP^T MMA) -> compute
    p_full                         compute (P^T in TMEM) -> mma
    ds_full / ds_empty             compute (dS^T in smem, fenced) -> mma / mma (commit
                                   after dQ) -> compute
    dq_full / dq_empty [NDQ]       mma (dQ MMA) -> reduce_dq / reduce_dq (dQ read) -> mma
    dkv_full / dkv_empty           mma (commit after the tile's last dK) -> store /
                                   store (dK, dV read) -> mma (before the next tile's
                                   first dV)
    tile_full / tile_empty [2]     load -> compute, mma, reduce_dq, store (count 4;
                                   DYNAMIC only)
    sink                           completions nobody waits for (an MMA without a barrier
                                   is issued synchronously)
Ordering invariants: tcgen05 ops of the mma warp run in issue order, so S^T(j + 1) is
issued after dV(j) (which read P^T) once p_full(j) said the compute has read S^T(j); dP^T(j
+ 1) after ds_full(j) (the compute has read dP^T(j)) and, at D = 128, after dq_empty(j)
(reduce_dq has read dQ(j) out of dP^T's columns); dQ(j) after ds_full(j). The compute
writes P^T chunk c into S^T columns it has already read (chunk c covers
[c * S_SLICE / 2, (c + 1) * S_SLICE / 2)).

Masking (exact zeros): keys past the sequence (K rows of the next sequence or TMA's zero
fill), query rows past it (lse read as +inf), the bottom-right causal triangle, and rows
with lse = -inf give P = 0, so dS = 0: such rows add nothing to dV, dK or dQ, and the dQ
box of a step adds exact zeros past the sequence.

Registers: Triton 3.8's OptimizePartitionWarps pass gives the tensor-holding non-default
tasks (reduce_dq, store) 88 registers and the 1-warp ones 24, the default (compute) the
rest; so every task holds a TMEM slice of at most 32 columns, never a whole tile. The mma
warp forms its smem descriptors per step from opaque stage indices (hoisted, 40 of them
spilled); the store writes from a scalar base with int32, 16-byte aligned offsets.

Overlap: TMEM holds one step's S^T and dP^T (512 columns with dK, dV), so within a
program the compute and the tensor core alternate on a step; a program overlaps its TMA
loads, the dQ reduce and the dK / dV store with both.

Not here: Cluster Launch Control (these pins do not register
`ttng.async_clc_try_cancel`; the tile counter stands in, at the cost of a zeroed counter
per launch and a global-memory handoff per tile), the 2-CTA MMA of the broadcast-Q
backward and P^T released in slices (not built).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import triton
import triton.language as tl
import triton.language.extra.tlx as tlx
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from jagged.launch import fast
from jagged.tiles import bwd_dependent, bwd_dynamic, kv_tiles, slot_count

from .bwd_hopper import (Descs, Grads, RowStats, _buf_phase, _desc, _masked, _opaque,
                         _postprocess, _prepare, _preprocess, lse_log2)
from .schedule import KVTiles, dq_slot_row, kv_tile_coords, tile_range
from .tile_counter import fetch_tile, next_tile, publish_tile

BLOCK_M = tl.constexpr(128)  # query rows a step (the dQ MMA's M)
BLOCK_N = tl.constexpr(128)  # keys a tile (the S^T / dP^T / dK / dV MMAs' M, a lane a key)
READERS = tl.constexpr(4)    # tasks that read the tile handoff: compute, mma, reduce_dq, store
LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class Config:
    q_stages: int         # Q / dO stages
    kv_stages: int        # K / V stages (2: the next tile's K / V load during this one)
    s_slice: int = 16     # S^T / dP^T columns the compute holds in registers at once
    dq_slice: int = 32    # dQ columns a reduce_dq stage holds (the TMA box width)
    o_slice: int = 8      # dK / dV columns the store holds at once (16 bytes a row: one
                          # vector store; 16 spilled at the 88 registers of the store)


# Defaults by head dim; not measured (no B200 here). Shared memory (2-byte dtype):
# Q + dO stages 2 * 128 * D each, K + V stages 2 * 128 * D each, dS^T 128 * 128, two fp32
# dQ stages 128 * dq_slice: D = 128 one of each: 192 KB; D = 64 two of each: 192 KB.
CONFIGS = {
    64: Config(q_stages=2, kv_stages=2),
    128: Config(q_stages=1, kv_stages=1),
}


def pick_config(head_dim: int) -> Config:
    return CONFIGS[head_dim]


def smem_bytes(cfg: Config, head_dim: int, elt: int = 2) -> int:  # role: host
    """Shared memory of the buffers (barriers and the compiler's scratch not counted)."""
    bm, bn = BLOCK_M.value, BLOCK_N.value
    return (elt * (2 * cfg.q_stages * bm * head_dim + 2 * cfg.kv_stages * bn * head_dim
                   + bn * bm) + 4 * 2 * bm * cfg.dq_slice)


def tmem_cols(head_dim: int) -> int:  # role: host
    """TMEM columns: S^T, dP^T, dV, dK, and dQ's two buffers at D = 64 (at D = 128 dQ
    lives in dP^T's columns)."""
    return 2 * BLOCK_N.value + 2 * head_dim + (2 * head_dim if head_dim < 128 else 0)


# ----------------------------------------------------------------------------- bundles
# (Descs, RowStats, Grads: bwd_hopper's; the dQ accumulator's box is [BLOCK_M, dq_slice])
class Smem(NamedTuple):
    """Q / dO stages, K / V stages, dS^T (the dK MMA's A, the dQ MMA's A transposed),
    reduce_dq's two fp32 stages."""
    q: object
    do: object
    k: object
    v: object
    ds: object
    dq: object


class Tmem(NamedTuple):
    """S^T and dP^T (fp32); P^T in S^T's lower columns as the compute writes it (p[c]:
    S_SLICE query columns, at S^T column c * S_SLICE / 2) and as the MMA reads it (pa[0]);
    dQ [NDQ] (D = 128: dP^T's columns); dK, dV."""
    s: object
    p: object
    pa: object
    dp: object
    dq: object
    dk: object
    dv: object


class Bars(NamedTuple):
    """mbarriers, named by what their completion says (module docstring)."""
    q_full: object
    q_empty: object
    kv_full: object
    kv_empty: object
    s_full: object
    dp_full: object
    p_full: object
    ds_full: object
    ds_empty: object
    dq_full: object
    dq_empty: object
    dkv_full: object
    dkv_empty: object
    tile_full: object
    tile_empty: object
    sink: object


# ----------------------------------------------------------------------------- schedule
@triton.jit
def _first(tiles, bars, HKV: tl.constexpr, BROADCAST_Q: tl.constexpr,
           DYNAMIC: tl.constexpr):  # role: schedule
    """A reading task's (first tile, step, end): the load task's handoff (DYNAMIC) or
    the program's static walk."""
    first, step, n_tiles = tile_range(tl.program_id(0), tl.num_programs(0), tiles.n_tiles,
                                      HKV, BROADCAST_Q)
    t = first
    if DYNAMIC:
        t = fetch_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, step, 0, DYNAMIC)
    return t, step, n_tiles


@triton.jit
def _next(tiles, bars, t, step, i, DYNAMIC: tl.constexpr):  # role: schedule
    return fetch_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, step, i, DYNAMIC)


@triton.jit
def _tile(t, tiles, HKV: tl.constexpr, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr):
    return kv_tile_coords(t, tl.program_id(0), tiles, HKV, BLOCK_M, BLOCK_N, CAUSAL,
                          BROADCAST_Q)


# ----------------------------------------------------------------------------- roles
@triton.jit
def load(descs, smem, bars, tiles, H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
         CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, NQ: tl.constexpr,
         NKV: tl.constexpr, DYNAMIC: tl.constexpr):
    """The producer: per tile K and V, per Q step Q and dO, by TMA; a box may run past the
    sequence (masked by the compute) or the tensor (TMA fills zeros)."""
    G: tl.constexpr = H // HKV
    ELT: tl.constexpr = tlx.size_of(tlx.dtype_of(descs.q))
    first, step, n_tiles = tile_range(tl.program_id(0), tl.num_programs(0), tiles.n_tiles,
                                      HKV, BROADCAST_Q)
    t = first
    if DYNAMIC:
        publish_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, 0)
    i = 0
    kcnt = 0
    qcnt = 0
    while t < n_tiles:
        tile = _tile(t, tiles, HKV, CAUSAL, BROADCAST_Q)
        n_steps = G * tile.n_m
        if n_steps > 0:
            kb, kph = _buf_phase(kcnt, NKV)
            tlx.barrier_wait(bars.kv_empty[kb], kph ^ 1)
            tlx.barrier_expect_bytes(bars.kv_full[kb], 2 * ELT * BLOCK_N * D)
            krow = (tile.k_start + tile.n0).to(tl.int32)
            tlx.async_descriptor_load(descs.k, smem.k[kb], [krow, tile.hk * D], bars.kv_full[kb])
            tlx.async_descriptor_load(descs.v, smem.v[kb], [krow, tile.hk * D], bars.kv_full[kb])
            kcnt += 1
            for j in range(0, n_steps):
                h = tile.hk * G + j // tile.n_m
                m0 = tile.m_lo + (j % tile.n_m) * BLOCK_M
                qb, qph = _buf_phase(qcnt, NQ)
                tlx.barrier_wait(bars.q_empty[qb], qph ^ 1)
                tlx.barrier_expect_bytes(bars.q_full[qb], 2 * ELT * BLOCK_M * D)
                tlx.async_descriptor_load(descs.q, smem.q[qb],
                                          [(tile.q_start + m0).to(tl.int32), h * D],
                                          bars.q_full[qb])
                tlx.async_descriptor_load(descs.do, smem.do[qb],
                                          [(tile.o_start + m0).to(tl.int32), h * D],
                                          bars.q_full[qb])
                qcnt += 1
        i += 1
        t = next_tile(t, step, tiles.sched, DYNAMIC)
        if DYNAMIC:
            publish_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, i)


@triton.jit
def mma(smem, tmem, bars, tiles, H: tl.constexpr, HKV: tl.constexpr, CAUSAL: tl.constexpr,
        BROADCAST_Q: tl.constexpr, NQ: tl.constexpr, NKV: tl.constexpr, NDQ: tl.constexpr,
        DQ_ALIAS: tl.constexpr, DYNAMIC: tl.constexpr):
    """The tensor core's issue order per step j: S^T, dP^T, dV (after p_full), dK and dQ
    (after ds_full). DQ_ALIAS (dQ in dP^T's columns): dP^T(j) waits until reduce_dq has
    read dQ(j - 1); else dQ(j) waits for its buffer's previous use."""
    G: tl.constexpr = H // HKV
    t, step, n_tiles = _first(tiles, bars, HKV, BROADCAST_Q, DYNAMIC)
    i = 0
    kcnt = 0
    qcnt = 0   # Q steps so far (the phase of the per-step barriers)
    tw = 0     # tiles with steps so far (dkv phases)
    while t < n_tiles:
        tile = _tile(t, tiles, HKV, CAUSAL, BROADCAST_Q)
        n_steps = G * tile.n_m
        if n_steps > 0:
            kb, kph = _buf_phase(kcnt, NKV)
            tlx.barrier_wait(bars.kv_full[kb], kph)
            for j in range(0, n_steps):
                qb, qph = _buf_phase(qcnt, NQ)
                ph = qcnt & 1
                # the stage indices through an opaque mov: the 40 smem descriptors a step
                # are then formed per step, not hoisted into the 24 registers of this warp
                qb = _opaque(qb)
                kb = _opaque(kb)
                db, dph = _buf_phase(qcnt, NDQ)
                tlx.barrier_wait(bars.q_full[qb], qph)
                tlx.async_dot(smem.k[kb], tlx.local_trans(smem.q[qb]), tmem.s[0],
                              use_acc=False, mBarriers=[bars.s_full[0]])      # S^T = K Q^T
                if DQ_ALIAS:
                    tlx.barrier_wait(bars.dq_empty[db], dph ^ 1)
                tlx.async_dot(smem.v[kb], tlx.local_trans(smem.do[qb]), tmem.dp[0],
                              use_acc=False, mBarriers=[bars.dp_full[0]])     # dP^T = V dO^T
                if j == 0:  # the store has read the previous tile's dK, dV
                    tlx.barrier_wait(bars.dkv_empty[0], (tw & 1) ^ 1)
                tlx.barrier_wait(bars.p_full[0], ph)
                tlx.async_dot(tmem.pa[0], smem.do[qb], tmem.dv[0], use_acc=j > 0,
                              mBarriers=[bars.sink[0]])                       # dV += P^T dO
                tlx.barrier_wait(bars.ds_full[0], ph)
                tlx.async_dot(smem.ds[0], smem.q[qb], tmem.dk[0], use_acc=j > 0,
                              mBarriers=[bars.q_empty[qb]])                   # dK += dS^T Q
                if not DQ_ALIAS:
                    tlx.barrier_wait(bars.dq_empty[db], dph ^ 1)
                tlx.async_dot(tlx.local_trans(smem.ds[0]), smem.k[kb],
                              tmem.dq[db], use_acc=False,
                              mBarriers=[bars.dq_full[db], bars.ds_empty[0]])  # dQ = dS K
                qcnt += 1
            tlx.tcgen05_commit(bars.kv_empty[kb])
            tlx.tcgen05_commit(bars.dkv_full[0])
            kcnt += 1
            tw += 1
        i += 1
        t = _next(tiles, bars, t, step, i, DYNAMIC)


@triton.jit
def compute(smem, tmem, bars, tiles, stats, qk_scale2, H: tl.constexpr, HKV: tl.constexpr,
            CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, S_SLICE: tl.constexpr,
            DYNAMIC: tl.constexpr):
    """Per step, S_SLICE query columns at a time: P^T from S^T and lse, dS^T from P^T,
    dP^T and delta; P^T into TMEM (chunk c over S^T columns already read), dS^T into
    smem. A thread owns a key row."""
    G: tl.constexpr = H // HKV
    NS: tl.constexpr = BLOCK_M // S_SLICE
    dt: tl.constexpr = smem.ds.dtype
    t, step, n_tiles = _first(tiles, bars, HKV, BROADCAST_Q, DYNAMIC)
    i = 0
    qcnt = 0
    while t < n_tiles:
        tile = _tile(t, tiles, HKV, CAUSAL, BROADCAST_Q)
        keys = tile.n0 + tl.arange(0, BLOCK_N)
        for j in range(0, G * tile.n_m):
            h = tile.hk * G + j // tile.n_m
            m0 = tile.m_lo + (j % tile.n_m) * BLOCK_M
            ph = qcnt & 1
            base = stats.stride_h * h + tile.o_start + m0
            tlx.barrier_wait(bars.s_full[0], ph)
            tlx.barrier_wait(bars.dp_full[0], ph)
            tlx.barrier_wait(bars.ds_empty[0], ph ^ 1)
            for c in tl.static_range(NS):
                cols = c * S_SLICE + tl.arange(0, S_SLICE)
                inb = m0 + cols < tile.len_q
                lse2 = lse_log2(tl.load(stats.lse + base + cols, mask=inb, other=float("inf")))
                dl = tl.load(stats.delta + base + cols, mask=inb, other=0.0)
                s = tlx.local_load(tlx.subslice(tmem.s[0], c * S_SLICE, S_SLICE))
                pt = tl.math.exp2(s * qk_scale2 - lse2[None, :])
                pt = _masked(pt, keys, m0 + cols, tile, None, CAUSAL, False)
                tlx.local_store(tmem.p[c], pt.to(dt))
                dpt = tlx.local_load(tlx.subslice(tmem.dp[0], c * S_SLICE, S_SLICE))
                dst = pt * (dpt - dl[None, :])
                tlx.local_store(tlx.local_slice(smem.ds[0], [0, c * S_SLICE],
                                                [BLOCK_N, S_SLICE]), dst.to(dt))
            tlx.barrier_arrive(bars.p_full[0], 1)
            tlx.fence_async_shared()
            tlx.barrier_arrive(bars.ds_full[0], 1)
            qcnt += 1
        i += 1
        t = _next(tiles, bars, t, step, i, DYNAMIC)


@triton.jit
def reduce_dq(descs, smem, tmem, bars, tiles, H: tl.constexpr, HKV: tl.constexpr,
              D: tl.constexpr, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr,
              NDQ: tl.constexpr, DQ_SLICE: tl.constexpr, DYNAMIC: tl.constexpr):
    """Per step, dQ out of TMEM DQ_SLICE columns at a time, each through one of two smem
    stages into a TMA reduce-add; dq_empty once the last slice is read. A stage is
    rewritten once at most one store (the other stage's) is pending."""
    G: tl.constexpr = H // HKV
    NSL: tl.constexpr = D // DQ_SLICE
    t, step, n_tiles = _first(tiles, bars, HKV, BROADCAST_Q, DYNAMIC)
    slot_row = dq_slot_row(tl.program_id(0), tiles, HKV, BROADCAST_Q)
    i = 0
    qcnt = 0
    scnt = 0
    while t < n_tiles:
        tile = _tile(t, tiles, HKV, CAUSAL, BROADCAST_Q)
        for j in range(0, G * tile.n_m):
            h = tile.hk * G + j // tile.n_m
            row = (slot_row + tile.q_start + tile.m_lo + (j % tile.n_m) * BLOCK_M).to(tl.int32)
            db, dph = _buf_phase(qcnt, NDQ)
            tlx.barrier_wait(bars.dq_full[db], dph)
            for c in tl.static_range(NSL):
                x = tlx.local_load(tlx.subslice(tmem.dq[db], c * DQ_SLICE, DQ_SLICE))
                if c == NSL - 1:
                    tlx.barrier_arrive(bars.dq_empty[db], 1)
                sb = scnt % 2
                tlx.async_descriptor_store_wait(1)
                tlx.local_store(smem.dq[sb], x)
                tlx.fence_async_shared()
                tlx.async_descriptor_store(descs.dq, smem.dq[sb], [row, h * D + c * DQ_SLICE],
                                           store_reduce="add")
                scnt += 1
            qcnt += 1
        i += 1
        t = _next(tiles, bars, t, step, i, DYNAMIC)
    tlx.async_descriptor_store_wait(0)


@triton.jit
def store(tmem, bars, tiles, grads, H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
          CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, O_SLICE: tl.constexpr,
          DYNAMIC: tl.constexpr):
    """At a tile's end dK (times scale) and dV, O_SLICE columns at a time, rows < len_k;
    a tile no query sees stores zeros."""
    G: tl.constexpr = H // HKV
    t, step, n_tiles = _first(tiles, bars, HKV, BROADCAST_Q, DYNAMIC)
    i = 0
    tw = 0
    while t < n_tiles:
        tile = _tile(t, tiles, HKV, CAUSAL, BROADCAST_Q)
        # a scalar base pointer and int32 offsets (BLOCK_N * stride_tok < 2^31): a thread
        # holds one row's O_SLICE contiguous columns, 16-byte aligned (dK / dV contiguous,
        # D and O_SLICE multiples of 8): one 16-byte vector store a row
        off0 = (tile.k_start + tile.n0) * grads.stride_tok + tile.hk * grads.stride_h
        rows = tl.arange(0, BLOCK_N)[:, None]
        mask = tile.n0 + rows < tile.len_k
        if G * tile.n_m > 0:
            tlx.barrier_wait(bars.dkv_full[0], tw & 1)
            for c in tl.static_range(D // O_SLICE):
                off = rows * grads.stride_tok + (c * O_SLICE + tl.arange(0, O_SLICE))[None, :]
                dv = tlx.local_load(tlx.subslice(tmem.dv[0], c * O_SLICE, O_SLICE))
                tl.store(tl.multiple_of(grads.dv + off0 + off, [1, 16]),
                         dv.to(grads.dv.dtype.element_ty), mask=mask)
                dk = tlx.local_load(tlx.subslice(tmem.dk[0], c * O_SLICE, O_SLICE))
                tl.store(tl.multiple_of(grads.dk + off0 + off, [1, 16]),
                         (dk * grads.scale).to(grads.dk.dtype.element_ty), mask=mask)
            tlx.barrier_arrive(bars.dkv_empty[0], 1)
            tw += 1
        else:
            for c in tl.static_range(D // O_SLICE):
                off = rows * grads.stride_tok + (c * O_SLICE + tl.arange(0, O_SLICE))[None, :]
                z = tl.zeros([BLOCK_N, O_SLICE], grads.dk.dtype.element_ty)
                tl.store(tl.multiple_of(grads.dv + off0 + off, [1, 16]), z, mask=mask)
                tl.store(tl.multiple_of(grads.dk + off0 + off, [1, 16]), z, mask=mask)
        i += 1
        t = _next(tiles, bars, t, step, i, DYNAMIC)


# ----------------------------------------------------------------------------- kernel
@triton.jit(do_not_specialize=["L_q", "n_slots", "stride_k_tok", "stride_k_h",
                               "stride_lse_h"])
def bwd_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
               cu_q_ptr, cu_k_ptr, tile_b_ptr, tile_n_ptr, n_tiles_ptr, sched_ptr,
               scale, qk_scale2, L_q, n_slots, stride_k_tok, stride_k_h, stride_lse_h,
               H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
               CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, DYNAMIC: tl.constexpr,
               Q_STAGES: tl.constexpr, KV_STAGES: tl.constexpr, S_SLICE: tl.constexpr,
               DQ_SLICE: tl.constexpr, O_SLICE: tl.constexpr):
    dt: tl.constexpr = tlx.dtype_of(q_desc)
    DQ_ALIAS: tl.constexpr = D == BLOCK_M   # dQ [BLOCK_M, D] fp32 fits dP^T's columns
    NDQ: tl.constexpr = 1 if DQ_ALIAS else 2
    smem = Smem(q=tlx.local_alloc((BLOCK_M, D), dt, Q_STAGES),
                do=tlx.local_alloc((BLOCK_M, D), dt, Q_STAGES),
                k=tlx.local_alloc((BLOCK_N, D), dt, KV_STAGES),
                v=tlx.local_alloc((BLOCK_N, D), dt, KV_STAGES),
                ds=tlx.local_alloc((BLOCK_N, BLOCK_M), dt, 1),
                dq=tlx.local_alloc((BLOCK_M, DQ_SLICE), tl.float32, 2))
    s_t = tlx.local_alloc((BLOCK_N, BLOCK_M), tl.float32, 1, tlx.storage_kind.tmem)
    dp_t = tlx.local_alloc((BLOCK_N, BLOCK_M), tl.float32, 1, tlx.storage_kind.tmem)
    # P^T aliases S^T, dQ (D = 128) dP^T: views of equal logical size, as `reuse` requires
    if DQ_ALIAS:
        dq_t = tlx.local_alloc((BLOCK_M, D), tl.float32, 1, tlx.storage_kind.tmem, reuse=dp_t)
    else:
        dq_t = tlx.local_alloc((BLOCK_M, D), tl.float32, 2, tlx.storage_kind.tmem)
    tmem = Tmem(s=s_t,
                p=tlx.local_alloc((BLOCK_N, S_SLICE), dt, 2 * (BLOCK_M // S_SLICE),
                                  tlx.storage_kind.tmem, reuse=s_t),
                pa=tlx.local_alloc((BLOCK_N, BLOCK_M), dt, 2, tlx.storage_kind.tmem, reuse=s_t),
                dp=dp_t, dq=dq_t,
                dk=tlx.local_alloc((BLOCK_N, D), tl.float32, 1, tlx.storage_kind.tmem),
                dv=tlx.local_alloc((BLOCK_N, D), tl.float32, 1, tlx.storage_kind.tmem))
    bars = Bars(q_full=tlx.alloc_barriers(Q_STAGES), q_empty=tlx.alloc_barriers(Q_STAGES),
                kv_full=tlx.alloc_barriers(KV_STAGES), kv_empty=tlx.alloc_barriers(KV_STAGES),
                s_full=tlx.alloc_barriers(1), dp_full=tlx.alloc_barriers(1),
                p_full=tlx.alloc_barriers(1), ds_full=tlx.alloc_barriers(1),
                ds_empty=tlx.alloc_barriers(1),
                dq_full=tlx.alloc_barriers(NDQ), dq_empty=tlx.alloc_barriers(NDQ),
                dkv_full=tlx.alloc_barriers(1), dkv_empty=tlx.alloc_barriers(1),
                tile_full=tlx.alloc_barriers(2),
                tile_empty=tlx.alloc_barriers(2, arrive_count=READERS),
                sink=tlx.alloc_barriers(1))
    descs = Descs(q_desc, k_desc, v_desc, do_desc, dq_desc)
    tiles = KVTiles(tile_b_ptr, tile_n_ptr, n_tiles_ptr, cu_q_ptr, cu_k_ptr, L_q, sched_ptr,
                    n_slots)
    stats = RowStats(lse_ptr, delta_ptr, stride_lse_h)
    grads = Grads(dk_ptr, dv_ptr, stride_k_tok, stride_k_h, scale)

    # a programmatic dependent of the kernel ahead, as bwd_hopper's main kernel: each task
    # waits before its first global access, then lets the postprocess launch
    with tlx.async_tasks():
        with tlx.async_task("default"):
            gdc_wait()
            gdc_launch_dependents()
            compute(smem, tmem, bars, tiles, stats, qk_scale2, H, HKV, CAUSAL, BROADCAST_Q,
                    S_SLICE, DYNAMIC)
        with tlx.async_task(num_warps=1, registers=24):
            gdc_wait()
            gdc_launch_dependents()
            mma(smem, tmem, bars, tiles, H, HKV, CAUSAL, BROADCAST_Q, Q_STAGES, KV_STAGES,
                NDQ, DQ_ALIAS, DYNAMIC)
        with tlx.async_task(num_warps=1, registers=24):
            gdc_wait()
            gdc_launch_dependents()
            load(descs, smem, bars, tiles, H, HKV, D, CAUSAL, BROADCAST_Q, Q_STAGES,
                 KV_STAGES, DYNAMIC)
        with tlx.async_task(num_warps=4, registers=88):
            gdc_wait()
            gdc_launch_dependents()
            reduce_dq(descs, smem, tmem, bars, tiles, H, HKV, D, CAUSAL, BROADCAST_Q, NDQ,
                      DQ_SLICE, DYNAMIC)
        with tlx.async_task(num_warps=4, registers=88):
            gdc_wait()
            gdc_launch_dependents()
            store(tmem, bars, tiles, grads, H, HKV, D, CAUSAL, BROADCAST_Q, O_SLICE, DYNAMIC)


# ----------------------------------------------------------------------------- host
def kernel_args(cfg: Config, H: int, HKV: int, head_dim: int, causal: bool,
                broadcast_q: bool) -> dict:
    """The constexpr arguments of `bwd_kernel` (shared with the compile checks)."""
    if head_dim not in (64, 128):
        raise ValueError(f"head_dim={head_dim}: the Blackwell backward is built for 64 and 128")
    if BLOCK_M.value % cfg.s_slice or head_dim % cfg.dq_slice or head_dim % cfg.o_slice:
        raise ValueError(f"backward Config {cfg}: slices must divide {BLOCK_M.value} / "
                         f"head_dim={head_dim}")
    return dict(H=H, HKV=HKV, D=head_dim, CAUSAL=bool(causal), BROADCAST_Q=bool(broadcast_q),
                DYNAMIC=bwd_dynamic(broadcast_q), Q_STAGES=cfg.q_stages,
                KV_STAGES=cfg.kv_stages, S_SLICE=cfg.s_slice, DQ_SLICE=cfg.dq_slice,
                O_SLICE=cfg.o_slice)


def signature(head_dim: int, cfg: Config, dtype: str = "bf16") -> dict:
    """Triton types of `bwd_kernel`'s runtime arguments (for compile-only checks)."""
    bm, bn = BLOCK_M.value, BLOCK_N.value
    return {"q_desc": f"tensordesc<{dtype}[{bm},{head_dim}]>",
            "k_desc": f"tensordesc<{dtype}[{bn},{head_dim}]>",
            "v_desc": f"tensordesc<{dtype}[{bn},{head_dim}]>",
            "do_desc": f"tensordesc<{dtype}[{bm},{head_dim}]>",
            "dq_desc": f"tensordesc<fp32[{bm},{cfg.dq_slice}]>",
            "lse_ptr": "*fp32", "delta_ptr": "*fp32", "dk_ptr": f"*{dtype}",
            "dv_ptr": f"*{dtype}", "cu_q_ptr": "*i32", "cu_k_ptr": "*i32",
            "tile_b_ptr": "*i32", "tile_n_ptr": "*i32", "n_tiles_ptr": "*i32",
            "sched_ptr": "*i32", "scale": "fp32", "qk_scale2": "fp32", "L_q": "i32",
            "n_slots": "i32", "stride_k_tok": "i32", "stride_k_h": "i32", "stride_lse_h": "i32"}


def backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q,
             dlse=None):
    """(dq, dk, dv) in q's dtype; the `bwd` of jagged.api.make_jagged_attention. dlse:
    the gradient on lse, or None. See the module docstring for the design."""
    p = _prepare(dout, q, k, v, out, lse, cu_k, broadcast_q)
    if p.empty:
        return p.dq, p.dk, p.dv
    D = p.D
    cfg = pick_config(D)
    BM, BN = BLOCK_M.value, BLOCK_N.value

    delta, dq_acc, grid, sched = _preprocess(p, broadcast_q, dlse)

    tile_b, tile_n, n_tiles = kv_tiles(cu_q, cu_k, p.L_q, max_k, causal, BM, BN)
    fast(bwd_kernel)[(grid,)](
        _desc(q, BM, D), _desc(k, BN, D), _desc(v, BN, D), _desc(p.dout, BM, D),
        _desc(dq_acc, BM, D, cols=cfg.dq_slice), p.lse, delta, p.dk, p.dv,
        cu_k if cu_q is None else cu_q, cu_k, tile_b, tile_n, n_tiles, sched,
        float(scale), float(scale) * LOG2E, p.L_q, slot_count(dq_acc, broadcast_q),
        p.dk.stride(0), p.dk.stride(1), p.lse.stride(0),
        **kernel_args(cfg, p.H, p.HKV, D, causal, broadcast_q), num_warps=4, num_stages=1,
        launch_pdl=bwd_dependent(broadcast_q))

    _postprocess(p, dq_acc, scale, broadcast_q)
    return p.dq, p.dk, p.dv
