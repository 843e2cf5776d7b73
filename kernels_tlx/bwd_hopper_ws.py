"""Warp-specialized TLX main kernel of the Hopper backward (see bwd_hopper.py for the
preprocess / postprocess, the schedule and the host wrapper; `backward(..., impl="ws")`,
tile `ws_config`: 128 keys per tile; 64 query rows per step but for short mean lengths,
32 there; 128 at D = 64 since session 20, below).

One persistent program per SM walks the same jagged, longest-first KV-tile list as the
plain kernel: round-robin, or for causal packed lists (DYNAMIC, `jagged.tiles.bwd_dynamic`)
in list order from a counter. There a sequence's tiles run longest to shortest, a sawtooth
the round-robin dealt unevenly: the load task takes each program's next tile with an atomic
add once the last one's loads are issued (`next_tile`) and hands it to the other roles
(`publish_tile` / `fetch_tile`). Measured on the H200 (session 17, do_bench, static ->
counter): llm causal B8 H16 8192 12.46 -> 11.29 ms, GQA B4 H32/8 4096 4.23 -> 2.96 ms,
D = 64 B16 H16 2048 1.39 -> 1.28 ms. Per program, four roles (tlx.async_task), each its own
helper:

  load       (default task, producer): per KV tile, K and V (two 64-key halves) by TMA
             into a ring of NUM_BUF_KV stages; per Q block, Q and dO by TMA into a ring of
             NUM_BUF_Q stages (mbarrier full/empty pairs).
  compute    (2 consumer warpgroups, replicate=2): consumer c owns keys
             [n0 + 64c, n0 + 64c + 64) of the tile: S^T = K_c Q^T, dP^T = V_c dO^T
             (wgmma, smem operands), P^T, dS^T in registers (LSE and delta from L2,
             loaded one Q block ahead and loop-carried), dV_c += P^T dO,
             dK_c += dS^T Q (register A operand).
             dQ with the head dim as the wgmma's M: dS^T -> smem; at D = 128 the two
             consumers meet at a named barrier and consumer c forms dQ columns
             [64c, 64c + 64) over all 128 keys (one reduce-add per Q block, 32
             registers of accumulator); at D = 64 each forms all columns over its own
             keys. The result goes to an fp32 staging buffer.
  reduce_dq  (1 warp): TMA bulk reduce-add (cp.reduce.async.bulk.tensor .add.f32) of
             each consumer's staged dQ into the fp32 accumulator, then frees the stage.
             It owns the dQ reduction, so the consumers never wait on global atomics.
  store      (inside the consumer, at the end of a tile): dK_c (times scale) and dV_c
             through the consumer's own V smem (no longer read), in 16-row slices, so
             no whole-tile pointer tensor competes with the accumulators for registers.

Registers (compile-only, sm_90a): no spill at D = 64 or D = 128. At D = 128 the K_c / V_c
wgmma descriptors (8 k-steps each) are formed per Q block from an opaque copy of the
stage index (_opaque): hoisted out of the loop they held ~40 registers and the tile loop
spilled 24-54 instructions; formed per block the Q loop is also shorter (e.g. 424 -> 387
SASS instructions), with the same memory, barrier and wgmma operations in the same order
(PTX). 64-row steps spilled the accumulators in the Q-block loop (PERF.md).

Dot schedule: the kernel's own waits keep S^T with dP^T, dV with dS^T and dK with dQ in
flight, but with this Triton the pipeliner's wgmma pass (asyncLaunchDots; it runs on the
loops at num_stages=1 too) puts a wgmma wait 0 right after every dot of the Q-block loop
(none is a pure loop-carried accumulator, and the loop arrives on barriers), so
the five dots of a Q block run one after the other. A loop at num_stages=0 (which that
pass skips; Q_LOOP_STAGES, host ws_config) keeps 3 wgmma waits of 0 a consumer step
instead of 9, spill-free. It is the default at 64-row steps and D = 128: +2..+3 % TFLOP/s
at llm-dense and gem 2048 (session 19, harness clocks). At D = 64 it lost (+2 % time,
session 19) and at 32-row steps it was within noise (session 6), so those keep 1.

LSE / delta one Q block ahead: each step's 2 x 8 values a thread (16 masked LDG) are
loaded during the previous step (step 0's before the Q loop) and carried in the S^T
accumulator's slice layout. Loaded in their own step, just before the S^T wgmma, ptxas
put the first LSE read ~30 instructions after the loads, before the first S^T HGMMA, so
nothing but the Q/dO wait hid the L2 round trip, every step. Now (SASS, compile-only)
no LDG result is read in the iteration that loads it: 4-9 HGMMAs (the dQ dots), the dQ
handoff and the next Q/dO wait lie between the LSE loads and the first LSE read, 14-26
HGMMAs for delta; still 16 LDG a step, no spill. Measured on the H200 at llm-dense
B8 H16 8192: 30.3 -> 25.4 ms non-causal (+19 %), 18.06 -> 15.85 ms causal (+14 %).

64-row steps (BLOCK_M = 64, the default; constexpr M64 below; 32-row steps
under JAGGED_BWD_WS_BLOCK_M=32): N = 64
S^T / dP^T / dQ^T wgmmas read a third less smem per row than N = 32 (a compile-only estimate
puts most of the 32-row kernel's gap to FA4 there, PERF.md session 8). To fit, three changes
apply only there (compile-only, sm_90a, D = 128:
0 spills, 194 KB; measured on the way: 263 KB and 198 spills as is; with the first two
changes 4 (causal 16) spill instructions at 232 registers, none at 240):
  * one K/V stage (NKV = 1): 197 KB instead of 263; a tile switch waits for the previous
    tile's stores (once per ~100 steps at long sequences; at D = 64, with 32 steps a tile
    at 2048 keys, two stages fit in 162 KB and measured 6 % faster, session 18);
  * lse2 / delta staged by the load task per Q stage (lse_smem / delta_smem, 512 B), read
    at use by the consumers instead of 2 x 16 registers carried a step ahead;
  * reduce_dq folded into the load task (one step behind its loads), so 3 warpgroups
    (384 threads) and 240 registers a consumer (REGS_COMPUTE_M64).
The 32-row build compiles to the same SASS as before the variant (one broadcast-Q build:
4 instructions of the reduce warp in another order). Measured on the H200 against 32-row
steps at D = 128: llm-dense B8 H16 8192 25.3 -> 21.2 ms, causal 14.4 -> 12.6 ms
(PERF.md session 9).

Causal mask on the diagonal only (opt-in: JAGGED_BWD_WS_DIAG_MASK=1, constexpr DIAG_MASK,
64-row steps): in this loop the wgmmas run one after the other (above), so the causal mask
(~150 SASS instructions a step between the S^T wait and the dV wgmma) sits with the tensor
cores idle; a consumer's Q loop is 581 instructions causal against 427 non-causal (sm_90a,
D = 128, bf16). With DIAG_MASK the key-length mask stays on every step and the causal bound
is applied in a branch taken only when it cuts the step's block (causal_cut: 2 steps a
tile in self-attention): 438 instructions on the other steps, 520 on those; same registers
(240, no spill), smem and wgmma schedule; the default build's SASS is unchanged. At 32-row
steps it is off (D = 128 broadcast-Q spilled 16 instructions with it). Measured in
session 10 at llm causal: do_bench 12.72 / 12.87 -> 12.37 / 12.52 ms, kernel time flat
(12.19 / 13.15 -> 12.68 / 12.59): the mask was not the limiter it was predicted to be.

128-row steps at D = 64 (the default there since session 20: llm B16 H16 2048 1.904 ->
1.608 ms, causal 1.125 -> 1.019; constexpr M128, compute's ROW_SPLIT;
JAGGED_BWD_WS_BLOCK_M=64 for the old step; D = 128 is refused on the host and by a
static_assert):
twice the rows a step for the same per-step overhead (barriers, handoffs), and K_c / V_c
read once per 128 rows by the N = 128 S^T / dP^T wgmmas. M64's changes apply (3 warpgroups,
240 registers, lse2 / delta staged by the load task, which also reduces dQ); on top:
  * dQ split by query rows (_step_rows): after the dS^T barrier consumer c forms dQ of rows
    [64c, 64c + 64) over all 128 keys, sum_c2 dS_c2[rows_c] K_c2, its A operand consumer
    c2's dS^T tile sliced at those 64 columns (one 128-byte swizzle atom) and read
    transposed; staged not transposed (16 STS.64 instead of 32 STS), one [64, D] box per
    consumer a step, reduce-added at row m0 + 64c (no DQ_SUM);
  * the dots one after the other: S^T, P^T, dV, then dP^T, dS^T, dK, dQ. S^T and dP^T are
    [64, 128] fp32, 64 registers each, so P^T + dP^T + dK + dV is already 192; issued
    together as at 64 rows (the exp under the dP^T dot) the consumers spilled 34-75
    instructions, also with S^T / dP^T accumulated onto -lse / scale and -delta starts.
    The math is the 64-row step's (same exp2 argument, masks and dS^T = P^T (dP^T - delta)).
  * one K/V stage (KV_STAGES_M64 ignored; the host refuses JAGGED_BWD_WS_KV_STAGES=2): 195 KB
    of smem (K/V 32, Q/dO ring 64, dS^T 64, dQ staging 32, lse / delta 2); no DIAG_MASK.
Compile-only (sm_90a, tests/test_bwd_compile.py): spill-free at 240 registers causal and
not, packed and broadcast-Q, DYNAMIC on and off, Q_LOOP_STAGES 0 and 1, bf16 and fp16;
the 64- and 32-row builds compile to the same PTX as without it.

Determinism: the same as the plain kernel (bulk reduce-adds from several programs into
one dQ row are unordered in the packed modes; broadcast-Q slots are per program).
"""
from __future__ import annotations

import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from .bwd_hopper import lse_log2, schedule
from .tile_counter import fetch_tile, next_tile, publish_tile

NUM_BUF_Q = tl.constexpr(2)       # depth of the Q/dO ring
NUM_BUF_KV = tl.constexpr(2)      # K/V stages: the next tile loads during this one
NUM_CONSUMERS = tl.constexpr(2)   # consumer warpgroups; each owns BLOCK_N // NUM_CONSUMERS keys
# setmaxnreg per role: producer (default, the compiler picks) + 2x4 consumer warps + 1 reduce warp
REGS_COMPUTE = tl.constexpr(232)
REGS_COMPUTE_M64 = tl.constexpr(240)  # 64-row steps: no reduce warp, 3 warpgroups
REGS_REDUCE = tl.constexpr(24)
DS_BARRIER = tl.constexpr(8)      # named barrier: both consumers' dS^T are in smem


def dq_cols(head_dim: int) -> int:
    """dQ columns per consumer (the DQ_COLS constexpr and the dQ TMA box width)."""
    half = head_dim // NUM_CONSUMERS.value
    return half if half >= 64 else head_dim


def dq_rows(block_m: int) -> int:
    """dQ rows per consumer (the dQ TMA box height): 128-row steps split the rows."""
    return block_m // NUM_CONSUMERS.value if block_m >= 128 else block_m


@triton.jit
def _buf_phase(cnt, NUM: tl.constexpr):
    return cnt % NUM, (cnt // NUM) & 1


@triton.jit
def _opaque(x):
    """x through a mov the compiler cannot see through or hoist (volatile inline asm)."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _tile_range(pid, nprog, n_tiles_ptr, HKV: tl.constexpr, BROADCAST_Q: tl.constexpr):
    n_tiles = tl.load(n_tiles_ptr)
    if BROADCAST_Q:
        first = pid // HKV
        step = nprog // HKV
    else:
        first = pid
        step = nprog
        n_tiles = n_tiles * HKV
    return first, step, n_tiles


@triton.jit
def load(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem,
         kv_full, kv_empty, q_full, q_empty,
         tile_b_ptr, tile_n_ptr, n_tiles_ptr, cu_q_ptr, cu_k_ptr, L_q,
         H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
         BROADCAST_Q: tl.constexpr, NUM_BUF: tl.constexpr, NC: tl.constexpr,
         NKV: tl.constexpr, lse_ptr=None, delta_ptr=None, stride_lse_h=None,
         lse_smem=None, delta_smem=None,
         dq_desc=None, dq_smem=None, dq_full=None, dq_empty=None, DQ_COLS: tl.constexpr = 0,
         REDUCE_DQ: tl.constexpr = False, sched_ptr=None, tile_full=None,
         tile_empty=None, DYNAMIC: tl.constexpr = False, DQ_SUM: tl.constexpr = False,
         DQ_ROWS: tl.constexpr = 0):
    G: tl.constexpr = H // HKV
    BNC: tl.constexpr = BLOCK_N // NC
    ELT: tl.constexpr = tlx.size_of(tlx.dtype_of(q_desc))
    pid = tl.program_id(0)
    first, step, n_tiles = _tile_range(pid, tl.num_programs(0), n_tiles_ptr, HKV, BROADCAST_Q)
    i = 0
    qcnt = 0
    if REDUCE_DQ:  # reduce_dq's work, one step behind (see below)
        if BROADCAST_Q:
            slot_row = (pid // HKV) * L_q
        else:
            slot_row = 0
        dq_row = pid * 0  # the previous step's dQ rows and head
        dq_h = pid * 0
    t = first
    if DYNAMIC:
        publish_tile(sched_ptr, tile_full, tile_empty, t, 0)
    while t < n_tiles:
        b, hk, n0, len_k, len_q, k_start, q_start, o_start, m_lo, n_m = schedule(
            t, tile_b_ptr, tile_n_ptr, cu_q_ptr, cu_k_ptr, L_q,
            HKV, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q)
        if BROADCAST_Q:
            hk = pid % HKV
        # K, V of the tile: one stage, freed by both consumers at the end of the tile
        kvb, kph = _buf_phase(i, NKV)
        tlx.barrier_wait(kv_empty[kvb], kph ^ 1)
        tlx.barrier_expect_bytes(kv_full[kvb], 2 * ELT * BLOCK_N * D)
        krow = (k_start + n0).to(tl.int32)
        for c in tl.static_range(NC):
            tlx.async_descriptor_load(k_desc, k_smem[kvb * NC + c], [krow + c * BNC, hk * D],
                                      kv_full[kvb])
            tlx.async_descriptor_load(v_desc, v_smem[kvb * NC + c], [krow + c * BNC, hk * D],
                                      kv_full[kvb])
        # Q, dO per (query head of the group, Q block)
        for j in range(0, G * n_m):
            h = hk * G + j // n_m
            m0 = m_lo + (j % n_m) * BLOCK_M
            buf, ph = _buf_phase(qcnt, NUM_BUF)
            if lse_smem is not None:  # the step's lse2 / delta; LDG before the wait hides L2
                offs = m0 + tl.arange(0, BLOCK_M)
                off = h * stride_lse_h + o_start + offs
                lse2 = lse_log2(tl.load(lse_ptr + off, mask=offs < len_q, other=float("inf")))
                dl = tl.load(delta_ptr + off, mask=offs < len_q, other=0.0)
            tlx.barrier_wait(q_empty[buf], ph ^ 1)
            if lse_smem is not None:
                # plain st.shared, published by the expect-bytes arrive below: it is lowered
                # as bar.sync over this warpgroup, then one thread's mbarrier.arrive
                # (.release.cta), and the consumers' q_full wait acquires. So q_full keeps
                # arrive_count 1 (that arrive + the TMA bytes), and q_empty (both consumers
                # arrive after their last read of the stage) also guards these two rows.
                tlx.local_store(lse_smem[buf], lse2)
                tlx.local_store(delta_smem[buf], dl)
            tlx.barrier_expect_bytes(q_full[buf], 2 * ELT * BLOCK_M * D)
            tlx.async_descriptor_load(q_desc, q_smem[buf], [(q_start + m0).to(tl.int32), h * D],
                                      q_full[buf])
            tlx.async_descriptor_load(do_desc, do_smem[buf], [(o_start + m0).to(tl.int32), h * D],
                                      q_full[buf])
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
                    _reduce_step(dq_desc, dq_smem, dq_full, dq_empty, dq_row, dq_h, qcnt - 1,
                                 D, NC, DQ_COLS, DQ_SUM, DQ_ROWS)
                dq_row = (slot_row + q_start + m0).to(tl.int32)
                dq_h = h
            qcnt += 1
        i += 1
        # the next tile, taken once this one's loads are issued (two steps before its end)
        t = next_tile(t, step, sched_ptr, DYNAMIC)
        if DYNAMIC:
            publish_tile(sched_ptr, tile_full, tile_empty, t, i)
    if REDUCE_DQ:
        if qcnt > 0:  # the last step's dQ
            _reduce_step(dq_desc, dq_smem, dq_full, dq_empty, dq_row, dq_h, qcnt - 1,
                         D, NC, DQ_COLS, DQ_SUM, DQ_ROWS)


@triton.jit
def causal_cut(nc0, m0, off, BNC: tl.constexpr):
    """Whether the causal bound (key n kept iff n <= row + off, off = len_k - len_q) drops
    any pair of keys [nc0, nc0 + BNC) x rows [m0, m0 + BLOCK_M): iff the last key passes the
    first row's bound. Rows past len_q need no mask (lse = +inf: P = 0), keys past len_k get
    the key-length mask on every step. Plain arithmetic: also callable from Python (tests)."""
    return nc0 + BNC - 1 > m0 + off


@triton.jit
def _step_rows(kc, vc, qb, dob, lse_s, delta_s, k_smem, ds_smem, kvb, qcnt, dk, dv, offs_n,
               offs_m, len_k, len_q, qk_scale2, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
               BNC: tl.constexpr, NC: tl.constexpr, cid: tl.constexpr):
    """compute's body at 128-row steps (D = 64), from the Q/dO wait to the dQ wait: returns
    dK_c, dV_c (their dots done) and this consumer's dQ rows [BLOCK_M // NC, D] (not
    transposed). The math is the 64-row step's; the order is not: S^T and dP^T are
    [BNC, 128] here (64 registers each), so the dots run one after the other and P^T, dP^T
    are consumed before the next one starts (at most P^T + dP^T + dK + dV, 192 registers,
    live at once). Issued together as at 64 rows (the exp under the dP^T dot) the build
    spilled 34-75 instructions, also with S^T / dP^T started from -lse / scale and -delta."""
    dt: tl.constexpr = qb.dtype
    RC: tl.constexpr = BLOCK_M // NC  # this consumer's query rows of dQ
    st = tlx.async_dot(kc, tlx.local_trans(qb))                      # S^T = K_c Q^T
    st = tlx.async_dot_wait(0, st)
    pt = tl.math.exp2(st * qk_scale2 - tlx.local_load(lse_s)[None, :])
    keep = (offs_n < len_k)[:, None]
    if CAUSAL:
        keep = keep & (offs_n[:, None] <= offs_m[None, :] + (len_k - len_q))
    pt = tl.where(keep, pt, 0.0)
    dv = tlx.async_dot(pt.to(dt), dob, dv)                           # dV_c += P^T dO
    dv = tlx.async_dot_wait(0, dv)  # P^T's bf16 copy dies before dP^T (Q_LOOP_STAGES=0)
    dpt = tlx.async_dot(vc, tlx.local_trans(dob))                    # dP^T = V_c dO^T
    dpt = tlx.async_dot_wait(0, dpt)
    dst = (pt * (dpt - tlx.local_load(delta_s)[None, :])).to(dt)
    dk = tlx.async_dot(dst, qb, dk)                                  # dK_c += dS^T Q
    # dQ of this consumer's RC query rows over all BLOCK_N keys, split by rows (no
    # DQ_SUM): dQ[rows_c] = sum_c2 dS_c2[rows_c] K_c2, A = consumer c2's dS^T columns
    # rows_c read transposed from smem (a whole 128-byte swizzle atom of its rows)
    sb = (qcnt % 2) * NC  # dS^T double-buffered by step parity, as in compute
    tlx.local_store(ds_smem[sb + cid], dst)
    tlx.fence_async_shared()
    tlx.named_barrier_wait(DS_BARRIER, NC * 128)
    dq = tlx.async_dot(_ds_rows(ds_smem, sb, cid, BNC, RC), k_smem[kvb * NC])
    for c2 in tl.static_range(1, NC):
        dq = tlx.async_dot(_ds_rows(ds_smem, sb + c2, cid, BNC, RC), k_smem[kvb * NC + c2], dq)
    dq = tlx.async_dot_wait(0, dq)
    return dk, dv, dq


@triton.jit
def _ds_rows(ds_smem, idx, cid: tl.constexpr, BNC: tl.constexpr, RC: tl.constexpr):
    """dS (query rows x keys) of consumer cid's RC rows, from the dS^T tile ds_smem[idx]."""
    return tlx.local_trans(tlx.local_slice(ds_smem[idx], [0, cid * RC], [BNC, RC]))


@triton.jit
def compute(k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem,
            kv_full, kv_empty, q_full, q_empty, dq_full, dq_empty,
            lse_ptr, delta_ptr, dk_ptr, dv_ptr,
            tile_b_ptr, tile_n_ptr, n_tiles_ptr, cu_q_ptr, cu_k_ptr, L_q,
            scale, stride_k_tok, stride_k_h, stride_lse_h,
            H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
            BROADCAST_Q: tl.constexpr, NUM_BUF: tl.constexpr, NC: tl.constexpr,
            DQ_COLS: tl.constexpr, cid: tl.constexpr, NKV: tl.constexpr,
            lse_smem=None, delta_smem=None, DIAG_MASK: tl.constexpr = False,
            sched_ptr=None, tile_full=None, tile_empty=None, DYNAMIC: tl.constexpr = False,
            DQ_SUM: tl.constexpr = False, Q_LOOP_STAGES: tl.constexpr = 1,
            ROW_SPLIT: tl.constexpr = False):
    # cid comes in as an argument: a jit helper is traced once per signature, so
    # async_task_replica_id() read here gave both replicas cid = 0 (dq_full[1] never
    # arrived: the session 3-5 hang)
    G: tl.constexpr = H // HKV
    BNC: tl.constexpr = BLOCK_N // NC
    pid = tl.program_id(0)
    first, step, n_tiles = _tile_range(pid, tl.num_programs(0), n_tiles_ptr, HKV, BROADCAST_Q)
    qk_scale2 = scale * 1.4426950408889634
    i = 0
    qcnt = 0
    dqc = dq_smem[cid]
    t = first
    if DYNAMIC:
        t = fetch_tile(sched_ptr, tile_full, tile_empty, t, step, 0, DYNAMIC)
    while t < n_tiles:
        b, hk, n0, len_k, len_q, k_start, q_start, o_start, m_lo, n_m = schedule(
            t, tile_b_ptr, tile_n_ptr, cu_q_ptr, cu_k_ptr, L_q,
            HKV, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q)
        if BROADCAST_Q:
            hk = pid % HKV
        nc0 = n0 + cid * BNC
        offs_n = nc0 + tl.arange(0, BNC)
        dk = tl.zeros([BNC, D], dtype=tl.float32)
        dv = tl.zeros([BNC, D], dtype=tl.float32)
        kvb, kph = _buf_phase(i, NKV)
        tlx.barrier_wait(kv_full[kvb], kph)
        kc = k_smem[kvb * NC + cid]
        vc = v_smem[kvb * NC + cid]
        # step 0's LSE / delta: head hk * G, rows m_lo + [0, BLOCK_M) (all masked off when
        # n_m == 0: then m_lo >= len_q); rows past the sequence -> P = 0
        if lse_smem is None:  # (with lse_smem: staged per Q stage by the load task)
            offs_0 = m_lo + tl.arange(0, BLOCK_M)  # (names not reused in the loop: not carried)
            off_0 = hk * G * stride_lse_h + o_start + offs_0
            lse_nx = tl.load(lse_ptr + off_0, mask=offs_0 < len_q, other=float("inf"))
            delta_nx = tl.load(delta_ptr + off_0, mask=offs_0 < len_q, other=0.0)
        # (a loop's own num_stages wins over the launch's: Q_LOOP_STAGES carries
        # JAGGED_BWD_WS_NUM_STAGES here, which until session 18 reached no loop)
        for j in tl.range(0, G * n_m, num_stages=Q_LOOP_STAGES):
            jm = j % n_m
            h = hk * G + j // n_m
            m0 = m_lo + jm * BLOCK_M
            buf, ph = _buf_phase(qcnt, NUM_BUF)
            offs_m = m0 + tl.arange(0, BLOCK_M)
            if lse_smem is None:
                lse = lse_nx  # loaded during the previous step (or before the loop)
                delta = delta_nx
            tlx.barrier_wait(q_full[buf], ph)
            qb = q_smem[buf]
            dob = do_smem[buf]
            if D >= 128:  # K_c / V_c descriptors per Q block, not held across the loop
                kvq = _opaque(kvb)
                kc = k_smem[kvq * NC + cid]
                vc = v_smem[kvq * NC + cid]
            if ROW_SPLIT:  # 128-row steps (D = 64): _step_rows
                dk, dv, dqt = _step_rows(kc, vc, qb, dob, lse_smem[buf], delta_smem[buf],
                                         k_smem, ds_smem, kvb, qcnt, dk, dv, offs_n, offs_m,
                                         len_k, len_q, qk_scale2, CAUSAL, BLOCK_M, BNC, NC,
                                         cid)
            else:
                # S^T = K_c Q^T and dP^T = V_c dO^T, both in flight together
                st = tlx.async_dot(kc, tlx.local_trans(qb))
                dpt = tlx.async_dot(vc, tlx.local_trans(dob))
                # The next step's LSE / delta, in flight under the rest of this step. Next
                # step: the next Q block of head h, or block 0 of head h + 1; at the last step
                # the index stays on this step's block (an in-bounds address) and the mask is
                # all false, so nothing is read. Each load comes after this step's last use of
                # the value it replaces (LSE: lse2, delta: dS^T), so ptxas keeps one set of
                # registers per value, no copies; it issues the LSE loads just before the dK
                # wait (ahead of the dQ wgmmas, the dQ handoff and the next Q/dO wait), the
                # delta loads about as early.
                if lse_smem is None:
                    more = j + 1 < G * n_m
                    wrap = jm == n_m - 1
                    h_nx = tl.where(more & wrap, h + 1, h)
                    m0_nx = tl.where(more, tl.where(wrap, m_lo, m0 + BLOCK_M), m0)
                    offs_nx = m0_nx + tl.arange(0, BLOCK_M)
                    rmask_nx = (offs_nx < len_q) & more
                    off_nx = h_nx * stride_lse_h + o_start + offs_nx
                    lse2 = lse_log2(lse)
                    lse_nx = tl.load(lse_ptr + off_nx, mask=rmask_nx, other=float("inf"))
                st = tlx.async_dot_wait(1, st)
                if lse_smem is not None:  # read at use: no registers held across the step
                    lse2 = tlx.local_load(lse_smem[buf])
                pt = tl.math.exp2(st * qk_scale2 - lse2[None, :])
                keep = (offs_n < len_k)[:, None]
                if CAUSAL:
                    if not DIAG_MASK:
                        keep = keep & (offs_n[:, None] <= offs_m[None, :] + (len_k - len_q))
                pt = tl.where(keep, pt, 0.0)
                if DIAG_MASK:  # causal bound only where it cuts this step's block (diagonal steps)
                    if causal_cut(nc0, m0, len_k - len_q, BNC):
                        pt = tl.where(offs_n[:, None] <= offs_m[None, :] + (len_k - len_q),
                                      pt, 0.0)
                lp = pt.to(dk_ptr.dtype.element_ty)
                dv = tlx.async_dot(lp, dob, dv)                   # dV_c += P^T dO
                dpt = tlx.async_dot_wait(1, dpt)
                if lse_smem is not None:
                    delta = tlx.local_load(delta_smem[buf])
                dst = (pt * (dpt - delta[None, :])).to(dk_ptr.dtype.element_ty)
                if lse_smem is None:
                    delta_nx = tl.load(delta_ptr + off_nx, mask=rmask_nx, other=0.0)
                sb = (qcnt % 2) * NC
                dk = tlx.async_dot(dst, qb, dk)                   # dK_c += dS^T Q
                # dQ, swapped so the wgmma's M is the head dim: dS^T goes to smem (double-
                # buffered by Q-block parity). At D >= 128 the consumers meet, then each
                # forms its DQ_COLS columns over all BLOCK_N keys:
                #   dQ^T[cols_c] = sum_c2 K_c2[:, cols_c]^T dS_c2^T
                # (one reduce-add per Q block); at D = 64 (a wgmma's M is at least 64) each
                # forms all D columns over its own keys: dQ^T = K_c^T dS_c^T.
                tlx.local_store(ds_smem[sb + cid], dst)
                tlx.fence_async_shared()
                if DQ_COLS < D:
                    tlx.named_barrier_wait(DS_BARRIER, NC * 128)
                    dqt = tl.zeros([DQ_COLS, BLOCK_M], dtype=tl.float32)
                    for c2 in tl.static_range(NC):
                        kt = tlx.local_trans(tlx.local_slice(k_smem[kvb * NC + c2],
                                                             [0, cid * DQ_COLS],
                                                             [BNC, DQ_COLS]))
                        dqt = tlx.async_dot(kt, ds_smem[sb + c2], dqt)
                else:
                    dqt = tlx.async_dot(tlx.local_trans(kc), ds_smem[sb + cid])
                dqt = tlx.async_dot_wait(0, dqt)
            dv = tlx.async_dot_wait(0, dv)
            dk = tlx.async_dot_wait(0, dk)
            tlx.barrier_arrive(q_empty[buf], 1)               # Q/dO stage free
            if DQ_SUM:
                if cid == NC - 1:
                    # D = 64: the others' full-D partials added here (their staging, read
                    # in the accumulator's layout), so one box a step is reduce-added to
                    # the fp32 dQ in global memory instead of NC (half the traffic)
                    for c2 in tl.static_range(NC - 1):
                        tlx.barrier_wait(dq_full[c2], qcnt & 1)
                        dqt += tlx.local_load(tlx.local_trans(dq_smem[c2]))
                        tlx.barrier_arrive(dq_empty[c2], 1)
            # stage this consumer's dQ columns for the reduce task (DQ_SUM: the others'
            # for the last consumer, above)
            tlx.barrier_wait(dq_empty[cid], (qcnt & 1) ^ 1)  # one stage per consumer
            if ROW_SPLIT:  # its dQ rows, not transposed (_step_rows)
                tlx.local_store(dqc, dqt)
            else:
                tlx.local_store(tlx.local_trans(dqc), dqt)
            tlx.fence_async_shared()
            tlx.barrier_arrive(dq_full[cid], 1)
            qcnt += 1
        # V_c is read by this consumer alone, and no longer: it stages the stores
        store(dk_ptr, dv_ptr, dk, dv, vc, k_start, nc0, len_k, hk, scale,
                   stride_k_tok, stride_k_h, BNC, D)
        tlx.fence("async_shared")  # our generic smem writes before the next TMA write
        tlx.barrier_arrive(kv_empty[kvb], 1)                  # K/V stage free
        i += 1
        t = fetch_tile(sched_ptr, tile_full, tile_empty, t, step, i, DYNAMIC)


@triton.jit
def store(dk_ptr, dv_ptr, dk, dv, stage, k_start, nc0, len_k, hk, scale,
               stride_k_tok, stride_k_h, BNC: tl.constexpr, D: tl.constexpr):
    """store: dK_c (times the softmax scale) and dV_c in the input dtype, through `stage`
    (smem of the tile's shape) in slices of ROWS keys: a pointer tensor of the whole
    [BNC, D] tile would cost 128 registers a thread, on top of dK and dV."""
    xk = (dk * scale).to(dk_ptr.dtype.element_ty)  # both narrowed first: the fp32
    xv = dv.to(dv_ptr.dtype.element_ty)              # accumulators die here
    _store_rows(dk_ptr, xk, stage, k_start, nc0, len_k, hk, stride_k_tok, stride_k_h, BNC, D)
    _store_rows(dv_ptr, xv, stage, k_start, nc0, len_k, hk, stride_k_tok, stride_k_h, BNC, D)


@triton.jit
def _store_rows(ptr, x, stage, k_start, nc0, len_k, hk, stride_k_tok, stride_k_h,
                BNC: tl.constexpr, D: tl.constexpr):
    ROWS: tl.constexpr = 16
    tlx.local_store(stage, x)
    d = tl.arange(0, D)
    for r in tl.static_range(BNC // ROWS):
        rows = nc0 + r * ROWS + tl.arange(0, ROWS)
        y = tlx.local_load(tlx.local_slice(stage, [r * ROWS, 0], [ROWS, D]))
        off = (k_start + rows)[:, None] * stride_k_tok + hk * stride_k_h + d[None, :]
        # rows start 16-byte aligned (backward allocates dK/dV contiguous): vector stores
        tl.store(tl.multiple_of(ptr + off, [1, 16]), y, mask=(rows < len_k)[:, None])


@triton.jit
def reduce_dq(dq_desc, dq_smem, dq_full, dq_empty,
              tile_b_ptr, tile_n_ptr, n_tiles_ptr, cu_q_ptr, cu_k_ptr, L_q,
              H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
              BROADCAST_Q: tl.constexpr, NUM_BUF: tl.constexpr, NC: tl.constexpr,
              DQ_COLS: tl.constexpr, sched_ptr=None, tile_full=None, tile_empty=None,
              DYNAMIC: tl.constexpr = False, DQ_SUM: tl.constexpr = False):
    G: tl.constexpr = H // HKV
    pid = tl.program_id(0)
    first, step, n_tiles = _tile_range(pid, tl.num_programs(0), n_tiles_ptr, HKV, BROADCAST_Q)
    if BROADCAST_Q:
        slot_row = (pid // HKV) * L_q
    else:
        slot_row = 0
    qcnt = 0
    i = 0
    t = first
    if DYNAMIC:
        t = fetch_tile(sched_ptr, tile_full, tile_empty, t, step, 0, DYNAMIC)
    while t < n_tiles:
        b, hk, n0, len_k, len_q, k_start, q_start, o_start, m_lo, n_m = schedule(
            t, tile_b_ptr, tile_n_ptr, cu_q_ptr, cu_k_ptr, L_q,
            HKV, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q)
        if BROADCAST_Q:
            hk = pid % HKV
        for j in range(0, G * n_m):
            h = hk * G + j // n_m
            m0 = m_lo + (j % n_m) * BLOCK_M
            _reduce_step(dq_desc, dq_smem, dq_full, dq_empty,
                         (slot_row + q_start + m0).to(tl.int32), h, qcnt, D, NC, DQ_COLS,
                         DQ_SUM)
            qcnt += 1
        i += 1
        t = fetch_tile(sched_ptr, tile_full, tile_empty, t, step, i, DYNAMIC)


@triton.jit
def _reduce_step(dq_desc, dq_smem, dq_full, dq_empty, row, h, qcnt,
                 D: tl.constexpr, NC: tl.constexpr, DQ_COLS: tl.constexpr,
                 DQ_SUM: tl.constexpr = False, DQ_ROWS: tl.constexpr = 0):
    """One Q step's dQ reduce-add (rows from `row`, head h; qcnt: the step's count, for
    the barrier phase): reduce_dq's body, and the load task's at 64-row steps. DQ_SUM: the
    last consumer's box holds the sum of all (compute), the only one added. DQ_ROWS
    (128-row steps): consumer c's box is rows [c * DQ_ROWS, (c + 1) * DQ_ROWS), all D."""
    C0: tl.constexpr = NC - 1 if DQ_SUM else 0
    for c in tl.static_range(C0, NC):  # consumer c's columns, or all D (each or summed)
        tlx.barrier_wait(dq_full[c], qcnt & 1)
        col = h * D + (c * DQ_COLS if DQ_COLS < D else 0)
        if DQ_ROWS:
            tlx.async_descriptor_store(dq_desc, dq_smem[c], [row + c * DQ_ROWS, col],
                                       store_reduce="add")
        else:
            tlx.async_descriptor_store(dq_desc, dq_smem[c], [row, col], store_reduce="add")
    # rows past the sequence hold exact zeros (P = 0), so whole boxes are added
    tlx.async_descriptor_store_wait(0)
    for c in tl.static_range(C0, NC):
        tlx.barrier_arrive(dq_empty[c], 1)


@triton.jit
def _bwd_main_ws(q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr,
                 dq_desc, dk_ptr, dv_ptr,
                 cu_q_ptr, cu_k_ptr, tile_b_ptr, tile_n_ptr, n_tiles_ptr, sched_ptr,
                 scale, L_q, stride_k_tok, stride_k_h, stride_lse_h,
                 H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr, DQ_COLS: tl.constexpr,
                 DIAG_MASK: tl.constexpr = False,  # opt-in, causal 64-row steps (above)
                 DYNAMIC: tl.constexpr = False,    # tiles from the counter (bwd_dynamic)
                 KV_STAGES_M64: tl.constexpr = 1,  # K/V stages at 64-row steps (ws_kv_stages)
                 DQ_SUM: tl.constexpr = False,     # D = 64: one dQ box a step (ws_dq_sum)
                 Q_LOOP_STAGES: tl.constexpr = 1):  # the Q-block loop's num_stages (ws_config)
    NC: tl.constexpr = NUM_CONSUMERS
    NB: tl.constexpr = NUM_BUF_Q
    BNC: tl.constexpr = BLOCK_N // NC
    dt: tl.constexpr = tlx.dtype_of(q_desc)
    # 64-row steps (BLOCK_M = 64, the default): one K/V stage at D = 128 (197 KB of
    # smem instead of 263; two at D = 64, bwd_hopper.ws_kv_stages), and lse2 / delta
    # staged in smem per Q stage by the load task instead of 2 x 16 registers carried a
    # step ahead in each consumer
    M64: tl.constexpr = BLOCK_M >= 64
    # 128-row steps (D = 64 only, its default; M64's changes apply too): the consumers split
    # dQ by query rows (ROW_SPLIT in compute), one K/V stage (two spilled in causal)
    M128: tl.constexpr = BLOCK_M >= 128
    tl.static_assert(D == 64 or not M128, "128-row steps are built for D = 64 only")
    NKV: tl.constexpr = 1 if M128 else (KV_STAGES_M64 if M64 else NUM_BUF_KV)
    # and no reduce_dq warp: the load task reduces dQ, so the kernel is 3 warpgroups (384
    # threads) and the consumers get 240 registers (128 x 24 + 256 x 240 <= 65,536)
    REGS_LOAD: tl.constexpr = REGS_REDUCE if M64 else None  # (None: as before, the compiler's)
    REGS_C: tl.constexpr = REGS_COMPUTE_M64 if M64 else REGS_COMPUTE
    DQS: tl.constexpr = DQ_SUM and DQ_COLS == D and not M128  # each forms all D columns
    DQ_ROWS: tl.constexpr = BLOCK_M // NC if M128 else 0  # M128: a consumer's dQ box rows
    # shared memory: K/V halves (NUM_BUF_KV stages), Q/dO ring, dS^T halves (two Q blocks deep:
    # a consumer may write the next block's while the other still reads this one's),
    # dQ column-half (M128: row-half) staging per consumer
    k_smem = tlx.local_alloc((BNC, D), dt, NC * NKV)  # [stage * NC + consumer]
    v_smem = tlx.local_alloc((BNC, D), dt, NC * NKV)
    q_smem = tlx.local_alloc((BLOCK_M, D), dt, NB)
    do_smem = tlx.local_alloc((BLOCK_M, D), dt, NB)
    ds_smem = tlx.local_alloc((BNC, BLOCK_M), dt, 2 * NC)
    dq_smem = tlx.local_alloc((DQ_ROWS if M128 else BLOCK_M, DQ_COLS), tl.float32, NC)
    if M64:
        lse_smem = tlx.local_alloc((BLOCK_M,), tl.float32, NB)  # with the Q/dO ring
        delta_smem = tlx.local_alloc((BLOCK_M,), tl.float32, NB)
    else:
        lse_smem = None
        delta_smem = None
    kv_full = tlx.alloc_barriers(num_barriers=NKV, arrive_count=1)
    kv_empty = tlx.alloc_barriers(num_barriers=NKV, arrive_count=NC)
    q_full = tlx.alloc_barriers(num_barriers=NB, arrive_count=1)
    q_empty = tlx.alloc_barriers(num_barriers=NB, arrive_count=NC)
    dq_full = tlx.alloc_barriers(num_barriers=NC, arrive_count=1)
    dq_empty = tlx.alloc_barriers(num_barriers=NC, arrive_count=1)
    # DYNAMIC: the tile handoff (two slots), read by the consumers (and the reduce_dq warp)
    tile_full = tlx.alloc_barriers(num_barriers=2, arrive_count=1)
    tile_empty = tlx.alloc_barriers(num_barriers=2, arrive_count=NC if M64 else NC + 1)

    with tlx.async_tasks():
        with tlx.async_task("default", registers=REGS_LOAD):
            load(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem,
                 kv_full, kv_empty, q_full, q_empty,
                 tile_b_ptr, tile_n_ptr, n_tiles_ptr, cu_q_ptr, cu_k_ptr, L_q,
                 H, HKV, D, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q, NB, NC,
                 NKV, lse_ptr, delta_ptr, stride_lse_h, lse_smem, delta_smem,
                 dq_desc, dq_smem, dq_full, dq_empty, DQ_COLS, M64,
                 sched_ptr, tile_full, tile_empty, DYNAMIC, DQS, DQ_ROWS)
        with tlx.async_task(num_warps=4, registers=REGS_C, replicate=NC):
            cid: tl.constexpr = tlx.async_task_replica_id()  # per replica, as in fwd_hopper
            compute(k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem,
                    kv_full, kv_empty, q_full, q_empty, dq_full, dq_empty,
                    lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                    tile_b_ptr, tile_n_ptr, n_tiles_ptr, cu_q_ptr, cu_k_ptr, L_q,
                    scale, stride_k_tok, stride_k_h, stride_lse_h,
                    H, HKV, D, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q, NB, NC, DQ_COLS, cid,
                    NKV, lse_smem, delta_smem, DIAG_MASK and CAUSAL and M64 and not M128,
                    sched_ptr, tile_full, tile_empty, DYNAMIC, DQS, Q_LOOP_STAGES, M128)
        if not M64:
            with tlx.async_task(num_warps=1, registers=REGS_REDUCE):
                reduce_dq(dq_desc, dq_smem, dq_full, dq_empty,
                          tile_b_ptr, tile_n_ptr, n_tiles_ptr, cu_q_ptr, cu_k_ptr, L_q,
                          H, HKV, D, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q, NB, NC, DQ_COLS,
                          sched_ptr, tile_full, tile_empty, DYNAMIC, DQS)
