"""Jagged (varlen, packed) flash-attention backward for Hopper (sm_90a), in CuteDSL.

    backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale,
             broadcast_q, dlse=None) -> (dq, dk, dv)          # in q's dtype

The CuteDSL twin of `kernels_tlx/bwd_hopper.py`: the same three kernels, the same roles
(load, compute, reduce_dq, store) and the same tile schedule (schedule.py). Both form
dQ over all BLOCK_N keys of a tile after a named barrier (dS^T in smem), one bulk
reduce per step. Where they differ: here dQ = dS K with the query rows as M, reduced by
a `reduce_dq` warp in 64 x 32 boxes; TLX forms dQ^T = K^T dS^T with the head dim as M
and its load task reduces 64 x 64 boxes.

(a) `Preprocess` (`_bwd_preprocess`): delta[h, i] = rowsum(dO * O) in fp32 ([H, Nq],
    lse's layout), and zeroes the fp32 dQ accumulator of the packed modes in the same pass.
(b) `BwdMain` (`_bwd_main`): a persistent grid (one CTA per SM) walking a jagged list of
    KV tiles, longest first. The tile list is built on the GPU from the offsets
    (`jagged.tiles.kv_tiles`, shared with the TLX backward; no host sync).
    Each CTA is warp specialized (3 warpgroups, 384 threads):

        warpgroup 0, warp 0  `load_kv`   K, V of the tile (TMA, once per tile, into
                                         Config.kv_stages stages)
                             `load_q`    Q, dO of each (query head, Q block) step into a
                                         Q_STAGES-deep ring (TMA, full/empty mbarriers),
                                         and the step's lse*log2e / delta rows into smem
        warpgroup 0, warp 1  `reduce_dq` the step's fp32 dQ partial (staged in smem by
                                         compute) reduce-added into the fp32 accumulator
                                         with TMA bulk tensor reduces
                                         (cp.reduce.async.bulk.tensor.add.f32)
        warpgroups 1 and 2   `compute`   per step, in the transposed form (each warpgroup
                                         owns 64 of the BLOCK_N = 128 keys):
                                         S^T = K Q^T, dP^T = V dO^T (wgmma, smem x smem),
                                         P^T = exp2(S^T*scale*log2e - lse*log2e),
                                         dV += P^T dO, dS^T = P^T (dP^T - delta),
                                         dK += dS^T Q (wgmma, P^T / dS^T from registers),
                                         dS^T -> smem, dQ_part = dS K (wgmma, smem x smem)
                                         -> smem for reduce_dq
                             `store`     dK (times scale), dV in the input dtype through
                                         the warpgroup's half of sV, rows predicated to
                                         the tile

    The tile ids of packed lists come in list order from a counter (`jagged.tiles.
    bwd_dynamic`), as TLX's: the load warp takes the CTA's next tile with an atomic add
    (`next_tile`) and hands it to compute and reduce_dq (`publish_tile` / `fetch_tile`,
    tile_counter.py; against the round-robin, llm causal B8 H16 8192 -11.5 %, GQA B4 H32/8
    -30 %, fuzz B48 H8/1 D64 -11 %); broadcast-Q's come round-robin.
    GQA: a tile owns one KV head and loops over the query heads of its group (step j:
    head hk * G + j // n_m, Q block j % n_m), so dK/dV are summed in registers and stored
    once. Where a call has few long tiles (jagged.tiles.bwd_parts > 1), as TLX's, each
    tile's steps are shared evenly by that many CTAs (schedule.part_steps); every
    part adds its dK / dV in fp32 into zeroed accumulators (`store_add`: from registers,
    red.global.add.v2.f32; TLX stages them through V smem for 16-byte adds).
(c) `Postprocess` (`_bwd_postprocess`): dQ = scale * sum over slots of the fp32
    accumulator, cast to the input dtype; split tiles: dK / dV from their accumulators
    too, each into its own gradient, in the same launch (the preprocess zeroed them;
    host.backward).
Long packed sequences (jagged.tiles.takes_flat, Config.dq_flat) hand dQ over as FA4 does:
each compute warpgroup stores its partial in the wgmma accumulator's register order into a
buffer of its own (16-byte stores, barriers 6 + w / 8 + w), and reduce_dq adds it with one
1-D bulk add (cp.reduce.async.bulk .add.f32) into a block-padded accumulator: Q block j
of sequence b is block jagged.tiles.flat_block, bm x D floats a (block, query head).
`PostFlat` reads a block's fragments back through the same wgmma partition and stores
its rows up to the sequence's end. The padding is half a step a sequence on average,
hence the threshold; a call of fewer blocks than SMs keeps the row accumulator (PostFlat
is a CTA a block). Key windows never take it (check_config): a window's Q blocks run
across its sequences, which no flat_block holds, and owned windows store dQ.
In the packed modes the three chain as programmatic dependent launches, as TLX's
(jagged.tiles.bwd_dependent): the preprocess triggers first, the main kernel waits before
any global access and triggers, the postprocess waits before it reads.

Steps (CONFIGS, by head dim and mean query rows a sequence): 64 query rows at D = 128
with one K/V stage (two need 242 KB of smem), S^T and dP^T issued together; 128 rows at
D = 64 with two K/V stages, dQ split by query rows between the warpgroups, S^T and dP^T
together (FA4's order, `compute_step_128`; broadcast-Q one after the other); 64 rows at
D = 64 where sequences average at most jagged.tiles.BWD_MID_MEAN_Q query rows; 80 rows
at D = 128 for long packed sequences without causal masking (`takes_plain`, FA4's step
there): 80 is no multiple of wgmma's 64-row M, so dQ^T = K^T dS^T takes the head dim as M
(a warpgroup's 64 columns; `Config.dq_t`), its elements stored transposed into the same
smem partial (one STS.32 each), and dV waits for dS^T (before it, S^T, dP^T, P^T and
dK / dV overfill the registers and ptxas serializes every wgmma).

Broadcast-Q (dQ is a sum over the whole batch): CTAs are pinned to a KV head (CTA p owns
head p % H_kv) and accumulate into fp32 slots dq_acc[(p // H_kv) % n_slots]
([n_slots, L_q, H, D], jagged.tiles.dq_slots); `Postprocess` sums the slots. Exactly as
TLX.

Masking: keys past the sequence end, query rows past the sequence end (lse = +inf), the
causal (bottom-right aligned: query i sees key j iff j <= i + len_k - len_q) triangle
and rows with lse = -inf all give P = 0, so they add nothing to dV, dK or dQ (dQ boxes
reach past the sequence but add exact zeros there; TMA clips past the tensor). As TLX's,
D = 128's causal 64-row step masks P^T only where a warpgroup's keys run past the
sequence or a row of the step misses one (`unmasked_from`; 376 instructions a warp
without the mask, 491 with); causal packed 128-row steps (D = 64) run each query head's
masked steps, then the others, in loops of their own (756 and 571 instructions; a branch
there made ptxas serialize every wgmma); the other steps mask every step (`probs`).

Key windows (`takes_windows`: short packed keys, mean length at most a tile,
jagged.tiles.BWD_WINDOW_MEAN_FRACTION; the `window_config` build): a tile is a window of
whole sequences of at most BLOCK_N packed key columns together, or a BLOCK_N-key block of
a longer one (jagged.tiles.windows over the key offsets, schedule.kv_window_coords),
dealt round-robin over windows x KV heads (never from the counter, causal or not). Its Q
blocks run over every query row of its sequences, from its first sequence's first row
(causal: its first row that sees a key; the preprocess zeroes the rows before it); each
key column meets only its own sequence's rows (`col_ranges`, once a tile) and every step
masks P^T to them (`window_keep`: one unsigned compare); dK / dV go to the window's real
columns. A window of whole sequences holds every key its rows meet, so its steps' dQ is
whole: `compute` stores it in q's dtype (`store_dq`) and reduce_dq adds nothing; the
preprocess zeroes and `PostRows` converts only the rows of the longer sequences, whose
blocks reduce-add their partials as above (and, causal, the rows that see no key). A call
of a few windows (jagged.tiles.window_parts > 1) shares each window's steps over CTAs as
split tiles do (`store_add`; a step's dQ stays its own). Not for broadcast-Q.

Determinism: as TLX's (TMA bulk reduce): dK/dV are with whole tiles (each row written
once), not with split ones; dQ is not bitwise deterministic.
"""
import math
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, NamedTuple, Optional

from jagged.arch import SMEM_LIMIT
from jagged.tiles import (BWD_WINDOW_MEAN_FRACTION, bwd_dependent, bwd_dynamic, bwd_head_run,
                          bwd_mean_q, bwd_mid, bwd_parts, flat_block, kv_tiles, takes_flat,
                          window_parts, window_tiles, windowed)

from . import host

LOG2E = 1.4426950408889634
BLOCK_N = 128           # keys per KV tile: 2 compute warpgroups x 64
Q_STAGES = 2            # depth of the Q / dO ring
NUM_MMA_WG = 2          # compute warpgroups
NUM_THREADS = 128 * (NUM_MMA_WG + 1)
LOAD_REGS, MMA_REGS = 24, 240   # setmaxnreg per role (24*128 + 240*256 <= 64K)
# named barriers (0 = syncthreads)
PDS_BARRIER = 1         # compute warpgroups: dS^T in smem written / free again
DQ_FULL_BARRIER = 2     # compute -> reduce_dq: the dQ partial is in smem
DQ_EMPTY_BARRIER = 3    # reduce_dq -> compute: the smem dQ buffer may be overwritten
DQ_BARRIER_THREADS = 128 * NUM_MMA_WG + 32
DQ_FULL_WG = 6          # Config.dq_flat: + warpgroup (6, 7), compute -> reduce_dq, and
DQ_EMPTY_WG = 8         # + warpgroup (8, 9), reduce_dq -> compute, a warpgroup's buffer
DQ_WG_THREADS = 128 + 32
STORE_BARRIER = 4       # + warpgroup (4, 5): a warpgroup's sV half written / read
PRE_THREADS = 128       # preprocess: D / PRE_VEC threads per (token, head) row
PRE_VEC = 8
PRE_GROUPS = 2          # preprocess: row groups a delta CTA (16 rows at D = 128, 32 at
                        # D = 64: TLX's ROWS), their loads issued before any sum
POST_THREADS = 128      # postprocess: 8 elements per thread
POST_VEC = 8
# Key windows: the accumulator rows of sequences longer than a window are zeroed, and
# converted, by CTAs of WIN_TOK tokens, one search a token for its sequence (TLX's
# WIN_TOK). A search a thread of a row's vector left both passes latency-bound.
WIN_TOK = 32
DQ_WIDE = 32            # fp32 columns of a dQ reduce box (128 B, the swizzle span)


@dataclass(frozen=True)
class Config:
    block_m: int     # query rows a step: 64, or 128 at D = 64 (the dots one after another)
    kv_stages: int   # K/V stages (2: the next tile's K/V load overlaps this tile's end)
    windows: bool = False   # tiles are key windows (`window_config`), not (sequence, KV
                            # block) pairs
    sdp_together: bool = False  # at 128 rows, S^T and dP^T in flight together
                                # (compute_step_128; not for broadcast-Q)
    dq_t: bool = False   # dQ^T = K^T dS^T, the head dim as M (D = 128: a warpgroup's 64
                         # columns): the form of a step whose rows are no multiple of 64
    ds_stages: int = 1     # dS^T buffers: 2 (one a Q stage) leave one of the step's two
                           # dS^T barriers (the buffer free again) out
    dq_flat: bool = False  # each warpgroup's dQ partial in a buffer of its own, in its
                           # accumulator's register order (16-byte stores), reduce-added
                           # by 1-D bulk adds into a block-padded accumulator
                           # (jagged.tiles.takes_flat; PostFlat restores
                           # the rows)
    head_run: int = 1      # list entries a KV head in turn (jagged.tiles.bwd_head_run,
                           # schedule.head_run_coords; _plan sets it)


# The measured defaults, keyed by (head dim, bucket): "mid" at D = 64 when a sequence has
# at most jagged.tiles.BWD_MID_MEAN_Q query rows on average, else "long".
#   D = 64, 128 rows against 64 (both with two K/V stages): llm B16 H16 2048 1.756 ->
#     1.621 ms, causal 1.025 -> 0.964; "mid": 64 rows, gem-jagged-d64 1024 / 0.1 (mean
#     102) -3.5 %, 134 -0.2 %, 260 +2.3 %; two K/V stages against one: 64 rows -1.4 %,
#     causal -1.6 %; 128 rows -1.2 %, causal -1.0 %. S^T and dP^T together (FA4's
#     order) against one after the other, graph replay: llm 1.672 -> 1.563 ms, causal
#     0.982 -> 0.958; fuzz B2 H8/2 16384 / 0.9 5.05 -> 4.75; 7 more fuzz shapes 2.3-5.8 %
#     faster. Its block-padded dQ (takes_flat) against the row accumulator (H100,
#     consecutive runs, eager): llm B16 H16 2048 1.598 -> 1.522 ms; varlen-llm D = 64
#     B10 H32/8 8192 9.95 -> 9.46, H16/2 5.17 -> 4.89, B20 H32/8 4096 4.08 -> 3.96,
#     H16/2 2.12 -> 2.00.
#   D = 128: 64 rows, one K/V stage (two would need 242 KB of smem); "plain": 80 rows
#     (takes_plain), against 64, one run, FA4 in it: llm B8 H16 8192 -3.7 % (replayed
#     -1.2 %), B4 H32/8 4096 -3.6 % (-3.1 %); gem-jagged 1024 / 0.9 -3.0 %, 2048 / 0.9
#     -3.6 % (replayed); fuzz B5 H8/4 16384 / 0.5 -4.3 %, B21 -5.1 %. Its two dS^T
#     stages (one dS^T barrier a step, as FA4's two PdS stages; 227 KB, the limit) come
#     with the block-padded dQ (takes_flat): together, against one stage and the row
#     accumulator (H200, consecutive runs), llm B8 H16 8192 19.83 -> 18.65 ms, gem-jagged
#     1024 / 0.9 11.92 -> 11.45, 2048 / 0.9 41.29 -> 38.61; at 64 rows two stages lost
#     (PERF, Tried and lost: `dsdbl`), and the block-padded dQ alone took llm causal
#     11.11 -> 10.26.
CONFIGS = {
    (64, "mid"): Config(block_m=64, kv_stages=2),
    (64, "long"): Config(block_m=128, kv_stages=2, sdp_together=True),
    (128, "long"): Config(block_m=64, kv_stages=1),
    (128, "plain"): Config(block_m=80, kv_stages=1, dq_t=True, ds_stages=2),
}


# takes_plain. An 80-row step pads a sequence to a multiple of 80 (256 rows: 320, 25 %
# idle), a 64-row one to a multiple of 64. Jagged lengths: from a mean of PLAIN_MEAN_Q
# query rows (gem-jagged 512 / 0.9, mean 460: +0.3 %; fuzz B136 512 / 0.75: -0.1 %; 1024 /
# 0.5 -3.2 %). Dense: the rows each pads, at PLAIN_ROW_COST of a 64-row step's time a
# row (llm B8 H16 8192: -3.7 % with 0.6 % more rows).
PLAIN_MEAN_Q = 512
PLAIN_ROW_COST = 0.96


def sdp_together(cfg: Config, broadcast_q: bool) -> bool:
    """Whether a build issues S^T and dP^T together (Config.sdp_together; broadcast-Q keeps
    the dots one after the other, as the TLX twin: its causal fp16 build would spill)."""
    return cfg.sdp_together and not broadcast_q


def pick_config(head_dim: int, mean_q: float = math.inf, causal: bool = False,
                broadcast_q: bool = False, max_q: int = 0, split: bool = False,
                n_q: float = math.inf, n_sms: int = 0) -> Config:
    """The measured default for a head dim and a call's mean query rows a sequence
    (jagged.tiles.bwd_mid; left out: the long sequences' step). "plain": long packed
    sequences without causal masking, where the head dim has a step of its own
    (`takes_plain`; max_q: the call's longest sequence, 0 where not known). The
    block-padded dQ: jagged.tiles.takes_flat, over the call's n_q query rows and n_sms.

    Tiles split over CTAs (split: jagged.tiles.bwd_parts > 1) end in fp32 adds
    (`store_add`), which leave the longest steps short of registers: they take the 64-row
    step at D = 128 (the 80-row step loop spills 48 bytes) and the 128-row step at D = 64
    one dot after another (in FA4's order ptxas serializes its wgmmas, C7512)."""
    bucket = "mid" if bwd_mid(head_dim, mean_q) else "long"
    if (bucket == "long" and not causal and not broadcast_q and (head_dim, "plain") in CONFIGS
            and not split and takes_plain(head_dim, mean_q, max_q)):
        bucket = "plain"
    cfg = _split(CONFIGS[(head_dim, bucket)], split)
    flat = takes_flat(mean_q, broadcast_q, n_q / cfg.block_m, n_sms)
    return replace(cfg, dq_flat=True) if flat else cfg


def _split(cfg: Config, split: bool) -> Config:
    """A build whose tiles are split over CTAs ends in fp32 adds: with them, ptxas
    serializes the wgmmas of FA4's dot order (pick_config), so it takes the other."""
    return replace(cfg, sdp_together=False) if split and cfg.sdp_together else cfg


def takes_plain(head_dim: int, mean_q: float, max_q: int = 0) -> bool:
    """Whether the "plain" step pads the call's sequences little enough to win. Every
    sequence max_q rows long (mean_q == max_q): where its blocks at PLAIN_ROW_COST of the
    long step's time a row cost less than the long step's blocks (80 against 64 rows: 256
    or 512 rows no, 1024 or 4096 yes). Otherwise from PLAIN_MEAN_Q rows on average."""
    if max_q > 0 and mean_q == max_q:
        bm, bm0 = CONFIGS[(head_dim, "plain")].block_m, CONFIGS[(head_dim, "long")].block_m
        return bm * -(-max_q // bm) * PLAIN_ROW_COST < bm0 * -(-max_q // bm0)
    return mean_q >= PLAIN_MEAN_Q


def window_config(head_dim: int, split: bool = False) -> Config:
    """Key windows: the head dim's long-sequence step (D = 64: 128 rows, two K/V
    stages; D = 128: 64 rows, one stage), its tiles key windows; split (window_parts >
    1): its dots one after another, as pick_config's."""
    return _split(replace(CONFIGS[(head_dim, "long")], windows=True), split)


def takes_windows(n_keys: int, batch: int, max_k: int, broadcast_q: bool) -> bool:
    """Whether a call's main kernel runs on key windows (jagged.tiles.windowed over the
    keys: short packed keys, decided on the host without a sync); broadcast-Q never
    does."""
    return windowed(n_keys, batch, max_k, BLOCK_N, broadcast_q, BWD_WINDOW_MEAN_FRACTION)


def check_config(head_dim: int, cfg: Config) -> None:
    """A ValueError for a step the kernel does not build: 128 rows are for D = 64 (their
    registers), and the smem model must fit in SMEM_LIMIT."""
    if cfg.block_m not in (64, 80, 128) or (cfg.block_m == 128 and head_dim != 64):
        raise ValueError(f"block_m = {cfg.block_m} at D = {head_dim}: 64, 80, or 128 at "
                         f"D = 64")
    if cfg.dq_t and (head_dim != 128 or cfg.block_m == 128):
        raise ValueError(f"dq_t at D = {head_dim}, block_m = {cfg.block_m}: D = 128 (two "
                         f"warpgroups of 64 columns), at most 80 rows")
    if cfg.block_m % 64 and not cfg.dq_t:
        raise ValueError(f"block_m = {cfg.block_m} takes dq_t (wgmma's M is 64 a warpgroup)")
    if cfg.sdp_together and cfg.block_m != 128:
        raise ValueError(f"sdp_together is a 128-row step's order (block_m = {cfg.block_m})")
    if cfg.dq_flat and cfg.windows:
        raise ValueError("dq_flat: whole sequences' Q blocks (not key windows)")
    if cfg.ds_stages not in (1, 2) or Q_STAGES % cfg.ds_stages:
        raise ValueError(f"ds_stages = {cfg.ds_stages}: 1 or 2 (a Q stage's)")
    if cfg.kv_stages not in (1, 2):
        raise ValueError(f"kv_stages = {cfg.kv_stages}: 1 or 2")
    if smem_bytes(head_dim, cfg) > SMEM_LIMIT[90]:
        raise ValueError(f"{cfg} at D = {head_dim} needs {smem_bytes(head_dim, cfg)} B of "
                         f"shared memory (> {SMEM_LIMIT[90]} B)")


def smem_bytes(head_dim: int, cfg: Config) -> int:
    """Bytes of the main kernel's SharedStorage for 16-bit inputs (the mbarriers, padded
    to sK's 1 KB alignment, then the tiles; sLD last). BwdMain asserts it equals the
    struct's size at trace time. D = 64, 128 rows: 195 KB (one K/V stage: 163 KB);
    D = 128, 64 rows: 178 KB (two K/V stages: 242 KB, over SMEM_LIMIT); 80 rows: 207 KB,
    with two dS^T stages 227 KB (SMEM_LIMIT exactly)."""
    D, ks, bm = head_dim, cfg.kv_stages, cfg.block_m
    n = 1024 + 2 * (2 * ks * BLOCK_N * D + 2 * Q_STAGES * bm * D + cfg.ds_stages * BLOCK_N * bm)
    n += 4 * bm * D                                        # sdQ, fp32
    n += 4 * math.prod(ld_shape(bm))                       # sLD
    return -(-n // 1024) * 1024                            # the struct's 1 KB alignment


# sLD: (query row of the step, lse*log2e | delta, Q stage), fp32, column-major, written
# by the load warp at row ld_row(lane, e); a compute thread reads its S^T accumulator
# column c at byte ld_thread_offset(lane, stage, bm) + 4 (x bm + ld_column(c)) of sLD
# (x = 0: lse, 1: delta). tests/test_cute_bwd_compile.py checks these against the wgmma
# partition and the layout.
def ld_shape(bm: int):
    """sLD's shape at bm query rows a step."""
    return (bm, 2, Q_STAGES)


def ld_rows(bm: int) -> int:
    """lse / delta rows a load lane stages a step (`ld_row` e = 0 .. this - 1; past bm, at
    80 rows, none)."""
    return 2 * -(-bm // 64)


def ld_flip(bm: int) -> int:
    """XOR of a thread offset with this: the other Q stage's."""
    return 4 * 2 * bm


def ld_row(lane, e, base=0):
    """base + the query row whose lse / delta lane `lane` of the load warp stages (e = 0 ..
    ld_rows - 1: rows 2 lane, 2 lane + 1, then the same 64 rows on)."""
    return base + 2 * lane + e % 2 + 64 * (e // 2)


def ld_thread_offset(lane, stage, bm: int):
    """Byte offset in sLD of a compute thread's first query column, 2 (lane % 4) (wgmma C
    layout, N = bm), in Q stage `stage`."""
    return 4 * (2 * (lane % 4) + 2 * bm * stage)


def ld_column(c: int) -> int:
    """The query column of S^T accumulator column c less the thread's first."""
    return 8 * (c // 2) + c % 2


def dq_smem_layout(D: int, bm: int):
    """The fp32 dQ partial in smem, (bm, D), as the TMA reduce boxes read it: D / DQ_WIDE
    blocks of (bm, DQ_WIDE) row-major, 128 B rows, 128B swizzle (a ComposedLayout whose
    swizzle counts bytes, as sK's: the TMA atom takes its swizzle mode from it; compute
    writes through `dq_store_view`). Against 64 x 8 boxes (32 B rows): llm causal
    -11.9 %."""
    import cutlass.cute as cute
    from cutlass import Float32
    from cutlass.cute.nvgpu import warpgroup
    atom = warpgroup.make_smem_layout_atom(
        warpgroup.SmemLayoutAtomKind.K_SW128, Float32)    # S<3,4,3> o (8, 32)
    return cute.tile_to_shape(atom, (bm, D), (0, 1))


def dq_mma(dt, D: int, bm: int, dq_t: bool):
    """The dQ wgmma (its C partition is the partial's layout, which PostFlat reads
    back). dQ = dS K: M = queries, N = D (warpgroup w: columns w*D/2..; 128 rows: rows
    64w.., all D), K = keys; A = dS (the dS^T tile read M-major), B = K^T (MN-major).
    dq_t: dQ^T = K^T dS^T, M = D (warpgroup w: columns 64w..), N = queries; A = K^T,
    B = dS (both MN-major)."""
    import cutlass.utils.hopper_helpers as sm90
    from cutlass import Float32
    from cutlass.cute.nvgpu import warpgroup
    split = (NUM_MMA_WG, 1, 1) if bm == 128 or dq_t else (1, NUM_MMA_WG, 1)
    tiler = (64, bm) if dq_t else (64, D) if bm == 128 else (64, D // NUM_MMA_WG)
    return sm90.make_trivial_tiled_mma(
        dt, dt, warpgroup.OperandMajorMode.MN, warpgroup.OperandMajorMode.MN, Float32,
        atom_layout_mnk=split, tiler_mn=tiler)


def dq_store_view(layout):
    """The compute threads' view of `dq_smem_layout`: the swizzle in elements (static
    offsets: 4 live STS.64 bases a thread, one per 8-column group of a block; blocks and
    the +8 row fold into immediates; through the swizzled pointer it took 16, and spilled),
    the same bytes the TMA box reads. A warp's STS.64 (8 rows x 4 lanes x 8 B) covers all
    32 banks twice (2 wavefronts, the minimum). tests: test_dq_smem_addresses."""
    from cutlass import Float32

    from .fragments import element_swizzled
    return element_swizzled(layout, Float32)


# role: schedule
class Sched(NamedTuple):
    """What every role of BwdMain needs to walk the tile list (schedule.tile_range,
    schedule.kv_tile_coords, tile_counter)."""
    mTileB: Any          # the list: batch element of each tile; key windows: the
                         # window order
    mTileN: Any          # and its KV block; key windows: each window's first and last
                         # sequence and first key [3, n_win]
    mNTiles: Any         # the list's length (live windows), on the device
    mCuQ: Any
    mCuK: Any
    L_q: Any             # broadcast-Q: the dense query length
    H: Any
    HKV: Any
    group: Any           # query heads per KV head
    mSched: Any          # the counter and the tile hand-over slots (tile_counter)
    pipeline_tile: Any   # the hand-over's barriers
    n_slots: Any         # broadcast-Q: the dQ accumulator's slots (schedule.tile_range)
    parts: int = 1       # CTAs a tile (jagged.tiles.bwd_parts), a build constant
    head_run: int = 1    # list entries a KV head in turn (Config.head_run), a build constant


class Smem(NamedTuple):
    """The main kernel's shared-memory tiles (and views of them)."""
    sK: Any
    sV: Any
    sQ: Any              # (bm, D, Q_STAGES), as sdO
    sdO: Any
    sdS: Any             # dS^T (keys, queries)
    sdQ: Any             # the fp32 dQ partial as the TMA reduce reads it
    sdQst: Any           # the same bytes as the compute threads write them
    sdQflat: Any         # Config.dq_flat: the same bytes, a warpgroup's buffer a column
    sVst: Any            # sV with the swizzle in the layout: `store`'s 16-byte reads
    sLD: Any             # lse*log2e and delta of each Q stage's rows


class Operands(NamedTuple):
    """A compute warpgroup's wgmmas, their operand fragments and accumulators, and the
    copies and coordinates of a step."""
    tiled_mma_sdp: Any   # S^T = K Q^T, dP^T = V dO^T
    tiled_mma_dkv: Any   # dV += P^T dO, dK += dS^T Q
    tiled_mma_dq: Any    # dQ = dS K
    shape_S: Any
    shape_dQ: Any
    tSrK: Any
    tSrQ: Any
    tPrV: Any
    tPrdO: Any
    tdVrdOt: Any
    tdKrQt: Any
    tdVrPt: Any
    tdKrdSt: Any
    tdQrdS: Any
    tdQrKt: Any
    acc_dK: Any
    acc_dV: Any
    tdQsdQ: Any          # this thread's part of the smem dQ partial
    r2s_dS: Any          # dS^T registers -> smem (stmatrix)
    thr_r2s_dS: Any
    tdSsdS: Any
    tScS: Any            # (key, query) of every S^T accumulator element


_COMPILED = {}


# --------------------------------------------------------------------------------------
# The kernels (all CuteDSL imports are inside `_kernel_classes`, so importing this module
# touches neither the DSL nor the driver).
# --------------------------------------------------------------------------------------

def _kernel_classes():
    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    import cutlass.utils.hopper_helpers as sm90
    from cutlass import Float32, Int32, const_expr
    from cutlass.cute.nvgpu import cpasync, warpgroup
    from cutlass.utils import LayoutEnum

    from .fragments import (acc_as_operand_a, acc_rows_cols, aligned, bulk_reduce_add_f32,
                            element_swizzled, flat_copy, head_tile, red_add_v2, replaced,
                            store_rows, tma_tiles, wgmma)
    from .schedule import kv_tile_coords, kv_window_coords, part_steps, tile_range
    from .seqinfo import (ROW_SEQ_CHUNK, col_q_range, dq_accumulated, row_seq_chunk,
                          sequence_of_step)
    from .tile_counter import fetch_tile, next_tile, publish_tile

    def transposed(s, shape, order):
        """A transposed view of a swizzled smem tile (the MN-major operand views)."""
        return cute.composition(s, cute.make_ordered_layout(shape, order=order))

    @cute.jit
    def accumulated(mCuQ, mCuK, B, rounds, tok, long_k: cutlass.Constexpr,
                    causal: cutlass.Constexpr = False):
        """Key windows: whether packed query row `tok` takes its dQ from the fp32
        accumulator: a row of a sequence of more than long_k keys, whose key blocks are
        windows of their own, a row past the last sequence (zeros) or, causal, a row that
        sees no key of its sequence (zeros: a window's walk starts past its first
        sequence's, schedule.kv_window_coords). Every other row's sequence is whole in one
        window (jagged.tiles.windows), which stores its dQ (`store_dq`). TLX's
        `_accumulated`."""
        seq, hi = Int32(0), B
        for _ in cutlass.range(rounds, unroll=1):
            seq, hi = sequence_of_step(mCuQ, tok, seq, hi)
        return dq_accumulated(mCuQ, mCuK, B, seq, tok, long_k, causal)

    # ================================================================================
    # (a) preprocess: delta = rowsum(dO * O); zero the packed dQ accumulator
    # ================================================================================
    # role: compute
    class Preprocess:
        def __init__(self, dtype, head_dim: int, long_k: int = 0, zero_dkv: bool = False,
                     causal: bool = False):
            self.dtype, self.D, self.long_k = dtype, head_dim, long_k
            self.zero_dkv, self.causal = zero_dkv, causal

        @cute.jit
        def __call__(self, mO: cute.Tensor, mdO: cute.Tensor, mDelta: cute.Tensor,
                     mdQacc: cute.Tensor, mSched: cute.Tensor, n_rows: Int32, H: Int32,
                     n_dq_rows: Int32, mCuQ: Optional[cute.Tensor],
                     mCuK: Optional[cute.Tensor], B: Int32, rounds: Int32,
                     mdKVacc: Optional[cute.Tensor], n_kv_rows: Int32, stream):
            rows_per_cta = PRE_GROUPS * PRE_THREADS // (self.D // PRE_VEC)
            n_ctas = (n_rows + rows_per_cta - 1) // rows_per_cta
            if const_expr(self.long_k > 0):
                n_ctas += (n_rows // H + WIN_TOK - 1) // WIN_TOK
            self.kernel(mO, mdO, mDelta, mdQacc, mSched, n_rows, H, n_dq_rows, mCuQ, mCuK,
                        B, rounds, mdKVacc, n_kv_rows).launch(
                grid=[n_ctas, 1, 1], block=[PRE_THREADS, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mDelta: cute.Tensor,
                   mdQacc: cute.Tensor, mSched: cute.Tensor, n_rows: Int32, H: Int32,
                   n_dq_rows: Int32, mCuQ: Optional[cute.Tensor],
                   mCuK: Optional[cute.Tensor], B: Int32, rounds: Int32,
                   mdKVacc: Optional[cute.Tensor], n_kv_rows: Int32):
            """Rows are (token, head) pairs, token-major ([Nq * H, D]); in the delta
            CTAs D / PRE_VEC neighbouring threads share a row (16-byte loads, coalesced)
            and sum their partial dot products with shuffles. They also zero the
            accumulator's n_dq_rows rows of D (a row a thread group; those past n_rows, of
            a block-padded one, Config.dq_flat, or of a broadcast-Q call's slots, as
            grid-stride shares) and the tile counter mSched[0]
            (jagged.tiles.dq_accumulator). long_k (key windows):
            only the rows the windows reduce-add into (`accumulated`: mCuQ, mCuK, B
            sequences, rounds >= bit_length(B); under jagged.tiles.windows_direct mdQacc
            is dQ itself, in its dtype, and they are the rows past the last sequence), by
            CTAs of WIN_TOK tokens after the delta ones in the grid, PRE_THREADS / WIN_TOK
            threads a token: the delta CTAs search nothing. zero_dkv (tiles split over
            CTAs) each CTA's grid-stride share of the fp32 dK / dV accumulators mdKVacc,
            n_kv_rows rows of D (jagged.tiles.dkv_accumulator; no launch of their own).
            The main kernel queued behind may launch at once: it waits for these writes
            itself."""
            cute.arch.griddepcontrol_launch_dependents()
            tpr = self.D // PRE_VEC                       # threads per row
            tidx = cute.arch.thread_idx()[0]
            bid = cute.arch.block_idx()[0]
            r = bid * (PRE_THREADS // tpr) + tidx // tpr
            chunk = tidx % tpr
            if const_expr(self.zero_dkv):
                rZ = cute.make_rmem_tensor((1, PRE_VEC), Float32)
                rZ.fill(0.0)
                grid_rows = cute.arch.grid_dim()[0] * (PRE_THREADS // tpr)
                for rk in cutlass.range(r, n_kv_rows, grid_rows, unroll=1):
                    cute.autovec_copy(rZ, cute.local_tile(mdKVacc, (1, PRE_VEC), (rk, chunk)))
            per_group = PRE_THREADS // tpr                 # rows a group
            n_delta = (n_rows + PRE_GROUPS * per_group - 1) // (PRE_GROUPS * per_group)
            if bid < n_delta:
                rows, rOs, rdOs = [], [], []
                for g in cutlass.range_constexpr(PRE_GROUPS):  # the loads first
                    rg = (bid * PRE_GROUPS + g) * per_group + tidx // tpr
                    rO = cute.make_rmem_tensor((1, PRE_VEC), self.dtype)
                    rdO = cute.make_rmem_tensor((1, PRE_VEC), self.dtype)
                    rO.fill(0.0)
                    rdO.fill(0.0)
                    if rg < n_rows:
                        cute.autovec_copy(cute.local_tile(mO, (1, PRE_VEC), (rg, chunk)), rO)
                        cute.autovec_copy(cute.local_tile(mdO, (1, PRE_VEC), (rg, chunk)),
                                          rdO)
                    rows.append(rg)
                    rOs.append(rO)
                    rdOs.append(rdO)
                for g in cutlass.range_constexpr(PRE_GROUPS):
                    rg = rows[g]
                    part = (rOs[g].load().to(Float32) * rdOs[g].load().to(Float32)).reduce(
                        cute.ReductionOp.ADD, Float32(0.0), 0)
                    # every lane shuffles (rows past the end add zeros), then the guard
                    total = cute.arch.warp_reduction_sum(part, threads_in_group=tpr)
                    if rg < n_rows:
                        if chunk == 0:
                            mDelta[rg % H, rg // H] = total
                        if const_expr(self.long_k == 0):
                            if rg < n_dq_rows:
                                rA = cute.make_rmem_tensor((1, PRE_VEC), mdQacc.element_type)
                                rA.fill(0.0)
                                cute.autovec_copy(rA, cute.local_tile(mdQacc, (1, PRE_VEC),
                                                                      (rg, chunk)))
            if const_expr(self.long_k > 0):
                if bid >= n_delta:  # a CTA of WIN_TOK tokens, all their rows
                    tpt = PRE_THREADS // WIN_TOK            # threads a token
                    tok = (bid - n_delta) * WIN_TOK + tidx // tpt
                    if tok < n_rows // H:
                        if accumulated(mCuQ, mCuK, B, rounds, tok, self.long_k,
                                       self.causal):
                            rZq = cute.make_rmem_tensor((1, PRE_VEC), mdQacc.element_type)
                            rZq.fill(0.0)
                            for v in cutlass.range(tidx % tpt, H * tpr, tpt, unroll=1):
                                cute.autovec_copy(rZq, cute.local_tile(
                                    mdQacc, (1, PRE_VEC), (tok * H + v // tpr, v % tpr)))
            if r == 0 and chunk == 0:
                mSched[0] = Int32(0)
            rT = cute.make_rmem_tensor((1, PRE_VEC), mdQacc.element_type)
            rT.fill(0.0)
            grid_rows = cute.arch.grid_dim()[0] * (PRE_THREADS // tpr)
            for rt in cutlass.range(n_rows + r, n_dq_rows, grid_rows, unroll=1):
                cute.autovec_copy(rT, cute.local_tile(mdQacc, (1, PRE_VEC), (rt, chunk)))

    # ================================================================================
    # (b) main kernel, one method per role
    # ================================================================================
    class BwdMain:
        def __init__(self, dtype, head_dim: int, causal: bool, broadcast_q: bool,
                     cfg: Config, dynamic: bool = False, parts: int = 1):
            check_config(head_dim, cfg)
            assert parts == 1 or not broadcast_q
            self.parts = parts      # CTAs a tile; > 1: mdK / mdV are fp32 accumulators
            self.dtype, self.D = dtype, head_dim
            self.causal, self.broadcast_q = causal, broadcast_q
            self.windows = cfg.windows                        # key windows
            assert not (self.windows and (broadcast_q or dynamic))
            self.dynamic = dynamic and not broadcast_q       # tiles from the counter
            self.cfg = cfg
            self.kv_stages = cfg.kv_stages
            self.bm = cfg.block_m                             # query rows a step
            self.sdp_together = sdp_together(cfg, broadcast_q)
            self.dq_t = cfg.dq_t                              # dQ^T, the head dim as M
            self.dq_flat = cfg.dq_flat                        # block-padded dQ partials
            assert not (self.dq_flat and broadcast_q)
            self.ld_rows = ld_rows(self.bm)                   # lse / delta rows a load lane

        # ------------------------------------------------------------------ host side
        @cute.jit
        def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                     mdO: cute.Tensor, mLSE: cute.Tensor, mDelta: cute.Tensor,
                     mdQacc: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
                     mCuQ: cute.Tensor, mCuK: cute.Tensor, mTileB: cute.Tensor,
                     mTileN: cute.Tensor, mNTiles: cute.Tensor, mSched: cute.Tensor,
                     scale: Float32, L_q: Int32, n_slots: Int32, group: Int32,
                     num_programs: Int32, mdQ: Optional[cute.Tensor], stream):
            D, dt = self.D, self.dtype
            # [tokens, heads, D] -> (tokens, D, heads): the TMA boxes tile (rows, D)
            mQ, mK, mV, mdO, mdQacc, mdK, mdV = [
                cute.make_tensor(t.iterator, cute.select(t.layout, mode=[0, 2, 1]))
                for t in (mQ, mK, mV, mdO, mdQacc, mdK, mdV)]
            # key windows: dQ itself, which owned windows store (`store_dq`)
            assert (mdQ is not None) == self.windows and not (self.windows and self.dq_t)
            if const_expr(mdQ is not None):
                mdQ = cute.make_tensor(mdQ.iterator, cute.select(mdQ.layout, mode=[0, 2, 1]))
            # smem tiles, 128B-swizzled along their contiguous dim
            atom_D = warpgroup.make_smem_layout_atom(
                sm90.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dt, D), dt)
            atom_M = warpgroup.make_smem_layout_atom(
                sm90.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dt, self.bm), dt)
            KS = self.kv_stages
            sK_layout = cute.tile_to_shape(atom_D, (BLOCK_N, D), (0, 1))
            sV_layout = cute.tile_to_shape(atom_D, (BLOCK_N, D), (0, 1))
            sK_box, sV_box = sK_layout, sV_layout      # one stage: the TMA box
            if const_expr(KS > 1):
                # a stage mode, as the Q / dO ring
                sK_layout = cute.tile_to_shape(atom_D, (BLOCK_N, D, KS), (0, 1, 2))
                sV_layout = cute.tile_to_shape(atom_D, (BLOCK_N, D, KS), (0, 1, 2))
                sK_box = cute.select(sK_layout, mode=[0, 1])
                sV_box = cute.select(sV_layout, mode=[0, 1])
            QS = Q_STAGES
            sQ_layout = cute.tile_to_shape(atom_D, (self.bm, D, QS), (0, 1, 2))
            sdO_layout = cute.tile_to_shape(atom_D, (self.bm, D, QS), (0, 1, 2))
            # dS^T: (keys, queries), queries contiguous (the accumulator's row-major order);
            # ds_stages 2: a stage mode, a Q stage's
            sdS_layout = cute.tile_to_shape(atom_M, (BLOCK_N, self.bm), (0, 1))
            if const_expr(self.cfg.ds_stages > 1):
                sdS_layout = cute.tile_to_shape(atom_M, (BLOCK_N, self.bm, self.cfg.ds_stages),
                                                (0, 1, 2))
            # dQ partial, fp32 (bm, D): the TMA reduce boxes (dq_smem_layout)
            sdQ_layout = dq_smem_layout(D, self.bm)

            # wgmma. S^T = K Q^T and dP^T = V dO^T: M = keys (warpgroup w: keys 64w..),
            # N = queries, K = D; both operands K-major from smem
            tiled_mma_sdp = sm90.make_trivial_tiled_mma(
                dt, dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.K, Float32,
                atom_layout_mnk=(NUM_MMA_WG, 1, 1), tiler_mn=(64, self.bm))
            # dV += P^T dO and dK += dS^T Q: M = keys, N = D, K = queries; A from
            # registers (the S^T / dP^T accumulators), B = dO^T / Q^T (MN-major smem)
            tiled_mma_dkv = sm90.make_trivial_tiled_mma(
                dt, dt, warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN, Float32,
                atom_layout_mnk=(NUM_MMA_WG, 1, 1), tiler_mn=(64, D),
                a_source=warpgroup.OperandSource.RMEM)
            # dQ = dS K (dq_mma)
            tiled_mma_dq = dq_mma(dt, D, self.bm, self.dq_t)

            # TMA atoms: K, V, Q, dO loads; the dQ reduce-add
            g2s = cpasync.CopyBulkTensorTileG2SOp()
            tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(g2s, mK, sK_box, (BLOCK_N, D), 1)
            tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(g2s, mV, sV_box, (BLOCK_N, D), 1)
            tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(
                g2s, mQ, cute.select(sQ_layout, mode=[0, 1]), (self.bm, D), 1)
            tma_atom_dO, tma_dO = cpasync.make_tiled_tma_atom(
                g2s, mdO, cute.select(sdO_layout, mode=[0, 1]), (self.bm, D), 1)
            tma_atom_dQ, tma_dQ = cpasync.make_tiled_tma_atom(
                cpasync.CopyReduceBulkTensorTileS2GOp(), mdQacc, sdQ_layout, (self.bm, D), 1)
            self.bytes_KV = cute.size_in_bytes(dt, sK_box)
            self.bytes_Q = cute.size_in_bytes(dt, cute.select(sQ_layout, mode=[0, 1]))

            @cute.struct
            class SharedStorage:
                mbar_KV: cute.struct.MemRange[cutlass.Int64, 2 * KS]
                mbar_Q: cute.struct.MemRange[cutlass.Int64, 2 * QS]
                mbar_Tile: cute.struct.MemRange[cutlass.Int64, 2 * 2]
                sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
                sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]
                sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
                sdO: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sdO_layout)], 1024]
                sdS: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sdS_layout)], 1024]
                sdQ: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(sdQ_layout)], 1024]
                sLD: cute.struct.Align[
                    cute.struct.MemRange[Float32, math.prod(ld_shape(self.bm))], 16]

            # the host-side model (check_config) is the struct
            assert SharedStorage.size_in_bytes() == smem_bytes(D, self.cfg), \
                (SharedStorage.size_in_bytes(), smem_bytes(D, self.cfg))
            self.kernel(
                tma_Q, tma_K, tma_V, tma_dO, mdQacc if self.dq_flat else tma_dQ, mLSE,
                mDelta, mdK, mdV,
                mCuQ, mCuK, mTileB, mTileN, mNTiles, mSched,
                tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_dO, tma_atom_dQ,
                scale, L_q, n_slots, group,
                sK_layout, sV_layout, sQ_layout, sdO_layout, sdS_layout, sdQ_layout,
                tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq, SharedStorage, mdQ,
            ).launch(grid=[num_programs, 1, 1], block=[NUM_THREADS, 1, 1],
                     stream=stream, min_blocks_per_mp=1,
                     use_pdl=bwd_dependent(self.broadcast_q))

        # ------------------------------------------------------------------ the kernel
        @cute.kernel
        def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor,
                   mdO: cute.Tensor, mdQacc: cute.Tensor, mLSE: cute.Tensor,
                   mDelta: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
                   mCuQ: cute.Tensor, mCuK: cute.Tensor, mTileB: cute.Tensor,
                   mTileN: cute.Tensor, mNTiles: cute.Tensor, mSched: cute.Tensor,
                   tma_atom_Q: cute.CopyAtom, tma_atom_K: cute.CopyAtom,
                   tma_atom_V: cute.CopyAtom, tma_atom_dO: cute.CopyAtom,
                   tma_atom_dQ: cute.CopyAtom,
                   scale: Float32, L_q: Int32, n_slots: Int32, group: Int32,
                   sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
                   sQ_layout: cute.ComposedLayout, sdO_layout: cute.ComposedLayout,
                   sdS_layout: cute.ComposedLayout, sdQ_layout,
                   tiled_mma_sdp: cute.TiledMma, tiled_mma_dkv: cute.TiledMma,
                   tiled_mma_dq: cute.TiledMma, SharedStorage: cutlass.Constexpr,
                   mdQ: Optional[cute.Tensor]):
            warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            if warp_idx == 0:
                for a in (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_dO, tma_atom_dQ):
                    cpasync.prefetch_descriptor(a)

            smem = cutlass.utils.SmemAllocator()
            storage = smem.allocate(SharedStorage)

            # pipelines: producer = the load warp (TMA bytes complete the phase),
            # consumer = the 8 compute warps (one elected arrive per warp)
            load_warp = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
            mma_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, NUM_MMA_WG * 4)
            pipeline_kv = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_KV.data_ptr(), num_stages=self.kv_stages,
                producer_group=load_warp, consumer_group=mma_warps,
                tx_count=2 * self.bytes_KV, defer_sync=True)
            pipeline_q = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.mbar_Q.data_ptr(), num_stages=Q_STAGES,
                producer_group=load_warp, consumer_group=mma_warps,
                tx_count=2 * self.bytes_Q, defer_sync=True)
            # dynamic: the tile handoff, load warp -> compute and reduce_dq (two slots; the
            # tile ids themselves go through mSched, see tile_counter)
            pipeline_tile = pipeline.PipelineAsync.create(
                barrier_storage=storage.mbar_Tile.data_ptr(), num_stages=2,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 32),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                         128 * NUM_MMA_WG + 32),
                defer_sync=True)
            pipeline.pipeline_init_arrive()

            # sdQ: the TMA reads through the swizzled pointer (as sK), the compute threads
            # write through the element view (static offsets): the same bytes.
            # sVst: sV with the swizzle in the layout, for the store's 16-byte reads: their
            # row offsets fold into immediates (through the swizzled pointer: an XOR chain
            # per row, hoisted out of the tile loop, and spills).
            s = Smem(
                sK=storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner),
                sV=storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner),
                sQ=storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner),
                sdO=storage.sdO.get_tensor(sdO_layout.outer, swizzle=sdO_layout.inner),
                sdS=storage.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner),
                sdQ=storage.sdQ.get_tensor(sdQ_layout.outer, swizzle=sdQ_layout.inner),
                sdQst=storage.sdQ.get_tensor(dq_store_view(sdQ_layout)),
                sdQflat=storage.sdQ.get_tensor(
                    cute.make_layout((self.bm * self.D // NUM_MMA_WG, NUM_MMA_WG))),
                sVst=storage.sV.get_tensor(element_swizzled(sV_layout, self.dtype)),
                sLD=storage.sLD.get_tensor(cute.make_layout(ld_shape(self.bm))))

            sched = Sched(mTileB, mTileN, mNTiles, mCuQ, mCuK, L_q, mQ.shape[2], mK.shape[2],
                          group, mSched, pipeline_tile, n_slots, self.parts,
                          self.cfg.head_run)
            pipeline.pipeline_init_wait()
            # a programmatic dependent of the kernel ahead (the preprocess or a list kernel,
            # which trigger first; jagged.tiles.bwd_dependent): global memory only after
            # its writes; the postprocess may then launch under this kernel
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()

            if warp_idx < 4:
                cute.arch.setmaxregister_decrease(LOAD_REGS)
                if warp_idx == 0:
                    self.load(mQ, mK, mV, mdO, mLSE, mDelta, s,
                              (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_dO),
                              pipeline_kv, pipeline_q, sched)
                if warp_idx == 1:
                    self.reduce_dq(mdQacc, s, tma_atom_dQ, sched)
            else:
                cute.arch.setmaxregister_increase(MMA_REGS)
                tidx = cute.arch.thread_idx()[0] - 128
                self.compute(mdK, mdV, s, pipeline_kv, pipeline_q,
                             (tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq), tidx, scale,
                             sched, mdQ)

        # ------------------------------------------------------------------ schedule
        @cute.jit
        def window_keys(self, sched, coords):
            """The keys of a key window's sequences: at most BLOCK_N where the window holds
            them all (jagged.tiles.windows: whole sequences, not a block of a longer one;
            TLX's `_window_keys`); then a step's dQ is its rows' whole dQ, stored once in q's
            dtype (`store_dq`), not reduce-added."""
            return sched.mCuK[coords[6] + 1] - sched.mCuK[coords[0]]

        @cute.jit
        def tile_range(self, sched):
            """(first tile, step, tile count, dQ slot row, pinned KV head) of this CTA."""
            return tile_range(sched, self.broadcast_q)

        @cute.jit
        def kv_tile_coords(self, t: Int32, pinned: Int32, sched):
            """Tile t -> where it lives (schedule.kv_tile_coords); key windows:
            schedule.kv_window_coords, which also gives the window's last sequence."""
            if const_expr(self.windows):
                return kv_window_coords(t, sched, self.bm, BLOCK_N, self.causal)
            return kv_tile_coords(t, pinned, sched, self.bm, BLOCK_N, self.causal,
                                  self.broadcast_q)

        # ------------------------------------------------------------------ load
        @cute.jit
        def load(self, mQ, mK, mV, mdO, mLSE, mDelta, s: Smem, atoms, pipeline_kv,
                 pipeline_q, sched):
            """The load warp: per tile `load_kv`, then `load_q` for every step, with each
            step's lse / delta rows loaded a step ahead (the tile's first before the K/V
            wait)."""
            group = sched.group
            tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_dO = atoms
            lane = cute.arch.lane_idx()
            raw = cute.make_rmem_tensor(2 * self.ld_rows, Float32)   # the next step's rows
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                    self.kv_stages)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, Q_STAGES)
            t, step, n_tiles, slot_row, pinned = self.tile_range(sched)
            i = Int32(0)
            if const_expr(self.dynamic):
                publish_tile(sched.mSched, sched.pipeline_tile, t, i)
            while t < n_tiles:
                b, hk, n0, seq, m_lo, n_m = self.kv_tile_coords(t, pinned, sched)[:6]
                j0, j1 = part_steps(t, group * n_m, self.parts)   # the tile's, or its part's
                if j0 < j1:   # (then n_m > 0 and len_q > 0: the row clamp is in range)
                    self.load_lse_delta_rows(raw, mLSE, mDelta, lane, hk * group + j0 // n_m,
                                             seq, m_lo + (j0 % n_m) * self.bm)
                self.load_kv(mK, mV, s.sK, s.sV, tma_atom_K, tma_atom_V, pipeline_kv,
                             kv_state, seq.k_start + n0, hk)
                kv_state.advance()
                for j in cutlass.range(j0, j1, unroll=1):
                    h = hk * group + j // n_m
                    m0 = m_lo + (j % n_m) * self.bm
                    self.load_q(mQ, mdO, s, tma_atom_Q, tma_atom_dO, pipeline_q, q_state,
                                seq.q_start + m0, seq.out_start + m0, h, raw, lane, m0,
                                seq.len_q)
                    # the next step's rows (the last step reloads its own: no branch)
                    jn = cutlass.min(j + 1, j1 - 1)
                    self.load_lse_delta_rows(raw, mLSE, mDelta, lane, hk * group + jn // n_m,
                                             seq, m_lo + (jn % n_m) * self.bm)
                    q_state.advance()
                # the next tile, taken once this one's loads are issued
                i += 1
                t = next_tile(t, step, sched.mSched, self.dynamic)
                if const_expr(self.dynamic):
                    publish_tile(sched.mSched, sched.pipeline_tile, t, i)

        @cute.jit
        def load_kv(self, mK, mV, sK, sV, tma_atom_K, tma_atom_V, pipeline_kv, kv_state,
                    row, hk):
            """The tile's K and V ([BLOCK_N, D]) by TMA. Rows past the sequence belong to
            the next one (or are zero-filled past the tensor); compute masks them."""
            tKsK, tKgK = tma_tiles(tma_atom_K, sK, head_tile(mK, row, hk, BLOCK_N, self.D))
            tVsV, tVgV = tma_tiles(tma_atom_V, sV, head_tile(mV, row, hk, BLOCK_N, self.D))
            if const_expr(self.kv_stages > 1):
                tKsK, tVsV = tKsK[None, kv_state.index], tVsV[None, kv_state.index]
            pipeline_kv.producer_acquire(kv_state)
            bar = pipeline_kv.producer_get_barrier(kv_state)
            cute.copy(tma_atom_K, tKgK, tKsK, tma_bar_ptr=bar)
            cute.copy(tma_atom_V, tVgV, tVsV, tma_bar_ptr=bar)

        @cute.jit
        def load_q(self, mQ, mdO, s: Smem, tma_atom_Q, tma_atom_dO, pipeline_q, q_state,
                   q_row, o_row, h, raw, lane, m0, len_q):
            """Q and dO ([bm, D], TMA) of one step into the ring's next slot; the step's
            lse / delta rows in raw, finished by `mask_lse_delta`, go to the slot's sLD
            rows before the full barrier's arrive."""
            tQsQ, tQgQ = tma_tiles(tma_atom_Q, s.sQ, head_tile(mQ, q_row, h, self.bm, self.D))
            tdOsdO, tdOgdO = tma_tiles(tma_atom_dO, s.sdO,
                                       head_tile(mdO, o_row, h, self.bm, self.D))
            sLD = s.sLD
            # producer_acquire split: wait for the slot, write its lse / delta rows, then
            # the (elected) arrive.expect_tx. Its release, after the warp's bar.warp.sync,
            # publishes every lane's st.shared to the consumers, whose full-barrier wait
            # acquires; their empty-barrier arrive (after the step's last read) guards the
            # rows like Q and dO.
            pipeline_q.sync_object_empty.wait(q_state.index, q_state.phase)
            self.mask_lse_delta(raw, lane, m0, len_q)
            for e in cutlass.range_constexpr(self.ld_rows):
                # 80 rows: the last 16 in lanes 0-7 only
                if const_expr(e < 2 * (self.bm // 64)) or ld_row(lane, e) < self.bm:
                    sLD[ld_row(lane, e), 0, q_state.index] = raw[e]
                    sLD[ld_row(lane, e), 1, q_state.index] = raw[self.ld_rows + e]
            cute.arch.sync_warp()
            pipeline_q.sync_object_full.arrive(q_state.index, pipeline_q.producer_mask)
            bar = pipeline_q.producer_get_barrier(q_state)
            cute.copy(tma_atom_Q, tQgQ, tQsQ[None, q_state.index], tma_bar_ptr=bar)
            cute.copy(tma_atom_dO, tdOgdO, tdOsdO[None, q_state.index], tma_bar_ptr=bar)

        @cute.jit
        def load_lse_delta_rows(self, raw, mLSE, mDelta, lane, h, seq, m0):
            """Lane l loads lse, delta of the sequence's rows m0 + ld_row(l, e) into raw
            (lse e, delta ld_rows + e; rows 2l, 2l + 1 (128 rows: and 64 on), no branch:
            rows past the end read row len_q - 1, n_m > 0 implies len_q > 0;
            `mask_lse_delta` masks them). Staged in smem by the load warp a step ahead:
            loaded by compute at their use they were 46 % of the kernel's time at llm."""
            for e in cutlass.range_constexpr(self.ld_rows):
                row = seq.out_start + cutlass.min(ld_row(lane, e, m0), seq.len_q - 1)
                raw[e] = mLSE[h, row]
                raw[self.ld_rows + e] = mDelta[h, row]

        # role: load
        @cute.jit
        def mask_lse_delta(self, raw, lane, m0, len_q):
            """raw (lane's rows m0 + ld_row(lane, e): lse e, delta ld_rows + e) ->
            lse*log2e (+inf, so P = 0, past the sequence or where lse = -inf) and delta
            (0 past the end)."""
            E = self.ld_rows
            for e in cutlass.range_constexpr(E):
                ok = ld_row(lane, e, m0) < len_q
                lse = raw[e]
                lse = lse * LOG2E if lse != -Float32.inf else Float32.inf
                raw[e] = lse if ok else Float32.inf
                raw[E + e] = raw[E + e] if ok else Float32(0.0)

        # ------------------------------------------------------------------ compute
        @cute.jit
        def compute(self, mdK, mdV, s: Smem, pipeline_kv, pipeline_q, mmas, tidx, scale,
                    sched, mdQ=None):
            """The two compute warpgroups: every step of every tile, then `store`. mdQ
            (key windows): dQ, where an owned window stores a step's (`store_dq`)."""
            D = self.D
            tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq = mmas
            group = sched.group
            scale_log2 = scale * LOG2E
            wg = cute.arch.make_warp_uniform(tidx // 128)
            sQ, sK, sV, sdO, sdS = s.sQ, s.sK, s.sV, s.sdO, s.sdS
            # transposed (MN-major) operand views
            sQt = transposed(sQ, (D, self.bm, Q_STAGES), (1, 0, 2))
            sdOt = transposed(sdO, (D, self.bm, Q_STAGES), (1, 0, 2))
            sKt = transposed(sK, (D, BLOCK_N), (1, 0))
            if const_expr(self.kv_stages > 1):
                sKt = transposed(sK, (D, BLOCK_N, self.kv_stages), (1, 0, 2))
            sdSt = transposed(sdS, (self.bm, BLOCK_N), (1, 0))          # dS (queries, keys)
            if const_expr(self.cfg.ds_stages > 1):
                sdSt = transposed(sdS, (self.bm, BLOCK_N, self.cfg.ds_stages), (1, 0, 2))
            # S^T = K Q^T, dP^T = V dO^T
            wg_sdp = tiled_mma_sdp.get_slice(wg * 128)
            tSrK = wg_sdp.make_fragment_A(wg_sdp.partition_A(sK))
            tSrQ = wg_sdp.make_fragment_B(wg_sdp.partition_B(sQ))
            tPrV = wg_sdp.make_fragment_A(wg_sdp.partition_A(sV))
            # one 64-row M block a warpgroup: warpgroup w reads V rows 64w.. only (`store`
            # stages its dK, dV there)
            assert cute.size(tPrV, mode=[1]) == 1
            tPrdO = wg_sdp.make_fragment_B(wg_sdp.partition_B(sdO))
            shape_S = wg_sdp.partition_shape_C((BLOCK_N, self.bm))
            # dV += P^T dO, dK += dS^T Q (A from registers)
            wg_dkv = tiled_mma_dkv.get_slice(wg * 128)
            tdVrdOt = wg_dkv.make_fragment_B(wg_dkv.partition_B(sdOt))
            tdKrQt = wg_dkv.make_fragment_B(wg_dkv.partition_B(sQt))
            tdVrPt = wg_dkv.make_fragment_A(wg_dkv.partition_shape_A((BLOCK_N, self.bm)))
            tdKrdSt = wg_dkv.make_fragment_A(wg_dkv.partition_shape_A((BLOCK_N, self.bm)))
            acc_dK = cute.make_rmem_tensor(wg_dkv.partition_shape_C((BLOCK_N, D)), Float32)
            acc_dV = cute.make_rmem_tensor(wg_dkv.partition_shape_C((BLOCK_N, D)), Float32)
            # dQ = dS K
            wg_dq = tiled_mma_dq.get_slice(wg * 128)
            if const_expr(not self.dq_t):
                tdQrdS = wg_dq.make_fragment_A(wg_dq.partition_A(sdSt))
                tdQrKt = wg_dq.make_fragment_B(wg_dq.partition_B(sKt))
                shape_dQ = wg_dq.partition_shape_C((self.bm, D))
                if const_expr(not self.dq_flat):
                    tdQsdQ = tiled_mma_dq.get_slice(tidx).partition_C(s.sdQst)
            else:
                # dQ^T: its (column, row) elements stored transposed into the same smem
                # partial (one STS.32 each; the swizzle spreads a warp's over all banks)
                tdQrKt = wg_dq.make_fragment_A(wg_dq.partition_A(sKt))
                tdQrdS = wg_dq.make_fragment_B(wg_dq.partition_B(sdSt))
                shape_dQ = wg_dq.partition_shape_C((D, self.bm))
                if const_expr(not self.dq_flat):
                    tdQsdQ = tiled_mma_dq.get_slice(tidx).partition_C(
                        transposed(s.sdQst, (D, self.bm), (1, 0)))
            if const_expr(self.dq_flat):
                # the warpgroup's buffer in the accumulator's register order
                tdQsdQ = flat_copy(128, NUM_MMA_WG).get_slice(tidx).partition_D(s.sdQflat)
            # dS^T registers -> smem (stmatrix)
            r2s_dS = cute.make_tiled_copy_C(
                cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False,
                                                                     num_matrices=4),
                                    self.dtype),
                tiled_mma_sdp)
            thr_r2s_dS = r2s_dS.get_slice(tidx)
            tdSsdS = thr_r2s_dS.partition_D(sdS)
            # (key, query) of every S^T accumulator element
            tScS = acc_rows_cols(tiled_mma_sdp.get_slice(tidx).partition_C(
                cute.make_identity_tensor((BLOCK_N, self.bm))))
            mma = Operands(tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq, shape_S, shape_dQ,
                           tSrK, tSrQ, tPrV, tPrdO, tdVrdOt, tdKrQt, tdVrPt, tdKrdSt, tdQrdS,
                           tdQrKt, acc_dK, acc_dV, tdQsdQ, r2s_dS, thr_r2s_dS, tdSsdS, tScS)
            cols = None
            dq_out = None
            if const_expr(self.windows):
                # key windows: the query rows [q_lo, q_lo + q_w) each of this thread's
                # key columns meets, counted from the window's first row (`col_ranges`)
                cols = (cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Int32),
                        cute.make_rmem_tensor(cute.size(tScS, mode=[0]), Int32))
                # an owned window's dQ (`store_dq`)
                dq_out = (mdQ, tidx, scale)

            lane = cute.arch.lane_idx()
            # byte offset in sLD of this thread's first query column (2 (lane % 4): wgmma
            # C layout) in the previous step's Q stage; flipped to the step's stage as the
            # step begins, so one register is all the step's reads need (an address formed
            # per step from the stage index and a per-thread column base, or the flip after
            # the step, keep two through the step's register peak: 12-32 B of spills,
            # causal / broadcast-Q)
            assert Q_STAGES == 2
            ld_off = ld_thread_offset(lane, 1, self.bm)
            kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                    self.kv_stages)
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, Q_STAGES)
            t, step, n_tiles, slot_row, pinned = self.tile_range(sched)
            i = Int32(0)
            if const_expr(self.dynamic):
                t = fetch_tile(sched.mSched, sched.pipeline_tile, t, step, i, self.dynamic)
            while t < n_tiles:
                coords = self.kv_tile_coords(t, pinned, sched)
                b, hk, n0, seq, m_lo, n_m = coords[:6]
                keys = None
                m_from = self.unmasked_from(seq, n0 + wg * (BLOCK_N // NUM_MMA_WG))
                if const_expr(self.windows):
                    self.col_ranges(sched, seq, b, coords[6], tScS, cols)
                    keys = self.window_keys(sched, coords)
                acc_dK.fill(0.0)
                acc_dV.fill(0.0)
                j0, j1 = part_steps(t, group * n_m, self.parts)
                jm = m_lo * 0     # step j's Q block (j % n_m), carried; the head is not read
                if const_expr(self.parts > 1):
                    jm = j0 % cutlass.max(n_m, 1)
                pipeline_kv.consumer_wait(kv_state)
                kv, kv_smem = None, (sV, s.sVst)   # the tile's K/V stage, its sV views
                if const_expr(self.kv_stages > 1):
                    kv = kv_state.index
                    kv_smem = (sV[None, None, kv], s.sVst[None, None, kv])
                split = const_expr(self.bm == 128 and self.causal
                                   and not (self.windows or self.broadcast_q))
                if const_expr(split):
                    # causal 128-row steps: per query head its masked steps, then those that
                    # need no mask, each run its own loop (TLX's compute)
                    n_m1 = cutlass.max(n_m, 1)
                    jm_from = cutlass.min(
                        (cutlass.max(m_from - m_lo, 0) + self.bm - 1) // self.bm, n_m1)
                    jj = j0
                    while jj < j1:
                        hb = jj - jj % n_m1  # the head's first step
                        seg = cutlass.min(j1, hb + n_m1)
                        mend = cutlass.min(seg, cutlass.max(jj, hb + jm_from))
                        for j in cutlass.range(jj, mend, unroll=1):
                            ld_off = ld_off ^ ld_flip(self.bm)
                            self.compute_step(mma, q_state, pipeline_q, n0, m_lo + jm * self.bm,
                                              seq, scale_log2, (s.sLD, ld_off), kv)
                            jm = Int32(0) if jm + 1 == n_m else jm + 1
                            q_state.advance()
                        for j in cutlass.range(mend, seg, unroll=1):
                            ld_off = ld_off ^ ld_flip(self.bm)
                            self.compute_step(mma, q_state, pipeline_q, n0, m_lo + jm * self.bm,
                                              seq, scale_log2, (s.sLD, ld_off), kv,
                                              unmasked=True)
                            jm = Int32(0) if jm + 1 == n_m else jm + 1
                            q_state.advance()
                        jj = seg
                for j in cutlass.range(j0, j0 if split else j1, unroll=1):
                    ld_off = ld_off ^ ld_flip(self.bm)
                    step_dq = None
                    if const_expr(self.windows):  # + (head, window keys, first row, window)
                        step_dq = dq_out + (hk * group + j // n_m, keys, m_lo + jm * self.bm,
                                            seq)
                    self.compute_step(mma, q_state, pipeline_q, n0, m_lo + jm * self.bm,
                                      seq, scale_log2, (s.sLD, ld_off), kv, cols, step_dq,
                                      m_from)
                    jm = Int32(0) if jm + 1 == n_m else jm + 1
                    q_state.advance()
                # ---- store dK, dV (a split tile: add them)
                if const_expr(self.parts > 1):
                    self.store_add(mdK, mdV, acc_dK, acc_dV, seq, n0, hk, scale,
                                   tiled_mma_dkv, tidx)
                else:
                    self.store(mdK, mdV, acc_dK, acc_dV, seq, n0, hk, scale, kv_smem,
                               tiled_mma_dkv, tidx)
                # the store wrote sV (generic proxy; store_add does not): order it before
                # the next TMA write into this stage (two stages: two tiles on; the load
                # warp fills the other stage meanwhile)
                cute.arch.fence_view_async_shared()
                pipeline_kv.consumer_release(kv_state)
                kv_state.advance()
                i += 1
                t = fetch_tile(sched.mSched, sched.pipeline_tile, t, step, i, self.dynamic)

        # role: compute
        @cute.jit
        def col_ranges(self, sched, seq, s_first, s_last, tScS, cols):
            """Key windows, once a tile: the packed query rows each of this thread's key
            columns meets, into cols = (q_lo, q_w): rows [q_lo, q_lo + q_w) relative to
            the window's first row; its own sequence's (found among s_first..s_last over
            the key offsets), the causal cut included; none for the columns past the
            window's real ones. The mask's geometry (`window_keep`)."""
            q_lo, q_w = cols
            keys = cute.size(q_lo)
            for r in cutlass.range_constexpr(keys):
                q_lo[r] = s_first                      # column r's sequence, counted up
            # the columns of a thread share each pass's loads of the offsets
            for j0 in cutlass.range(s_first + 1, s_last + 1, ROW_SEQ_CHUNK, unroll=1):
                for r in cutlass.range_constexpr(keys):
                    q_lo[r] = row_seq_chunk(sched.mCuK, j0, s_last,
                                            seq.k_start + tScS[r, 0][0], q_lo[r])
            for r in cutlass.range_constexpr(keys):
                lo, hi = col_q_range(sched.mCuQ, sched.mCuK, q_lo[r],
                                     seq.k_start + tScS[r, 0][0], self.causal)
                hi = hi if tScS[r, 0][0] < seq.len_k else lo
                q_lo[r] = lo - seq.q_start
                q_w[r] = cutlass.max(hi - lo, 0)

        @cute.jit
        def read_ld(self, ld, x, ncol):
            """lse*log2e (x = 0) or delta (x = 1) of this thread's ncol query columns
            (finished by the load warp: `mask_lse_delta`). ld = (sLD, offset of the
            thread's first column in this step's stage): column c is 8 (c // 2) + c % 2
            further (`ld_column`)."""
            sLD, off = ld
            # the stage's rows from a byte address (an element index costs a shift and a
            # register)
            rows = cute.make_tensor(
                cute.make_ptr(Float32, sLD.iterator.toint() + off, cute.AddressSpace.smem,
                              assumed_align=8), cute.make_layout(2 * self.bm))
            v = cute.make_rmem_tensor(ncol, Float32)
            for c in cutlass.range_constexpr(ncol):
                v[c] = rows[x * self.bm + ld_column(c)]
            return v

        @cute.jit
        def compute_step(self, mma: Operands, q_state, pipeline_q, n0, m0, seq, scale_log2,
                         ld, kv=None, cols=None, dq_out=None, m_from=None, unmasked=False):
            """One (KV tile, Q block) step in the transposed form: dK, dV accumulate in
            registers; the unscaled dQ partial goes to smem for `reduce_dq`. ld: (sLD,
            offset), `read_ld`. kv: the tile's K/V stage (None: one stage). cols: key
            windows' row ranges (`col_ranges`); dq_out: key windows' dQ (`store_dq`);
            m_from: the first row whose steps need no mask (`unmasked_from`)."""
            if const_expr(kv is not None):
                mma = replaced(mma, tSrK=mma.tSrK[None, None, None, kv],
                               tPrV=mma.tPrV[None, None, None, kv],
                               tdQrKt=mma.tdQrKt[None, None, None, kv])
            if const_expr(self.bm == 128):
                self.compute_step_128(mma, q_state, pipeline_q, n0, m0, seq, scale_log2, ld,
                                      cols, dq_out, unmasked)
            else:
                self.compute_step_64(mma, q_state, pipeline_q, n0, m0, seq, scale_log2, ld,
                                     cols, dq_out, m_from)

        @cute.jit
        def compute_step_64(self, mma: Operands, q_state, pipeline_q, n0, m0, seq, scale_log2,
                            ld, cols=None, dq_out=None, m_from=None):
            """compute_step at 64 query rows: S^T and dP^T issued together. The dP^T wgmma
            starts from -delta, so it returns dP^T - delta and no delta register lives
            through the step's peak (dS^T); lse is read after the S^T wait, at use (read
            earlier, or delta after the dP^T wait: 8-64 B of spills at D = 128, causal /
            broadcast-Q)."""
            s = q_state.index
            pipeline_q.consumer_wait(q_state)
            acc_S = cute.make_rmem_tensor(mma.shape_S, Float32)
            acc_dP = cute.make_rmem_tensor(mma.shape_S, Float32)
            wgmma(mma.tiled_mma_sdp, acc_S, mma.tSrK, mma.tSrQ[None, None, None, s],  # S^T = K Q^T
                  zero_init=True, wait=-1)
            ncol = cute.size(mma.tScS, mode=[1])
            self.minus_delta(acc_dP, ld, ncol)
            wgmma(mma.tiled_mma_sdp, acc_dP, mma.tPrV, mma.tPrdO[None, None, None, s],  # dP^T
                  zero_init=False, wait=-1)                                               # - delta
            warpgroup.wait_group(1)
            lse2 = self.read_ld(ld, 0, ncol)
            skip = const_expr(self.D == 128 and self.causal and not self.dq_t)  # (probs)
            St = self.probs(acc_S, lse2, mma.tScS, n0, m0, seq, scale_log2, cols,
                            m_from if skip else None)
            dPt = acc_rows_cols(acc_dP)
            if const_expr(not self.dq_t):
                mma.tdVrPt.store(acc_as_operand_a(acc_S).load().to(self.dtype))
                wgmma(mma.tiled_mma_dkv, mma.acc_dV, mma.tdVrPt,                    # dV += P^T dO
                      mma.tdVrdOt[None, None, None, s], zero_init=False, wait=-1)
                warpgroup.wait_group(1)
            else:
                warpgroup.wait_group(0)
            # dS^T = P^T (dP^T - delta)
            for r in cutlass.range_constexpr(cute.size(dPt, mode=[0])):
                for c in cutlass.range_constexpr(cute.size(dPt, mode=[1])):
                    dPt[r, c] = St[r, c] * dPt[r, c]
            if const_expr(self.dq_t):
                # 80 rows: P^T's operand formed once dS^T is (the S^T accumulator free):
                # before, S^T, dP^T, P^T and dK / dV overfill the registers
                mma.tdVrPt.store(acc_as_operand_a(acc_S).load().to(self.dtype))
                wgmma(mma.tiled_mma_dkv, mma.acc_dV, mma.tdVrPt,                    # dV += P^T dO
                      mma.tdVrdOt[None, None, None, s], zero_init=False, wait=-1)
            self.dk_dq(mma, acc_dP, q_state, pipeline_q, dq_out)

        @cute.jit
        def compute_step_128(self, mma: Operands, q_state, pipeline_q, n0, m0, seq, scale_log2,
                             ld, cols=None, dq_out=None, unmasked=False):
            """compute_step at 128 query rows (D = 64). S^T / dP^T are [64, 128] fp32 (64
            registers each) beside dK, dV (32 each); lse / delta are read at their use.
            Config.sdp_together (the default, but not at broadcast-Q, whose causal fp16
            build would spill 10 B): FA4's order, S^T and dP^T issued together, P^T under
            dP^T, dS^T, then dV beside dQ and dK. Otherwise the dots one after the other,
            as the TLX twin's: S^T, P^T, dV (its P^T operand dead before dP^T is issued),
            then dP^T (from -delta), dS^T, dK, dQ."""
            s = q_state.index
            ncol = cute.size(mma.tScS, mode=[1])
            pipeline_q.consumer_wait(q_state)
            acc_S = cute.make_rmem_tensor(mma.shape_S, Float32)
            acc_dP = cute.make_rmem_tensor(mma.shape_S, Float32)
            if const_expr(not self.sdp_together):
                wgmma(mma.tiled_mma_sdp, acc_S, mma.tSrK, mma.tSrQ[None, None, None, s],
                      zero_init=True, wait=0)                                      # S^T = K Q^T
                St = self.probs(acc_S, self.read_ld(ld, 0, ncol), mma.tScS, n0, m0, seq,
                                scale_log2, cols, unmasked=unmasked)
                mma.tdVrPt.store(acc_as_operand_a(acc_S).load().to(self.dtype))
                wgmma(mma.tiled_mma_dkv, mma.acc_dV, mma.tdVrPt,                    # dV += P^T dO
                      mma.tdVrdOt[None, None, None, s], zero_init=False, wait=0)
                self.minus_delta(acc_dP, ld, ncol)
                wgmma(mma.tiled_mma_sdp, acc_dP, mma.tPrV, mma.tPrdO[None, None, None, s],
                      zero_init=False, wait=0)                                     # dP^T - delta
            else:
                wgmma(mma.tiled_mma_sdp, acc_S, mma.tSrK, mma.tSrQ[None, None, None, s],
                      zero_init=True, wait=-1)                                     # S^T = K Q^T
                self.minus_delta(acc_dP, ld, ncol)
                wgmma(mma.tiled_mma_sdp, acc_dP, mma.tPrV, mma.tPrdO[None, None, None, s],
                      zero_init=False, wait=-1)                                    # dP^T - delta
                warpgroup.wait_group(1)
                St = self.probs(acc_S, self.read_ld(ld, 0, ncol), mma.tScS, n0, m0, seq,
                                scale_log2, cols, unmasked=unmasked)
                mma.tdVrPt.store(acc_as_operand_a(acc_S).load().to(self.dtype))
                warpgroup.wait_group(0)
            dPt = acc_rows_cols(acc_dP)
            for r in cutlass.range_constexpr(cute.size(dPt, mode=[0])):               # dS^T
                for c in cutlass.range_constexpr(cute.size(dPt, mode=[1])):
                    dPt[r, c] = St[r, c] * dPt[r, c]
            if const_expr(self.sdp_together):
                wgmma(mma.tiled_mma_dkv, mma.acc_dV, mma.tdVrPt,                    # dV += P^T dO
                      mma.tdVrdOt[None, None, None, s], zero_init=False, wait=-1)
            self.dk_dq(mma, acc_dP, q_state, pipeline_q, dq_out)

        @cute.jit
        def minus_delta(self, acc_dP, ld, ncol):
            """The dP^T accumulator set to -delta of its query columns (read from sLD,
            `read_ld`), so its wgmma returns dP^T - delta. Two distinct values (0 - x is
            not -x at x = +0): one accumulator register each, else a copy lands after
            wgmma.fence and ptxas injects a wait for the S^T wgmma before issuing the dP^T
            one (C7517)."""
            delta = self.read_ld(ld, 1, ncol)
            dPt = acc_rows_cols(acc_dP)
            assert cute.size(dPt, mode=[0]) == 2
            for c in cutlass.range_constexpr(ncol):
                dPt[0, c] = -delta[c]
                dPt[1, c] = Float32(0.0) - delta[c]

        @cute.jit
        def probs(self, acc_S, lse2, tScS, n0, m0, seq, scale_log2, cols=None, m_from=None,
                  unmasked=False):
            """P^T = exp2(S^T * scale*log2e - lse*log2e) in place, masked to 0 (keys past
            the sequence; causal: right of the diagonal; key windows: rows outside each
            column's range, `window_keep`) on the steps that need it, as TLX: over key
            windows or without m_from every step, else those whose first row m0 is below
            m_from (`unmasked_from`); returns the (key, query) view. Only D = 128's causal
            64-row step takes m_from: in the 80- and 128-row steps the branch makes ptxas
            serialize every wgmma (its in-place writes to the S^T accumulator), and D =
            64's 64-row step spills 60 B with it. Causal, one compare a score: a row inside
            the sequence sees no key past it (key <= row + len_k - len_q < len_k), and a
            row past it has P = 0 (its lse loads as +inf), as in TLX's _causal_select."""
            St = acc_rows_cols(acc_S)
            if const_expr(unmasked):  # a step that needs no mask (compute's causal split)
                for r in cutlass.range_constexpr(cute.size(St, mode=[0])):
                    for c in cutlass.range_constexpr(cute.size(St, mode=[1])):
                        St[r, c] = cute.math.exp2(St[r, c] * scale_log2 - lse2[c],
                                                  fastmath=True)
            elif const_expr(self.windows or m_from is None):
                for r in cutlass.range_constexpr(cute.size(St, mode=[0])):
                    key = n0 + tScS[r, 0][0]
                    if const_expr(self.windows):
                        lo, width = self.window_range(cols, r, m0)
                    for c in cutlass.range_constexpr(cute.size(St, mode=[1])):
                        p = cute.math.exp2(St[r, c] * scale_log2 - lse2[c], fastmath=True)
                        if const_expr(self.windows):
                            keep = self.window_keep(tScS[0, c][1], lo, width)
                        elif const_expr(self.causal):  # key < len_k follows (above)
                            keep = seq.causal_visible(m0 + tScS[0, c][1], key)
                        else:
                            keep = key < seq.len_k
                        St[r, c] = p if keep else Float32(0.0)
            else:
                for r in cutlass.range_constexpr(cute.size(St, mode=[0])):
                    for c in cutlass.range_constexpr(cute.size(St, mode=[1])):
                        St[r, c] = cute.math.exp2(St[r, c] * scale_log2 - lse2[c],
                                                  fastmath=True)
                if m0 < m_from:
                    for r in cutlass.range_constexpr(cute.size(St, mode=[0])):
                        key = n0 + tScS[r, 0][0]
                        for c in cutlass.range_constexpr(cute.size(St, mode=[1])):
                            if const_expr(self.causal):
                                keep = seq.causal_visible(m0 + tScS[0, c][1], key)
                            else:
                                keep = key < seq.len_k
                            St[r, c] = St[r, c] if keep else Float32(0.0)
            return St

        @cute.jit
        def unmasked_from(self, seq, nc0):
            """The first query row from which a step's rows see all of this warpgroup's
            keys [nc0, nc0 + BLOCK_N // NUM_MMA_WG): causal, the first that sees the last
            of them; none where they run past the sequence. Steps from there need no mask
            (rows past the sequence need none: their lse loads as +inf, P = 0)."""
            end = nc0 + BLOCK_N // NUM_MMA_WG
            first = Int32(0)
            if const_expr(self.causal):
                first = seq.causal_q_start(end - 1)
            return first if end <= seq.len_k else seq.len_q + 1

        @cute.jit
        def window_range(self, cols, r, m0):
            """Key windows: (first query column of the step that key row r meets, how
            many), from `col_ranges`."""
            q_lo, q_w = cols
            return q_lo[r] - m0, cutlass.Uint32(q_w[r])

        @cute.jit
        def window_keep(self, q, lo, width):
            """lo <= q < lo + width as one unsigned compare (q < lo wraps around); the
            bitcast makes it unsigned (arithmetic on a coordinate stays signed)."""
            return Int32(q - lo).bitcast(cutlass.Uint32) < width

        @cute.jit
        def dk_dq(self, mma: Operands, acc_dP, q_state, pipeline_q, dq_out=None):
            """The step's end, from dS^T in acc_dP: dS^T -> smem, dQ = dS K, then dK +=
            dS^T Q under the dQ partial's hand-over to reduce_dq (the FA3/FA4 order: wait
            for dQ only; llm 24.48 -> 22.81 ms against dK first and a wait for both). An
            owned key window (dq_out) stores its dQ instead; the hand-over stays, and
            reduce_dq adds nothing."""
            s = q_state.index
            mma.tdKrdSt.store(acc_as_operand_a(acc_dP).load().to(self.dtype))
            rdS = cute.make_rmem_tensor_like(acc_dP, self.dtype)
            rdS.store(acc_dP.load().to(self.dtype))
            tdSsdS, tdQrdS = mma.tdSsdS, mma.tdQrdS
            if const_expr(self.cfg.ds_stages > 1):
                # the step's own buffer: the other warpgroup's dQ MMA that read it two steps
                # ago finished before its last barrier below, which this one passed
                tdSsdS = tdSsdS[None, None, None, s]
                tdQrdS = tdQrdS[None, None, None, s]
            else:
                # dS^T -> smem, once both warpgroups' previous dQ wgmmas are done reading it
                cute.arch.barrier(barrier_id=PDS_BARRIER, number_of_threads=NUM_MMA_WG * 128)
            cute.copy(mma.r2s_dS, mma.thr_r2s_dS.retile(rdS), tdSsdS)
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=PDS_BARRIER, number_of_threads=NUM_MMA_WG * 128)
            acc_dQ = cute.make_rmem_tensor(mma.shape_dQ, Float32)
            if const_expr(self.dq_t):
                warpgroup.wait_group(0)    # dV: its P^T operand's registers free for dQ^T
                wgmma(mma.tiled_mma_dq, acc_dQ, mma.tdQrKt, tdQrdS, zero_init=True,  # dQ^T =
                      wait=-1)                                                     # K^T dS^T
            else:
                wgmma(mma.tiled_mma_dq, acc_dQ, tdQrdS, mma.tdQrKt, zero_init=True,  # dQ = dS K
                      wait=-1)
            # wait for dQ (and dV) only, so dK runs under the store
            wgmma(mma.tiled_mma_dkv, mma.acc_dK, mma.tdKrdSt,                      # dK += dS^T Q
                  mma.tdKrQt[None, None, None, s], zero_init=False, wait=1)
            # ---- hand the dQ partial to reduce_dq
            if const_expr(self.dq_flat):   # this warpgroup's buffer, its own barriers
                assert dq_out is None      # key windows never take it (check_config)
                wg = cute.arch.make_warp_uniform(cute.arch.warp_idx() // 4 - 1)
                cute.arch.barrier(barrier_id=DQ_EMPTY_WG + wg, number_of_threads=DQ_WG_THREADS)
                cute.autovec_copy(cute.make_tensor(acc_dQ.iterator,
                                                   cute.make_layout(mma.tdQsdQ.shape)),
                                  mma.tdQsdQ)
                cute.arch.fence_view_async_shared()
                cute.arch.barrier_arrive(barrier_id=DQ_FULL_WG + wg,
                                         number_of_threads=DQ_WG_THREADS)
            else:
                cute.arch.barrier(barrier_id=DQ_EMPTY_BARRIER,
                                  number_of_threads=DQ_BARRIER_THREADS)
                if const_expr(dq_out is None):
                    mma.tdQsdQ.store(acc_dQ.load())
                else:
                    if dq_out[4] > BLOCK_N:    # a block of a longer sequence: reduce-added
                        mma.tdQsdQ.store(acc_dQ.load())
                    else:                      # owned: its rows' whole dQ
                        self.store_dq(mma, acc_dQ, dq_out)
                cute.arch.fence_view_async_shared()
                cute.arch.barrier_arrive(barrier_id=DQ_FULL_BARRIER,
                                         number_of_threads=DQ_BARRIER_THREADS)
            warpgroup.wait_group(0)        # dK: done reading Q (smem) and dS^T (registers)
            pipeline_q.consumer_release(q_state)

        @cute.jit
        def store_dq(self, mma: Operands, acc_dQ, dq_out):
            """An owned key window's step: this thread's part of its dQ (the (bm, D) block
            of head h from row m0), times the softmax scale, in q's dtype, the window's
            rows only. dq_out: (mdQ, the compute thread index, scale, h, the window's keys,
            m0, its SeqlenInfo). TLX's `_store_dq`."""
            mdQ, tidx, scale, h, _, m0, seq = dq_out
            thr_dq = mma.tiled_mma_dq.get_slice(tidx)
            tdQcdQ = thr_dq.partition_C(cute.make_identity_tensor((self.bm, self.D)))
            tdQgdQ = thr_dq.partition_C(head_tile(mdQ, seq.q_start + m0, h, self.bm, self.D))
            rows = seq.len_q - m0
            # the wgmma C fragment ((2 columns, 2 rows 8 apart, column groups), 1, 1): a
            # column pair is one 4-byte store, kept where its row is the window's
            assert cute.size(acc_dQ, mode=[1]) == 1 and cute.size(acc_dQ, mode=[2]) == 1
            pair = cute.make_rmem_tensor((2,), self.dtype)
            for j in cutlass.range_constexpr(cute.size(acc_dQ, mode=[0, 1])):
                for k in cutlass.range_constexpr(cute.size(acc_dQ, mode=[0, 2])):
                    if tdQcdQ[(0, j, k), 0, 0][0] < rows:
                        for c in cutlass.range_constexpr(2):
                            pair[c] = (acc_dQ[(c, j, k), 0, 0] * scale).to(self.dtype)
                        cute.autovec_copy(pair, tdQgdQ[(None, j, k), 0, 0])

        # ------------------------------------------------------------------ reduce_dq
        @cute.jit
        def reduce_dq(self, mdQacc, s: Smem, tma_atom_dQ, sched):
            """Reduce-add each step's dQ partial ([bm, D] fp32, smem) into the fp32
            accumulator with TMA bulk reduces (smem -> cp.reduce.async.bulk.tensor.add).
            Rows past the sequence carry exact zeros (P = 0 there), so the whole box can
            be added; TMA clips rows past the tensor. dq_flat: `reduce_flat`."""
            group = sched.group
            if const_expr(not self.dq_flat):   # the buffer starts empty
                cute.arch.barrier_arrive(barrier_id=DQ_EMPTY_BARRIER,
                                         number_of_threads=DQ_BARRIER_THREADS)
            t, step, n_tiles, slot_row, pinned = self.tile_range(sched)
            i = Int32(0)
            if const_expr(self.dynamic):
                t = fetch_tile(sched.mSched, sched.pipeline_tile, t, step, i, self.dynamic)
            while t < n_tiles:
                coords = self.kv_tile_coords(t, pinned, sched)
                b, hk, n0, seq, m_lo, n_m = coords[:6]
                add = True
                if const_expr(self.windows):  # an owned window stores its dQ itself
                    add = self.window_keys(sched, coords) > BLOCK_N
                j0, j1 = part_steps(t, group * n_m, self.parts)
                for j in cutlass.range(j0, j1, unroll=1):
                    h = hk * group + j // n_m
                    m0 = m_lo + (j % n_m) * self.bm
                    if const_expr(self.dq_flat):   # no key windows: every step adds
                        self.reduce_flat(mdQacc, s.sdQflat, sched.H, h,
                                         flat_block(seq.q_start, b, m0, self.bm))
                    else:
                        tsdQ, tgdQ = tma_tiles(tma_atom_dQ, s.sdQ, head_tile(
                            mdQacc, slot_row + seq.q_start + m0, h, self.bm, self.D))
                        cute.arch.barrier(barrier_id=DQ_FULL_BARRIER,
                                          number_of_threads=DQ_BARRIER_THREADS)
                        if add:
                            # the whole warp calls: the TMA op elects one issuing lane
                            cute.copy(tma_atom_dQ, tsdQ, tgdQ)
                            cute.arch.cp_async_bulk_commit_group()
                            cute.arch.cp_async_bulk_wait_group(0, read=True)
                        cute.arch.barrier_arrive(barrier_id=DQ_EMPTY_BARRIER,
                                                 number_of_threads=DQ_BARRIER_THREADS)
                i += 1
                t = fetch_tile(sched.mSched, sched.pipeline_tile, t, step, i, self.dynamic)
            cute.arch.cp_async_bulk_wait_group(0, read=False)

        @cute.jit
        def reduce_flat(self, mdQacc, sdQflat, H, h, block):
            """Config.dq_flat's step: each warpgroup's partial (bm x D / 2 floats in its
            accumulator's register order, `flat_copy`) reduce-added by one 1-D bulk add
            into its run of the block-padded accumulator: the step's block
            (jagged.tiles.flat_block), then its query head h, then the warpgroup (bm x D
            floats a block and head; PostFlat restores the rows). A warpgroup's
            buffer is handed back once the add of its last partial has read it, the
            other's add still in flight."""
            half = self.bm * self.D // NUM_MMA_WG
            run = (cutlass.Int64(block) * H + h) * (self.bm * self.D)
            for w in cutlass.range_constexpr(NUM_MMA_WG):
                cute.arch.cp_async_bulk_wait_group(NUM_MMA_WG - 1 - w, read=True)
                cute.arch.barrier_arrive(barrier_id=DQ_EMPTY_WG + w,
                                         number_of_threads=DQ_WG_THREADS)
            for w in cutlass.range_constexpr(NUM_MMA_WG):
                cute.arch.barrier(barrier_id=DQ_FULL_WG + w, number_of_threads=DQ_WG_THREADS)
                with cute.arch.elect_one():
                    bulk_reduce_add_f32(sdQflat[None, w].iterator,
                                        mdQacc.iterator + run + w * half, 4 * half)
                cute.arch.cp_async_bulk_commit_group()

        # ------------------------------------------------------------------ store
        @cute.jit
        def store(self, mdK, mdV, acc_dK, acc_dV, seq, n0, hk, scale, stage, tiled_mma_dkv,
                  tidx):
            """dK (times the softmax scale) and dV of the tile, in the input dtype; rows
            past the sequence end are never written (they belong to the next sequence).
            Each warpgroup stages them in its own half of sV (stmatrix), then 16-byte
            stores (STG.128, not 128 predicated STG.U16 a thread: gem 256 / 0.5 1.346 ->
            0.964 ms)."""
            D = self.D
            rdK = cute.make_rmem_tensor_like(acc_dK, self.dtype)
            rdV = cute.make_rmem_tensor_like(acc_dV, self.dtype)
            rdK.store((acc_dK.load() * scale).to(self.dtype))
            rdV.store(acc_dV.load().to(self.dtype))
            # Warpgroup w's dP^T wgmma reads V rows 64w.. only (see tPrV), its dK / dV
            # rows are the same 64 keys, and its last wgmma was waited for (wait_group(0)
            # ending the step): that half may be overwritten without syncing with the
            # other warpgroup, which still reads its own half.
            rows = BLOCK_N // NUM_MMA_WG
            wg = cute.arch.make_warp_uniform(tidx // 128)
            r2s = cute.make_tiled_copy_C(
                cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(
                    transpose=False, num_matrices=4), self.dtype), tiled_mma_dkv)
            thr_r2s = r2s.get_slice(tidx)
            sV, sVst = stage          # two views of sV (see kernel)
            tRsV = thr_r2s.partition_D(sV)
            # smem -> gmem: D / 8 threads a row, 16 B each (LDS.128, STG.128)
            tpr = D // 8
            s2g = cute.make_tiled_copy_tv(
                cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype,
                                    num_bits_per_copy=128),
                cute.make_ordered_layout((128 // tpr, tpr), order=(1, 0)),
                cute.make_layout((1, 8)))
            half = cute.local_tile(sVst, (rows, D), (wg, 0))
            for x, (r, m) in enumerate(((rdK, mdK), (rdV, mdV))):
                if const_expr(x > 0):   # every thread has read dK out of the half
                    cute.arch.barrier(barrier_id=STORE_BARRIER + wg, number_of_threads=128)
                cute.copy(r2s, thr_r2s.retile(r), tRsV)
                cute.arch.barrier(barrier_id=STORE_BARRIER + wg, number_of_threads=128)
                store_rows(s2g, tidx % 128, half,
                           head_tile(m, seq.k_start + n0, hk, rows, D, (wg, 0)),
                           seq.len_k - n0 - wg * rows)     # of this warpgroup's 64 keys

        @cute.jit
        def store_add(self, mdK, mdV, acc_dK, acc_dV, seq, n0, hk, scale, tiled_mma_dkv,
                      tidx):
            """A tile split over CTAs (parts > 1): dK (times the softmax scale) and dV
            added into the fp32 accumulators mdK / mdV from registers, each pair of a
            row's adjacent columns one red.global.add.v2.f32; rows past the sequence end
            are never touched. A thread's accumulator element i = v0 + 2 v1 + 4 j sits at
            (row + 8 v1, column + v0 + 8 j) (the wgmma C fragment; the test checks it):
            two row pointers and immediate column offsets."""
            crd = tiled_mma_dkv.get_slice(tidx).partition_C(
                cute.make_identity_tensor((BLOCK_N, self.D)))
            r0, c0 = crd[0]
            for acc, m, f in ((acc_dK, mdK, scale), (acc_dV, mdV, None)):
                for v1 in cutlass.range_constexpr(2):
                    r = n0 + r0 + 8 * v1
                    if r < seq.len_k:
                        row = m.iterator + cute.crd2idx((seq.k_start + r, c0, hk), m.layout)
                        for j in cutlass.range_constexpr(cute.size(acc) // 4):
                            a, b = acc[2 * v1 + 4 * j], acc[2 * v1 + 4 * j + 1]
                            if const_expr(f is not None):
                                a, b = a * f, b * f
                            red_add_v2(row + 8 * j, a, b)

    # ================================================================================
    # (c) postprocess: dQ = scale * sum_slots dq_acc, cast
    # ================================================================================
    # role: reduce_dq
    class CastDKV:
        """Tiles split over CTAs (dkv): a postprocess also casts the fp32 dK / dV
        accumulators, each into its own gradient (jagged.tiles.grad_buffers)."""

        @cute.jit
        def cast_dkv(self, mdKVacc, mdK, mdV, n_kv_vec: Int32, i: Int32, stride: Int32):
            """Thread i of `stride`: its grid-stride share of mdKVacc (2, n) fp32 (dK, then
            dV, scaled by the parts) into mdK, mdV (n,), POST_VEC elements at a time; no
            launch of their own."""
            kv = cute.make_rmem_tensor((POST_VEC,), Float32)
            out = cute.make_rmem_tensor((POST_VEC,), self.dtype)
            for iv in cutlass.range(i, n_kv_vec, stride, unroll=1):
                for half, m in ((0, mdK), (1, mdV)):
                    cute.autovec_copy(cute.local_tile(mdKVacc[half, None], (POST_VEC,), (iv,)),
                                      kv)
                    out.store(kv.load().to(self.dtype))
                    cute.autovec_copy(out, cute.local_tile(m, (POST_VEC,), (iv,)))

    class Postprocess(CastDKV):
        def __init__(self, dtype, pdl: bool, dkv: bool = False):
            self.dtype, self.pdl = dtype, pdl  # pdl: launched as the main kernel's dependent
            self.dkv = dkv                     # CastDKV

        @cute.jit
        def __call__(self, mdQacc: cute.Tensor, mdQ: cute.Tensor, n_vec: Int32,
                     n_slots: Int32, scale: Float32, mdKVacc: Optional[cute.Tensor],
                     mdK: Optional[cute.Tensor], mdV: Optional[cute.Tensor], n_kv_vec: Int32,
                     stream):
            self.kernel(mdQacc, mdQ, n_vec, n_slots, scale, mdKVacc, mdK, mdV,
                        n_kv_vec).launch(
                grid=[(n_vec + POST_THREADS - 1) // POST_THREADS, 1, 1],
                block=[POST_THREADS, 1, 1], stream=stream, use_pdl=self.pdl)

        @cute.kernel
        def kernel(self, mdQacc: cute.Tensor, mdQ: cute.Tensor, n_vec: Int32,
                   n_slots: Int32, scale: Float32, mdKVacc: Optional[cute.Tensor],
                   mdK: Optional[cute.Tensor], mdV: Optional[cute.Tensor], n_kv_vec: Int32):
            """mdQacc (n_slots, n_elem) fp32, mdQ (n_elem,); POST_VEC elements a thread.
            Its reads wait for the main kernel (where launched as its dependent)."""
            cute.arch.griddepcontrol_wait()
            i = cute.arch.block_idx()[0] * POST_THREADS + cute.arch.thread_idx()[0]
            if i < n_vec:
                acc = cute.make_rmem_tensor((POST_VEC,), Float32)
                acc.fill(0.0)
                part = cute.make_rmem_tensor((POST_VEC,), Float32)
                for s in cutlass.range(n_slots, unroll=1):  # in a fixed order
                    cute.autovec_copy(cute.local_tile(mdQacc[s, None], (POST_VEC,), (i,)), part)
                    acc.store(acc.load() + part.load())
                out = cute.make_rmem_tensor((POST_VEC,), self.dtype)
                out.store((acc.load() * scale).to(self.dtype))
                cute.autovec_copy(out, cute.local_tile(mdQ, (POST_VEC,), (i,)))
            if const_expr(self.dkv):
                self.cast_dkv(mdKVacc, mdK, mdV, n_kv_vec, i,
                              cute.arch.grid_dim()[0] * POST_THREADS)

    # role: reduce_dq
    class PostRows(CastDKV):
        """Key windows: dQ = scale * the accumulator for the rows it holds (`accumulated`;
        causal: as the preprocess's); the owned windows' rows, stored by the main kernel,
        are left alone. TLX's `_bwd_post_rows`."""

        def __init__(self, dtype, long_k: int, pdl: bool, dkv: bool = False,
                     causal: bool = False):
            self.dtype, self.long_k, self.pdl = dtype, long_k, pdl
            self.dkv = dkv   # windows split over CTAs: CastDKV
            self.causal = causal

        @cute.jit
        def __call__(self, mdQacc: cute.Tensor, mdQ: cute.Tensor, mCuQ: cute.Tensor,
                     mCuK: cute.Tensor, B: Int32, rounds: Int32, n_vec: Int32,
                     token_vecs: Int32, scale: Float32, mdKVacc: Optional[cute.Tensor],
                     mdK: Optional[cute.Tensor], mdV: Optional[cute.Tensor], n_kv_vec: Int32,
                     stream):
            n_tok = n_vec // token_vecs
            self.kernel(mdQacc, mdQ, mCuQ, mCuK, B, rounds, n_vec, token_vecs, scale,
                        mdKVacc, mdK, mdV, n_kv_vec).launch(
                grid=[(n_tok + WIN_TOK - 1) // WIN_TOK, 1, 1],
                block=[POST_THREADS, 1, 1], stream=stream, use_pdl=self.pdl)

        @cute.kernel
        def kernel(self, mdQacc: cute.Tensor, mdQ: cute.Tensor, mCuQ: cute.Tensor,
                   mCuK: cute.Tensor, B: Int32, rounds: Int32, n_vec: Int32,
                   token_vecs: Int32, scale: Float32, mdKVacc: Optional[cute.Tensor],
                   mdK: Optional[cute.Tensor], mdV: Optional[cute.Tensor], n_kv_vec: Int32):
            """mdQacc, mdQ (n_elem,), token-major, token_vecs vectors of POST_VEC a token
            (H * D / POST_VEC); a CTA WIN_TOK tokens, POST_THREADS / WIN_TOK threads a
            token, each searching its token's sequence once, ahead of the wait (it reads
            only the offsets). Its reads of the accumulator wait for the main kernel."""
            tpt = POST_THREADS // WIN_TOK                   # threads a token
            tidx = cute.arch.thread_idx()[0]
            tok = cute.arch.block_idx()[0] * WIN_TOK + tidx // tpt
            n_tok = n_vec // token_vecs
            take = (tok < n_tok) & accumulated(mCuQ, mCuK, B, rounds,
                                               cutlass.min(tok, n_tok - 1), self.long_k,
                                               self.causal)
            cute.arch.griddepcontrol_wait()
            if take:
                acc = cute.make_rmem_tensor((POST_VEC,), Float32)
                out = cute.make_rmem_tensor((POST_VEC,), self.dtype)
                for v in cutlass.range(tidx % tpt, token_vecs, tpt, unroll=1):
                    i = tok * token_vecs + v
                    cute.autovec_copy(cute.local_tile(mdQacc, (POST_VEC,), (i,)), acc)
                    out.store((acc.load() * scale).to(self.dtype))
                    cute.autovec_copy(out, cute.local_tile(mdQ, (POST_VEC,), (i,)))
            if const_expr(self.dkv):
                self.cast_dkv(mdKVacc, mdK, mdV, n_kv_vec,
                              cute.arch.block_idx()[0] * POST_THREADS + tidx,
                              cute.arch.grid_dim()[0] * POST_THREADS)

    # role: reduce_dq
    class PostFlat(CastDKV):
        """Config.dq_flat's postprocess: a CTA an accumulator block (its sequence found
        once, by a binary search of the offsets), its query heads one after another; two
        warpgroups of 128 threads, each thread with the accumulator fragment of the main
        kernel's compute thread of its index (`flat_copy` reads it in 16-byte loads), cast
        through the dQ wgmma's own partition into the block's rows in smem, then stored
        16 bytes a thread up to the sequence's end. Blocks past their sequence's last (the
        padding) store nothing."""

        def __init__(self, dtype, head_dim: int, block_m: int, dq_t: bool, pdl: bool,
                     dkv: bool = False):
            self.dtype, self.D, self.bm, self.dq_t = dtype, head_dim, block_m, dq_t
            self.pdl = pdl
            self.dkv = dkv   # tiles split over CTAs: CastDKV

        @cute.jit
        def __call__(self, mdQacc: cute.Tensor, mdQ: cute.Tensor, mCuQ: cute.Tensor,
                     n_blocks: Int32, scale: Float32, mdKVacc: Optional[cute.Tensor],
                     mdK: Optional[cute.Tensor], mdV: Optional[cute.Tensor], n_kv_vec: Int32,
                     stream):
            D, bm = self.D, self.bm
            # the block's rows in smem, a row 16 bytes longer than D (its 16-byte reads
            # and the partition's 2-byte writes spread over the banks)
            sO_layout = cute.make_layout((bm, D), stride=(D + 8, 1))

            @cute.struct
            class SharedStorage:
                sO: cute.struct.Align[cute.struct.MemRange[self.dtype, bm * (D + 8)], 16]

            self.kernel(mdQacc, mdQ, mCuQ, scale, mdKVacc, mdK, mdV, n_kv_vec,
                        dq_mma(self.dtype, D, bm, self.dq_t), sO_layout,
                        SharedStorage).launch(
                grid=[n_blocks, 1, 1], block=[128 * NUM_MMA_WG, 1, 1],
                smem=SharedStorage.size_in_bytes(), stream=stream, use_pdl=self.pdl)

        @cute.kernel
        def kernel(self, mdQacc: cute.Tensor, mdQ: cute.Tensor, mCuQ: cute.Tensor,
                   scale: Float32, mdKVacc: Optional[cute.Tensor],
                   mdK: Optional[cute.Tensor], mdV: Optional[cute.Tensor], n_kv_vec: Int32,
                   tiled_mma_dq: cute.TiledMma, sO_layout: cute.Layout,
                   SharedStorage: cutlass.Constexpr):
            """mdQacc: the block-padded accumulator, flat; mdQ [Nq, H, D]. Its reads
            wait for the main kernel (where launched as its dependent)."""
            D, bm = self.D, self.bm
            cute.arch.griddepcontrol_wait()
            tidx = cute.arch.thread_idx()[0]
            blk = cute.arch.block_idx()[0]
            H = mdQ.shape[1]
            # the sequence whose blocks hold blk: the last b with flat_block(cu[b], b) <= blk
            lo, hi = Int32(0), Int32(mCuQ.shape[0] - 2)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if flat_block(mCuQ[mid], mid, 0, bm) <= blk:
                    lo = mid
                else:
                    hi = mid - 1
            row0 = mCuQ[lo] + (blk - flat_block(mCuQ[lo], lo, 0, bm)) * bm
            rows = cutlass.min(mCuQ[lo + 1] - row0, bm)
            if rows > 0:
                smem = cutlass.utils.SmemAllocator()
                sO = smem.allocate(SharedStorage).sO.get_tensor(sO_layout)
                thr_mma = tiled_mma_dq.get_slice(tidx)
                tOsO = thr_mma.partition_C(
                    cute.composition(sO, cute.make_ordered_layout((D, bm), order=(1, 0)))
                    if const_expr(self.dq_t) else sO)
                acc = cute.make_rmem_tensor(tOsO.shape, Float32)
                half = bm * D // NUM_MMA_WG
                vpr = D // POST_VEC                       # 16-byte vectors a row
                r = cute.make_rmem_tensor((POST_VEC,), self.dtype)
                for h in cutlass.range(H, unroll=1):
                    # this block and head's run: the warpgroups' buffers as its two columns
                    run = (cutlass.Int64(blk) * H + h) * (bm * D)
                    gAcc = cute.make_tensor(aligned(mdQacc.iterator + run, 16),
                                            cute.make_layout((half, NUM_MMA_WG)))
                    tAg = flat_copy(128, NUM_MMA_WG).get_slice(tidx).partition_S(gAcc)
                    cute.autovec_copy(tAg, cute.make_tensor(acc.iterator,
                                                            cute.make_layout(tAg.shape)))
                    cute.arch.sync_threads()              # the last head's rows are out
                    tOsO.store((acc.load() * scale).to(self.dtype))
                    cute.arch.sync_threads()
                    for v in cutlass.range(tidx, bm * vpr, 128 * NUM_MMA_WG, unroll=1):
                        row, c = v // vpr, v % vpr
                        if row < rows:
                            cute.autovec_copy(cute.local_tile(sO[row, None], (POST_VEC,),
                                                              (c,)), r)
                            cute.autovec_copy(r, cute.local_tile(mdQ[row0 + row, h, None],
                                                                 (POST_VEC,), (c,)))
            if const_expr(self.dkv):
                nt = 128 * NUM_MMA_WG
                self.cast_dkv(mdKVacc, mdK, mdV, n_kv_vec, blk * nt + tidx,
                              cute.arch.grid_dim()[0] * nt)

    return Preprocess, BwdMain, Postprocess, PostRows, PostFlat


# --------------------------------------------------------------------------------------
# Host: compile once per config (on symbolic tensors), then launch
# --------------------------------------------------------------------------------------

def compile_preprocess(dtype, head_dim: int, long_k: int = 0, zero_dkv: bool = False,
                       into_dq: bool = False, causal: bool = False, options: str = ""):
    """long_k (key windows): zero only the rows of sequences of more than long_k keys
    (the call passes cu_q, cu_k, B and bit_length(B); otherwise None, None, and B and
    rounds unused); zero_dkv: also the split tiles' fp32 dK / dV accumulators ([rows, D];
    otherwise None and 0); into_dq (jagged.tiles.windows_direct): the rows zeroed are
    dQ's own, in `dtype`, where the accumulator's are fp32; causal (key windows): also the
    rows that see no key (`accumulated`)."""
    import cutlass
    import cutlass.cute as cute
    cdt = host.cute_dtype(dtype)
    Pre = _kernel_classes()[0]
    rows = cute.sym_int32()
    o = host.fake(cdt, (rows, head_dim), (head_dim, 1), 16)
    do = host.fake(cdt, (rows, head_dim), (head_dim, 1), 16)
    delta = host.fake(cutlass.Float32, (cute.sym_int32(), cute.sym_int32()),
                      (cute.sym_int64(), 1), 4)
    acc = host.fake(cdt if into_dq else cutlass.Float32, (cute.sym_int32(), head_dim),
                    (head_dim, 1), 16)
    sched = host.fake(cutlass.Int32, (cute.sym_int32(),), (1,), 4)
    nb = cute.sym_int32()
    cus = ((host.fake(cutlass.Int32, (nb,), (1,), 4), host.fake(cutlass.Int32, (nb,), (1,), 4))
           if long_k else (None, None))
    kv_acc = (host.fake(cutlass.Float32, (cute.sym_int32(), head_dim), (head_dim, 1), 16)
              if zero_dkv else None)
    return host.compile_kernel(Pre(cdt, head_dim, long_k, zero_dkv, causal), o, do,
                               delta, acc, sched, cutlass.Int32(1), cutlass.Int32(1),
                               cutlass.Int32(1), *cus, cutlass.Int32(1), cutlass.Int32(1),
                               kv_acc, cutlass.Int32(0), options=options)


def _dkv_args(cdt, dkv: bool) -> tuple:
    """The postprocesses' split-tile arguments: the fp32 dK / dV accumulators (2, n) and
    the two gradients (n,), or None where dkv is off."""
    import cutlass
    import cutlass.cute as cute
    if not dkv:
        return None, None, None
    n = cute.sym_int32()
    return (host.fake(cutlass.Float32, (2, n), (cute.sym_int64(divisibility=POST_VEC), 1), 16),
            host.fake(cdt, (n,), (1,), 16), host.fake(cdt, (n,), (1,), 16))


def compile_post_rows(dtype, pdl: bool = True, dkv: bool = False, causal: bool = False,
                      options: str = ""):
    """Key windows' postprocess (PostRows) for BLOCK_N-key windows; dkv: windows split
    over CTAs, their fp32 dK / dV converted too; causal: with the rows that see no key."""
    import cutlass
    import cutlass.cute as cute
    cdt = host.cute_dtype(dtype)
    PostRows = _kernel_classes()[3]
    n = cute.sym_int32()
    acc = host.fake(cutlass.Float32, (n,), (1,), 16)
    dq = host.fake(cdt, (n,), (1,), 16)
    nb = cute.sym_int32()
    cu_q = host.fake(cutlass.Int32, (nb,), (1,), 4)
    cu_k = host.fake(cutlass.Int32, (nb,), (1,), 4)
    return host.compile_kernel(PostRows(cdt, BLOCK_N, pdl, dkv, causal), acc, dq, cu_q, cu_k,
                               cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1),
                               cutlass.Int32(1), cutlass.Float32(1.0), *_dkv_args(cdt, dkv),
                               cutlass.Int32(0), options=options)


def compile_postprocess(dtype, pdl: bool = True, dkv: bool = False, options: str = ""):
    """dkv: tiles split over CTAs, their fp32 dK / dV converted too."""
    import cutlass
    import cutlass.cute as cute
    cdt = host.cute_dtype(dtype)
    Post = _kernel_classes()[2]
    n = cute.sym_int32()
    acc = host.fake(cutlass.Float32, (cute.sym_int32(), n),
                    (cute.sym_int64(divisibility=POST_VEC), 1), 16)
    dq = host.fake(cdt, (n,), (1,), 16)
    return host.compile_kernel(Post(cdt, pdl, dkv), acc, dq, cutlass.Int32(1), cutlass.Int32(1),
                               cutlass.Float32(1.0), *_dkv_args(cdt, dkv), cutlass.Int32(0),
                               options=options)


def compile_post_flat(dtype, head_dim: int, block_m: int, dq_t: bool, pdl: bool = True,
                      dkv: bool = False, options: str = ""):
    """The postprocess of a block-padded dQ accumulator (Config.dq_flat) of a main kernel
    of block_m query rows a step, dQ^T where dq_t (its dQ wgmma's partition); dkv as
    compile_postprocess's."""
    import cutlass
    import cutlass.cute as cute
    cdt = host.cute_dtype(dtype)
    Post = _kernel_classes()[4]
    acc = host.fake(cutlass.Float32, (cute.sym_int32(),), (1,), 16)
    dq = host.fake(cdt, (cute.sym_int32(), cute.sym_int32(), head_dim),
                   (cute.sym_int64(divisibility=head_dim), head_dim, 1), 16)
    cu_q = host.fake(cutlass.Int32, (cute.sym_int32(),), (1,), 4)
    return host.compile_kernel(Post(cdt, head_dim, block_m, dq_t, pdl, dkv), acc, dq, cu_q,
                               cutlass.Int32(1), cutlass.Float32(1.0), *_dkv_args(cdt, dkv),
                               cutlass.Int32(0), options=options)


def compile_main(dtype, head_dim: int, causal: bool, broadcast_q: bool,
                 cfg: Config | None = None, dynamic: bool | None = None, options: str = "",
                 parts: int = 1):
    """Compile the main kernel (no GPU needed with CUTE_DSL_ARCH=sm_90a). cfg: None, the
    default for head_dim (pick_config); window_config(head_dim): the key-windows build.
    dynamic: tiles from the counter (None: jagged.tiles.bwd_dynamic; key windows never).
    parts: CTAs a tile (jagged.tiles.bwd_parts), dK / dV then fp32 accumulators."""
    import cutlass
    import cutlass.cute as cute
    cdt = host.cute_dtype(dtype)
    Main = _kernel_classes()[1]
    cfg = pick_config(head_dim, causal=causal, broadcast_q=broadcast_q) if cfg is None else cfg
    args = host.bwd_args(cdt, head_dim, cfg.windows, parts > 1)
    sched = host.fake(cutlass.Int32, (cute.sym_int32(),), (1,), 4)
    if dynamic is None:
        dynamic = bwd_dynamic(broadcast_q) and not cfg.windows
    # key windows: dQ in q's dtype (owned windows store it), contiguous: its static
    # strides keep store_dq's addresses out of the registers the tile loop holds
    dq = None
    if cfg.windows:
        heads = cute.sym_int32()
        dq = host.fake(cdt, (cute.sym_int32(), heads, head_dim),
                       (heads * head_dim, head_dim, 1), 16)
    return host.compile_kernel(Main(cdt, head_dim, causal, broadcast_q, cfg, dynamic, parts),
                               *args, sched, cutlass.Float32(1.0), cutlass.Int32(0),
                               cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), dq,
                               options=options)


def _plan(c: host.BwdCall) -> tuple[int, Config]:
    """CTAs a tile (jagged.tiles.bwd_parts, from the whole tiles' step) or a key window
    (window_parts), and the main kernel's config for that many (_config). Key windows'
    config keeps the row accumulator (window_config: no dq_flat), whose rows PostRows and
    the owned windows' stores read and write."""
    cfg = _config(c, 1)
    if cfg.windows:
        parts = window_parts(c.q.shape[0], c.k.shape[0], c.k.shape[1], c.group, cfg.block_m,
                             BLOCK_N, c.grid, c.causal, c.cu_k.shape[0] - 1)
    else:
        parts = bwd_parts(c.q.shape[0], c.k.shape[0], c.cu_k.shape[0] - 1, c.k.shape[1],
                          c.group, c.causal, c.broadcast_q, cfg.block_m, BLOCK_N, c.grid,
                          c.max_q, c.max_k)
    cfg = cfg if parts == 1 else _config(c, parts)
    return parts, replace(cfg, head_run=bwd_head_run(
        c.k.shape[0], c.cu_k.shape[0] - 1, c.q.shape[1], c.k.shape[1], c.max_q, c.q.shape[2],
        BLOCK_N, c.causal, c.broadcast_q, cfg.windows, c.max_k))


def _config(c: host.BwdCall, parts: int) -> Config:
    """The main kernel's step for a call whose tiles (or key windows) are in `parts`
    parts."""
    D = c.q.shape[2]
    B = c.cu_k.shape[0] - 1
    if takes_windows(c.k.shape[0], B, c.max_k, c.broadcast_q):
        return window_config(D, parts > 1)
    return pick_config(D, bwd_mean_q(c.q.shape[0], B, c.broadcast_q), c.causal,
                       c.broadcast_q, c.max_q, split=parts > 1, n_q=c.q.shape[0],
                       n_sms=c.grid)


def _main(c: host.BwdCall):
    """(b): the main kernel over the KV-tile list, or over key windows (`takes_windows`:
    window_tiles over the key offsets, the window order, count and table in place of the
    list; module docstring), each tile in c.parts parts (> 1: c.dk, c.dv are the fp32
    accumulators) with config c.cfg (`_plan`)."""
    D = c.q.shape[2]
    cfg = c.cfg
    if cfg.windows:
        dynamic = False
        tile_b, n_tiles, tile_n = window_tiles(c.cu_k, c.cu_q, c.k.shape[0], c.max_k,
                                               BLOCK_N, cfg.block_m)
    else:
        dynamic = bwd_dynamic(c.broadcast_q)
        tile_b, tile_n, n_tiles = kv_tiles(c.cu_q, c.cu_k, c.L_q, c.max_k, c.causal,
                                           cfg.block_m, BLOCK_N)
    host.compiled(_COMPILED, compile_main, c.q.dtype, D, c.causal, c.broadcast_q, cfg,
                  dynamic, "", c.parts)(
        c.q, c.k, c.v, c.dout, c.lse, c.delta, c.dq_acc, c.dk, c.dv,
        c.cu_q if c.cu_q is not None else c.cu_k, c.cu_k, tile_b, tile_n, n_tiles, c.sched,
        c.scale, c.L_q, c.n_slots, c.group, c.grid, c.dq if cfg.windows else None)


KERNELS = host.BwdKernels(partial(host.compiled, _COMPILED, compile_preprocess), _main,
                          partial(host.compiled, _COMPILED, compile_postprocess), POST_VEC,
                          takes_windows, partial(host.compiled, _COMPILED, compile_post_rows),
                          BLOCK_N, _plan,
                          partial(host.compiled, _COMPILED, compile_post_flat))


def backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q,
             dlse=None):
    """(dq, dk, dv) in q's dtype. See the module docstring for the design. dlse: the
    gradient on lse (jagged.api), or None."""
    return host.backward(KERNELS, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal,
                         scale, broadcast_q, dlse)
