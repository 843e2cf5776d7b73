"""Jagged (varlen, packed) flash-attention backward for Hopper (sm_90a).

    backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale,
             broadcast_q) -> (dq, dk, dv)          # in q's dtype

Three kernels, named after their roles:

(a) `_bwd_preprocess`: delta[h, i] = rowsum(dO * O) in fp32 ([H, Nq], lse's layout),
    and zeroes the fp32 dQ accumulator of the packed modes in the same pass.
(b) `_bwd_main`: a persistent grid (one program per SM) walking a jagged list of KV
    tiles, longest first. The tile list is built on the GPU with torch ops from the
    offsets (`jagged.tiles.kv_tiles`; no host sync): every (sequence, KV block) is a tile,
    its work is the number of Q blocks that see it, tiles are sorted by work
    (descending, stable; causal: by their sequence's largest tile, so a sequence's
    tiles run together and share its Q / dO rows in L2) and dealt round-robin to the
    programs; causal packed lists are taken from a counter instead (the ws kernel:
    `jagged.tiles.bwd_dynamic`). On the GPU the default main kernel is the warp-specialized
    `_bwd_main_ws` (bwd_hopper_ws.py), the same roles as tasks. Per tile the body is
    a table of contents:
        schedule  -> which tile (batch, KV block, KV head), its Q-block range
        load      -> K, V of the tile (once); then Q, dO, LSE, delta per Q block
        compute   -> S^T = K Q^T, P^T = exp2(S^T*scale*log2e - lse*log2e),
                     dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
                     dK += dS^T Q, dQ_part = dS K         (all wgmma, fp32 acc;
                     dQ_part = (K^T dS^T)^T with Config.dq_t, for BLOCK_M < 64)
        reduce_dq -> dQ_part reduce-added (red.global.add.f32) into the fp32 dQ
                     accumulator
        store     -> dK (times scale), dV in the input dtype, masked to the tile
    GQA: a tile owns one KV head and loops over the query heads of its group, so dK/dV
    are summed in registers and stored once (no atomics on dK/dV).
(c) `_bwd_postprocess`: dQ = scale * sum over slots of the fp32 accumulator, cast to
    the input dtype.

Tile configs: `CONFIGS` names the tile shapes (BLOCK_M query rows per step, BLOCK_N
keys per tile, warps, pipeline stages, dq_t); `pick_config` picks the default per
head dim and length bucket (short: max_seqlen_k <= 64 or mean keys per sequence <= 32);
`backward(..., config=name)` or the env var JAGGED_BWD_CONFIG overrides it. "base" is
v1's shape and "base_s3" (the default) the same with three stages; both spill at D=128,
and still beat the configs in `SPILL_FREE`, which compile with no spills
(tests/test_bwd_compile.py, PERF.md).

Broadcast-Q (dQ is a sum over the whole batch, B=1152 in GEM): programs are pinned to a
KV head (program p owns head p % H_kv) and each pinned program accumulates into its
own private fp32 slot `dq_acc[slot]` ([n_slots, L_q, H, D], slot = p // H_kv), so the
reduce-adds never contend across SMs and a slot (L_q*G*D*4 bytes per program, 128 KB
at L_q=256, D=128) stays L2-resident; `_bwd_postprocess` then sums the slots in a
fixed order. Tiles of a head are dealt to that head's programs longest first.

Determinism
-----------
* broadcast_q: contention-free (each slot is written by exactly one program, which
  visits its tiles in a fixed order; `_bwd_postprocess` sums the slots in a fixed
  order). With `deterministic=True` the reduce-add is a per-element red.global.add,
  and each accumulator element is always updated by the same thread (same register
  layout every iteration), so same-address adds are applied in program order: bitwise
  deterministic, at some cost in issue slots. The default TMA bulk reduce
  (cp.reduce.async.bulk) does not promise that two in-flight bulk reduces to the same
  rows apply in issue order, so it is not guaranteed bitwise deterministic. (If the
  slot buffer would exceed `jagged.tiles.MAX_SLOT_BYTES`, slots are shared by programs and nothing
  is deterministic; this does not happen at GEM shapes.)
* packed modes (self / cross): dQ rows of a sequence longer than one KV tile receive
  reduce-adds from several programs in a run-dependent order -> NOT bitwise
  deterministic (dK/dV are: each dK/dV row is written once, summed in registers).
  Not implemented yet, a cheap deterministic option for these modes: per-KV-block dQ
  partial slots ([NB, Nq, H, D] fp32 when it fits) summed in KV-block order by
  `_bwd_postprocess`, exactly as the broadcast-Q slots.
* impl="ws": the same, except that its reduce task issues the two consumers' bulk
  reduces of a Q block back to back (not ordered): never bitwise deterministic.

Masking: keys past the sequence end, query rows past the sequence end, the causal
(bottom-right aligned: query i sees key j iff j <= i + len_k - len_q) triangle and
rows with lse = -inf all give P = 0, so they add nothing to dV, dK or dQ.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from jagged.tiles import bwd_dynamic, dq_accumulator, kv_tiles

from .launch import fast

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# upper bound on the broadcast-Q per-program dQ slot buffer


# ---------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """Tile shape of the main kernel: a KV tile of block_n keys meets Q blocks of block_m
    rows. dq_t computes the dQ partial as (K^T dS^T)^T, so that its wgmma has M = D
    rows instead of block_m (a block_m below 64 would otherwise fall back to mma.sync
    with K copied into registers)."""
    block_m: int = 64
    block_n: int = 128
    num_warps: int = 8
    num_stages: int = 2
    dq_t: bool = False


# Per-thread registers are dominated by the dK and dV accumulators, 2 * block_n * D / 
# (32 * num_warps) fp32 (128 at block_n 128, D 128, 8 warps), plus S^T, dP^T, P^T and the
# dQ partial (block_n * block_m / 256 each at 8 warps). Compile results for sm_90a
# (registers, spills per mode) are in PERF.md, "bwd_hopper configs (compile-only, CPU)";
# tests/test_bwd_compile.py asserts that every config in SPILL_FREE compiles with no
# spills for its head dims in all four (causal, broadcast-Q) modes.
CONFIGS = {
    # v1 (the kernel measured in PERF.md, session 1); spills at D=128 (255 regs)
    "base": Config(block_m=64, block_n=128, num_warps=8, num_stages=2),
    # base with the next Q block's loads a whole iteration ahead: the default (PERF.md session 5)
    "base_s3": Config(block_m=64, block_n=128, num_warps=8, num_stages=3),
    # 128-key tiles, 16-row Q steps: K/V reuse and dQ/Q/dO traffic of v1, thin wgmmas (N=16)
    "m16n128": Config(block_m=16, block_n=128, num_warps=8, num_stages=2, dq_t=True),
    # 64-key tiles: half the accumulator registers; 2x the Q/dO loads and dQ reduce-adds
    "m64n64": Config(block_m=64, block_n=64, num_warps=8, num_stages=2),
    "m32n64": Config(block_m=32, block_n=64, num_warps=8, num_stages=2, dq_t=True),
    # one warpgroup: no operand shared between two warpgroups
    "m32n64w4": Config(block_m=32, block_n=64, num_warps=4, num_stages=2, dq_t=True),
}
# the configs that compile with no spills, per head dim (tests/test_bwd_compile.py)
SPILL_FREE = {
    64: ("base", "base_s3", "m16n128", "m64n64", "m32n64", "m32n64w4"),
    128: ("m16n128", "m64n64", "m32n64", "m32n64w4"),
}
# default per (head_dim, bucket), chosen by measurement on the H200 (PERF.md, session 2:
# `gpu_check_bwd --configs ...`, gem-jagged + llm-dense + broadcast-Q, D=128): "base"
# beat every spill-free config on 15 of 16 shapes, by 1.1-2.4x, so its spills are not
# the limiter. The exception is very short sequences (gem-jagged 256/0.1, ~26 keys per
# sequence): m32n64 11.9 TFLOP/s against base's 8.0, since 128-key tiles are ~80 %
# empty there. "short": mean keys per sequence <= 32 (known on the host from the shapes,
# no sync) or every sequence within 64 keys. Session 5: "base_s3" (the next Q block's
# loads one iteration earlier) beat "base" on 12 of 14 D=128 shapes, +2-9 % (llm-dense
# 341 against 325, causal 283 against 260); D=64 is not measured, and is spill-free.
DEFAULTS = {
    (64, "long"): "base_s3",
    (64, "short"): "base_s3",
    (128, "long"): "base_s3",
    (128, "short"): "m32n64",
}
SHORT_MEAN_K = 32


def pick_config(head_dim: int, max_seqlen_k: int, causal: bool = False,
                broadcast_q: bool = False, mean_k: float | None = None) -> str:
    """Name of the default config; JAGGED_BWD_CONFIG (a CONFIGS name) overrides it.
    mean_k: total keys / batch (None: unknown, bucket by max_seqlen_k alone)."""
    env = os.environ.get("JAGGED_BWD_CONFIG")
    if env:
        if env not in CONFIGS:
            raise ValueError(f"JAGGED_BWD_CONFIG={env!r} is not one of {sorted(CONFIGS)}")
        return env
    short = max_seqlen_k <= 64 or (mean_k is not None and mean_k <= SHORT_MEAN_K)
    return DEFAULTS[(64 if head_dim <= 64 else 128, "short" if short else "long")]


def get_config(config) -> Config:
    """A Config from a Config or a CONFIGS name."""
    if isinstance(config, Config):
        return config
    if config not in CONFIGS:
        raise ValueError(f"unknown bwd config {config!r}; known: {sorted(CONFIGS)}")
    return CONFIGS[config]


# the warp-specialized kernel's tile (impl="ws", bwd_hopper_ws.py): 128 keys per tile as
# two 64-key consumer warpgroups, 64 query rows per step (its M64 variant: one K/V stage,
# lse / delta in smem, dQ reduced by the load task), against 32 rows on the H200: D = 128
# (PERF.md session 9) llm-dense B8 H16 8192 25.3 -> 21.2 ms (causal 14.4 -> 12.6),
# gem-jagged 2048 / 0.5 20.6 -> 17.9 ms, 512 / 0.5 2.16 -> 2.02 ms; D = 64 (session 18)
# llm-dense B16 H16 2048 2.29 -> 2.07 ms (causal 1.27 -> 1.19). 32 rows stay faster at
# short mean lengths (D = 128 kernels, sparsity 0.1: max 256 0.209 against 0.239 ms, 512
# 0.341 against 0.358, 1024 0.685 against 0.690), so up to WS_SHORT_MEAN_K keys.
WS_CONFIG = Config(block_m=32, block_n=128, num_warps=4, num_stages=1)
WS_CONFIG_M64 = replace(WS_CONFIG, block_m=64)
# D = 64 only: 128-row steps, the ws kernel's M128 (bwd_hopper_ws.py), the default there
# past WS_SHORT_MEAN_K since session 20 (llm B16 H16 2048, do_bench against 64-row steps:
# 1.904 -> 1.608 ms, -15.6 %; causal 1.125 -> 1.019, -9.4 %)
WS_CONFIG_M128 = replace(WS_CONFIG, block_m=128)
WS_SHORT_MEAN_K = 64
# read per call (A/B runs): JAGGED_BWD_WS_BLOCK_M=32 or 64 picks the step (D = 64 or 128),
# 128 the 128-row step (D = 64 only: a ValueError at D = 128);
# JAGGED_BWD_WS_NUM_STAGES=0|1 the Q loop's num_stages. At 0 the loop skips Triton's
# pipeliner passes, whose wgmma pass puts a wait 0 after every dot: 3 waits of 0 a
# consumer step instead of 9 at 64-row steps, S^T and dP^T in flight together. The
# default at 64-row steps, D = 128 (WS_Q_LOOP_STAGES_D128): session 19, harness clocks,
# TFLOP/s 1 -> 0 (repeat of 1): llm B8 H16 8192 498.8 -> 510.3 (499.2), causal 478.7 ->
# 490.2 (483.3), GQA B4 H32/8 4096 506.9 -> 521.3 (508.9), causal 456.6 -> 468.4 (452.4).
# D = 64 stays at 1 (do_bench, B16 H16 2048: 1.900 -> 1.938 (1.893) ms, causal 1.105 ->
# 1.095); 32-row steps too (null there, session 6). Session 10's "null" 64-row A/B
# compiled the same PTX: the loop's own num_stages=1 won until session 18.
WS_Q_LOOP_STAGES_D128 = 0
WS_BLOCK_M_ENV = "JAGGED_BWD_WS_BLOCK_M"
WS_STAGES_ENV = "JAGGED_BWD_WS_NUM_STAGES"
# read per call, opt-in: JAGGED_BWD_WS_DIAG_MASK=1 applies the causal mask only on the steps
# whose block it cuts (the ws kernel's DIAG_MASK, 64-row steps); session 10, llm causal:
# do_bench -2.8 %, kernel time flat, against a predicted -10 %, so not the default (with
# the D = 128 Q loop at num_stages=0, session 19's default, causal spills 4 instructions)
WS_DIAG_MASK_ENV = "JAGGED_BWD_WS_DIAG_MASK"
# the K/V stages of 64-row steps: two at D = 64 (162 KB; against one, session 18, llm
# B16 H16 2048: 2.07 -> 1.95 ms, causal 1.18 -> 1.15), one at D = 128 (two need 263 KB);
# JAGGED_BWD_WS_KV_STAGES=1|2 overrides it per call (A/B runs; 2 only at D = 64 with
# 64-row steps: 128-row steps have one, two spilled in causal)
WS_KV_STAGES_ENV = "JAGGED_BWD_WS_KV_STAGES"
# D = 64: each consumer forms a full-D dQ partial over its own keys; the last one adds the
# others' (from their smem staging), so one box a step is reduce-added instead of NC
# (the ws kernel's DQ_SUM; session 18, llm B16 H16 2048: 1.96 -> 1.89 ms, causal 1.15 ->
# 1.12); JAGGED_BWD_WS_DQ_SUM=0|1 overrides it per call (A/B runs)
WS_DQ_SUM_ENV = "JAGGED_BWD_WS_DQ_SUM"


def _env_choice(name: str, choices: tuple[str, ...]) -> str | None:
    """$name read now: one of `choices`, or None when unset or empty."""
    env = os.environ.get(name)
    if env and env not in choices:
        raise ValueError(f"{name}={env}: expected one of {', '.join(choices)}")
    return env or None


def ws_diag_mask(causal: bool) -> bool:
    """The ws kernel's DIAG_MASK constexpr for this call (WS_DIAG_MASK_ENV; causal only)."""
    return bool(causal) and _env_choice(WS_DIAG_MASK_ENV, ("0", "1")) == "1"


def ws_kv_stages(head_dim: int, block_m: int = 64) -> int:
    """The ws kernel's KV_STAGES_M64 constexpr for this call (WS_KV_STAGES_ENV above)."""
    two = head_dim <= 64 and block_m < 128
    env = _env_choice(WS_KV_STAGES_ENV, ("1", "2") if two else ("1",))
    return int(env) if env else (2 if two else 1)


def ws_dq_sum() -> bool:
    """The ws kernel's DQ_SUM constexpr for this call (WS_DQ_SUM_ENV; D = 64 only)."""
    return _env_choice(WS_DQ_SUM_ENV, ("0", "1")) != "0"


def ws_config(head_dim: int, mean_k: float | None = None) -> Config:
    """The ws kernel's tile: WS_CONFIG_M64 (64-row steps), or WS_CONFIG (32 rows) when the
    mean KV length (total keys / batch; None: unknown) is at most WS_SHORT_MEAN_K.
    WS_BLOCK_M_ENV picks the step (128: WS_CONFIG_M128, D = 64 only), WS_STAGES_ENV the
    Q loop's num_stages (default: 1, but WS_Q_LOOP_STAGES_D128 at 64-row steps and
    D = 128)."""
    env = _env_choice(WS_BLOCK_M_ENV, ("32", "64", "128"))
    stages = _env_choice(WS_STAGES_ENV, ("0", "1"))
    if env == "128" and head_dim != 64:
        raise ValueError(f"{WS_BLOCK_M_ENV}=128 is built for head dim 64 only, got {head_dim}")
    if env:
        cfg = {"32": WS_CONFIG, "64": WS_CONFIG_M64, "128": WS_CONFIG_M128}[env]
    else:
        short = mean_k is not None and mean_k <= WS_SHORT_MEAN_K
        cfg = WS_CONFIG if short else WS_CONFIG_M128 if head_dim == 64 else WS_CONFIG_M64
    if stages:
        return replace(cfg, num_stages=int(stages))
    if cfg.block_m == 64 and head_dim > 64:
        return replace(cfg, num_stages=WS_Q_LOOP_STAGES_D128)
    return cfg


def config(head_dim: int) -> dict:
    """The warp-specialized kernel's tile shape as a dict (impl="ws")."""
    c = ws_config(head_dim)
    return dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, num_warps=c.num_warps,
                num_stages=c.num_stages)


_SM_COUNT = {}


def _num_sms(device) -> int:
    if device.type != "cuda":  # the interpreter: a few persistent programs
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


# ---------------------------------------------------------------------------------------
# (a) preprocess: delta = rowsum(dO * O); zero the packed dQ accumulator
# ---------------------------------------------------------------------------------------
@triton.jit
def _bwd_preprocess(out_ptr, dout_ptr, delta_ptr, dq_acc_ptr, sched_ptr, n_rows,
                    stride_o_tok, stride_o_h, stride_do_tok, stride_do_h,
                    stride_delta_h,
                    H: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr,
                    ZERO_DQ: tl.constexpr):
    """One program per ROWS (token, head) pairs; rows ordered token-major. ZERO_DQ (packed
    modes) also zeroes the tile counter sched_ptr[0] (jagged.tiles.dq_accumulator)."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    tok = r // H
    h = r % H
    d = tl.arange(0, D)
    valid = r < n_rows
    o = tl.load(out_ptr + tok[:, None] * stride_o_tok + h[:, None] * stride_o_h + d[None, :],
                mask=valid[:, None], other=0.0).to(tl.float32)
    do = tl.load(dout_ptr + tok[:, None] * stride_do_tok + h[:, None] * stride_do_h + d[None, :],
                 mask=valid[:, None], other=0.0).to(tl.float32)
    tl.store(delta_ptr + h * stride_delta_h + tok, tl.sum(o * do, axis=1), mask=valid)
    if ZERO_DQ:  # dq_acc is [Nq, H, D] contiguous fp32: row r is r*D
        tl.store(dq_acc_ptr + r[:, None] * D + d[None, :],
                 tl.zeros([ROWS, D], dtype=tl.float32), mask=valid[:, None])
        if tl.program_id(0) == 0:
            tl.store(sched_ptr, 0)


# ---------------------------------------------------------------------------------------
# (b) main kernel, one helper per role
# ---------------------------------------------------------------------------------------
@triton.jit
def schedule(t, tile_b_ptr, tile_n_ptr, cu_q_ptr, cu_k_ptr, L_q,
             HKV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr):
    """Tile t -> (batch b, KV head hk, first key n0, keys/queries of the sequence,
    token offsets of q rows, of dO/O/lse rows and of k rows, first Q row m_lo, number
    of Q blocks n_m). Packed modes deal the sorted tile list x H_kv heads round-robin;
    broadcast-Q programs are pinned to one head and deal the tile list only."""
    if BROADCAST_Q:
        base = t
        hk = 0  # set by the caller (pinned head)
    else:
        base = t // HKV
        hk = t % HKV
    b = tl.load(tile_b_ptr + base)
    n0 = tl.load(tile_n_ptr + base) * BLOCK_N
    k_start = tl.load(cu_k_ptr + b).to(tl.int64)
    len_k = (tl.load(cu_k_ptr + b + 1) - k_start).to(tl.int32)
    if BROADCAST_Q:
        q_start = tl.zeros([], dtype=tl.int64)
        o_start = b.to(tl.int64) * L_q
        len_q = L_q
    else:
        q_start = tl.load(cu_q_ptr + b).to(tl.int64)
        o_start = q_start
        len_q = (tl.load(cu_q_ptr + b + 1) - q_start).to(tl.int32)
    if CAUSAL:
        # first row that sees key n0: i >= n0 - (len_k - len_q)
        m_lo = tl.maximum(n0 - len_k + len_q, 0)
        m_lo = (m_lo // BLOCK_M) * BLOCK_M
    else:
        m_lo = 0
    n_m = tl.maximum(tl.cdiv(len_q - m_lo, BLOCK_M), 0)
    return b, hk, n0, len_k, len_q, k_start, q_start, o_start, m_lo, n_m


@triton.jit
def load_kv(k_desc, v_desc, k_start, n0, hk, D: tl.constexpr):
    """The tile's K and V ([BLOCK_N, D]) by TMA. Rows past the sequence belong to the
    next one (or are zero-filled past the tensor); compute masks them."""
    row = (k_start + n0).to(tl.int32)
    return k_desc.load([row, hk * D]), v_desc.load([row, hk * D])


@triton.jit
def load_q(q_desc, do_desc, lse_ptr, delta_ptr, q_start, o_start, m0, len_q, h,
           stride_lse_h, D: tl.constexpr, BLOCK_M: tl.constexpr):
    """Q and dO ([BLOCK_M, D], TMA), lse*log2e and delta ([BLOCK_M]) of one Q block.
    Rows past the sequence: lse = +inf (so P = 0), delta = 0."""
    offs_m = m0 + tl.arange(0, BLOCK_M)
    rmask = offs_m < len_q
    qt = q_desc.load([(q_start + m0).to(tl.int32), h * D])
    dot = do_desc.load([(o_start + m0).to(tl.int32), h * D])
    lse = tl.load(lse_ptr + h * stride_lse_h + o_start + offs_m, mask=rmask, other=float("inf"))
    delta = tl.load(delta_ptr + h * stride_lse_h + o_start + offs_m, mask=rmask, other=0.0)
    return qt, dot, lse_log2(lse), delta


@triton.jit
def lse_log2(lse):
    """lse * log2(e) for P = exp2(S * scale * log2(e) - lse_log2); rows that saw no key
    (lse = -inf) get +inf, so P = 0 there as on rows past the sequence."""
    return tl.where(lse == float("-inf"), float("inf"), lse) * 1.4426950408889634


@triton.jit
def compute(kt, vt, qt, dot, lse2, delta, dk, dv, n0, m0, len_k, len_q, qk_scale2,
            CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            DQ_T: tl.constexpr):
    """One (KV tile, Q block) step in the transposed form: returns updated dK, dV
    (unscaled fp32) and this block's unscaled dQ partial [BLOCK_M, D] (fp32)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    st = tl.dot(kt, tl.trans(qt))                                   # [N, M] = K Q^T
    pt = tl.math.exp2(st * qk_scale2 - lse2[None, :])
    keep = (offs_n < len_k)[:, None]
    if CAUSAL:
        keep = keep & (offs_n[:, None] <= offs_m[None, :] + (len_k - len_q))
    pt = tl.where(keep, pt, 0.0)
    lp = pt.to(qt.dtype)
    dv = tl.dot(lp, dot, dv)                                        # dV += P^T dO
    dpt = tl.dot(vt, tl.trans(dot))                                 # [N, M] = V dO^T
    dst = (pt * (dpt - delta[None, :])).to(qt.dtype)                # dS^T
    dk = tl.dot(dst, qt, dk)                                        # dK += dS^T Q
    if DQ_T:
        dq = tl.trans(tl.dot(tl.trans(kt), dst))                    # ([D, M] = K^T dS^T)^T
    else:
        dq = tl.dot(tl.trans(dst), kt)                              # [M, D] = dS K
    return dk, dv, dq


@triton.jit
def reduce_dq(dq_desc, dq_acc_ptr, dq, slot_row, q_start, m0, len_q, h,
              H: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
              TMA_REDUCE: tl.constexpr):
    """Reduce-add the dQ partial into the fp32 accumulator with a TMA bulk reduce
    (registers -> smem -> cp.reduce.async.bulk.tensor.add). Rows past the sequence
    carry exact zeros (P = 0 there), so the whole box can be added (TMA clips rows past
    the tensor). TMA_REDUCE=False: per-element red.global.add (the Triton interpreter
    has no descriptor reduce), masked to the sequence's rows, since nothing clips it."""
    row0 = slot_row + q_start + m0
    if TMA_REDUCE:
        dq_desc.atomic_add([row0.to(tl.int32), h * D], dq)
    else:
        r = tl.arange(0, BLOCK_M)
        d = tl.arange(0, D)
        tl.atomic_add(dq_acc_ptr + ((row0 + r)[:, None] * H + h) * D + d[None, :], dq,
                      mask=(m0 + r < len_q)[:, None], sem="relaxed")


@triton.jit
def store(dk_ptr, dv_ptr, dk, dv, k_start, n0, len_k, hk, scale,
          stride_k_tok, stride_k_h, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """dK (times the softmax scale) and dV of the tile, in the input dtype."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    mask = (offs_n < len_k)[:, None]
    off = (k_start + offs_n)[:, None] * stride_k_tok + hk * stride_k_h + d[None, :]
    # dk/dv are fresh contiguous allocations (backward): 16-byte aligned rows; say so,
    # so the stores vectorize whatever the launch specializes
    dk_ptrs = tl.multiple_of(dk_ptr + off, [1, 16])
    dv_ptrs = tl.multiple_of(dv_ptr + off, [1, 16])
    tl.store(dk_ptrs, (dk * scale).to(dk_ptr.dtype.element_ty), mask=mask)
    tl.store(dv_ptrs, dv.to(dv_ptr.dtype.element_ty), mask=mask)


# L_q is never specialized: at L_q = 1 with one query head per KV head the broadcast-Q
# Q loop would have one trip, and the pipeliner would then multi-buffer the tile loop's
# K/V instead (354 KB of shared memory at D = 128, base_s3; found by the GPU matrix).
@triton.jit(do_not_specialize=["L_q"])
def _bwd_main(q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr,
              dq_desc, dq_acc_ptr, dk_ptr, dv_ptr,
              cu_q_ptr, cu_k_ptr, tile_b_ptr, tile_n_ptr, n_tiles_ptr,
              scale, L_q, stride_k_tok, stride_k_h, stride_lse_h,
              H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, TMA_REDUCE: tl.constexpr,
              DQ_T: tl.constexpr):
    G: tl.constexpr = H // HKV
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    qk_scale2 = scale * 1.4426950408889634
    n_tiles = tl.load(n_tiles_ptr)
    if BROADCAST_Q:  # pinned: program p owns KV head p % HKV and dQ slot p // HKV
        first = pid // HKV
        step = nprog // HKV
        slot_row = (pid // HKV) * L_q
    else:
        first = pid
        step = nprog
        n_tiles = n_tiles * HKV
        slot_row = 0
    for t in range(first, n_tiles, step):
        # ---- schedule
        b, hk, n0, len_k, len_q, k_start, q_start, o_start, m_lo, n_m = schedule(
            t, tile_b_ptr, tile_n_ptr, cu_q_ptr, cu_k_ptr, L_q,
            HKV, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q)
        if BROADCAST_Q:
            hk = pid % HKV
        # ---- load K, V once per tile
        kt, vt = load_kv(k_desc, v_desc, k_start, n0, hk, D)
        dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
        # ---- loop over (query head of the group) x (Q block)
        for j in range(0, G * n_m):
            h = hk * G + j // n_m
            m0 = m_lo + (j % n_m) * BLOCK_M
            qt, dot, lse2, delta = load_q(q_desc, do_desc, lse_ptr, delta_ptr, q_start, o_start,
                                          m0, len_q, h, stride_lse_h, D, BLOCK_M)
            dk, dv, dq = compute(kt, vt, qt, dot, lse2, delta, dk, dv, n0, m0, len_k, len_q,
                                 qk_scale2, CAUSAL, BLOCK_M, BLOCK_N, DQ_T)
            reduce_dq(dq_desc, dq_acc_ptr, dq, slot_row, q_start, m0, len_q, h, H, D, BLOCK_M,
                      TMA_REDUCE)
        # ---- store dK, dV
        store(dk_ptr, dv_ptr, dk, dv, k_start, n0, len_k, hk, scale,
              stride_k_tok, stride_k_h, D, BLOCK_N)


# ---------------------------------------------------------------------------------------
# (c) postprocess: dQ = scale * sum_slots dq_acc, cast
# ---------------------------------------------------------------------------------------
@triton.jit
def _bwd_postprocess(dq_acc_ptr, dq_ptr, n_elem, n_slots, slot_stride, scale,
                     BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elem
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, n_slots):  # fixed order -> deterministic
        acc += tl.load(dq_acc_ptr + s * slot_stride + offs, mask=mask, other=0.0)
    tl.store(dq_ptr + offs, (acc * scale).to(dq_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------
# host side
# ---------------------------------------------------------------------------------------
def _desc(t, rows, D, cols=None):
    """2-D TMA descriptor over a packed [tokens, heads, D] (or [.., tokens, heads, D])
    tensor seen as [tokens, heads * D], box [rows, cols or D]."""
    t2 = t.reshape(-1, t.shape[-2] * t.shape[-1])
    n = max(t2.shape[0], 1)
    return TensorDescriptor(t2, shape=[n, t2.shape[1]], strides=[t2.shape[1], 1],
                            block_shape=[rows, cols or D])


def backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q,
             impl=None, deterministic=False, config=None, dlse=None):
    """(dq, dk, dv) in q's dtype. See the module docstring for the design.

    impl: "ws" (the warp-specialized TLX kernel of bwd_hopper_ws.py, the default on the
    GPU: faster on every gem-jagged and llm-dense row of the H200, PERF.md session 7) or
    "triton" (the plain persistent kernel above: the interpreter's and the deterministic
    path); env JAGGED_BWD_IMPL sets the default. deterministic: see the module
    docstring (bitwise for broadcast-Q).
    config: a CONFIGS name or a Config for impl="triton" (default: pick_config); the
    "ws" kernel runs ws_config(D, mean_k). dlse: the gradient on lse (jagged.api), or None."""
    impl = impl or os.environ.get("JAGGED_BWD_IMPL", "triton" if _INTERPRET else "ws")
    if deterministic:
        impl = "triton"
    if impl not in ("triton", "ws"):
        raise ValueError(f"impl must be 'triton' or 'ws', got {impl!r}")
    dout = dout.contiguous()
    out = out.contiguous()
    lse = lse.contiguous()
    H, D = q.shape[1], q.shape[2]
    HKV = k.shape[1]
    B = cu_k.shape[0] - 1
    Nq = out.shape[0]
    dev = q.device
    if impl == "ws":
        cfg = ws_config(D, k.shape[0] / max(B, 1))
    else:
        cfg = get_config(config if config is not None else
                         pick_config(D, max_k, causal, broadcast_q, k.shape[0] / max(B, 1)))
    BM, BN = cfg.block_m, cfg.block_n
    L_q = q.shape[0] if broadcast_q else 0

    dq = torch.empty_like(q)
    # contiguous (the store assumes 16-byte aligned rows of HKV * D elements)
    dk = torch.empty(k.shape, dtype=k.dtype, device=dev)
    dv = torch.empty(v.shape, dtype=v.dtype, device=dev)
    if k.shape[0] == 0 or B == 0 or Nq == 0:  # no pair anywhere (and TMA cannot
        dk.zero_(); dv.zero_(); dq.zero_()     # describe an empty tensor)
        return dq, dk, dv

    # (a) preprocess
    delta = torch.empty((H, Nq), device=dev, dtype=torch.float32)
    dq_acc, grid_main, sched = dq_accumulator(Nq, L_q, H, HKV, D, broadcast_q, _num_sms(dev),
                                              dev)
    n_slots = dq_acc.shape[0] if broadcast_q else 1
    ROWS = 32 if D <= 64 else 16
    if Nq > 0:
        fast(_bwd_preprocess)[(triton.cdiv(Nq * H, ROWS),)](
            out, dout, delta, dq_acc, sched, Nq * H, out.stride(0), out.stride(1),
            dout.stride(0), dout.stride(1), delta.stride(0),
            H=H, D=D, ROWS=ROWS, ZERO_DQ=not broadcast_q, num_warps=4)
        if dlse is not None:  # the gradient on lse (jagged.api)
            delta -= dlse

    # (b) main
    tile_b, tile_n, n_tiles = kv_tiles(cu_q, cu_k, L_q, max_k, causal, BM, BN)
    cu_q_arg = cu_q if cu_q is not None else cu_k
    q_desc = _desc(q, BM, D)
    do_desc = _desc(dout, BM, D)
    if impl == "ws":
        from .bwd_hopper_ws import NUM_CONSUMERS, _bwd_main_ws, dq_cols, dq_rows
        kv_rows = BN // NUM_CONSUMERS.value
        dq_desc = _desc(dq_acc, dq_rows(BM), D, cols=dq_cols(D))  # a consumer's box
        fast(_bwd_main_ws)[(grid_main,)](
            q_desc, _desc(k, kv_rows, D), _desc(v, kv_rows, D), do_desc, lse, delta, dq_desc,
            dk, dv, cu_q_arg, cu_k, tile_b, tile_n, n_tiles, sched,
            float(scale), L_q, dk.stride(0), dk.stride(1), lse.stride(0),
            H=H, HKV=HKV, D=D, BLOCK_M=BM, BLOCK_N=BN, CAUSAL=bool(causal),
            BROADCAST_Q=bool(broadcast_q), DQ_COLS=dq_cols(D), DIAG_MASK=ws_diag_mask(causal),
            DYNAMIC=bwd_dynamic(causal, broadcast_q), KV_STAGES_M64=ws_kv_stages(D, BM),
            DQ_SUM=ws_dq_sum(), Q_LOOP_STAGES=cfg.num_stages, num_warps=4,
            num_stages=cfg.num_stages)
    else:
        dq_desc = _desc(dq_acc, BM, D)
        fast(_bwd_main)[(grid_main,)](
            q_desc, _desc(k, BN, D), _desc(v, BN, D), do_desc, lse, delta, dq_desc, dq_acc, dk, dv,
            cu_q_arg, cu_k, tile_b, tile_n, n_tiles,
            float(scale), L_q, dk.stride(0), dk.stride(1), lse.stride(0),
            H=H, HKV=HKV, D=D, BLOCK_M=BM, BLOCK_N=BN, CAUSAL=bool(causal),
            BROADCAST_Q=bool(broadcast_q), TMA_REDUCE=not (_INTERPRET or deterministic),
            DQ_T=cfg.dq_t, num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    # (c) postprocess
    n_elem = dq.numel()
    if n_elem:
        PB = 1024
        fast(_bwd_postprocess)[(triton.cdiv(n_elem, PB),)](
            dq_acc, dq, n_elem, n_slots, L_q * H * D, float(scale), BLOCK=PB, num_warps=4)
    return dq, dk, dv
