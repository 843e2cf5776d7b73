"""Jagged (varlen, packed) flash-attention forward for Blackwell (sm_100a), in CuteDSL.

    forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q)
        -> (out [Nq, H, D] in q's dtype, lse [H, Nq] fp32)

Compiled for sm_100a, not run: no B200 was available; the `-m gpu` test
(tests/test_fwd_blackwell_cute.py) checks it against harness/oracle.py on one.

The same contract, tile list and names as `fwd_hopper.py`; tcgen05 MMAs with S, P and O
in tensor memory (TMEM). A CTA tile is two 128-row query halves of one (sequence, head)
(block_m = 256 in the shared tile list, longest first); both halves share every K/V block.
One CTA per SM (512 threads x 128 registers fill the register file), 16 warps. Launched
as a programmatic dependent of the tile-list kernel, as fwd_hopper: one griddepcontrol.wait
after the barrier setup, before any global access.

    warps 0-3, 4-7  `softmax` s   half s (thread = query row = TMEM lane): S_s from TMEM,
                                  the online softmax in exp2, P_s (16-bit) back into TMEM
                                  over S_s's upper half columns; the row rescale factor
                                  and, at the tile's end, row sum and max to `correction`
    warps 8-11      `correction`  rescales O_s in TMEM between PVs; at the tile's end
                                  `store`: O_s / rowsum -> registers (then O_s goes back
                                  to `mma`: early release) -> global, predicated per row;
                                  LSE (-inf and O = 0 on rows that see no key)
    warp 12         `mma`         allocates TMEM; S_s = Q_s K_n^T, O_s += P_s V_n
                                  (tcgen05, one thread issues); commits to mbarriers
    warp 13         `load`        TMA: Q_0, K_0, Q_1, V_0, K_1, V_1, ...; Q in 2 slots,
                                  K and V through one num_buffers_kv-slot ring
    warp 14         `schedule`    Cluster Launch Control: cancels the next unlaunched CTA
                                  and hands its tile id to every role (1-CTA clusters)
    warp 15         idle

TMEM (fp32 columns, lanes = rows): S_0 [0, 128), S_1 [128, 256), O_0 [256, 256 + D),
O_1 [256 + D, 256 + 2D); P_s is the 16-bit view of S_s's columns [64, 128). All 512
columns are allocated, so the allocation starts at column 0.

Schedule: the grid is the tile list's upper bound (B * blocks * H); CTA c's first tile is
c, later ones are the ids of CTAs it cancels (the hardware launches and cancels in id
order, so tiles go out longest first). Tile ids at or past the device-side count end the
walk. Tiles decode as `schedule.tile_coords` without the static round-robin's flip.

One wave without a list (Config.direct, jagged.tiles.fwd_direct), as fwd_hopper's: when
every (sequence, query block, head) tile has a CTA of its own, CTA c takes tile c alone
(the pairs in order, no CLC query; a pair past its sequence's queries visits no KV
block and stores nothing), and the kernel ahead is the offsets check. The reads
(offsets, TMA boxes, which the hardware bounds) run under it; `store` waits for it
(griddepcontrol.wait) before its global writes, after O_s went back to `mma`.

Per step n a half s runs: mma QK_s(n) -> softmax_s(n) -> [correction rescales O_s by
softmax_s(n)'s factor after PV_s(n-1)] -> mma PV_s(n) -> mma QK_s(n+1) (it overwrites
P_s(n): tcgen05 MMAs from one thread execute in order). While softmax 0 works, the
tensor core runs half 1's PV and QK, and the other way round (ping-pong).

Hand-overs (mbarriers; arrivals per phase; "commit": tcgen05.commit, one arrival when
the issuing thread's earlier MMAs are done), each waited in order with parity count % 2
(a producer's first wait on an empty barrier passes):

    pipe_q      2 slots   load -> mma: TMA bytes (1 + tx)  | mma -> load: commit after Q's last QK
    pipe_kv     N slots   load -> mma: TMA bytes (1 + tx)  | mma -> load: commit after its MMAs
    pipe_s_p    per half  mma -> softmax s: commit of QK   | softmax s -> mma: P written (128)
    pipe_o      per half  mma -> correction: commit of PV  | correction -> mma: O_s rescaled,
                                                             or read out by `store` (128)
    pipe_stats  per half  softmax s -> correction (128)    | correction -> softmax s (128)
    pipe_clc    1 slot    schedule -> all: CLC bytes (1 + 16) | all 15 role warps -> schedule (480)
    bar 1       named     TMEM allocated (416: warps 0-12 sync) / released (384 arrive + mma sync)

A half whose rows all lie past the sequence's end (the last tile of a sequence of
length 1-128 mod 256) runs the same hand-overs without its MMAs and softmax (`store`
reads its stale O_s and writes no row).

Per tile of n_end > 0 blocks and per half: n_end S / P hand-overs, n_end PVs (the first
waits for the previous tile's `store` to release O_s), n_end - 1 rescale factors plus
the final row sum and max through `stats`; a tile without keys only passes its stats.

The KV loop is peeled per half: blocks [0, n_bulk_s) are visible to every row of half s
and run without mask code; blocks [n_bulk_s, n_end) (sequence tail, causal diagonal) are
masked. Both halves walk the same n_end blocks (they share K/V): under causal, half 0
sees up to 128 / block_n blocks that are fully masked for it. Causal is bottom-right
aligned: query i sees key j iff j <= i + len_k - len_q.

Modes: self / cross, broadcast_q (one dense q [L_q, H, D] for all B sequences; out
[B * L_q, H, D]), GQA (kv head = h // (H // H_kv)), head dims 64 and 128, bf16 and fp16.
One compiled kernel per (dtype, D, causal, broadcast_q, Config), on symbolic shapes.
Broadcast-Q with a short L_q under GQA packs the group's heads into a tile's rows
(Config.pack, jagged.tiles.gqa_pack), as fwd_hopper does: q comes in packed, O and LSE
are viewed through a (pack, rows) layout (`fragments.packed_views`) that puts each row
back in its query row and head, and the causal cut is the query row's
(SeqlenInfo.row_kv_end).
"""

import math
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, Optional

import torch

from . import blackwell, host

HALF_M = 128            # query rows of one softmax warpgroup (a tcgen05 M = 128 MMA)
NUM_THREADS = 512       # 16 warps (roles in the module docstring)
SOFTMAX_WARPS = (0, 4)  # first warp of softmax half 0 and 1
CORRECTION_WARP = 8
MMA_WARP, LOAD_WARP, SCHEDULE_WARP = 12, 13, 14
TMEM_COLS = 512
TMEM_BARRIER = 1        # named barrier: TMEM allocation handed to / back from the users
# setmaxnreg per warpgroup: 2 * 184 + 96 + 48 = 512 (x 128 threads = the 64K registers)
SOFTMAX_REGS, CORRECTION_REGS, OTHER_REGS = 184, 96, 48
DTYPES = (torch.bfloat16, torch.float16)  # the element types these kernels are built for


@dataclass(frozen=True)
class Config:
    block_n: int = 128          # keys per KV block (S_s is 128 x block_n fp32 columns)
    num_buffers_kv: int = 3     # slots of the K/V ring (K and V take alternate slots)
    early_release: bool = True  # `store` hands O_s back to `mma` once it is in registers,
                                # before its global stores (else after them)
    clc: bool = True            # tiles by Cluster Launch Control (else the static
                                # round-robin of schedule.tile_coords)
    block_m: int = 2 * HALF_M   # query rows per tile (two softmax halves)
    pack: int = 1               # broadcast-Q: query heads a tile's rows hold (a call's
                                # jagged.tiles.gqa_pack; q comes in packed, O and LSE out not)
    direct: bool = False        # no tile list: one wave, CTA c takes tile c (a call's
                                # jagged.tiles.fwd_direct; no CLC query)


# Defaults keyed by (head_dim, causal). Not yet measured on a B200: FA4's sm100 shapes
# (two 128-row halves, 128-key blocks, three K/V slots).
CONFIGS = {(d, c): Config() for d in (64, 128) for c in (False, True)}


def pick_config(head_dim: int, max_seqlen_k: int, causal: bool,
                mean_k: float | None = None) -> Config:
    """The default for a call (one per head dim and causal flag)."""
    return CONFIGS[(head_dim, bool(causal))]


# role: schedule
class Sched(NamedTuple):
    """What every role needs to decode a tile id."""
    mPairs: Any          # the tile list: (batch element, query block) pairs (direct: None)
    mCount: Any          # [valid pairs] (on the device; read where used, not kept live;
                         # direct: (every pair,))
    mCuQ: Any
    mCuK: Any
    L_q: Any
    H: Any
    group: Any           # query heads per KV head
    nblk: Any            # query blocks per sequence (the pair encoding's stride)


class Tile(NamedTuple):
    """One decoded tile: head, kv head, first query row, sequence, KV block split."""
    h: Any
    hk: Any
    m0: Any
    seq: Any
    n_bulk0: Any         # blocks [0, n_bulk_s) unmasked for half s
    n_bulk1: Any
    n_end: Any           # blocks [0, n_end) visited by the tile


def tile_of(tile, sched: Sched, BLOCK_M: int, BLOCK_N: int, CAUSAL: bool,
            BROADCAST_Q: bool, PACK: int = 1, DIRECT: bool = False) -> Tile:
    """Tile id -> where it lives: chunks of nblk pairs of the list, pairs fastest, then
    heads (schedule.tile_coords' order without its round-robin flip: CLC hands ids out in
    order). Plain arithmetic: traced inside a role, or run on ints. PACK > 1
    (jagged.tiles.gqa_pack): tile row r is query row r // PACK, of len_q // PACK, for the
    causal cut (SeqlenInfo.row_kv_end). DIRECT (jagged.tiles.fwd_direct): no list, the
    pairs in pair order (mCount: every pair); a pair past its sequence's queries visits
    no KV block."""
    from .seqinfo import SeqlenInfo, _max, _min

    span = sched.nblk * sched.H
    first = tile // span * sched.nblk
    chunk_len = _min(sched.nblk, sched.mCount[0] - first)
    r = tile - tile // span * span
    h = r // chunk_len
    if DIRECT:
        pair = first + r % chunk_len
    else:
        pair = sched.mPairs[first + r % chunk_len] & 0xFFFFFFFF
    if not isinstance(pair, int):
        import cutlass
        pair = cutlass.Int32(pair)
    b = pair // sched.nblk
    m0 = (pair % sched.nblk) * BLOCK_M
    seq = SeqlenInfo.of(b, sched.mCuQ, sched.mCuK, sched.L_q, BROADCAST_Q)
    if CAUSAL:
        n_end = (seq.row_kv_end(m0 + BLOCK_M - 1, PACK) + BLOCK_N - 1) // BLOCK_N
        n_bulk0 = seq.row_kv_end(m0, PACK) // BLOCK_N
        n_bulk1 = seq.row_kv_end(m0 + HALF_M, PACK) // BLOCK_N
    else:
        n_end = (seq.len_k + BLOCK_N - 1) // BLOCK_N
        n_bulk0 = seq.len_k // BLOCK_N
        n_bulk1 = n_bulk0
    if DIRECT:  # a pair past its queries: nothing to visit, nothing to store
        n_end = _min(_max(seq.len_q - m0, 0), 1) * n_end
    return Tile(h, h // sched.group, m0, seq, _min(n_bulk0, n_end), _min(n_bulk1, n_end),
                n_end)


_COMPILED = {}


def _kernel_class():
    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    import cutlass.utils.blackwell_helpers as sm100
    from cutlass import Float32, Int32, const_expr
    from cutlass.cute.nvgpu import cpasync, tcgen05

    from .fragments import head_tile, packed_views
    from .blackwell import tc_fence_after

    LN_2 = math.log(2.0)

    class FwdBlackwell(blackwell.kernel_base()):
        def __init__(self, dtype, head_dim: int, causal: bool, broadcast_q: bool,
                     cfg: Config):
            assert cfg.block_m == 2 * HALF_M and cfg.block_n == 128
            self.dtype, self.D = dtype, head_dim
            self.causal, self.broadcast_q = causal, broadcast_q
            self.block_m, self.block_n = cfg.block_m, cfg.block_n
            self.stages = cfg.num_buffers_kv
            self.early_release = cfg.early_release
            self.direct = cfg.direct
            self.clc = cfg.clc and not cfg.direct   # direct: a CTA a tile, nothing to fetch
            self.clc_stages = 1
            self.pack = cfg.pack
            assert self.pack == 1 or (broadcast_q and HALF_M % self.pack == 0)
            # TMEM columns (fp32): S_0, S_1, O_0, O_1; P_s over S_s's upper half
            self.tmem_s = [0, self.block_n]
            self.tmem_o = [2 * self.block_n, 2 * self.block_n + head_dim]
            self.tmem_p = [c + self.block_n // 2 for c in self.tmem_s]
            self.tmem_total = self.tmem_o[1] + head_dim
            assert self.tmem_total <= TMEM_COLS
            self.cluster_shape = (1, 1, 1)
            self.num_threads = NUM_THREADS

        # ------------------------------------------------------------------ host side
        @cute.jit
        def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                     mO: cute.Tensor, mLSE: cute.Tensor, mCuQ: Optional[cute.Tensor],
                     mCuK: cute.Tensor, mPairs: cute.Tensor, mCount: cute.Tensor,
                     scale_log2: Float32, L_q: Int32, group: Int32, nblk: Int32,
                     num_programs: Int32, stream):
            D, dt, BN = self.D, self.dtype, self.block_n
            if const_expr(self.pack > 1):
                mO, mLSE = packed_views(mO, mLSE, self.pack)
            # [tokens, heads, D] -> (tokens, D, heads); V as (D, tokens, heads): the PV
            # MMA reads V MN-major
            mQ, mK, mO = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[0, 2, 1]))
                          for t in (mQ, mK, mO)]
            mVt = cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[2, 0, 1]))
            one = tcgen05.CtaGroup.ONE
            K_major, MN_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
            self.tiler_qk = (HALF_M, BN, D)
            self.tiler_pv = (HALF_M, D, BN)
            tiled_mma_qk = sm100.make_trivial_tiled_mma(dt, dt, K_major, K_major, Float32,
                                                        one, self.tiler_qk[:2])
            tiled_mma_pv = sm100.make_trivial_tiled_mma(dt, dt, K_major, MN_major, Float32,
                                                        one, self.tiler_pv[:2],
                                                        tcgen05.OperandSource.TMEM)
            sQ_layout = sm100.make_smem_layout_a(tiled_mma_qk, self.tiler_qk, dt, 2)
            sK_layout = sm100.make_smem_layout_b(tiled_mma_qk, self.tiler_qk, dt, self.stages)
            sV_layout = sm100.make_smem_layout_b(tiled_mma_pv, self.tiler_pv, dt, self.stages)
            tP_layout = sm100.make_smem_layout_a(tiled_mma_pv, self.tiler_pv, dt, 1)
            vmnk = cute.tiled_divide(cute.make_layout(self.cluster_shape),
                                     (tiled_mma_qk.thr_id.shape,))
            g2s = cpasync.CopyBulkTensorTileG2SOp(one)
            tma_atom_Q, tma_Q = cute.nvgpu.make_tiled_tma_atom_A(
                g2s, mQ, cute.select(sQ_layout, mode=[0, 1, 2]), self.tiler_qk, tiled_mma_qk,
                vmnk.shape)
            tma_atom_K, tma_K = cute.nvgpu.make_tiled_tma_atom_B(
                g2s, mK, cute.select(sK_layout, mode=[0, 1, 2]), self.tiler_qk, tiled_mma_qk,
                vmnk.shape)
            tma_atom_V, tma_V = cute.nvgpu.make_tiled_tma_atom_B(
                g2s, mVt, cute.select(sV_layout, mode=[0, 1, 2]), self.tiler_pv, tiled_mma_pv,
                vmnk.shape)
            self.bytes_Q = cute.size_in_bytes(dt, cute.select(sQ_layout, mode=[0, 1, 2]))
            self.bytes_KV = cute.size_in_bytes(dt, cute.select(sK_layout, mode=[0, 1, 2]))
            kv_elems = cutlass.max(cute.cosize(sK_layout), cute.cosize(sV_layout))

            @cute.struct
            class SharedStorage:
                mbar_q: cute.struct.MemRange[cutlass.Int64, 2 * 2]
                mbar_kv: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
                mbar_s_p: cute.struct.MemRange[cutlass.Int64, 2 * 2]
                mbar_o: cute.struct.MemRange[cutlass.Int64, 2 * 2]
                mbar_stats: cute.struct.MemRange[cutlass.Int64, 2 * 2]
                mbar_clc: cute.struct.MemRange[cutlass.Int64, 2 * self.clc_stages]
                clc_response: cute.struct.Align[
                    cute.struct.MemRange[Int32, 4 * self.clc_stages], 16]
                tmem_holding: Int32
                # [row, (scale or sum, max), half]
                stats: cute.struct.MemRange[Float32, HALF_M * 2 * 2]
                sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
                sKV: cute.struct.Align[cute.struct.MemRange[dt, kv_elems], 1024]

            self.shared_storage = SharedStorage
            self.launch(self.kernel(
                tma_Q, tma_K, tma_V, mO, mLSE, mCuQ, mCuK, mPairs, mCount,
                tma_atom_Q, tma_atom_K, tma_atom_V, scale_log2, L_q, group, nblk,
                sQ_layout, sK_layout, sV_layout, tP_layout, tiled_mma_qk, tiled_mma_pv,
                SharedStorage,
            ), num_programs, stream, use_pdl=True)

        # ------------------------------------------------------------------ the kernel
        @cute.kernel
        def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                   mO: cute.Tensor, mLSE: cute.Tensor, mCuQ: Optional[cute.Tensor],
                   mCuK: cute.Tensor, mPairs: cute.Tensor, mCount: cute.Tensor,
                   tma_atom_Q: cute.CopyAtom, tma_atom_K: cute.CopyAtom,
                   tma_atom_V: cute.CopyAtom, scale_log2: Float32, L_q: Int32,
                   group: Int32, nblk: Int32,
                   sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
                   sV_layout: cute.ComposedLayout, tP_layout: cute.ComposedLayout,
                   tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma,
                   SharedStorage: cutlass.Constexpr):
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            if const_expr(self.direct):  # every pair: B * nblk (mPairs, mCount unused)
                sched = Sched(None, ((mCuK.shape[0] - 1) * nblk,), mCuQ, mCuK, L_q,
                              mQ.shape[2], group, nblk)
            else:
                sched = Sched(mPairs, mCount, mCuQ, mCuK, L_q, mQ.shape[2], group, nblk)
            if warp == LOAD_WARP:
                for a in (tma_atom_Q, tma_atom_K, tma_atom_V):
                    cpasync.prefetch_descriptor(a)
            smem = cutlass.utils.SmemAllocator()
            storage = smem.allocate(SharedStorage)

            Group = pipeline.CooperativeGroup
            T = pipeline.Agent.Thread
            one_thread, rows = Group(T, 1), Group(T, HALF_M)
            # Q, K/V: load (TMA bytes) -> mma (tcgen05.commit frees the slot)
            pipe_q = self.tma_to_mma(storage.mbar_q, 2, self.bytes_Q)
            pipe_kv = self.tma_to_mma(storage.mbar_kv, self.stages, self.bytes_KV)
            # per half s: full = S_s written (mma commit -> softmax s),
            #             empty = P_s written (softmax s, 128 threads -> mma)
            pipe_s_p = self.mma_to(storage.mbar_s_p, 2, HALF_M)
            # per half s: full = PV into O_s done (mma commit -> correction),
            #             empty = O_s rescaled or read out (correction, 128 threads -> mma)
            pipe_o = self.mma_to(storage.mbar_o, 2, HALF_M)
            # per half s: full = stats written (softmax s -> correction),
            #             empty = stats read (correction -> softmax s); 128 threads each
            pipe_stats = pipeline.PipelineAsync.create(
                barrier_storage=storage.mbar_stats.data_ptr(), num_stages=2,
                producer_group=rows, consumer_group=rows, defer_sync=True)
            # the next tile id: schedule warp (CLC response bytes) -> every thread of the
            # 15 role warps
            pipe_clc = pipeline.PipelineClcFetchAsync.create(
                barrier_storage=storage.mbar_clc.data_ptr(), num_stages=self.clc_stages,
                producer_group=one_thread, consumer_group=Group(T, 15 * 32), tx_count=16,
                cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)), defer_sync=True)
            tmem, tmem_barrier = self.tmem_allocator(storage, TMEM_BARRIER, MMA_WARP)
            pipeline.pipeline_init_arrive()
            pipeline.pipeline_init_wait()
            # a programmatic dependent of the tile-list kernel (jagged.tiles PDL): global
            # memory (the tile count first) only once the kernels ahead have finished.
            # direct: the kernel ahead is the offsets check, and only `store` waits for it
            if const_expr(not self.direct):
                cute.arch.griddepcontrol_wait()

            sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            sK = storage.sKV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
            sV = storage.sKV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
            sStats = storage.stats.get_tensor(cute.make_layout((HALF_M, 2, 2)))
            resp = storage.clc_response.data_ptr()
            clc = (pipe_clc, resp)

            if cute.arch.block_idx()[0] < self.n_tiles(sched):
                if warp >= 12:
                    cute.arch.setmaxregister_decrease(OTHER_REGS)
                    if warp == MMA_WARP:
                        tmem_ptr = self.tmem_acquire(tmem, tmem_barrier, TMEM_COLS)
                        self.mma(tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, tP_layout,
                                 pipe_q, pipe_kv, pipe_s_p, pipe_o, sched, clc)
                        self.tmem_release(tmem, tmem_barrier, tmem_ptr)
                    if warp == LOAD_WARP:
                        self.load(tiled_mma_qk, tiled_mma_pv, mQ, mK, mV, sQ, sK, sV,
                                  tma_atom_Q, tma_atom_K, tma_atom_V, pipe_q, pipe_kv, sched,
                                  clc)
                    if warp == SCHEDULE_WARP:
                        self.schedule_clc(sched, clc)
                elif warp >= CORRECTION_WARP:
                    cute.arch.setmaxregister_decrease(CORRECTION_REGS)
                    tmem_barrier.arrive_and_wait()
                    self.correction(tiled_mma_pv, mO, mLSE, sStats, pipe_o, pipe_stats,
                                    scale_log2, sched, clc)
                    tmem_barrier.arrive()
                else:
                    cute.arch.setmaxregister_increase(SOFTMAX_REGS)
                    tmem_barrier.arrive_and_wait()
                    half = warp // 4
                    self.softmax(tiled_mma_qk, half, sStats, pipe_s_p, pipe_stats,
                                 scale_log2, sched, clc)
                    tmem_barrier.arrive()

        # ------------------------------------------------------------------ schedule
        def n_tiles(self, sched: Sched):
            """Valid pairs x heads: the walk ends at the first tile id at or past it."""
            return sched.mCount[0] * sched.H

        @cute.jit
        def tile_at(self, tile: Int32, sched: Sched) -> Tile:
            return tile_of(tile, sched, self.block_m, self.block_n, self.causal,
                           self.broadcast_q, self.pack, self.direct)

        @cute.jit
        def next_tile(self, tile: Int32, i: Int32, sched: Sched, clc):
            """The CTA's (i + 1)-th tile: the id of the CTA the schedule warp's i-th CLC
            query cancelled (none left: n_tiles, which ends every role's walk)."""
            if const_expr(self.clc):
                pipe_clc, resp = clc
                s, ph = i % self.clc_stages, (i // self.clc_stages) % 2
                pipe_clc.sync_object_full.wait(s, ph)
                x, _, _, valid = cute.arch.clc_response(self.clc_slot(resp, s))
                # this read (generic proxy) before the next query's write (async proxy)
                cute.arch.fence_proxy("async.shared", space="cta")
                pipe_clc.sync_object_empty.arrive(s, None)
                tile = x if valid != 0 else self.n_tiles(sched)
            else:
                tile = tile + cute.arch.grid_dim()[0]
            return tile

        def clc_slot(self, resp, s):
            """Response slot s (16 bytes, 16-byte aligned: read as one 128-bit word)."""
            return resp if const_expr(self.clc_stages == 1) else (resp + 4 * s).align(16)

        @cute.jit
        def schedule_clc(self, sched: Sched, clc):
            """One CLC query per tile this CTA takes, one response slot at a time."""
            if const_expr(self.clc):
                pipe_clc, resp = clc
                n_tiles = self.n_tiles(sched)
                tile = cute.arch.block_idx()[0]
                i = Int32(0)
                while tile < n_tiles:
                    s, ph = i % self.clc_stages, (i // self.clc_stages) % 2
                    pipe_clc.sync_object_empty.wait(s, ph ^ 1)
                    with cute.arch.elect_one():
                        pipe_clc.sync_object_full.arrive_and_expect_tx(s, 16)
                        cute.arch.issue_clc_query(pipe_clc.sync_object_full.get_barrier(s),
                                                  self.clc_slot(resp, s), multicast=False)
                    tile = self.next_tile(tile, i, sched, clc)
                    i += 1

        # ------------------------------------------------------------------ load
        @cute.jit
        def load(self, tiled_mma_qk, tiled_mma_pv, mQ, mK, mVt, sQ, sK, sV, tma_atom_Q,
                 tma_atom_K, tma_atom_V, pipe_q, pipe_kv, sched, clc):
            BN, D = self.block_n, self.D
            thr_qk, thr_pv = tiled_mma_qk.get_slice(0), tiled_mma_pv.get_slice(0)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 2)
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                    self.stages)
            n_tiles = self.n_tiles(sched)
            tile = cute.arch.block_idx()[0]
            i = Int32(0)
            while tile < n_tiles:
                t = self.tile_at(tile, sched)
                if t.n_end > 0:
                    # K / V: (block_n, D) boxes from the sequence's first key; boxes past
                    # its end read the next sequence's keys (masked) or TMA's zero fill
                    gK = head_tile(mK, t.seq.k_start, t.hk, BN, D, (None, 0))
                    gV = cute.local_tile(
                        cute.domain_offset((0, t.seq.k_start), mVt[None, None, t.hk]),
                        (D, BN), (0, None))
                    tKsK, tKgK = cpasync.tma_partition(
                        tma_atom_K, 0, cute.make_layout(1), cute.group_modes(sK, 0, 3),
                        cute.group_modes(thr_qk.partition_B(gK), 0, 3))
                    tVsV, tVgV = cpasync.tma_partition(
                        tma_atom_V, 0, cute.make_layout(1), cute.group_modes(sV, 0, 3),
                        cute.group_modes(thr_pv.partition_B(gV), 0, 3))
                    q_state = self.load_q(0, t, mQ, sQ, tma_atom_Q, thr_qk, pipe_q, q_state)
                    kv_state = self.load_kv(tma_atom_K, tKgK[None, 0], tKsK, pipe_kv,
                                            kv_state)
                    q_state = self.load_q(1, t, mQ, sQ, tma_atom_Q, thr_qk, pipe_q, q_state)
                    kv_state = self.load_kv(tma_atom_V, tVgV[None, 0], tVsV, pipe_kv,
                                            kv_state)
                    for n in cutlass.range(1, t.n_end, unroll=1):
                        kv_state = self.load_kv(tma_atom_K, tKgK[None, n], tKsK, pipe_kv,
                                                kv_state)
                        kv_state = self.load_kv(tma_atom_V, tVgV[None, n], tVsV, pipe_kv,
                                                kv_state)
                tile = self.next_tile(tile, i, sched, clc)
                i += 1

        @cute.jit
        def load_q(self, half: cutlass.Constexpr, t: Tile, mQ, sQ, tma_atom_Q, thr_qk,
                   pipe_q, q_state):
            """Q_half: the (128, D) box at row q_start + m0 + 128 * half of head h."""
            gQ = head_tile(mQ, t.seq.q_start + t.m0 + half * HALF_M, t.h, HALF_M, self.D)
            tQsQ, tQgQ = cpasync.tma_partition(
                tma_atom_Q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 3),
                cute.group_modes(thr_qk.partition_A(gQ), 0, 3))
            pipe_q.producer_acquire(q_state)
            cute.copy(tma_atom_Q, tQgQ, tQsQ[None, q_state.index],
                      tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
            q_state.advance()
            return q_state

        @cute.jit
        def load_kv(self, tma_atom, src, dst, pipe_kv, kv_state):
            pipe_kv.producer_acquire(kv_state)
            cute.copy(tma_atom, src, dst[None, kv_state.index],
                      tma_bar_ptr=pipe_kv.producer_get_barrier(kv_state))
            kv_state.advance()
            return kv_state

        # ------------------------------------------------------------------ mma
        @cute.jit
        def mma(self, tiled_mma_qk, tiled_mma_pv, sQ, sK, sV, tP_layout, pipe_q, pipe_kv,
                pipe_s_p, pipe_o, sched, clc):
            thr_qk, thr_pv = tiled_mma_qk.get_slice(0), tiled_mma_pv.get_slice(0)
            tSrQ = thr_qk.make_fragment_A(sQ)
            tSrK = thr_qk.make_fragment_B(sK)
            tOrV = thr_pv.make_fragment_B(sV)
            tStS = thr_qk.make_fragment_C(thr_qk.partition_shape_C(self.tiler_qk[:2]))
            tOtO = thr_pv.make_fragment_C(thr_pv.partition_shape_C(self.tiler_pv[:2]))
            tOrP = thr_pv.make_fragment_A(cute.make_tensor(tStS.iterator, tP_layout.outer))
            tOrP = tOrP[None, None, None, 0]
            ratio = Float32.width // self.dtype.width       # 16-bit P per fp32 column
            S = [cute.make_tensor(tStS.iterator + c, tStS.layout) for c in self.tmem_s]
            O = [cute.make_tensor(tOtO.iterator + c, tOtO.layout) for c in self.tmem_o]
            P = [cute.make_tensor(tOrP.iterator + c * ratio, tOrP.layout) for c in self.tmem_p]

            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 2)
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                    self.stages)
            steps = Int32(0)        # S_s commits so far (per half: the same count)
            pvs = Int32(0)          # PV_s issued so far (per half)
            n_tiles = self.n_tiles(sched)
            tile = cute.arch.block_idx()[0]
            i = Int32(0)
            while tile < n_tiles:
                t = self.tile_at(tile, sched)
                if t.n_end > 0:
                    # prologue: S_s(0) = Q_s K_0
                    pipe_kv.consumer_wait(kv_state)
                    k_idx = kv_state.index
                    for s in cutlass.range_constexpr(2):
                        q_idx = q_state.index
                        pipe_q.consumer_wait(q_state)
                        self.qk(tiled_mma_qk, S[s], tSrQ[None, None, None, q_idx],
                                tSrK[None, None, None, k_idx], pipe_s_p, s,
                                t.m0 + s * HALF_M < t.seq.len_q)
                        if t.n_end == 1:
                            pipe_q.consumer_release(q_state)
                        q_state.advance()
                    steps += 1
                    pipe_kv.consumer_release(kv_state)
                    kv_state.advance()
                    # step n: PV_s(n - 1) = P_s V_(n-1), then S_s(n) = Q_s K_n
                    for n in cutlass.range(1, t.n_end + 1, unroll=1):
                        v_state = kv_state.clone()
                        pipe_kv.consumer_wait(v_state)
                        kv_state.advance()
                        has_k = n < t.n_end
                        if has_k:
                            pipe_kv.consumer_wait(kv_state)
                        for s in cutlass.range_constexpr(2):
                            # P_s(n - 1) written, O_s rescaled (or, at n = 1, read out
                            # by the previous tile's store)
                            pipe_s_p.sync_object_empty.wait(s, (steps - 1) % 2)
                            pipe_o.sync_object_empty.wait(s, (pvs % 2) ^ 1)
                            tc_fence_after()
                            if t.m0 + s * HALF_M < t.seq.len_q:
                                self.gemm(tiled_mma_pv, O[s], P[s],
                                          tOrV[None, None, None, v_state.index], n > 1)
                            pipe_o.sync_object_full.arrive(s, pipe_o.producer_mask,
                                                           pipe_o.cta_group)
                            if has_k:
                                self.qk(tiled_mma_qk, S[s],
                                        tSrQ[None, None, None, s],
                                        tSrK[None, None, None, kv_state.index],
                                        pipe_s_p, s, t.m0 + s * HALF_M < t.seq.len_q)
                        pvs += 1
                        pipe_kv.consumer_release(v_state)
                        if has_k:
                            steps += 1
                            if n == t.n_end - 1:        # Q's last use: free both slots
                                for s in cutlass.range_constexpr(2):
                                    pipe_q.sync_object_empty.arrive(
                                        s, pipe_q.consumer_mask, pipe_q.cta_group)
                            pipe_kv.consumer_release(kv_state)
                            kv_state.advance()
                tile = self.next_tile(tile, i, sched, clc)
                i += 1

        @cute.jit
        def qk(self, tiled_mma_qk, acc, tA, tB, pipe_s_p, s: cutlass.Constexpr, live):
            """S_s = Q_s K^T (a half without rows: the hand-over only), committed to
            softmax s."""
            if live:
                self.gemm(tiled_mma_qk, acc, tA, tB, False)
            pipe_s_p.sync_object_full.arrive(s, pipe_s_p.producer_mask, pipe_s_p.cta_group)

        # ------------------------------------------------------------------ softmax
        @cute.jit
        def softmax(self, tiled_mma_qk, half, sStats, pipe_s_p, pipe_stats, scale_log2,
                    sched, clc):
            BN = self.block_n
            tidx = cute.arch.thread_idx()[0] % HALF_M      # = TMEM lane = row in the half
            thr_qk = tiled_mma_qk.get_slice(0)
            tStS = thr_qk.make_fragment_C(thr_qk.partition_shape_C(self.tiler_qk[:2]))
            tSAcc = tStS[(None, None), 0, 0]
            tSAcc = cute.make_tensor(tSAcc.iterator + half * BN, tSAcc.layout)
            tScS = thr_qk.partition_C(cute.make_identity_tensor(self.tiler_qk[:2]))
            tScS = tScS[(None, None), 0, 0]
            ld = tcgen05.make_tmem_copy(cute.make_copy_atom(
                tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(32)), Float32), tSAcc
            ).get_slice(tidx)
            tStS_t2r = ld.partition_S(tSAcc)
            tScS_t2r = ld.partition_D(tScS)
            tStP = cute.make_tensor(tSAcc.iterator + BN // 2, cute.composition(
                tSAcc.layout, cute.make_layout((HALF_M, BN // 2))))
            st = tcgen05.make_tmem_copy(cute.make_copy_atom(
                tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(16)), Float32), tStP
            ).get_slice(tidx)
            tStP_r2t = st.partition_D(tStP)
            p_shape = st.partition_S(cute.make_identity_tensor((HALF_M, BN // 2))).shape

            steps = Int32(0)
            events = Int32(0)       # stats hand-overs to correction so far
            n_tiles = self.n_tiles(sched)
            tile = cute.arch.block_idx()[0]
            i = Int32(0)
            while tile < n_tiles:
                t = self.tile_at(tile, sched)
                row = t.m0 + half * HALF_M + tScS_t2r[0][0]
                n_bulk = t.n_bulk0 if half == 0 else t.n_bulk1
                row_max = Float32(-Float32.inf)
                row_sum = Float32(0.0)
                if t.m0 + half * HALF_M < t.seq.len_q:
                    for n in cutlass.range(n_bulk, unroll=1):                      # bulk
                        row_max, row_sum, events = self.softmax_step(
                            False, n, row, t, row_max, row_sum, steps, events, half, sStats,
                            pipe_s_p, pipe_stats, scale_log2, ld, tStS_t2r, tScS_t2r, st,
                            tStP_r2t, p_shape)
                        steps += 1
                    for n in cutlass.range(n_bulk, t.n_end, unroll=1):             # tail
                        row_max, row_sum, events = self.softmax_step(
                            True, n, row, t, row_max, row_sum, steps, events, half, sStats,
                            pipe_s_p, pipe_stats, scale_log2, ld, tStS_t2r, tScS_t2r, st,
                            tStP_r2t, p_shape)
                        steps += 1
                else:
                    # a half past the sequence's last row (mma skipped its MMAs): the
                    # same hand-overs, factor 1 (correction skips the rescale)
                    for n in cutlass.range(t.n_end, unroll=1):
                        pipe_s_p.sync_object_full.wait(half, steps % 2)
                        if n > 0:
                            pipe_stats.sync_object_empty.wait(half, (events % 2) ^ 1)
                            sStats[tidx, 0, half] = Float32(1.0)
                            pipe_stats.sync_object_full.arrive(half, None)
                            events += 1
                        pipe_s_p.sync_object_empty.arrive(half, None)
                        steps += 1
                # the tile's row sum and max (the store's normalizer and LSE)
                pipe_stats.sync_object_empty.wait(half, (events % 2) ^ 1)
                sStats[tidx, 0, half] = row_sum
                sStats[tidx, 1, half] = row_max
                pipe_stats.sync_object_full.arrive(half, None)
                events += 1
                tile = self.next_tile(tile, i, sched, clc)
                i += 1

        @cute.jit
        def softmax_step(self, masked: cutlass.Constexpr, n, row, t: Tile, row_max, row_sum,
                         steps, events, half, sStats, pipe_s_p, pipe_stats, scale_log2, ld,
                         tStS_t2r, tScS_t2r, st, tStP_r2t, p_shape):
            """Block n of half `half`: S from TMEM, (mask,) new row max, the rescale factor
            to correction (n > 0), P = exp2(S - max) back into TMEM, then P ready."""
            BN = self.block_n
            tidx = cute.arch.thread_idx()[0] % HALF_M
            pipe_s_p.sync_object_full.wait(half, steps % 2)
            tc_fence_after()
            tSrS = cute.make_rmem_tensor(tScS_t2r.shape, Float32)
            cute.copy(ld, tStS_t2r, tSrS)
            cute.arch.fence_view_async_tmem_load()
            if const_expr(masked):
                end = t.seq.len_k
                if const_expr(self.causal):
                    end = t.seq.row_kv_end(row, self.pack)
                limit = end - n * BN
                for c in cutlass.range_constexpr(cute.size(tSrS)):
                    tSrS[c] = -Float32.inf if tScS_t2r[c][1] >= limit else tSrS[c]
            m_new = tSrS.load().reduce(cute.ReductionOp.MAX, row_max, 0)
            m_safe = 0.0 if m_new == -Float32.inf else m_new      # no key seen yet
            scale = cute.math.exp2((row_max - m_safe) * scale_log2, fastmath=True)
            if n > 0:
                pipe_stats.sync_object_empty.wait(half, (events % 2) ^ 1)
                sStats[tidx, 0, half] = scale
                pipe_stats.sync_object_full.arrive(half, None)
                events += 1
            m_scaled = m_safe * scale_log2
            # P chunk by chunk (32 columns: a TMEM store of 16 packed words each), the row
            # sum from the fp32 values; P's registers alias the S layout in 16 bits
            tSrP32 = cute.make_rmem_tensor(p_shape, Float32)
            tSrP = cute.make_tensor(cute.recast_ptr(tSrP32.iterator, dtype=self.dtype),
                                    tSrS.layout)
            acc = row_sum * scale
            for k in cutlass.range_constexpr(cute.size(tSrS, mode=[2])):
                chunk = tSrS[None, None, k]
                for c in cutlass.range_constexpr(cute.size(chunk)):
                    chunk[c] = cute.math.exp2(chunk[c] * scale_log2 - m_scaled, fastmath=True)
                p = chunk.load()
                acc += p.reduce(cute.ReductionOp.ADD, 0.0, 0)
                tSrP[None, None, k].store(p.to(self.dtype))
                cute.copy(st, tSrP32[None, None, k], tStP_r2t[None, None, k])
            cute.arch.fence_view_async_tmem_store()
            pipe_s_p.sync_object_empty.arrive(half, None)
            return m_new, acc, events

        # ------------------------------------------------------------------ correction
        @cute.jit
        def correction(self, tiled_mma_pv, mO, mLSE, sStats, pipe_o, pipe_stats, scale_log2,
                       sched, clc):
            tidx = cute.arch.thread_idx()[0] % HALF_M
            thr_pv = tiled_mma_pv.get_slice(0)
            tOtO = thr_pv.make_fragment_C(thr_pv.partition_shape_C(self.tiler_pv[:2]))
            tOacc = tOtO[(None, None), 0, 0]
            tOcO = thr_pv.partition_C(cute.make_identity_tensor(self.tiler_pv[:2]))
            tOcO = tOcO[(None, None), 0, 0]
            ld = tcgen05.make_tmem_copy(cute.make_copy_atom(
                tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(32)), Float32), tOacc
            ).get_slice(tidx)
            st = tcgen05.make_tmem_copy(cute.make_copy_atom(
                tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(32)), Float32), tOacc
            ).get_slice(tidx)
            tOcO_t2r = ld.partition_D(tOcO)
            O_t2r = [ld.partition_S(cute.make_tensor(tOacc.iterator + c, tOacc.layout))
                     for c in self.tmem_o]
            O_r2t = [st.partition_D(cute.make_tensor(tOacc.iterator + c, tOacc.layout))
                     for c in self.tmem_o]

            events = Int32(0)       # stats hand-overs read (per half: the same count)
            pvs = Int32(0)          # O_full waits (per half)
            n_tiles = self.n_tiles(sched)
            tile = cute.arch.block_idx()[0]
            i = Int32(0)
            while tile < n_tiles:
                t = self.tile_at(tile, sched)
                for n in cutlass.range(1, t.n_end, unroll=1):
                    for s in cutlass.range_constexpr(2):
                        pipe_stats.sync_object_full.wait(s, events % 2)
                        scale = sStats[tidx, 0, s]
                        pipe_stats.sync_object_empty.arrive(s, None)
                        pipe_o.sync_object_full.wait(s, pvs % 2)
                        tc_fence_after()
                        self.rescale(ld, st, O_t2r[s], O_r2t[s], tOcO_t2r, scale)
                        pipe_o.sync_object_empty.arrive(s, None)
                    events += 1
                    pvs += 1
                for s in cutlass.range_constexpr(2):
                    pipe_stats.sync_object_full.wait(s, events % 2)
                    row_sum = sStats[tidx, 0, s]
                    row_max = sStats[tidx, 1, s]
                    pipe_stats.sync_object_empty.arrive(s, None)
                    self.store(s, t, ld, O_t2r[s], tOcO_t2r, row_sum, row_max, scale_log2,
                               mO, mLSE, pipe_o, pvs)
                events += 1
                if t.n_end > 0:
                    pvs += 1
                tile = self.next_tile(tile, i, sched, clc)
                i += 1

        @cute.jit
        def rescale(self, ld, st, tOtO_t2r, tOtO_r2t, tOcO_t2r, scale):
            """O_s *= scale, a row per thread, 32 columns at a time (skipped when no row of
            the warp changed its max)."""
            if cute.arch.vote_any_sync(scale != 1.0):
                for k in cutlass.range_constexpr(cute.size(tOtO_t2r, mode=[2])):
                    r = cute.make_rmem_tensor(tOcO_t2r[None, None, 0].shape, Float32)
                    cute.copy(ld, tOtO_t2r[None, None, k], r)
                    cute.arch.fence_view_async_tmem_load()
                    r.store(r.load() * scale)
                    cute.copy(st, r, tOtO_r2t[None, None, k])
                cute.arch.fence_view_async_tmem_store()

        # ------------------------------------------------------------------ store
        @cute.jit
        def store(self, s: cutlass.Constexpr, t: Tile, ld, tOtO_t2r, tOcO_t2r, row_sum,
                  row_max, scale_log2, mO, mLSE, pipe_o, pvs):
            """O_s / rowsum and LSE out for half s; rows at or past len_q are never written.
            O_s goes back to mma once read (early_release) or once stored."""
            r_in = t.m0 + s * HALF_M + tOcO_t2r[0][0]
            empty = row_sum == 0.0
            inv = 0.0 if empty else cute.arch.rcp_approx(row_sum)
            lse = -Float32.inf if empty else (
                row_max * scale_log2 + cute.math.log2(row_sum, fastmath=True)) * LN_2
            rO = cute.make_rmem_tensor((self.D,), self.dtype)
            chunks = cute.size(tOtO_t2r, mode=[2])
            per = self.D // chunks
            if t.n_end > 0:
                pipe_o.sync_object_full.wait(s, pvs % 2)
                tc_fence_after()
                for k in cutlass.range_constexpr(chunks):
                    r = cute.make_rmem_tensor(tOcO_t2r[None, None, 0].shape, Float32)
                    cute.copy(ld, tOtO_t2r[None, None, k], r)
                    cute.arch.fence_view_async_tmem_load()
                    for c in cutlass.range_constexpr(per):
                        rO[k * per + c] = (r[c] * inv).to(self.dtype)
                if const_expr(self.early_release):
                    pipe_o.sync_object_empty.arrive(s, None)
            else:
                rO.fill(0.0)
            if const_expr(self.direct):  # no write before the offsets check has passed
                cute.arch.griddepcontrol_wait()
            if r_in < t.seq.len_q:
                out_row = t.seq.out_start + r_in
                cute.autovec_copy(rO, mO[out_row, None, t.h])
                mLSE[t.h, out_row] = lse
            if const_expr(not self.early_release):
                if t.n_end > 0:
                    pipe_o.sync_object_empty.arrive(s, None)

    return FwdBlackwell


# --------------------------------------------------------------------------------------
# Host: compile once per config, then launch
# --------------------------------------------------------------------------------------

def build(dtype, head_dim: int, causal: bool, broadcast_q: bool, cfg: Config | None = None):
    """The kernel object (its tmem_total, shared_storage and cluster_shape are set once
    compiled)."""
    cfg = CONFIGS[(head_dim, bool(causal))] if cfg is None else cfg
    return _kernel_class()(host.cute_dtype(dtype), head_dim, causal, broadcast_q, cfg)


def compile_forward(dtype, head_dim: int, causal: bool, broadcast_q: bool,
                    cfg: Config | None = None, options: str = "", kernel=None):
    """Compile (no GPU needed with CUTE_DSL_ARCH=sm_100a) and return the callable."""
    fwd = build(dtype, head_dim, causal, broadcast_q, cfg) if kernel is None else kernel
    return host.compile_fwd(fwd, broadcast_q, head_dim, options)


def programs(cfg: Config, n_tiles: int, device) -> int:
    """CLC: a CTA per tile of the upper bound (those past the device-side count exit at
    once); static: one per SM. direct (one wave): a CTA a tile either way."""
    return n_tiles if cfg.clc else host.persistent_programs(cfg, n_tiles, device)


KERNELS = host.FwdKernels(pick_config, partial(host.compiled, _COMPILED, compile_forward),
                          programs, pack_gqa=True, direct=True)


def forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q):
    """-> (out [Nq, H, D], lse [H, Nq] fp32); Nq = B * L_q in broadcast-Q mode."""
    if q.dtype not in DTYPES:
        raise TypeError(f"the CuteDSL Blackwell forward takes bf16 or fp16, got {q.dtype}")
    return host.forward(KERNELS, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale,
                        broadcast_q)
