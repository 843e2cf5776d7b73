"""Jagged (varlen, packed) flash-attention backward for Hopper (sm_90a) in Triton + TLX.

    backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale,
             broadcast_q, dlse=None) -> (dq, dk, dv)          # in q's dtype

Three kernels:

(a) `_bwd_preprocess`: delta[h, i] = rowsum(dO * O) - dlse in fp32 ([H, Nq], lse's
    layout); it also zeroes the fp32 dQ accumulator (broadcast-Q: its slots) and the tile
    counter, and with split tiles their dK / dV accumulators.
(b) `bwd_kernel`: one persistent program per SM walks the jagged list of KV tiles of
    BLOCK_N = 128 keys, longest first (jagged.tiles.kv_tiles, built on the GPU; schedule.py),
    packed lists in list order from a counter (`jagged.tiles.bwd_dynamic`,
    tile_counter.py; broadcast-Q round-robin): the round-robin deals each round's longest
    tile to the same programs (against it: llm causal B8 H16 8192 -10.1 %, GQA B4 H32/8
    4096 -29.9 %, fuzz B48 H8/1 D64 -12 %). Per program, these roles (tlx.async_task), each
    its own helper:

  load       (producer): per KV tile K and V (two 64-key halves) by TMA into KV_STAGES
             stages; per Q step Q and dO by TMA into a NUM_BUF_Q-deep ring (mbarrier
             full / empty pairs); at 64- and 128-row steps also the step's lse2 / delta
             into smem, and reduce_dq's work.
  compute    (2 consumer warpgroups): consumer c owns keys [n0 + 64c, n0 + 64c + 64):
             S^T = K_c Q^T, P^T = exp2(S^T * scale * log2(e) - lse * log2(e)),
             dV_c += P^T dO, dP^T = V_c dO^T, dS^T = P^T (dP^T - delta), dK_c += dS^T Q
             (wgmma, fp32 accumulators) and its part of dQ, staged in smem as fp32.
  reduce_dq  TMA bulk reduce-add (cp.reduce.async.bulk.tensor .add.f32) of the staged dQ
             into the fp32 accumulator, then frees the stage: a 1-warp task at 32-row
             steps, folded into the load task at 64- and 128-row steps (3 warpgroups, so
             240 registers a consumer). The consumers never wait on global atomics.
  store      (compute's, at the end of a tile): dK_c (times scale) and dV_c through the
             consumer's own V smem (no longer read), in 16-row slices.
    GQA: a tile owns one KV head and loops over the query heads of its group, so dK / dV
    are summed in registers and stored once. Where a call has few long tiles
    (jagged.tiles.bwd_parts: PARTS > 1) each tile's steps are shared evenly by PARTS
    programs (schedule.part_steps); every part adds its dK / dV in fp32 (16-byte
    atomics, half the columns at a time through the same V smem) into zeroed
    accumulators (jagged.tiles.dkv_accumulator).
(c) `_bwd_postprocess`: dQ = scale * sum over slots of the fp32 accumulator, cast to the
    input dtype; split tiles: dK / dV from their accumulators too, in the same launch.
Long packed sequences keep the row accumulator in this style: the block-padded hand-over
(the CuteDSL twin's Config.dq_flat) lost here by ~1 % (PERF, Tried and lost). The twin adds
a partial with one 1-D bulk reduce, which Triton cannot emit; a TMA box over fp32 staging
moves 128-byte rows whatever its shape (PERF, gap 3).
In the packed modes the three chain as programmatic dependent launches
(jagged.tiles.bwd_dependent): the preprocess, the list kernel and `_window_rows` trigger
their dependents first, the main kernel is launched as a dependent (each role waits,
gdc_wait, before its first global access) and triggers, and the postprocess, launched as
its dependent, waits before it reads: each kernel's launch and prologue run under the
kernel ahead.

Steps (CONFIGS). 128 query rows a step at D = 64 (64 up to jagged.tiles.BWD_MID_MEAN_Q
query rows a sequence), 64 at D = 128, 32 for mean KV lengths up to SHORT_MEAN_K at both:
  * 32 rows: two K/V stages; lse / delta loaded one step ahead into registers; dQ reduced
    by a 1-warp task.
  * 64 rows (D = 128, and D = 64's "mid" bucket with two K/V stages): one K/V stage at
    D = 128 (two need 263 KB of smem), lse2 / delta staged in smem by the load task per
    Q stage, dQ reduced by the load task; spill-free at 240 registers in 194 KB (D =
    64: 162 KB). The N = 64 S^T / dP^T / dQ^T wgmmas read a third less smem a row than
    N = 32.
  * 128 rows (D = 64 only): as 64 rows, and the consumers split dQ by query rows
    (`_step_rows`); 195 KB with one K/V stage (two spilled in causal).

Key windows (short keys on average, `takes_windows`): a tile is instead whole sequences
of at most BLOCK_N packed key columns together, or a BLOCK_N-key block of a longer one
(jagged.tiles.windows / window_tiles over cu_k, schedule.kv_window_coords), against every
query row of its sequences (causal: from its first sequence's first row that sees a
key); each key column meets its own sequence's rows (`_col_bounds`, `_keep`), every step
masked; the rows of every column come from `_window_rows`, launched before the main
kernel and kept with the window list (`window_lists`). At gem 256 / 0.1 (mean 26 keys) a
(sequence, KV block) tile is ~80 % empty keys. Windows are walked statically, causal too,
in the short bucket's steps (`window_config`). A window of whole sequences holds every
key its rows meet (`_window_keys`), so a step's dQ is whole: the consumers store it in
q's dtype (`_store_dq`) and reduce_dq adds nothing; the preprocess zeroes and
`_bwd_post_rows` converts only the rows of the longer sequences, whose blocks reduce-add
their partials (and, causal, the rows that see no key).
When every sequence fits one window's keys and no window is split
(jagged.tiles.windows_direct) there are none: the preprocess zeroes dQ's rows past the
last sequence itself and no postprocess launches. A call of a few windows
(jagged.tiles.window_parts > 1) shares each window's steps over PARTS programs as split
tiles do (dK / dV added in fp32; a step's dQ stays its own).

Broadcast-Q (dQ is a sum over the whole batch): programs are pinned to a KV head (program
p owns head p % H_kv) and accumulate into fp32 slots `dq_acc[slot]` ([n_slots, L_q, H, D],
slot = (p // H_kv) % n_slots: one slot per 2048 keys of the call at most, since each
slot is zeroed and read once more; jagged.tiles.dq_slots); `_bwd_postprocess` sums the
slots. Tiles of a head are dealt to that head's programs longest first.

Determinism: dK / dV are with whole tiles (each row written once, summed in registers),
not with split ones (their parts' adds meet in no fixed order); dQ is not: bulk
reduce-adds from several programs into one dQ row (packed modes, a broadcast-Q slot), and
a program's consumers' boxes of one step (issued back to back), apply in no fixed order.

Masking: keys past the sequence end, query rows past the sequence end, the causal
(bottom-right aligned: query i sees key j iff j <= i + len_k - len_q) triangle and rows
with lse = -inf all give P = 0, so they add nothing to dV, dK or dQ. Rows go by their lse
(+inf past the end or where lse = -inf); keys by P^T's mask. D = 128's causal packed
64-row step applies it only where a consumer's keys run past the sequence or a row of the
step misses one (`_unmasked_from`; the step loop, both branches, 479 instructions a warp).
Causal packed 128-row steps (D = 64) run each query head's masked steps, then the others,
in loops of their own (`_row_step`; a branch in one loop spilled 41 instructions a step):
736 and 554 instructions a warp. The causal triangle is one compare and one select a
score at P^T's use (`_causal_select`). The other builds mask every step: the branch spilled
in broadcast-Q's 32- and 64-row builds (38-49 instructions; CuteDSL's broadcast-Q D = 128
step takes it spill-free) and in D = 128's non-causal 64-row one (8).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from jagged.arch import num_sms
from jagged.seqinfo import (causal_last_key, causal_q_start, col_q_range, dq_accumulated,
                            row_seq, sequence_of)
from jagged.tiles import (BWD_WINDOW_MEAN_FRACTION, PDL, bwd_dependent, bwd_dynamic,
                          bwd_head_run, bwd_mean_q, bwd_mid, bwd_parts, bwd_programs,
                          dkv_accumulator, dq_accumulator, grad_buffers, kv_tiles, per_offsets,
                          slot_count, window_parts, window_tiles, windowed, windows_direct)

from jagged.launch import cdiv, fast, fast_at, next_pow2, once_a_site, tma_desc
from .schedule import (KVTiles, dq_slot_row, kv_tile_coords, kv_window_coords, part_steps,
                       tile_range)
from .tile_counter import fetch_tile, next_tile, publish_tile


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class Config:
    block_m: int     # query rows a step: 32, 64 or 128 (128 at D = 64 only)
    kv_stages: int   # K/V stages (2: the next tile's K/V load during this one)
    num_stages: int  # the launch's num_stages and the Q-step loop's (0: the loop stays
                     # out of Triton's pipeliner, `compute`)
    sdp_together: bool = False  # at 128 rows, S^T and dP^T in flight together
                                # (_step_rows; the Q loop at num_stages 0)


BLOCK_N = 128        # keys a tile: NUM_CONSUMERS warpgroups of 64
SHORT_MEAN_K = 64    # mean keys per sequence up to which 32-row steps win

# The measured defaults, keyed by (head_dim, bucket): "short" when the mean KV length
# (total keys / batch, known on the host without a sync) is at most SHORT_MEAN_K.
#   D = 128, 64 rows against 32: llm B8 H16 8192 25.30 -> 21.16 ms, causal 14.37 ->
#     12.58, gem 2048 / 0.5 20.64 -> 17.86; 32 rows stay faster at short means (kernel
#     at gem 256 / 0.1: 0.209 against 0.239 ms).
#   D = 128, the Q loop at num_stages=0 (3 wgmma waits of 0 a consumer step instead of 9):
#     llm 498.8 -> 510.3 TFLOP/s, causal 478.7 -> 490.2, GQA 506.9 -> 521.3.
#   D = 64, 128 rows against 64: llm B16 H16 2048 1.904 -> 1.608 ms, causal 1.125 ->
#     1.019; "mid" (mean query rows at most jagged.tiles.BWD_MID_MEAN_Q): 64 rows, two
#     K/V stages, gem-jagged-d64 1024 / 0.1 (mean 102) -8.1 %, 134 -2.1 %, 209 +3.5 %.
#     At 32-row steps the Q loop at num_stages=0 cost do_bench +3 %. S^T and dP^T
#     together (FA4's order, num_stages=0) against one after the other, graph replay:
#     llm 1.665 -> 1.625 ms, causal 1.034 -> 1.039; fuzz B2 H8/2 16384 / 0.9 5.053 ->
#     4.771, 7 more fuzz shapes 0.9-7.2 % faster; varlen-llm (causal) 1.8-3.8 % faster.
CONFIGS = {
    (64, "short"): Config(block_m=32, kv_stages=2, num_stages=1),
    (64, "mid"): Config(block_m=64, kv_stages=2, num_stages=0),
    (64, "long"): Config(block_m=128, kv_stages=1, num_stages=0, sdp_together=True),
    (128, "short"): Config(block_m=32, kv_stages=2, num_stages=1),
    (128, "long"): Config(block_m=64, kv_stages=1, num_stages=0),
}


def sdp_together(cfg: Config, broadcast_q: bool) -> bool:
    """Whether a build issues S^T and dP^T together (Config.sdp_together; broadcast-Q keeps
    the dots one after the other, as the CuteDSL twin: its causal step loop spills 18)."""
    return cfg.sdp_together and not broadcast_q


def pick_config(head_dim: int, mean_k: float, mean_q: float = math.inf) -> Config:
    """The measured default for a call (mean_k: total keys / batch; mean_q: query rows a
    sequence, jagged.tiles.bwd_mid)."""
    if mean_k <= SHORT_MEAN_K:
        return CONFIGS[(head_dim, "short")]
    return CONFIGS[(head_dim, "mid" if bwd_mid(head_dim, mean_q) else "long")]


# Key windows (short keys, jagged.tiles.windowed): a tile is whole sequences of at most
# BLOCK_N keys (jagged.tiles.windows), against every query row of those sequences. The
# windows take the short bucket's steps (32 rows, two K/V stages), measured fastest at
# mean keys of at most half a tile (64, SHORT_MEAN_K; windowed calls go up to a tile,
# jagged.tiles.BWD_WINDOW_MEAN_FRACTION); a window's rows are its sequences' (at most
# BLOCK_N at len_q = len_k), so 32-row steps leave the least padding at the row range's
# end; and a window has few steps, so the next window's K/V loading under this one's pays.
def window_config(head_dim: int) -> Config:
    return CONFIGS[(head_dim, "short")]


def takes_windows(n_keys: int, batch: int, max_k: int, broadcast_q: bool) -> bool:
    """Whether a backward runs over key windows (packed queries, short keys on average)."""
    return windowed(n_keys, batch, max_k, BLOCK_N, broadcast_q, BWD_WINDOW_MEAN_FRACTION)


NUM_BUF_Q = tl.constexpr(2)       # depth of the Q/dO ring
NUM_CONSUMERS = tl.constexpr(2)   # consumer warpgroups; each owns BLOCK_N // NUM_CONSUMERS keys
# setmaxnreg per role: producer (the compiler's at 32-row steps), 2 x 4 consumer warps,
# and the reduce warp
REGS_COMPUTE = tl.constexpr(232)
REGS_COMPUTE_M64 = tl.constexpr(240)  # 64- and 128-row steps: no reduce warp, 3 warpgroups
REGS_REDUCE = tl.constexpr(24)
DS_BARRIER = tl.constexpr(8)      # named barrier: both consumers' dS^T are in smem
ROW_SEQ_CHUNK = tl.constexpr(16)  # offsets a pass of seqinfo.row_seq compares (windows)


class Descs(NamedTuple):
    """TMA descriptors: the Q, K, V, dO operands and the fp32 dQ accumulator."""
    q: object
    k: object
    v: object
    do: object
    dq: object


class Smem(NamedTuple):
    """A program's shared memory: K / V halves [stage * NC + consumer], the Q / dO ring,
    dS^T halves (two steps deep), each consumer's dQ staging, and the step's lse2 / delta
    beside the ring (None at 32-row steps, where the consumers carry them)."""
    k: object
    v: object
    q: object
    do: object
    ds: object
    dq: object
    lse: object
    delta: object


class Bars(NamedTuple):
    """mbarriers, full / empty pairs: K/V stages, the Q/dO ring, each consumer's dQ
    staging, the tile handoff (tile_counter.py)."""
    kv_full: object
    kv_empty: object
    q_full: object
    q_empty: object
    dq_full: object
    dq_empty: object
    tile_full: object
    tile_empty: object


class RowStats(NamedTuple):
    """lse and delta, [H, Nq] fp32, stride_h elements between heads."""
    lse: object
    delta: object
    stride_h: object


class Grads(NamedTuple):
    """dK and dV ([Nk, H_kv, D], strides in elements), the softmax scale dK (and dQ)
    take, and dQ ([Nq, H, D] contiguous, q's dtype) where key windows store it directly
    (`_store_dq`; None otherwise)."""
    dk: object
    dv: object
    stride_tok: object
    stride_h: object
    scale: object
    dq: object = None


class RowTile(NamedTuple):
    """What a tile's 128-row steps share (_row_step): the program's smem and barriers,
    the tile and its key bounds, this consumer's K/V stage and its K_c / V_c, its key
    offsets, its dQ staging, and the softmax scale times log2(e)."""
    smem: object
    bars: object
    tile: object
    bounds: object
    kvb: object
    kc: object
    vc: object
    offs_n: object
    dqc: object
    qk_scale2: object


def dq_cols(head_dim: int) -> int:  # role: host
    """dQ columns per consumer (the DQ_COLS constexpr and the dQ TMA box width)."""
    half = head_dim // NUM_CONSUMERS.value
    return half if half >= 64 else head_dim


def dq_rows(block_m: int) -> int:  # role: host
    """dQ rows per consumer (the dQ TMA box height): 128-row steps split the rows."""
    return block_m // NUM_CONSUMERS.value if block_m >= 128 else block_m


# ----------------------------------------------------------------------------- preprocess
# Key windows: the accumulator rows of sequences longer than a window are zeroed, and
# converted, by programs of WIN_TOK tokens, one search a token for its sequence. A search a
# program of a few rows left the passes latency-bound (each program's dependent loads).
WIN_TOK = tl.constexpr(32)
POST_COLS = 128  # _bwd_post_rows: columns a pass ([WIN_TOK, POST_COLS], 32 values a thread)


def pre_programs(n_tok: int, H: int, rows: int, windows: bool) -> int:  # role: host
    """_bwd_preprocess's grid: the delta programs of `rows` (token, head) rows, then (key
    windows) the zeroing ones of WIN_TOK tokens."""
    return cdiv(n_tok * H, rows) + (cdiv(n_tok, WIN_TOK.value) if windows else 0)


@triton.jit
def _bwd_preprocess(out_ptr, dout_ptr, delta_ptr, dq_acc_ptr, sched_ptr, n_rows,
                    stride_o_tok, stride_o_h, stride_do_tok, stride_do_h,
                    stride_delta_h, cu_q_ptr, cu_k_ptr, B, ROUNDS, dkv_acc_ptr, n_kv_rows,
                    n_dq_rows,
                    H: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr,
                    LONG_K: tl.constexpr = 0,
                    PDL: tl.constexpr = False, ZERO_DKV: tl.constexpr = False,
                    CAUSAL: tl.constexpr = False):
    """Programs [0, cdiv(n_rows, ROWS)): ROWS (token, head) pairs each, token-major, their
    delta. They also zero the dQ accumulator's n_dq_rows rows of D (the delta programs
    their own rows, those past n_rows as grid-stride shares: a broadcast-Q call's slots
    may hold more rows or fewer) and the tile counter sched_ptr[0]
    (jagged.tiles.dq_accumulator). LONG_K (key windows): only the rows the windows
    reduce-add into (`_accumulated`; under jagged.tiles.windows_direct dq_acc_ptr is dQ
    itself and they are the rows past the last sequence), by WIN_TOK tokens a program in
    programs of their own after the delta ones (`pre_programs`): the delta programs
    search nothing. ZERO_DKV (tiles split over programs): each program also zeroes its
    grid-stride share of the fp32 dK / dV accumulators, n_kv_rows rows of D
    (jagged.tiles.dkv_accumulator; no launch of their own). PDL: the kernel queued behind
    may launch at once (it waits for these writes itself)."""
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    d = tl.arange(0, D)
    if ZERO_DKV:
        for r0 in range(pid * ROWS, n_kv_rows, tl.num_programs(0) * ROWS):
            rk = r0 + tl.arange(0, ROWS)
            tl.store(dkv_acc_ptr + rk[:, None].to(tl.int64) * D + d[None, :],
                     tl.zeros([ROWS, D], dtype=tl.float32), mask=(rk < n_kv_rows)[:, None])
    n_delta = tl.cdiv(n_rows, ROWS)
    if pid < n_delta:
        r = pid * ROWS + tl.arange(0, ROWS)
        tok = r // H
        h = r % H
        valid = r < n_rows
        o = tl.load(out_ptr + tok[:, None] * stride_o_tok + h[:, None] * stride_o_h
                    + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        do = tl.load(dout_ptr + tok[:, None] * stride_do_tok + h[:, None] * stride_do_h
                     + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        tl.store(delta_ptr + h * stride_delta_h + tok, tl.sum(o * do, axis=1), mask=valid)
        if not LONG_K:  # dq_acc is [rows, H, D] contiguous fp32: row r is r*D
            tl.store(dq_acc_ptr + r[:, None] * D + d[None, :],
                     tl.zeros([ROWS, D], dtype=tl.float32),
                     mask=(valid & (r < n_dq_rows))[:, None])
    elif LONG_K:  # a program of WIN_TOK tokens: their rows, all heads
        n_tok = n_rows // H
        ztok = (pid - n_delta) * WIN_TOK + tl.arange(0, WIN_TOK)
        zero = (ztok < n_tok) & _accumulated(cu_q_ptr, cu_k_ptr, B,
                                             tl.minimum(ztok, n_tok - 1), ROUNDS, LONG_K,
                                             CAUSAL)
        for hz in range(0, H):
            tl.store(dq_acc_ptr + (ztok * H + hz).to(tl.int64)[:, None] * D + d[None, :],
                     tl.zeros([WIN_TOK, D], dtype=tl.float32), mask=zero[:, None])
    if pid == 0:
        tl.store(sched_ptr, 0)
    grid_rows = tl.num_programs(0) * ROWS
    for r0 in range(n_rows + pid * ROWS, n_dq_rows, grid_rows):
        rt = r0 + tl.arange(0, ROWS)
        tl.store(dq_acc_ptr + rt[:, None].to(tl.int64) * D + d[None, :],
                 tl.zeros([ROWS, D], dtype=tl.float32), mask=(rt < n_dq_rows)[:, None])


@triton.jit
def _accumulated(cu_q_ptr, cu_k_ptr, B, tok, ROUNDS, LONG_K: tl.constexpr,
                 CAUSAL: tl.constexpr = False):
    """Key windows: whether packed query rows `tok` take their dQ from the fp32
    accumulator: rows of a sequence of more than LONG_K keys, whose key blocks are windows
    of their own, rows past the last sequence (zeros) and, CAUSAL, rows that see no key
    of their sequence (zeros: a window's walk starts past its first sequence's,
    schedule.kv_window_coords). Every other row's sequence is whole in one window
    (jagged.tiles.windows), which stores its dQ (`_store_dq`)."""
    seq = sequence_of(tok, cu_q_ptr, B, ROUNDS)
    return dq_accumulated(cu_q_ptr, cu_k_ptr, B, seq, tok, LONG_K, CAUSAL)


@triton.jit
def _window_rows(cu_q_ptr, cu_k_ptr, win_ptr, n_win, col_rows_ptr,
                 BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, PDL: tl.constexpr = False):
    """Key windows (jagged.tiles.window_tiles over cu_k: win = each window's first and last
    sequence and first key): one program per window; each of its packed key columns gets
    the packed query rows [lo, hi) of its own sequence that see it (seqinfo.row_seq,
    col_q_range), into col_rows [2, n_win * BLOCK_N] at the column's packed index (each
    column written by its own window; `_col_bounds` gives the columns past a window's keys
    no row). The main kernel's consumers load them: row_seq's loop there costs 13 spill instructions
    at D = 128 (and 6-22 in the load task, which runs on the compiler's few registers).
    PDL: as _bwd_preprocess's."""
    if PDL:
        gdc_launch_dependents()
    w = tl.program_id(0)
    s_first = tl.load(win_ptr + w)
    if s_first >= 0:  # live
        s_last = tl.load(win_ptr + n_win + w)
        cols = tl.load(win_ptr + 2 * n_win + w) + tl.arange(0, BLOCK_N)
        seq = row_seq(cu_k_ptr, s_first, s_last, cols, ROW_SEQ_CHUNK)
        lo, hi = col_q_range(cu_q_ptr, cu_k_ptr, seq, cols, CAUSAL)
        own = cols < tl.load(cu_k_ptr + s_last + 1)  # the next window's keys are its own
        tl.store(col_rows_ptr + cols, lo, mask=own)
        tl.store(col_rows_ptr + n_win * BLOCK_N + cols, hi, mask=own)


# ----------------------------------------------------------------------------- helpers
@triton.jit
def _buf_phase(cnt, NUM: tl.constexpr):
    """Ring slot and mbarrier parity of the cnt-th use of a NUM-deep ring."""
    return cnt % NUM, (cnt // NUM) & 1


@triton.jit
def _opaque(x):  # role: compute
    """x through a mov the compiler cannot see through or hoist (volatile inline asm)."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def lse_log2(lse):  # role: compute
    """lse * log2(e) for P = exp2(S * scale * log2(e) - lse_log2); rows that saw no key
    (lse = -inf) get +inf, so P = 0 there as on rows past the sequence."""
    return tl.where(lse == float("-inf"), float("inf"), lse) * 1.4426950408889634


@triton.jit
def _coords(t, pid, tiles, HKV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr,
            WINDOWS: tl.constexpr, PARTS: tl.constexpr = 1):  # role: schedule
    """Tile t -> KVTile, from the (sequence, KV block) list or the key-window list, each
    tile split PARTS ways."""
    if WINDOWS:
        return kv_window_coords(t, tiles, HKV, BLOCK_M, BLOCK_N, CAUSAL, PARTS)
    else:
        return kv_tile_coords(t, pid, tiles, HKV, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q,
                              PARTS)


@triton.jit
def _col_bounds(col_rows, tiles, tile, c0: tl.constexpr, N: tl.constexpr,
                BLOCK_N: tl.constexpr):  # role: compute
    """Key window columns [c0, c0 + N): the query rows [lo, hi) (from tile.q_start) each
    meets, as `_window_rows` wrote them (col_rows [2, windows * BLOCK_N])."""
    c = c0 + tl.arange(0, N)
    cols = tile.k_start + c
    lo = tl.load(col_rows + cols)
    hi = tl.where(c < tile.len_k, tl.load(col_rows + tiles.L_q * BLOCK_N + cols), lo)
    return lo - tile.q_start, hi - tile.q_start


@triton.jit
def _window_keys(tiles, tile):  # role: schedule
    """The keys of a key window's sequences: at most BLOCK_N where the window holds them
    all (jagged.tiles.windows: whole sequences, not a block of a longer one); then a
    step's dQ is its rows' whole dQ, stored once in q's dtype (`_store_dq`), not
    reduce-added."""
    return tile.keys


@triton.jit
def _store_dq(grads, dqt, tile, h, offs_m, col0, H: tl.constexpr,
              D: tl.constexpr):  # role: compute
    """An owned window's step: dQ^T [columns, rows offs_m] (columns col0 on, of head h),
    times the softmax scale, into dQ in q's dtype, the window's rows only."""
    cols = col0 + tl.arange(0, dqt.shape[0])
    rows = (tile.q_start + offs_m).to(tl.int64)
    ptrs = grads.dq + (rows[None, :] * H + h) * D + cols[:, None]
    tl.store(ptrs, (dqt * grads.scale).to(grads.dq.dtype.element_ty),
             mask=(offs_m < tile.len_q)[None, :])


@triton.jit
def _masked(pt, offs_n, offs_m, tile, bounds, CAUSAL: tl.constexpr,
            WINDOWS: tl.constexpr):  # role: compute
    """P^T (keys x query rows) zero outside its mask: CAUSAL the sequence's bottom-right
    triangle (_causal_select), else _keep's."""
    if CAUSAL and not WINDOWS:
        return _causal_select(pt, offs_n, offs_m, tile)
    else:
        return tl.where(_keep(offs_n, offs_m, tile, bounds, WINDOWS), pt, 0.0)


@triton.jit
def _keep(offs_n, offs_m, tile, bounds, WINDOWS: tl.constexpr):  # role: compute
    """P^T's mask where it is not the causal triangle: WINDOWS, row offs_m (from
    tile.q_start) in each key's [lo, hi) (`bounds`, _col_bounds); else the keys inside
    the sequence."""
    if WINDOWS:
        lo, hi = bounds
        return (offs_m[None, :] >= lo[:, None]) & (offs_m[None, :] < hi[:, None])
    else:
        return (offs_n < tile.len_k)[:, None]


@triton.jit
def _causal_select(pt, offs_n, offs_m, tile):  # role: compute
    """pt where key offs_n is visible to row offs_m (seqinfo.causal_visible), else 0: a
    compare and a select a score, at pt's use (as a tl.where, ptxas issues the compares,
    which need no wgmma, ahead of the wgmma wait and carries their 64 predicates packed
    in integer registers: 4-5 instructions a score). A row past the sequence needs no
    test (its lse loads as +inf: P = 0), and a row inside it sees no key past it (j <=
    i + len_k - len_q < len_k)."""
    last = causal_last_key(offs_m, tile.len_q, tile.len_k)
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.le.s32 p, $2, $3; selp.f32 $0, $1, 0f00000000, p; }",
        "=r,r,r,r", [pt, offs_n[:, None], last[None, :]], dtype=tl.float32, is_pure=True,
        pack=1)


@triton.jit
def _unmasked_from(tile, nc0, BNC: tl.constexpr, CAUSAL: tl.constexpr):  # role: compute
    """The first query row from which a step's rows see all of the consumer's keys [nc0,
    nc0 + BNC): CAUSAL, the first that sees the last of them; none where they run past
    the sequence. Steps from there need no mask."""
    first = causal_q_start(nc0 + BNC - 1, tile.len_q, tile.len_k) if CAUSAL else nc0 * 0
    return tl.where(nc0 + BNC > tile.len_k, tile.len_q + 1, first)


@triton.jit
def _mask_p(pt, offs_n, offs_m, tile, bounds, m0, m_from, CAUSAL: tl.constexpr,
            WINDOWS: tl.constexpr, SKIP: tl.constexpr):  # role: compute
    """P^T masked (_masked) on the steps that need it: with SKIP those whose first row m0
    is below m_from (_unmasked_from), else (and over key windows) every step. Rows past
    the sequence need none (their lse loads as +inf: P = 0)."""
    if WINDOWS or not SKIP:
        pt = _masked(pt, offs_n, offs_m, tile, bounds, CAUSAL, WINDOWS)
    elif m0 < m_from:
        pt = _masked(pt, offs_n, offs_m, tile, bounds, CAUSAL, WINDOWS)
    return pt


# ----------------------------------------------------------------------------- roles
@triton.jit
def load(descs, smem, bars, tiles, stats,
         H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
         BROADCAST_Q: tl.constexpr, NUM_BUF: tl.constexpr, NC: tl.constexpr,
         NKV: tl.constexpr, DQ_COLS: tl.constexpr, REDUCE_DQ: tl.constexpr,
         DYNAMIC: tl.constexpr, DQ_SUM: tl.constexpr, DQ_ROWS: tl.constexpr,
         WINDOWS: tl.constexpr, PARTS: tl.constexpr):
    """The producer: per tile K and V, per Q step Q and dO, by TMA. With smem.lse (64- and
    128-row steps) also the step's lse2 / delta into smem, and with REDUCE_DQ reduce_dq's
    work, one step behind."""
    G: tl.constexpr = H // HKV
    BNC: tl.constexpr = BLOCK_N // NC
    ELT: tl.constexpr = tlx.size_of(tlx.dtype_of(descs.q))
    pid = tl.program_id(0)
    first, step, n_tiles = tile_range(pid, tl.num_programs(0), tiles.n_tiles, HKV, BROADCAST_Q,
                                      PARTS)
    i = 0
    qcnt = 0
    if REDUCE_DQ:  # reduce_dq's work, one step behind (see below)
        slot_row = dq_slot_row(pid, tiles, HKV, BROADCAST_Q)
        dq_row = pid * 0  # the previous step's dQ rows and head
        dq_h = pid * 0
    t = first
    if DYNAMIC:
        publish_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, 0)
    while t < n_tiles:
        tile = _coords(t, pid, tiles, HKV, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q, WINDOWS,
                       PARTS)
        # K, V of the tile into stage i % NKV, freed by both consumers at the end of the tile
        kvb, kph = _buf_phase(i, NKV)
        tlx.barrier_wait(bars.kv_empty[kvb], kph ^ 1)
        tlx.barrier_expect_bytes(bars.kv_full[kvb], 2 * ELT * BLOCK_N * D)
        krow = (tile.k_start + tile.n0).to(tl.int32)
        for c in tl.static_range(NC):
            tlx.async_descriptor_load(descs.k, smem.k[kvb * NC + c],
                                      [krow + c * BNC, tile.hk * D], bars.kv_full[kvb])
            tlx.async_descriptor_load(descs.v, smem.v[kvb * NC + c],
                                      [krow + c * BNC, tile.hk * D], bars.kv_full[kvb])
        # Q, dO per (query head of the group, Q block): the tile's, or its part's
        j0, j1 = part_steps(t, G * tile.n_m, PARTS)
        for j in range(j0, j1):
            h = tile.hk * G + j // tile.n_m
            m0 = tile.m_lo + (j % tile.n_m) * BLOCK_M
            buf, ph = _buf_phase(qcnt, NUM_BUF)
            if smem.lse is not None:  # the step's lse2 / delta; LDG before the wait hides L2
                offs = m0 + tl.arange(0, BLOCK_M)
                off = h * stats.stride_h + tile.o_start + offs
                inb = offs < tile.len_q
                lse2 = lse_log2(tl.load(stats.lse + off, mask=inb, other=float("inf")))
                dl = tl.load(stats.delta + off, mask=inb, other=0.0)
            tlx.barrier_wait(bars.q_empty[buf], ph ^ 1)
            if smem.lse is not None:
                # plain st.shared, published by the expect-bytes arrive below: it is lowered
                # as bar.sync over this warpgroup, then one thread's mbarrier.arrive
                # (.release.cta), and the consumers' q_full wait acquires. So q_full keeps
                # arrive_count 1 (that arrive + the TMA bytes), and q_empty (both consumers
                # arrive after their last read of the stage) also guards these two rows.
                tlx.local_store(smem.lse[buf], lse2)
                tlx.local_store(smem.delta[buf], dl)
            tlx.barrier_expect_bytes(bars.q_full[buf], 2 * ELT * BLOCK_M * D)
            tlx.async_descriptor_load(descs.q, smem.q[buf], [(tile.q_start + m0).to(tl.int32),
                                                             h * D], bars.q_full[buf])
            tlx.async_descriptor_load(descs.do, smem.do[buf], [(tile.o_start + m0).to(tl.int32),
                                                               h * D], bars.q_full[buf])
            if REDUCE_DQ:
                # reduce_dq folded in (3 warpgroups, so the consumers get 240 registers):
                # step qcnt - 1's dQ, after step qcnt's loads were issued. No deadlock: the
                # q_empty wait above needs the consumers past step qcnt - 2, whose dq_empty
                # wait needed the reduce of step qcnt - 3 (done an iteration ago); this
                # dq_full wait needs step qcnt - 1 done, whose Q/dO were issued a step ago
                # and whose dq_empty wait needed the reduce of step qcnt - 2 (done). The
                # K/V wait at a tile start needs only the previous tile's steps done, and
                # those wait on reduces up to the one before their last step.
                if qcnt > 0:
                    _reduce_step(descs.dq, smem, bars, dq_row, dq_h, qcnt - 1, True, D, NC,
                                 DQ_COLS, DQ_SUM, DQ_ROWS)
                dq_row = (slot_row + tile.q_start + m0).to(tl.int32)
                dq_h = h
            qcnt += 1
        i += 1
        # the next tile, taken once this one's loads are issued (two steps before its end)
        t = next_tile(t, step, tiles.sched, DYNAMIC)
        if DYNAMIC:
            publish_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, i)
    if REDUCE_DQ:
        if qcnt > 0:  # the last step's dQ
            _reduce_step(descs.dq, smem, bars, dq_row, dq_h, qcnt - 1, True, D, NC, DQ_COLS,
                         DQ_SUM, DQ_ROWS)


@triton.jit
def compute(smem, bars, tiles, stats, grads, col_rows,
            H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
            BROADCAST_Q: tl.constexpr, NUM_BUF: tl.constexpr, NC: tl.constexpr,
            DQ_COLS: tl.constexpr, cid: tl.constexpr, NKV: tl.constexpr,
            DYNAMIC: tl.constexpr, DQ_SUM: tl.constexpr, Q_LOOP_STAGES: tl.constexpr,
            ROW_SPLIT: tl.constexpr, WINDOWS: tl.constexpr, SDP_TOGETHER: tl.constexpr,
            PARTS: tl.constexpr):
    """Consumer cid: per tile its 64 keys against every Q step of the tile's query heads;
    per step dV_c, dK_c and its part of dQ (staged for reduce_dq); at the tile's end the
    store. cid comes in as an argument: a jit helper is traced once per signature, so
    async_task_replica_id() read here would give both replicas cid = 0 (a hang: dq_full[1]
    never arrives).

    Dot schedule: the waits below keep S^T with dP^T, dV with dS^T and dK with dQ in
    flight, but Triton's pipeliner (its wgmma pass runs on loops at num_stages=1 too) puts
    a wgmma wait 0 right after every dot of the Q-step loop (none is a pure loop-carried
    accumulator, and the loop arrives on barriers), so the dots of a step run one after
    the other. The loop at num_stages=0 (Q_LOOP_STAGES) skips that pass: 3 waits of 0 a
    step instead of 9, spill-free.

    Registers (sm_90a): no spill. At D = 128 the K_c / V_c wgmma descriptors (8 k-steps
    each) are formed per Q step from an opaque copy of the stage index (_opaque): hoisted
    out of the loop they held ~40 registers and the tile loop spilled 24-54 instructions.

    lse / delta at 32-row steps: loaded one step ahead (step 0's before the loop) and
    carried in the S^T accumulator's slice layout, so no LDG result is read in the
    iteration that loads it (llm B8 H16 8192: 30.3 -> 25.4 ms, causal 18.06 -> 15.85 ms
    against loading them in their own step). At 64- and 128-row steps the load task
    stages them in smem (smem.lse / smem.delta), read at use.

    WINDOWS: the tile is a key window; each key's query rows (_col_bounds, read at the
    tile's start) mask every step."""
    G: tl.constexpr = H // HKV
    BNC: tl.constexpr = BLOCK_N // NC
    pid = tl.program_id(0)
    first, step, n_tiles = tile_range(pid, tl.num_programs(0), tiles.n_tiles, HKV, BROADCAST_Q,
                                      PARTS)
    qk_scale2 = grads.scale * 1.4426950408889634
    i = 0
    qcnt = 0
    dqc = smem.dq[cid]
    t = first
    if DYNAMIC:
        t = fetch_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, step, 0, DYNAMIC)
    while t < n_tiles:
        tile = _coords(t, pid, tiles, HKV, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q, WINDOWS,
                       PARTS)
        nc0 = tile.n0 + cid * BNC
        offs_n = nc0 + tl.arange(0, BNC)
        m_from = _unmasked_from(tile, nc0, BNC, CAUSAL)
        if WINDOWS:
            bounds = _col_bounds(col_rows, tiles, tile, cid * BNC, BNC, BLOCK_N)
            owned = _window_keys(tiles, tile) <= BLOCK_N
        else:
            bounds = None
            owned = False
        dk = tl.zeros([BNC, D], dtype=tl.float32)
        dv = tl.zeros([BNC, D], dtype=tl.float32)
        kvb, kph = _buf_phase(i, NKV)
        tlx.barrier_wait(bars.kv_full[kvb], kph)
        kc = smem.k[kvb * NC + cid]
        vc = smem.v[kvb * NC + cid]
        j0, j1 = part_steps(t, G * tile.n_m, PARTS)
        # step j0's LSE / delta: a whole tile's is head hk * G, rows m_lo + [0, BLOCK_M)
        # (all masked off when n_m == 0: then m_lo >= len_q); rows past the sequence -> P = 0
        if smem.lse is None:  # (with smem.lse: staged per Q stage by the load task)
            h_0 = tile.hk * G
            offs_0 = tile.m_lo + tl.arange(0, BLOCK_M)  # (names not reused in the loop)
            ok_0 = offs_0 < tile.len_q
            if PARTS > 1:  # a part's first step (an empty part reads nothing)
                n_m1 = tl.maximum(tile.n_m, 1)
                h_0 += j0 // n_m1
                offs_0 += (j0 % n_m1) * BLOCK_M
                ok_0 = (offs_0 < tile.len_q) & (j0 < j1)
            off_0 = h_0 * stats.stride_h + tile.o_start + offs_0
            lse_nx = tl.load(stats.lse + off_0, mask=ok_0, other=float("inf"))
            delta_nx = tl.load(stats.delta + off_0, mask=ok_0, other=0.0)
        # (a loop's own num_stages wins over the launch's: Q_LOOP_STAGES)
        if ROW_SPLIT:  # 128-row steps (D = 64): _row_step (no key windows at 128 rows)
            # (the loops stay here: one inside a jit helper gives other SASS, its
            # registers renumbered)
            rt = RowTile(smem, bars, tile, bounds, kvb, kc, vc, offs_n, dqc, qk_scale2)
            if CAUSAL and not BROADCAST_Q:
                # causal: per query head its masked steps, then those that need no
                # mask, each run its own loop (a branch in one loop spilled 41 a step)
                n_m = tl.maximum(tile.n_m, 1)
                jm_from = tl.minimum(tl.cdiv(tl.maximum(m_from - tile.m_lo, 0), BLOCK_M),
                                     n_m)
                jj = j0
                while jj < j1:
                    hb = jj - jj % n_m  # the head's first step
                    seg = tl.minimum(j1, hb + n_m)
                    mend = tl.minimum(seg, tl.maximum(jj, hb + jm_from))
                    for j in tl.range(jj, mend, num_stages=Q_LOOP_STAGES):
                        dk, dv = _row_step(rt, qcnt, dk, dv, j, CAUSAL, BLOCK_M, BNC, NC,
                                           NUM_BUF, cid, WINDOWS, SDP_TOGETHER, True)
                        qcnt += 1
                    for j in tl.range(mend, seg, num_stages=Q_LOOP_STAGES):
                        dk, dv = _row_step(rt, qcnt, dk, dv, j, CAUSAL, BLOCK_M, BNC, NC,
                                           NUM_BUF, cid, WINDOWS, SDP_TOGETHER, False)
                        qcnt += 1
                    jj = seg
            else:
                for j in tl.range(j0, j1, num_stages=Q_LOOP_STAGES):
                    dk, dv = _row_step(rt, qcnt, dk, dv, j, CAUSAL, BLOCK_M, BNC, NC, NUM_BUF,
                                       cid, WINDOWS, SDP_TOGETHER, True)
                    qcnt += 1
        else:  # 64- and 32-row steps
            for j in tl.range(j0, j1, num_stages=Q_LOOP_STAGES):
                jm = j % tile.n_m
                h = tile.hk * G + j // tile.n_m
                m0 = tile.m_lo + jm * BLOCK_M
                buf, ph = _buf_phase(qcnt, NUM_BUF)
                offs_m = m0 + tl.arange(0, BLOCK_M)
                if smem.lse is None:
                    lse = lse_nx  # loaded during the previous step (or before the loop)
                    delta = delta_nx
                tlx.barrier_wait(bars.q_full[buf], ph)
                qb = smem.q[buf]
                dob = smem.do[buf]
                if D >= 128:  # K_c / V_c descriptors per Q block, not held over the loop
                    kvq = _opaque(kvb)
                    kc = smem.k[kvq * NC + cid]
                    vc = smem.v[kvq * NC + cid]
                # S^T = K_c Q^T and dP^T = V_c dO^T, both in flight together
                st = tlx.async_dot(kc, tlx.local_trans(qb))
                dpt = tlx.async_dot(vc, tlx.local_trans(dob))
                # The next step's LSE / delta, in flight under the rest of this step.
                # Next step: the next Q block of head h, or block 0 of head h + 1; at the
                # last step the index stays on this step's block (an in-bounds address) and
                # the mask is all false, so nothing is read. Each load comes after this
                # step's last use of the value it replaces (LSE: lse2, delta: dS^T), so
                # ptxas keeps one set of registers per value, no copies; it issues the LSE
                # loads just before the dK wait (ahead of the dQ wgmmas, the dQ handoff and
                # the next Q/dO wait), the delta loads about as early.
                if smem.lse is None:
                    more = j + 1 < j1
                    wrap = jm == tile.n_m - 1
                    h_nx = tl.where(more & wrap, h + 1, h)
                    m0_nx = tl.where(more, tl.where(wrap, tile.m_lo, m0 + BLOCK_M), m0)
                    offs_nx = m0_nx + tl.arange(0, BLOCK_M)
                    rmask_nx = (offs_nx < tile.len_q) & more
                    off_nx = h_nx * stats.stride_h + tile.o_start + offs_nx
                    lse2 = lse_log2(lse)
                    lse_nx = tl.load(stats.lse + off_nx, mask=rmask_nx, other=float("inf"))
                st = tlx.async_dot_wait(1, st)
                if smem.lse is not None:  # read at use: no registers held across the step
                    lse2 = tlx.local_load(smem.lse[buf])
                pt = tl.math.exp2(st * qk_scale2 - lse2[None, :])
                pt = _mask_p(pt, offs_n, offs_m, tile, bounds, m0, m_from, CAUSAL, WINDOWS,
                             CAUSAL and D == 128 and BLOCK_M == 64 and not BROADCAST_Q)
                lp = pt.to(kc.dtype)
                dv = tlx.async_dot(lp, dob, dv)                   # dV_c += P^T dO
                dpt = tlx.async_dot_wait(1, dpt)
                if smem.lse is not None:
                    delta = tlx.local_load(smem.delta[buf])
                dst = (pt * (dpt - delta[None, :])).to(kc.dtype)
                if smem.lse is None:
                    delta_nx = tl.load(stats.delta + off_nx, mask=rmask_nx, other=0.0)
                sb = (qcnt % 2) * NC
                dk = tlx.async_dot(dst, qb, dk)                   # dK_c += dS^T Q
                # dQ, swapped so the wgmma's M is the head dim: dS^T goes to smem (double-
                # buffered by Q-block parity). At D >= 128 the consumers meet, then each
                # forms its DQ_COLS columns over all BLOCK_N keys:
                #   dQ^T[cols_c] = sum_c2 K_c2[:, cols_c]^T dS_c2^T
                # (one reduce-add per Q block); at D = 64 (a wgmma's M is at least 64) each
                # forms all D columns over its own keys: dQ^T = K_c^T dS_c^T.
                tlx.local_store(smem.ds[sb + cid], dst)
                tlx.fence_async_shared()
                if DQ_COLS < D:
                    tlx.named_barrier_wait(DS_BARRIER, NC * 128)
                    dqt = tl.zeros([DQ_COLS, BLOCK_M], dtype=tl.float32)
                    for c2 in tl.static_range(NC):
                        kt = tlx.local_trans(tlx.local_slice(smem.k[kvb * NC + c2],
                                                             [0, cid * DQ_COLS],
                                                             [BNC, DQ_COLS]))
                        dqt = tlx.async_dot(kt, smem.ds[sb + c2], dqt)
                else:
                    dqt = tlx.async_dot(tlx.local_trans(kc), smem.ds[sb + cid])
                # dV and dK done (the dQ^T wgmma, the last issued, may run on): the
                # Q/dO stage is free before dQ^T completes
                dv = tlx.async_dot_wait(1, dv)
                dk = tlx.async_dot_wait(1, dk)
                tlx.barrier_arrive(bars.q_empty[buf], 1)          # Q/dO stage free
                dqt = tlx.async_dot_wait(0, dqt)
                if DQ_SUM:
                    if cid == NC - 1:
                        # D = 64: the others' full-D partials added here (their staging, read
                        # in the accumulator's layout), so one box a step is reduce-added to
                        # the fp32 dQ in global memory instead of NC (half the traffic)
                        for c2 in tl.static_range(NC - 1):
                            tlx.barrier_wait(bars.dq_full[c2], qcnt & 1)
                            dqt += tlx.local_load(tlx.local_trans(smem.dq[c2]))
                            tlx.barrier_arrive(bars.dq_empty[c2], 1)
                # stage this consumer's dQ columns for the reduce task (DQ_SUM: the others'
                # for the last consumer, above); an owned window's whole dQ goes straight to
                # dQ instead, and the hand-over stays (the reduce task adds nothing)
                tlx.barrier_wait(bars.dq_empty[cid], (qcnt & 1) ^ 1)  # one stage per consumer
                if WINDOWS and (cid == NC - 1 or not DQ_SUM):
                    if owned:
                        _store_dq(grads, dqt, tile, h, offs_m,
                                  cid * DQ_COLS if DQ_COLS < D else 0, H, D)
                    else:
                        tlx.local_store(tlx.local_trans(dqc), dqt)
                else:
                    tlx.local_store(tlx.local_trans(dqc), dqt)
                tlx.fence_async_shared()
                tlx.barrier_arrive(bars.dq_full[cid], 1)
                qcnt += 1
        # V_c is read by this consumer alone, and no longer: it stages the stores
        if PARTS > 1:  # a split tile: add them
            store_add(grads, dk, dv, vc, tile, nc0, BNC, D)
        else:
            store(grads, dk, dv, vc, tile, nc0, BNC, D)
        tlx.fence("async_shared")  # our generic smem writes before the next TMA write
        tlx.barrier_arrive(bars.kv_empty[kvb], 1)             # K/V stage free
        i += 1
        t = fetch_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, step, i, DYNAMIC)


@triton.jit
def _row_step(rt, qcnt, dk, dv, j, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
              BNC: tl.constexpr, NC: tl.constexpr, NUM_BUF: tl.constexpr, cid: tl.constexpr,
              WINDOWS: tl.constexpr, SDP_TOGETHER: tl.constexpr, MASK: tl.constexpr):
    """compute's step j at 128 rows (D = 64) of tile rt (a RowTile): the Q/dO wait,
    _step_rows (P^T masked if MASK: compute's causal split runs the steps that need no
    mask with MASK=False), the stage's release and the dQ hand-over (no DQ_SUM at 128
    rows); returns dK_c, dV_c."""
    smem = rt.smem
    bars = rt.bars
    tile = rt.tile
    m0 = tile.m_lo + (j % tile.n_m) * BLOCK_M
    buf, ph = _buf_phase(qcnt, NUM_BUF)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    tlx.barrier_wait(bars.q_full[buf], ph)
    dk, dv, dqt = _step_rows(rt.kc, rt.vc, smem.q[buf], smem.do[buf], smem, buf, rt.kvb, qcnt,
                             dk, dv, rt.offs_n, offs_m, tile, rt.bounds, rt.qk_scale2, CAUSAL,
                             BLOCK_M, BNC, NC, cid, WINDOWS, SDP_TOGETHER, MASK)
    # dV and dK done (the last dQ wgmma may run on): the Q/dO stage is free
    dv = tlx.async_dot_wait(1, dv)
    dk = tlx.async_dot_wait(1, dk)
    tlx.barrier_arrive(bars.q_empty[buf], 1)          # Q/dO stage free
    dqt = tlx.async_dot_wait(0, dqt)
    tlx.barrier_wait(bars.dq_empty[cid], (qcnt & 1) ^ 1)
    tlx.local_store(rt.dqc, dqt)
    tlx.fence_async_shared()
    tlx.barrier_arrive(bars.dq_full[cid], 1)
    return dk, dv


@triton.jit
def _step_rows(kc, vc, qb, dob, smem, buf, kvb, qcnt, dk, dv, offs_n, offs_m, tile, bounds,
               qk_scale2, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BNC: tl.constexpr,
               NC: tl.constexpr, cid: tl.constexpr, WINDOWS: tl.constexpr,
               SDP_TOGETHER: tl.constexpr, MASK: tl.constexpr = True):
    """compute's body at 128-row steps (D = 64), from the Q/dO wait to the dQ issue: returns
    dK_c, dV_c and this consumer's dQ rows [BLOCK_M // NC, D] (not transposed), their dots
    in flight. S^T and dP^T are [BNC, 128] here (64 registers each).
    SDP_TOGETHER (the default, the Q loop at num_stages 0, as the CuteDSL twin): FA4's
    order, S^T and dP^T issued together, P^T under dP^T, dS^T, then dV beside dK and dQ.
    Its step loop is spill-free without causal masking (causal: 8 spill instructions a
    step, the mask's registers); the tile's coordinates spill around the Q loop (26
    instructions in all, 74 causal). At num_stages 1 the pipeliner's waits serialize the
    dots and the step loop spills. Otherwise the dots one after the other, P^T and dP^T
    consumed before the next one starts (at most P^T + dP^T + dK + dV, 192 registers)."""
    dt: tl.constexpr = qb.dtype
    RC: tl.constexpr = BLOCK_M // NC  # this consumer's query rows of dQ
    st = tlx.async_dot(kc, tlx.local_trans(qb))                      # S^T = K_c Q^T
    if SDP_TOGETHER:
        dpt = tlx.async_dot(vc, tlx.local_trans(dob))                # dP^T = V_c dO^T
        st = tlx.async_dot_wait(1, st)
    else:
        st = tlx.async_dot_wait(0, st)
    pt = tl.math.exp2(st * qk_scale2 - tlx.local_load(smem.lse[buf])[None, :])
    if MASK:
        pt = _masked(pt, offs_n, offs_m, tile, bounds, CAUSAL, WINDOWS)
    if not SDP_TOGETHER:
        dv = tlx.async_dot(pt.to(dt), dob, dv)                       # dV_c += P^T dO
        dv = tlx.async_dot_wait(0, dv)  # P^T's bf16 copy dies before dP^T (Q_LOOP_STAGES=0)
        dpt = tlx.async_dot(vc, tlx.local_trans(dob))                # dP^T = V_c dO^T
    dpt = tlx.async_dot_wait(0, dpt)
    dst = (pt * (dpt - tlx.local_load(smem.delta[buf])[None, :])).to(dt)
    if SDP_TOGETHER:
        dv = tlx.async_dot(pt.to(dt), dob, dv)                       # dV_c += P^T dO
    dk = tlx.async_dot(dst, qb, dk)                                  # dK_c += dS^T Q
    # dQ of this consumer's RC query rows over all BLOCK_N keys, split by rows (no
    # DQ_SUM): dQ[rows_c] = sum_c2 dS_c2[rows_c] K_c2, A = consumer c2's dS^T columns
    # rows_c read transposed from smem (a whole 128-byte swizzle atom of its rows)
    sb = (qcnt % 2) * NC  # dS^T double-buffered by step parity, as in compute
    tlx.local_store(smem.ds[sb + cid], dst)
    tlx.fence_async_shared()
    tlx.named_barrier_wait(DS_BARRIER, NC * 128)
    dq = tlx.async_dot(_ds_rows(smem.ds, sb, cid, BNC, RC), smem.k[kvb * NC])
    for c2 in tl.static_range(1, NC):
        dq = tlx.async_dot(_ds_rows(smem.ds, sb + c2, cid, BNC, RC), smem.k[kvb * NC + c2],
                           dq)
    return dk, dv, dq


@triton.jit
def _ds_rows(ds_smem, idx, cid: tl.constexpr, BNC: tl.constexpr, RC: tl.constexpr):
    """dS (query rows x keys) of consumer cid's RC rows, from the dS^T tile ds_smem[idx]."""
    return tlx.local_trans(tlx.local_slice(ds_smem[idx], [0, cid * RC], [BNC, RC]))


@triton.jit
def store(grads, dk, dv, stage, tile, nc0, BNC: tl.constexpr, D: tl.constexpr):
    """store: dK_c (times the softmax scale) and dV_c in the input dtype, through `stage`
    (smem of the tile's shape) in slices of ROWS keys: a pointer tensor of the whole
    [BNC, D] tile would cost 128 registers a thread, on top of dK and dV."""
    xk = (dk * grads.scale).to(grads.dk.dtype.element_ty)  # both narrowed first: the fp32
    xv = dv.to(grads.dv.dtype.element_ty)                  # accumulators die here
    _store_rows(grads.dk, xk, stage, tile, nc0, grads, BNC, D, 0, False)
    _store_rows(grads.dv, xv, stage, tile, nc0, grads, BNC, D, 0, False)


@triton.jit
def store_add(grads, dk, dv, stage, tile, nc0, BNC: tl.constexpr, D: tl.constexpr):
    """store's twin for a tile split over programs (jagged.tiles.bwd_parts): dK_c (times
    the softmax scale) and dV_c added in fp32 into the accumulators grads.dk / grads.dv
    point at, half the columns at a time (an fp32 half fills the 16-bit stage)."""
    st = tlx.local_reinterpret(stage, tl.float32, [BNC, D // 2], layout=_add_stage())
    lo, hi = _column_halves(dk * grads.scale, BNC, D)
    _store_rows(grads.dk, lo, st, tile, nc0, grads, BNC, D // 2, 0, True)
    _store_rows(grads.dk, hi, st, tile, nc0, grads, BNC, D // 2, D // 2, True)
    lo, hi = _column_halves(dv, BNC, D)
    _store_rows(grads.dv, lo, st, tile, nc0, grads, BNC, D // 2, 0, True)
    _store_rows(grads.dv, hi, st, tile, nc0, grads, BNC, D // 2, D // 2, True)


@triton.constexpr_function
def _add_stage():
    """The fp32 half-tile view of a 16-bit stage (store_add): rows of 16-byte vectors,
    swizzled over eight. Made at compile time: a layout held in a module global fails
    Triton's launch-time check of the globals a kernel read (deep copies, compared by
    identity)."""
    return tlx.swizzled_shared_layout_encoding(
        vectorSize=4, perPhase=1, maxPhase=8, order=[1, 0], numCTAs=[1, 1],
        numCTAsPerCGA=[1, 1], numCTASplit=[1, 1], numCTAOrder=[1, 1])


@triton.jit
def _column_halves(x, BNC: tl.constexpr, D: tl.constexpr):
    """x [BNC, D] -> (x[:, :D / 2], x[:, D / 2:])."""
    return tl.split(tl.permute(tl.reshape(x, [BNC, 2, D // 2]), [0, 2, 1]))


@triton.jit
def _store_rows(ptr, x, stage, tile, nc0, grads, BNC: tl.constexpr, D: tl.constexpr,
                COL0: tl.constexpr, ADD: tl.constexpr):
    """x [BNC, D] into columns [COL0, COL0 + D) of the tile's keys (ADD: added, fp32)."""
    ROWS: tl.constexpr = 16
    tlx.local_store(stage, x)
    d = COL0 + tl.arange(0, D)
    for r in tl.static_range(BNC // ROWS):
        rows = nc0 + r * ROWS + tl.arange(0, ROWS)
        y = tlx.local_load(tlx.local_slice(stage, [r * ROWS, 0], [ROWS, D]))
        off = ((tile.k_start + rows)[:, None] * grads.stride_tok + tile.hk * grads.stride_h
               + d[None, :])
        # rows start 16-byte aligned (backward allocates dK/dV contiguous): vector stores
        # (ADD: atom.add.v4.f32)
        dst = tl.multiple_of(ptr + off, [1, 16])
        keep = (rows < tile.len_k)[:, None]
        if ADD:
            tl.atomic_add(dst, y, mask=keep, sem="relaxed")
        else:
            tl.store(dst, y, mask=keep)


@triton.jit
def reduce_dq(dq_desc, smem, bars, tiles,
              H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
              BROADCAST_Q: tl.constexpr, NC: tl.constexpr, DQ_COLS: tl.constexpr,
              DYNAMIC: tl.constexpr, DQ_SUM: tl.constexpr, WINDOWS: tl.constexpr,
              PARTS: tl.constexpr):
    G: tl.constexpr = H // HKV
    pid = tl.program_id(0)
    first, step, n_tiles = tile_range(pid, tl.num_programs(0), tiles.n_tiles, HKV, BROADCAST_Q,
                                      PARTS)
    slot_row = dq_slot_row(pid, tiles, HKV, BROADCAST_Q)
    qcnt = 0
    i = 0
    t = first
    if DYNAMIC:
        t = fetch_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, step, 0, DYNAMIC)
    while t < n_tiles:
        tile = _coords(t, pid, tiles, HKV, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q, WINDOWS,
                       PARTS)
        add = _window_keys(tiles, tile) > BLOCK_N if WINDOWS else True
        j0, j1 = part_steps(t, G * tile.n_m, PARTS)
        if WINDOWS:  # the same steps, (head, row) counted without dividing by n_m
            row0 = (tile.q_start + tile.m_lo).to(tl.int32)  # (the warp's 24 registers)
            h = tile.hk * G
            jm = 0
            if PARTS > 1:  # a part's first step
                h += j0 // tl.maximum(tile.n_m, 1)
                jm = j0 % tl.maximum(tile.n_m, 1)
            for j in range(j0, j1):
                _reduce_step(dq_desc, smem, bars, row0 + jm * BLOCK_M, h, qcnt, add, D, NC,
                             DQ_COLS, DQ_SUM)
                qcnt += 1
                jm += 1
                h += (jm == tile.n_m).to(tl.int32)
                jm = tl.where(jm == tile.n_m, 0, jm)
        else:
            for j in range(j0, j1):
                h = tile.hk * G + j // tile.n_m
                m0 = tile.m_lo + (j % tile.n_m) * BLOCK_M
                _reduce_step(dq_desc, smem, bars, (slot_row + tile.q_start + m0).to(tl.int32),
                             h, qcnt, add, D, NC, DQ_COLS, DQ_SUM)
                qcnt += 1
        i += 1
        t = fetch_tile(tiles.sched, bars.tile_full, bars.tile_empty, t, step, i, DYNAMIC)


@triton.jit
def _reduce_step(dq_desc, smem, bars, row, h, qcnt, add,
                 D: tl.constexpr, NC: tl.constexpr, DQ_COLS: tl.constexpr,
                 DQ_SUM: tl.constexpr, DQ_ROWS: tl.constexpr = 0):
    """One Q step's dQ reduce-add (rows from `row`, head h; qcnt: the step's count, for
    the barrier phase): reduce_dq's body, and the load task's at 64-row steps. DQ_SUM: the
    last consumer's box holds the sum of all (compute), the only one added. DQ_ROWS
    (128-row steps): consumer c's box is rows [c * DQ_ROWS, (c + 1) * DQ_ROWS), all D.
    add false (a key window that owns its keys, `_window_keys`): the hand-over only,
    nothing added."""
    C0: tl.constexpr = NC - 1 if DQ_SUM else 0
    for c in tl.static_range(C0, NC):  # consumer c's columns, or all D (each or summed)
        tlx.barrier_wait(bars.dq_full[c], qcnt & 1)
        col = h * D + (c * DQ_COLS if DQ_COLS < D else 0)
        if add:
            if DQ_ROWS:
                tlx.async_descriptor_store(dq_desc, smem.dq[c], [row + c * DQ_ROWS, col],
                                           store_reduce="add")
            else:
                tlx.async_descriptor_store(dq_desc, smem.dq[c], [row, col],
                                           store_reduce="add")
    # rows past the sequence hold exact zeros (P = 0), so whole boxes are added
    tlx.async_descriptor_store_wait(0)
    for c in tl.static_range(C0, NC):
        tlx.barrier_arrive(bars.dq_empty[c], 1)


# ----------------------------------------------------------------------------- kernel
@triton.jit(do_not_specialize=["n_slots"])  # one build whatever the slot count
def bwd_kernel(q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr,
               dq_desc, dk_ptr, dv_ptr,
               cu_q_ptr, cu_k_ptr, tile_b_ptr, tile_n_ptr, n_tiles_ptr, sched_ptr,
               scale, L_q, n_slots, stride_k_tok, stride_k_h, stride_lse_h,
               col_rows,  # key windows: each key column's query rows (_window_rows); None
               dq_ptr,    # key windows: dQ, which owned windows store (_store_dq); None
               H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, DQ_COLS: tl.constexpr,
               DYNAMIC: tl.constexpr,        # tiles from the counter (bwd_dynamic)
               KV_STAGES: tl.constexpr,      # Config.kv_stages
               Q_LOOP_STAGES: tl.constexpr,  # the Q-step loop's num_stages (Config)
               WINDOWS: tl.constexpr = False,  # tiles are key windows (kv_window_coords)
               SDP_TOGETHER: tl.constexpr = False,  # Config.sdp_together
               PARTS: tl.constexpr = 1,  # programs a tile (bwd_parts); dk / dv fp32 if > 1
               HEAD_RUN: tl.constexpr = 1):  # list entries a KV head in turn (bwd_head_run)
    NC: tl.constexpr = NUM_CONSUMERS
    NB: tl.constexpr = NUM_BUF_Q
    BNC: tl.constexpr = BLOCK_N // NC
    dt: tl.constexpr = tlx.dtype_of(q_desc)
    # 64- and 128-row steps: lse2 / delta staged in smem per Q stage by the load task
    # instead of 2 x 16 registers carried a step ahead in each consumer, and no reduce_dq
    # warp: the load task reduces dQ, so the kernel is 3 warpgroups (384 threads) and the
    # consumers get 240 registers (128 x 24 + 256 x 240 <= 65,536)
    M64: tl.constexpr = BLOCK_M >= 64
    # 128-row steps (D = 64 only): the consumers split dQ by query rows (ROW_SPLIT)
    M128: tl.constexpr = BLOCK_M >= 128
    tl.static_assert(D == 64 or not M128, "128-row steps are built for D = 64 only")
    tl.static_assert(M128 or not SDP_TOGETHER, "SDP_TOGETHER is a 128-row step's order")
    # key windows: packed queries, walked statically (no tile counter, even causal)
    tl.static_assert(not WINDOWS or not (BROADCAST_Q or DYNAMIC), "windows: packed, static")
    # key windows hand owned windows' dQ over in reduce_dq's protocol (_reduce_step's add)
    tl.static_assert(not WINDOWS or BLOCK_M < 64, "windows: 32-row steps, the reduce warp")
    NKV: tl.constexpr = KV_STAGES
    REGS_LOAD: tl.constexpr = REGS_REDUCE if M64 else None  # (None: the compiler's)
    REGS_C: tl.constexpr = REGS_COMPUTE_M64 if M64 else REGS_COMPUTE
    # D = 64 below 128-row steps: each consumer forms all D columns of dQ over its keys,
    # and the last one sums them, so one box a step is reduce-added instead of NC
    # (llm B16 H16 2048 1.96 -> 1.89 ms at 64-row steps)
    DQS: tl.constexpr = DQ_COLS == D and not M128
    DQ_ROWS: tl.constexpr = BLOCK_M // NC if M128 else 0  # M128: a consumer's dQ box rows
    # shared memory: K/V halves (NKV stages), Q/dO ring, dS^T halves (two Q blocks deep:
    # a consumer may write the next block's while the other still reads this one's),
    # dQ column-half (M128: row-half) staging per consumer
    smem = Smem(
        k=tlx.local_alloc((BNC, D), dt, NC * NKV),  # [stage * NC + consumer]
        v=tlx.local_alloc((BNC, D), dt, NC * NKV),
        q=tlx.local_alloc((BLOCK_M, D), dt, NB),
        do=tlx.local_alloc((BLOCK_M, D), dt, NB),
        ds=tlx.local_alloc((BNC, BLOCK_M), dt, 2 * NC),
        dq=tlx.local_alloc((DQ_ROWS if M128 else BLOCK_M, DQ_COLS), tl.float32, NC),
        lse=tlx.local_alloc((BLOCK_M,), tl.float32, NB) if M64 else None,  # with the ring
        delta=tlx.local_alloc((BLOCK_M,), tl.float32, NB) if M64 else None)
    bars = Bars(
        kv_full=tlx.alloc_barriers(num_barriers=NKV, arrive_count=1),
        kv_empty=tlx.alloc_barriers(num_barriers=NKV, arrive_count=NC),
        q_full=tlx.alloc_barriers(num_barriers=NB, arrive_count=1),
        q_empty=tlx.alloc_barriers(num_barriers=NB, arrive_count=NC),
        # each consumer thread arrives on its own after fencing its own dQ stores (no
        # warpgroup bar.sync ahead of a thread-0 arrive)
        dq_full=tlx.alloc_warp_barrier(num_barriers=NC, num_warps=4),
        dq_empty=tlx.alloc_barriers(num_barriers=NC, arrive_count=1),
        # DYNAMIC: the tile handoff (two slots), read by the consumers (and reduce_dq)
        tile_full=tlx.alloc_barriers(num_barriers=2, arrive_count=1),
        tile_empty=tlx.alloc_barriers(num_barriers=2, arrive_count=NC if M64 else NC + 1))
    descs = Descs(q_desc, k_desc, v_desc, do_desc, dq_desc)
    tiles = KVTiles(tile_b_ptr, tile_n_ptr, n_tiles_ptr, cu_q_ptr, cu_k_ptr, L_q, sched_ptr,
                    n_slots, HEAD_RUN)
    stats = RowStats(lse_ptr, delta_ptr, stride_lse_h)
    grads = Grads(dk_ptr, dv_ptr, stride_k_tok, stride_k_h, scale, dq_ptr)

    # Launched as a programmatic dependent of the kernel before it (the preprocess, a list
    # kernel or _window_rows, which trigger first): each role waits (gdc_wait) before it
    # touches global memory, and lets the postprocess launch under this kernel
    with tlx.async_tasks():
        with tlx.async_task("default", registers=REGS_LOAD):
            gdc_wait()
            gdc_launch_dependents()
            load(descs, smem, bars, tiles, stats, H, HKV, D, BLOCK_M, BLOCK_N, CAUSAL,
                 BROADCAST_Q, NB, NC, NKV, DQ_COLS, M64, DYNAMIC, DQS, DQ_ROWS, WINDOWS, PARTS)
        with tlx.async_task(num_warps=4, registers=REGS_C, replicate=NC):
            cid: tl.constexpr = tlx.async_task_replica_id()  # per replica, as in fwd_hopper
            gdc_wait()
            gdc_launch_dependents()
            compute(smem, bars, tiles, stats, grads, col_rows, H, HKV, D, BLOCK_M, BLOCK_N,
                    CAUSAL, BROADCAST_Q, NB, NC, DQ_COLS, cid, NKV, DYNAMIC, DQS, Q_LOOP_STAGES,
                    M128, WINDOWS, SDP_TOGETHER, PARTS)
        if not M64:
            with tlx.async_task(num_warps=1, registers=REGS_REDUCE):
                gdc_wait()
                gdc_launch_dependents()
                reduce_dq(dq_desc, smem, bars, tiles, H, HKV, D, BLOCK_M, BLOCK_N, CAUSAL,
                          BROADCAST_Q, NC, DQ_COLS, DYNAMIC, DQS, WINDOWS, PARTS)


# ----------------------------------------------------------------------------- postprocess
@triton.jit
def _bwd_postprocess(dq_acc_ptr, dq_ptr, n_elem, n_slots, slot_stride, scale,
                     dkv_acc_ptr, dk_ptr, dv_ptr, n_kv,
                     BLOCK: tl.constexpr, PDL: tl.constexpr = False, DKV: tl.constexpr = False):
    """dQ = scale * the sum of the accumulator's n_slots slots, BLOCK elements a program;
    DKV: `_cast_dkv` too. PDL: launched as a dependent of the main kernel, so its reads
    wait for it."""
    if PDL:
        gdc_wait()
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elem
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, n_slots):  # in a fixed order
        acc += tl.load(dq_acc_ptr + s * slot_stride + offs, mask=mask, other=0.0)
    tl.store(dq_ptr + offs, (acc * scale).to(dq_ptr.dtype.element_ty), mask=mask)
    if DKV:
        _cast_dkv(dkv_acc_ptr, dk_ptr, dv_ptr, n_kv, tl.program_id(0), tl.num_programs(0),
                  BLOCK)


@triton.jit
def _cast_dkv(dkv_acc_ptr, dk_ptr, dv_ptr, n_kv, pid, nprog, BLOCK: tl.constexpr):
    """Tiles split over programs: program pid of nprog casts its grid-stride share of the
    fp32 dK / dV accumulators ([2, n_kv]: dK then dV, scaled by the parts) into dk and dv,
    each gradient its own allocation (jagged.tiles.grad_buffers); no launch of their own."""
    for b in range(pid, tl.cdiv(n_kv, BLOCK), nprog):
        offs = b * tl.full([], BLOCK, tl.int64) + tl.arange(0, BLOCK)
        mask = offs < n_kv
        tl.store(dk_ptr + offs, tl.load(dkv_acc_ptr + offs, mask=mask, other=0.0)
                 .to(dk_ptr.dtype.element_ty), mask=mask)
        tl.store(dv_ptr + offs, tl.load(dkv_acc_ptr + n_kv + offs, mask=mask, other=0.0)
                 .to(dv_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_post_rows(dq_acc_ptr, dq_ptr, cu_q_ptr, cu_k_ptr, B, ROUNDS, n_tok, HD, scale,
                   dkv_acc_ptr, dk_ptr, dv_ptr, n_kv,
                   LONG_K: tl.constexpr, COLS: tl.constexpr, CAUSAL: tl.constexpr = False,
                   PDL: tl.constexpr = False, DKV: tl.constexpr = False):
    """Key windows: dQ = scale * the accumulator for the rows it holds (`_accumulated`),
    WIN_TOK tokens a program, COLS of their H * D values at a time; the owned windows'
    rows, stored by the main kernel, are left alone (CAUSAL: as the preprocess's). DKV
    (windows split over programs): `_cast_dkv` too. PDL: as _bwd_postprocess's; the
    search reads only the offsets, so it runs ahead of the wait."""
    tok = tl.program_id(0) * WIN_TOK + tl.arange(0, WIN_TOK)
    take = (tok < n_tok) & _accumulated(cu_q_ptr, cu_k_ptr, B, tl.minimum(tok, n_tok - 1),
                                        ROUNDS, LONG_K, CAUSAL)
    if PDL:
        gdc_wait()
    for c0 in range(0, HD, COLS):
        col = c0 + tl.arange(0, COLS)
        offs = tok.to(tl.int64)[:, None] * HD + col[None, :]
        mask = take[:, None] & (col < HD)[None, :]
        acc = tl.load(dq_acc_ptr + offs, mask=mask, other=0.0)
        tl.store(dq_ptr + offs, (acc * scale).to(dq_ptr.dtype.element_ty), mask=mask)
    if DKV:
        _cast_dkv(dkv_acc_ptr, dk_ptr, dv_ptr, n_kv, tl.program_id(0), tl.num_programs(0),
                  WIN_TOK * COLS // 4)


# ----------------------------------------------------------------------------- host
def _desc(t, rows, D, cols=None):
    """2-D TMA descriptor over a contiguous packed [tokens, heads, D] (or [.., tokens,
    heads, D]) tensor seen as [tokens, heads * D], box [rows, cols or D]."""
    row = t.shape[-2] * t.shape[-1]
    return tma_desc(t, (max(t.numel() // row, 1), row), (row, 1), (rows, cols or D))


class Prep(NamedTuple):
    """A backward call's inputs made contiguous, its sizes and its (uninitialized)
    gradients, as both architectures' `backward` set them up."""
    dout: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor
    H: int
    HKV: int
    D: int
    B: int
    Nq: int
    L_q: int             # broadcast-Q: the shared query length; 0 otherwise
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor

    @property
    def empty(self) -> bool:
        """No (query, key) pair anywhere: the gradients are zeros, and nothing launches
        (TMA cannot describe an empty tensor)."""
        return self.dk.shape[0] == 0 or self.B == 0 or self.Nq == 0


def _prepare(dout, q, k, v, out, lse, cu_k, broadcast_q) -> Prep:  # role: host
    """The host prologue of a backward call; an empty call's gradients come zeroed."""
    # dk, dv contiguous (the store assumes 16-byte aligned rows of HKV * D elements)
    p = Prep(dout.contiguous(), out.contiguous(), lse.contiguous(), q.shape[1], k.shape[1],
             q.shape[2], cu_k.shape[0] - 1, out.shape[0], q.shape[0] if broadcast_q else 0,
             *grad_buffers(q, k))
    if p.empty:
        p.dk.zero_(); p.dv.zero_(); p.dq.zero_()
    return p


def _accumulators(p: Prep, broadcast_q, rows=None):  # role: host
    """(dQ accumulator, programs of the main kernel, scheduling buffer):
    jagged.tiles.dq_accumulator (rows: its own, or None for one a query row)."""
    dev = p.dq.device
    return dq_accumulator(p.Nq, p.L_q, p.H, p.HKV, p.D, broadcast_q, num_sms(dev), dev,
                          p.dk.shape[0], rows)


def _preprocess(p: Prep, broadcast_q, dlse, windows=None, acc=None,
                dkv_acc=None, direct=False, causal=False, site=None):  # role: host
    """(a) delta = rowsum(dO * O) - dlse, the dQ accumulator zeroed (broadcast-Q: its slots;
    windows = (cu_q, cu_k): key windows, only the rows they reduce-add into; direct
    (jagged.tiles.windows_direct): those rows of dQ itself, in its dtype; causal: with the
    rows that see no key, `_accumulated`), and dkv_acc (tiles split over programs) in the
    same launch -> (delta, dq_acc, programs of the main kernel, scheduling buffer). acc:
    `_accumulators`' (made here if None)."""
    delta = torch.empty((p.H, p.Nq), device=p.dq.device, dtype=torch.float32)
    dq_acc, grid, sched = acc or _accumulators(p, broadcast_q)
    zeroed = p.dq if direct else dq_acc
    ROWS = 32 if p.D <= 64 else 16
    cu_q, cu_k = windows or (None, None)
    fast_at(_bwd_preprocess, site)[(pre_programs(p.Nq, p.H, ROWS, windows is not None),)](
        p.out, p.dout, delta, zeroed, sched, p.Nq * p.H, p.out.stride(0), p.out.stride(1),
        p.dout.stride(0), p.dout.stride(1), delta.stride(0), cu_q, cu_k, p.B,
        p.B.bit_length(), dkv_acc, 0 if dkv_acc is None else dkv_acc.numel() // p.D,
        zeroed.numel() // p.D, H=p.H, D=p.D, ROWS=ROWS,
        LONG_K=BLOCK_N if windows else 0, PDL=PDL, ZERO_DKV=dkv_acc is not None,
        CAUSAL=bool(causal) and windows is not None, num_warps=4)
    if dlse is not None:  # d lse_i / d s_ij = P_ij: it enters through delta (jagged.api)
        delta -= dlse
    return delta, dq_acc, grid, sched


def window_rows(cu_q, cu_k, win, causal):  # role: host
    """Each key column's query rows over the key windows `win` ([3, n_win], window_tiles
    over cu_k): int32 [2, n_win * BLOCK_N], (lo, hi) packed rows (_window_rows)."""
    n_win = win.shape[1]
    out = torch.empty((2, n_win * BLOCK_N), dtype=torch.int32, device=win.device)
    fast(_window_rows)[(n_win,)](cu_q, cu_k, win, n_win, out, BLOCK_N=BLOCK_N,
                                 CAUSAL=bool(causal), PDL=PDL, num_warps=4)
    return out


def window_lists(cu_q, cu_k, n_k: int, max_k: int, block_m: int, causal):  # role: host
    """(order, count, win, col_rows): the key windows' list (window_tiles over cu_k) and
    each key column's query rows (window_rows), kept together while the offsets tensors
    are unchanged (jagged.tiles.per_offsets), so that an eager call on the offsets of the
    call before launches neither."""
    return per_offsets(_build_window_lists, cu_q, cu_k, n_k, max_k, block_m, bool(causal))


def _build_window_lists(cu_q, cu_k, n_k, max_k, block_m, causal):  # role: host
    order, count, win = window_tiles(cu_k, cu_q, n_k, max_k, BLOCK_N, block_m)
    return order, count, win, window_rows(cu_q, cu_k, win, causal)


def _postprocess(p: Prep, dq_acc, scale, broadcast_q, dkv_acc=None,
                 windows=None, causal=False, site=None):  # role: host
    """(c) dQ = scale * the sum of the accumulator's slots, in q's dtype, into p.dq; with
    dkv_acc (tiles split over programs) also dK / dV from it, in the same launch.
    windows = (cu_q, cu_k): key windows, only the rows the accumulator holds
    (_bwd_post_rows; causal: with the rows that see no key)."""
    pdl = PDL and bwd_dependent(broadcast_q)
    dkv = (dkv_acc, p.dk, p.dv, 0 if dkv_acc is None else p.dk.numel())
    PB = 1024
    if windows is not None:
        HD = p.H * p.D
        fast_at(_bwd_post_rows, site)[(cdiv(p.Nq, WIN_TOK.value),)](
            dq_acc, p.dq, windows[0], windows[1], p.B, p.B.bit_length(), p.Nq, HD,
            float(scale), *dkv, LONG_K=BLOCK_N, COLS=min(POST_COLS, next_pow2(HD)),
            CAUSAL=bool(causal), PDL=PDL, DKV=dkv_acc is not None, num_warps=4,
            launch_pdl=pdl)
    else:
        n_elem = p.dq.numel()
        fast_at(_bwd_postprocess, site)[(cdiv(n_elem, PB),)](
            dq_acc, p.dq, n_elem, slot_count(dq_acc, broadcast_q), p.L_q * p.H * p.D,
            float(scale), *dkv, BLOCK=PB, PDL=PDL, DKV=dkv_acc is not None, num_warps=4,
            launch_pdl=pdl)


class Decisions(NamedTuple):  # role: host
    """A call site's choices (`backward`): key windows, config, programs, parts a tile,
    windows that store every dQ row, list entries a KV head in turn."""
    windows: bool
    cfg: Config
    grid: int
    parts: int
    direct: bool
    head_run: int


_DECIDED: dict = {}  # (site, device) -> Decisions


def _decide(q, k, p: Prep, max_q, max_k, causal, broadcast_q) -> Decisions:  # role: host
    """The call's Decisions: pure functions of its shapes, flags and bounds (`backward`
    makes them once a call site, jagged.launch.once_a_site)."""
    windows = takes_windows(k.shape[0], p.B, max_k, broadcast_q)
    cfg = window_config(p.D) if windows else pick_config(
        p.D, k.shape[0] / p.B, bwd_mean_q(q.shape[0], p.B, broadcast_q))
    grid = bwd_programs(broadcast_q, p.HKV, num_sms(p.dq.device))
    if windows:
        parts = window_parts(q.shape[0], k.shape[0], p.HKV, p.H // p.HKV, cfg.block_m,
                             BLOCK_N, grid, bool(causal), p.B)
    else:
        parts = bwd_parts(q.shape[0], k.shape[0], p.B, p.HKV, p.H // p.HKV, causal,
                          broadcast_q, cfg.block_m, BLOCK_N, grid, int(max_q), int(max_k))
    direct = windows and windows_direct(int(max_k), BLOCK_N, parts)
    head_run = bwd_head_run(k.shape[0], p.B, p.H, p.HKV, int(max_q), p.D, BLOCK_N,
                            bool(causal), broadcast_q, windows)
    return Decisions(windows, cfg, grid, parts, direct, head_run)


def backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q,
             dlse=None):
    """(dq, dk, dv) in q's dtype; the `bwd` of jagged.api.make_jagged_attention. dlse:
    the gradient on lse, or None. See the module docstring for the design."""
    p = _prepare(dout, q, k, v, out, lse, cu_k, broadcast_q)
    if p.empty:
        return p.dq, p.dk, p.dv
    D = p.D
    # every launch argument's specialization follows from these (the shapes, the dtype,
    # the flags and the bounds: the decisions below, the lists' sizes, the strides of
    # contiguous tensors), so the launches skip the plan key (jagged.launch.fast_at)
    site = (q.shape, k.shape, q.dtype, int(max_q), int(max_k), bool(causal),
            bool(broadcast_q), cu_q is None, p.B)
    windows, cfg, grid_main, parts, direct, head_run = once_a_site(
        _DECIDED, (site, q.device),
        lambda: _decide(q, k, p, max_q, max_k, causal, broadcast_q))
    BM = cfg.block_m
    dkv_acc = dkv_accumulator(k, parts)
    acc = _accumulators(p, broadcast_q, BM if direct else None)
    delta, dq_acc, _, sched = _preprocess(p, broadcast_q, dlse,
                                          (cu_q, cu_k) if windows else None, acc, dkv_acc,
                                          direct, causal, site)

    # (b) main
    if windows:  # tile_b: the window order, tile_n: `win`, L_q: the window count
        tile_b, n_tiles, tile_n, col_rows = window_lists(cu_q, cu_k, k.shape[0], max_k, BM,
                                                         causal)
        l_q, dynamic = tile_n.shape[1], False
    else:
        tile_b, tile_n, n_tiles = kv_tiles(cu_q, cu_k, p.L_q, max_k, causal, BM, BLOCK_N)
        l_q, dynamic, col_rows = p.L_q, bwd_dynamic(broadcast_q), None
    dk, dv = (p.dk, p.dv) if dkv_acc is None else (dkv_acc[0], dkv_acc[1])
    kv_rows = BLOCK_N // NUM_CONSUMERS.value
    fast_at(bwd_kernel, site)[(grid_main,)](
        _desc(q, BM, D), _desc(k, kv_rows, D), _desc(v, kv_rows, D), _desc(p.dout, BM, D),
        p.lse, delta, _desc(dq_acc, dq_rows(BM), D, cols=dq_cols(D)),  # a consumer's box
        dk, dv, cu_k if cu_q is None else cu_q, cu_k, tile_b, tile_n, n_tiles, sched,
        float(scale), l_q, slot_count(dq_acc, broadcast_q), p.dk.stride(0), p.dk.stride(1),
        p.lse.stride(0), col_rows, p.dq if windows else None,
        H=p.H, HKV=p.HKV, D=D, BLOCK_M=BM, BLOCK_N=BLOCK_N, CAUSAL=bool(causal),
        BROADCAST_Q=bool(broadcast_q), DQ_COLS=dq_cols(D), DYNAMIC=dynamic,
        KV_STAGES=cfg.kv_stages, Q_LOOP_STAGES=cfg.num_stages, WINDOWS=windows,
        SDP_TOGETHER=sdp_together(cfg, broadcast_q), PARTS=parts, HEAD_RUN=head_run,
        num_warps=4, num_stages=cfg.num_stages, launch_pdl=bwd_dependent(broadcast_q))

    if direct:  # the windows stored every row, the preprocess zeroed the rest
        return p.dq, p.dk, p.dv
    _postprocess(p, dq_acc, scale, broadcast_q, dkv_acc, (cu_q, cu_k) if windows else None,
                 causal, site)
    return p.dq, p.dk, p.dv
