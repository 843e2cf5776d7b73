"""Jagged (varlen, packed) flash-attention forward for Hopper (sm_90a), in CuteDSL.

    forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q, descale=None)
        -> (out [Nq, H, D] in q's dtype (fp8: bf16), lse [H, Nq] fp32)

The CuteDSL twin of `kernels_tlx/fwd_hopper.py`: same roles, same names, same order.

A persistent grid (one CTA per SM) walks the jagged tile list of `schedule.py`
(longest first, causal lists by sequence; a sequence's query blocks per head; CTA p
takes the p-th tile of each round of P, odd full rounds counted from the right).
Each CTA is warp specialized (1 + Config.block_m // 64 warpgroups: 384 threads, or 512
at block_m = 192, the D = 64 long default):

    warpgroup 0, warp 0   `load`    TMA: Q once per tile into one of 2 slots (the next
                                    tile's Q loads during this one), K and V per KV block
                                    into a num_buffers_kv-deep ring (cutlass.pipeline
                                    PipelineTmaAsync: full/empty mbarriers)
    warpgroups 1, 2 (, 3) `compute` S = Q K^T (wgmma, smem x smem), online softmax in
                                    exp2, O += P V (wgmma, P from registers); each
                                    warpgroup owns 64 of the block_m = 128 (192) query
                                    rows. Block n's softmax runs under the PV wgmma of
                                    block n - 1, and the warpgroups take turns issuing
                                    (a ring of named barriers: ping-pong at 2)
                          `store`   O / rowsum -> the tile's Q slot (stmatrix; fp8: an
                                    O buffer of its own) -> global,
                                    predicated per row so no row outside the sequence is
                                    written; LSE in fp32 (-inf and O = 0 on rows that see
                                    no key); then the Q slot goes back to `load`

The kernel is launched as a programmatic dependent of its tile-list kernel (use_pdl; the
list kernels trigger first): its launch and barrier setup run under the list kernel, and
it waits (griddepcontrol.wait) before it reads global memory.

Causal packed lists take their tiles from a counter (Config.dynamic, jagged.tiles.
fwd_dynamic), as the backward's: the load warp's first tile is its CTA id, each next one
an atomic add once the last one's loads are issued (tile_counter.next_tile), handed to
the consumers (and fp8_v's converting warps) through the scheduling buffer's two slots a
CTA (publish_tile / fetch_tile); the static round-robin deals a causal list's sawtooth of
tile lengths unevenly. The buffer (mSched, jagged.tiles.fwd_sched) is zeroed by the list
kernel, and again by the launch's last CTA to finish its loads (`finish_tiles`), so a
reused list runs without a launch ahead.

The KV loop is peeled: blocks [0, n_bulk) are visible to every row of the tile and run
branch-free; blocks [n_bulk, n_end) (the sequence tail and the causal diagonal) are
masked. Causal masking is bottom-right aligned: query i sees key j iff
j <= i + len_k - len_q.

Modes: self / cross (packed q with cu_q), broadcast_q (one dense q [L_q, H, D] shared
by all B sequences; out [B * L_q, H, D]), GQA (kv head = h // (H // H_kv)), head dims
64 and 128, bf16 and fp16. One compiled kernel per (dtype, D, causal, broadcast_q, Config):
shapes, lengths, strides and scale are runtime values (compiled on symbolic tensors).
Broadcast-Q with a short L_q under GQA packs the group's heads into a tile's rows
(Config.pack, jagged.tiles.gqa_pack): q comes in packed, O and LSE are viewed through a
(pack, rows) layout (`fragments.packed_views`) that puts each row back in its query row
and head.

Row windows (`takes_windows`: short packed queries, mean length at most half a tile;
the `window_config` build): a tile is a window of whole sequences of at most 128 packed
query rows together, or a 128-row block of a longer one (jagged.tiles.windows /
window_tiles, schedule.window_coords), so a tile of short sequences is not mostly empty
rows. `load` is unchanged (Q at the
window's first row, K / V from its first sequence's first key, up to the last key any
of its rows sees); `compute` finds each of its rows' sequence and key columns once a
tile (`row_ranges`) and masks every KV block to them (`window_mask`: no unmasked bulk);
`store` writes the window's real rows. fp8: each row's softmax scale takes its own
sequence's descales (`row_ranges`; V tiles: its v_descale on O too). Not for broadcast-Q.

fp8 (q's dtype float8_e4m3fn, `forward(..., descale=)`): Q and K in e4m3, S = Q K^T an
e4m3 wgmma (both operands K-major as laid out: no transpose) with the tile's q_descale *
k_descale of its (sequence, KV head) folded into the softmax scale; P V in 16 bits, out
bf16, staged in a bf16 O buffer (an e4m3 Q slot holds half of O's bytes). V reaches the
P V wgmma one of two ways (`fp8_v_tiles`, by the query rows a KV head serves):
- V tiles (Config.fp8_v, few rows a KV head): V stays e4m3 in global memory. The load
  warp TMAs each V tile in e4m3 into a ring of its own, and the load warpgroup's four
  warps convert it to f16 into the ring the P V wgmma reads (`v_to_f16`), one block
  behind the loads so the next K and V copies are in flight meanwhile (e4m3 -> f16 is
  exact, one cvt a pair; P goes to f16 too). The consumers are unchanged: pipeline_v's
  full barrier now means "f16 tile ready" (an arrive a converting warp), its empty one
  "f16 slot free". v_descale, one scalar per (sequence, KV head), commutes with P V and
  scales O in `store`.
- otherwise V dequantized to bf16 once a call (jagged.fp8.dequantize_rows, v_descale
  folded in), as TLX's forward always does: P V is the bf16 path.
"""

import math
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, Optional

from jagged.tiles import FWD_SHORT_MEAN_K, fwd_bucket, fwd_consumers, windowed

from . import host
from .schedule import kv_block, kv_steps, tile_coords, window_coords
from .seqinfo import ROW_SEQ_CHUNK, row_kv_range, row_seq_chunk

SPLIT_M = 64           # query rows of one consumer (compute + store) warpgroup
LOAD_REGS = 24         # setmaxnreg of the load warpgroup (the consumers': fwd_consumers)
SCHED_BARRIER = 2      # named barrier ids (0 = syncthreads, 1 unused): 2 .. 1 + N:
                       # consumer wg may issue its wgmmas (a ring of turns); the next N:
                       # consumer wg's own epilogue (`store`); N = 2: 2, 3 and 4, 5


@dataclass(frozen=True)
class Config:
    block_m: int          # query rows per tile: block_m // 64 consumer warpgroups (2, or 3
                          # at 192, FA4's D = 64 tile, consumers at 160 registers)
    block_n: int          # keys per KV block
    num_buffers_kv: int   # depth of the K/V ring
    mask_first: bool      # the masked last KV block first (schedule.kv_block): a
                          # non-causal tile runs one masked softmax, not two
    num_buffers_q: int = 2    # Q double buffer (16-bit: a slot also stages its tile's O)
    windows: bool = False     # tiles are row windows (`window_config`), not (sequence,
                              # query block) pairs
    pack: int = 1             # broadcast-Q: query heads a tile's rows hold (a call's
                              # jagged.tiles.gqa_pack; q comes in packed, O and LSE out not)
    direct: bool = False      # no tile list: one wave, the pairs in order (a call's
                              # jagged.tiles.fwd_direct)
    fp8_v: bool = False       # fp8: V converted tile by tile in the kernel (a call's
                              # fp8_v_tiles), P V in f16, v_descale on O
    dynamic: bool = False     # tiles from the counter in mSched (a call's
                              # jagged.tiles.fwd_dynamic: causal packed lists)


def smem_bytes(head_dim: int, cfg: Config, fp8: bool = False) -> int:
    """Bytes of the forward's SharedStorage: the mbarriers (padded to sQ's 1 KB
    alignment), the Q slots and the K / V rings; fp8: Q and K in e4m3 and an O buffer in
    bf16 a Q slot. FwdHopper asserts it equals the struct's size at trace time. The
    largest, fp8 D = 128 long: 193 KB; with fp8_v (V in f16, and its e4m3 ring): 225 KB."""
    D, bm, bn = head_dim, cfg.block_m, cfg.block_n
    qk = 1 if fp8 else 2                                     # bytes of a Q / K element
    n = 1024 + qk * D * (bm * cfg.num_buffers_q + bn * cfg.num_buffers_kv)
    n += 2 * D * bn * cfg.num_buffers_kv                     # V, 16-bit
    if fp8:
        n += 2 * D * bm * cfg.num_buffers_q                  # O, bf16
    if cfg.fp8_v:
        n += D * bn * cfg.num_buffers_kv                     # V's e4m3 ring
    return n


# fp8: V converted tile by tile in the load warps (Config.fp8_v) where that costs less
# than the once-a-call V pass. The pass reads and writes each key's V once a KV head; the
# conversions run once a (query tile, KV block), so their share grows with the query rows
# a KV head serves, G * mean_k. Replayed, against the pass (H200): gem-jagged D128 fp8
# at G * mean_k 134 / 507 / 1844: -13.9 / -8.9 / -4.2 %; llm-dense B4 H32/8 4096 (16384):
# +4.5 %, causal +2.1 %.
FP8_V_TILES_MAX = 4096


def fp8_v_tiles(group: int, mean_k: float) -> bool:
    """Whether an fp8 call converts V in the kernel (host.FwdKernels.fp8_v): group, query
    heads a KV head (broadcast-Q too); mean_k, total keys / batch."""
    return group * mean_k <= FP8_V_TILES_MAX


# The measured defaults, keyed by (head_dim, length bucket, causal); the bucket is
# "short" (64-key blocks) for short sequences, by max or mean KV length, else "long"
# (jagged.tiles.fwd_bucket). Broadcast-Q and packed share them. TLX's table, except:
#   192-row tiles at D = 64, long, causal too: llm B16 H16 D64 2048 -11.5 % non-causal,
#     -5.2 % causal against 128 rows (TLX's causal masked steps spill at 160 registers);
#   the softmax of block n under the PV wgmma of block n - 1 and the consumers'
#     ping-pong on every bucket (TLX: the long ones).
#   mask_first non-causal: gem 256 / 0.5 -4.5 % (elsewhere within +-1 %); causal +2.8 %
#     in TLX (a causal tile's diagonal steps are masked either way).
CONFIGS = {
    (64, "long", False): Config(block_m=192, block_n=128, num_buffers_kv=3, mask_first=True),
    (64, "long", True): Config(block_m=192, block_n=128, num_buffers_kv=3, mask_first=False),
    (64, "short", False): Config(block_m=128, block_n=64, num_buffers_kv=3, mask_first=True),
    (64, "short", True): Config(block_m=128, block_n=64, num_buffers_kv=3, mask_first=False),
    (128, "long", False): Config(block_m=128, block_n=128, num_buffers_kv=2, mask_first=True),
    (128, "long", True): Config(block_m=128, block_n=128, num_buffers_kv=2, mask_first=False),
    (128, "short", False): Config(block_m=128, block_n=64, num_buffers_kv=3, mask_first=True),
    (128, "short", True): Config(block_m=128, block_n=64, num_buffers_kv=3, mask_first=False),
}


def pick_config(head_dim: int, max_seqlen_k: int, causal: bool,
                mean_k: float | None = None) -> Config:
    """The measured default for a call (mean_k: total keys / batch, None if unknown)."""
    return CONFIGS[(head_dim, fwd_bucket(max_seqlen_k, mean_k, causal), bool(causal))]


def window_config(head_dim: int) -> Config:
    """Row windows: the short bucket's tile, its first KV block read first (every block
    of a window is masked, so mask_first would only reorder them)."""
    return Config(block_m=128, block_n=64, num_buffers_kv=3, mask_first=False, windows=True)


def takes_windows(n_rows: int, n_keys: int, batch: int, max_q: int,
                  broadcast_q: bool) -> bool:
    """Whether a call runs on row windows (jagged.tiles.windowed: short packed queries,
    decided on the host without a sync) over short keys (mean at most FWD_SHORT_MEAN_K:
    over long keys a window's rows skip most of what it reads, every step masked);
    broadcast-Q never does. fp8 too: each row takes its own sequence's descales
    (`row_ranges`)."""
    return (n_keys <= FWD_SHORT_MEAN_K * batch
            and windowed(n_rows, batch, max_q, 128, broadcast_q))


# role: schedule
class Sched(NamedTuple):
    """What every role needs to decode a tile id (schedule.tile_coords)."""
    mPairs: Any          # the tile list: (batch element, query block) pairs; row
                         # windows: the window order
    n_pairs: Any         # valid pairs (live windows), on the device
    mCuQ: Any
    mCuK: Any
    L_q: Any             # broadcast-Q: the dense query length
    H: Any
    group: Any           # query heads per KV head
    nblk: Any            # query blocks per sequence (the pair encoding's stride);
                         # row windows: the windows (unused)
    mWin: Any            # row windows: each window's first and last sequence and first
                         # row [3, n_win]
    mSched: Any = None   # dynamic: the counter and the tile handoff slots (tile_counter)
    pipeline_tile: Any = None  # dynamic: the handoff's barriers, load warp -> the others


class Scales(NamedTuple):
    """fp8: the descales fp32 [B, H_kv] the softmax scale of a tile takes (None
    otherwise); fp8_v: v_descale, O's."""
    q: Any
    k: Any
    v: Any = None


class Operands(NamedTuple):
    """A consumer warpgroup's wgmmas, operand fragments, accumulators and softmax state."""
    tiled_mma_qk: Any
    tiled_mma_pv: Any
    shape_S: Any
    tSrQ: Any            # the tile's Q slot
    tSrK: Any
    tOrVt: Any
    tOrP: Any
    acc_O: Any
    tScS: Any            # (row, col) of every S accumulator element
    row_max: Any
    row_sum: Any
    scale_log2: Any
    pipeline_k: Any
    pipeline_v: Any
    wg: Any              # this consumer warpgroup


_COMPILED = {}


# --------------------------------------------------------------------------------------
# The kernel (all CuteDSL imports are inside `_kernel_class`, so importing this module
# touches neither the DSL nor the driver).
# --------------------------------------------------------------------------------------

def _kernel_class():
    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    import cutlass.utils.hopper_helpers as sm90
    from cutlass import Float32, Int32, const_expr
    from cutlass.cute.nvgpu import cpasync, warpgroup
    from cutlass.utils import LayoutEnum

    LN_2 = math.log(2.0)

    from .fragments import (acc_as_operand_a, acc_rows_cols, head_tile, packed_views,
                            replaced, store_rows, tma_tiles, wgmma)
    from .tile_counter import fetch_tile, finish_tiles, next_tile, publish_tile

    class FwdHopper:
        def __init__(self, dtype, head_dim: int, causal: bool, broadcast_q: bool,
                     cfg: Config):
            # consumer warpgroups, each 64 rows of the tile, and their registers
            self.num_mma_wg, self.mma_regs = fwd_consumers(cfg.block_m, LOAD_REGS)
            self.cfg = cfg
            self.block_m = cfg.block_m
            self.num_threads = 128 * (self.num_mma_wg + 1)
            self.epilogue_barrier = SCHED_BARRIER + self.num_mma_wg  # after the ring's ids
            self.block_n, self.stages = cfg.block_n, cfg.num_buffers_kv
            self.q_stages = cfg.num_buffers_q
            self.mask_first = cfg.mask_first
            self.dtype = dtype        # Q's and K's
            # fp8: e4m3 Q and K; V (dequantized once a call), P and O in bf16
            self.fp8 = dtype.width == 8
            self.pv_dtype = cutlass.BFloat16 if self.fp8 else dtype
            self.o_dtype = self.pv_dtype
            # fp8_v: V converted from e4m3 in the kernel, P V in f16 (O stays bf16)
            self.fp8_v = cfg.fp8_v
            if self.fp8_v:
                self.pv_dtype = cutlass.Float16
            self.D = head_dim
            self.causal = causal
            self.broadcast_q = broadcast_q
            self.windows = cfg.windows
            self.pack = cfg.pack
            self.direct = cfg.direct
            self.dynamic = cfg.dynamic
            # dynamic: the threads that fetch each tile from the load warp (tile_counter):
            # the consumers', and fp8_v's three other converting warps'
            self.tile_fetchers = 128 * self.num_mma_wg + (96 if self.fp8_v else 0)
            assert not (self.windows and (broadcast_q or self.mask_first))
            assert not (self.dynamic and self.direct)   # direct: no list, no counter
            # fp8 row windows: a softmax scale (and, fp8_v, a v_descale) per row, its own
            # sequence's descales
            self.row_scale = self.windows and self.fp8
            assert self.pack == 1 or (broadcast_q and 64 % self.pack == 0)
            assert not (self.direct and (self.windows or self.fp8))
            assert self.fp8 or not self.fp8_v

        # ------------------------------------------------------------------ host side
        @cute.jit
        def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                     mO: cute.Tensor, mLSE: cute.Tensor, mCuQ: Optional[cute.Tensor],
                     mCuK: cute.Tensor, mPairs: cute.Tensor, mCount: cute.Tensor,
                     mQDescale: Optional[cute.Tensor], mKDescale: Optional[cute.Tensor],
                     mVDescale: Optional[cute.Tensor],
                     mWin: Optional[cute.Tensor], mSched: cute.Tensor, scale_log2: Float32,
                     L_q: Int32,
                     group: Int32, nblk: Int32, num_programs: Int32, stream):
            D, dt, pv, od = self.D, self.dtype, self.pv_dtype, self.o_dtype
            if const_expr(self.pack > 1):
                mO, mLSE = packed_views(mO, mLSE, self.pack)
            # [tokens, heads, D] -> (tokens, D, heads): the TMA boxes tile (rows, D)
            mQ, mK, mV, mO = [cute.make_tensor(t.iterator, cute.select(t.layout, mode=[0, 2, 1]))
                              for t in (mQ, mK, mV, mO)]
            # smem: Q, K, V, O tiles, swizzled along D (K-major for both GEMMs)
            atom = warpgroup.make_smem_layout_atom(
                sm90.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dt, D), dt)
            atom_pv = atom                               # V's and O's
            if const_expr(self.fp8):
                atom_pv = warpgroup.make_smem_layout_atom(
                    sm90.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, pv, D), pv)
            atom_o = atom_pv
            if const_expr(self.fp8_v):
                atom_o = warpgroup.make_smem_layout_atom(
                    sm90.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, od, D), od)
            sQ_layout = cute.tile_to_shape(atom, (self.block_m, D, self.q_stages), (0, 1, 2))
            sK_layout = cute.tile_to_shape(atom, (self.block_n, D, self.stages), (0, 1, 2))
            sV_layout = cute.tile_to_shape(atom_pv, (self.block_n, D, self.stages), (0, 1, 2))
            # O is staged in the tile's Q slot; fp8: in a bf16 buffer of its own a slot
            sO_layout = sQ_layout
            if const_expr(self.fp8):
                sO_layout = cute.tile_to_shape(atom_o, (self.block_m, D, self.q_stages),
                                               (0, 1, 2))
            # fp8_v: V lands in e4m3 (the TMA's ring), swizzled as K
            sV8_layout = sV_layout
            if const_expr(self.fp8_v):
                sV8_layout = cute.tile_to_shape(atom, (self.block_n, D, self.stages), (0, 1, 2))

            # wgmma: each consumer warpgroup owns 64 rows (atom layout N x 1 x 1)
            tiled_mma_qk = sm90.make_trivial_tiled_mma(
                dt, dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K, Float32,
                atom_layout_mnk=(self.num_mma_wg, 1, 1), tiler_mn=(64, self.block_n))
            tiled_mma_pv = sm90.make_trivial_tiled_mma(
                pv, pv, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN, Float32,
                atom_layout_mnk=(self.num_mma_wg, 1, 1), tiler_mn=(64, D),
                a_source=warpgroup.OperandSource.RMEM)

            # TMA atoms for Q, K, V (loads); O goes out through smem + predicated stores
            g2s = cpasync.CopyBulkTensorTileG2SOp()
            tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(
                g2s, mQ, cute.select(sQ_layout, mode=[0, 1]), (self.block_m, D))
            tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(
                g2s, mK, cute.select(sK_layout, mode=[0, 1]), (self.block_n, D), 1)
            tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(
                g2s, mV, cute.select(sV8_layout, mode=[0, 1]), (self.block_n, D), 1)
            self.bytes_Q = cute.size_in_bytes(dt, cute.select(sQ_layout, mode=[0, 1]))
            self.bytes_K = cute.size_in_bytes(dt, cute.select(sK_layout, mode=[0, 1]))
            self.bytes_V = cute.size_in_bytes(mV.element_type,
                                              cute.select(sV8_layout, mode=[0, 1]))

            # O: smem -> gmem, 16-byte vectors, one warpgroup's threads laid out inside a
            # swizzle atom (each consumer stores its own rows, `store`)
            vec = 128 // od.width
            cols = atom_o.outer.shape[1] // vec
            store_tiled_copy_O = cute.make_tiled_copy_tv(
                cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), od, num_bits_per_copy=128),
                cute.make_ordered_layout((128 // cols, cols), order=(1, 0)),
                cute.make_layout((1, vec)))

            @cute.struct
            class SharedStorage:
                mbar_Q: cute.struct.MemRange[cutlass.Int64, 2 * self.q_stages]
                mbar_K: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
                mbar_V: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
                if const_expr(self.fp8_v):
                    mbar_V8: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
                if const_expr(self.dynamic):
                    mbar_Tile: cute.struct.MemRange[cutlass.Int64, 2 * 2]
                sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
                sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
                sV: cute.struct.Align[cute.struct.MemRange[pv, cute.cosize(sV_layout)], 1024]
                if const_expr(self.fp8):
                    sO: cute.struct.Align[cute.struct.MemRange[od, cute.cosize(sO_layout)],
                                          1024]
                if const_expr(self.fp8_v):
                    sV8: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV8_layout)],
                                           1024]

            # the host-side model is the struct
            assert SharedStorage.size_in_bytes() == smem_bytes(D, self.cfg, self.fp8), \
                (SharedStorage.size_in_bytes(), smem_bytes(D, self.cfg, self.fp8))
            self.kernel(
                tma_Q, tma_K, tma_V, mO, mLSE, mCuQ, mCuK, mPairs, mCount,
                mQDescale, mKDescale, mVDescale, mWin, mSched,
                tma_atom_Q, tma_atom_K, tma_atom_V, scale_log2, L_q, group, nblk,
                sQ_layout, sK_layout, sV_layout, sO_layout, sV8_layout,
                tiled_mma_qk, tiled_mma_pv, store_tiled_copy_O, SharedStorage,
            ).launch(grid=[num_programs, 1, 1], block=[self.num_threads, 1, 1],
                     stream=stream, min_blocks_per_mp=1, use_pdl=True)

        # ------------------------------------------------------------------ the kernel
        @cute.kernel
        def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                   mO: cute.Tensor, mLSE: cute.Tensor, mCuQ: Optional[cute.Tensor],
                   mCuK: cute.Tensor, mPairs: cute.Tensor, mCount: cute.Tensor,
                   mQDescale: Optional[cute.Tensor], mKDescale: Optional[cute.Tensor],
                   mVDescale: Optional[cute.Tensor],
                   mWin: Optional[cute.Tensor], mSched: cute.Tensor,
                   tma_atom_Q: cute.CopyAtom,
                   tma_atom_K: cute.CopyAtom, tma_atom_V: cute.CopyAtom, scale_log2: Float32,
                   L_q: Int32, group: Int32, nblk: Int32,
                   sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
                   sV_layout: cute.ComposedLayout, sO_layout: cute.ComposedLayout,
                   sV8_layout: cute.ComposedLayout, tiled_mma_qk: cute.TiledMma, tiled_mma_pv: cute.TiledMma,
                   store_tiled_copy_O: cute.TiledCopy,
                   SharedStorage: cutlass.Constexpr):
            warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            if warp_idx == 0:
                for a in (tma_atom_Q, tma_atom_K, tma_atom_V):
                    cpasync.prefetch_descriptor(a)

            smem = cutlass.utils.SmemAllocator()
            storage = smem.allocate(SharedStorage)

            # pipelines: producer = the load warp (TMA bytes complete the phase),
            # consumer = the 8 (12) compute warps (one elected arrive per warp)
            load_warp = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
            mma_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_wg * 4)
            pipeline_q = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_Q.data_ptr(), num_stages=self.q_stages,
                producer_group=load_warp, consumer_group=mma_warps,
                tx_count=self.bytes_Q, defer_sync=True)
            pipeline_k = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_K.data_ptr(), num_stages=self.stages,
                producer_group=load_warp, consumer_group=mma_warps,
                tx_count=self.bytes_K, defer_sync=True)
            if const_expr(self.fp8_v):
                # the f16 ring: filled by the load warpgroup's four warps (an arrive each,
                # no bytes); the e4m3 ring: TMA in, the four warps' reads out
                convert_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4)
                pipeline_v = pipeline.PipelineTmaAsync.create(
                    barrier_storage=storage.mbar_V.data_ptr(), num_stages=self.stages,
                    producer_group=convert_warps, consumer_group=mma_warps,
                    tx_count=0, defer_sync=True)
                pipeline_v8 = pipeline.PipelineTmaAsync.create(
                    barrier_storage=storage.mbar_V8.data_ptr(), num_stages=self.stages,
                    producer_group=load_warp, consumer_group=convert_warps,
                    tx_count=self.bytes_V, defer_sync=True)
            else:
                pipeline_v = pipeline.PipelineTmaAsync.create(
                    barrier_storage=storage.mbar_V.data_ptr(), num_stages=self.stages,
                    producer_group=load_warp, consumer_group=mma_warps,
                    tx_count=self.bytes_V, defer_sync=True)
            pipeline_tile = None
            if const_expr(self.dynamic):
                # the tile handoff, load warp -> every thread of the consumers and (fp8_v)
                # of the three other converting warps, which walk the tiles too (two
                # slots; the tile ids themselves go through mSched, see tile_counter)
                pipeline_tile = pipeline.PipelineAsync.create(
                    barrier_storage=storage.mbar_Tile.data_ptr(), num_stages=2,
                    producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 32),
                    consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                             self.tile_fetchers),
                    defer_sync=True)
            pipeline.pipeline_init_arrive()

            sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
            sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
            # O is staged through the tile's own Q slot (Q is dead after the last QK); fp8:
            # its bf16 O buffer
            if const_expr(self.fp8):
                sO = storage.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
            else:
                sO = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            # V^T view (D, self.block_n, stages) for the PV wgmma (B operand, MN-major)
            sVt = cute.composition(
                sV, cute.make_ordered_layout((self.D, self.block_n, self.stages), order=(1, 0, 2)))

            # a programmatic dependent of the tile-list kernel (jagged.tiles PDL): global
            # memory (the tile count first) only once the kernels ahead have finished.
            # direct (jagged.tiles.fwd_direct): no list, the kernel ahead is the offsets
            # check, and only the stores wait for it (`store`); the reads before it touch
            # the offsets and TMA boxes, which the hardware bounds
            if const_expr(self.direct):
                sched = Sched(None, (mCuK.shape[0] - 1) * nblk, mCuQ, mCuK, L_q, mQ.shape[2],
                              group, nblk, mWin)
            else:
                cute.arch.griddepcontrol_wait()
                sched = Sched(mPairs, mCount[0], mCuQ, mCuK, L_q, mQ.shape[2], group, nblk,
                              mWin, mSched, pipeline_tile)
            pipeline.pipeline_init_wait()

            if warp_idx < 4:
                cute.arch.setmaxregister_decrease(LOAD_REGS)
                if const_expr(self.fp8_v):  # warp 0 loads, all four convert
                    sV8 = storage.sV8.get_tensor(sV8_layout.outer, swizzle=sV8_layout.inner)
                    self.load(mQ, mK, mV, sQ, sK, sV, sV8, tma_atom_Q, tma_atom_K, tma_atom_V,
                              pipeline_q, pipeline_k, pipeline_v, pipeline_v8, sched,
                              warp_idx == 0)
                elif warp_idx == 0:
                    self.load(mQ, mK, mV, sQ, sK, sV, None, tma_atom_Q, tma_atom_K, tma_atom_V,
                              pipeline_q, pipeline_k, pipeline_v, None, sched, True)
            else:
                cute.arch.setmaxregister_increase(self.mma_regs)
                tidx = cute.arch.thread_idx()[0] - 128
                self.compute(mO, mLSE, sQ, sK, sVt, sO, pipeline_q, pipeline_k, pipeline_v,
                             tiled_mma_qk, tiled_mma_pv, store_tiled_copy_O, tidx,
                             scale_log2, Scales(mQDescale, mKDescale, mVDescale), sched)

        # ------------------------------------------------------------------ schedule
        @cute.jit
        def schedule(self, tile: Int32, sched: Sched):
            """Tile id -> where it lives (schedule.tile_coords); row windows:
            schedule.window_coords, which also gives the window's last sequence."""
            if const_expr(self.windows):
                return window_coords(tile, sched.mPairs, sched.n_pairs, sched.mWin,
                                     sched.mCuQ, sched.mCuK, sched.H, sched.group,
                                     self.block_m, self.block_n, self.causal)
            return tile_coords(tile, sched.mPairs, sched.n_pairs, sched.mCuQ, sched.mCuK,
                               sched.L_q, sched.H, sched.group, sched.nblk, self.block_m,
                               self.block_n, self.causal, self.broadcast_q, self.pack,
                               self.direct)

        # ------------------------------------------------------------------ load
        @cute.jit
        def load(self, mQ, mK, mV, sQ, sK, sV, sV8, tma_atom_Q, tma_atom_K, tma_atom_V,
                 pipeline_q, pipeline_k, pipeline_v, pipeline_v8, sched, issuer):
            """Each tile's Q box and its K and V blocks into their rings, by the warp where
            `issuer` holds (warp 0). fp8_v: run by the load warpgroup's four warps; V lands
            in e4m3 in sV8, and each block goes to the f16 ring one block behind the
            copies (`v_to_f16`), a tile's last block at its end."""
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                   self.q_stages)
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                    self.stages)
            sV_in, pipeline_v_in = sV, pipeline_v   # where V's copies land
            if const_expr(self.fp8_v):
                sV_in, pipeline_v_in = sV8, pipeline_v8
                v8_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                        self.stages)
                v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                       self.stages)
            num_tiles = sched.n_pairs * sched.H
            tile = cute.arch.block_idx()[0]
            i = Int32(0)            # dynamic: the CTA's tiles so far (tile_counter's slots)
            if const_expr(self.dynamic):
                tile = self.share_tile(tile, i, sched, issuer)
            while tile < num_tiles:
                h, hk, m0, seq, n_bulk, n_end, b = self.schedule(tile, sched)[:7]
                # Q: one (block_m, D) box at row q_start + m0 of head h, into the next of
                # q_stages slots (always: the 16-bit build stages this tile's O there)
                if issuer:
                    tQsQ, tQgQ = tma_tiles(tma_atom_Q, sQ, head_tile(
                        mQ, seq.q_start + m0, h, self.block_m, self.D))
                    pipeline_q.producer_acquire(q_state)
                    cute.copy(tma_atom_Q, tQgQ, tQsQ[None, q_state.index],
                              tma_bar_ptr=pipeline_q.producer_get_barrier(q_state))
                q_state.advance()
                if n_end > 0:
                    # K, V: (block_n, D) boxes of kv head hk; block n at row k_start + n*block_n
                    tKsK, tKgK = tma_tiles(tma_atom_K, sK, head_tile(
                        mK, seq.k_start, hk, self.block_n, self.D, (None, 0)))
                    tVsV, tVgV = tma_tiles(tma_atom_V, sV_in, head_tile(
                        mV, seq.k_start, hk, self.block_n, self.D, (None, 0)))
                    for n in cutlass.range(n_end, unroll=1):
                        blk = kv_block(n, n_end, self.mask_first)
                        if issuer:
                            pipeline_k.producer_acquire(kv_state)
                            cute.copy(tma_atom_K, tKgK[None, blk], tKsK[None, kv_state.index],
                                      tma_bar_ptr=pipeline_k.producer_get_barrier(kv_state))
                            # fp8_v: the e4m3 slot is free once the four warps converted it
                            pipeline_v_in.producer_acquire(kv_state)
                            cute.copy(tma_atom_V, tVgV[None, blk], tVsV[None, kv_state.index],
                                      tma_bar_ptr=pipeline_v_in.producer_get_barrier(kv_state))
                        kv_state.advance()
                        if const_expr(self.fp8_v):
                            if n > 0:
                                self.v_to_f16(sV8, sV, pipeline_v8, pipeline_v, v8_state,
                                              v_state, kv_block(n - 1, n_end, self.mask_first),
                                              seq.len_k)
                                v8_state.advance()
                                v_state.advance()
                    if const_expr(self.fp8_v):
                        self.v_to_f16(sV8, sV, pipeline_v8, pipeline_v, v8_state, v_state,
                                      kv_block(n_end - 1, n_end, self.mask_first), seq.len_k)
                        v8_state.advance()
                        v_state.advance()
                if const_expr(self.dynamic):
                    # the next tile, taken once this one's loads are issued
                    i += 1
                    if issuer:
                        tile = next_tile(tile, 0, sched.mSched, True)
                    tile = self.share_tile(tile, i, sched, issuer)
                else:
                    tile += cute.arch.grid_dim()[0]
            if const_expr(self.dynamic):
                if issuer:
                    finish_tiles(sched.mSched)

        @cute.jit
        def share_tile(self, tile: Int32, i: Int32, sched: Sched, issuer):
            """dynamic, the load warpgroup: the load warp (issuer) publishes its CTA's i-th
            tile; fp8_v's other converting warps fetch it, as the consumers do."""
            if issuer:
                publish_tile(sched.mSched, sched.pipeline_tile, tile, i)
            else:
                tile = fetch_tile(sched.mSched, sched.pipeline_tile, tile, 0, i, True)
            return tile

        @cute.jit
        def v_to_f16(self, sV8, sV, pipeline_v8, pipeline_v, v8_state, v_state, blk, len_k):
            """Block blk's V from the e4m3 slot to the f16 one the P V wgmma reads, once
            it landed and the consumers freed the f16 slot: 8 neighbours a thread a pass
            (an 8-byte load, a 16-byte store; the swizzles move 16-byte units only). Rows
            past the sequence's keys become 0: their P is 0, and 0 * a NaN code (a row
            outside every sequence) would not be."""
            tidx = cute.arch.thread_idx()[0]
            cols = self.D // 8
            conv = cute.make_tiled_copy_tv(
                cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype,
                                    num_bits_per_copy=64),
                cute.make_ordered_layout((128 // cols, cols), order=(1, 0)),
                cute.make_layout((1, 8)))
            thr = conv.get_slice(tidx)
            pipeline_v8.consumer_wait(v8_state)
            pipeline_v.sync_object_empty.wait(v_state.index, v_state.phase)
            src = thr.partition_S(sV8[None, None, v8_state.index])
            dst = thr.partition_S(sV[None, None, v_state.index])
            crd = thr.partition_S(cute.make_identity_tensor((self.block_n, self.D)))
            limit = len_k - blk * self.block_n
            for i in cutlass.range_constexpr(cute.size(src, mode=[1])):
                r8 = cute.make_fragment_like(src[None, i, 0])
                cute.autovec_copy(src[None, i, 0], r8)
                r16 = cute.make_rmem_tensor_like(r8, cutlass.Float16)
                r16.store(r8.load().to(cutlass.Float16))
                if crd[0, i, 0][0] >= limit:
                    r16.fill(0.0)
                cute.autovec_copy(r16, dst[None, i, 0])
            pipeline_v8.consumer_release(v8_state)
            # this thread's generic writes before the wgmma's (async proxy) reads; then
            # the warp's, behind one arrive a warp
            cute.arch.fence_view_async_shared()
            cute.arch.sync_warp()
            if cute.arch.lane_idx() == 0:
                cute.arch.mbarrier_arrive(pipeline_v.producer_get_barrier(v_state))

        # ------------------------------------------------------------------ compute
        @cute.jit
        def compute(self, mO, mLSE, sQ, sK, sVt, sO, pipeline_q, pipeline_k, pipeline_v,
                    tiled_mma_qk, tiled_mma_pv, store_tiled_copy_O, tidx, scale_log2, scales,
                    sched):
            wg = cute.arch.make_warp_uniform(tidx // 128)
            wg_mma_qk = tiled_mma_qk.get_slice(wg * 128)
            wg_mma_pv = tiled_mma_pv.get_slice(wg * 128)
            thr_mma_qk = tiled_mma_qk.get_slice(tidx)
            # operand fragments (smem descriptors) and accumulators
            tSrQ = wg_mma_qk.make_fragment_A(wg_mma_qk.partition_A(sQ))
            tSrK = wg_mma_qk.make_fragment_B(wg_mma_qk.partition_B(sK))
            tOrVt = wg_mma_pv.make_fragment_B(wg_mma_pv.partition_B(sVt))
            M = self.block_m
            acc_O = cute.make_rmem_tensor(wg_mma_pv.partition_shape_C((M, self.D)), Float32)
            tOrP = wg_mma_pv.make_fragment_A(wg_mma_pv.partition_shape_A((M, self.block_n)))
            # (row, col) of every accumulator element, for masks and the LSE store
            tScS = acc_rows_cols(thr_mma_qk.partition_C(
                cute.make_identity_tensor((M, self.block_n))))
            row_max = cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Float32)
            row_sum = cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Float32)
            if const_expr(self.windows):
                # row windows: the key columns [kv_lo, kv_hi) of each of this thread's rows,
                # counted from the window's first key (`row_ranges`)
                kv_lo = cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Int32)
                kv_hi = cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Int32)
            row_sc = row_vs = None
            if const_expr(self.row_scale):
                row_sc = cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Float32)
                if const_expr(self.fp8_v):
                    row_vs = cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Float32)
            mma = Operands(tiled_mma_qk, tiled_mma_pv,
                           wg_mma_qk.partition_shape_C((M, self.block_n)), None, tSrK, tOrVt,
                           tOrP, acc_O, tScS, row_max, row_sum, scale_log2, pipeline_k,
                           pipeline_v, wg)

            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                   self.q_stages)
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                    self.stages)
            # consumer 0 issues first: pre-arrive on its own scheduling barrier (in place
            # of the last consumer's hand-over, whose arrive completes it later)
            if wg == 0:
                cute.arch.barrier_arrive(barrier_id=SCHED_BARRIER, number_of_threads=256)
            num_tiles = sched.n_pairs * sched.H
            tile = cute.arch.block_idx()[0]
            i = Int32(0)            # dynamic: the CTA's tiles so far (tile_counter's slots)
            if const_expr(self.dynamic):
                tile = fetch_tile(sched.mSched, sched.pipeline_tile, tile, 0, i, True)
            while tile < num_tiles:
                coords = self.schedule(tile, sched)
                h, hk, m0, seq, n_bulk, n_end, b = coords[:7]
                geom = (m0, seq)
                if const_expr(self.windows):
                    # n_bulk = 0: the first step and the tail take every block, masked
                    per_row = (scale_log2, scales, hk, row_sc, row_vs) \
                        if const_expr(self.row_scale) else None
                    geom = self.row_ranges(sched, seq, b, coords[7], tScS, kv_lo, kv_hi,
                                           per_row)
                tile_scale = row_sc if const_expr(self.row_scale) else \
                    self.tile_scale(scale_log2, scales, b, hk)
                row_max.fill(-Float32.inf)
                row_sum.fill(0.0)
                acc_O.fill(0.0)
                pipeline_q.consumer_wait(q_state)
                mma_t = replaced(mma, tSrQ=tSrQ[None, None, None, q_state.index],
                                 scale_log2=tile_scale)
                if n_end > 0:
                    # S_0 first; then each step issues S_n and P_(n-1) V_(n-1) together
                    # and runs the softmax of S_n under the PV wgmma
                    first, bulk_lo, bulk_end, tail_end = kv_steps(n_bulk, n_end,
                                                                  self.mask_first)
                    # unmasked when the bulk covers block 0 (mask_first: always masked)
                    if const_expr(not self.mask_first) and n_bulk > 0:
                        self.first_qk(False, first, geom, mma_t, kv_state)
                    else:
                        self.first_qk(True, first, geom, mma_t, kv_state)
                    for n in cutlass.range(bulk_lo, bulk_end, unroll=1):              # bulk
                        kv_state = self.kv_step(n, False, geom, mma_t, kv_state)
                    # non-causal under mask_first the first step took the one masked
                    # block: no tail, and no code for it
                    if const_expr(self.causal or not self.mask_first):
                        for n in cutlass.range(cutlass.max(bulk_end, bulk_lo), tail_end,
                                               unroll=1):                              # tail
                            kv_state = self.kv_step(n, True, geom, mma_t, kv_state)
                    kv_state = self.last_pv(mma_t, kv_state)
                if const_expr(self.direct):  # no write before the offsets check passed
                    cute.arch.griddepcontrol_wait()
                v_scale = row_vs
                if const_expr(self.fp8_v and not self.row_scale):  # read here: held across
                    v_scale = scales.v[b, hk]  # the KV loop it costs the consumers registers
                self.store(acc_O, row_max, row_sum, tile_scale, mO, mLSE,
                           sO[None, None, q_state.index], tScS, tiled_mma_pv,
                           store_tiled_copy_O, tidx, h, m0, seq, v_scale)
                # the slot is free once this warp's reads of O are done; order our generic
                # smem accesses before the next TMA write into it
                cute.arch.fence_view_async_shared()
                pipeline_q.consumer_release(q_state)
                q_state.advance()
                if const_expr(self.dynamic):
                    i += 1
                    tile = fetch_tile(sched.mSched, sched.pipeline_tile, tile, 0, i, True)
                else:
                    tile += cute.arch.grid_dim()[0]

        @cute.jit
        def tile_scale(self, scale_log2, scales: Scales, b, hk):  # role: compute
            """The softmax scale (log2 domain) of a tile: fp8 folds in q_descale *
            k_descale of its sequence b and KV head hk (fp32 [B, H_kv])."""
            if const_expr(self.fp8):
                scale_log2 = scale_log2 * scales.q[b, hk] * scales.k[b, hk]
            return scale_log2

        def row_of(self, scale, r):
            """Accumulator row r's softmax scale (or v_descale): per row (fp8 row windows,
            `row_ranges`) or the tile's."""
            return scale[r] if const_expr(self.row_scale) else scale

        @cute.jit
        def row_ranges(self, sched: Sched, seq, s_first, s_last, tScS, kv_lo, kv_hi,
                       row_scale=None):
            """Row windows, once a tile: the key columns [kv_lo, kv_hi) each of this
            thread's rows sees, relative to the window's first key: its own sequence's
            (found among s_first..s_last), the causal cut included; none for the rows past
            the window's last sequence. The mask's geometry. row_scale (fp8): (scale_log2,
            scales, hk, out, out_v): out[r] <- row r's softmax scale, tile_scale's with its
            own sequence's descales; fp8_v: out_v[r] <- its v_descale."""
            rows = cute.size(kv_lo)
            for r in cutlass.range_constexpr(rows):
                kv_lo[r] = s_first                      # row r's sequence, counted up
            # the rows of a thread share each pass's loads of the offsets
            for j0 in cutlass.range(s_first + 1, s_last + 1, ROW_SEQ_CHUNK, unroll=1):
                for r in cutlass.range_constexpr(rows):
                    kv_lo[r] = row_seq_chunk(sched.mCuQ, j0, s_last,
                                             seq.q_start + tScS[r, 0][0], kv_lo[r])
            if const_expr(row_scale is not None):
                scale_log2, scales, hk, out, out_v = row_scale
                for r in cutlass.range_constexpr(rows):
                    out[r] = self.tile_scale(scale_log2, scales, kv_lo[r], hk)
                    if const_expr(self.fp8_v):
                        out_v[r] = scales.v[kv_lo[r], hk]
            for r in cutlass.range_constexpr(rows):
                lo, hi = row_kv_range(sched.mCuQ, sched.mCuK, kv_lo[r],
                                      seq.q_start + tScS[r, 0][0], self.causal)
                hi = hi if tScS[r, 0][0] < seq.len_q else lo
                kv_lo[r] = lo - seq.k_start
                kv_hi[r] = hi - seq.k_start
            return kv_lo, kv_hi

        @cute.jit
        def mask(self, acc_S, n, geom, tScS):
            """-inf on keys past the sequence end and (causal) right of the diagonal.
            geom: (m0, the tile's SeqlenInfo); row windows: (kv_lo, kv_hi), `row_ranges`."""
            if const_expr(self.windows):
                self.window_mask(acc_S, n, geom, tScS)
            else:
                self.tile_mask(acc_S, n, geom, tScS)

        @cute.jit
        def window_mask(self, acc_S, n, geom, tScS):
            """Row windows: -inf outside each row's key columns [kv_lo, kv_hi)."""
            kv_lo, kv_hi = geom
            S = acc_rows_cols(acc_S)
            for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
                lo = kv_lo[r] - n * self.block_n
                width = cutlass.Uint32(cutlass.max(kv_hi[r] - kv_lo[r], 0))
                # lo <= col < lo + width as one unsigned compare (col < lo wraps around);
                # the bitcast makes it unsigned (arithmetic on a coordinate stays signed:
                # Uint32() of it compares signed), one select a score against two
                for c in cutlass.range_constexpr(cute.size(S, mode=[1])):
                    off = Int32(tScS[0, c][1] - lo).bitcast(cutlass.Uint32)
                    S[r, c] = -Float32.inf if off >= width else S[r, c]

        @cute.jit
        def tile_mask(self, acc_S, n, geom, tScS):
            m0, seq = geom
            S = acc_rows_cols(acc_S)
            for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
                end = seq.len_k                                     # the keys row r sees
                if const_expr(self.causal):
                    end = seq.row_kv_end(m0 + tScS[r, 0][0], self.pack)
                limit = end - n * self.block_n
                # one select per element, as TLX's tl.where (an `if` per element: ~1000
                # more SASS a 128-key masked block; 256 / 0.5 0.380 -> 0.272 ms)
                for c in cutlass.range_constexpr(cute.size(S, mode=[1])):
                    S[r, c] = -Float32.inf if tScS[0, c][1] >= limit else S[r, c]

        @cute.jit
        def softmax(self, acc_S, row_max, row_sum, scale_log2):
            """Online softmax step in the exp2 domain (quad row reductions): acc_S <- P,
            returns the factor the running O must be scaled by."""
            S = acc_rows_cols(acc_S)
            row_scale = cute.make_rmem_tensor_like(row_max, Float32)
            for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
                s_row = S[r, None].load()
                m_new = s_row.reduce(cute.ReductionOp.MAX, row_max[r], 0)
                m_new = cute.arch.warp_reduction_max(m_new, threads_in_group=4)
                m_prev = row_max[r]
                row_max[r] = m_new
                m_safe = 0.0 if m_new == -Float32.inf else m_new  # rows with no key yet
                sc = self.row_of(scale_log2, r)
                p_row = cute.math.exp2(s_row * sc - m_safe * sc, fastmath=True)
                row_scale[r] = cute.math.exp2((m_prev - m_safe) * sc, fastmath=True)
                row_sum[r] = p_row.reduce(cute.ReductionOp.ADD, row_sum[r] * row_scale[r], 0)
                S[r, None].store(p_row)
            return row_scale

        @cute.jit
        def rescale(self, acc_O, row_scale):
            O = acc_rows_cols(acc_O)
            for r in cutlass.range_constexpr(cute.size(O, mode=[0])):
                O[r, None].store(O[r, None].load() * row_scale[r])

        @cute.jit
        def first_qk(self, masked: cutlass.Constexpr, n, geom, mma: Operands, kv_state):
            """S = Q K_n of the first step, its softmax, P into registers (its V is consumed
            by the next step)."""
            acc_S = cute.make_rmem_tensor(mma.shape_S, Float32)
            mma.pipeline_k.consumer_wait(kv_state)
            wgmma(mma.tiled_mma_qk, acc_S, mma.tSrQ, mma.tSrK[None, None, None, kv_state.index],
                  zero_init=True, wait=0)
            mma.pipeline_k.consumer_release(kv_state)
            if const_expr(masked):
                self.mask(acc_S, n, geom, mma.tScS)
            self.softmax(acc_S, mma.row_max, mma.row_sum, mma.scale_log2)
            mma.tOrP.store(acc_as_operand_a(acc_S).load().to(self.pv_dtype))

        @cute.jit
        def kv_step(self, n, masked: cutlass.Constexpr, geom, mma: Operands, kv_state):
            """Block n: issue S_n = Q K_n and O += P_(n-1) V_(n-1), softmax S_n while the
            PV wgmma runs, then rescale O and keep P_n. Consumers take turns issuing."""
            wg = mma.wg
            v_state = kv_state.clone()
            kv_state.advance()
            acc_S = cute.make_rmem_tensor(mma.shape_S, Float32)
            mma.pipeline_k.consumer_wait(kv_state)
            cute.arch.barrier(barrier_id=SCHED_BARRIER + wg, number_of_threads=256)
            wgmma(mma.tiled_mma_qk, acc_S, mma.tSrQ, mma.tSrK[None, None, None, kv_state.index],
                  zero_init=True, wait=-1)
            mma.pipeline_v.consumer_wait(v_state)
            wgmma(mma.tiled_mma_pv, mma.acc_O, mma.tOrP,
                  mma.tOrVt[None, None, None, v_state.index], zero_init=False, wait=-1)
            # hand the turn to the next consumer in the ring (each turn barrier joins two
            # warpgroups: the waiter and its predecessor); 1 - wg at 2: no signed modulo
            if const_expr(self.num_mma_wg == 2):
                next_wg = 1 - wg
            else:
                next_wg = (wg + 1) % self.num_mma_wg
            cute.arch.barrier_arrive(barrier_id=SCHED_BARRIER + next_wg, number_of_threads=256)
            warpgroup.wait_group(1)
            mma.pipeline_k.consumer_release(kv_state)
            if const_expr(masked):
                self.mask(acc_S, n, geom, mma.tScS)
            row_scale = self.softmax(acc_S, mma.row_max, mma.row_sum, mma.scale_log2)
            warpgroup.wait_group(0)
            mma.pipeline_v.consumer_release(v_state)
            mma.tOrP.store(acc_as_operand_a(acc_S).load().to(self.pv_dtype))
            self.rescale(mma.acc_O, row_scale)
            return kv_state

        @cute.jit
        def last_pv(self, mma: Operands, kv_state):
            """O += P_last V_last."""
            mma.pipeline_v.consumer_wait(kv_state)
            wgmma(mma.tiled_mma_pv, mma.acc_O, mma.tOrP,
                  mma.tOrVt[None, None, None, kv_state.index], zero_init=False, wait=0)
            mma.pipeline_v.consumer_release(kv_state)
            kv_state.advance()
            return kv_state

        # ------------------------------------------------------------------ store
        @cute.jit
        def store(self, acc_O, row_max, row_sum, scale_log2, mO, mLSE, sO, tScS,
                  tiled_mma_pv, store_tiled_copy_O, tidx, h, m0, seq, v_scale=None):
            """O / rowsum and LSE out; rows at or past len_q are never written. fp8_v:
            O also times v_scale (the tile's v_descale; fp8 row windows: each row's)."""
            out_start = seq.out_start
            O = acc_rows_cols(acc_O)
            lse = cute.make_rmem_tensor_like(row_max, Float32)
            for r in cutlass.range_constexpr(cute.size(O, mode=[0])):
                total = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
                empty = total == 0.0
                inv = 0.0 if empty else cute.arch.rcp_approx(total)
                if const_expr(self.fp8_v):
                    inv = inv * self.row_of(v_scale, r)
                lse[r] = -Float32.inf if empty else (
                    row_max[r] * self.row_of(scale_log2, r)
                    + cute.math.log2(total, fastmath=True)) * LN_2
                O[r, None].store(O[r, None].load() * inv)

            rows_left = seq.len_q - m0
            # LSE [H, Nout]: the thread holding column 0 of a row writes it
            gLSE = cute.domain_offset((out_start + m0,), mLSE[h, None])
            if tScS[0, 0][1] == 0:
                for r in cutlass.range_constexpr(cute.size(lse)):
                    row = tScS[r, 0][0]
                    if row < rows_left:
                        gLSE[row] = lse[r]

            # O: registers -> smem (stmatrix) -> global (16-byte rows, row-predicated)
            rO = cute.make_rmem_tensor_like(acc_O, self.o_dtype)
            rO.store(acc_O.load().to(self.o_dtype))
            r2s = cute.make_tiled_copy_C(
                cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False,
                                                                     num_matrices=4),
                                    self.o_dtype),
                tiled_mma_pv)
            thr_r2s = r2s.get_slice(tidx)
            cute.copy(r2s, thr_r2s.retile(rO), thr_r2s.partition_D(sO))
            # each warpgroup stores its own 64 rows behind its own 128-thread barrier, as TLX
            # (against one 256-thread barrier: 256 / 0.5 0.268 -> 0.241 ms)
            wg = cute.arch.make_warp_uniform(tidx // 128)
            cute.arch.barrier(barrier_id=self.epilogue_barrier + wg, number_of_threads=128)
            store_rows(store_tiled_copy_O, tidx % 128,
                       cute.local_tile(sO, (SPLIT_M, self.D), (wg, 0)),
                       head_tile(mO, out_start + m0 + wg * SPLIT_M, h, SPLIT_M, self.D),
                       rows_left - wg * SPLIT_M)

    return FwdHopper


# --------------------------------------------------------------------------------------
# Host: compile once per config, then launch
# --------------------------------------------------------------------------------------

def compile_forward(dtype, head_dim: int, causal: bool, broadcast_q: bool,
                    cfg: Config | None = None, options: str = ""):
    """Compile (no GPU needed with CUTE_DSL_ARCH=sm_90a) and return the callable. cfg:
    None, the long bucket's default; window_config(head_dim): the row-windows build."""
    cfg = CONFIGS[(head_dim, "long", bool(causal))] if cfg is None else cfg
    fwd = _kernel_class()(host.cute_dtype(dtype), head_dim, causal, broadcast_q, cfg)
    return host.compile_fwd(fwd, broadcast_q, head_dim, options,
                            descale=host.descale_args(fwd.fp8) + host.descale_args(
                                fwd.fp8_v, 1), windows=fwd.windows, sched=True)


KERNELS = host.FwdKernels(pick_config, partial(host.compiled, _COMPILED, compile_forward),
                          host.persistent_programs, fp8=True, takes_windows=takes_windows,
                          window_config=window_config, pack_gqa=True, direct=True,
                          fp8_v=fp8_v_tiles, dynamic=True)


def forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q, descale=None):
    """-> (out [Nq, H, D], lse [H, Nq] fp32); Nq = B * L_q in broadcast-Q mode.
    descale: None (16-bit q, k, v) or (q_descale, k_descale, v_descale), fp32 [B, H_kv]
    each, for e4m3 q, k, v (out bf16); V converted tile by tile in the kernel where
    fp8_v_tiles says so, else in one pass a call."""
    return host.forward(KERNELS, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale,
                        broadcast_q, descale)
