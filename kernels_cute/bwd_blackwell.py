"""Jagged (varlen, packed) flash-attention backward for Blackwell (sm_100a), in CuteDSL.

    backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale,
             broadcast_q, dlse=None) -> (dq, dk, dv)          # in q's dtype

Compiled for sm_100a, not run: no B200 was available; the `-m gpu` test
(tests/test_bwd_blackwell_cute.py) checks it against harness/oracle.py on one.

The same contract, tile list (jagged.tiles.kv_tiles, longest first), static persistent
walk (schedule.tile_range: one CTA per SM; broadcast-Q CTAs pinned to a KV head, sharing
its dQ slots, jagged.tiles.dq_slots) and preprocess / postprocess kernels as
`bwd_hopper.py` (imported: they are plain SIMT code); in the packed modes the three chain
as programmatic dependent launches, as there (jagged.tiles.bwd_dependent). The main kernel uses tcgen05 MMAs with the accumulators in tensor
memory (TMEM). A tile is 128 keys of one (sequence, KV head); a step is 128 query rows of
one query head of its group (GQA: the group's heads one after another, dK / dV summed in
TMEM and stored once). 12 warps:

    warps 0-3   `compute`    thread = key (TMEM lane): S^T and dP^T rows from TMEM in
                             32-column chunks, P^T = exp2(S^T scale log2e - lse log2e)
                             (rows past the sequence get P = 0 through lse = +inf; the
                             masked steps also zero keys past it and, causal, the pairs
                             right of the diagonal), P^T (16-bit) back into TMEM over
                             S^T's upper columns, dS^T = P^T (dP^T - delta) (16-bit) into
                             smem; `store` at the tile's end: dK * scale, dV from TMEM to
                             global, rows predicated to the sequence
    warps 4-7   `reduce_dq`  thread = query row: the step's dQ from TMEM in 32-column
                             chunks, staged through two smem buffers, each reduce-added
                             into the fp32 accumulator by a TMA bulk tensor reduce
                             (cp.reduce.async.bulk.tensor.add.f32)
    warp 8      `mma`        allocates TMEM; per step S^T = K Q^T, dP^T = V dO^T, then
                             dV += P^T dO (P^T from TMEM), dK += dS^T Q, dQ = dS K
    warp 9      `load`       TMA: K, V once per tile; Q, dO per step into a
                             Config.q_stages ring; the step's lse log2e / delta rows into
                             smem (plain loads and stores)
    warps 10-11 idle

TMEM (fp32 columns, lane = key for S^T, dP^T, dV, dK; lane = query row for dQ):
S^T [0, 128), dP^T [128, 256), dV [256, 256 + D), dK [256 + D, 256 + 2D); P^T is the
16-bit view of S^T's columns [64, 128); dQ overlays dP^T's columns [128, 128 + D). All
512 columns are allocated.

Hand-overs (mbarriers, each waited in order; a consumer waits parity n % 2 for its n-th
hand-over, a producer (n % 2) ^ 1, which passes on a fresh barrier; "commit":
tcgen05.commit, one arrival when the issuing thread's earlier MMAs are done):

    pipe_kv   1 stage    load -> mma: TMA bytes of K and V (1 + tx)
                         mma -> load: commit after the tile's last MMA
    pipe_q    q_stages   load -> mma: TMA bytes of Q and dO (1 + tx)
                         mma -> load: commit after the step's dK MMA (the last reading them)
    pipe_ld   q_stages   load (32 threads) -> compute: lse / delta rows in smem
                         compute (128) -> load: read
    pipe_sdp  1          mma -> compute: commit of S^T and dP^T
                         compute (128) -> mma: P^T in TMEM, dS^T in smem, dP^T read
                         (mma waits it before dV / dK / dQ, and so before the next S^T)
    pipe_dq   1          mma -> reduce_dq: commit of dQ
                         reduce_dq (128) -> mma: dQ read out of TMEM (before the next dP^T)
    pipe_dkv  1          mma -> compute: commit after the tile's last dK
                         compute (128) -> mma: dK, dV read out (before the next tile's
                         first dV / dK, which overwrite them)
    bar 1     named      TMEM allocated (288: warps 0-8) / released (256 arrive + mma)
    bar 2     named      reduce_dq's 128 threads: a staging buffer written / free

Ordering that needs no barrier: MMAs issued by the one mma thread run in order, so dV
(reading P^T) precedes the next S^T (overwriting it); the commit that hands S^T(j + 1)
to compute covers dK(j) and dQ(j), the last readers of dS^T(j) in smem.

A tile whose sequence has no query block that sees it (n_m = 0) issues no MMA: `store`
writes dK = dV = 0 without a hand-over. Per tile with s = group * n_m > 0 steps: one
K/V, s Q/dO and lse/delta, s S/dP, s dQ, one dK/dV hand-over.

The Q loop is split per head (`bulk_start`): of a tile's Q blocks m_lo, m_lo + 128, ...
the leading ones are masked (`mask_bound`: one compare and select a P^T element) and
the rest are the bulk, whose step has no mask code. Every block is masked on a tile that
reaches past the sequence's keys (its last); under causal, the blocks whose first row
does not see the tile's last key (at most two: the diagonal). The load, mma and
reduce_dq roles walk the same steps in the same order and do not tell them apart.

Pair build (`Config.two_cta`; `pick_config` takes it for broadcast-Q at D = 128 only):
a cluster of two CTAs (2, 1, 1) runs cta_group::2 MMAs, all issued by the leader (rank 0)
over both CTAs' smem (the same offsets in each) and TMEM. Broadcast-Q's KV tiles of any
sequences meet the one Q, so pair p (CTAs 2p, 2p + 1, pinned to a KV head and dQ slot
as a 1-CTA program is) takes tiles 2u, 2u + 1 of its head's list (past the end: a tile
of no keys at the tensor's end, its K / V zero-filled by TMA, every P = 0) and both
walk the pair's Q steps (from the lower of the two tiles' first blocks). Per step:

    S^T = K Q^T, dP^T = V dO^T   M = the pair's 256 keys (each CTA its tile's 128 in its
                                 TMEM), N = 128 queries: each CTA loads 64 rows of Q, dO
    dV += P^T dO, dK += dS^T Q   M = 256 keys, A = P^T, dS^T from each CTA's TMEM, N = D:
                                 each CTA loads its D half of all 128 rows of dO, Q
    dQ = dS K                    M = 128 queries (each CTA 64: lanes 0-63 D's first half,
                                 64-127 its second), K = the pair's 256 keys as two MMAs,
                                 one a tile; each CTA holds its D half of both tiles' K
                                 (loaded once a tile) and dS of its query half for both
                                 tiles' keys: compute keeps its own tile's half (smem
                                 stage `rank`) and sends the other (stage 2, one
                                 cp.async.bulk to the peer's stage `rank`, completing on
                                 the peer's `ds`)

So each CTA loads as many Q / dO bytes as a 1-CTA step, its MMAs read half of every B
operand from its own smem, and dQ, summed over both tiles in TMEM, is reduce-added once
a pair: 64 rows a CTA in (64, 32) boxes through one staging buffer. TMEM: S^T [0, 128)
with P^T over [0, 64), dP^T [128, 256) with dS^T over [128, 192) and dQ over [192, 256)
(compute's chunks ascending: chunk k lands on chunk k / 2, read), dV, dK as above.

Cross-CTA hand-overs (the rest as above, one stage each): TMA of both CTAs completes on
the leader's full barriers (one expect of both CTAs' bytes); the leader's commits
multicast to both CTAs' barriers (pipe_*_full, the empties of the TMA rings); compute,
reduce_dq and store of both CTAs arrive on the leader's empty barriers (256); the
leader waits before dQ for its `ds` (the peer's half landed) and `ds_pair`, on which
the peer's mma warp (otherwise idle) relays its own `ds`. The commit of S^T(j + 1)
follows both waits of step j, so no copy of step j still reads stage 2 or writes a
stage when compute rewrites them. TMEM is allocated and freed cta_group::2 (the pair's
dealloc handshake); both CTAs meet at a cluster barrier before they exit.

Not here: tiles are dealt statically (no Cluster Launch Control, no counter for causal
lists).
"""
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

from jagged.tiles import bwd_dependent, kv_tiles

from . import blackwell, bwd_hopper, host

LOG2E = 1.4426950408889634
BLOCK_N = 128           # keys per tile (the tcgen05 M of S^T, dP^T, dV, dK)
BLOCK_M = 128           # query rows per step (the M of dQ)
NUM_THREADS = 384
COMPUTE_WARP, REDUCE_WARP, MMA_WARP, LOAD_WARP = 0, 4, 8, 9
TMEM_COLS = 512
TMEM_BARRIER = 1        # named barriers (0 = syncthreads)
DQ_BARRIER = 2
XCHG_BARRIER = 3      # pair build: compute's 128 threads, dS half staged
DQ_WIDE = 32            # fp32 columns of a dQ reduce box (128 B, the swizzle span)


@dataclass(frozen=True)
class Config:
    q_stages: int       # Q / dO ring depth (two at D = 128 would need 258 KB of smem)
    two_cta: bool = False   # the pair build (broadcast-Q, D = 128; module docstring)


CONFIGS = {64: Config(q_stages=2), 128: Config(q_stages=1)}
TWO_CTA = Config(q_stages=1, two_cta=True)


def pick_config(head_dim: int, broadcast_q: bool = False) -> Config:
    """Broadcast-Q at D = 128 runs the pair build, every other call the 1-CTA one."""
    return TWO_CTA if broadcast_q and head_dim == 128 else CONFIGS[head_dim]


def pair_grid(grid: int, kv_heads: int) -> int:
    """The pair build's CTAs for a broadcast-Q grid of `grid` (jagged.tiles.dq_accumulator:
    programs pinned to kv_heads heads): two a pair, pairs pinned to the heads as programs
    are, at least one pair a head."""
    return 2 * max(1, grid // kv_heads // 2) * kv_heads


# role: schedule
class Sched(NamedTuple):
    """What every role needs to walk the tile list (schedule.tile_range, kv_tile_coords)."""
    mTileB: Any
    mTileN: Any
    mNTiles: Any
    mCuQ: Any
    mCuK: Any
    L_q: Any
    H: Any
    HKV: Any
    group: Any
    n_slots: Any  # broadcast-Q: the dQ accumulator's slots
    parts: int = 1  # CTAs a tile (jagged.tiles.bwd_parts; this build takes whole tiles)
    head_run: int = 1  # list entries a KV head in turn (this build: the heads innermost)


# role: compute
def bulk_start(seq, n0, m_lo, n_m, causal: bool, BM: int = BLOCK_M, BN: int = BLOCK_N):
    """The first bulk Q block of a tile's walk of one head: blocks [0, result) of m_lo,
    m_lo + BM, ... need the mask, blocks [result, n_m) none. Every block does when the tile
    reaches past the sequence's keys (n0 + BN > len_k); under causal, the blocks whose
    first row does not see the tile's last key (the diagonal; later rows see every key
    an earlier one does). Rows past len_q need no mask: lse = +inf gives them P = 0.
    Plain arithmetic: traced in a role, or run on ints (tests, harness/protocol/)."""
    from .seqinfo import _max, _min

    first = n_m * 0
    if causal:
        # rows [full, len_q) see keys [n0, n0 + BN); full >= causal_q_start(n0) >= m_lo
        full = seq.causal_q_start(n0 + BN - 1)
        first = _min((full - m_lo + BM - 1) // BM, n_m)
    past = _min(_max(n0 + BN - seq.len_k, 0), 1)            # 1: keys past the sequence
    return _max(first, past * n_m)


def mask_bound(seq, key, m0, causal: bool, BM: int = BLOCK_M):
    """A masked step (query rows m0 on) keeps key's P in the columns from the result on:
    the first row that sees it under causal, BM (none) for keys past the sequence."""
    from .seqinfo import _max, _min

    lo = key * 0
    if causal:
        lo = key - (seq.len_k - seq.len_q) - m0
    return _max(lo, _min(_max(key - seq.len_k + 1, 0), 1) * BM)


class StepIO(NamedTuple):
    """What a compute step reads and writes: the TMEM load / store copies (thread =
    key), S^T, dP^T and P^T in TMEM, the (key, query) coordinates of a loaded chunk, the
    packed P^T register shape, dS^T and the lse / delta rows in smem."""
    ld: Any
    tS: Any
    tdP: Any
    tcrd: Any
    st: Any
    tP: Any
    p_shape: Any
    sdSt: Any
    sLD: Any


_COMPILED = {}


def _kernel_class():
    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    import cutlass.utils.blackwell_helpers as sm100
    from cutlass import Float32, Int32, const_expr
    from cutlass.cute.nvgpu import cpasync, tcgen05

    from .fragments import element_swizzled, head_tile, tma_tiles
    from .blackwell import tc_fence_after
    from .schedule import kv_tile_coords, tile_range
    from .seqinfo import SeqlenInfo

    def with_cols(t, c):
        """The TMEM tensor t moved by c fp32 columns."""
        return cute.make_tensor(t.iterator + c, t.layout)

    class BwdBlackwell(blackwell.kernel_base()):
        def __init__(self, dtype, head_dim: int, causal: bool, broadcast_q: bool,
                     cfg: Config):
            self.dtype, self.D = dtype, head_dim
            self.causal, self.broadcast_q = causal, broadcast_q
            self.qs = cfg.q_stages
            self.tmem_s, self.tmem_dp = 0, BLOCK_N
            self.tmem_p = self.tmem_s + BLOCK_M // 2
            self.tmem_dq = self.tmem_dp
            self.tmem_dv = 2 * BLOCK_N
            self.tmem_dk = self.tmem_dv + head_dim
            self.tmem_total = self.tmem_dk + head_dim
            assert self.tmem_total <= TMEM_COLS
            self.cluster_shape = (1, 1, 1)
            self.num_threads = NUM_THREADS

        # ------------------------------------------------------------------ host side
        @cute.jit
        def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                     mdO: cute.Tensor, mLSE: cute.Tensor, mDelta: cute.Tensor,
                     mdQacc: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
                     mCuQ: cute.Tensor, mCuK: cute.Tensor, mTileB: cute.Tensor,
                     mTileN: cute.Tensor, mNTiles: cute.Tensor, scale: Float32, L_q: Int32,
                     n_slots: Int32, group: Int32, num_programs: Int32, stream):
            D, dt, QS = self.D, self.dtype, self.qs
            # [tokens, heads, D] -> (tokens, D, heads)
            mQ, mK, mV, mdO, mdQacc, mdK, mdV = [
                cute.make_tensor(t.iterator, cute.select(t.layout, mode=[0, 2, 1]))
                for t in (mQ, mK, mV, mdO, mdQacc, mdK, mdV)]
            one = tcgen05.CtaGroup.ONE
            Km, MNm = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
            # S^T = K Q^T, dP^T = V dO^T: M = keys, N = queries, K = D
            self.tiler_s = (BLOCK_N, BLOCK_M, D)
            # dV += P^T dO, dK += dS^T Q: M = keys, N = D, K = queries
            self.tiler_kv = (BLOCK_N, D, BLOCK_M)
            # dQ = dS K: M = queries, N = D, K = keys
            self.tiler_dq = (BLOCK_M, D, BLOCK_N)
            mma_s = sm100.make_trivial_tiled_mma(dt, dt, Km, Km, Float32, one,
                                                 self.tiler_s[:2])
            mma_dv = sm100.make_trivial_tiled_mma(dt, dt, Km, MNm, Float32, one,
                                                  self.tiler_kv[:2], tcgen05.OperandSource.TMEM)
            mma_dk = sm100.make_trivial_tiled_mma(dt, dt, Km, MNm, Float32, one,
                                                  self.tiler_kv[:2])
            mma_dq = sm100.make_trivial_tiled_mma(dt, dt, MNm, MNm, Float32, one,
                                                  self.tiler_dq[:2])
            sK_layout = sm100.make_smem_layout_a(mma_s, self.tiler_s, dt, 1)
            sV_layout = sm100.make_smem_layout_a(mma_s, self.tiler_s, dt, 1)
            sQ_layout = sm100.make_smem_layout_b(mma_s, self.tiler_s, dt, QS)
            sdO_layout = sm100.make_smem_layout_b(mma_s, self.tiler_s, dt, QS)
            # the same bytes as the MN-major operands of dV / dK / dQ
            sQt_layout = sm100.make_smem_layout_b(mma_dk, self.tiler_kv, dt, QS)
            sdOt_layout = sm100.make_smem_layout_b(mma_dv, self.tiler_kv, dt, QS)
            sKt_layout = sm100.make_smem_layout_b(mma_dq, self.tiler_dq, dt, 1)
            sdSt_layout = sm100.make_smem_layout_a(mma_dk, self.tiler_kv, dt, 1)
            sdS_layout = sm100.make_smem_layout_a(mma_dq, self.tiler_dq, dt, 1)
            tP_layout = sm100.make_smem_layout_a(mma_dv, self.tiler_kv, dt, 1)
            sdQ_layout = bwd_hopper.dq_smem_layout(DQ_WIDE, BLOCK_M)   # one staging buffer
            vmnk = cute.tiled_divide(cute.make_layout(self.cluster_shape),
                                     (mma_s.thr_id.shape,))
            g2s = cpasync.CopyBulkTensorTileG2SOp(one)
            sel = lambda l: cute.select(l, mode=[0, 1, 2])           # noqa: E731
            tma_atom_K, tma_K = cute.nvgpu.make_tiled_tma_atom_A(
                g2s, mK, sel(sK_layout), self.tiler_s, mma_s, vmnk.shape)
            tma_atom_V, tma_V = cute.nvgpu.make_tiled_tma_atom_A(
                g2s, mV, sel(sV_layout), self.tiler_s, mma_s, vmnk.shape)
            tma_atom_Q, tma_Q = cute.nvgpu.make_tiled_tma_atom_B(
                g2s, mQ, sel(sQ_layout), self.tiler_s, mma_s, vmnk.shape)
            tma_atom_dO, tma_dO = cute.nvgpu.make_tiled_tma_atom_B(
                g2s, mdO, sel(sdO_layout), self.tiler_s, mma_s, vmnk.shape)
            tma_atom_dQ, tma_dQ = cpasync.make_tiled_tma_atom(
                cpasync.CopyReduceBulkTensorTileS2GOp(), mdQacc, sdQ_layout,
                (BLOCK_M, DQ_WIDE), 1)
            self.bytes_KV = 2 * cute.size_in_bytes(dt, sel(sK_layout))
            self.bytes_Q = 2 * cute.size_in_bytes(dt, sel(sQ_layout))

            @cute.struct
            class SharedStorage:
                mbar_kv: cute.struct.MemRange[cutlass.Int64, 2]
                mbar_q: cute.struct.MemRange[cutlass.Int64, 2 * QS]
                mbar_ld: cute.struct.MemRange[cutlass.Int64, 2 * QS]
                mbar_sdp: cute.struct.MemRange[cutlass.Int64, 2]
                mbar_dq: cute.struct.MemRange[cutlass.Int64, 2]
                mbar_dkv: cute.struct.MemRange[cutlass.Int64, 2]
                tmem_holding: Int32
                sLD: cute.struct.Align[cute.struct.MemRange[Float32, BLOCK_M * 2 * QS], 16]
                sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
                sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]
                sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
                sdO: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sdO_layout)], 1024]
                sdS: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sdSt_layout)], 1024]
                sdQ: cute.struct.Align[
                    cute.struct.MemRange[Float32, 2 * cute.cosize(sdQ_layout)], 1024]

            self.shared_storage = SharedStorage
            self.launch(self.kernel(
                tma_Q, tma_K, tma_V, tma_dO, tma_dQ, mLSE, mDelta, mdK, mdV,
                mCuQ, mCuK, mTileB, mTileN, mNTiles, tma_atom_Q, tma_atom_K, tma_atom_V,
                tma_atom_dO, tma_atom_dQ, scale, L_q, n_slots, group,
                sK_layout, sV_layout, sQ_layout, sdO_layout, sQt_layout, sdOt_layout,
                sKt_layout, sdSt_layout, sdS_layout, tP_layout, sdQ_layout,
                mma_s, mma_dv, mma_dk, mma_dq, SharedStorage,
            ), num_programs, stream, use_pdl=bwd_dependent(self.broadcast_q))

        # ------------------------------------------------------------------ the kernel
        @cute.kernel
        def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                   mdO: cute.Tensor, mdQacc: cute.Tensor, mLSE: cute.Tensor,
                   mDelta: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
                   mCuQ: cute.Tensor, mCuK: cute.Tensor, mTileB: cute.Tensor,
                   mTileN: cute.Tensor, mNTiles: cute.Tensor,
                   tma_atom_Q: cute.CopyAtom, tma_atom_K: cute.CopyAtom,
                   tma_atom_V: cute.CopyAtom, tma_atom_dO: cute.CopyAtom,
                   tma_atom_dQ: cute.CopyAtom, scale: Float32, L_q: Int32, n_slots: Int32,
                   group: Int32,
                   sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
                   sQ_layout: cute.ComposedLayout, sdO_layout: cute.ComposedLayout,
                   sQt_layout: cute.ComposedLayout, sdOt_layout: cute.ComposedLayout,
                   sKt_layout: cute.ComposedLayout, sdSt_layout: cute.ComposedLayout,
                   sdS_layout: cute.ComposedLayout, tP_layout: cute.ComposedLayout,
                   sdQ_layout: cute.ComposedLayout,
                   mma_s: cute.TiledMma, mma_dv: cute.TiledMma, mma_dk: cute.TiledMma,
                   mma_dq: cute.TiledMma, SharedStorage: cutlass.Constexpr):
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            sched = Sched(mTileB, mTileN, mNTiles, mCuQ, mCuK, L_q, mQ.shape[2], mK.shape[2],
                          group, n_slots)
            if warp == LOAD_WARP:
                for a in (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_dO):
                    cpasync.prefetch_descriptor(a)
            smem = cutlass.utils.SmemAllocator()
            storage = smem.allocate(SharedStorage)

            Group = pipeline.CooperativeGroup
            T = pipeline.Agent.Thread
            one_thread, rows, warp_threads = Group(T, 1), Group(T, 128), Group(T, 32)
            pipe_kv = self.tma_to_mma(storage.mbar_kv, 1, self.bytes_KV)
            pipe_q = self.tma_to_mma(storage.mbar_q, self.qs, self.bytes_Q)
            pipe_ld = pipeline.PipelineAsync.create(
                barrier_storage=storage.mbar_ld.data_ptr(), num_stages=self.qs,
                producer_group=warp_threads, consumer_group=rows, defer_sync=True)
            pipe_sdp = self.mma_to(storage.mbar_sdp, 1, 128)
            pipe_dq = self.mma_to(storage.mbar_dq, 1, 128)
            pipe_dkv = self.mma_to(storage.mbar_dkv, 1, 128)
            tmem, tmem_barrier = self.tmem_allocator(storage, TMEM_BARRIER, MMA_WARP)
            pipeline.pipeline_init_arrive()
            pipeline.pipeline_init_wait()
            # a programmatic dependent of the kernel ahead, as bwd_hopper's main kernel:
            # global memory only after its writes; then the postprocess may launch
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()

            sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
            sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
            sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            sdO = storage.sdO.get_tensor(sdO_layout.outer, swizzle=sdO_layout.inner)
            sdSt = storage.sdS.get_tensor(sdSt_layout.outer, swizzle=sdSt_layout.inner)
            view = lambda s, l: cute.make_tensor(                      # noqa: E731
                cute.recast_ptr(s.iterator, l.inner, dtype=self.dtype), l.outer)
            sQt, sdOt = view(sQ, sQt_layout), view(sdO, sdOt_layout)
            sKt, sdS = view(sK, sKt_layout), view(sdSt, sdS_layout)
            sLD = storage.sLD.get_tensor(cute.make_layout((BLOCK_M, 2, self.qs)))
            sdQ = storage.sdQ.get_tensor(cute.make_layout(2 * cute.cosize(sdQ_layout)))

            if warp == MMA_WARP:
                tmem_ptr = self.tmem_acquire(tmem, tmem_barrier, TMEM_COLS)
                self.mma(mma_s, mma_dv, mma_dk, mma_dq, sK, sV, sQ, sdO, sQt, sdOt, sKt,
                         sdSt, sdS, tP_layout, pipe_kv, pipe_q, pipe_sdp, pipe_dq, pipe_dkv,
                         sched)
                self.tmem_release(tmem, tmem_barrier, tmem_ptr)
            if warp == LOAD_WARP:
                self.load(mma_s, mQ, mK, mV, mdO, mLSE, mDelta, sK, sV, sQ, sdO, sLD,
                          tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_dO, pipe_kv, pipe_q,
                          pipe_ld, sched)
            if warp >= REDUCE_WARP and warp < MMA_WARP:
                tmem_barrier.arrive_and_wait()
                self.reduce_dq(mma_dq, mdQacc, sdQ, sdQ_layout, tma_atom_dQ, pipe_dq, sched)
                tmem_barrier.arrive()
            if warp < REDUCE_WARP:
                tmem_barrier.arrive_and_wait()
                self.compute(mma_s, mma_dk, mdK, mdV, sdSt, sLD, pipe_ld, pipe_sdp, pipe_dkv,
                             scale, sched)
                tmem_barrier.arrive()

        # ------------------------------------------------------------------ schedule
        @cute.jit
        def steps_of(self, t: Int32, pinned: Int32, sched: Sched):
            """Tile t -> (b, hk, n0, seq, m_lo, n_m, steps): steps = group * n_m, step j is
            query head hk * group + j // n_m, rows m_lo + (j % n_m) * BLOCK_M on."""
            b, hk, n0, seq, m_lo, n_m = kv_tile_coords(t, pinned, sched, BLOCK_M, BLOCK_N,
                                                       self.causal, self.broadcast_q)
            return b, hk, n0, seq, m_lo, n_m, sched.group * n_m

        # ------------------------------------------------------------------ load
        @cute.jit
        def load(self, mma_s, mQ, mK, mV, mdO, mLSE, mDelta, sK, sV, sQ, sdO, sLD,
                 tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_dO, pipe_kv, pipe_q, pipe_ld,
                 sched):
            D = self.D
            lane = cute.arch.lane_idx()
            thr = mma_s.get_slice(0)
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.qs)
            ld_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.qs)
            t, step, n_tiles, slot_row, pinned = tile_range(sched, self.broadcast_q)
            while t < n_tiles:
                b, hk, n0, seq, m_lo, n_m, steps = self.steps_of(t, pinned, sched)
                if steps > 0:
                    # K / V boxes past the sequence's end read the next sequence's keys
                    # (P = 0 there) or TMA's zero fill
                    pipe_kv.producer_acquire(kv_state)
                    bar = pipe_kv.producer_get_barrier(kv_state)
                    for atom, m, s in ((tma_atom_K, mK, sK), (tma_atom_V, mV, sV)):
                        self.tma_box(atom, thr.partition_A(head_tile(
                            m, seq.k_start + n0, hk, BLOCK_N, D)), s, 0, bar)
                    kv_state.advance()
                    for j in cutlass.range(steps, unroll=1):
                        h = hk * sched.group + j // n_m
                        m0 = m_lo + (j % n_m) * BLOCK_M
                        pipe_q.producer_acquire(q_state)
                        bar = pipe_q.producer_get_barrier(q_state)
                        for atom, m, s, r in ((tma_atom_Q, mQ, sQ, seq.q_start),
                                              (tma_atom_dO, mdO, sdO, seq.out_start)):
                            self.tma_box(atom, thr.partition_B(head_tile(
                                m, r + m0, h, BLOCK_M, D)), s, q_state.index, bar)
                        q_state.advance()
                        # lse log2e and delta of the step's rows: rows past the sequence
                        # and rows that saw no key (lse = -inf) get lse = +inf (P = 0)
                        pipe_ld.producer_acquire(ld_state)
                        for e in cutlass.range_constexpr(BLOCK_M // 32):
                            r = m0 + lane + 32 * e
                            lse2 = Float32.inf
                            dl = Float32(0.0)
                            if r < seq.len_q:
                                x = mLSE[h, seq.out_start + r]
                                dl = mDelta[h, seq.out_start + r]
                                if x != -Float32.inf:
                                    lse2 = x * LOG2E
                            sLD[lane + 32 * e, 0, ld_state.index] = lse2
                            sLD[lane + 32 * e, 1, ld_state.index] = dl
                        pipe_ld.producer_commit(ld_state)
                        ld_state.advance()
                t += step

        @cute.jit
        def tma_box(self, atom, g, s, stage, bar):
            """One TMA load of the MMA-partitioned gmem box g into stage `stage` of s."""
            ts, tg = cpasync.tma_partition(atom, 0, cute.make_layout(1),
                                           cute.group_modes(s, 0, 3), cute.group_modes(g, 0, 3))
            cute.copy(atom, tg, ts[None, stage], tma_bar_ptr=bar)

        # ------------------------------------------------------------------ mma
        @cute.jit
        def mma(self, mma_s, mma_dv, mma_dk, mma_dq, sK, sV, sQ, sdO, sQt, sdOt, sKt, sdSt,
                sdS, tP_layout, pipe_kv, pipe_q, pipe_sdp, pipe_dq, pipe_dkv, sched):
            D = self.D
            th_s, th_dv = mma_s.get_slice(0), mma_dv.get_slice(0)
            th_dk, th_dq = mma_dk.get_slice(0), mma_dq.get_slice(0)
            tSrK = th_s.make_fragment_A(sK)[None, None, None, 0]
            tSrV = th_s.make_fragment_A(sV)[None, None, None, 0]
            tSrQ = th_s.make_fragment_B(sQ)
            tSrdO = th_s.make_fragment_B(sdO)
            tVrdOt = th_dv.make_fragment_B(sdOt)
            tKrQt = th_dk.make_fragment_B(sQt)
            tKrdS = th_dk.make_fragment_A(sdSt)[None, None, None, 0]
            tQrdS = th_dq.make_fragment_A(sdS)[None, None, None, 0]
            tQrKt = th_dq.make_fragment_B(sKt)[None, None, None, 0]
            acc_s = th_s.make_fragment_C(th_s.partition_shape_C(self.tiler_s[:2]))
            acc_kv = th_dv.make_fragment_C(th_dv.partition_shape_C(self.tiler_kv[:2]))
            acc_dq = th_dq.make_fragment_C(th_dq.partition_shape_C(self.tiler_dq[:2]))
            S, dP = with_cols(acc_s, self.tmem_s), with_cols(acc_s, self.tmem_dp)
            dV, dK = with_cols(acc_kv, self.tmem_dv), with_cols(acc_kv, self.tmem_dk)
            dQ = with_cols(acc_dq, self.tmem_dq)
            tVrP = th_dv.make_fragment_A(cute.make_tensor(acc_s.iterator, tP_layout.outer))
            tVrP = tVrP[None, None, None, 0]
            ratio = Float32.width // self.dtype.width       # 16-bit P per fp32 column
            P = cute.make_tensor(tVrP.iterator + self.tmem_p * ratio, tVrP.layout)

            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.qs)
            n_sdp = Int32(0)        # S / dP hand-overs so far (= dQ hand-overs)
            n_dkv = Int32(0)        # dK / dV hand-overs so far
            t, step, n_tiles, slot_row, pinned = tile_range(sched, self.broadcast_q)
            while t < n_tiles:
                b, hk, n0, seq, m_lo, n_m, steps = self.steps_of(t, pinned, sched)
                if steps > 0:
                    pipe_kv.consumer_wait(kv_state)
                    # the previous tile's store has read dK, dV
                    pipe_dkv.sync_object_empty.wait(0, (n_dkv % 2) ^ 1)
                    for j in cutlass.range(steps, unroll=1):
                        qi = q_state.index
                        pipe_q.consumer_wait(q_state)
                        # S^T(j): compute released step j - 1 (waited below)
                        self.gemm(mma_s, S, tSrK, tSrQ[None, None, None, qi], False)
                        # dP^T(j) overwrites dQ(j - 1): reduce_dq has read it
                        pipe_dq.sync_object_empty.wait(0, (n_sdp % 2) ^ 1)
                        tc_fence_after()
                        self.gemm(mma_s, dP, tSrV, tSrdO[None, None, None, qi], False)
                        pipe_sdp.sync_object_full.arrive(0, pipe_sdp.producer_mask,
                                                         pipe_sdp.cta_group)
                        # P^T in TMEM, dS^T in smem
                        pipe_sdp.sync_object_empty.wait(0, n_sdp % 2)
                        tc_fence_after()
                        self.gemm(mma_dv, dV, P, tVrdOt[None, None, None, qi], j > 0)
                        self.gemm(mma_dk, dK, tKrdS, tKrQt[None, None, None, qi], j > 0)
                        pipe_q.consumer_release(q_state)
                        q_state.advance()
                        self.gemm(mma_dq, dQ, tQrdS, tQrKt, False)
                        pipe_dq.sync_object_full.arrive(0, pipe_dq.producer_mask,
                                                        pipe_dq.cta_group)
                        n_sdp += 1
                    pipe_dkv.sync_object_full.arrive(0, pipe_dkv.producer_mask,
                                                     pipe_dkv.cta_group)
                    n_dkv += 1
                    pipe_kv.consumer_release(kv_state)
                    kv_state.advance()
                t += step

        # ------------------------------------------------------------------ compute
        @cute.jit
        def compute(self, mma_s, mma_dk, mdK, mdV, sdSt, sLD, pipe_ld, pipe_sdp, pipe_dkv,
                    scale, sched):
            """Every step of every tile, each head's Q blocks split at `bulk_start`: the
            masked ones (the causal diagonal; all of a tile reaching past the sequence's
            keys) first, then the bulk, which carries no mask; then `store`."""
            tidx = cute.arch.thread_idx()[0] % 128          # = TMEM lane = key of the tile
            scale_log2 = scale * LOG2E
            th = mma_s.get_slice(0)
            acc = th.make_fragment_C(th.partition_shape_C(self.tiler_s[:2]))[(None, None), 0, 0]
            crd = th.partition_C(cute.make_identity_tensor(self.tiler_s[:2]))[(None, None), 0, 0]
            ld = tcgen05.make_tmem_copy(cute.make_copy_atom(
                tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(32)), Float32), acc
            ).get_slice(tidx)
            tP = cute.make_tensor(acc.iterator + self.tmem_p, cute.composition(
                acc.layout, cute.make_layout((BLOCK_N, BLOCK_M // 2))))
            st = tcgen05.make_tmem_copy(cute.make_copy_atom(
                tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(16)), Float32), tP
            ).get_slice(tidx)
            io = StepIO(
                ld=ld, tS=ld.partition_S(with_cols(acc, self.tmem_s)),
                tdP=ld.partition_S(with_cols(acc, self.tmem_dp)), tcrd=ld.partition_D(crd),
                st=st, tP=st.partition_D(tP),
                p_shape=st.partition_S(cute.make_identity_tensor((BLOCK_N, BLOCK_M // 2))).shape,
                sdSt=sdSt, sLD=sLD)
            ld_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.qs)
            n_sdp = Int32(0)
            n_dkv = Int32(0)
            t, step, n_tiles, slot_row, pinned = tile_range(sched, self.broadcast_q)
            while t < n_tiles:
                b, hk, n0, seq, m_lo, n_m, steps = self.steps_of(t, pinned, sched)
                key = n0 + tidx
                m_bulk = bulk_start(seq, n0, m_lo, n_m, self.causal)
                for g in cutlass.range(sched.group, unroll=1):
                    for jm in cutlass.range(m_bulk, unroll=1):                   # masked
                        self.compute_step(True, io, m_lo + jm * BLOCK_M, key, seq, ld_state,
                                          n_sdp, pipe_ld, pipe_sdp, scale_log2)
                        ld_state.advance()
                        n_sdp += 1
                    for jm in cutlass.range(m_bulk, n_m, unroll=1):              # bulk
                        self.compute_step(False, io, m_lo + jm * BLOCK_M, key, seq, ld_state,
                                          n_sdp, pipe_ld, pipe_sdp, scale_log2)
                        ld_state.advance()
                        n_sdp += 1
                n_dkv = self.store(mma_dk, mdK, mdV, seq, n0, hk, key, steps, scale,
                                   pipe_dkv, n_dkv)
                t += step

        @cute.jit
        def compute_step(self, masked: cutlass.Constexpr, io, m0, key, seq, ld_state, n_sdp,
                         pipe_ld, pipe_sdp, scale_log2):
            """One step (query rows m0 on): S^T, dP^T chunks from TMEM, P^T =
            exp2(S^T scale log2e - lse log2e) back into TMEM, dS^T = P^T (dP^T - delta)
            into smem. Masked: P^T = 0 left of key's `mask_bound`; the bulk step has no
            mask code (its keys are the sequence's, every row sees them)."""
            tidx = cute.arch.thread_idx()[0] % 128
            bound = Int32(0)
            if const_expr(masked):
                bound = mask_bound(seq, key, m0, self.causal)
            nchunk = cute.size(io.tS, mode=[2])
            pipe_ld.consumer_wait(ld_state)
            si = ld_state.index
            pipe_sdp.sync_object_full.wait(0, n_sdp % 2)
            tc_fence_after()
            # descending chunks: P chunk k lands on S chunks >= k / 2 + 2, all read
            for kk in cutlass.range_constexpr(nchunk):
                k = nchunk - 1 - kk
                rS = cute.make_rmem_tensor(io.tcrd[None, None, 0].shape, Float32)
                cute.copy(io.ld, io.tS[None, None, k], rS)
                rdP = cute.make_rmem_tensor(io.tcrd[None, None, 0].shape, Float32)
                cute.copy(io.ld, io.tdP[None, None, k], rdP)
                cute.arch.fence_view_async_tmem_load()
                rP32 = cute.make_rmem_tensor(io.p_shape[:2], Float32)
                rP = cute.make_tensor(cute.recast_ptr(rP32.iterator, dtype=self.dtype),
                                      rS.layout)
                rdS = cute.make_rmem_tensor((cute.size(rS),), self.dtype)
                for c in cutlass.range_constexpr(cute.size(rS)):
                    col = io.tcrd[None, None, k][c][1]
                    p = cute.math.exp2(rS[c] * scale_log2 - io.sLD[col, 0, si], fastmath=True)
                    if const_expr(masked):
                        p = 0.0 if col < bound else p
                    rP[c] = p.to(self.dtype)
                    rdS[c] = (p * (rdP[c] - io.sLD[col, 1, si])).to(self.dtype)
                cute.copy(io.st, rP32, io.tP[None, None, k])
                # sdSt is ((keys, 16 queries), 1, query blocks, 1): 16 columns of row tidx
                # a block
                nb = cute.size(rS) // 16
                for i in cutlass.range_constexpr(nb):
                    cute.autovec_copy(cute.local_tile(rdS, (16,), (i,)),
                                      io.sdSt[(tidx, None), 0, k * nb + i, 0])
            cute.arch.fence_view_async_tmem_store()
            # dS^T (generic proxy writes) before the MMAs read it (async proxy)
            cute.arch.fence_proxy("async.shared", space="cta")
            pipe_ld.consumer_release(ld_state)
            pipe_sdp.sync_object_empty.arrive(0, None)

        # ------------------------------------------------------------------ store
        @cute.jit
        def store(self, mma_dk, mdK, mdV, seq, n0, hk, key, steps, scale, pipe_dkv, n_dkv):
            """dK * scale and dV rows out (keys at or past len_k are never written; a tile
            without steps writes zeros); dK, dV go back to mma once read."""
            tidx = cute.arch.thread_idx()[0] % 128
            th = mma_dk.get_slice(0)
            acc = th.make_fragment_C(th.partition_shape_C(self.tiler_kv[:2]))[(None, None), 0, 0]
            crd = th.partition_C(cute.make_identity_tensor(self.tiler_kv[:2]))[(None, None), 0, 0]
            ld = tcgen05.make_tmem_copy(cute.make_copy_atom(
                tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(32)), Float32), acc
            ).get_slice(tidx)
            tcrd = ld.partition_D(crd)
            chunks = cute.size(tcrd, mode=[2])
            per = self.D // chunks
            row_ok = key < seq.len_k
            r = cute.make_rmem_tensor((per,), self.dtype)
            if steps > 0:
                pipe_dkv.sync_object_full.wait(0, n_dkv % 2)
                tc_fence_after()
            # chunk by chunk: 32 columns from TMEM -> 16-bit -> 64 B of the row
            for x, (col, m, f) in enumerate(((self.tmem_dk, mdK, scale),
                                             (self.tmem_dv, mdV, 1.0))):
                src = ld.partition_S(with_cols(acc, col))
                for k in cutlass.range_constexpr(chunks):
                    r.fill(0.0)
                    if steps > 0:
                        v = cute.make_rmem_tensor(tcrd[None, None, 0].shape, Float32)
                        cute.copy(ld, src[None, None, k], v)
                        cute.arch.fence_view_async_tmem_load()
                        for c in cutlass.range_constexpr(per):
                            r[c] = (v[c] * f).to(self.dtype)
                    if row_ok:
                        cute.autovec_copy(r, cute.local_tile(
                            m[seq.k_start + key, None, hk], (per,), (k,)))
            if steps > 0:
                pipe_dkv.sync_object_empty.arrive(0, pipe_dkv.consumer_mask)
                n_dkv += 1
            return n_dkv

        # ------------------------------------------------------------------ reduce_dq
        @cute.jit
        def reduce_dq(self, mma_dq, mdQacc, sdQ, sdQ_layout, tma_atom_dQ, pipe_dq, sched):
            """Each step's dQ ([128, D] fp32, TMEM) reduce-added into the accumulator in
            32-column boxes through two smem buffers. Rows past the sequence carry exact
            zeros (dS = 0 there); TMA clips rows past the tensor."""
            tidx = cute.arch.thread_idx()[0] % 128         # = TMEM lane = query row
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            th = mma_dq.get_slice(0)
            acc = th.make_fragment_C(th.partition_shape_C(self.tiler_dq[:2]))[(None, None), 0, 0]
            crd = th.partition_C(cute.make_identity_tensor(self.tiler_dq[:2]))[(None, None), 0, 0]
            ld = tcgen05.make_tmem_copy(cute.make_copy_atom(
                tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(DQ_WIDE)), Float32), acc
            ).get_slice(tidx)
            tdQ = ld.partition_S(with_cols(acc, self.tmem_dq))
            tcrd = ld.partition_D(crd)
            chunks = cute.size(tdQ, mode=[2])
            buf_elems = cute.cosize(sdQ_layout)
            wview = element_swizzled(sdQ_layout, Float32)
            bufs_w = [cute.make_tensor(sdQ.iterator + i * buf_elems, wview) for i in range(2)]
            bufs = [cute.make_tensor(cute.recast_ptr(sdQ.iterator + i * buf_elems,
                                                     sdQ_layout.inner, dtype=Float32),
                                     sdQ_layout.outer) for i in range(2)]
            n_dq = Int32(0)
            t, step, n_tiles, slot_row, pinned = tile_range(sched, self.broadcast_q)
            while t < n_tiles:
                b, hk, n0, seq, m_lo, n_m, steps = self.steps_of(t, pinned, sched)
                for j in cutlass.range(steps, unroll=1):
                    h = hk * sched.group + j // n_m
                    m0 = m_lo + (j % n_m) * BLOCK_M
                    pipe_dq.sync_object_full.wait(0, n_dq % 2)
                    tc_fence_after()
                    for k in cutlass.range_constexpr(chunks):
                        v = cute.make_rmem_tensor(tcrd[None, None, 0].shape, Float32)
                        cute.copy(ld, tdQ[None, None, k], v)
                        cute.arch.fence_view_async_tmem_load()
                        if const_expr(k == chunks - 1):     # dQ read: dP^T may follow
                            pipe_dq.sync_object_empty.arrive(0, None)
                        # buffer k % 2: its reduce two boxes ago has read it
                        if warp == REDUCE_WARP:
                            cute.arch.cp_async_bulk_wait_group(1, read=True)
                        cute.arch.barrier(barrier_id=DQ_BARRIER, number_of_threads=128)
                        cute.autovec_copy(v, bufs_w[k % 2][tidx, None])
                        cute.arch.fence_proxy("async.shared", space="cta")
                        cute.arch.barrier(barrier_id=DQ_BARRIER, number_of_threads=128)
                        if warp == REDUCE_WARP:
                            ts, tg = tma_tiles(tma_atom_dQ, bufs[k % 2], head_tile(
                                mdQacc, slot_row + seq.q_start + m0, h, BLOCK_M, DQ_WIDE,
                                (0, k)))
                            cute.copy(tma_atom_dQ, ts, tg)
                            cute.arch.cp_async_bulk_commit_group()
                    n_dq += 1
                t += step
            if warp == REDUCE_WARP:
                cute.arch.cp_async_bulk_wait_group(0, read=False)

    def head_tile_t(m, row, h, rows, cols):
        """The (rows = D, cols tokens) box of head h of a (D, tokens, heads) view whose first
        token is `row`."""
        return cute.local_tile(cute.domain_offset((0, row), m[None, None, h]), (rows, cols),
                               (0, 0))

    class BwdBlackwellPair(BwdBlackwell):
        """The pair build (module docstring, "Pair build"): a cluster of two CTAs, the
        leader issuing cta_group::2 MMAs over both."""

        def __init__(self, dtype, head_dim: int, causal: bool, broadcast_q: bool,
                     cfg: Config):
            super().__init__(dtype, head_dim, causal, broadcast_q, cfg)
            assert broadcast_q and head_dim == 128 and cfg.q_stages == 1
            # P^T over S^T's lower columns, dS^T over dP^T's, dQ (64 rows x D: lanes 0-63
            # hold D's first half, 64-127 its second) over dP^T's upper 64
            self.tmem_p = self.tmem_s
            self.tmem_ds = self.tmem_dp
            self.tmem_dq = self.tmem_dp + BLOCK_M // 2
            self.cluster_shape = (2, 1, 1)

        # ------------------------------------------------------------------ host side
        @cute.jit
        def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                     mdO: cute.Tensor, mLSE: cute.Tensor, mDelta: cute.Tensor,
                     mdQacc: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
                     mCuQ: cute.Tensor, mCuK: cute.Tensor, mTileB: cute.Tensor,
                     mTileN: cute.Tensor, mNTiles: cute.Tensor, scale: Float32, L_q: Int32,
                     n_slots: Int32, group: Int32, num_programs: Int32, stream):
            D, dt = self.D, self.dtype
            mQ, mK, mV, mdO, mdQacc, mdK, mdV = [
                cute.make_tensor(t.iterator, cute.select(t.layout, mode=[0, 2, 1]))
                for t in (mQ, mK, mV, mdO, mdQacc, mdK, mdV)]
            # (D, tokens, heads): the B operands whose N is D
            mQt, mdOt, mKt = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[1, 0, 2]))
                              for t in (mQ, mdO, mK)]
            two = tcgen05.CtaGroup.TWO
            Km, MNm = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
            # S^T, dP^T: M = the pair's 256 keys, N = 128 queries (64 a CTA), K = D
            self.tiler_s = (2 * BLOCK_N, BLOCK_M, D)
            # dV, dK: M = the pair's keys, N = D (D / 2 a CTA), K = queries
            self.tiler_kv = (2 * BLOCK_N, D, BLOCK_M)
            # dQ: M = 128 queries (64 a CTA), N = D, K = one tile's keys; the pair's two
            # tiles summed by two MMAs into one accumulator
            self.tiler_dq = (BLOCK_M, D, BLOCK_N)
            mma_s = sm100.make_trivial_tiled_mma(dt, dt, Km, Km, Float32, two,
                                                 self.tiler_s[:2])
            mma_dv = sm100.make_trivial_tiled_mma(dt, dt, Km, MNm, Float32, two,
                                                  self.tiler_kv[:2], tcgen05.OperandSource.TMEM)
            mma_dk = sm100.make_trivial_tiled_mma(dt, dt, Km, MNm, Float32, two,
                                                  self.tiler_kv[:2], tcgen05.OperandSource.TMEM)
            mma_dq = sm100.make_trivial_tiled_mma(dt, dt, MNm, MNm, Float32, two,
                                                  self.tiler_dq[:2])
            sK_layout = sm100.make_smem_layout_a(mma_s, self.tiler_s, dt, 1)
            sV_layout = sm100.make_smem_layout_a(mma_s, self.tiler_s, dt, 1)
            sQ_layout = sm100.make_smem_layout_b(mma_s, self.tiler_s, dt, 1)
            sdO_layout = sm100.make_smem_layout_b(mma_s, self.tiler_s, dt, 1)
            sQt_layout = sm100.make_smem_layout_b(mma_dk, self.tiler_kv, dt, 1)
            sdOt_layout = sm100.make_smem_layout_b(mma_dv, self.tiler_kv, dt, 1)
            # stage s: tile s of the pair (K's D half of this CTA)
            sKt_layout = sm100.make_smem_layout_b(mma_dq, self.tiler_dq, dt, 2)
            # stages 0, 1: dS of the pair's tiles (this CTA's query half); 2: the half
            # this CTA sends to its peer
            sdS_layout = sm100.make_smem_layout_a(mma_dq, self.tiler_dq, dt, 3)
            tP_layout = sm100.make_smem_layout_a(mma_dv, self.tiler_kv, dt, 1)
            tdS_layout = sm100.make_smem_layout_a(mma_dk, self.tiler_kv, dt, 1)
            sdQ_layout = bwd_hopper.dq_smem_layout(DQ_WIDE, BLOCK_M // 2)   # one reduce box
            vmnk = cute.tiled_divide(cute.make_layout(self.cluster_shape),
                                     (mma_s.thr_id.shape,))
            g2s = cpasync.CopyBulkTensorTileG2SOp(two)
            sel = lambda l: cute.select(l, mode=[0, 1, 2])           # noqa: E731
            tma_atom_K, tma_K = cute.nvgpu.make_tiled_tma_atom_A(
                g2s, mK, sel(sK_layout), self.tiler_s, mma_s, vmnk.shape)
            tma_atom_V, tma_V = cute.nvgpu.make_tiled_tma_atom_A(
                g2s, mV, sel(sV_layout), self.tiler_s, mma_s, vmnk.shape)
            tma_atom_Q, tma_Q = cute.nvgpu.make_tiled_tma_atom_B(
                g2s, mQ, sel(sQ_layout), self.tiler_s, mma_s, vmnk.shape)
            tma_atom_dO, tma_dO = cute.nvgpu.make_tiled_tma_atom_B(
                g2s, mdO, sel(sdO_layout), self.tiler_s, mma_s, vmnk.shape)
            tma_atom_Qt, tma_Qt = cute.nvgpu.make_tiled_tma_atom_B(
                g2s, mQt, sel(sQt_layout), self.tiler_kv, mma_dk, vmnk.shape)
            tma_atom_dOt, tma_dOt = cute.nvgpu.make_tiled_tma_atom_B(
                g2s, mdOt, sel(sdOt_layout), self.tiler_kv, mma_dv, vmnk.shape)
            tma_atom_Kt, tma_Kt = cute.nvgpu.make_tiled_tma_atom_B(
                g2s, mKt, sel(sKt_layout), self.tiler_dq, mma_dq, vmnk.shape)
            tma_atom_dQ, tma_dQ = cpasync.make_tiled_tma_atom(
                cpasync.CopyReduceBulkTensorTileS2GOp(), mdQacc, sdQ_layout,
                (BLOCK_M // 2, DQ_WIDE), 1)
            # the leader's full barriers count both CTAs' bytes
            nb = lambda l: cute.size_in_bytes(dt, sel(l))             # noqa: E731
            self.bytes_KV = 2 * (nb(sK_layout) + nb(sV_layout) + nb(sKt_layout))
            self.bytes_Q = 2 * (nb(sQ_layout) + nb(sdO_layout) + nb(sQt_layout)
                                + nb(sdOt_layout))
            self.ds_stage = cute.cosize(cute.select(sdS_layout.outer, mode=[0, 1, 2]))

            @cute.struct
            class SharedStorage:
                mbar_kv: cute.struct.MemRange[cutlass.Int64, 2]
                mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
                mbar_ld: cute.struct.MemRange[cutlass.Int64, 2]
                mbar_sdp: cute.struct.MemRange[cutlass.Int64, 2]
                mbar_dq: cute.struct.MemRange[cutlass.Int64, 2]
                mbar_dkv: cute.struct.MemRange[cutlass.Int64, 2]
                mbar_ds: cutlass.Int64          # the peer's dS half landed here
                mbar_pair: cutlass.Int64        # leader: this CTA's half landed in the peer
                mbar_dealloc: cutlass.Int64
                tmem_holding: Int32
                sLD: cute.struct.Align[cute.struct.MemRange[Float32, BLOCK_M * 2], 16]
                sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
                sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]
                sKt: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sKt_layout)], 1024]
                sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
                sdO: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sdO_layout)], 1024]
                sQt: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQt_layout)], 1024]
                sdOt: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sdOt_layout)], 1024]
                sdS: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sdS_layout)], 1024]
                sdQ: cute.struct.Align[
                    cute.struct.MemRange[Float32, 2 * cute.cosize(sdQ_layout)], 1024]

            self.shared_storage = SharedStorage
            self.launch(self.kernel_pair(
                tma_Q, tma_K, tma_V, tma_dO, tma_Qt, tma_dOt, tma_Kt, tma_dQ, mLSE, mDelta,
                mdK, mdV, mCuQ, mCuK, mTileB, mTileN, mNTiles, tma_atom_Q, tma_atom_K,
                tma_atom_V, tma_atom_dO, tma_atom_Qt, tma_atom_dOt, tma_atom_Kt, tma_atom_dQ,
                scale, L_q, n_slots, group,
                sK_layout, sV_layout, sQ_layout, sdO_layout, sQt_layout, sdOt_layout,
                sKt_layout, sdS_layout, tP_layout, tdS_layout, sdQ_layout,
                mma_s, mma_dv, mma_dk, mma_dq, SharedStorage,
            ), num_programs, stream, use_pdl=bwd_dependent(self.broadcast_q))

        # ------------------------------------------------------------------ the kernel
        @cute.kernel
        def kernel_pair(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                        mdO: cute.Tensor, mQt: cute.Tensor, mdOt: cute.Tensor,
                        mKt: cute.Tensor, mdQacc: cute.Tensor, mLSE: cute.Tensor,
                        mDelta: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
                        mCuQ: cute.Tensor, mCuK: cute.Tensor, mTileB: cute.Tensor,
                        mTileN: cute.Tensor, mNTiles: cute.Tensor,
                        tma_atom_Q: cute.CopyAtom, tma_atom_K: cute.CopyAtom,
                        tma_atom_V: cute.CopyAtom, tma_atom_dO: cute.CopyAtom,
                        tma_atom_Qt: cute.CopyAtom, tma_atom_dOt: cute.CopyAtom,
                        tma_atom_Kt: cute.CopyAtom, tma_atom_dQ: cute.CopyAtom,
                        scale: Float32, L_q: Int32, n_slots: Int32, group: Int32,
                        sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
                        sQ_layout: cute.ComposedLayout, sdO_layout: cute.ComposedLayout,
                        sQt_layout: cute.ComposedLayout, sdOt_layout: cute.ComposedLayout,
                        sKt_layout: cute.ComposedLayout, sdS_layout: cute.ComposedLayout,
                        tP_layout: cute.ComposedLayout, tdS_layout: cute.ComposedLayout,
                        sdQ_layout: cute.ComposedLayout,
                        mma_s: cute.TiledMma, mma_dv: cute.TiledMma, mma_dk: cute.TiledMma,
                        mma_dq: cute.TiledMma, SharedStorage: cutlass.Constexpr):
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
            sched = Sched(mTileB, mTileN, mNTiles, mCuQ, mCuK, L_q, mQ.shape[2], mK.shape[2],
                          group, n_slots)
            if warp == LOAD_WARP:
                for a in (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_dO, tma_atom_Qt,
                          tma_atom_dOt, tma_atom_Kt):
                    cpasync.prefetch_descriptor(a)
            smem = cutlass.utils.SmemAllocator()
            storage = smem.allocate(SharedStorage)
            vmnk = cute.tiled_divide(cute.make_layout(self.cluster_shape),
                                     (mma_s.thr_id.shape,))

            Group = pipeline.CooperativeGroup
            T = pipeline.Agent.Thread
            one_thread, rows, warp_threads = Group(T, 1), Group(T, 128), Group(T, 32)
            pair_rows = Group(T, 2 * 128)       # both CTAs' threads arrive at the leader
            pipe_kv = pipeline.PipelineTmaUmma.create(
                barrier_storage=storage.mbar_kv.data_ptr(), num_stages=1,
                producer_group=one_thread, consumer_group=one_thread, tx_count=self.bytes_KV,
                cta_layout_vmnk=vmnk, defer_sync=True)
            pipe_q = pipeline.PipelineTmaUmma.create(
                barrier_storage=storage.mbar_q.data_ptr(), num_stages=1,
                producer_group=one_thread, consumer_group=one_thread, tx_count=self.bytes_Q,
                cta_layout_vmnk=vmnk, defer_sync=True)
            pipe_ld = pipeline.PipelineAsync.create(
                barrier_storage=storage.mbar_ld.data_ptr(), num_stages=1,
                producer_group=warp_threads, consumer_group=rows, defer_sync=True)
            pipe_sdp, pipe_dq, pipe_dkv = [pipeline.PipelineUmmaAsync.create(
                barrier_storage=m.data_ptr(), num_stages=1, producer_group=one_thread,
                consumer_group=pair_rows, cta_layout_vmnk=vmnk, defer_sync=True)
                for m in (storage.mbar_sdp, storage.mbar_dq, storage.mbar_dkv)]
            mbar_ds, mbar_pair = storage.mbar_ds.ptr, storage.mbar_pair.ptr
            if warp == MMA_WARP:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_init(mbar_ds, 1)
                    cute.arch.mbarrier_init(mbar_pair, 1)
            tmem_barrier = pipeline.NamedBarrier(barrier_id=TMEM_BARRIER,
                                                 num_threads=32 * (MMA_WARP + 1))
            tmem = cutlass.utils.TmemAllocator(
                storage.tmem_holding.ptr, barrier_for_retrieve=tmem_barrier,
                allocator_warp_id=MMA_WARP, is_two_cta=True,
                two_cta_tmem_dealloc_mbar_ptr=storage.mbar_dealloc.ptr)
            # every barrier of the pair initialized before either CTA arrives remotely
            cluster_mn = cute.make_layout((2, 1))
            pipeline.pipeline_init_arrive(cluster_shape_mn=cluster_mn, is_relaxed=True)
            pipeline.pipeline_init_wait(cluster_shape_mn=cluster_mn)
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()

            sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
            sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
            sKt = storage.sKt.get_tensor(sKt_layout.outer, swizzle=sKt_layout.inner)
            sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            sdO = storage.sdO.get_tensor(sdO_layout.outer, swizzle=sdO_layout.inner)
            sQt = storage.sQt.get_tensor(sQt_layout.outer, swizzle=sQt_layout.inner)
            sdOt = storage.sdOt.get_tensor(sdOt_layout.outer, swizzle=sdOt_layout.inner)
            sdS = storage.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
            sLD = storage.sLD.get_tensor(cute.make_layout((BLOCK_M, 2, 1)))
            sdQ = storage.sdQ.get_tensor(cute.make_layout(2 * cute.cosize(sdQ_layout)))

            if warp == MMA_WARP:
                tmem_ptr = self.tmem_acquire(tmem, tmem_barrier, TMEM_COLS)
                if rank == 0:
                    self.mma_pair(mma_s, mma_dv, mma_dk, mma_dq, sK, sV, sQ, sdO, sQt, sdOt,
                                  sKt, sdS, tP_layout, tdS_layout, pipe_kv, pipe_q, pipe_sdp,
                                  pipe_dq, pipe_dkv, mbar_ds, mbar_pair, sched)
                else:
                    self.relay(mbar_ds, mbar_pair, sched)
                self.tmem_release(tmem, tmem_barrier, tmem_ptr)
            if warp == LOAD_WARP:
                self.load_pair(mma_s, mma_dv, mma_dk, mma_dq, mQ, mK, mV, mdO, mQt, mdOt, mKt,
                               mLSE, mDelta, sK, sV, sKt, sQ, sdO, sQt, sdOt, sLD,
                               tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_dO, tma_atom_Qt,
                               tma_atom_dOt, tma_atom_Kt, pipe_kv, pipe_q, pipe_ld, sched)
            if warp >= REDUCE_WARP and warp < MMA_WARP:
                tmem_barrier.arrive_and_wait()
                self.reduce_pair(mma_s, mdQacc, sdQ, sdQ_layout, tma_atom_dQ, pipe_dq, sched)
                tmem_barrier.arrive()
            if warp < REDUCE_WARP:
                tmem_barrier.arrive_and_wait()
                self.compute_pair(mma_s, mma_dk, mdK, mdV, sdS, sLD, pipe_ld, pipe_sdp,
                                  pipe_dkv, mbar_ds, scale, sched, mK.shape[0])
                tmem_barrier.arrive()
            # neither CTA leaves while the other may still arrive on its barriers
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

        # ------------------------------------------------------------------ schedule
        @cute.jit
        def pair_range(self, sched: Sched):
            """(first pair-tile u, step, tile count, dQ slot row, pinned KV head, rank):
            pair pid // 2 is pinned as a 1-CTA program is (KV head pair % H_kv, dQ slot
            (pair // H_kv) % n_slots) and takes tiles 2u + rank for u = first, first + step,
            ... while 2u < the tile count."""
            HKV = sched.HKV
            pid = cute.arch.block_idx()[0]
            pair = pid // 2
            first = pair // HKV
            step = cute.arch.grid_dim()[0] // 2 // HKV
            return (first, step, sched.mNTiles[0], first % sched.n_slots * sched.L_q,
                    pair % HKV, pid % 2)

        @cute.jit
        def pair_steps(self, u, pinned, rank, n_keys, sched: Sched):
            """Pair-tile u -> (b, hk, n0, seq, m_lo, n_m, steps, row0, row1): this CTA's
            tile 2u + rank (past the list's end: a tile of no keys at row n_keys, whose
            K / V boxes TMA fills with zeros, every P = 0), the pair's Q walk (from the
            lower of the two tiles' first blocks to L_q) and the first key rows of the
            pair's two tiles."""
            n_tiles = sched.mNTiles[0]
            t0 = 2 * u
            t1 = cutlass.min(t0 + 1, n_tiles - 1)
            real1 = cutlass.min(n_tiles - t0 - 1, 1)            # 1: tile 2u + 1 exists
            b0, hk, n00, s0, m_lo0, n_m0 = kv_tile_coords(t0, pinned, sched, BLOCK_M,
                                                          BLOCK_N, self.causal, True)
            b1, hk1, n01, s1, m_lo1, n_m1 = kv_tile_coords(t1, pinned, sched, BLOCK_M,
                                                           BLOCK_N, self.causal, True)
            row0 = s0.k_start + n00
            row1 = real1 * (s1.k_start + n01) + (1 - real1) * n_keys
            m_lo = cutlass.min(m_lo0, m_lo1)
            n_m = (s0.len_q - m_lo + BLOCK_M - 1) // BLOCK_M
            b = b0 + rank * (b1 - b0)
            live = 1 - rank * (1 - real1)                       # 0: the tile of no keys
            n0 = live * (n00 + rank * (n01 - n00))
            k_start = live * (s0.k_start + rank * (s1.k_start - s0.k_start)) \
                + (1 - live) * n_keys
            len_k = live * (s0.len_k + rank * (s1.len_k - s0.len_k))
            seq = SeqlenInfo(s0.q_start, s0.out_start + rank * (s1.out_start - s0.out_start),
                             k_start, s0.len_q, len_k)
            return b, hk, n0, seq, m_lo, n_m, sched.group * n_m, row0, row1

        # ------------------------------------------------------------------ load
        @cute.jit
        def load_pair(self, mma_s, mma_dv, mma_dk, mma_dq, mQ, mK, mV, mdO, mQt, mdOt, mKt,
                      mLSE, mDelta, sK, sV, sKt, sQ, sdO, sQt, sdOt, sLD, tma_atom_Q,
                      tma_atom_K, tma_atom_V, tma_atom_dO, tma_atom_Qt, tma_atom_dOt,
                      tma_atom_Kt, pipe_kv, pipe_q, pipe_ld, sched):
            """This CTA's halves: its tile's K, V (the A rows of S^T, dP^T), its D half of
            both tiles' K (dQ's B); per step its 64 query rows of Q, dO (S^T's, dP^T's B)
            and its D half of all 128 (dK's, dV's B); its tile's lse / delta rows."""
            D = self.D
            lane = cute.arch.lane_idx()
            u, ustep, n_tiles, slot_row, pinned, rank = self.pair_range(sched)
            th_s, th_dv = mma_s.get_slice(rank), mma_dv.get_slice(rank)
            th_dk, th_dq = mma_dk.get_slice(rank), mma_dq.get_slice(rank)
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            ld_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
            while 2 * u < n_tiles:
                b, hk, n0, seq, m_lo, n_m, steps, row0, row1 = self.pair_steps(
                    u, pinned, rank, mK.shape[0], sched)
                pipe_kv.producer_acquire(kv_state)
                bar = pipe_kv.producer_get_barrier(kv_state)
                # the 256-key box whose half `rank` is this CTA's tile
                for atom, m, s in ((tma_atom_K, mK, sK), (tma_atom_V, mV, sV)):
                    self.tma_box(atom, th_s.partition_A(head_tile(
                        m, seq.k_start + n0 - rank * BLOCK_N, hk, 2 * BLOCK_N, D)), s, 0, bar)
                for s_, row in ((0, row0), (1, row1)):
                    self.tma_box(tma_atom_Kt, th_dq.partition_B(head_tile_t(
                        mKt, row, hk, D, BLOCK_N)), sKt, s_, bar)
                kv_state.advance()
                for j in cutlass.range(steps, unroll=1):
                    h = hk * sched.group + j // n_m
                    m0 = m_lo + (j % n_m) * BLOCK_M
                    pipe_q.producer_acquire(q_state)
                    bar = pipe_q.producer_get_barrier(q_state)
                    for atom, m, s in ((tma_atom_Q, mQ, sQ), (tma_atom_dO, mdO, sdO)):
                        r0 = seq.q_start if const_expr(atom is tma_atom_Q) else seq.out_start
                        self.tma_box(atom, th_s.partition_B(head_tile(
                            m, r0 + m0, h, BLOCK_M, D)), s, 0, bar)
                    self.tma_box(tma_atom_Qt, th_dk.partition_B(head_tile_t(
                        mQt, seq.q_start + m0, h, D, BLOCK_M)), sQt, 0, bar)
                    self.tma_box(tma_atom_dOt, th_dv.partition_B(head_tile_t(
                        mdOt, seq.out_start + m0, h, D, BLOCK_M)), sdOt, 0, bar)
                    q_state.advance()
                    pipe_ld.producer_acquire(ld_state)
                    for e in cutlass.range_constexpr(BLOCK_M // 32):
                        r = m0 + lane + 32 * e
                        lse2 = Float32.inf
                        dl = Float32(0.0)
                        if r < seq.len_q:
                            x = mLSE[h, seq.out_start + r]
                            dl = mDelta[h, seq.out_start + r]
                            if x != -Float32.inf:
                                lse2 = x * LOG2E
                        sLD[lane + 32 * e, 0, 0] = lse2
                        sLD[lane + 32 * e, 1, 0] = dl
                    pipe_ld.producer_commit(ld_state)
                    ld_state.advance()
                u += ustep

        # ------------------------------------------------------------------ mma
        @cute.jit
        def mma_pair(self, mma_s, mma_dv, mma_dk, mma_dq, sK, sV, sQ, sdO, sQt, sdOt, sKt,
                     sdS, tP_layout, tdS_layout, pipe_kv, pipe_q, pipe_sdp, pipe_dq,
                     pipe_dkv, mbar_ds, mbar_pair, sched):
            """The leader's mma warp: every MMA of the pair (its smem addresses name the
            same offsets in both CTAs; each CTA's accumulators in its own TMEM)."""
            th_s, th_dv = mma_s.get_slice(0), mma_dv.get_slice(0)
            th_dk, th_dq = mma_dk.get_slice(0), mma_dq.get_slice(0)
            tSrK = th_s.make_fragment_A(sK)[None, None, None, 0]
            tSrV = th_s.make_fragment_A(sV)[None, None, None, 0]
            tSrQ = th_s.make_fragment_B(sQ)[None, None, None, 0]
            tSrdO = th_s.make_fragment_B(sdO)[None, None, None, 0]
            tVrdOt = th_dv.make_fragment_B(sdOt)[None, None, None, 0]
            tKrQt = th_dk.make_fragment_B(sQt)[None, None, None, 0]
            tQrdS = th_dq.make_fragment_A(sdS)
            tQrKt = th_dq.make_fragment_B(sKt)
            acc_s = th_s.make_fragment_C(th_s.partition_shape_C(self.tiler_s[:2]))
            acc_kv = th_dv.make_fragment_C(th_dv.partition_shape_C(self.tiler_kv[:2]))
            acc_dq = th_dq.make_fragment_C(th_dq.partition_shape_C(self.tiler_dq[:2]))
            S, dP = with_cols(acc_s, self.tmem_s), with_cols(acc_s, self.tmem_dp)
            dV, dK = with_cols(acc_kv, self.tmem_dv), with_cols(acc_kv, self.tmem_dk)
            dQ = with_cols(acc_dq, self.tmem_dq)
            ratio = Float32.width // self.dtype.width       # 16-bit values per fp32 column
            tVrP = th_dv.make_fragment_A(cute.make_tensor(acc_s.iterator, tP_layout.outer))
            tVrP = tVrP[None, None, None, 0]
            P = cute.make_tensor(tVrP.iterator + self.tmem_p * ratio, tVrP.layout)
            tKrdS = th_dk.make_fragment_A(cute.make_tensor(acc_s.iterator, tdS_layout.outer))
            tKrdS = tKrdS[None, None, None, 0]
            dSt = cute.make_tensor(tKrdS.iterator + self.tmem_ds * ratio, tKrdS.layout)

            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            n_sdp = Int32(0)        # steps so far (S / dP, dS exchange and dQ hand-overs)
            n_dkv = Int32(0)
            u, ustep, n_tiles, slot_row, pinned, rank = self.pair_range(sched)
            while 2 * u < n_tiles:
                steps = sched.group * self.pair_steps(u, pinned, rank, 0, sched)[5]
                pipe_kv.consumer_wait(kv_state)
                pipe_dkv.sync_object_empty.wait(0, (n_dkv % 2) ^ 1)
                for j in cutlass.range(steps, unroll=1):
                    pipe_q.consumer_wait(q_state)
                    self.gemm(mma_s, S, tSrK, tSrQ, False)
                    # dP^T(j) shares columns with dQ(j - 1): both reduce_dq have read it
                    pipe_dq.sync_object_empty.wait(0, (n_sdp % 2) ^ 1)
                    tc_fence_after()
                    self.gemm(mma_s, dP, tSrV, tSrdO, False)
                    pipe_sdp.sync_object_full.arrive(0, pipe_sdp.producer_mask,
                                                     pipe_sdp.cta_group)
                    # both CTAs: P^T, dS^T in TMEM, dS (own half) in smem
                    pipe_sdp.sync_object_empty.wait(0, n_sdp % 2)
                    tc_fence_after()
                    self.gemm(mma_dv, dV, P, tVrdOt, j > 0)
                    self.gemm(mma_dk, dK, dSt, tKrQt, j > 0)
                    pipe_q.consumer_release(q_state)
                    q_state.advance()
                    # the exchanged halves: the peer's here, ours in the peer
                    cute.arch.mbarrier_wait(mbar_ds, n_sdp % 2)
                    cute.arch.mbarrier_wait(mbar_pair, n_sdp % 2)
                    self.gemm(mma_dq, dQ, tQrdS[None, None, None, 0], tQrKt[None, None, None, 0],
                              False)
                    self.gemm(mma_dq, dQ, tQrdS[None, None, None, 1], tQrKt[None, None, None, 1],
                              True)
                    pipe_dq.sync_object_full.arrive(0, pipe_dq.producer_mask, pipe_dq.cta_group)
                    n_sdp += 1
                pipe_dkv.sync_object_full.arrive(0, pipe_dkv.producer_mask, pipe_dkv.cta_group)
                n_dkv += 1
                pipe_kv.consumer_release(kv_state)
                kv_state.advance()
                u += ustep

        @cute.jit
        def relay(self, mbar_ds, mbar_pair, sched):
            """The second CTA's mma warp: each step, once the leader's dS half has landed
            here, tells the leader (the leader's dQ MMA reads this CTA's smem)."""
            n = Int32(0)
            u, ustep, n_tiles, slot_row, pinned, rank = self.pair_range(sched)
            while 2 * u < n_tiles:
                steps = sched.group * self.pair_steps(u, pinned, rank, 0, sched)[5]
                for j in cutlass.range(steps, unroll=1):
                    cute.arch.mbarrier_wait(mbar_ds, n % 2)
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive(mbar_pair, peer_cta_rank_in_cluster=0)
                    n += 1
                u += ustep

        # ------------------------------------------------------------------ compute
        @cute.jit
        def compute_pair(self, mma_s, mma_dk, mdK, mdV, sdS, sLD, pipe_ld, pipe_sdp,
                         pipe_dkv, mbar_ds, scale, sched, n_keys):
            """compute's walk over the pair's steps (this CTA's tile; the tile of no keys
            masks every step), then `store`."""
            tidx = cute.arch.thread_idx()[0] % 128
            scale_log2 = scale * LOG2E
            th = mma_s.get_slice(0)
            acc = th.make_fragment_C(th.partition_shape_C(self.tiler_s[:2]))[(None, None), 0, 0]
            crd = th.partition_C(cute.make_identity_tensor(self.tiler_s[:2]))[(None, None), 0, 0]
            ld = tcgen05.make_tmem_copy(cute.make_copy_atom(
                tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(32)), Float32), acc
            ).get_slice(tidx)
            half = cute.make_layout((BLOCK_N, BLOCK_M // 2))
            tP = cute.make_tensor(acc.iterator + self.tmem_p, cute.composition(acc.layout, half))
            tdS = cute.make_tensor(acc.iterator + self.tmem_ds,
                                   cute.composition(acc.layout, half))
            st = tcgen05.make_tmem_copy(cute.make_copy_atom(
                tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(16)), Float32), tP
            ).get_slice(tidx)
            io = StepIO(
                ld=ld, tS=ld.partition_S(with_cols(acc, self.tmem_s)),
                tdP=ld.partition_S(with_cols(acc, self.tmem_dp)), tcrd=ld.partition_D(crd),
                st=st, tP=st.partition_D(tP),
                p_shape=st.partition_S(cute.make_identity_tensor((BLOCK_N, BLOCK_M // 2))).shape,
                sdSt=sdS, sLD=sLD)
            tdS_part = st.partition_D(tdS)
            ld_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            n_sdp = Int32(0)
            n_dkv = Int32(0)
            u, ustep, n_tiles, slot_row, pinned, rank = self.pair_range(sched)
            while 2 * u < n_tiles:
                b, hk, n0, seq, m_lo, n_m, steps, row0, row1 = self.pair_steps(
                    u, pinned, rank, n_keys, sched)
                key = n0 + tidx
                m_bulk = bulk_start(seq, n0, m_lo, n_m, self.causal)
                for g in cutlass.range(sched.group, unroll=1):
                    for jm in cutlass.range(m_bulk, unroll=1):                   # masked
                        self.compute_step_pair(True, io, tdS_part, m_lo + jm * BLOCK_M, key,
                                               seq, ld_state, n_sdp, pipe_ld, pipe_sdp,
                                               mbar_ds, rank, scale_log2)
                        ld_state.advance()
                        n_sdp += 1
                    for jm in cutlass.range(m_bulk, n_m, unroll=1):              # bulk
                        self.compute_step_pair(False, io, tdS_part, m_lo + jm * BLOCK_M, key,
                                               seq, ld_state, n_sdp, pipe_ld, pipe_sdp,
                                               mbar_ds, rank, scale_log2)
                        ld_state.advance()
                        n_sdp += 1
                n_dkv = self.store(mma_dk, mdK, mdV, seq, n0, hk, key, steps, scale,
                                   pipe_dkv, n_dkv)
                u += ustep

        @cute.jit
        def compute_step_pair(self, masked: cutlass.Constexpr, io, tdS, m0, key, seq,
                              ld_state, n_sdp, pipe_ld, pipe_sdp, mbar_ds, rank, scale_log2):
            """compute_step for the pair: P^T and dS^T (16-bit) into TMEM over S^T's and
            dP^T's lower columns (ascending chunks: chunk k lands on chunk k // 2, read);
            dS's query half `rank` into smem stage `rank` (dQ's A: this tile's keys), the
            other half into stage 2, sent to the peer's stage `rank` by one bulk copy."""
            tidx = cute.arch.thread_idx()[0] % 128
            bound = Int32(0)
            if const_expr(masked):
                bound = mask_bound(seq, key, m0, self.causal)
            nchunk = cute.size(io.tS, mode=[2])
            pipe_ld.consumer_wait(ld_state)
            si = ld_state.index
            pipe_sdp.sync_object_full.wait(0, n_sdp % 2)
            tc_fence_after()
            for k in cutlass.range_constexpr(nchunk):
                rS = cute.make_rmem_tensor(io.tcrd[None, None, 0].shape, Float32)
                cute.copy(io.ld, io.tS[None, None, k], rS)
                rdP = cute.make_rmem_tensor(io.tcrd[None, None, 0].shape, Float32)
                cute.copy(io.ld, io.tdP[None, None, k], rdP)
                cute.arch.fence_view_async_tmem_load()
                rP32 = cute.make_rmem_tensor(io.p_shape[:2], Float32)
                rP = cute.make_tensor(cute.recast_ptr(rP32.iterator, dtype=self.dtype),
                                      rS.layout)
                rdS32 = cute.make_rmem_tensor(io.p_shape[:2], Float32)
                rdS = cute.make_tensor(cute.recast_ptr(rdS32.iterator, dtype=self.dtype),
                                       rS.layout)
                for c in cutlass.range_constexpr(cute.size(rS)):
                    col = io.tcrd[None, None, k][c][1]
                    p = cute.math.exp2(rS[c] * scale_log2 - io.sLD[col, 0, si], fastmath=True)
                    if const_expr(masked):
                        p = 0.0 if col < bound else p
                    rP[c] = p.to(self.dtype)
                    rdS[c] = (p * (rdP[c] - io.sLD[col, 1, si])).to(self.dtype)
                cute.copy(io.st, rP32, io.tP[None, None, k])
                cute.copy(io.st, rdS32, tdS[None, None, k])
                # query half h = k // 2 (constant): stage `rank` if it is this CTA's, else 2
                h = k * cute.size(rS) // (BLOCK_M // 2)
                stage = 2 * rank if const_expr(h == 0) else 2 - rank
                w = cute.size(rS)
                row = io.sdSt[(None, tidx % 16), 0, tidx // 16, stage]
                cute.autovec_copy(rdS, cute.local_tile(row, (w,), (k % ((BLOCK_M // 2) // w),)))
            cute.arch.fence_view_async_tmem_store()
            # dS (generic proxy writes) before the MMAs and the bulk copy read it
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=XCHG_BARRIER, number_of_threads=128)
            if tidx == 0:
                peer = rank ^ 1
                nbytes = self.ds_stage * self.dtype.width // 8
                cute.arch.mbarrier_arrive_and_expect_tx(mbar_ds, nbytes,
                                                        peer_cta_rank_in_cluster=peer)
                blackwell.bulk_copy_to_peer(io.sdSt[None, None, None, 2].iterator,
                                            io.sdSt[None, None, None, rank].iterator,
                                            mbar_ds, nbytes, peer)
            pipe_ld.consumer_release(ld_state)
            pipe_sdp.sync_object_empty.arrive(0, pipe_sdp.consumer_mask)

        # ------------------------------------------------------------------ reduce_dq
        @cute.jit
        def reduce_pair(self, mma_s, mdQacc, sdQ, sdQ_layout, tma_atom_dQ, pipe_dq, sched):
            """Each step's dQ, this CTA's 64 rows of the pair's sum (lane l: row l % 64,
            D's half l // 64), reduce-added in (64, 32) boxes: per 32-column chunk the
            four warps stage 128 rows (two boxes) in one buffer, two reduces read it."""
            tidx = cute.arch.thread_idx()[0] % 128
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            th = mma_s.get_slice(0)
            acc = th.make_fragment_C(th.partition_shape_C(self.tiler_s[:2]))[(None, None), 0, 0]
            acc = cute.make_tensor(acc.iterator + self.tmem_dq, cute.composition(
                acc.layout, cute.make_layout((BLOCK_M, BLOCK_M // 2))))
            ld = tcgen05.make_tmem_copy(cute.make_copy_atom(
                tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(DQ_WIDE)), Float32), acc
            ).get_slice(tidx)
            tdQ = ld.partition_S(acc)
            chunks = cute.size(tdQ, mode=[2])
            vshape = ld.partition_D(cute.make_identity_tensor(acc.shape))[None, None, 0].shape
            box = cute.cosize(sdQ_layout)
            lay128 = bwd_hopper.dq_smem_layout(DQ_WIDE, BLOCK_M)
            buf_w = cute.make_tensor(sdQ.iterator, element_swizzled(lay128, Float32))
            boxes = [cute.make_tensor(cute.recast_ptr(sdQ.iterator + e * box,
                                                      sdQ_layout.inner, dtype=Float32),
                                      sdQ_layout.outer) for e in range(2)]
            n_dq = Int32(0)
            u, ustep, n_tiles, slot_row, pinned, rank = self.pair_range(sched)
            while 2 * u < n_tiles:
                b, hk, n0, seq, m_lo, n_m, steps, row0, row1 = self.pair_steps(
                    u, pinned, rank, 0, sched)
                for j in cutlass.range(steps, unroll=1):
                    h = hk * sched.group + j // n_m
                    m0 = m_lo + (j % n_m) * BLOCK_M + rank * (BLOCK_M // 2)
                    pipe_dq.sync_object_full.wait(0, n_dq % 2)
                    tc_fence_after()
                    for k in cutlass.range_constexpr(chunks):
                        v = cute.make_rmem_tensor(vshape, Float32)
                        cute.copy(ld, tdQ[None, None, k], v)
                        cute.arch.fence_view_async_tmem_load()
                        if const_expr(k == chunks - 1):     # dQ read: dP^T may follow
                            pipe_dq.sync_object_empty.arrive(0, pipe_dq.consumer_mask)
                        # the buffer: the last chunk's reduces have read it
                        if warp == REDUCE_WARP:
                            cute.arch.cp_async_bulk_wait_group(0, read=True)
                        cute.arch.barrier(barrier_id=DQ_BARRIER, number_of_threads=128)
                        cute.autovec_copy(v, buf_w[tidx, None])
                        cute.arch.fence_proxy("async.shared", space="cta")
                        cute.arch.barrier(barrier_id=DQ_BARRIER, number_of_threads=128)
                        if warp == REDUCE_WARP:
                            for e in cutlass.range_constexpr(2):
                                ts, tg = tma_tiles(tma_atom_dQ, boxes[e], head_tile(
                                    mdQacc, slot_row + seq.q_start + m0, h, BLOCK_M // 2,
                                    DQ_WIDE, (0, e * chunks + k)))
                                cute.copy(tma_atom_dQ, ts, tg)
                            cute.arch.cp_async_bulk_commit_group()
                    n_dq += 1
                u += ustep
            if warp == REDUCE_WARP:
                cute.arch.cp_async_bulk_wait_group(0, read=False)

    return BwdBlackwell, BwdBlackwellPair


# --------------------------------------------------------------------------------------
# Host: compile once per config (on symbolic tensors), then launch
# --------------------------------------------------------------------------------------

def build(dtype, head_dim: int, causal: bool, broadcast_q: bool, cfg: Config | None = None):
    """The kernel object (its tmem_total, shared_storage, cluster_shape set once compiled)."""
    cfg = pick_config(head_dim, broadcast_q) if cfg is None else cfg
    one, pair = _kernel_class()
    return (pair if cfg.two_cta else one)(host.cute_dtype(dtype), head_dim, causal,
                                          broadcast_q, cfg)


def compile_main(dtype, head_dim: int, causal: bool, broadcast_q: bool,
                 cfg: Config | None = None, options: str = "", kernel=None):
    """Compile the main kernel (no GPU needed with CUTE_DSL_ARCH=sm_100a)."""
    import cutlass
    k_ = build(dtype, head_dim, causal, broadcast_q, cfg) if kernel is None else kernel
    return host.compile_kernel(k_, *host.bwd_args(k_.dtype, head_dim), cutlass.Float32(1.0),
                               cutlass.Int32(0), cutlass.Int32(1), cutlass.Int32(1),
                               cutlass.Int32(1), options=options)


def _main(c: host.BwdCall):
    """The main kernel over the KV-tile list (module docstring)."""
    cfg = pick_config(c.q.shape[2], c.broadcast_q)
    grid = pair_grid(c.grid, c.k.shape[1]) if cfg.two_cta else c.grid
    tile_b, tile_n, n_tiles = kv_tiles(c.cu_q, c.cu_k, c.L_q, c.max_k, c.causal, BLOCK_M,
                                       BLOCK_N)
    host.compiled(_COMPILED, compile_main, c.q.dtype, c.q.shape[2], c.causal, c.broadcast_q,
                  cfg)(
        c.q, c.k, c.v, c.dout, c.lse, c.delta, c.dq_acc, c.dk, c.dv,
        c.cu_q if c.cu_q is not None else c.cu_k, c.cu_k, tile_b, tile_n, n_tiles,
        c.scale, c.L_q, c.n_slots, c.group, grid)


# the preprocess and postprocess are bwd_hopper's (plain SIMT code); dQ is reduce-added
# from TMEM in TMA boxes over its rows (no block-padded form: post_flat None)
KERNELS = host.BwdKernels(partial(host.compiled, _COMPILED, bwd_hopper.compile_preprocess),
                          _main, partial(host.compiled, _COMPILED, bwd_hopper.compile_postprocess),
                          bwd_hopper.POST_VEC)


def backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q,
             dlse=None):
    """(dq, dk, dv) in q's dtype (the module docstring has the design). dlse: the
    gradient on lse, or None."""
    return host.backward(KERNELS, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal,
                         scale, broadcast_q, dlse)
