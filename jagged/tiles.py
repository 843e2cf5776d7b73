"""Jagged tile lists shared by both kernel styles (on the GPU, no host sync).

Forward: a tile is a (sequence, query block) pair `b * nblk + m`, ordered by
descending work (KV blocks to visit, plus one for the Q load and the epilogue, so
tiles with no key still count), ties by pair index; causal lists by sequence first
(see `fwd_tiles`); invalid pairs (past a sequence's queries) come last. `fwd_tiles`
builds it for both styles (their `schedule.build_tiles`) with one small key kernel
that also sorts; `longest_first_tiles` is its torch-op reference.

Backward: a tile is a (sequence, KV block) pair. `kv_tiles` builds the list the
backward kernels of both styles walk with the same key kernel (up to SORT_MAX pairs;
else the keys, torch.sort and a decode kernel); `kv_tiles_reference` is its torch-op
reference. `dq_accumulator` makes the fp32 dQ buffer they reduce into.

Both lists are reused while their offsets tensors are unchanged (`per_offsets`). The
forward's length bucket and consumer count (`fwd_bucket`, `fwd_consumers`), broadcast-Q's
GQA head packing (`gqa_pack`, `pack_heads`) and the backward's scheduling mode
(`bwd_dynamic`) live here too, since both styles share them.
"""
from __future__ import annotations

import functools
import math
import os
from collections import OrderedDict

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .launch import cdiv, fast, next_pow2
from .offsets import check_offsets, launch_check
from .seqinfo import causal_q_start, causal_q_start_ref


def longest_first_tiles(cu_q, cu_k, batch: int, max_seqlen_q: int, L_q: int | None,
                        block_m: int, block_n: int, causal: bool):
    """-> (pairs int32 [batch * nblk], count int32 [1] of valid pairs, nblk)."""
    nblk = max(1, -(-max_seqlen_q // block_m))
    dev = cu_k.device
    len_k = (cu_k[1:] - cu_k[:-1]).to(torch.int32)
    if L_q is not None:
        len_q = torch.full_like(len_k, L_q)
    else:
        len_q = (cu_q[1:] - cu_q[:-1]).to(torch.int32)
    m0 = torch.arange(0, nblk * block_m, block_m, device=dev, dtype=torch.int32)[None, :]
    lq, lk = len_q[:, None], len_k[:, None]
    valid = m0 < lq
    work = (lk + block_n - 1) // block_n + 1  # every block of a sequence: all its keys
    if causal:  # sequences by their keys, then their blocks, last (longest) first
        b = torch.arange(batch, device=dev)[:, None]
        mi = torch.arange(nblk, device=dev)[None, :]
        work = (work * batch + batch - 1 - b) * nblk + mi
    work = torch.where(valid, work, -1)
    pairs = torch.argsort(work.reshape(-1), descending=True, stable=True).to(torch.int32)
    count = valid.sum(dtype=torch.int32).reshape(1)
    return pairs, count, nblk


# the forward's 64-key blocks win up to this mean length: kernel time at gem-jagged
# sparsity 0.1, means 26 / 52 / 102 / 209 keys: -30 / -11 / -10 / +2 % (PERF.md)
FWD_SHORT_MEAN_K = 128


# causal: 64-key blocks win while every sequence has at most this many keys (a tile's
# few KV blocks are mostly on the diagonal, masked, and nothing overlaps across them);
# kernel ms, 128-key / 64-key blocks, H200 (TLX, CuteDSL): max 256-512 -10..-28 % /
# -6..-30 % over four fuzz shapes; gem 1024 / 0.5 -3 / +3 %, 2048 / 0.9 +8 / +4 %, llm
# 8192 +19 / +6 %, D = 64 4096 +25 / +18 %
FWD_CAUSAL_SHORT_MAX_K = 512


# D = 64 backward: 64-row steps beat 128-row ones up to this mean query length a sequence
# (the last step of a sequence pads fewer rows); graph replay, H200, B1152 H4, TLX /
# CuteDSL: mean 102 -8.1 / -3.5 %, 134 -2.1 / -0.2 %, 209 +3.5 / -1.0 %, 260 +6.6 / +2.3 %
BWD_MID_MEAN_Q = 128


def bwd_mean_q(n_q: int, batch: int, broadcast_q: bool) -> float:
    """A backward call's mean query rows a sequence, as `bwd_mid` reads it: broadcast-Q's
    rows are shared by every sequence."""
    return n_q / (1 if broadcast_q else batch)


def bwd_mid(head_dim: int, mean_q: float) -> bool:
    """Whether a backward takes its 64-row step at D = 64 (both styles' `pick_config`):
    the mean query rows a sequence (total / batch, or broadcast-Q's L_q, known without a
    sync) at most BWD_MID_MEAN_Q."""
    return head_dim == 64 and mean_q <= BWD_MID_MEAN_Q


def fwd_bucket(max_seqlen_k: int, mean_k: float | None = None, causal: bool = False) -> str:
    """The forward's length bucket, shared by both styles' `pick_config`: "short" (64-key
    blocks) when every sequence's KV fits in one 64-key block; without causal masking,
    when the mean KV length (total keys / batch, known without a sync) is at most
    FWD_SHORT_MEAN_K; causal, when the longest is at most FWD_CAUSAL_SHORT_MAX_K. Else
    "long"."""
    by_mean = mean_k is not None and not causal and mean_k <= FWD_SHORT_MEAN_K
    by_max = causal and max_seqlen_k <= FWD_CAUSAL_SHORT_MAX_K
    return "short" if max_seqlen_k <= 64 or by_mean or by_max else "long"


def fwd_consumers(block_m: int, producer_regs: int) -> tuple[int, int]:
    """(consumer warpgroups, their register cap) of a forward tile of block_m query rows,
    64 a consumer: 2 or 3 (192, FA4's D = 64 tile). 64K registers an SM for 128 producer
    threads and n * 128 consumer threads, in steps of 8: 240 for 2, 160 for 3."""
    if block_m not in (128, 192):
        raise ValueError(f"forward Config block_m={block_m}: block_m is 128 or 192 "
                         f"(2 or 3 consumer warpgroups of 64 rows; 3 at 160 registers)")
    n = block_m // 64
    return n, (512 - producer_regs) // n // 8 * 8


# --------------------------------------------------------------------- GQA head packing
def gqa_pack(broadcast_q: bool, L_q: int, group: int, block_m: int) -> int:
    """How many query heads a broadcast-Q forward tile packs into its rows (1: none).

    A tile holds L_q shared query rows of one head, so a short L_q leaves most of its
    block_m rows empty (fuzz B531 H32/4, L_q 16: 16 of 128). Under GQA the `group` heads
    of a KV head read the same keys: packed, tile row r is query row r // group of head
    hk * group + r % group (`pack_heads`), and H_kv * cdiv(L_q * group, block_m) tiles
    replace H * cdiv(L_q, block_m). Packed only where that makes fewer tiles, at a group
    dividing a 64-row consumer block (its rows start on a query row). Causal: a packed
    row's cut is its query row's (both styles' tile_coords and masks)."""
    if not broadcast_q or group <= 1 or 64 % group:
        return 1
    packed = -(-L_q * group // block_m)
    return group if packed < group * -(-L_q // block_m) else 1


def packed_query(q: torch.Tensor, broadcast_q: bool, kv_heads: int, block_m: int):
    """A forward's q as its tiles read it, and the heads a tile packs (`gqa_pack`): the
    packed copy (`pack_heads`) where it packs, else q itself."""
    pack = gqa_pack(broadcast_q, q.shape[0], q.shape[1] // kv_heads, block_m)
    return (pack_heads(q, pack) if pack > 1 else q), pack


def pack_heads(q: torch.Tensor, group: int) -> torch.Tensor:
    """Broadcast-Q's q [L_q, H, D] -> [L_q * group, H_kv, D], row l * group + j of KV head
    hk being q[l, hk * group + j] (a copy of the small shared q)."""
    L_q, H, D = q.shape
    return q.view(L_q, H // group, group, D).transpose(1, 2).reshape(L_q * group, H // group, D)


# Broadcast-Q dQ slots. A slot costs its zeroing and its read in the postprocess, 8 bytes
# per (query row, head, column): about the main kernel's work over 90 keys. So a call
# gets one slot per SLOT_KEYS of its keys (~5 % of the main kernel), within
# MAX_SLOT_BYTES in all; the programs pinned to a KV head share them round-robin, their
# reduce-adds meeting in L2 as the packed modes' do.
SLOT_KEYS = 2048
MAX_SLOT_BYTES = 512 * 1024 * 1024


@triton.jit
def seq_lens(cu_q, cu_k, b, inb, L_q, BROADCAST_Q: tl.constexpr):
    """(len_q, len_k) of sequences b (where inb; 0 elsewhere). BROADCAST_Q: every query
    length is L_q (cu_q unused)."""
    len_k = tl.load(cu_k + b + 1, mask=inb, other=0) - tl.load(cu_k + b, mask=inb, other=0)
    if BROADCAST_Q:
        len_q = L_q + b * 0
    else:
        len_q = tl.load(cu_q + b + 1, mask=inb, other=0) - tl.load(cu_q + b, mask=inb, other=0)
    return len_q, len_k


# tile lists of at most this many sequences (and NB_MAX blocks each) are sorted inside
# their key kernel (tl.sort, one program): no torch.sort, whose host cost (0.1-0.2 ms a
# call on the H200 node) exceeded the kernels' own time at short sequences (PERF.md)
SORT_MAX = 4096
NB_MAX = 4096
# the sorted sequences' runs of blocks are written SORT_LANES pairs at a time: RUN blocks
# of each of BLOCK sequences (a block a sequence at a time took one step per block of
# the longest sequence: 18 us of a replayed 0.2 ms backward at fuzz B13 H2/2 512 / 16384)
SORT_LANES = 2048


def sort_launch(batch: int, nb: int) -> dict:
    """Launch options of a key kernel over `batch` sequences of `nb` blocks: one in-kernel
    sort of the sequences when batch <= SORT_MAX and nb <= NB_MAX, else a loop of 1024-pair
    steps (sorted by torch.sort afterwards)."""
    if batch <= SORT_MAX and nb <= NB_MAX:
        block = next_pow2(max(batch, 128))
        return dict(BLOCK=block, SORT=True, RUN=max(1, SORT_LANES // block),
                    num_warps=min(8, max(4, block // 256)))
    return dict(BLOCK=1024, SORT=False, num_warps=4)


@triton.jit
def _q_pair_work(pair, inb, cu_q, cu_k, n_pairs, NB, L_q, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr):
    """Forward: (sequence b, query block m) = pair b * NB + m. Its work: KV blocks to
    visit, plus one for the Q load and the epilogue; 0 when the block holds no query.
    CAUSAL (int64): by the sequence's largest work (its last block's: all its keys), then
    the sequence, then m, so a sequence's tiles stay together, its longest first (see
    fwd_tiles)."""
    b = pair // NB
    m0 = (pair % NB) * BLOCK_M
    len_q, len_k = seq_lens(cu_q, cu_k, b, inb, L_q, BROADCAST_Q)
    work = (len_k + BLOCK_N - 1) // BLOCK_N + 1
    if CAUSAL:
        n_seq = n_pairs // NB
        work = (work.to(tl.int64) * n_seq + (n_seq - 1 - b)) * NB + pair % NB
    return tl.where(inb & (m0 < len_q), work, 0)


@triton.jit
def _kv_pair_work(pair, inb, cu_q, cu_k, NB, L_q, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr):
    """Backward: (sequence b, KV block n) = pair b * NB + n. Its work: query blocks that
    see the block, plus one (so blocks no query sees still come before padding); 0 past
    the sequence's keys. CAUSAL: the work of the sequence's first KV block (its largest)
    for every block, so a sequence's tiles stay together (see kv_tiles)."""
    b = pair // NB
    n0 = (pair % NB) * BLOCK_N
    len_q, len_k = seq_lens(cu_q, cu_k, b, inb, L_q, BROADCAST_Q)
    if CAUSAL:  # the query blocks from the one holding the first row that sees key 0
        m_lo = causal_q_start(0, len_q, len_k) // BLOCK_M * BLOCK_M
        work = (len_q - m_lo + BLOCK_M - 1) // BLOCK_M
    else:
        work = (len_q + BLOCK_M - 1) // BLOCK_M
    return tl.where(inb & (n0 < len_k), work + 1, 0)


@triton.jit
def _pair_work(pair, inb, cu_q, cu_k, n_pairs, NB, L_q, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr,
               KV_TILES: tl.constexpr):
    if KV_TILES:
        return _kv_pair_work(pair, inb, cu_q, cu_k, NB, L_q, BLOCK_M, BLOCK_N, CAUSAL,
                             BROADCAST_Q)
    else:
        return _q_pair_work(pair, inb, cu_q, cu_k, n_pairs, NB, L_q, BLOCK_M, BLOCK_N,
                            CAUSAL, BROADCAST_Q)


@triton.jit
def _seq_tiles(b, inb, cu_q, cu_k, n_pairs, NB, L_q, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr,
               KV_TILES: tl.constexpr):
    """(real tiles of sequence b, the work each of them has; 0 and 0 where it has none):
    its first block's `_pair_work`, which every real block of the sequence shares (the
    causal forward's composite key aside, whose leading part is this work)."""
    len_q, len_k = seq_lens(cu_q, cu_k, b, inb, L_q, BROADCAST_Q)
    if KV_TILES:
        n = tl.cdiv(len_k, BLOCK_N)
        work = _kv_pair_work(b * NB, inb, cu_q, cu_k, NB, L_q, BLOCK_M, BLOCK_N, CAUSAL,
                             BROADCAST_Q)
    else:
        n = tl.cdiv(len_q, BLOCK_M)
        work = _q_pair_work(b * NB, inb, cu_q, cu_k, n_pairs, NB, L_q, BLOCK_M, BLOCK_N,
                            False, BROADCAST_Q)
    n = tl.where(inb, tl.minimum(n, NB), 0)
    return n, tl.where(n > 0, work, 0)


@triton.jit
def _store_pairs(b, blk, keys_ptr, tiles_ptr, i, m, n_stride, NB, KV_TILES: tl.constexpr):
    """Sorted pairs (sequence b, block blk) at positions i: the forward's int64 keys (the
    pair b * NB + blk), or the backward's tiles (b and blk as they are: no division)."""
    if KV_TILES:
        _store_tiles(b, blk, tiles_ptr, i, m, n_stride)
    else:
        tl.store(keys_ptr + i, (b * NB + blk).to(tl.int64), mask=m)


@triton.jit
def _store_tiles(b, blk, out_ptr, i, m, n_stride):
    """Tiles (sequence b, block blk) -> tile_b (out[i]) and tile_n (out[n_stride + i])."""
    tl.store(out_ptr + i, b, mask=m)
    tl.store(out_ptr + n_stride + i, blk, mask=m)


@triton.jit
def _tile_keys_kernel(cu_q, cu_k, keys_ptr, tiles_ptr, count_ptr, n_pairs, n_stride, NB, L_q,
                      n_q, n_k, max_q, max_k,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                      BROADCAST_Q: tl.constexpr, KV_TILES: tl.constexpr,
                      BLOCK: tl.constexpr, SORT: tl.constexpr, RUN: tl.constexpr = 1,
                      CHECK: tl.constexpr = False, PDL: tl.constexpr = False,
                      WAIT_LAST: tl.constexpr = False):
    """One program, for both tile lists (KV_TILES: the backward's). Both store the count
    of real tiles (work > 0): no zeroed buffer, no atomics (a torch.zeros cost ~0.1 ms of
    host time per call on the H200 node).

    SORT (at most BLOCK sequences): every real tile of a sequence has its sequence's work,
    so the sequences are sorted, by the int32 key work << log2(BLOCK) | ~b descending
    (longest first, ties by sequence), and each is written out as its run of blocks, RUN
    blocks of every sequence a step: ascending, except the causal forward's (last block
    first). The padding pairs follow in pair order. The list equals a sort of every pair
    by its key (`_pair_work`, the order `longest_first_tiles` and `kv_tiles_reference`
    give) at a fraction of the cost: a 2304- / 4608-pair forward list at gem 256 / 512,
    sparsity 0.1, took 17 / 52 us sorted pair by pair. Else the int64 key -work << 32 |
    pair of every pair, 1024 at a time, into keys_ptr (ascending = the same order).

    CHECK: the offsets check first (jagged.offsets, the forward's `check=`; the launch
    compiles its asserts in), and nothing written from offsets that fail it. PDL: the
    kernel queued behind may launch at once (it waits for this one's writes itself).
    WAIT_LAST (a backward's list, launched as a programmatic dependent of its
    preprocess, whose writes it does not read): it runs beside the preprocess and waits
    for it last, so that the main kernel's wait for this kernel covers both."""
    if PDL:
        gdc_launch_dependents()
    ok = True
    if CHECK:
        ok = check_offsets(cu_q, cu_k, n_pairs // NB, n_q, n_k, max_q, max_k, not BROADCAST_Q,
                           1024)
    if ok:
        if SORT:
            BITS: tl.constexpr = BLOCK.bit_length() - 1
            n_seq = n_pairs // NB
            b = tl.arange(0, BLOCK)
            inb = b < n_seq
            n, work = _seq_tiles(b, inb, cu_q, cu_k, n_pairs, NB, L_q, BLOCK_M, BLOCK_N,
                                 CAUSAL, BROADCAST_Q, KV_TILES)
            total = tl.sum(n, 0)
            key = tl.sort((tl.minimum(work, (1 << (31 - BITS)) - 1) << BITS) | (BLOCK - 1 - b),
                          descending=True)
            sb = BLOCK - 1 - (key & (BLOCK - 1))  # the sequences, longest first
            sn, _ = _seq_tiles(sb, sb < n_seq, cu_q, cu_k, n_pairs, NB, L_q, BLOCK_M, BLOCK_N,
                               CAUSAL, BROADCAST_Q, KV_TILES)
            start = _per_run(tl.cumsum(sn, 0) - sn, RUN)
            sb, sn = _per_run(sb, RUN), _per_run(sn, RUN)
            for j0 in range(0, NB, RUN):
                j = _run_blocks(j0, RUN)
                if CAUSAL and not KV_TILES:
                    blk = sn - 1 - j
                else:
                    blk = j + sb * 0
                _store_pairs(sb + j * 0, blk, keys_ptr, tiles_ptr, start + j, j < sn, n_stride,
                             NB, KV_TILES)
            # the padding pairs (recounted: fewer live registers across the loops)
            n, _ = _seq_tiles(b, inb, cu_q, cu_k, n_pairs, NB, L_q, BLOCK_M, BLOCK_N, CAUSAL,
                              BROADCAST_Q, KV_TILES)
            pad = tl.where(inb, NB - n, 0)
            pad_start = _per_run(total + tl.cumsum(pad, 0) - pad - n, RUN)
            b2, n, live = _per_run(b, RUN), _per_run(n, RUN), _per_run(inb, RUN)
            for j0 in range(0, NB, RUN):
                j = _run_blocks(j0, RUN)
                _store_pairs(b2 + j * 0, j + b2 * 0, keys_ptr, tiles_ptr, pad_start + j,
                             live & (j >= n) & (j < NB), n_stride, NB, KV_TILES)
        else:
            total = 0
            for start in range(0, n_pairs, BLOCK):
                pair = start + tl.arange(0, BLOCK)
                inb = pair < n_pairs
                work = _pair_work(pair, inb, cu_q, cu_k, n_pairs, NB, L_q, BLOCK_M, BLOCK_N,
                                  CAUSAL, BROADCAST_Q, KV_TILES)
                key = ((-tl.minimum(work, 2**31 - 1)).to(tl.int64) << 32) | pair.to(tl.int64)
                tl.store(keys_ptr + pair, key, mask=inb)
                total += tl.sum((work > 0).to(tl.int32), 0)
        tl.store(count_ptr, total)
        if not KV_TILES:  # the forward's tile counter and finished programs (fwd_sched)
            tl.store(count_ptr + 1, 0)
            tl.store(count_ptr + 2, 0)
    if WAIT_LAST:
        gdc_wait()


@triton.jit
def _per_run(x, RUN: tl.constexpr):
    """A sequence's value beside its RUN blocks of a step (1: the lanes stay sequences,
    whose 1-D layout the 4096-sequence sorts need to stay spill-free)."""
    if RUN > 1:
        return x[:, None]
    else:
        return x


@triton.jit
def _run_blocks(j0, RUN: tl.constexpr):
    """The blocks [j0, j0 + RUN) of every sequence's run (`_per_run`'s shape)."""
    if RUN > 1:
        return j0 + tl.arange(0, RUN)[None, :]
    else:
        return j0


@triton.jit
def _kv_decode_kernel(keys_ptr, out_ptr, n_pairs, n_stride, NB, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n_pairs
    pair = (tl.load(keys_ptr + i, mask=m, other=0) & 0xFFFFFFFF).to(tl.int32)
    _store_tiles(pair // NB, pair % NB, out_ptr, i, m, n_stride)


# Tile lists (and the offsets checks, jagged.validate) are reused while their offsets are
# unchanged: the same tensor objects at the same version counter, as across a model's
# layers. The key kernel's launch was a large part of a short call's host time (forward
# at gem 256 / 0.1: 0.185 against 0.270 ms a call without reuse, PERF.md). Off under
# CUDA-graph capture (a replay must rebuild). Offsets changed behind torch's back (a raw
# pointer write, e.g. by another library's kernel or a DLPack alias, that does not bump
# the version counter) are not seen: write new offsets through torch ops (cu.copy_(new),
# cu[1:] = ...), which bump it, or pass a new tensor.
TILE_CACHE_SIZE = 32
_TILE_CACHE: OrderedDict = OrderedDict()


def per_offsets(build, cu_q, cu_k, *params):
    """build(cu_q, cu_k, *params), reused while these offsets tensors are unchanged (the
    tile lists, and the device-side offsets check of jagged.validate)."""
    try:
        key = (build, id(cu_q), id(cu_k), cu_k._version,
               None if cu_q is None else cu_q._version, params)
    except RuntimeError:  # inference-mode tensors have no version counter
        return build(cu_q, cu_k, *params)
    if cu_k.is_cuda and torch.cuda.is_current_stream_capturing():
        return build(cu_q, cu_k, *params)
    hit = _TILE_CACHE.get(key)
    if hit is not None:
        _TILE_CACHE.move_to_end(key)
        return hit[2]
    out = build(cu_q, cu_k, *params)
    _TILE_CACHE[key] = (cu_q, cu_k, out)  # holding the tensors keeps their ids unique
    if len(_TILE_CACHE) > TILE_CACHE_SIZE:
        _TILE_CACHE.popitem(last=False)
    return out


def cached_builds(build=None, cu_k: torch.Tensor | None = None) -> list:
    """The `per_offsets` cache's entries, oldest first, as (params, output): those of
    `build` (every build if None) over offsets at cu_k's address (any if None). For tests
    and diagnostics; the cache's key layout stays private."""
    return [(key[-1], out) for key, (_, k, out) in _TILE_CACHE.items()
            if (build is None or key[0] is build)
            and (cu_k is None or k.data_ptr() == cu_k.data_ptr())]


def fwd_tiles(cu_q, cu_k, batch: int, max_seqlen_q: int, L_q: int | None,
              block_m: int, block_n: int, causal: bool, check: tuple | None = None,
              direct: bool = False, dynamic: bool = False):
    """Forward tile list, the `build_tiles` of both styles' schedule (cached, above).

    -> (pairs int64 [batch * nblk], longest first, the pair b * nblk + m in the low 32
    bits; count int32 [1] of valid pairs, the scheduling buffer of `fwd_sched` after it;
    nblk). One key kernel makes and sorts the keys
    (torch.sort sorts them past SORT_MAX pairs): no host sync, two host operations. Same
    order and count as `longest_first_tiles`.

    `L_q`: the broadcast query length in broadcast-Q mode (cu_q is None), else None.
    `check`: (n_q, n_k, max_q, max_k), the call's token counts and maxima: the key kernel
    first runs jagged.validate's device-side offsets check on them (`checked_launch`).
    `direct` (`fwd_direct`): no list, (None, batch * nblk, nblk), every pair in order; the
    check runs alone (`check_offsets_async`).

    Causal order: each sequence's tiles together, sequences by their KV length, a
    sequence's query blocks last (longest) to first, so the programs that run at once
    share one (sequence, head)'s K/V in L2, as the backward's causal order does
    (kv_tiles). Against longest tile first over the batch, sustained on the H200 with the
    boustrophedon round-robin of both styles' tile_coords, llm causal: B8 H16 8192 TLX
    527.9 -> 569.2 TFLOP/s, CuteDSL 520.2 -> 563.7; B16 H16 D64 2048 TLX 292.8 -> 338.0,
    CuteDSL 334.8 -> 358.6; GQA B4 H32/8 4096 +1.8 % / null. The SM clock under the 700 W
    cap rose 1410 -> 1538 MHz at B8: longest tile first ran ~16 (sequence, head) K/V
    streams at once (120+ at D64), this order 2-3. Without the boustrophedon, a sequence's
    sawtooth of causal tiles unbalanced the static round-robin (cycles +6 %)."""
    if direct:
        nblk = pairs_per_sequence(max_seqlen_q, block_m)
        if check is not None:  # broadcast-Q (L_q given): the key offsets only
            check_offsets_async(None if L_q is not None else cu_q, cu_k, *check)
        return None, batch * nblk, nblk
    # a list whose tiles come from its counter (`dynamic`: fwd_dynamic, a Hopper forward)
    # is keyed by the stream too: the counter serves one forward at a time
    stream = 0
    if dynamic and cu_k.is_cuda:
        stream = torch.cuda.current_stream(cu_k.device).cuda_stream
    return per_offsets(_build_fwd_tiles, cu_q, cu_k, batch, max_seqlen_q, L_q, block_m,
                       block_n, bool(causal), check, stream)


# Programmatic dependent launch: a list kernel lets the attention kernel queued behind it
# (the forward's, the backward's main) launch at once, so that kernel's launch and prologue
# (up to its gdc_wait) run under the list; the interpreter has no griddepcontrol
PDL = os.environ.get("TRITON_INTERPRET", "0") != "1"


def check_offsets_async(cu_seqlens_q, cu_seqlens_k, n_q, n_k, max_seqlen_q, max_seqlen_k):
    """Queue the device-side offsets check alone (jagged.validate; no host sync), where no
    list kernel runs it; skipped for offsets already checked with the same token counts
    and maxima (and never skipped under CUDA-graph capture, so a replay checks the values
    it finds). The kernel queued behind may launch at once (PDL)."""
    per_offsets(launch_check, cu_seqlens_q, cu_seqlens_k, n_q, n_k, max_seqlen_q, max_seqlen_k,
                PDL)


def checked_launch(check: tuple | None) -> tuple[tuple, dict]:
    """A tile kernel's (n_q, n_k, max_q, max_k) arguments and launch options: with a
    `check` (those four), the offsets check with its asserts compiled in (debug), without
    the overflow checks debug adds to every integer add of the tile arithmetic. The sizes
    go by position: a launch plan (jagged.launch) takes runtime arguments no other way."""
    if check is None:
        return (0, 0, 0, 0), {}
    return tuple(check), dict(CHECK=True, debug=True, sanitize_overflow=False)


def _build_fwd_tiles(cu_q, cu_k, batch, max_seqlen_q, L_q, block_m, block_n, causal, check,
                     _stream=0):
    nblk = pairs_per_sequence(max_seqlen_q, block_m)
    n_pairs = batch * nblk
    # keys, then the count and the scheduling buffer (fwd_sched) at a 16-byte aligned
    # offset (Triton specializes kernels on pointer alignment: a shifting one would
    # recompile them)
    n2 = n_pairs + n_pairs % 2
    n_count = 1 + FWD_SCHED_INTS
    buf = torch.empty(n2 + cdiv(n_count, 4) * 2, dtype=torch.int64, device=cu_k.device)
    keys, count = buf[:n_pairs], buf[n2:].view(torch.int32)[:1]
    opts = sort_launch(batch, nblk)
    sizes, checked = checked_launch(check)
    fast(_tile_keys_kernel)[(1,)](
        cu_k if cu_q is None else cu_q, cu_k, keys, None, count, n_pairs, 0, nblk,
        L_q or 0, *sizes, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal),
        BROADCAST_Q=L_q is not None, KV_TILES=False, PDL=PDL, **opts, **checked)
    return (keys if opts["SORT"] else torch.sort(keys).values), count, nblk


# The forward's scheduling buffer, after the pair count in the list's own memory: [0] the
# tile counter, [1] the programs finished, [4 + 2p, 4 + 2p + 2) program p's handoff slots
# (kernels_tlx/tile_counter.py's layout). The list kernel zeroes [0] and [1] when it builds
# the list, and the last program of a forward that took its tiles from the counter zeroes
# them again, so a reused list needs no launch ahead of the kernel. One forward at a time
# per list: the list cache is keyed by the stream (fwd_tiles).
FWD_MAX_PROGRAMS = 1024
FWD_SCHED_INTS = 4 + 2 * FWD_MAX_PROGRAMS


def fwd_sched(count: torch.Tensor) -> torch.Tensor:
    """The scheduling buffer after a forward tile list's `count` (fwd_tiles), int32
    [FWD_SCHED_INTS], in the list's memory; the kernels reach it as count + 1."""
    return count.as_strided((FWD_SCHED_INTS,), (1,), count.storage_offset() + 1)


def fwd_dynamic(causal: bool, broadcast_q: bool, windows: bool, direct: bool) -> bool:
    """Whether a forward's programs take their tiles from a counter (both Hopper styles):
    the producer of each program takes its next tile with an atomic add once it has
    issued the loads of the last one, and hands it to the consumers (tile_counter.py).
    Causal packed lists: a sequence's tiles form a sawtooth of lengths (its query blocks
    last to first, every head), which the static round-robin deals unevenly wherever the
    sawtooth's period and the program count disagree (a host model of the list order
    with real lengths, max program load over the mean, static / counter: fuzz B3 H16/8
    16384 / 0.75 1.130 / 1.019, varlen-llm B10 H32/8 8192 1.087 / 1.003). Replayed on an
    H100, round-robin -> counter, TLX / CuteDSL: fuzz B3 -15.6 % / -14.7 %, varlen-llm
    B10 H32/8 D128 -3.0 % / -4.9 %, B5 H32/8 D128 -1.9 % / -3.6 %, llm B8 H16 8192 TLX
    +0.2 %. Not without causal masking (a sequence's tiles are equal and the list runs
    longest first), over row windows, in broadcast-Q or in a one-wave (direct) launch."""
    return causal and not broadcast_q and not windows and not direct


def fwd_direct(n_tiles: int, programs: int, listed: bool = False) -> bool:
    """Whether a forward walks its (sequence, query block, head) tiles without a list
    (both Hopper styles): when each of its n_tiles tiles has a program of its own, one
    wave, the list's order changes nothing, so the kernel takes the pairs in order (a
    pair past its sequence's queries does nothing) and no list kernel runs ahead of it:
    the offsets check does (`check_offsets_async`, queued by `fwd_tiles(direct=True)`),
    and the kernel waits for it only before its first store. `listed`: a call that needs
    a list or a pass after the check anyway (row windows, fp8's V pass) keeps the list."""
    return not listed and n_tiles <= programs


def pairs_per_sequence(max_q: int, block_m: int) -> int:
    """The query blocks a sequence has room for in a forward tile list (its NBLK)."""
    return max(1, -(-max_q // block_m))


# ----------------------------------------------------------------------------- row windows
# Short sequences leave most of a per-sequence query block empty (gem 256 / 0.1: 26 rows
# of 128 on average). A window is instead whole sequences of at most BLOCK_M packed rows
# together (or one BLOCK_M-row block of a longer sequence): each row sees its own
# sequence's keys (seqinfo.row_kv_range), and the window reads its sequences' keys. Whole
# sequences, not BLOCK_M consecutive rows: a window reads no key of a sequence whose rows
# another window holds, and a backward key window holds all the keys its rows meet.

# the forward runs over windows when the mean query length is at most this fraction of a
# block: several sequences a program, where a program per (sequence, block) would leave
# most of its rows empty
WINDOW_MEAN_FRACTION = 0.5


# the Hopper backwards run over key windows up to a mean of a whole 128-key tile: a window
# of sequences of at most a tile of keys owns them and stores their dQ whole, where a tile
# list's tiles reduce-add every row into the fp32 accumulator, which the preprocess zeroes
# and the postprocess converts
BWD_WINDOW_MEAN_FRACTION = 1.0


def windowed(n_rows: int, batch: int, max_q: int, block_m: int, broadcast_q: bool,
             fraction: float = WINDOW_MEAN_FRACTION) -> bool:
    """Whether a pass takes windows: packed rows (not broadcast-Q) whose mean length (rows
    / batch: no sync) is at most `fraction` of a block (the forwards' row windows at
    WINDOW_MEAN_FRACTION, the backwards' key windows at BWD_WINDOW_MEAN_FRACTION)."""
    return (not broadcast_q and batch > 1 and max_q > 1
            and n_rows <= fraction * block_m * batch)


@triton.jit
def _windows_kernel(cu, win_ptr, order_ptr, count_ptr, B, n_win, SPAN, ROUNDS, cu_k,
                    n_q, n_k, max_q, max_k,
                    BLOCK_M: tl.constexpr, SEQS: tl.constexpr, ORDER: tl.constexpr,
                    BLOCK_N: tl.constexpr = 64, LANES: tl.constexpr = 512,
                    CHECK: tl.constexpr = False, PDL: tl.constexpr = False):
    """One program: windows of whole sequences (`windows`), packed greedily in sequence
    order within runs of SEQS - 1 sequences (`_groups`, one run a pass, in registers; a
    run's end also ends a group). A group of g rows holds max(cdiv(g, BLOCK_M), 1)
    windows: one, or the BLOCK_M-row blocks of one longer sequence (SPAN >= cdiv(max
    length, BLOCK_M)); a group of empty sequences one too, so every sequence is in a
    window. ROUNDS >= bit_length(min(B, SEQS - 1)). ORDER: then the window tile list
    (`window_tiles`) from them. CHECK: the offsets check first (cu: cu_seqlens_q; as
    _tile_keys_kernel's); PDL as _tile_keys_kernel's."""
    if PDL:
        gdc_launch_dependents()
    ok = True
    if CHECK:
        ok = check_offsets(cu, cu_k, B, n_q, n_k, max_q, max_k, True, 1024)
    if ok:
        n_live = 0
        for c0 in range(0, B, SEQS - 1):
            n_live = _groups(cu, win_ptr, c0, B, n_win, SPAN, ROUNDS, n_live, BLOCK_M, SEQS)
        n_live = tl.minimum(n_live, n_win)
        for w0 in range(n_live, n_win, SEQS):  # dead windows
            w = w0 + tl.arange(0, SEQS)
            tl.store(win_ptr + w, -1, mask=w < n_win)
            tl.store(win_ptr + n_win + w, -1, mask=w < n_win)
            tl.store(win_ptr + 2 * n_win + w, -1, mask=w < n_win)
        if ORDER:
            tl.debug_barrier()  # the windows this program wrote, visible to all its threads
            _window_order(cu_k, win_ptr, order_ptr, n_win, n_live, BLOCK_N, LANES)
            tl.store(count_ptr, n_live)


@triton.jit
def _groups(cu, win_ptr, c0, B, n_win, SPAN, ROUNDS, n_live, BLOCK_M: tl.constexpr,
            SEQS: tl.constexpr):
    """The groups of sequences c0 .. c0 + n - 1 (n = min(B - c0, SEQS - 1)), lane i
    sequence c0 + i, lane n the run's end: lane i finds next(i), the first sequence that
    would take a group from i past BLOCK_M rows (a binary search; i + 1 at least); the
    groups are the chain 0, next(0), next(next(0)), ..., which pointer doubling puts in
    the lanes (lane i < n: next^i(0), n past the last group). The search reads the
    offsets again from global memory (L1 hits after the loads above, no barrier: a
    tl.gather of a lane table takes shared-memory round trips behind barriers, 14 a round
    at 2048 lanes in sm_90a SASS); the doubling's tables, new each round, go through
    tl.gather. Stored as windows from window n_live on -> the windows stored so far."""
    i = tl.arange(0, SEQS)
    n = tl.minimum(B - c0, SEQS - 1)
    real = i < n
    target = tl.load(cu + c0 + i, mask=i <= n, other=0) + BLOCK_M   # cu[c0 + i] + BLOCK_M
    lo = i
    hi = tl.zeros_like(i) + n
    for _ in range(0, ROUNDS):  # sequences before i end by cu[i]: the answer is >= i
        mid = (lo + hi) // 2
        open_ = lo < hi
        # the end of sequence c0 + mid (mid < n), cu[c0 + mid + 1]
        fits = tl.load(cu + c0 + mid + 1, mask=open_ & (mid < n), other=2147483647) <= target
        lo = tl.where(open_ & fits, mid + 1, lo)
        hi = tl.where(open_ & ~fits, mid, hi)
    nxt = tl.where(real, tl.maximum(lo, i + 1), n)
    jump = nxt                                  # next^(2^r)
    first = tl.zeros_like(i)                    # next^(i mod 2^r)(0), lane i
    for r in range(0, ROUNDS):
        first = tl.where(((i >> r) & 1) == 1, tl.gather(jump, first, 0), first)
        jump = tl.gather(jump, jump, 0)
    t = tl.gather(nxt, first, 0)
    # lanes from n on hold no group (at most n of them), nor next^i(0) (i >= 2^ROUNDS)
    head = real & (first < n)
    start = tl.load(cu + c0 + first, mask=head, other=0)           # first, t <= n
    n_w = tl.where(head, tl.maximum(tl.cdiv(tl.load(cu + c0 + t, mask=head, other=0) - start,
                                            BLOCK_M), 1), 0)
    base = n_live + tl.cumsum(n_w, 0) - n_w
    for j in range(0, SPAN):
        w = base + j
        keep = (j < n_w) & (w < n_win)
        tl.store(win_ptr + w, c0 + first, mask=keep)
        tl.store(win_ptr + n_win + w, c0 + t - 1, mask=keep)
        tl.store(win_ptr + 2 * n_win + w, start + j * BLOCK_M, mask=keep)
    return n_live + tl.sum(n_w, 0)


# the window order's work buckets: the exact work below WORK_EXACT, then one an octave
# (the last from WORK_EXACT << (WORK_BUCKETS - WORK_EXACT - 1) on)
WORK_BUCKETS = tl.constexpr(16)
WORK_EXACT = tl.constexpr(8)
ORDER_LANES = 512


@triton.jit
def _work_hits(cu_k, win_ptr, n_win, n_live, w0, BLOCK_N: tl.constexpr,
               LANES: tl.constexpr):
    """Windows w0 .. w0 + LANES - 1 (live ones, w < n_live) as one-hot rows of their
    work bucket, int32 [LANES, WORK_BUCKETS]: work = the KV blocks their sequences' keys
    take, plus one."""
    w = w0 + tl.arange(0, LANES)
    live = w < n_live
    s0 = tl.load(win_ptr + w, mask=live, other=0)
    s1 = tl.load(win_ptr + n_win + w, mask=live, other=0)
    keys = tl.load(cu_k + s1 + 1, mask=live, other=0) - tl.load(cu_k + s0, mask=live, other=0)
    work = tl.cdiv(keys, BLOCK_N) + 1
    bucket = tl.minimum(work, WORK_EXACT)
    for k in tl.static_range(1, WORK_BUCKETS - WORK_EXACT):
        bucket += (work >= (WORK_EXACT << k)).to(tl.int32)
    bucket = tl.where(live, bucket, -1)
    return (bucket[:, None] == tl.arange(0, WORK_BUCKETS)[None, :]).to(tl.int32)


@triton.jit
def _place(order_ptr, hits, start, w0, LANES: tl.constexpr):
    """Windows w0.. (their `hits`) to their places, each after the windows of its bucket
    before it (start: each bucket's next free place); returns the next free places."""
    at = tl.sum(hits * (tl.cumsum(hits, 0) - 1 + start[None, :]), 1)
    w = w0 + tl.arange(0, LANES)
    tl.store(order_ptr + at, w, mask=tl.sum(hits, 1) > 0)
    return start + tl.sum(hits, 0)


@triton.jit
def _window_order(cu_k, win_ptr, order_ptr, n_win, n_live, BLOCK_N: tl.constexpr,
                  LANES: tl.constexpr):
    """The live windows (0 .. n_live - 1) longest first by the KV blocks their sequences'
    keys take (`_work_hits`' buckets: exact up to WORK_EXACT - 1 blocks, then by octave),
    ties by window; the dead ones last. A counting sort, LANES windows a pass: a pass
    counts each bucket's windows, a second places them; up to LANES live windows (every
    windowed gem-jagged call) in one pass of loads. Its cost follows the live windows,
    not the list's room (a sort over the room, 3 cdiv(rows, block) + 2, took longer)."""
    hits = _work_hits(cu_k, win_ptr, n_win, n_live, 0, BLOCK_N, LANES)
    count = tl.sum(hits, 0)
    for w0 in range(LANES, n_live, LANES):
        count += tl.sum(_work_hits(cu_k, win_ptr, n_win, n_live, w0, BLOCK_N, LANES), 0)
    start = tl.sum(count, 0) - tl.cumsum(count, 0)     # the windows of higher buckets
    start = _place(order_ptr, hits, start, 0, LANES)
    for w0 in range(LANES, n_live, LANES):
        start = _place(order_ptr,
                       _work_hits(cu_k, win_ptr, n_win, n_live, w0, BLOCK_N, LANES),
                       start, w0, LANES)
    w = tl.arange(0, LANES)
    for w0 in range(n_live, n_win, LANES):
        tl.store(order_ptr + w0 + w, w0 + w, mask=w0 + w < n_win)


def _span(max_len: int, block: int) -> int:
    return max(1, -(-max_len // block))


def window_count(n_rows: int, block: int, batch: int = 0) -> int:
    """Room for the windows of `n_rows` packed rows in `batch` sequences: full blocks (<=
    n_rows / block) and one last window a group (< 2 n_rows / block + 2: two groups in a
    row hold more than a block, or the second would have joined the first; each run of
    _windows_kernel's ends a group too)."""
    return 3 * max(1, -(-n_rows // block)) + 2 + _group_pass(batch)[1]


def _rounds(batch: int, seqs: int) -> int:
    return max(1, min(batch, seqs - 1).bit_length())


def windows(cu_q, n_rows: int, max_len: int, block_m: int):
    """int32 [3, window_count(n_rows, block_m, batch)]: each window's first and last
    sequence and its first row (-1 past the live ones). A window is whole sequences of at
    most block_m rows together, packed greedily in order (within runs of a few thousand
    sequences, `_group_pass`), or one block of a longer sequence, so no sequence shorter
    than a block shares its rows with another window; every sequence, empty ones too, is
    in a window. `n_rows` bounds the packed rows (q.shape[0]: no sync), `max_len` the
    sequences' lengths. Cached like the tile lists."""
    return per_offsets(_build_windows, cu_q, cu_q, n_rows, max_len, block_m)


# the most sequences _windows_kernel packs in one pass (a run: SEQS - 1 of them)
GROUP_SEQS = 4096


def _group_pass(batch: int) -> tuple[int, int]:
    """(SEQS, runs after the first) of _windows_kernel for a batch."""
    seqs = min(GROUP_SEQS, max(128, next_pow2(batch + 1)))
    return seqs, max(0, -(-batch // (seqs - 1)) - 1)


def _group_warps(seqs: int) -> int:
    return min(8, max(4, seqs // 256))


def _window_sizes(cu_q, n_rows, max_len, block_m):
    """(B, n_win, SPAN, ROUNDS, SEQS): _windows_kernel's sizes for a call."""
    B = cu_q.shape[0] - 1
    seqs = _group_pass(B)[0]
    return (B, window_count(n_rows, block_m, B), _span(max_len, block_m), _rounds(B, seqs),
            seqs)


def _build_windows(cu_q, _cu, n_rows, max_len, block_m):
    B, n_win, span, rounds, seqs = _window_sizes(cu_q, n_rows, max_len, block_m)
    out = torch.empty(3, n_win, dtype=torch.int32, device=cu_q.device)
    fast(_windows_kernel)[(1,)](cu_q, out, None, None, B, n_win, span, rounds, None, 0, 0,
                                0, 0, BLOCK_M=block_m, SEQS=seqs, ORDER=False,
                                num_warps=_group_warps(seqs))
    return out


def window_tiles(cu_q, cu_k, n_rows: int, max_q: int, block_m: int, block_n: int,
                 check: tuple | None = None):
    """The tile list over windows of whole sequences (`windows`; the Hopper kernels of
    both styles, forward over cu_q, backward with the offsets swapped): (order int32
    [n_win], the windows longest first (by the keys of the sequences they span), dead
    ones last; count int32 [1] of live windows; win int32 [3, n_win], `windows`). One
    kernel, no host sync; cached like the others (`_window_order`). `check`: as fwd_tiles' (the forward's windows only: cu_q the query
    offsets)."""
    return per_offsets(_build_window_tiles, cu_q, cu_k, n_rows, max_q, block_m, block_n,
                       check)


def _build_window_tiles(cu_q, cu_k, n_rows, max_q, block_m, block_n, check):
    B, n_win, span, rounds, seqs = _window_sizes(cu_q, n_rows, max_q, block_m)
    # win, order, then the count, each at a 16-byte aligned offset (as _build_fwd_tiles)
    o1 = cdiv(3 * n_win, 4) * 4
    o2 = o1 + cdiv(n_win, 4) * 4
    buf = torch.empty(o2 + 4, dtype=torch.int32, device=cu_q.device)
    sizes, checked = checked_launch(check)
    fast(_windows_kernel)[(1,)](cu_q, buf, buf[o1:], buf[o2:], B, n_win, span, rounds, cu_k,
                                *sizes, BLOCK_M=block_m, SEQS=seqs, ORDER=True, BLOCK_N=block_n,
                                LANES=ORDER_LANES, num_warps=_group_warps(max(2 * ORDER_LANES, seqs)),
                                PDL=PDL, **checked)
    return buf[o1:o1 + n_win], buf[o2:o2 + 1], buf[:3 * n_win].view(3, n_win)


def windows_reference(cu_q, n_rows: int, block_m: int):
    """`windows` in Python: the greedy packing, one sequence at a time, a new group at
    each run of the kernel's."""
    cu = [int(x) for x in cu_q.to(torch.int64).cpu()]
    B = len(cu) - 1
    n_win = window_count(n_rows, block_m, B)
    run = _group_pass(B)[0] - 1
    out = torch.full((3, n_win), -1, dtype=torch.int32)
    w, s = 0, 0
    while s < B:
        t = s + 1
        while t < min(B, (s // run + 1) * run) and cu[t + 1] - cu[s] <= block_m:
            t += 1
        for j in range(max(1, -(-(cu[t] - cu[s]) // block_m))):
            out[:, w] = torch.tensor([s, t - 1, cu[s] + j * block_m])
            w += 1
        s = t
    return out


def window_tiles_reference(cu_q, cu_k, n_rows: int, block_m: int, block_n: int):
    """`window_tiles` in torch ops (its test's reference)."""
    win = windows_reference(cu_q, n_rows, block_m).to(torch.int64)
    cu_k = cu_k.to(torch.int64).cpu()
    live = win[0] >= 0
    keys = torch.where(live, cu_k[win[1].clamp(min=0) + 1] - cu_k[win[0].clamp(min=0)], 0)
    work = (keys + block_n - 1) // block_n + 1
    exact, buckets = WORK_EXACT.value, WORK_BUCKETS.value
    octave = torch.log2(work.clamp(min=1).double()).floor().long() - int(math.log2(exact))
    bucket = torch.where(work < exact, work, exact + octave)
    bucket = torch.where(live, bucket.clamp(max=buckets - 1), -1)
    order = torch.sort(bucket, descending=True, stable=True).indices
    return order.to(torch.int32), live.sum().to(torch.int32).reshape(1), win.to(torch.int32)


def kv_tiles(cu_q, cu_k, L_q, max_k, causal, BLOCK_M, BLOCK_N):
    """Backward KV-tile list, longest work first: one kernel up to SORT_MAX pairs, else a
    key kernel, torch.sort and a decode kernel (few host operations: at short sequences
    the backward's time is the host's, see PERF.md). Same result as
    `kv_tiles_reference`.

    Returns (tile_b, tile_n, n_tiles): int32 [>= B * NB] batch index and KV-block index of
    every tile sorted by work (Q blocks that see it) descending, and an int32 [1]
    tensor with the number of real tiles (KV blocks inside their sequence; they come
    first, including those no query sees, which still store dK = dV = 0). Cached like
    `fwd_tiles`.

    Causal order: each sequence's tiles together, sorted by the sequence's largest tile
    work (ties by pair: b, then n ascending), so the programs that run at once share its
    Q / dO / dQ rows in L2; longest first by tile scattered them over the batch. Measured
    at llm-dense B8 H16 8192 causal on the H200: TLX 15.85 -> 14.64 ms, CuteDSL 15.73 ->
    14.36 ms. Without causal masking every tile of a sequence has the same work, so the
    two orders are the same.

    Every caller builds it right after the backward's preprocess: its key kernel launches
    as that kernel's programmatic dependent and runs beside it (it reads only the
    offsets, which the plainly launched preprocess already waited for), and waits for it
    last (WAIT_LAST)."""
    return per_offsets(_build_kv_tiles, cu_q, cu_k, L_q, max_k, bool(causal), BLOCK_M, BLOCK_N)


def _build_kv_tiles(cu_q, cu_k, L_q, max_k, causal, BLOCK_M, BLOCK_N):
    B = cu_k.shape[0] - 1
    NB = max(1, -(-max_k // BLOCK_N))
    n = B * NB
    # one buffer: tile_b, tile_n, count, each starting 16-byte aligned (as above)
    n4 = -(-n // 4) * 4
    tiles = torch.empty(2 * n4 + 4, dtype=torch.int32, device=cu_k.device)
    count = tiles[2 * n4:2 * n4 + 1]
    opts = sort_launch(B, NB)
    keys = None if opts["SORT"] else torch.empty(n, dtype=torch.int64, device=cu_k.device)
    fast(_tile_keys_kernel)[(1,)](
        cu_k if cu_q is None else cu_q, cu_k, keys, tiles, count, n, n4, NB, L_q, 0, 0, 0, 0,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=bool(causal), BROADCAST_Q=cu_q is None,
        KV_TILES=True, PDL=PDL, WAIT_LAST=PDL, launch_pdl=PDL, **opts)
    if keys is not None:
        fast(_kv_decode_kernel)[(cdiv(n, 1024),)](torch.sort(keys).values, tiles, n, n4, NB,
                                                  BLOCK=1024)
    return tiles[:n], tiles[n4:n4 + n], count


def kv_tiles_reference(cu_q, cu_k, L_q, max_k, causal, BLOCK_M, BLOCK_N):
    """`kv_tiles` in plain torch ops (the reference it is tested against)."""
    dev = cu_k.device
    lk = (cu_k[1:] - cu_k[:-1]).to(torch.int64)
    lq = (cu_q[1:] - cu_q[:-1]).to(torch.int64) if cu_q is not None else torch.full_like(lk, L_q)
    B = lk.shape[0]
    NB = max(1, -(-max_k // BLOCK_N))
    n0 = torch.arange(NB, device=dev, dtype=torch.int64) * BLOCK_N
    real = n0[None, :] < lk[:, None]
    if causal:  # every tile of a sequence: the work of its first KV block
        m_lo = causal_q_start_ref(0, lq, lk) // BLOCK_M * BLOCK_M
        work = ((lq - m_lo + BLOCK_M - 1) // BLOCK_M)[:, None].expand(B, NB)
    else:
        work = ((lq + BLOCK_M - 1) // BLOCK_M)[:, None].expand(B, NB)
    # +1 so real tiles with no work still sort ahead of the padding tiles
    key = torch.where(real, work + 1, torch.zeros_like(work)).reshape(-1)
    order = torch.sort(key, descending=True, stable=True).indices
    tile_b = (order // NB).to(torch.int32)
    tile_n = (order % NB).to(torch.int32)
    n_tiles = real.sum().to(torch.int32).reshape(1)
    return tile_b, tile_n, n_tiles


def bwd_programs(broadcast_q: bool, H_kv: int, n_sms: int) -> int:
    """Programs of a backward's main kernel: one per SM; broadcast-Q's pinned to KV heads,
    as many a head (`dq_accumulator`)."""
    return max(1, n_sms // H_kv) * H_kv if broadcast_q else n_sms


def dq_accumulator(Nq, L_q, H, H_kv, D, broadcast_q, n_sms, device, n_k, rows=None):
    """(fp32 dQ accumulator, programs of the main kernel, int32 scheduling buffer).

    Packed modes: one [rows, H, D] buffer (rows: Nq or `flat_rows` of a block-padded
    one; or one block under `windows_direct`, which nothing reads or writes: it only
    backs the main kernel's dQ descriptor), one program per SM. Broadcast-Q: n_slots
    [L_q, H, D] slots (dq_slots, over the call's n_k keys), programs pinned to KV heads
    (program p: head p % H_kv, slot (p // H_kv) % n_slots); the postprocess sums the
    slots. The preprocess zeroes it (no launch of its own).

    The scheduling buffer (`bwd_dynamic`) shares the accumulator's allocation, so it is
    fresh per call: [0] the tile counter (the preprocess zeroes it), [4 + 2p,
    4 + 2p + 2) program p's two-slot tile handoff."""
    grid = bwd_programs(broadcast_q, H_kv, n_sms)
    if not broadcast_q:
        shape = (Nq if rows is None else rows, H, D)
    else:
        shape = (dq_slots(grid // H_kv, L_q * H * D * 4, n_k), L_q, H, D)
    n = math.prod(shape)
    buf = torch.empty(n + 4 + 2 * grid, device=device, dtype=torch.float32)
    return buf[:n].view(shape), grid, buf[n:].view(torch.int32)


# takes_flat. A block-padded dQ accumulator pads each sequence to whole steps (on average
# half a step: 6-8 % more accumulator rows at a mean of 512 rows) for 16-byte stores of
# the step's dQ partial in its accumulator's register order (CuteDSL's 80-row step: 40
# STS.32 a thread -> 10 STS.128).
FLAT_MEAN_Q = 512


def takes_flat(mean_q: float, broadcast_q: bool, blocks: float = math.inf,
               n_sms: int = 0) -> bool:
    """Whether a backward's dQ partials go to a block-padded accumulator (CuteDSL's
    Config.dq_flat; the TLX build keeps the row accumulator): packed sequences of at least
    FLAT_MEAN_Q query rows on average (key windows never: their builds keep the row
    accumulator), in at least a wave of query blocks (`blocks`, over n_sms SMs). Its
    postprocess takes a CTA a block, the block's heads one after another: a call of fewer
    blocks leaves most SMs idle there (fuzz cross B2 H16/8 D128 1024 / 1024 s0.9, 25
    blocks of 80 rows: 0.160 ms replayed with it, 0.100 without, H100)."""
    return not broadcast_q and mean_q >= FLAT_MEAN_Q and blocks >= n_sms


def flat_block(q_start, b, m_lo, block_m: int):
    """A block-padded dQ accumulator's block (CuteDSL's Config.dq_flat) of the Q block of
    sequence b (first row q_start) that starts m_lo rows in (a multiple of block_m): the
    sequence's blocks start at (q_start + b block_m) // block_m, whole blocks past the one
    before, so no two sequences share one. Plain arithmetic: host ints or traced."""
    return (q_start + b * block_m) // block_m + m_lo // block_m


def flat_rows(n_q: int, batch: int, block_m: int) -> int:
    """Rows of a block-padded dQ accumulator (`flat_block`): every block of a call with
    n_q query rows over `batch` sequences is below n_q // block_m + batch."""
    return (n_q // block_m + batch) * block_m


def slot_count(dq_acc: torch.Tensor, broadcast_q: bool) -> int:
    """The slots of a `dq_accumulator` buffer (1 in the packed modes)."""
    return dq_acc.shape[0] if broadcast_q else 1


def dq_slots(programs: int, slot_bytes: int, n_k: int) -> int:
    """Broadcast-Q: dQ slots for `programs` programs a KV head over n_k keys in all."""
    return max(1, min(programs, MAX_SLOT_BYTES // max(slot_bytes, 1), -(-n_k // SLOT_KEYS)))


# Backward tiles split over their steps (`bwd_parts`): a tile's fixed cost in Q
# steps (its K / V load, the dK / dV epilogue); a split tile's, BWD_PART_ROWS / block_m
# steps with every program busy (its fp32 dK / dV adds, their zeroing and conversion:
# bytes in proportion to the tile's keys x D, a step's time to block_m x keys x D);
# measured on the H200 (TLX, split against whole): fuzz B21 H1 D128 2048 / 0.9 (64-row
# steps) ~4.8 steps, fuzz B2 H8/2 D64 16384 / 0.9 (128 rows) ~2.7
BWD_TILE_STEPS = 1.0
BWD_PART_ROWS = 300.0
# and a split call's own, in steps: zeroing and converting the accumulators (~3-4 us as
# launches of their own; fuzz cross B8 H1/1 D128 8192 / 128 causal, 8 tiles of one step,
# split in two: +8 / +10 %; folded into the pre- and postprocess: to measure)
BWD_SPLIT_CALL_STEPS = 3.0
BWD_PART_GAIN = 0.96  # a larger P only where its model span is this much shorter
BWD_MAX_PARTS = 8     # one build per P (1, 2, 4, 8)


@functools.lru_cache(maxsize=256)
def bwd_parts(n_q: int, n_k: int, batch: int, h_kv: int, group: int, causal: bool,
              broadcast_q: bool, block_m: int, block_n: int, programs: int,
              max_q: int = 0, max_k: int = 0) -> int:
    """How many programs share each backward tile (both styles): 1, 2, 4 or 8. A tile (KV
    block, KV head) walks the Q blocks that see it for every query head of its GQA group
    (group x n_m steps); split P ways, part p takes the p-th P-th of those steps
    (schedule.part_steps) and adds its dK / dV into fp32 accumulators. Few long tiles
    balance badly over the programs (fuzz B2 H8/2 D64 16384 / 0.9: 442 tiles of ~450 steps
    on 132 programs).

    From host sizes only (no sync), the span of each P (`parts_spans`); P doubles while
    that shortens the span by BWD_PART_GAIN. max_q / max_k only bound the lengths (a jagged
    call may pass its padded bound: fuzz cross B43 H8/8 D64 8192 / 2048 has 1604 rows at
    most, 738 on average), so the spans are modelled twice: with a sequence as long as the
    bound (tight) and with every sequence of the mean length (loose). Where the two pick
    different P, the tight one's is taken only if it gains more where the bound holds than
    it loses where it does not. Without a bound (0), the mean sizes alone and no longest
    tile. Broadcast-Q (pinned heads, dQ slots) stays whole. Cached: a model's layers ask
    it the same question."""
    if broadcast_q or batch == 0 or n_k == 0 or n_q == 0:
        return 1
    terms = _part_terms(n_k, batch, h_kv, block_m, block_n, programs)
    work = (n_q, n_k, batch, group, causal, block_m)
    if not max_q:
        return 1 << _fewest_index(_spans(terms, *_work(*work, 0, 0)))
    tight = _spans(terms, *_work(*work, min(max_q, n_q), min(max_k, n_k)))
    loose = _spans(terms, *_work(*work, n_q / batch, n_k / batch))
    i, j = _fewest_index(tight), _fewest_index(loose)
    return 1 << (i if i == j or tight[j] / tight[i] > loose[i] / loose[j] else j)


def _fewest_index(spans: list[float]) -> int:
    """log2 of P = 1, doubled while spans[log2 2P] < BWD_PART_GAIN spans[log2 P]."""
    i = 0
    while i + 1 < len(spans) and spans[i + 1] < BWD_PART_GAIN * spans[i]:
        i += 1
    return i


def parts_spans(n_q: int, n_k: int, batch: int, h_kv: int, group: int, causal: bool,
                block_m: int, block_n: int, programs: int, max_q: float,
                max_k: float) -> list[float]:
    """bwd_parts' model of a backward's span in steps, its tiles split P = 1, 2, ...,
    BWD_MAX_PARTS ways, the longest sequence max_q x max_k (0: no longest tile).
    T ~ h_kv (n_k / block_n + batch / 2) tiles of w steps (group x the mean rows that see a
    key / block_m; causal: bottom-right aligned; self-attention lengths: scaled by the
    least sum of squared lengths the longest sequence allows, over n^2 / batch); over
    r = T P / programs rounds, the span is (max(r, 1) + the last round's idle part,
    min(ceil(r) - r, 1 / 2): tiles of unequal work fill some of it) x (w / P + a tile's
    fixed steps; a split tile's scaled by min(r, 1), the share of the programs whose adds
    compete for memory), at least the longest tile's part (group x max_q rows, causal:
    min(max_q, max_k), the first key block's), plus BWD_SPLIT_CALL_STEPS for P > 1."""
    return _spans(_part_terms(n_k, batch, h_kv, block_m, block_n, programs),
                  *_work(n_q, n_k, batch, group, causal, block_m, max_q, max_k))


def _part_terms(n_k, batch, h_kv, block_m, block_n, programs) -> list[tuple]:
    """Per P (parts_spans): (P, max(r, 1) + idle, the tile's fixed steps, the call's)."""
    tiles = h_kv * (n_k / block_n + batch / 2)
    out, p = [], 1
    while p <= BWD_MAX_PARTS:
        rounds = tiles * p / programs
        fixed = BWD_PART_ROWS / block_m * min(rounds, 1.0) if p > 1 else BWD_TILE_STEPS
        idle = min(math.ceil(rounds) - rounds, 0.5) if rounds > 1 else 0.0
        out.append((p, max(rounds, 1.0) + idle, fixed,
                    BWD_SPLIT_CALL_STEPS if p > 1 else 0.0))
        p *= 2
    return out


def _work(n_q, n_k, batch, group, causal, block_m, max_q, max_k) -> tuple[float, float]:
    """(a tile's mean steps, the longest tile's steps) (parts_spans)."""
    mq, mk = n_q / batch, n_k / batch
    if causal:  # rows that see a key, over the keys: bottom-right aligned
        rows = mq - mq * mq / (2 * mk) if mq <= mk else mk / 2
    else:
        rows = mq
    steps = group * rows / block_m
    if max_q and max_q == max_k and n_q == n_k and batch > 1:
        # self-attention lengths: a call's steps go with the sum of its squared lengths,
        # at least max^2 + (n - max)^2 / (batch - 1) where one sequence is the longest
        m = min(max_q, n_q)
        steps *= max((m * m + (n_q - m) ** 2 / (batch - 1)) / (n_q * n_q / batch), 1.0)
    return steps, group * (min(max_q, max_k) if causal else max_q) / block_m


def _spans(terms, steps, longest) -> list[float]:
    return [max(mult * (steps / p + fixed), longest / p + fixed) + call
            for p, mult, fixed, call in terms]


def window_parts(n_q: int, n_k: int, h_kv: int, group: int, block_m: int, block_n: int,
                 programs: int, causal: bool = False, batch: int = 0) -> int:
    """`bwd_parts` for a backward over key windows (`windows` over the keys, both styles):
    its windows taken as cdiv(n_k, block_n) sequences of block_n keys, every query row of
    a window walked. A call of a few windows, each walking a GQA group's heads over its
    rows, splits their steps (fuzz B8 H8/1 D128 512 / 0.1 causal: 443 tokens, 8 parts);
    the short-sequence cells' hundreds of windows stay whole. Causal, a window walks from
    its first sequence's first row that sees a key (kv_window_coords): where a
    sequence has more than half a window's keys on average (batch sequences; windows of
    one sequence, mostly) the rows walked are taken as at most its keys and a block (fuzz
    cross B8 H1/1 D128 8192 / 128 causal: 1280 of 65536 rows, whole windows)."""
    windows = max(1, -(-n_k // block_n))
    if causal and batch and 2 * n_k > batch * block_n:
        n_q = min(n_q, n_k + batch * block_m)
    return bwd_parts(n_q, n_k, windows, h_kv, group, False, False, block_m, block_n,
                     programs)


def windows_direct(max_k: int, block_n: int, parts: int) -> bool:
    """Whether a backward over key windows stores every real query row's dQ directly:
    each sequence fits one key tile (max_k <= block_n; the forward's offsets check holds
    the lengths to max_k, as the window list's own span does) and the windows are not
    split over programs (parts == 1). Then no row goes through the fp32 dQ accumulator (one
    block, `dq_accumulator`): the preprocess zeroes dQ's rows past the last sequence
    itself and no postprocess launches (both styles)."""
    return max_k <= block_n and parts == 1


def grad_buffers(q: torch.Tensor, k: torch.Tensor):
    """(dq, dk, dv), uninitialized, in q's and k's shapes and dtypes (dk, dv contiguous):
    three allocations, as a custom op's outputs may not alias one another (torch.compile
    checks it)."""
    def kv():
        return torch.empty(k.shape, dtype=k.dtype, device=k.device)
    return torch.empty_like(q), kv(), kv()


def dkv_accumulator(k: torch.Tensor, parts: int) -> torch.Tensor | None:
    """Tiles split over `parts` programs (bwd_parts > 1): fp32 dK / dV accumulators,
    [2, Nk, H_kv, D] (dK then dV), uninitialized: the preprocess zeroes them, the parts
    add into them and the postprocess converts them, no launch of their own; None
    otherwise."""
    if parts == 1:
        return None
    return torch.empty((2, *k.shape), dtype=torch.float32, device=k.device)


def bwd_dependent(broadcast_q: bool) -> bool:
    """Whether the backward's main kernel and postprocess launch as programmatic dependents
    of the kernel ahead (both styles; the kernels wait for it themselves either way). In
    the packed modes: replayed, fuzz seed 0, -4..-10 % at 20-50 us calls (TLX and CuteDSL),
    -1 % at 0.25 ms. Not in broadcast-Q, where it lost: B356 H4/1 +17 % / +7 %, B76 H2/1
    causal +12 % / +2 % (TLX / CuteDSL), the cause not located."""
    return not broadcast_q


# bwd_head_run. The packed backward deals its tiles with the KV heads innermost: a wave
# of 132 programs then holds ~132 / H_kv list entries for every KV head, each tile walking
# its head group's Q / dO rows and reduce-adding its dQ rows (8 bytes an element: Q and
# dO in 16 bits, dQ in fp32). Once the programs drift apart on a long non-causal sequence
# every head's rows are in flight: llm-dense B8 H16 D128 8192 holds 134 MB against the
# 50 MB L2 (CuteDSL's call at ~31 ms in some processes, ~19 in others; H100). A run of
# BWD_HEAD_RUN entries a head keeps a wave on ~2 KV heads, as FA4's grid takes a head's
# KV blocks first: 18.6 ms a call (median), DRAM traffic -43 %. Where 2 KV heads' rows
# overflow the L2 as well, the runs lost (fuzz B5 H8/4 D128 16384 / 0.5: TLX +8.7 %,
# CuteDSL +2.7 %), and on causal lists too, whose tiles differ in length (GQA and short
# sequences +2-3 %; PERF, Design decisions: Backward).
BWD_HEAD_RUN = 64
BWD_HEAD_RUN_BYTES = 50 << 20  # the H100 / H200 L2
BWD_HEAD_RUN_HEADS = 2         # KV heads a wave holds in runs (~132 programs / 64)


def bwd_head_run(n_k: int, batch: int, h_q: int, h_kv: int, max_q: int, head_dim: int,
                 block_n: int, causal: bool, broadcast_q: bool, windows: bool = False) -> int:
    """List entries a KV head takes in turn before the next head's (both styles'
    schedule.kv_tile_coords): BWD_HEAD_RUN for a non-causal call whose longest sequence's
    rows over all query heads (Q, dO, the fp32 dQ: 8 bytes an element) exceed
    BWD_HEAD_RUN_BYTES while those of BWD_HEAD_RUN_HEADS KV heads' groups fit it, where
    the list (about n_k / block_n + batch / 2 entries) holds a whole run; else 1, the
    heads innermost. Broadcast-Q (pinned heads) and key windows (their own coords) take
    1."""
    if causal or broadcast_q or windows or h_kv < 2:
        return 1
    head = h_q // h_kv * max_q * head_dim * 8  # one KV head's group's rows
    if h_kv * head <= BWD_HEAD_RUN_BYTES or BWD_HEAD_RUN_HEADS * head > BWD_HEAD_RUN_BYTES:
        return 1
    return BWD_HEAD_RUN if n_k / block_n + batch / 2 >= BWD_HEAD_RUN else 1


def bwd_dynamic(broadcast_q: bool) -> bool:
    """Whether the backward's programs take their tiles from a counter (both styles): the
    producer of each program takes its next tile with an atomic add once it has issued the
    loads of the last one, and hands it to the other roles (kernels_tlx/tile_counter.py).
    Every packed list: the list runs longest first, and a static round-robin deals each
    round's longest tile to the same programs. Host simulation, max program load over the
    mean, static / counter: causal GQA B4 H32/8 4096 1.395 / 1.001, fuzz B5 H8/4 16384 /
    0.5 1.082 / 1.007, cross B43 H8 8192 / 2048 1.227 / 1.010, B48 H8/1 1024 / 0.5 1.394 /
    1.183. Broadcast-Q programs are pinned to a head and stay static."""
    return not broadcast_q
