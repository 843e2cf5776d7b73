"""KV-cache attention (decode) for Hopper (sm_90a) in Triton: split-KV partials, paged
caches of any page size or a contiguous cache, pack-GQA, small query counts. No TLX op
is needed: Triton's pipeliner issues the asynchronous copies (cp.async, TMA) that keep
this memory-bound loop fed, and the same code runs in the interpreter (the tests).

One program handles one (sequence b, kv head, split s, row block): the tile's rows are
the GROUP query heads of that kv head times the sequence's query rows, row-major (row
r -> query row r // GROUP, head h_kv * GROUP + r % GROUP, so a query row's heads are
adjacent in memory), so every K/V byte is read once per kv head and row block. The M
tile is the smallest of 16 / 32 / 64 / 128 rows that holds GROUP * len_q; rows past
GROUP * n_q(b) are padding, masked on load and store.

The grid's batch coordinate p is sequence b = order[p] when the core passes a launch
order (its sequences longest first: the programs issued last then are short ones), else
b = p.

Split s of sequence b covers key blocks [s * bps, (s + 1) * bps), bps =
cdiv(cdiv(n_k(b), BLOCK_N), num_splits); a split that sees no key writes o = 0 and
lse = -inf. The core's `combine` merges the splits.

Roles:
    load     K and V blocks of BLOCK_N keys. Gathered (`_load_kv_rows`): per-row offsets
             through the page table (row j -> page_table[b, j // PAGE_SIZE], slot
             j % PAGE_SIZE; a contiguous cache is one page per sequence), masked past
             the range. Bulk (`_load_kv_box`): TMA boxes [BLOCK_N, D] of a 2-D view
             [rows, H_kv * D], used when a block never crosses a page (contiguous
             cache, or PAGE_SIZE % BLOCK_N == 0) and lies below n_k (the box reads no
             row past the sequence, which may hold anything).
    compute  S = Q K^T, online softmax in the log2 domain, O += P V (fp32); e4m3 K
             and V converted to f16 first. fp8 caches at 16 and 32 rows swap the
             products (`_attend_t`, Config.swap): S^T = K Q^T and O^T += V^T P^T with the
             block's keys and the head dim as the wgmma's M and the tile's rows as its N,
             so no row is padded to 64 and an e4m3 q meets e4m3 K in an fp8 wgmma.
    store    O / l and lse (natural log) of the tile's real rows, into out / lse
             (one split) or the split's slice of o_part / lse_part.

The pipeline: the KV loop is peeled into a bulk of blocks every tile row sees whole
(no mask; `tl.range(num_stages=STAGES)`: Triton's software pipeliner issues the loads of
later blocks while one is computed, into K and V rings 3 to 5 deep (CONFIGS):
cp.async for gathered rows and for the page-table entries their addresses depend on,
TMA with mbarriers for boxes) and a masked tail (the sequence end, the
causal diagonal: at most a few blocks, gathered with zero fill).

fp8 (FP8, an e4m3 cache with an e4m3 or bf16 q): K and V travel in e4m3, half the
bytes (TMA boxes of D bytes a row, 64 or 128, or gathered rows), and are converted to
f16 in registers, exactly (every e4m3 value is an f16 value) and in one cvt a pair (a
bf16 target takes an f16 -> f32 -> bf16 chain: 264 quarter-rate F2F a warp in each
128-key block of the 16-row bulk loop). A bf16 q is scaled by a power of two into f16's
range once at load (`_to_f16`). The MMAs are f16, except S (S^T swapped) with an e4m3
q: e4m3 x e4m3 in a wgmma, K read from its ring as loaded (every fp8 tile is a wgmma
one: Hopper's mma.sync has no native e4m3 form). Its accumulation keeps fewer bits than
fp32 (lse within 3.8e-3 of float64 on an H100, against 1e-4 with f16 products), far
below what e4m3 costs q itself. K is converted in the dot's operand
layout (its contraction, D, is contiguous); V's contraction runs over keys, D bytes
apart, so V is converted in its load layout and reaches P V through shared memory as an
f16 tile (`_v_f16`). The descales are fp32 [B, H_kv]: the
program multiplies its qk scale by q_descale * k_descale and its accumulator by
v_descale before the store (partials too: the combine is linear). Out is bf16.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from jagged.portable import INTERPRET, mma
from jagged.seqinfo import causal_kv_end, causal_visible

from jagged.launch import cdiv, fast, tma_desc

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)
ROW_TILES = (16, 32, 64, 128)  # M tiles: tl.dot needs M >= 16


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class Config:
    block_n: int      # keys per K/V block
    num_stages: int   # the bulk loop's num_stages (the ring depth it gives: CONFIGS)
    num_warps: int
    swap: bool = False  # with an e4m3 q, keys as the MMAs' M (`_attend_t`)
    q8_stages: int = 0  # num_stages with an e4m3 q over an e4m3 cache (0: the same): its
                        # S wgmma reads K from the ring, one stage more

    def stages(self, q8: bool) -> int:
        return self.q8_stages if q8 and self.q8_stages else self.num_stages


# Keyed by (head_dim, rows per tile, kind, cache element bytes): kind "gather" (pages
# smaller than a block, or not a whole number of blocks), "page" (PAGE_SIZE % block_n
# == 0: TMA boxes inside a page), "contig" (contiguous cache: TMA boxes); 2-byte caches
# (bf16, fp16) and 1-byte ones (fp8 e4m3). The K and V ring depth Triton's pipeliner
# builds from num_stages depends on the load chain (a page-table load ahead of K / V
# takes stages) and on the MMA (wgmma at 64+ rows is asynchronous), so each entry
# states the depth it gets (TTGIR) and what fits an SM (228 KB of shared memory, 64 K
# registers). 2-byte caches:
#   16, 32 rows (mma.sync): blocks of 32 KB (K + V), rings of 3; 103-111 KB, two
#     programs an SM.
#   64 rows (wgmma, one warpgroup): blocks of 16 KB, rings of 5; 89-98 KB, two
#     programs an SM (32 KB blocks in rings of 4 took 138-146 KB: one; 8 warps went
#     past 128 registers: one).
#   128 rows: over 128 registers at 8 warps (D = 128), one program an SM: blocks of
#     32 KB, rings of 4 (146-162 KB).
#   1-byte caches: K and V blocks are converted to f16 in registers, which takes
#     registers a 2-byte block does not: blocks of 32 KB where they fit (16 rows; 128
#     rows, one program an SM), else 16 KB blocks in deeper rings (32 rows at 4 warps:
#     8 warps went past 128 registers; 64 rows at D = 128). The resources of each
#     entry: FP8_CONFIGS.
def _table() -> dict:  # role: host
    t = {}
    for d in (64, 128):
        big = 16384 // (d * 2)  # keys of a 32 KB block of K + V
        for m in ROW_TILES:
            if m == 64:
                gather, contig = Config(big // 2, 9, 4), Config(big // 2, 5, 4)
            else:
                warps = 4 if m == 16 else 8
                gather, contig = Config(big, 7, warps), Config(big, 4, warps)
            t[(d, m, "gather", 2)] = t[(d, m, "page", 2)] = gather
            t[(d, m, "contig", 2)] = contig
    for (d, m), cfgs in FP8_CONFIGS.items():
        for kind, cfg in zip(("gather", "page", "contig"), cfgs):
            t[(d, m, kind, 1)] = cfg
    return t


# fp8 caches, (head_dim, rows per tile): (gather, page, contig). Ring depths, shared
# memory and registers over e4m3 and bf16 q, split or not (sm_90a):
#   16 / 32 rows (V's f16 copy, [BLOCK_N, D], beside the rings: `_v_f16`): with an e4m3
#   q swapped where Config.swap (`_attend_t`), its S wgmma reading K from the ring, a
#   stage deeper than V's at the same num_stages (q8_stages keeps two programs an SM
#   where it would not); a bf16 q unswapped. Depths e4m3 q K / V (bf16 q both):
#   16 rows: D 128: 2 (2), 2 / 1 (2), 2 / 1 (2); 87-106 KB; 138-164. D 64: 8 / 7 (7),
#     5 / 4 (4), 6 / 5 (5); 71-110 KB; 80-124.
#   32 rows: D 128: 5 / 4 (4), 4 / 3 (3), 5 / 4 (5); 77-109 KB; 151-168 (the unsplit
#     bf16-q page build spills 2 instructions outside the loop). D 64: 6 / 5 (5), 5 / 4
#     (4), 9 / 8 (8); 49-83 KB; 124-141.
#   The bulk step at D 128, e4m3 q, one warp (SASS): 16 rows (128 keys) 401 instructions
#   swapped against 557 (F2F 72 / 136; HMMA 64 -> 16 HGMMA + 8 e4m3 QGMMA), 32 rows (64
#   keys) 385 / 589.
#   64 rows: D 128: 3; 97-98 KB; 166-184. D 64: 4; 105-107 KB; 165-200.
#   128 rows: D 128: 3; 193-195 KB; 202-210. D 64: 3; 97-99 KB; 168-186.
#   (64 / 128 rows with an e4m3 q: K's ring a stage deeper, no f16 K: 81-161 KB.)
#   ptxas caps some builds at 128 registers and spills there: deeper rings of 64-key
#   blocks at D 64 did in one of the four builds of an entry (e4m3 or bf16 q, split or
#   not), 128-key blocks at 16 rows / D 64 in gathers.
FP8_CONFIGS = {
    (128, 16): (Config(128, 6, 4), Config(128, 6, 4, True, 4), Config(128, 3, 4, True, 2)),
    (64, 16): (Config(64, 16, 4, True), Config(128, 10, 4, True), Config(128, 6, 4, True)),
    (128, 32): (Config(64, 9, 4, True), Config(64, 8, 4, True), Config(64, 6, 4, True, 5)),
    (64, 32): (Config(64, 11, 4, True), Config(64, 9, 4, True), Config(64, 9, 4, True)),
    (128, 64): (Config(64, 8, 4), Config(64, 8, 4), Config(64, 4, 4)),
    (64, 64): (Config(128, 9, 4), Config(128, 9, 4), Config(128, 5, 4)),
    (128, 128): (Config(128, 7, 8), Config(128, 7, 8), Config(128, 4, 8)),
    (64, 128): (Config(128, 7, 8), Config(128, 7, 8), Config(128, 4, 8)),
}
CONFIGS = _table()


def programs_per_sm(head_dim: int, rows: int, fp8: bool) -> int:  # role: host
    """How many programs an SM runs at once, for the core's split count (one wave):
    tiles of `rows` packed rows over a 16-bit or an fp8 cache. 16-bit: one, each
    streaming its keys through a deep ring at the copy bandwidth (H200 B8 32k, 2
    splits: 4.05-4.22 TB/s). fp8 up to 64 rows: two (105 KB, <= 203 registers each),
    since the conversion, not memory, bounds one program (B8 32k pages of 1, kernel
    alone: 1 an SM 220 us, 2 an SM 180 us; 16 query rows x GQA 4 339 / 251 us).
    128-row fp8 tiles take 193 KB: one."""
    return 2 if fp8 and rows <= 64 else 1


def rows_per_tile(group: int, len_q: int) -> int:  # role: host
    """The M tile: the smallest of ROW_TILES holding group * len_q rows, else the largest."""
    rows = group * max(len_q, 1)
    for m in ROW_TILES:
        if rows <= m:
            return m
    return ROW_TILES[-1]


def cache_kind(page_table, page_size: int, block_n: int) -> str:  # role: host
    """"contig", "page" (a block of block_n keys is whole inside one page) or "gather"."""
    if page_table is None:
        return "contig"
    return "page" if page_size % block_n == 0 else "gather"


def pick_config(head_dim: int, block_m: int, page_table, page_size: int,
                elsize: int = 2) -> tuple[Config, str]:
    """The default config of a call and its cache kind (elsize: the cache's element bytes)."""
    cfg = CONFIGS[(head_dim, block_m, "page" if page_table is not None else "contig", elsize)]
    kind = cache_kind(page_table, page_size, cfg.block_n)
    return (cfg if kind != "gather" else CONFIGS[(head_dim, block_m, "gather", elsize)]), kind


# ----------------------------------------------------------------------------- roles
@triton.jit
def _to_f16(q):  # role: compute
    """(q / 2^e in f16, 2^e), the tile's largest magnitude scaled into (2^14, 2^15]: the
    fp8 build computes in f16, and a bf16 q may lie beyond f16's range or below its
    normal one. A power of two is exact; an e4m3 q stays exact."""
    qf = q.to(tl.float32)
    amax = tl.max(tl.max(tl.abs(qf), 1), 0)
    pow2 = tl.where(amax > 0.0, tl.math.exp2(tl.math.ceil(tl.math.log2(amax)) - 15.0), 1.0)
    return (qf / pow2).to(tl.float16), pow2


@triton.jit
def _sequence(order, p, ORDERED: tl.constexpr):  # role: schedule
    """The sequence of batch coordinate p: order[p] (the launch order), or p."""
    if ORDERED:
        return tl.load(order + p)
    return p


@triton.jit
def _query_rows(cu_seqlens_q, b, len_q, DENSE_Q: tl.constexpr):  # role: schedule
    """(first row in q, row count n_q) of sequence b: dense, len_q rows a sequence."""
    if DENSE_Q:
        return b * len_q, len_q
    start = tl.load(cu_seqlens_q + b)
    return start, tl.load(cu_seqlens_q + b + 1) - start


@triton.jit
def _key_range(n_q, n_k, split, num_splits, m0, GROUP: tl.constexpr,  # role: schedule
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(lo, bulk_end, n_end): the keys [lo, n_end) of this split that the tile's rows
    (m0 ..) see, and the whole blocks [lo, bulk_end) that every real row sees (no mask).
    Split s holds blocks [s * bps, (s + 1) * bps), bps = cdiv(cdiv(n_k, BLOCK_N),
    num_splits); empty (n_end <= lo) past the keys and for a row block past the
    sequence's rows."""
    bps = tl.cdiv(tl.cdiv(n_k, BLOCK_N), num_splits)
    lo = split * bps * BLOCK_N
    n_end = tl.minimum(lo + bps * BLOCK_N, n_k)
    n_full = n_k
    if CAUSAL:  # bottom-right: the tile's last real row sees most, its first least
        last = tl.minimum(m0 + BLOCK_M, GROUP * n_q) - 1
        n_end = tl.minimum(n_end, causal_kv_end(last // GROUP + 1, n_q, n_k))
        n_full = causal_kv_end(m0 // GROUP + 1, n_q, n_k)
    n_end = tl.where(m0 < GROUP * n_q, n_end, lo)
    bulk_end = lo + tl.maximum(tl.minimum(n_end, n_full) - lo, 0) // BLOCK_N * BLOCK_N
    return lo, bulk_end, n_end


@triton.jit
def _kv_where(pt_row, n0, b, n_end, stride_kp, stride_ks, L_max,  # role: load
              BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
              TMA: tl.constexpr):
    """Where the block of keys n0 .. lives: TMA, the box's first row in the 2-D view
    [rows, H_kv * D] (the block lies inside one page / sequence); else the element
    offsets (int64) [BLOCK_N] of its rows. Page-table entries of keys >= n_end are not
    read (page 0 stands in; those rows' loads are masked or never issued)."""
    if TMA:
        if PAGED:
            page = tl.load(pt_row + n0 // PAGE_SIZE, mask=n0 < n_end, other=0)
            return page * PAGE_SIZE + n0 % PAGE_SIZE
        else:
            return b * L_max + n0
    else:
        j = n0 + tl.arange(0, BLOCK_N)
        if PAGED:
            page = tl.load(pt_row + j // PAGE_SIZE, mask=j < n_end, other=0)
            return page.to(tl.int64) * stride_kp + (j % PAGE_SIZE).to(tl.int64) * stride_ks
        else:
            return b.to(tl.int64) * stride_kp + j.to(tl.int64) * stride_ks


@triton.jit
def _load_kv_rows(k_head, v_head, rows, n0, n_end,  # role: load
                  D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """Gathered K and V blocks [BLOCK_N, D]: rows (element offsets) of keys n0 ..;
    MASKED: keys >= n_end are 0."""
    off = rows[:, None] + tl.arange(0, D)[None, :]
    if MASKED:
        keep = (n0 + tl.arange(0, BLOCK_N) < n_end)[:, None]
        k = tl.load(k_head + off, mask=keep, other=0.0)
        v = tl.load(v_head + off, mask=keep, other=0.0)
    else:
        k = tl.load(k_head + off)
        v = tl.load(v_head + off)
    return k, v


@triton.jit
def _load_kv_box(k_desc, v_desc, row, col):  # role: load
    """K and V blocks [BLOCK_N, D] as TMA boxes at (row, col) of [rows, H_kv * D]."""
    return k_desc.load([row, col]), v_desc.load([row, col])


@triton.jit
def _v_f16(v):  # role: compute
    """e4m3 V -> f16, exact, four a 32-bit register (two cvt.rn.f16x2.e4m3x2), in
    the layout V loads in (rows contiguous: LDS.128). The asm is not pure, so Triton's
    layout passes do not move the conversion into P V's operand layout (RemoveLayout-
    Conversions would, through a pure op, and V would then load from shared memory as
    bytes, LDS.U8, paired across rows D bytes apart); the f16 tile instead reaches the
    MMA operand through shared memory (STS.128, ldmatrix: V's f16 copy, BLOCK_N * D * 2
    bytes). Unswapped (`_attend`, mma.sync) a 16-row bulk step of 128 keys at D 128
    issues 564 instructions a warp against 799 with the byte loads."""
    if INTERPRET:
        return v.to(tl.float16)
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; "
        "cvt.rn.f16x2.e4m3x2 $1, hi; }", "=r,=r,r", [v], dtype=tl.float16, is_pure=False,
        pack=4)


@triton.jit
def _masked_max(s, m_i, qi, n0, n_q, n_k, n_end, BLOCK_N: tl.constexpr,  # role: compute
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, KEYS: tl.constexpr):
    """(s, m_new, m_use) of a block's scores s with the keys along axis KEYS: MASKED, keys
    >= n_end and (causal) keys past a row's diagonal at -inf; the rows' running max m_new
    and the max to subtract, m_use (0 where a row has seen no key: no NaN)."""
    if MASKED:
        j = n0 + tl.arange(0, BLOCK_N)
        if KEYS == 1:  # (indexing, not tl.expand_dims: with it the bf16 bulk step took
            # 9 more instructions, sm_90a)
            keep = (j < n_end)[None, :]
            if CAUSAL:
                keep = keep & causal_visible(qi[:, None], j[None, :], n_q, n_k)
        else:
            keep = (j < n_end)[:, None]
            if CAUSAL:
                keep = keep & causal_visible(qi[None, :], j[:, None], n_q, n_k)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, KEYS))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(s, KEYS))
        m_use = m_new
    return s, m_new, m_use


@triton.jit
def _attend(q, k, v, acc, m_i, l_i, qk_scale, qi, n0, n_q, n_k, n_end,  # role: compute
            BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """One K/V block: S = Q K^T, online softmax (log2 domain), O += P V. MASKED: keys
    >= n_end and (causal) keys past a row's diagonal get P = 0, and rows that have seen
    no key keep m = -inf without NaN. K and V in q's dtype or fp8 (V converted to f16,
    and K to q's dtype, f16, unless q is e4m3 too: e4m3 values are f16 values; the
    descales live in qk_scale and the store)."""
    if v.dtype == tl.float8e4nv:
        v = _v_f16(v)
    else:
        v = v.to(q.dtype)
    if q.dtype != k.dtype:
        k = k.to(q.dtype)
    s = mma(q, tl.trans(k)) * qk_scale
    s, m_new, m_use = _masked_max(s, m_i, qi, n0, n_q, n_k, n_end, BLOCK_N, MASKED, CAUSAL, 1)
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + mma(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _attend_t(q, k, v, acc, m_i, l_i, qk_scale, qi, n0, n_q, n_k, n_end,  # role: compute
              BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """`_attend` for an e4m3 q over an e4m3 cache with the block's keys as the MMAs' M
    (wgmma at 16 and 32 rows, no row padding to 64): S^T = K Q^T ([BLOCK_N, M]; e4m3 K
    and q straight into an fp8 wgmma, both K-major), the softmax down the columns, O^T
    += V^T P^T ([D, M]; V in f16, P^T through shared memory). acc is O^T; m_i per column
    (tile row); l_i [BLOCK_N, M]: each thread's own partial row sums, added up once
    after the loop (no cross-warp sum a block)."""
    v = _v_f16(v)
    st = mma(k, tl.trans(q)) * qk_scale
    st, m_new, m_use = _masked_max(st, m_i, qi, n0, n_q, n_k, n_end, BLOCK_N, MASKED, CAUSAL,
                                   0)
    pt = tl.math.exp2(st - m_use[None, :])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha[None, :] + pt
    acc = acc * alpha[None, :] + mma(tl.trans(v), pt.to(v.dtype))
    return acc, m_new, l_i


@triton.jit
def _block(q, k, v, acc, m_i, l_i, qk_scale, qi, n0, n_q, n_k, n_end,  # role: compute
           BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
           SWAP: tl.constexpr):
    """One K/V block: `_attend_t` (SWAP) or `_attend`."""
    if SWAP:
        acc, m_i, l_i = _attend_t(q, k, v, acc, m_i, l_i, qk_scale, qi, n0, n_q, n_k, n_end,
                                  BLOCK_N, MASKED, CAUSAL)
    else:
        acc, m_i, l_i = _attend(q, k, v, acc, m_i, l_i, qk_scale, qi, n0, n_q, n_k, n_end,
                                BLOCK_N, MASKED, CAUSAL)
    return acc, m_i, l_i


@triton.jit
def _store(o_row, lse_row, acc, m_i, l_i, d, real):  # role: store
    """O / l and lse = ln 2 * (m + log2 l) of the real rows; a row that saw no key
    (l = 0) gets O = 0 and lse = -inf."""
    seen = l_i > 0.0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * LN2, float("-inf"))
    tl.store(o_row[:, None] + d[None, :], o.to(o_row.dtype.element_ty), mask=real[:, None])
    tl.store(lse_row, lse, mask=real)


# ----------------------------------------------------------------------------- kernel
@triton.jit
def decode_kernel(q, k_cache, v_cache, k_desc, v_desc, cache_seqlens, page_table, cu_seqlens_q,
                  order, o, lse, q_descale, k_descale, v_descale, Nq, H_kv, max_pages, len_q,
                  L_max, num_splits, qk_scale,
                  GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr,
                  TMA: tl.constexpr, DENSE_Q: tl.constexpr, CAUSAL: tl.constexpr,
                  SPLIT: tl.constexpr, STAGES: tl.constexpr, FP8: tl.constexpr,
                  ORDERED: tl.constexpr, SWAP: tl.constexpr = False):
    """Grid (num_splits * row blocks, H_kv, B), row blocks fastest. Every tensor is
    contiguous: strides derive from the shapes (D a constexpr, so the compiler sees
    whole 16-byte rows). L_max: rows of a page (paged) or of a sequence (contiguous).
    FP8: the cache (and maybe q) in e4m3, computed in f16 (S of an e4m3 q in e4m3), the
    descales fp32 [B, H_kv] (read only then). ORDERED: the batch coordinate indexes
    `order` int32 [B] (the launch order), else it is the sequence. SWAP: `_attend_t`."""
    H = H_kv * GROUP
    stride_qn = H * D                       # q, out [Nq, H, D]; o_part [S, Nq, H, D]
    stride_ks = H_kv * D                    # a key row of the cache
    stride_kp = L_max * stride_ks           # a page (a sequence) of the cache
    stride_os = tl.cast(Nq, tl.int64) * stride_qn if SPLIT else 0  # Nq may be a constant 1
    stride_ls = H * Nq if SPLIT else 0      # lse [H, Nq]; lse_part [S, H, Nq]
    # a split's row blocks are neighbours in launch order: they run together and share
    # their K / V reads through L2
    row_blocks = tl.cdiv(GROUP * len_q, BLOCK_M)
    split = tl.program_id(0) // row_blocks
    m0 = tl.program_id(0) % row_blocks * BLOCK_M
    h_kv = tl.program_id(1)
    b = _sequence(order, tl.program_id(2), ORDERED)
    q_start, n_q = _query_rows(cu_seqlens_q, b, len_q, DENSE_Q)
    n_k = tl.load(cache_seqlens + b)

    # tile rows: query row qi, head h; real rows are those of the sequence
    r = m0 + tl.arange(0, BLOCK_M)
    qi = r // GROUP
    h = h_kv * GROUP + r % GROUP
    real = qi < n_q
    d = tl.arange(0, D)
    q_rows = q + (q_start + qi).to(tl.int64) * stride_qn + h * D
    q_tile = tl.load(q_rows[:, None] + d[None, :], mask=real[:, None], other=0.0)
    if FP8:  # the tile's scales: one (sequence, kv head)
        at = b * H_kv + h_kv
        # an e4m3 q stays e4m3 where S is a wgmma (64+ rows, or swapped): e4m3 K meets it
        if not ((SWAP or BLOCK_M >= 64) and q_tile.dtype == tl.float8e4nv):
            q_tile, q_pow = _to_f16(q_tile)
            qk_scale = qk_scale * q_pow
        qk_scale = qk_scale * tl.load(q_descale + at) * tl.load(k_descale + at)

    lo, bulk_end, n_end = _key_range(n_q, n_k, split, num_splits, m0, GROUP, BLOCK_M,
                                     BLOCK_N, CAUSAL)

    pt_row = page_table + b.to(tl.int64) * max_pages
    k_head = k_cache + h_kv * D
    v_head = v_cache + h_kv * D
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    if SWAP:
        l_i = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        acc = tl.zeros([D, BLOCK_M], tl.float32)
    else:
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
    # bulk: whole blocks every real row sees, software-pipelined (Config: the stages)
    for n0 in tl.range(lo, bulk_end, BLOCK_N, num_stages=STAGES):
        cur = _kv_where(pt_row, n0, b, bulk_end, stride_kp, stride_ks, L_max,
                        BLOCK_N, PAGED, PAGE_SIZE, TMA)
        if TMA:
            k, v = _load_kv_box(k_desc, v_desc, cur, h_kv * D)
        else:
            k, v = _load_kv_rows(k_head, v_head, cur, n0, n_end, D, BLOCK_N, False)
        acc, m_i, l_i = _block(q_tile, k, v, acc, m_i, l_i, qk_scale, qi, n0, n_q, n_k,
                               n_end, BLOCK_N, False, CAUSAL, SWAP)
    # tail: the sequence end and the causal diagonal, gathered with zero fill
    for n0 in tl.range(bulk_end, n_end, BLOCK_N, num_stages=1):
        rows = _kv_where(pt_row, n0, b, n_end, stride_kp, stride_ks, L_max,
                         BLOCK_N, PAGED, PAGE_SIZE, False)
        k, v = _load_kv_rows(k_head, v_head, rows, n0, n_end, D, BLOCK_N, True)
        acc, m_i, l_i = _block(q_tile, k, v, acc, m_i, l_i, qk_scale, qi, n0, n_q, n_k,
                               n_end, BLOCK_N, True, CAUSAL, SWAP)

    if FP8:
        acc = acc * tl.load(v_descale + at)
    if SWAP:
        acc = tl.trans(acc)
        l_i = tl.sum(l_i, 0)
    o_rows = o + split * stride_os + (q_start + qi).to(tl.int64) * stride_qn + h * D
    lse_rows = lse + split * stride_ls + h * Nq + (q_start + qi)
    _store(o_rows, lse_rows, acc, m_i, l_i, d, real)


# ----------------------------------------------------------------------------- host
def kernel_args(cfg: Config, head_dim: int, group: int, block_m: int, page_size: int,
                kind: str, dense_q: bool, causal: bool, split: bool,
                paged: bool | None = None, fp8: bool = False, ordered: bool = False,
                q8: bool = False) -> dict:
    """The constexpr arguments of `decode_kernel` (shared with the compile checks);
    kind "gather" loads the bulk without TMA, also from a contiguous cache (paged False);
    q8: q in e4m3 too."""
    return dict(GROUP=group, D=head_dim, BLOCK_M=block_m, BLOCK_N=cfg.block_n,
                PAGE_SIZE=page_size, PAGED=kind != "contig" if paged is None else paged,
                TMA=kind != "gather", DENSE_Q=dense_q, CAUSAL=causal, SPLIT=split,
                STAGES=cfg.stages(q8), FP8=fp8, ORDERED=ordered, SWAP=cfg.swap and q8)


def signature(cfg: Config, head_dim: int, kind: str, dtype: str = "bf16",
              split: bool = True, q_dtype: str | None = None, ordered: bool = False) -> dict:
    """Triton types of `decode_kernel`'s runtime arguments (compile-only checks). dtype:
    the cache's ("bf16", "fp16", "fp8e4nv"); q_dtype: q's (None: the cache's); ordered:
    with a launch order."""
    fp8 = dtype == "fp8e4nv"
    q_dtype = q_dtype or dtype
    out = "fp32" if split else ("bf16" if fp8 else dtype)
    box = f"tensordesc<{dtype}[{cfg.block_n},{head_dim}]>" if kind != "gather" else "constexpr"
    sig = {"q": f"*{q_dtype}", "k_cache": f"*{dtype}", "v_cache": f"*{dtype}",
           "k_desc": box, "v_desc": box, "cache_seqlens": "*i32", "page_table": "*i32",
           "cu_seqlens_q": "*i32", "order": "*i32" if ordered else "constexpr",
           "o": f"*{out}", "lse": "*fp32"}
    for name in ("q_descale", "k_descale", "v_descale"):
        sig[name] = "*fp32" if fp8 else "constexpr"
    for name in ("Nq", "H_kv", "max_pages", "len_q", "L_max", "num_splits"):
        sig[name] = "i32"
    sig["qk_scale"] = "fp32"
    return sig


def _aligned(t: torch.Tensor) -> bool:  # role: host
    return t.data_ptr() % 16 == 0


def forward(q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, out, lse,
            o_part, lse_part, *, len_q: int, causal: bool, scale: float,
            num_splits: int, descale=None, order=None, config: Config | None = None) -> None:
    """Writes out / lse (num_splits == 1) or o_part / lse_part (num_splits > 1); the
    arguments as jagged.kvcache passes them (validated, contiguous, q 3-D [Nq, H, D]).
    descale: (q_descale, k_descale, v_descale) fp32 [B, H_kv] for an fp8 cache (out
    bf16), else None. order: None (sequence b's programs b-th), or int32 [B], a
    permutation: sequence order[p]'s programs p-th. config: instead of the table's
    default (its block_n decides the cache kind)."""
    Nq, H, D = q.shape
    B = cache_seqlens.shape[0]
    H_kv = k_cache.shape[2]
    group = H // H_kv
    if Nq == 0 or B == 0 or len_q == 0:
        return
    block_m = rows_per_tile(group, len_q)
    page_size = k_cache.shape[1] if page_table is not None else 1
    fp8 = descale is not None
    if fp8 != (k_cache.dtype == torch.float8_e4m3fn):
        raise ValueError(f"descale must be given exactly for a float8_e4m3fn cache (the "
                         f"core fills it), got {'a tuple' if fp8 else None} with a "
                         f"{k_cache.dtype} cache")
    elsize = k_cache.element_size()
    if config is None:
        cfg, kind = pick_config(D, block_m, page_table, page_size, elsize)
    else:
        cfg, kind = config, cache_kind(page_table, page_size, config.block_n)
    rows = k_cache.shape[0] * k_cache.shape[1]
    if kind != "gather" and not (rows and _aligned(k_cache) and _aligned(v_cache)):
        kind = "gather"  # TMA needs 16-byte aligned bases (and a cache with rows)
        if config is None:
            cfg = CONFIGS[(D, block_m, "gather", elsize)]
    if kind == "gather":
        k_desc = v_desc = None
    else:
        k_desc = tma_desc(k_cache, (rows, H_kv * D), (H_kv * D, 1), (cfg.block_n, D))
        v_desc = tma_desc(v_cache, (rows, H_kv * D), (H_kv * D, 1), (cfg.block_n, D))
    split = num_splits > 1
    o, l = (o_part, lse_part) if split else (out, lse)
    grid = (num_splits * cdiv(group * len_q, block_m), H_kv, B)
    pt = page_table if page_table is not None else cache_seqlens  # never read unpaged
    fast(decode_kernel)[grid](
        q, k_cache, v_cache, k_desc, v_desc, cache_seqlens, pt,
        cu_seqlens_q if cu_seqlens_q is not None else cache_seqlens, order, o, l,
        *(descale if fp8 else (None, None, None)),
        Nq, H_kv, pt.shape[-1], len_q, k_cache.shape[1], num_splits, scale * LOG2E,
        **kernel_args(cfg, D, group, block_m, page_size, kind, cu_seqlens_q is None, causal,
                      split, paged=page_table is not None, fp8=fp8,
                      ordered=order is not None, q8=q.dtype == torch.float8_e4m3fn),
        num_warps=cfg.num_warps, num_stages=1)
