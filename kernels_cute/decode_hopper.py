"""KV-cache attention (decode) for Hopper (sm_90a), in CuteDSL.

    forward(q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, out, lse,
            o_part, lse_part, *, len_q, causal, scale, num_splits, descale=None,
            order=None, config=None) -> None

What it computes: for every sequence b, kv head h_kv and split s, attention of the
query rows of b (all group = H / H_kv query heads of h_kv, packed into the rows of one
tile: tile row r -> query row r // group, head h_kv * group + r % group) over split s's
contiguous chunk of the sequence's cached keys. The cache is contiguous [B, L, H_kv, D]
or paged [pages, page_size, H_kv, D] through an int32 page table, any page size; query
row i (of n_q) sees key j iff j <= i + n_k - n_q when causal (bottom-right), every
j < n_k otherwise. num_splits == 1 writes out / lse; num_splits > 1 writes each split's
normalized partial output and its LSE (fp32), which the core's `combine` merges.

FP8 (a float8_e4m3fn cache; q float8_e4m3fn or bfloat16): descale = (q_descale,
k_descale, v_descale), fp32 [B, H_kv]. The program (b, h_kv, split) multiplies its
softmax scale by q_descale[b, h_kv] * k_descale[b, h_kv] and its normalized output
(partials included: the combine is linear) by v_descale[b, h_kv]; out is bf16. The
products are 16-bit mma.sync: e4m3 is exact in f16 and in bf16, so an fp8 q makes them
f16 (one cvt per two elements, and P keeps 10 bits), a bf16 q bf16. Except with an e4m3
q at 16, 32 and 64 rows (the D = 128 defaults), where S is an e4m3 x e4m3 wgmma (fp32
accumulate; Hopper's mma.sync has no e4m3 form), e4m3 K read from its slot as loaded and
the e4m3 q from smem, both K-major, K never converted, and one warpgroup (the CTA, one
key group) computes the whole block:
  - 16 and 32 rows (Config.swap, `compute_t`) swap the products, since a wgmma's M is
    64: S^T = K Q^T takes the block's keys as M and the tile's rows as N, the online
    softmax runs down the columns, and O^T += V^T P^T takes the head dim as M (V
    converted to f16, P^T in f16 through smem). No row is padded to 64.
  - 64 rows (Config.wgmma_s, `compute_w`) fill M: S = Q K^T (M the rows, N the keys),
    the softmax along the rows as on mma.sync, O += P V an f16 wgmma with P in
    registers (its A) and V converted to f16 (its B).

One CTA (4 warps; 8 for 128 rows) per (split, kv head x row block, sequence). The grid's
batch coordinate p is sequence b = order[p] when the core passes a launch order (its
sequences longest first: the CTAs issued last then are short ones), else b = p. The roles:

    `load`     cp.async, 16 bytes a thread a copy, one cache row (token) at a time: the
               row's page is looked up per token (token j -> page_table[b, j // page_size],
               row j % page_size), so any page size and any page order work; K and V of a
               block of Config.block_n tokens go into one of Config.stages smem slots
               (one commit group per block; stages - 1 blocks in flight under the
               compute of the current one). Where several key groups split a block
               (every tile but the 64-row one and the 128-row one), each key group's
               threads copy exactly the rows of its own keys (block rows kg * BNg..),
               so a block's data and its slot's reuse concern that key group alone.
               The page-table reads of a block are issued one block ahead of its
               copies; j // page_size is a multiply-high divmod.
               Q is gathered once per tile the same way, into the last K slot (it is in
               registers before that slot's first block lands), or its own smem where
               it does not fit (128 rows). FP8: the slots hold the cache's bytes (a
               16-byte copy is 16 elements of a row, not 8); an fp8 q is read into
               registers (8 bytes a load), converted and stored as f16. Swapped and
               wgmma: the slots and Q lie in the wgmma's K-major layout (rows of D
               bytes, the 128-byte swizzle at D 128, the 64-byte one at D 64: a 16-byte
               copy stays whole), and the e4m3 q goes to its own smem as it is (8 bytes
               a copy).
    `convert`  FP8 only: each thread converts the 16-byte chunks of block t it copied
               itself (its own cp.async wait makes them visible: no barrier on the fp8
               slots) into one 16-bit block in the layout the bf16 kernel reads, then the
               loop's second barrier (a key group's: its rows of the 16-bit block are the
               ones it converted). Cost a block: per cache element one 1-byte smem read,
               one 2-byte smem write, 1-2 cvt (e4m3x2 -> f16x2, then f32 -> bf16x2 for a
               bf16 q), and the barrier; the 16-bit block (K and V, block_n keys) is smem
               the stages do not get. Swapped and wgmma: V alone (the S / S^T wgmma reads
               K in e4m3), under that wgmma; the ring takes the 16-bit K block's bytes
               (Config.q8_stages).
    `compute`  mma.sync m16n8k16 (fp32 accumulate): warps_m warps share the tile's rows
               (16 each), the other warps split each KV block's keys (key groups), so a
               16-row tile keeps all four warps busy. S = Q K^T (Q held in registers),
               the mask (sequence end, causal diagonal) on the blocks that need it,
               online softmax in exp2 with scale * log2(e) folded in, O += P V.
               Swapped (`compute_t`, one `attend_t` a block, TLX's `_attend_t`): wgmma
               m64nMk32 e4m3 (S^T, keys x rows) and m64nMk16 f16 (O^T, D x rows) over
               the warpgroup; a column's max over the block's keys: the 8 lanes holding
               it meet in a transposing butterfly (n_cols - 1 shuffles leave each lane
               one column's max), the 4 warps' through smem (one barrier), and each lane
               reads its columns' max and correction by shuffle; the column sums stay
               each thread's partial ones (no cross-warp sum a block); P^T goes to smem
               by stmatrix (MN-major: the rows contiguous, the 32- / 64-byte swizzle),
               V^T is the 16-bit V block read MN-major.
               wgmma (`compute_w`, one `attend` a block, TLX's `_attend` at 64 rows):
               wgmma m64nNk32 e4m3 (S, rows x keys, N = block_n) and m64nDk16 f16 (O,
               rows x D) over the warpgroup; warp w owns rows 16 w.., so a row's max is
               its quad's (two shuffles, no smem, no barrier) and its sum stays the
               thread's partial one until `store`, as on mma.sync; P is S's
               accumulator converted to f16 in place, the A fragment of O's wgmma (the
               accumulator's layout is the A operand's, two 8-column groups a k16
               step); V is the 16-bit V block read MN-major (B: N = D contiguous).
    `store`    the key groups' (row max, row sum, O) meet in smem (reusing the K slots);
               each output row is merged, normalized and written once (16-byte chunks),
               its LSE (natural log) beside it. Rows that see no key: O = 0, LSE = -inf.
               Padding rows (past group * n_q) are never written. Swapped: one key
               group; O^T lands in smem as O (transposed), the columns' max once and
               each warp's column sums (summed over its lanes), which the merge adds.
               wgmma: one key group, as the 64-row mma.sync tile.

The pipeline is `DecodeHopper.kernel`'s KV loop: wait for block t's commit group, one
barrier (so block t is visible and slot (t - 1) % stages is free), issue block
t + stages - 1 into it, (FP8: convert block t, barrier,) compute block t. The barrier is
the key group's where several key groups split a block (`kv_sync`): each key group
copies, converts and reads only its own rows of every slot (and of the 16-bit block), so
its threads alone need to agree. A 16-row tile (warps_m 1: a key group is a warp) takes
bar.warp.sync (no BAR in the loop's SASS); a 32-row tile (warps_m 2, 2 key groups) a
named barrier (1 + kg) of its 64 threads; 64 and 128 rows (one key group) the CTA
barrier. Q, read by every warp, is waited for with a CTA barrier before the loop, and
where it sits in the last K slot (the 16-bit K block) a second CTA barrier after every
warp has read it keeps the first key groups' writes there off it. `store` keeps its CTA
barriers (the key groups finish at different blocks; the slots become O after a CTA
barrier). Swapped and wgmma, a block: wait for block t's group and fence it
(fence.proxy.async: the cp.async bytes before the wgmma's async-proxy reads), wait for
block t - 1's P V wgmma (it read the 16-bit V block, and P^T in smem or P in registers),
one CTA barrier, issue block t + stages - 1 (`next_block`); the S (S^T) wgmma under V's
conversion; swapped, the column maxima's barrier, then P^T and V fenced, a barrier, the
O^T wgmma; wgmma, the row softmax (no barrier), then V fenced, a barrier, the O wgmma;
either left in flight until the next block. The blocks every tile row sees whole run in
a loop without the mask, the rest (sequence end, causal diagonal) in a second one with
it. The split partition: the tile's visible key blocks cut into num_splits chunks of
cdiv(n_blocks, num_splits) blocks (split s takes chunk s, possibly empty).

One compiled kernel per (q dtype, cache dtype, D, Config, causal, paged, packed q,
split, ordered); shapes, lengths, page size, group, splits, scale and descales are
runtime values.
"""

import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import torch

from . import host

FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class Config:
    block_m: int       # tile rows (packed query rows x heads): 16, 32, 64 or 128
    block_n: int       # keys per KV block (one pipeline stage holds K and V of a block)
    stages: int        # KV blocks resident in smem (stages - 1 in flight while computing)
    warps_m: int       # warps along the rows (16 rows each)
    warps: int = 4     # warps of a CTA; warps // warps_m key groups split each block's keys
    swap: bool = False  # with an e4m3 q over an e4m3 cache, keys as the wgmmas' M
                        # (`compute_t`; 16 and 32 rows)
    # with an e4m3 q over an e4m3 cache at 64 rows, S = Q K^T as an e4m3 wgmma and O += P V
    # an f16 one, the tile's rows as M (`compute_w`: TLX's `_attend` at 64 rows). TLX has
    # no twin flag (tl.dot takes a wgmma at 64 rows on its own); here the instruction is
    # the kernel's choice, so a flag of the table's, as `swap`, not `swap` itself: nothing
    # is swapped, and the two differ in every step but the ring's
    wgmma_s: bool = False
    q8_stages: int = 0  # stages with an e4m3 q over an e4m3 cache where S reads e4m3 K
                        # (swapped or wgmma_s; 0: the same): no 16-bit K block, so the
                        # ring takes its bytes

    @property
    def key_groups(self) -> int:
        return self.warps // self.warps_m

    def kv_stages(self, q8: bool) -> int:
        """The ring depth of a build: q8, an e4m3 q over an e4m3 cache."""
        return self.q8_stages if self.k8(q8) and self.q8_stages else self.stages

    def swapped(self, q8: bool) -> bool:
        """Whether a build swaps its products (`compute_t`): swap, with an e4m3 q over an
        e4m3 cache, at up to 32 rows."""
        return self.swap and q8 and self.block_m <= 32

    def wgmma(self, q8: bool) -> bool:
        """Whether a build takes S = Q K^T and O += P V as wgmmas, unswapped (`compute_w`):
        wgmma_s, with an e4m3 q over an e4m3 cache, at 64 rows (one warpgroup)."""
        return self.wgmma_s and q8 and self.block_m == 64

    def k8(self, q8: bool) -> bool:
        """Whether K stays e4m3 (S an e4m3 wgmma reading it from its slot: no 16-bit K
        block, V alone converted): swapped or wgmma."""
        return self.swapped(q8) or self.wgmma(q8)

    @property
    def q_in_kv_slot(self) -> bool:
        """Q is staged in the last K slot (FP8: the 16-bit K block) where it fits, else
        in its own smem."""
        return self.block_m <= self.block_n


# Keyed by (head_dim, block_m). Up to 64 rows: 32 KB of K + V a block and 96 KB of slots
# a CTA (80 KB at D = 64, 64 rows), so two CTAs share an SM (<= 255 registers x 128
# threads each) and keep >= 128 KB of cache reads in flight on it. The 64-row tile at
# D = 64 takes 64-key blocks, 5 stages: with 128-key blocks (S alone 64 registers a
# thread) it needs 255; at D = 128 it takes 128-key blocks, 3 stages (192 KB, one CTA an
# SM): H200, B8 32k, 16 query rows x GQA 4, 3.62 TB/s against 2.28 with 64-key blocks at
# 2 splits (3.35 at 4, two CTAs an SM). 128 rows (GQA 8 x 16 query rows): 8 warps, one
# CTA an SM, Q in its own smem, so the cache is read once for all of them.
CONFIGS = {
    (64, 16): Config(block_m=16, block_n=128, stages=3, warps_m=1),
    (64, 32): Config(block_m=32, block_n=128, stages=3, warps_m=2),
    (64, 64): Config(block_m=64, block_n=64, stages=5, warps_m=4),
    (128, 16): Config(block_m=16, block_n=64, stages=3, warps_m=1),
    (128, 32): Config(block_m=32, block_n=64, stages=3, warps_m=2),
    (128, 64): Config(block_m=64, block_n=128, stages=3, warps_m=4),
    (64, 128): Config(block_m=128, block_n=64, stages=8, warps_m=8, warps=8),
    (128, 128): Config(block_m=128, block_n=64, stages=5, warps_m=8, warps=8),
}

# FP8 caches, keyed the same. A block keeps the bf16 table's keys, and the warps, so the
# registers of S and O stay the bf16 kernel's: the one 16-bit block the slots convert to
# grows with the keys (twice the keys a block would double it and S). The fp8 slots are
# half the bytes, so the stages grow instead. Up to 64 rows (two CTAs an SM, <= 112 KB
# each): D = 128 (64 keys) and D = 64 (128 keys) 4 stages of 16 KB + the 32 KB block
# (48 KB in flight a CTA); D = 64, 64 rows, 9 stages of 8 KB + 16 KB (64 KB in flight).
# 128 rows (one CTA an SM, Q 16-bit in its own smem): D = 64 16 + 15 x 8 + 16 KB (112 KB
# in flight), D = 128 32 + 9 x 16 + 32 KB (128 KB in flight).
# 16 and 32 rows at D = 128 with an e4m3 q (swap, `compute_t`): K stays e4m3 in its slot
# (no 16-bit K block), so the ring is a stage deeper (q8_stages): 5 x 16 KB + the 16 KB V
# block + e4m3 Q, P^T (f16) and the column maxima, 101-107 KB (64 KB in flight), two CTAs
# an SM. D = 64 keeps the mma.sync tile: swapped (128 keys a block, two S^T wgmmas) it
# took 7-10 % longer (H100, B8 32k, 16 and 32 rows, graph replay).
# 64 rows at D = 128 with an e4m3 q (wgmma_s, `compute_w`): likewise no 16-bit K block,
# a stage deeper: 5 x 16 KB + the 16 KB V block + e4m3 Q (8 KB), 104 KB (64 KB in
# flight), two CTAs an SM; a block step of 360 SASS instructions a warp against 605 on
# mma.sync. D = 64 keeps mma.sync here too: wgmma_s with q8_stages 11 (100 KB) builds
# clean (303 instructions a step against 441), but instruction counts did not predict
# the swapped tile at D = 64, so it stays off the table until a GPU times it.
FP8_CONFIGS = {
    (64, 16): Config(block_m=16, block_n=128, stages=4, warps_m=1),
    (64, 32): Config(block_m=32, block_n=128, stages=4, warps_m=2),
    (64, 64): Config(block_m=64, block_n=64, stages=9, warps_m=4),
    (128, 16): Config(block_m=16, block_n=64, stages=4, warps_m=1, swap=True, q8_stages=5),
    (128, 32): Config(block_m=32, block_n=64, stages=4, warps_m=2, swap=True, q8_stages=5),
    (128, 64): Config(block_m=64, block_n=64, stages=4, warps_m=4, wgmma_s=True, q8_stages=5),
    (64, 128): Config(block_m=128, block_n=64, stages=15, warps_m=8, warps=8),
    (128, 128): Config(block_m=128, block_n=64, stages=9, warps_m=8, warps=8),
}


def _kb(n: int) -> int:
    """n bytes rounded up to whole KB (each smem region is 1024-byte aligned)."""
    return -(-n // 1024) * 1024


def smem_kv_bytes(cfg: Config, head_dim: int, elem_bytes: int = 2, q8: bool = False) -> int:
    """Bytes of the K (or V) slots (q8: an e4m3 q over an e4m3 cache)."""
    return cfg.kv_stages(q8) * cfg.block_n * head_dim * elem_bytes


def smem_bytes(cfg: Config, head_dim: int, elem_bytes: int = 2, q8: bool = False) -> int:
    """Shared memory of one CTA with a cache of `elem_bytes`-byte elements (1: fp8; q8:
    and an e4m3 q), each region 1024-byte aligned: the K and V slots (the merge reuses
    them), FP8 also the 16-bit K and V block, and Q (16-bit) where it does not fit the last
    K slot / the 16-bit K block. Swapped (`compute_t`): the slots, the 16-bit V block, Q in
    e4m3, P^T in f16 and the warps' column maxima. wgmma (`compute_w`): the slots, the
    16-bit V block and Q in e4m3 (P stays in registers)."""
    m, n = cfg.block_m, cfg.block_n
    if elem_bytes == 1 and cfg.swapped(q8):
        return (2 * smem_kv_bytes(cfg, head_dim, 1, q8) + n * head_dim * 2
                + _kb(m * head_dim) + _kb(n * m * 2) + _kb(4 * m * 4))
    if elem_bytes == 1 and cfg.wgmma(q8):
        return 2 * smem_kv_bytes(cfg, head_dim, 1, q8) + n * head_dim * 2 + _kb(m * head_dim)
    q = 0 if cfg.q_in_kv_slot else _kb(cfg.block_m * head_dim * 2)
    if elem_bytes == 2:
        return q + 2 * smem_kv_bytes(cfg, head_dim)
    return q + 2 * smem_kv_bytes(cfg, head_dim, 1) + 2 * cfg.block_n * head_dim * 2


def store_bytes(cfg: Config, head_dim: int, q8: bool = False) -> int:
    """The key groups' fp32 O that `store` stages in the K slots (FP8: K and V slots;
    swapped: one O^T, the warpgroup's; wgmma: one key group)."""
    return cfg.block_m * head_dim * 4 * (1 if cfg.swapped(q8) else cfg.key_groups)


def tile_rows(rows: int) -> int:
    """block_m for `rows` packed rows (group * len_q): the smallest tile that holds them;
    more than 128 rows run in several 128-row tiles (each reads the cache)."""
    return 16 if rows <= 16 else 32 if rows <= 32 else 64 if rows <= 64 else 128


SM_SMEM = 228 * 1024   # an H100 / H200 SM's shared memory
CTA_OVERHEAD = 2048    # a resident CTA's reserved 1 KB and the kernel's static 1 KB


def programs_per_sm(head_dim: int, rows: int, fp8: bool) -> int:  # role: host
    """How many CTAs of the default config an SM runs at once, for the core's split
    count (one wave): two where their shared memory fits two, else one. A second CTA
    overlaps the first's block steps (H200, B8 32k pages of 1, kernel alone, one an SM
    against two: 16-bit 280 / 254 us, fp8 296 / 224 us; fp8 64 rows 375 / 311 us; B1
    32k 16-bit 44.6 / 45.4 us)."""
    cfg = pick_config(head_dim, rows, fp8)
    used = max(smem_bytes(cfg, head_dim, 1 if fp8 else 2, q8) for q8 in (False, fp8))
    return 2 if 2 * (used + CTA_OVERHEAD) <= SM_SMEM else 1


def pick_config(head_dim: int, rows: int, fp8: bool = False) -> Config:
    """The default for a tile of `rows` packed rows (fp8: of an fp8 cache)."""
    return (FP8_CONFIGS if fp8 else CONFIGS)[(head_dim, tile_rows(rows))]


class Tile(NamedTuple):
    """What a CTA works on (traced DSL values): sequence b's rows row0.. of kv head hk."""
    b: Any
    hk: Any
    q_start: Any         # the sequence's first row in q / out / lse
    n_q: Any
    n_k: Any
    row0: Any            # first tile row (packed: query row r // group, head r % group)
    rows: Any            # the sequence's tile rows, group * n_q
    group: Any
    page_div: Any        # page_size as a fast divisor (paged)


class SwapOps(NamedTuple):
    """A swapped tile's wgmma operands (traced DSL values; `compute_t`)."""
    tSrK: Any            # K of every slot: S^T's A (keys, D), e4m3, K-major
    tSrQ: Any            # Q: S^T's B (rows, D), e4m3, K-major
    tOrVt: Any           # V^T: O^T's A (D, keys), the 16-bit V block read MN-major
    tOrPt: Any           # P^T: O^T's B (rows, keys), f16, MN-major
    tScS: Any            # (key, row) of each S^T accumulator element
    r2s: Any             # this thread's stmatrix of S^T's accumulator into P^T
    sP_kr: Any           # P^T seen as (keys, rows)


class WgmmaOps(NamedTuple):
    """An unswapped wgmma tile's operands (traced DSL values; `compute_w`)."""
    tSrQ: Any            # Q: S's A (rows, D), e4m3, K-major
    tSrK: Any            # K of every slot: S's B (keys, D), e4m3, K-major
    tOrP: Any            # P: O's A (rows, keys), f16, registers
    tOrV: Any            # V: O's B (D, keys), the 16-bit V block read MN-major
    tScS: Any            # (row, key) of each S accumulator element


_COMPILED = {}
LOG2_E = math.log2(math.e)
FLT_MIN = 1.1754943508222875e-38   # the smallest normal fp32


def _cute_dtype(torch_dtype):
    import cutlass
    return {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16,
            FP8: cutlass.Float8E4M3FN}[torch_dtype]


# --------------------------------------------------------------------------------------
# The kernel (the DSL is imported inside `_kernel_class`: importing this module touches
# neither the DSL nor the driver).
# --------------------------------------------------------------------------------------

def _kernel_class():
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float16, Float32, Int32, const_expr
    import cutlass.utils.hopper_helpers as sm90
    from cutlass.cute.nvgpu import cpasync, warp, warpgroup
    from cutlass.utils import LayoutEnum

    from .fragments import acc_as_operand_a, acc_rows_cols, element_swizzled, wgmma

    LN_2 = math.log(2.0)

    def smem_atom():
        """(8, 64)-element row-major atom of 16-bit elements, its 128-byte rows swizzled
        (Swizzle<3,3,3>): the 8 rows of an ldmatrix 8x8 land in distinct banks."""
        return cute.make_composed_layout(cute.make_swizzle(3, 3, 3), 0,
                                         cute.make_ordered_layout((8, 64), order=(1, 0)))

    def wgmma_view(ptr, layout, dtype):
        """The smem tensor a wgmma reads (its descriptor): the bytes of `layout` (an
        element-swizzled layout, as the copies use) with the swizzle moved into the
        pointer, in bytes (the inverse of fragments.element_swizzled)."""
        sw, lg = layout.inner, (dtype.width // 8).bit_length() - 1
        p = cute.recast_ptr(ptr, cute.make_swizzle(sw.num_bits, sw.num_base + lg, sw.num_shift),
                            dtype=dtype)
        return cute.make_tensor(p, layout.outer)

    # The column maxima of a swapped tile (`compute_t`): plain functions (traced where
    # called), their loops unrolled in Python. A wgmma accumulator's column is held by the
    # 8 lanes 4 apart (each with the same columns, its own rows).
    def pick(cond, a, b):
        """a where cond, else b (a select)."""
        return type(a)(cutlass.select_(cond, a, b))

    def keys_max_own(vals, lane):  # role: compute
        """The warp's max of one column a lane: vals, this thread's partial maxima of its
        n_cols columns, meet over the 8 lanes that hold the same columns in a
        transposing butterfly: each step a lane keeps half its columns (its lane bit picks
        which) and sends the other half to its partner, so n_cols - 1 shuffles (not
        3 n_cols) leave each lane the max of one column, the `own` one (16 rows: 4
        columns, two lanes share one)."""
        off = 4
        while len(vals) > 1:
            half = len(vals) // 2
            upper = (lane & off) != 0
            kept = []
            for i in range(half):
                lo, hi = vals[i], vals[i + half]
                recv = cute.arch.shuffle_sync_bfly(pick(upper, lo, hi), offset=off)
                kept.append(cute.arch.fmax(pick(upper, hi, lo), recv))
            vals = kept
            off *= 2
        x = vals[0]
        while off <= 16:
            x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=off))
            off *= 2
        return x

    def own(vals, lane):  # role: compute
        """The entry of vals (one a column of this thread) of the column whose max
        `keys_max_own` leaves with this lane: the same choices, no shuffle."""
        off = 4
        while len(vals) > 1:
            half = len(vals) // 2
            upper = (lane & off) != 0
            vals = [pick(upper, vals[i + half], vals[i]) for i in range(half)]
            off *= 2
        return vals[0]

    def owner(c: int, n: int) -> int:  # role: compute
        """The lane offset (within the lanes 4 apart holding a column set) of the lane
        that owns column c of n after `keys_max_own`: c's bits from the top, one a step."""
        off, lanes = 4, 0
        while n > 1:
            n //= 2
            lanes += off * ((c // n) % 2)
            c %= n
            off *= 2
        return lanes

    def rows_cols(t):
        """An mma.sync accumulator ((2, 2), MMA_M, MMA_N) as (rows, cols) =
        ((2, MMA_M), (2, MMA_N))."""
        shp = t.layout.shape
        st = cute.make_layout(shp).stride
        rc = cute.make_layout(((shp[0][1], shp[1]), (shp[0][0], shp[2])),
                              stride=((st[0][1], st[1]), (st[0][0], st[2])))
        return cute.make_tensor(t.iterator, cute.composition(t.layout, rc))

    def as_operand_a(acc):  # role: compute
        """The S accumulator ((2, 2), M, N) as the A operand of the PV mma
        ((2, 2, 2), M, N / 2): k16 = two 8-column atoms."""
        l = cute.logical_divide(acc.layout, (None, None, 2))
        a = cute.make_layout(
            ((l.shape[0][0], l.shape[0][1], l.shape[2][0]), l.shape[1], l.shape[2][1]),
            stride=((l.stride[0][0], l.stride[0][1], l.stride[2][0]), l.stride[1],
                    l.stride[2][1]))
        return cute.make_tensor(acc.iterator, a)

    class DecodeHopper:
        def __init__(self, q_dtype, kv_dtype, head_dim: int, cfg: Config, causal: bool,
                     paged: bool, packed: bool, split: bool, ordered: bool = False):
            self.fp8 = kv_dtype.width == 8
            self.q_fp8 = q_dtype.width == 8
            assert not self.q_fp8 or self.fp8
            self.q_dtype, self.kv_dtype, self.D = q_dtype, kv_dtype, head_dim
            # the mma operands (16-bit); e4m3 is exact in both f16 and bf16
            self.dtype = (Float16 if self.q_fp8 else BFloat16) if self.fp8 else q_dtype
            assert self.dtype == q_dtype or self.q_fp8
            # split: fp32 partials o [S, Nq, H, D], lse [S, H, Nq]; else out [Nq, H, D] in
            # q's dtype (bf16 for an fp8 call), lse [H, Nq]
            self.split = split
            self.out_dtype = Float32 if split else BFloat16 if self.fp8 else q_dtype
            self.M, self.BN = cfg.block_m, cfg.block_n
            # swap (`compute_t`): an e4m3 q over an e4m3 cache at 16 and 32 rows. Hopper's
            # mma.sync has no e4m3 form, and a wgmma's M is 64: the block's keys take M (S^T =
            # K Q^T, an e4m3 wgmma reading K from its slot) and the head dim O^T's, the tile's
            # rows N, so no row is padded to 64. One warpgroup (the CTA) computes the whole
            # block: one key group.
            self.swap = self.fp8 and cfg.swapped(self.q_fp8)
            # wgmma (`compute_w`, TLX's `_attend` at 64 rows): the same at 64 rows, where the
            # tile's rows fill a wgmma's M: S = Q K^T an e4m3 wgmma (e4m3 Q and K from smem),
            # O += P V an f16 one with P from registers, the softmax along the rows
            self.wg = self.fp8 and cfg.wgmma(self.q_fp8)
            # K stays e4m3 (no 16-bit K block; V alone converted)
            self.k8 = self.swap or self.wg
            self.stages = cfg.kv_stages(self.q_fp8 and self.fp8)
            self.wm, self.wn = cfg.warps_m, 1 if self.swap else cfg.key_groups
            self.BNg = cfg.block_n // self.wn        # keys of one key group per block
            self.causal, self.paged, self.packed = causal, paged, packed
            self.ordered = ordered                   # the batch coordinate indexes mOrder
            self.num_threads = cfg.warps * 32
            # swapped / wgmma: Q stays e4m3 in its own smem (S's B / A operand)
            self.q_in_kv_slot = cfg.q_in_kv_slot and not self.k8
            assert head_dim % 64 == 0 and self.dtype.width == 16
            self.vec = 128 // kv_dtype.width         # cache elements of one 16-byte copy
            self.row_threads = head_dim // self.vec  # threads covering one cache row
            # key-group copies (several key groups): each key group's 32 * warps_m
            # threads copy (FP8: and convert) exactly the rows of its own keys, so the KV
            # loop syncs only them (a warp: bar.warp.sync; warps_m > 1: a named barrier)
            self.by_group = self.wn > 1
            self.gthreads = 32 * self.wm if self.by_group else self.num_threads
            self.rows_per_pass = self.gthreads // self.row_threads
            self.BNc = self.BNg if self.by_group else self.BN   # keys a copy group covers
            # q: 8 elements a copy (16 bytes of a 16-bit q, 8 of an fp8 one)
            self.q_row_threads = head_dim // 8
            assert self.BNc % self.rows_per_pass == 0
            assert self.M % (self.num_threads // self.q_row_threads) == 0
            assert self.BNg % 16 == 0 and self.M == 16 * self.wm
            # `store` stages the key groups' fp32 O in the K slots (FP8: K and V slots)
            q8 = self.q_fp8 and self.fp8
            o_room = 2 * smem_kv_bytes(cfg, head_dim, 1, q8) if self.fp8 else \
                smem_kv_bytes(cfg, head_dim)
            assert store_bytes(cfg, head_dim, q8) <= o_room
            assert self.stages >= 2
            assert not self.swap or (self.num_threads == 128 and self.BN % 64 == 0)
            assert not self.wg or (self.num_threads == 128 and self.M == 64
                                   and self.BN % 16 == 0 and self.BN <= 256)
            self.smem = smem_bytes(cfg, head_dim, 1 if self.fp8 else 2, q8)

        # ------------------------------------------------------------------ host side
        @cute.jit
        def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                     mSeqK: cute.Tensor, mPageTable: Optional[cute.Tensor],
                     mCuQ: Optional[cute.Tensor], mOrder: Optional[cute.Tensor],
                     mO: cute.Tensor, mLSE: cute.Tensor,
                     mQd: Optional[cute.Tensor], mKd: Optional[cute.Tensor],
                     mVd: Optional[cute.Tensor],
                     scale_log2: Float32, len_q: Int32, group: Int32,
                     page_size: Int32, num_splits: Int32, stream):
            dt, D = self.dtype, self.D
            atom = smem_atom()
            sQ_layout = cute.tile_to_shape(atom, (self.M, D), (0, 1))
            # 16-bit K / V: the slots (bf16 / fp16 cache) or the one converted block (fp8)
            n_kv16 = 1 if const_expr(self.fp8) else self.stages
            sKV_layout = cute.tile_to_shape(atom, (self.BN, D, n_kv16), (0, 1, 2))
            # fp8 slots: plain rows (each thread reads back only the chunks it copied,
            # a warp 512 contiguous bytes)
            sKV8_layout = cute.make_ordered_layout((self.BN, D, self.stages), order=(1, 0, 2))
            # swapped (`compute_t`) and wgmma (`compute_w`): the wgmmas' operands in their
            # smem layouts (element swizzles; the wgmmas read them through pointer swizzles
            # of the same bytes, `wgmma_view`). e4m3 K [keys, D] and Q [rows, D] are K-major
            # as laid out (D contiguous, an fp8 wgmma's only form): D bytes a row, the
            # 128-byte swizzle at D 128, the 64-byte one at D 64 (the 16-byte chunks a
            # cp.async writes stay whole). The 16-bit V block [keys, D] is MN-major as it
            # is (the layout above, the 128-byte swizzle: 64 D x 8 keys an atom, the keys'
            # atoms first): V^T's A swapped, V's B (N = D, K = keys) unswapped. Swapped,
            # P^T [rows, keys] is the MN-major B, the rows contiguous (32 or 64 bytes: the
            # 32- / 64-byte swizzle), so a thread's two neighbouring columns of S^T's
            # accumulator are one 4-byte store (stmatrix writes its 8 x 8 blocks as they
            # are); unswapped, P is O's A from registers (S's accumulator converted in
            # place, as the forward's P).
            sQ8_layout = sP_layout = tiled_mma_s = tiled_mma_o = None
            if const_expr(self.k8):
                atom8 = warpgroup.make_smem_layout_atom(
                    sm90.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, self.kv_dtype, D),
                    self.kv_dtype)
                sKV8_layout = cute.tile_to_shape(atom8, (self.BN, D, self.stages), (0, 1, 2))
                sQ8_layout = cute.tile_to_shape(atom8, (self.M, D), (0, 1))
            if const_expr(self.swap):
                sP_layout = element_swizzled(cute.tile_to_shape(
                    warpgroup.make_smem_layout_atom(
                        warpgroup.SmemLayoutAtomKind.MN_SW32 if self.M == 16 else
                        warpgroup.SmemLayoutAtomKind.MN_SW64, Float16),
                    (self.M, self.BN), (1, 0)), Float16)
                # one warpgroup, M = 64 a wgmma (two for 128 keys / D = 128), N = the rows
                tiled_mma_s = sm90.make_trivial_tiled_mma(
                    self.kv_dtype, self.kv_dtype, warpgroup.OperandMajorMode.K,
                    warpgroup.OperandMajorMode.K, Float32, atom_layout_mnk=(1, 1, 1),
                    tiler_mn=(64, self.M))
                tiled_mma_o = sm90.make_trivial_tiled_mma(
                    Float16, Float16, warpgroup.OperandMajorMode.MN,
                    warpgroup.OperandMajorMode.MN, Float32, atom_layout_mnk=(1, 1, 1),
                    tiler_mn=(64, self.M))
            if const_expr(self.wg):
                # one warpgroup, its 64 rows M (warp w rows 16 w..); N the block's keys (S),
                # the head dim (O: one wgmma a k-step, n128 at D 128)
                tiled_mma_s = sm90.make_trivial_tiled_mma(
                    self.kv_dtype, self.kv_dtype, warpgroup.OperandMajorMode.K,
                    warpgroup.OperandMajorMode.K, Float32, atom_layout_mnk=(1, 1, 1),
                    tiler_mn=(64, self.BN))
                tiled_mma_o = sm90.make_trivial_tiled_mma(
                    Float16, Float16, warpgroup.OperandMajorMode.K,
                    warpgroup.OperandMajorMode.MN, Float32, atom_layout_mnk=(1, 1, 1),
                    tiler_mn=(64, D), a_source=warpgroup.OperandSource.RMEM)

            # mma.sync 16x8x16, warps_m warps along M; N tiles of 16 so ldmatrix.x4 fills
            # a B fragment in one instruction
            tiled_mma = cute.make_tiled_mma(
                warp.MmaF16BF16Op(dt, Float32, (16, 8, 16)), (self.wm, 1, 1),
                permutation_mnk=(self.M, 16, 16))

            # gathers: 16-byte cp.async, row_threads threads per cache row (by key group:
            # a key group's threads over its keys' rows)
            g2s = cute.make_copy_atom(
                cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), self.kv_dtype,
                num_bits_per_copy=128)
            gather = cute.make_tiled_copy_tv(
                g2s, cute.make_ordered_layout((self.rows_per_pass, self.row_threads),
                                              order=(1, 0)),
                cute.make_layout((1, self.vec)))
            # q: 8 elements a thread a copy (cp.async of a 16-bit q; an fp8 q goes
            # through registers, where it is converted)
            q_atom = cute.make_copy_atom(
                cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dt,
                num_bits_per_copy=128)
            gather_q = cute.make_tiled_copy_tv(
                q_atom, cute.make_ordered_layout(
                    (self.num_threads // self.q_row_threads, self.q_row_threads),
                    order=(1, 0)),
                cute.make_layout((1, 8)))

            q_elems = 0 if self.q_in_kv_slot or self.k8 else cute.cosize(sQ_layout)
            kv8_elems = 2 * cute.cosize(sKV8_layout) if const_expr(self.fp8) else 0
            kv16_elems = cute.cosize(sKV_layout)
            # swapped / wgmma: no 16-bit K block; e4m3 Q (swapped: and P^T and the warps'
            # column maxima)
            k16_elems = 0 if self.k8 else kv16_elems
            q8_elems = cute.cosize(sQ8_layout) if const_expr(self.k8) else 0
            p_elems = cute.cosize(sP_layout) if const_expr(self.swap) else 0
            red_elems = 4 * self.M if const_expr(self.swap) else 0

            @cute.struct
            class SharedStorage:
                sK: cute.struct.Align[cute.struct.MemRange[dt, k16_elems], 1024]
                sV: cute.struct.Align[cute.struct.MemRange[dt, kv16_elems], 1024]
                sQ: cute.struct.Align[cute.struct.MemRange[dt, q_elems], 1024]
                # fp8: the K slots then the V slots (`store` stages O across both)
                sKV8: cute.struct.Align[cute.struct.MemRange[self.kv_dtype, kv8_elems], 1024]
                sQ8: cute.struct.Align[cute.struct.MemRange[self.kv_dtype, q8_elems], 1024]
                sP: cute.struct.Align[cute.struct.MemRange[Float16, p_elems], 1024]
                sRed: cute.struct.Align[cute.struct.MemRange[Float32, red_elems], 1024]

            # the host's model (smem_bytes, programs_per_sm) is the struct
            assert SharedStorage.size_in_bytes() == self.smem, \
                (SharedStorage.size_in_bytes(), self.smem)

            n_row_blocks = (group * len_q + self.M - 1) // self.M
            # token -> (page, row): a multiply-high divmod, not an integer division
            page_div = cute.FastDivmodDivisorV2(page_size) if const_expr(self.paged) \
                else page_size
            self.kernel(mQ, mK, mV, mSeqK, mPageTable, mCuQ, mOrder, mO, mLSE, mQd, mKd, mVd,
                        scale_log2, len_q, group, page_div, num_splits, sQ_layout,
                        sKV_layout, sKV8_layout, tiled_mma, gather, gather_q,
                        sQ8_layout, sP_layout, tiled_mma_s, tiled_mma_o,
                        SharedStorage).launch(
                grid=[num_splits, mK.shape[2] * n_row_blocks, mSeqK.shape[0]],
                block=[self.num_threads, 1, 1], stream=stream)

        # ------------------------------------------------------------------ the kernel
        @cute.kernel
        def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                   mSeqK: cute.Tensor, mPageTable: Optional[cute.Tensor],
                   mCuQ: Optional[cute.Tensor], mOrder: Optional[cute.Tensor],
                   mO: cute.Tensor, mLSE: cute.Tensor,
                   mQd: Optional[cute.Tensor], mKd: Optional[cute.Tensor],
                   mVd: Optional[cute.Tensor],
                   scale_log2: Float32, len_q: Int32, group: Int32,
                   page_div, num_splits: Int32,
                   sQ_layout: cute.ComposedLayout, sKV_layout: cute.ComposedLayout,
                   sKV8_layout, tiled_mma: cute.TiledMma,
                   gather: cute.TiledCopy, gather_q: cute.TiledCopy,
                   sQ8_layout, sP_layout, tiled_mma_s, tiled_mma_o,
                   SharedStorage: cutlass.Constexpr):
            tidx = cute.arch.thread_idx()[0]
            split, by, p = cute.arch.block_idx()
            b = self.sequence(mOrder, p)
            H_kv = mK.shape[2]
            hk = by % H_kv
            row0 = (by // H_kv) * self.M
            n_k = mSeqK[b]
            if const_expr(self.packed):
                q_start = mCuQ[b]
                n_q = mCuQ[b + 1] - q_start
            else:
                q_start = b * len_q
                n_q = len_q
            rows = group * n_q                 # valid tile rows of the sequence
            v_scale = Float32(1.0)
            if const_expr(self.fp8):
                # the real scores are the fp8 ones times q_descale * k_descale (kept
                # positive, so the raw row max stays the scaled one's argmax and a masked
                # -inf times the scale stays -inf)
                scale_log2 = cutlass.max(scale_log2 * mQd[b, hk] * mKd[b, hk], FLT_MIN)
                v_scale = mVd[b, hk]

            smem = cutlass.utils.SmemAllocator()
            storage = smem.allocate(SharedStorage)
            sV = storage.sV.get_tensor(sKV_layout)
            sK = sV                            # swapped / wgmma: K stays e4m3 (no 16-bit block)
            if const_expr(not self.k8):
                sK = storage.sK.get_tensor(sKV_layout)
            if const_expr(self.k8):
                sQ = storage.sQ8.get_tensor(sQ8_layout)
            elif const_expr(self.q_in_kv_slot):
                # Q in the last K slot (FP8: the 16-bit K block): it is in registers
                # before that slot's first load / conversion (the loop's first CTA
                # barrier, or by key group the CTA barrier after Q's reads)
                sQ = cute.make_tensor(sK[None, None, cute.size(sK, mode=[2]) - 1].iterator,
                                      sQ_layout)
            else:
                sQ = storage.sQ.get_tensor(sQ_layout)
            sK8, sV8 = sK, sV
            if const_expr(self.fp8):
                p8 = storage.sKV8.data_ptr()
                sK8 = cute.make_tensor(p8, sKV8_layout)
                sV8 = cute.make_tensor(p8 + cute.cosize(sKV8_layout), sKV8_layout)
            # `store`: the key groups' fp32 O over the K slots (FP8: the K and V slots),
            # the row statistics in the V slots (FP8: the 16-bit K block)
            o_ptr = cute.recast_ptr(storage.sK.data_ptr(), dtype=Float32)
            stats_ptr = cute.recast_ptr(storage.sV.data_ptr(), dtype=Float32)
            if const_expr(self.fp8):
                o_ptr = cute.recast_ptr(storage.sKV8.data_ptr(), dtype=Float32)
                stats_ptr = cute.recast_ptr(
                    (storage.sV if self.k8 else storage.sK).data_ptr(), dtype=Float32)

            if row0 < rows:
                # the KV blocks this split reads: the tile's visible keys in num_splits
                # contiguous chunks. Causal: the tile's last row sees the most keys, its
                # first row the fewest (blocks wholly below that need no mask)
                n_vis = n_k
                n_full = n_k
                if const_expr(self.causal):
                    i_last = cutlass.min(row0 + self.M - 1, rows - 1) // group
                    n_vis = cutlass.max(cutlass.min(i_last + 1 + n_k - n_q, n_k), 0)
                    n_full = cutlass.max(cutlass.min(row0 // group + 1 + n_k - n_q, n_k), 0)
                n_blocks = (n_vis + self.BN - 1) // self.BN
                per_split = (n_blocks + num_splits - 1) // num_splits
                blk_lo = split * per_split
                n_iter = cutlass.max(cutlass.min(per_split, n_blocks - blk_lo), 0)
                tile = Tile(b, hk, q_start, n_q, n_k, row0, rows, group, page_div)

                if const_expr(not self.q_fp8):
                    self.load_q(mQ, sQ, gather_q, tidx, tile)
                cute.arch.cp_async_commit_group()
                # (page, row in page) of this thread's rows of the next block to issue
                rows_kv = cute.make_rmem_tensor((2, self.BNc // self.rows_per_pass), Int32)
                for t in cutlass.range_constexpr(self.stages - 1):
                    if t < n_iter:
                        self.lookup(mPageTable, gather, tidx, blk_lo + t, rows_kv, tile)
                        self.load_kv(mK, mV, sK8, sV8, gather, tidx, rows_kv, t, hk)
                    cute.arch.cp_async_commit_group()
                if self.stages - 1 < n_iter:
                    self.lookup(mPageTable, gather, tidx, blk_lo + self.stages - 1, rows_kv,
                                tile)
                if const_expr(self.k8):
                    # e4m3 as it is, once the cache copies are in flight
                    self.load_q8(mQ, sQ, tidx, tile)
                elif const_expr(self.q_fp8):
                    # through registers, once the cache copies are in flight
                    self.load_q_fp8(mQ, sQ, gather_q, tidx, tile)

                if const_expr(self.swap):
                    row_max, row_sum, acc_O = self.compute_t(
                        sQ, sV, sK8, sV8, storage.sP.get_tensor(sP_layout),
                        storage.sRed.get_tensor(cute.make_layout((self.M, 4), stride=(4, 1))),
                        mK, mV, mPageTable, gather, tiled_mma_s, tiled_mma_o, tidx,
                        scale_log2, blk_lo, n_iter, n_full, rows_kv, tile)
                elif const_expr(self.wg):
                    row_max, row_sum, acc_O = self.compute_w(
                        sQ, sV, sK8, sV8, mK, mV, mPageTable, gather, tiled_mma_s, tiled_mma_o,
                        tidx, scale_log2, blk_lo, n_iter, n_full, rows_kv, tile)
                else:
                    row_max, row_sum, acc_O = self.compute(
                        sQ, sK, sV, sK8, sV8, mK, mV, mPageTable, gather, tiled_mma, tidx,
                        scale_log2, blk_lo, n_iter, n_full, rows_kv, tile)

                # the slots become the key groups' fp32 O
                cute.arch.cp_async_wait_group(0)
                cute.arch.barrier()
                self.store(acc_O, row_max, row_sum, o_ptr, stats_ptr, mO, mLSE,
                           tiled_mma_o if self.k8 else tiled_mma, tidx, scale_log2, v_scale,
                           split, tile)

        # ------------------------------------------------------------------ schedule
        @cute.jit
        def sequence(self, mOrder, p):  # role: schedule
            """The sequence of batch coordinate p: mOrder[p] (the launch order), or p."""
            b = p
            if const_expr(self.ordered):
                b = mOrder[p]
            return b

        # ------------------------------------------------------------------ load
        @cute.jit
        def gmem_at(self, m, offset, n: cutlass.Constexpr,
                    align: cutlass.Constexpr = 16):  # role: load
            """The n-element vector of m at element `offset` (`align`-byte aligned)."""
            ptr = cute.make_ptr(m.element_type, (m.iterator + offset).toint(),
                                cute.AddressSpace.gmem, assumed_align=align)
            return cute.make_tensor(ptr, cute.make_layout((n,)))

        @cute.jit
        def q_rows(self, sQ, gather_q, tidx, tile):  # role: load
            """This thread's 8-element chunks of sQ and their (row, col) in the tile."""
            thr = gather_q.get_slice(tidx)
            tQsQ = thr.partition_D(sQ)
            tQcQ = thr.partition_S(cute.make_identity_tensor((self.M, self.D)))
            return tQsQ, tQcQ

        @cute.jit
        def q_offset(self, mQ, tQcQ, m, tile):  # role: load
            """Where chunk m lives in q: tile row r -> q[q_start + r // group,
            h_kv * group + r % group]; padding rows repeat the last valid row (computed,
            never stored)."""
            r = cutlass.min(tile.row0 + tQcQ[0, m, 0][0], tile.rows - 1)
            i = r // tile.group
            return cute.crd2idx((tile.q_start + i, tile.hk * tile.group + (r - i * tile.group),
                                 tQcQ[0, m, 0][1]), mQ.layout)

        @cute.jit
        def load_q(self, mQ, sQ, gather_q, tidx, tile):  # role: load
            """A 16-bit q: cp.async, 16 bytes a copy."""
            tQsQ, tQcQ = self.q_rows(sQ, gather_q, tidx, tile)
            for m in cutlass.range_constexpr(cute.size(tQsQ, mode=[1])):
                src = self.gmem_at(mQ, self.q_offset(mQ, tQcQ, m, tile), 8)
                cute.copy(gather_q, cute.make_tensor(src.iterator, tQsQ[None, m, 0].layout),
                          tQsQ[None, m, 0])

        @cute.jit
        def load_q_fp8(self, mQ, sQ, gather_q, tidx, tile):  # role: load
            """An fp8 q: 8 bytes a load into registers, converted, 16 bytes a store."""
            tQsQ, tQcQ = self.q_rows(sQ, gather_q, tidx, tile)
            for m in cutlass.range_constexpr(cute.size(tQsQ, mode=[1])):
                src = self.gmem_at(mQ, self.q_offset(mQ, tQcQ, m, tile), 8, 8)
                src = cute.make_tensor(src.iterator, tQsQ[None, m, 0].layout)
                r = cute.make_rmem_tensor_like(src)
                cute.autovec_copy(src, r)
                tQsQ[None, m, 0].store(r.load().to(self.dtype))

        @cute.jit
        def load_q8(self, mQ, sQ8, tidx, tile):  # role: load
            """Swapped / wgmma: an e4m3 q into its K-major smem as it is (the S^T wgmma's B,
            the S wgmma's A), 8 bytes a load and a store (q's rows are 8-byte aligned); rows
            as in `q_offset`. The wgmma reads it through the async proxy: `compute_t` /
            `compute_w` fences it."""
            copy_q8 = cute.make_tiled_copy_tv(
                cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.kv_dtype,
                                    num_bits_per_copy=64),
                cute.make_ordered_layout(
                    (self.num_threads // self.q_row_threads, self.q_row_threads), order=(1, 0)),
                cute.make_layout((1, 8)))
            thr = copy_q8.get_slice(tidx)
            tQsQ = thr.partition_D(sQ8)
            tQcQ = thr.partition_S(cute.make_identity_tensor((self.M, self.D)))
            for m in cutlass.range_constexpr(cute.size(tQsQ, mode=[1])):
                src = self.gmem_at(mQ, self.q_offset(mQ, tQcQ, m, tile), 8, 8)
                src = cute.make_tensor(src.iterator, tQsQ[None, m, 0].layout)
                r = cute.make_rmem_tensor_like(src)
                cute.autovec_copy(src, r)
                cute.autovec_copy(r, tQsQ[None, m, 0])

        @cute.jit
        def lookup(self, mPageTable, gather, tidx, blk, rows_kv, tile):  # role: load
            """Where this thread's cache rows of block blk live: rows_kv (page, row in
            page) per copy pass, filled in place. Token j -> page_table[b, j // page_size],
            j % page_size (paged) or (b, j) (contiguous). Tokens past n_k repeat token
            n_k - 1 (their scores are masked; a finite V row keeps P V finite). Issued a
            block ahead of its copies, so the table read's latency is off the loop."""
            b, n_k = tile.b, tile.n_k
            tKcK = self.kv_thr(gather, tidx).partition_S(
                self.kv_rows(cute.make_identity_tensor((self.BN, self.D)), tidx))
            for m in cutlass.range_constexpr(cute.size(rows_kv, mode=[1])):
                j = cutlass.min(blk * self.BN + tKcK[0, m, 0][0], n_k - 1)
                if const_expr(self.paged):
                    pi, row = divmod(j, tile.page_div)
                    rows_kv[0, m] = mPageTable[b, pi]
                    rows_kv[1, m] = row
                else:
                    rows_kv[0, m] = b
                    rows_kv[1, m] = j

        @cute.jit
        def load_kv(self, mK, mV, sK, sV, gather, tidx, rows_kv, stage, hk):  # role: load
            """K and V of one block (its rows from `lookup`) into slot `stage`. k_cache and
            v_cache share one layout (one shape, both contiguous: the core checks), so a
            row's offset is computed once for both."""
            thr = self.kv_thr(gather, tidx)
            tKsK = thr.partition_D(self.kv_rows(sK[None, None, stage], tidx))
            tVsV = thr.partition_D(self.kv_rows(sV[None, None, stage], tidx))
            col = thr.partition_S(cute.make_identity_tensor((self.BNc, self.D)))[0, 0, 0][1]
            for m in cutlass.range_constexpr(cute.size(tKsK, mode=[1])):
                off = cute.crd2idx((rows_kv[0, m], rows_kv[1, m], hk, col), mK.layout)
                src_k = self.gmem_at(mK, off, self.vec)
                src_v = self.gmem_at(mV, off, self.vec)
                cute.copy(gather, cute.make_tensor(src_k.iterator, tKsK[None, m, 0].layout),
                          tKsK[None, m, 0])
                cute.copy(gather, cute.make_tensor(src_v.iterator, tVsV[None, m, 0].layout),
                          tVsV[None, m, 0])

        @cute.jit
        def kv_thr(self, gather, tidx):  # role: load
            """This thread's slice of the cache gather (by key group: its index in the
            key group)."""
            return gather.get_slice(tidx % self.gthreads)

        @cute.jit
        def kv_rows(self, s, tidx):  # role: load
            """The (keys, D) rows of one block `s` this thread's copy group covers: the
            whole block, or (by key group) its key group's rows kg * BNg..."""
            if const_expr(self.by_group):
                s = cute.local_tile(s, (self.BNg, self.D), (tidx // (32 * self.wm), 0))
            return s

        @cute.jit
        def kv_sync(self, kg):  # role: load
            """The barrier of the KV loop: the CTA, or (by key group) the key group's
            threads (one warp: bar.warp.sync; warps_m warps: named barrier 1 + kg)."""
            if const_expr(not self.by_group):
                cute.arch.barrier()
            elif const_expr(self.wm == 1):
                cute.arch.sync_warp()
            else:
                cute.arch.barrier(barrier_id=1 + kg, number_of_threads=self.gthreads)

        @cute.jit
        def issue_block(self, nxt, sK8, sV8, mK, mV, mPageTable, gather, tidx, blk_lo, n_iter,
                        rows_kv, tile):  # role: load
            """Block nxt's copies into its slot (none past the last block), the page of the
            block after it looked up, and this thread's commit group (empty or not: the
            loop waits by group count)."""
            if nxt < n_iter:
                self.load_kv(mK, mV, sK8, sV8, gather, tidx, rows_kv, nxt % self.stages,
                             tile.hk)
                if nxt + 1 < n_iter:
                    self.lookup(mPageTable, gather, tidx, blk_lo + nxt + 1, rows_kv, tile)
            cute.arch.cp_async_commit_group()

        # ------------------------------------------------------------------ convert
        @cute.jit
        def convert_kv(self, sK8, sV8, sK, sV, gather, tidx, stage):  # role: load
            """FP8: this thread's chunks of slot `stage` (the ones it copied) -> the
            16-bit block, in the same (key, D) places."""
            thr = self.kv_thr(gather, tidx)
            # swapped / wgmma: V only (the S / S^T wgmma reads K in e4m3)
            pairs = ((sV8, sV),) if const_expr(self.k8) else ((sK8, sK), (sV8, sV))
            for src, dst in pairs:
                t8 = thr.partition_D(self.kv_rows(src[None, None, stage], tidx))
                t16 = thr.partition_D(self.kv_rows(dst[None, None, 0], tidx))
                for m in cutlass.range_constexpr(cute.size(t8, mode=[1])):
                    r = cute.make_rmem_tensor_like(t8[None, m, 0])
                    cute.autovec_copy(t8[None, m, 0], r)
                    t16[None, m, 0].store(r.load().to(self.dtype))

        @cute.jit
        def key_slice(self, s, stage, kg):  # role: compute
            """Key group kg's (keys, D) rows of slot `stage`."""
            return cute.local_tile(s[None, None, stage], (self.BNg, self.D), (kg, 0))

        @cute.jit
        def key_slice_t(self, s, stage, kg):  # role: compute
            """The same rows seen transposed (D, keys): the B operand of P V."""
            st = cute.composition(s[None, None, stage],
                                  cute.make_ordered_layout((self.D, self.BN), order=(1, 0)))
            return cute.local_tile(st, (self.D, self.BNg), (0, kg))

        # ------------------------------------------------------------------ compute
        def key_ends(self, tile_rows, tile):  # role: compute
            """The keys [0, end) each of these tile rows (this thread's rows or columns of
            an accumulator) sees: n_k, or (causal) up to its query row's diagonal."""
            ends = cute.make_rmem_tensor(len(tile_rows), Int32)
            for i, r in enumerate(tile_rows):
                ends[i] = tile.n_k
                if const_expr(self.causal):
                    qi = cutlass.min(tile.row0 + r, tile.rows - 1) // tile.group
                    ends[i] = qi + 1 + tile.n_k - tile.n_q
            return ends

        @cute.jit
        def mask_rows(self, S, tScS, row_end, key0):  # role: compute
            """S (rows, keys), this thread's part, with each row's keys from row_end[r] on
            at -inf; tScS: the (row, key) of each element, its keys counted from key0."""
            for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
                limit = row_end[r] - key0
                for c in cutlass.range_constexpr(cute.size(S, mode=[1])):
                    S[r, c] = -Float32.inf if tScS[0, c][1] >= limit else S[r, c]

        @cute.jit
        def softmax_rows(self, S, O, row_max, row_sum, scale_log2):  # role: compute
            """The online softmax of a block along its rows (exp2 domain, scale * log2(e)
            folded in; TLX's `_masked_max` and the updates of `_attend`): S (rows, keys)
            becomes P, O (rows, D) is rescaled; this thread's part of them, a row's max
            over the 4 lanes (a quad) that hold it, its sum this thread's partial one
            (the quad adds them up in `store`)."""
            for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
                s_row = S[r, None].load()
                m_new = s_row.reduce(cute.ReductionOp.MAX, row_max[r], 0)
                m_new = cute.arch.warp_reduction_max(m_new, threads_in_group=4)
                m_prev = row_max[r]
                row_max[r] = m_new
                m_safe = 0.0 if m_new == -Float32.inf else m_new
                p_row = cute.math.exp2(s_row * scale_log2 - m_safe * scale_log2,
                                       fastmath=True)
                corr = cute.math.exp2((m_prev - m_safe) * scale_log2, fastmath=True)
                row_sum[r] = p_row.reduce(cute.ReductionOp.ADD, row_sum[r] * corr, 0)
                S[r, None].store(p_row)
                O[r, None].store(O[r, None].load() * corr)

        @cute.jit
        def compute(self, sQ, sK, sV, sK8, sV8, mK, mV, mPageTable, gather, tiled_mma,
                    tidx, scale_log2, blk_lo, n_iter, n_full, rows_kv, tile):  # role: compute
            """The KV loop of one tile; returns this thread's (row max, row sum, O) of its
            key group (row sums are per thread: the quad reduces them in `store`)."""
            dt = self.dtype
            kg = tidx // (32 * self.wm)                  # key group: keys kg*BNg.. of a block
            thr_mma = tiled_mma.get_slice(tidx % (32 * self.wm))

            # ldmatrix: Q, K row-major (k-major), V transposed (D, keys)
            ldm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), dt)
            ldm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), dt)
            s2r_Q = cute.make_tiled_copy_A(ldm, tiled_mma).get_slice(tidx % (32 * self.wm))
            s2r_K = cute.make_tiled_copy_B(ldm, tiled_mma).get_slice(tidx % (32 * self.wm))
            s2r_V = cute.make_tiled_copy_B(ldm_t, tiled_mma).get_slice(tidx % (32 * self.wm))

            tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
            tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(self.key_slice(sK, 0, kg)))
            tOrV = thr_mma.make_fragment_B(thr_mma.partition_B(self.key_slice_t(sV, 0, kg)))
            acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((self.M, self.D)), Float32)
            acc_O.fill(0.0)
            shape_S = thr_mma.partition_shape_C((self.M, self.BNg))
            # (row, key) of every S element within the tile / the key group's slice
            tScS = rows_cols(thr_mma.partition_C(cute.make_identity_tensor((self.M, self.BNg))))
            n_rows = cute.size(tScS, mode=[0])
            row_max = cute.make_rmem_tensor(n_rows, Float32)
            row_sum = cute.make_rmem_tensor(n_rows, Float32)
            row_max.fill(-Float32.inf)
            row_sum.fill(0.0)
            row_end = self.key_ends([tScS[r, 0][0] for r in range(n_rows)], tile)

            # Q: smem -> registers once
            cute.arch.cp_async_wait_group(self.stages - 1)
            cute.arch.barrier()
            cute.copy(s2r_Q, s2r_Q.partition_S(sQ), s2r_Q.retile(tSrQ))
            if const_expr(self.by_group and self.q_in_kv_slot):
                # Q's bytes lie over the first key groups' rows of the last K slot (FP8:
                # the 16-bit K block): every warp has read Q before any key group writes
                # its rows there (the loop syncs key groups only)
                cute.arch.barrier()

            for t in cutlass.range(n_iter, unroll=1):
                stage = t % self.stages
                cute.arch.cp_async_wait_group(self.stages - 2)
                self.kv_sync(kg)
                # slot (t - 1) % stages is free: the next block goes there (FP8: the
                # 16-bit block is free too). By key group: block t's rows of this key
                # group are visible to its threads, and they are done reading its rows
                # of slot (t - 1) % stages (and of the 16-bit block)
                self.issue_block(t + self.stages - 1, sK8, sV8, mK, mV, mPageTable, gather,
                                 tidx, blk_lo, n_iter, rows_kv, tile)
                kv = stage
                if const_expr(self.fp8):
                    self.convert_kv(sK8, sV8, sK, sV, gather, tidx, stage)
                    self.kv_sync(kg)
                    kv = 0

                blk = blk_lo + t
                # S = Q K^T over this key group's keys
                acc_S = cute.make_rmem_tensor(shape_S, Float32)
                acc_S.fill(0.0)
                tSsK = s2r_K.partition_S(self.key_slice(sK, kv, kg))
                tSrK_v = s2r_K.retile(tSrK)
                for k in cutlass.range_constexpr(cute.size(tSrK, mode=[2])):
                    cute.copy(s2r_K, tSsK[None, None, k], tSrK_v[None, None, k])
                    cute.gemm(tiled_mma, acc_S, tSrQ[None, None, k], tSrK[None, None, k], acc_S)

                S = rows_cols(acc_S)
                if (blk + 1) * self.BN > n_full:
                    self.mask_rows(S, tScS, row_end, blk * self.BN + kg * self.BNg)
                self.softmax_rows(S, rows_cols(acc_O), row_max, row_sum, scale_log2)

                # O += P V
                rP = cute.make_rmem_tensor_like(acc_S, dt)
                rP.store(acc_S.load().to(dt))
                tOrP = as_operand_a(rP)
                tOsV = s2r_V.partition_S(self.key_slice_t(sV, kv, kg))
                tOrV_v = s2r_V.retile(tOrV)
                for k in cutlass.range_constexpr(cute.size(tOrV, mode=[2])):
                    cute.copy(s2r_V, tOsV[None, None, k], tOrV_v[None, None, k])
                    cute.gemm(tiled_mma, acc_O, tOrP[None, None, k], tOrV[None, None, k], acc_O)
            return row_max, row_sum, acc_O

        @cute.jit
        def next_block(self, t, sK8, sV8, mK, mV, mPageTable, gather, tidx, blk_lo, n_iter,
                       rows_kv, tile):  # role: load
            """The head of block t in a wgmma tile (`attend_t`, `attend`): the pipeline of
            `compute` with the CTA (the warpgroup) as its one key group. Block t's copies
            waited for and fenced, block t - 1's P V wgmma waited for, one CTA barrier,
            block t + stages - 1 issued into slot (t - 1) % stages. Returns block t's
            slot."""
            stage = t % self.stages
            cute.arch.cp_async_wait_group(self.stages - 2)
            # this thread's copies of block t (cp.async: the generic proxy) before the S
            # wgmma reads the slot (the async proxy)
            cute.arch.fence_view_async_shared()
            # block t - 1's P V wgmma is done with the 16-bit V block (and its P: P^T in
            # smem swapped, registers unswapped)
            warpgroup.wait_group(0)
            cute.arch.barrier()
            # slot (t - 1) % stages is free: the next block goes there
            self.issue_block(t + self.stages - 1, sK8, sV8, mK, mV, mPageTable, gather, tidx,
                             blk_lo, n_iter, rows_kv, tile)
            return stage

        def wgmma_kqv(self, sK8, sQ8, sV):  # role: compute
            """The wgmma tiles' smem operands (descriptors over the copies' bytes): K and q
            in e4m3 as loaded, and V^T (D, keys), the 16-bit V block [keys, D] read
            MN-major (P V's B unswapped, O^T's A swapped)."""
            sKw = wgmma_view(sK8.iterator, sK8.layout, self.kv_dtype)
            sQw = wgmma_view(sQ8.iterator, sQ8.layout, self.kv_dtype)
            sVw = wgmma_view(sV.iterator, sV.layout, Float16)
            return sKw, sQw, cute.composition(
                sVw, cute.make_ordered_layout((self.D, self.BN, 1), order=(1, 0, 2)))

        @cute.jit
        def compute_w(self, sQ8, sV, sK8, sV8, mK, mV, mPageTable, gather, tiled_mma_s,
                      tiled_mma_o, tidx, scale_log2, blk_lo, n_iter, n_full, rows_kv,
                      tile):  # role: compute
            """The KV loop of one tile on wgmmas, unswapped (wgmma_s: an e4m3 q over an e4m3
            cache, 64 rows; TLX's `_attend` there), one `attend` a block: the bulk (no
            mask), then the masked tail, as `compute_t`. Returns this thread's (row max,
            row sum, O), as `compute`: a warp owns 16 whole rows, so the row max is whole
            (the quad's) and the row sums are per thread (the quad adds them in `store`)."""
            thr_s = tiled_mma_s.get_slice(tidx)
            thr_o = tiled_mma_o.get_slice(tidx)
            sKw, sQw, sVt = self.wgmma_kqv(sK8, sQ8, sV)
            # S = Q K^T: A (rows, D), B (keys, D) per slot; O = P V: A (rows, keys) in
            # registers, B (D, keys)
            ops = WgmmaOps(
                thr_s.make_fragment_A(thr_s.partition_A(sQw)),
                thr_s.make_fragment_B(thr_s.partition_B(sKw)),
                thr_o.make_fragment_A(thr_o.partition_shape_A((self.M, self.BN))),
                thr_o.make_fragment_B(thr_o.partition_B(sVt[None, None, 0])),
                acc_rows_cols(thr_s.partition_C(cute.make_identity_tensor((self.M, self.BN)))))
            acc_O = cute.make_rmem_tensor(thr_o.partition_shape_C((self.M, self.D)), Float32)
            acc_O.fill(0.0)
            n_rows = cute.size(ops.tScS, mode=[0])
            row_max = cute.make_rmem_tensor(n_rows, Float32)
            row_sum = cute.make_rmem_tensor(n_rows, Float32)
            row_max.fill(-Float32.inf)
            row_sum.fill(0.0)
            row_end = self.key_ends([ops.tScS[r, 0][0] for r in range(n_rows)], tile)

            # Q: this thread's e4m3 stores (generic proxy) before the wgmmas' reads (async
            # proxy), then every thread's
            cute.arch.fence_view_async_shared()
            cute.arch.barrier()
            # blocks [0, n_bulk) lie below n_full: no mask (two loops, as `compute_t`)
            n_bulk = cutlass.max(cutlass.min(n_full // self.BN - blk_lo, n_iter), 0)
            for t in cutlass.range(n_bulk, unroll=1):
                self.attend(False, t, ops, acc_O, row_max, row_sum, row_end, sK8, sV8, sV,
                            mK, mV, mPageTable, gather, tiled_mma_s, tiled_mma_o, tidx,
                            scale_log2, blk_lo, n_iter, rows_kv, tile)
            for t in cutlass.range(n_bulk, n_iter, unroll=1):
                self.attend(True, t, ops, acc_O, row_max, row_sum, row_end, sK8, sV8, sV,
                            mK, mV, mPageTable, gather, tiled_mma_s, tiled_mma_o, tidx,
                            scale_log2, blk_lo, n_iter, rows_kv, tile)
            warpgroup.wait_group(0)
            return row_max, row_sum, acc_O

        @cute.jit
        def attend(self, masked: cutlass.Constexpr, t, ops, acc_O, row_max, row_sum, row_end,
                   sK8, sV8, sV, mK, mV, mPageTable, gather, tiled_mma_s, tiled_mma_o, tidx,
                   scale_log2, blk_lo, n_iter, rows_kv, tile):  # role: compute
            """Block t on wgmmas, unswapped (TLX's `_attend` at 64 rows): S = Q K^T ([rows,
            keys]; e4m3 Q from smem and e4m3 K from its slot, both K-major, into an fp8
            wgmma, fp32 accumulate), masked (keys past a row's row_end at -inf), the
            softmax along the rows (`softmax_rows`), O += P V ([rows, D]; P converted to
            f16 in registers as the wgmma's A, V the 16-bit V block), left in flight until
            the next block's head (`next_block`)."""
            stage = self.next_block(t, sK8, sV8, mK, mV, mPageTable, gather, tidx, blk_lo,
                                    n_iter, rows_kv, tile)
            # S = Q K^T, e4m3 x e4m3; V converted to 16 bits meanwhile
            acc_S = cute.make_rmem_tensor(
                tiled_mma_s.get_slice(tidx).partition_shape_C((self.M, self.BN)), Float32)
            wgmma(tiled_mma_s, acc_S, ops.tSrQ, ops.tSrK[None, None, None, stage],
                  zero_init=True, wait=-1)
            self.convert_kv(sK8, sV8, sV, sV, gather, tidx, stage)
            warpgroup.wait_group(0)

            S = acc_rows_cols(acc_S)
            if const_expr(masked):
                self.mask_rows(S, ops.tScS, row_end, (blk_lo + t) * self.BN)
            self.softmax_rows(S, acc_rows_cols(acc_O), row_max, row_sum, scale_log2)

            # O += P V: P (f16) into the A fragment's registers, every thread's V
            # converted and fenced (its generic stores before the wgmma's async-proxy
            # reads), then the wgmma (in flight until the next block's head)
            ops.tOrP.store(acc_as_operand_a(acc_S).load().to(Float16))
            cute.arch.fence_view_async_shared()
            cute.arch.barrier()
            wgmma(tiled_mma_o, acc_O, ops.tOrP, ops.tOrV, zero_init=False, wait=-1)

        @cute.jit
        def keys_reduce(self, x, op):  # role: compute
            """x reduced over the lanes of a warp that hold one column of a wgmma
            accumulator (lanes 4 apart: the warp's 8 rows of each 8-row group)."""
            for off in (4, 8, 16):
                x = op(x, cute.arch.shuffle_sync_bfly(x, offset=off))
            return x

        @cute.jit
        def compute_t(self, sQ8, sV, sK8, sV8, sP, sRed, mK, mV, mPageTable, gather,
                      tiled_mma_s, tiled_mma_o, tidx, scale_log2, blk_lo, n_iter, n_full,
                      rows_kv, tile):  # role: compute
            """The KV loop of one tile with the block's keys as the wgmmas' M (swap: an e4m3
            q over an e4m3 cache, 16 and 32 rows; TLX's `_attend_t`), one `attend_t` a
            block: the bulk (blocks every tile row sees whole, no mask), then the masked
            tail (the sequence end, the causal diagonal). Returns this thread's (column
            max, column sums, O^T): the column max is the warpgroup's, the column sums this
            thread's own partial ones over its keys, added up once in `store` (no
            cross-warp sum a block)."""
            thr_s = tiled_mma_s.get_slice(tidx)
            thr_o = tiled_mma_o.get_slice(tidx)
            sKw, sQw, sVt = self.wgmma_kqv(sK8, sQ8, sV)
            sPw = wgmma_view(sP.iterator, sP.layout, Float16)
            # S^T = K Q^T: A (keys, D) per slot, B (rows, D); O^T = V^T P^T: A (D, keys),
            # B (rows, keys)
            ops = SwapOps(
                thr_s.make_fragment_A(thr_s.partition_A(sKw)),
                thr_s.make_fragment_B(thr_s.partition_B(sQw)),
                thr_o.make_fragment_A(thr_o.partition_A(sVt[None, None, 0])),
                thr_o.make_fragment_B(thr_o.partition_B(sPw)),
                # (key, row) of every S^T element: rows of the view are keys, columns rows
                acc_rows_cols(thr_s.partition_C(cute.make_identity_tensor((self.BN, self.M)))),
                # P^T: S^T's accumulator (f16) by stmatrix into the (keys, rows) view of
                # P^T, its 8 x 8 blocks whole (rows contiguous)
                cute.make_tiled_copy_C(
                    cute.make_copy_atom(warp.StMatrix8x8x16bOp(transpose=False,
                                                               num_matrices=4), Float16),
                    tiled_mma_s).get_slice(tidx),
                cute.composition(sPw, cute.make_ordered_layout((self.BN, self.M),
                                                               order=(1, 0))))
            acc_O = cute.make_rmem_tensor(thr_o.partition_shape_C((self.D, self.M)), Float32)
            acc_O.fill(0.0)
            n_cols = cute.size(ops.tScS, mode=[1])
            # the running max of the column this lane owns (`keys_max_own`; the lanes that
            # need it read it by shuffle), this thread's partial sums of its columns
            col_max = cute.make_rmem_tensor(1, Float32)
            col_sum = cute.make_rmem_tensor(n_cols, Float32)
            col_max.fill(-Float32.inf)
            col_sum.fill(0.0)
            # the keys [0, col_end[c]) each of this thread's columns (tile rows) sees
            col_end = self.key_ends([ops.tScS[0, c][1] for c in range(n_cols)], tile)

            # Q: this thread's e4m3 stores (generic proxy) before the wgmmas' reads (async
            # proxy), then every thread's
            cute.arch.fence_view_async_shared()
            cute.arch.barrier()
            # blocks [0, n_bulk) lie below n_full: no mask. Two loops, not a branch in
            # one: a conditional mask on S^T in the loop crashes the DSL's compiler (and the
            # bulk step carries no mask code)
            n_bulk = cutlass.max(cutlass.min(n_full // self.BN - blk_lo, n_iter), 0)
            for t in cutlass.range(n_bulk, unroll=1):
                self.attend_t(False, t, ops, acc_O, col_max, col_sum, col_end, sK8, sV8, sV,
                              sRed, mK, mV, mPageTable, gather, tiled_mma_s, tiled_mma_o,
                              tidx, scale_log2, blk_lo, n_iter, rows_kv, tile)
            for t in cutlass.range(n_bulk, n_iter, unroll=1):
                self.attend_t(True, t, ops, acc_O, col_max, col_sum, col_end, sK8, sV8, sV,
                              sRed, mK, mV, mPageTable, gather, tiled_mma_s, tiled_mma_o,
                              tidx, scale_log2, blk_lo, n_iter, rows_kv, tile)
            warpgroup.wait_group(0)
            return col_max, col_sum, acc_O

        @cute.jit
        def attend_t(self, masked: cutlass.Constexpr, t, ops, acc_O, col_max, col_sum,
                     col_end, sK8, sV8, sV, sRed, mK, mV, mPageTable, gather, tiled_mma_s,
                     tiled_mma_o, tidx, scale_log2, blk_lo, n_iter, rows_kv,
                     tile):  # role: compute
            """Block t swapped (TLX's `_attend_t`): S^T = K Q^T ([keys, rows]; e4m3 K from
            its slot and e4m3 Q from smem, both K-major, into an fp8 wgmma, fp32
            accumulate), masked (keys past a column's col_end at -inf), the softmax down the
            columns, O^T += V^T P^T ([D, rows]; V^T the 16-bit V block, P^T in f16 through
            smem), the head of the block `next_block`'s."""
            warp_i = cute.arch.make_warp_uniform(tidx // 32)
            stage = self.next_block(t, sK8, sV8, mK, mV, mPageTable, gather, tidx, blk_lo,
                                    n_iter, rows_kv, tile)

            # S^T = K Q^T, e4m3 x e4m3; V converted to 16 bits meanwhile (fenced with P^T)
            acc_S = cute.make_rmem_tensor(
                tiled_mma_s.get_slice(tidx).partition_shape_C((self.BN, self.M)), Float32)
            wgmma(tiled_mma_s, acc_S, ops.tSrK[None, None, None, stage], ops.tSrQ,
                  zero_init=True, wait=-1)
            self.convert_kv(sK8, sV8, sV, sV, gather, tidx, stage)
            warpgroup.wait_group(0)

            S = acc_rows_cols(acc_S)
            if const_expr(masked):
                key0 = (blk_lo + t) * self.BN
                for c in cutlass.range_constexpr(cute.size(S, mode=[1])):
                    limit = col_end[c] - key0
                    for r in cutlass.range_constexpr(cute.size(S, mode=[0])):
                        S[r, c] = -Float32.inf if ops.tScS[r, 0][0] >= limit else S[r, c]

            # the column max over the block's keys: this thread's keys, the warp's (each
            # lane one column's, `keys_max_own`), then the warpgroup's: the four warps'
            # maxima meet in smem (one barrier; the previous block's readers are past the
            # loop's barriers), each lane reading its own column's
            n_cols = cute.size(S, mode=[1])
            lane = tidx % 32
            own_col = own([ops.tScS[0, c][1] for c in range(n_cols)], lane)
            mx = keys_max_own(
                [S[None, c].load().reduce(cute.ReductionOp.MAX, -Float32.inf, 0)
                 for c in range(n_cols)], lane)
            sRed[own_col, warp_i] = mx
            cute.arch.barrier()
            red = cute.make_rmem_tensor(4, Float32)
            cute.autovec_copy(sRed[own_col, None], red)
            m_prev = col_max[0]
            m_new = red.load().reduce(cute.ReductionOp.MAX, m_prev, 0)
            col_max[0] = m_new
            # the new max (0 where the column has seen no key: no NaN) and the old one's
            # correction, scaled, once a column; each lane reads its columns' by shuffle
            m_scaled = (0.0 if m_new == -Float32.inf else m_new) * scale_log2
            corr_own = cute.math.exp2(m_prev * scale_log2 - m_scaled, fastmath=True)

            # online softmax down the columns (exp2 domain, scale * log2(e) folded in)
            O = acc_rows_cols(acc_O)
            for c in cutlass.range_constexpr(n_cols):
                src = (lane & 3) + owner(c, n_cols)
                m_c = cute.arch.shuffle_sync(m_scaled, offset=src)
                corr = cute.arch.shuffle_sync(corr_own, offset=src)
                p_col = cute.math.exp2(S[None, c].load() * scale_log2 - m_c, fastmath=True)
                col_sum[c] = p_col.reduce(cute.ReductionOp.ADD, col_sum[c] * corr, 0)
                S[None, c].store(p_col)
                O[None, c].store(O[None, c].load() * corr)

            # O^T += V^T P^T: every warp's P^T (f16) in smem and its V converted, fenced
            # (this thread's generic stores before the wgmma's async-proxy reads), then the
            # wgmma (in flight until the next block's first wait)
            rP = cute.make_rmem_tensor_like(acc_S, Float16)
            rP.store(acc_S.load().to(Float16))
            cute.copy(ops.r2s, ops.r2s.retile(rP), ops.r2s.partition_D(ops.sP_kr))
            cute.arch.fence_view_async_shared()
            cute.arch.barrier()
            wgmma(tiled_mma_o, acc_O, ops.tOrVt, ops.tOrPt, zero_init=False, wait=-1)

        # ------------------------------------------------------------------ store
        @cute.jit
        def store(self, acc_O, row_max, row_sum, o_ptr, stats_ptr, mO, mLSE, tiled_mma,
                  tidx, scale_log2, v_scale, split, tile):  # role: store
            """Merge the key groups' partials row by row, normalize (FP8: and scale by
            v_descale), write O and LSE. Swapped (`compute_t`, one key group): O^T lands
            transposed as O, the rows' max once and each warp's row sums (its threads'
            partial sums added over the lanes), which the merge adds up. wgmma
            (`compute_w`): one key group, its O the P V wgmma's accumulator."""
            hk, q_start, row0, rows, group = tile.hk, tile.q_start, tile.row0, tile.rows, tile.group
            M, D, wn = self.M, self.D, self.wn
            # the row sums' groups: the key groups, or (swapped) the warps
            n_sum = 4 if const_expr(self.swap) else wn
            # the slots are free (the caller waited for every copy and the CTA)
            sO = cute.make_tensor(o_ptr, cute.make_ordered_layout((M, D, wn), order=(1, 0, 2)))
            sMax = cute.make_tensor(stats_ptr, cute.make_layout((M, wn)))
            sSum = cute.make_tensor(stats_ptr + M * wn, cute.make_layout((M, n_sum)))
            if const_expr(self.swap):
                warp_i = cute.arch.make_warp_uniform(tidx // 32)
                thr_o = tiled_mma.get_slice(tidx)
                # (d, row) of every O^T element; a column is a tile row
                tOcO = acc_rows_cols(thr_o.partition_C(cute.make_identity_tensor((D, M))))
                for c in cutlass.range_constexpr(cute.size(row_sum)):
                    total = self.keys_reduce(row_sum[c], lambda a, b: a + b)
                    if tidx % 32 < 4:
                        sSum[tOcO[0, c][1], warp_i] = total
                # the column maxima: each lane its own column's (every warp holds them all)
                if warp_i == 0:
                    n_cols = cute.size(row_sum)
                    sMax[own([tOcO[0, c][1] for c in range(n_cols)], tidx % 32), 0] = \
                        row_max[0]
                # O^T into O's rows: the (D, rows) view of sO
                tOsO = thr_o.partition_C(cute.make_tensor(
                    o_ptr, cute.make_layout((D, M), stride=(1, D))))
            else:
                kg = tidx // (32 * self.wm)
                thr_mma = tiled_mma.get_slice(tidx % (32 * self.wm))
                # (row, col) of this thread's accumulator elements: a row's 4 lanes (a
                # quad) hold its columns, mma.sync or wgmma alike
                if const_expr(self.wg):
                    tScS = acc_rows_cols(thr_mma.partition_C(cute.make_identity_tensor((M, D))))
                else:
                    tScS = rows_cols(thr_mma.partition_C(
                        cute.make_identity_tensor((M, self.BNg))))
                for r in cutlass.range_constexpr(cute.size(row_sum)):
                    total = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
                    if tScS[0, 0][1] == 0:
                        sMax[tScS[r, 0][0], kg] = row_max[r]
                        sSum[tScS[r, 0][0], kg] = total
                tOsO = thr_mma.partition_C(sO[None, None, kg])
            for i in cutlass.range_constexpr(cute.size(acc_O)):
                tOsO[i] = acc_O[i]
            cute.arch.barrier()

            # each thread: 8-element chunks (row, c) of the tile
            vec = 8
            chunks = D // vec
            for it in cutlass.range_constexpr((M * chunks + self.num_threads - 1)
                                              // self.num_threads):
                idx = tidx + it * self.num_threads
                r = idx // chunks
                c = idx - r * chunks
                rg = row0 + r
                if idx < M * chunks and rg < rows:
                    mx = sMax[r, 0]
                    for g in cutlass.range_constexpr(1, wn):
                        mx = cutlass.max(mx, sMax[r, g])
                    mx_safe = 0.0 if mx == -Float32.inf else mx
                    total = Float32(0.0)
                    acc = cute.make_rmem_tensor((vec,), Float32)
                    acc.fill(0.0)
                    if const_expr(self.swap):
                        # one key group: O and the max are whole, the warps' sums add up
                        for g in cutlass.range_constexpr(n_sum):
                            total += sSum[r, g]
                        acc.store(cute.local_tile(sO[r, None, 0], (vec,), (c,)).load())
                    else:
                        for g in cutlass.range_constexpr(wn):
                            w = cute.math.exp2((sMax[r, g] - mx_safe) * scale_log2,
                                               fastmath=True)
                            total += sSum[r, g] * w
                            part = cute.local_tile(sO[r, None, g], (vec,), (c,))
                            acc.store(acc.load() + part.load() * w)
                    empty = total == 0.0
                    inv = 0.0 if empty else 1.0 / total
                    if const_expr(self.fp8):
                        inv = inv * v_scale
                    i = rg // group
                    h = hk * group + (rg - i * group)
                    if const_expr(self.split):
                        row_o, row_lse = mO[split, q_start + i, h, None], mLSE[split, h, None]
                    else:
                        row_o, row_lse = mO[q_start + i, h, None], mLSE[h, None]
                    dst = cute.local_tile(row_o, (vec,), (c,))
                    dst.store((acc.load() * inv).to(self.out_dtype))
                    if c == 0:
                        row_lse[q_start + i] = -Float32.inf if empty else (
                            mx_safe * scale_log2 + cute.math.log2(total, fastmath=True)) * LN_2

    return DecodeHopper


# --------------------------------------------------------------------------------------
# Host: compile once per configuration, then launch
# --------------------------------------------------------------------------------------

def _fake_args(q_dtype, kv_dtype, head_dim: int, paged: bool, packed: bool, split: bool,
               ordered: bool = False):
    """Symbolic tensors: one compiled kernel serves every shape of its configuration."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    def i64(div=1):
        return cute.sym_int64(divisibility=div)

    fp8 = kv_dtype.width == 8
    nq, h, hkv, b = (cute.sym_int32() for _ in range(4))
    q = make_fake_tensor(q_dtype, (nq, h, head_dim), stride=(i64(8), i64(8), 1),
                         assumed_align=8 if q_dtype.width == 8 else 16)
    npg, psz = cute.sym_int32(), cute.sym_int32()
    kv_div = 128 // kv_dtype.width      # 16-byte aligned rows

    def cache():
        return make_fake_tensor(kv_dtype, (npg, psz, hkv, head_dim),
                                stride=(i64(kv_div), i64(kv_div), i64(kv_div), 1),
                                assumed_align=16)

    k, v = cache(), cache()
    seqk = make_fake_tensor(cutlass.Int32, (b,), stride=(1,), assumed_align=4)
    pt = make_fake_tensor(cutlass.Int32, (cute.sym_int32(), cute.sym_int32()),
                          stride=(i64(), 1), assumed_align=4) if paged else None
    cu_q = make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), stride=(1,),
                            assumed_align=4) if packed else None
    order = make_fake_tensor(cutlass.Int32, (b,), stride=(1,), assumed_align=4) \
        if ordered else None
    if split:   # o_part [S, Nq, H, D] fp32, lse_part [S, H, Nq]
        ns = cute.sym_int32()
        o = make_fake_tensor(cutlass.Float32, (ns, nq, h, head_dim),
                             stride=(i64(8), i64(8), i64(8), 1), assumed_align=16)
        lse = make_fake_tensor(cutlass.Float32, (ns, h, nq), stride=(i64(), i64(), 1),
                               assumed_align=4)
    else:       # out [Nq, H, D] in q's dtype (bf16 for fp8), lse [H, Nq]
        o = make_fake_tensor(cutlass.BFloat16 if fp8 else q_dtype, (nq, h, head_dim),
                             stride=(i64(8), i64(8), 1), assumed_align=16)
        lse = make_fake_tensor(cutlass.Float32, (h, nq), stride=(i64(), 1), assumed_align=4)
    # descales: fp32 [B, H_kv] (contiguous: the core checks), fp8 calls only
    descales = tuple(make_fake_tensor(cutlass.Float32, (b, hkv), stride=(i64(), 1),
                                      assumed_align=4) if fp8 else None for _ in range(3))
    return (q, k, v, seqk, pt, cu_q, order, o, lse) + descales


def compile_decode(dtype, head_dim: int, cfg: Config, causal: bool, paged: bool,
                   packed: bool, split: bool, options: str = "", kv_dtype=None,
                   ordered: bool = False):
    """Compile (no GPU needed with CUTE_DSL_ARCH=sm_90a) and return the callable:
    fn(q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, order, o, lse,
       q_descale, k_descale, v_descale, scale_log2, len_q, group, page_size, num_splits);
    o, lse: out [Nq, H, D], lse [H, Nq], or (split) o_part [S, Nq, H, D], lse_part
    [S, H, Nq]. dtype: q's; kv_dtype: the cache's (default q's); the descales only (and
    always) when the cache is fp8; order int32 [B] only (and always) when ordered."""
    import cutlass
    import cutlass.cute as cute

    def cute_dt(t):
        return _cute_dtype(t) if isinstance(t, torch.dtype) else t

    q_dt = cute_dt(dtype)
    kv_dt = q_dt if kv_dtype is None else cute_dt(kv_dtype)
    kern = _kernel_class()(q_dt, kv_dt, head_dim, cfg, causal, paged, packed, split, ordered)
    args = _fake_args(q_dt, kv_dt, head_dim, paged, packed, split, ordered)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    opts = ("--enable-tvm-ffi " + options).strip()
    return cute.compile(kern, *args, cutlass.Float32(1.0), cutlass.Int32(1),
                        cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), stream,
                        options=opts)


def _build(q_dtype, kv_dtype, head_dim, tile, causal, paged, packed, split, ordered):
    """The kernel of a key (q dtype, cache dtype, head_dim, block_m or a Config, causal,
    paged, packed, split, ordered), compiled once through `host.compiled`."""
    cfg = tile if isinstance(tile, Config) else \
        (FP8_CONFIGS if kv_dtype == FP8 else CONFIGS)[(head_dim, tile)]
    return compile_decode(q_dtype, head_dim, cfg, causal, paged, packed, split,
                          kv_dtype=kv_dtype, ordered=ordered)


def forward(q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, out, lse,
            o_part, lse_part, *, len_q: int, causal: bool, scale: float,
            num_splits: int, descale=None, order=None,
            config: Optional[Config] = None) -> None:
    """See the module docstring and the core's `kvcache_attention`. q [Nq, H, D];
    num_splits == 1 writes out / lse, else o_part [S, Nq, H, D] / lse_part [S, H, Nq].
    descale: (q_descale, k_descale, v_descale) fp32 [B, H_kv] for an fp8 cache (None:
    all ones), else None. order: None (sequence b's CTAs b-th), or int32 [B], a
    permutation: sequence order[p]'s CTAs p-th. config: in place of the table's (a
    sweep's)."""
    Nq, H, D = q.shape
    group = H // k_cache.shape[2]
    if Nq == 0 or cache_seqlens.shape[0] == 0 or len_q == 0:
        return
    split = num_splits > 1
    fp8 = k_cache.dtype == FP8
    if fp8 and descale is None:
        ones = torch.ones(cache_seqlens.shape[0], k_cache.shape[2], device=q.device,
                          dtype=torch.float32)
        descale = (ones, ones, ones)
    if not fp8 and descale is not None:
        raise ValueError("descale is only for a float8_e4m3fn cache")
    key = (q.dtype, k_cache.dtype, D, tile_rows(group * len_q) if config is None else config,
           bool(causal), page_table is not None, cu_seqlens_q is not None, split,
           order is not None)
    fn = host.compiled(_COMPILED, _build, *key)
    if split:
        out, lse = o_part, lse_part
    fn(q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, order, out, lse,
       *(descale or (None, None, None)), scale * LOG2_E, len_q, group, k_cache.shape[1],
       num_splits)
