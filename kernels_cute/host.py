"""Host code of the CuteDSL forward and backward, shared by the Hopper and Blackwell
kernels: element types, the symbolic tensors a kernel compiles on (one compile serves
every shape, length and stride), the compile cache (in memory, and on disk through
`disk_cache`), and the launch around an architecture's kernel: the forward's outputs,
empty cases and tile list (fp8: V dequantized to bf16, the descales); the backward's
preprocess (delta, dQ accumulator) and postprocess (dQ's slot sum).

The DSL is imported inside the functions only: importing this module touches neither
the DSL nor the driver.
"""
import math
from dataclasses import replace
from typing import Any, Callable, NamedTuple

import torch

from jagged.arch import num_sms
from jagged.fp8 import FP8, dequantize_rows
from jagged.launch import once_a_site
from jagged.tiles import (bwd_dependent, dkv_accumulator, dq_accumulator, flat_rows,
                          fwd_direct, fwd_dynamic, fwd_sched, fwd_tiles, grad_buffers,
                          packed_query, pairs_per_sequence, slot_count, window_tiles,
                          windows_direct)
from jagged.validate import forward_without_tiles

from . import disk_cache


def cute_dtype(dtype):
    """The DSL element type of a torch dtype (a DSL type passes through)."""
    import cutlass
    if not isinstance(dtype, torch.dtype):
        return dtype
    return {torch.bfloat16: cutlass.BFloat16, torch.float16: cutlass.Float16,
            FP8: cutlass.Float8E4M3FN}[dtype]


def compiled(cache: dict, make: Callable, *key):
    """make(*key), compiled once per key (host time per call: one dict lookup); a new
    process loads it from `disk_cache` where an earlier one stored it."""
    k = (make,) + key
    fn = cache.get(k)
    if fn is None:
        fn = cache[k] = disk_cache.load_or_compile(make, key)
    return fn


def compile_kernel(kernel, *args, options: str = ""):
    """cute.compile through TVM-FFI; the launch runs on the caller's current stream."""
    import cutlass.cute as cute
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(kernel, *args, stream, options=("--enable-tvm-ffi " + options).strip())


def fake(dtype, shape, stride, align):
    from cutlass.cute.runtime import make_fake_tensor
    return make_fake_tensor(dtype, shape, stride=stride, assumed_align=align)


def tok(dtype, rows, heads, head_dim):
    """A packed [tokens, heads, D] tensor, symbolic tokens/heads/strides (16B-aligned)."""
    import cutlass.cute as cute
    div = 128 // dtype.width
    return fake(dtype, (rows, heads, head_dim),
                (cute.sym_int64(divisibility=div), cute.sym_int64(divisibility=div), 1), 16)


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------

def fwd_args(dtype, broadcast_q: bool, head_dim: int, windows: bool = False,
             packed: bool = False, fp8_v: bool = False):
    """The forward kernel's symbolic tensors: q, k, v, out, lse, cu_q (None in
    broadcast-Q mode), cu_k, the tile list's pairs and count (row windows: the int32
    window order and count). An 8-bit dtype (fp8): q and k in it, v and out bf16.
    packed (GQA heads packed into broadcast-Q tiles): q has the KV heads' count of
    heads, out and lse every query head. fp8_v: v in the 8-bit dtype too."""
    import cutlass
    import cutlass.cute as cute

    pv = cutlass.BFloat16 if dtype.width == 8 else dtype
    nq, nk, no, h, hkv = (cute.sym_int32() for _ in range(5))
    hq = cute.sym_int32() if packed else h
    q, k, v, o = (tok(dtype, nq, hq, head_dim), tok(dtype, nk, hkv, head_dim),
                  tok(dtype if fp8_v else pv, nk, hkv, head_dim), tok(pv, no, h, head_dim))
    lse = fake(cutlass.Float32, (h, no), (cute.sym_int64(), 1), 4)
    nb = cute.sym_int32()
    cu_k = fake(cutlass.Int32, (nb,), (1,), 4)
    cu_q = None if broadcast_q else fake(cutlass.Int32, (nb,), (1,), 4)
    if windows:
        pairs = fake(cutlass.Int32, (cute.sym_int32(),), (1,), 4)
    else:
        pairs = fake(cutlass.Int64, (cute.sym_int32(),), (1,), 8)
    count = fake(cutlass.Int32, (1,), (1,), 4)
    return q, k, v, o, lse, cu_q, cu_k, pairs, count


def descale_args(fp8: bool, count: int = 2):
    """q_descale and k_descale of a forward with an fp8 build, after the tile list:
    symbolic fp32 [B, H_kv] for the fp8 build, None for a 16-bit one; count 1: the
    v_descale of a forward with V-tile builds (FwdKernels.fp8_v), after them."""
    import cutlass
    import cutlass.cute as cute
    return tuple(fake(cutlass.Float32, (cute.sym_int32(), cute.sym_int32()),
                      (cute.sym_int64(), 1), 4) if fp8 else None for _ in range(count))


def window_args(windows: bool):
    """The window table of a forward that has row-window builds, after the descales:
    symbolic int32 [3, n_win] for a windows build, None for the others."""
    import cutlass
    import cutlass.cute as cute
    return (fake(cutlass.Int32, (3, cute.sym_int32()), (cute.sym_int64(), 1), 4)
            if windows else None,)


def compile_fwd(kernel, broadcast_q: bool, head_dim: int, options: str = "",
                descale: tuple = (), windows: bool | None = None, sched: bool = False):
    """Compile a forward kernel object (its dtype, head dim and flags set) on symbolic
    tensors; the scalars (scale, L_q, group, nblk, programs) are runtime values.
    descale: the descale arguments of a forward with an fp8 build (`descale_args`).
    windows: None for a forward without row windows, else whether this build runs them
    (`window_args`). sched: every build of the forward takes the scheduling buffer
    (FwdKernels.dynamic), int32, after the window table."""
    import cutlass
    import cutlass.cute as cute
    args = fwd_args(kernel.dtype, broadcast_q, head_dim, bool(windows),
                    getattr(kernel, "pack", 1) > 1, getattr(kernel, "fp8_v", False)) + \
        tuple(descale)
    if windows is not None:
        args += window_args(windows)
    if sched:
        args += (fake(cutlass.Int32, (cute.sym_int32(),), (1,), 4),)
    return compile_kernel(kernel, *args, cutlass.Float32(1.0), cutlass.Int32(0),
                          cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1),
                          options=options)


class FwdKernels(NamedTuple):
    """An architecture's forward as `forward` launches it."""
    pick_config: Callable  # (head_dim, max_k, causal, mean_k) -> Config
    compiled: Callable     # (dtype, head_dim, causal, broadcast_q, cfg) -> the kernel
    programs: Callable     # (cfg, n_tiles, device) -> CTAs of the launch
    fp8: bool = False      # an fp8 build: the kernel takes q_descale, k_descale after
                           # the tile list (None, None for 16-bit inputs)
    takes_windows: Callable | None = None  # row windows: (n_rows, n_keys, batch, max_q,
                           # broadcast_q) -> whether a call runs on them; the kernel
                           # takes the window table after the descales (None on a
                           # build without them)
    window_config: Callable | None = None  # (head_dim) -> the windows build's Config
    pack_gqa: bool = False  # broadcast-Q tiles may pack a GQA group's heads (the Config's
                            # `pack`, jagged.tiles.gqa_pack)
    direct: bool = False    # one wave of tiles runs without a list (the Config's `direct`,
                            # jagged.tiles.fwd_direct)
    fp8_v: Callable | None = None  # (group, mean_k) -> whether an fp8 call converts V in
                            # the kernel (Config.fp8_v: e4m3 V, no V pass); the kernel takes
                            # v_descale after k_descale (None when not converting)
    dynamic: bool = False   # causal packed lists take their tiles from a counter (the
                            # Config's `dynamic`, jagged.tiles.fwd_dynamic); every build
                            # takes the scheduling buffer (fwd_sched) after the window table


_UNUSED: dict = {}  # device -> (pairs, count) a list-free build takes and never reads;
                   # the count also stands for the scheduling buffer of a static build


def _unused_list(device):
    t = _UNUSED.get(device)
    if t is None:
        t = _UNUSED[device] = (torch.empty(1, dtype=torch.int64, device=device),
                               torch.empty(1, dtype=torch.int32, device=device))
    return t


def forward(kern: FwdKernels, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale,
            broadcast_q, descale=None):
    """-> (out [Nq, H, D], lse [H, Nq] fp32); Nq = B * L_q in broadcast-Q mode.
    descale: None (16-bit q, k, v) or (q_descale, k_descale, v_descale), fp32 [B, H_kv]
    each, for e4m3 q, k, v (out bf16; kern.fp8 only)."""
    H, D = q.shape[1], q.shape[2]
    B = cu_k.shape[0] - 1
    L_q = q.shape[0] if broadcast_q else 0
    n_out = B * L_q if broadcast_q else q.shape[0]
    fp8 = descale is not None
    out = torch.empty(n_out, H, D, dtype=torch.bfloat16 if fp8 else q.dtype, device=q.device)
    lse = torch.empty(H, n_out, dtype=torch.float32, device=q.device)
    # the offsets check, run by the tile-list kernel; no key anywhere: TMA cannot
    # describe an empty tensor
    check = (q.shape[0], k.shape[0], max_q, max_k)
    if forward_without_tiles(out, lse, cu_q, cu_k, check):
        return out, lse
    windows = kern.takes_windows is not None and kern.takes_windows(
        q.shape[0], k.shape[0], B, max_q, broadcast_q)
    if windows:
        cfg = kern.window_config(D)
    else:
        cfg = kern.pick_config(D, max_k, causal, k.shape[0] / B)
    table = () if kern.takes_windows is None else (None,)  # the kernel's window table
    sched = (_unused_list(q.device)[1],) if kern.dynamic else ()  # its scheduling buffer
    # the tiles' query rows and heads: a packing tile holds `pack` heads
    q, pack = packed_query(q, broadcast_q and kern.pack_gqa, k.shape[1], cfg.block_m)
    if pack > 1:
        cfg = replace(cfg, pack=pack)
    L_t, H_t = L_q * pack, q.shape[1]
    if windows:  # windows of block_m packed rows, heads folded in (nblk: the windows)
        pairs, count, win = window_tiles(cu_q, cu_k, q.shape[0], max_q, cfg.block_m,
                                         cfg.block_n, check)
        table, nblk = (win,), win.shape[1]
        n_tiles = nblk * H
    else:
        nblk = pairs_per_sequence(L_t if broadcast_q else max_q, cfg.block_m)
        direct = kern.direct and fwd_direct(B * nblk * H_t, num_sms(q.device), fp8)
        dynamic = kern.dynamic and fwd_dynamic(bool(causal), bool(broadcast_q), windows,
                                               direct)
        pairs, count, nblk = fwd_tiles(cu_q, cu_k, B, L_t if broadcast_q else max_q,
                                       L_t if broadcast_q else None, cfg.block_m, cfg.block_n,
                                       causal, check, direct, dynamic)
        n_tiles = B * nblk * H_t
        if direct:  # no list: the kernel waits for the check before it stores
            cfg = replace(cfg, direct=True)
            pairs, count = _unused_list(q.device)
        elif dynamic:
            cfg = replace(cfg, dynamic=True)
            sched = (fwd_sched(count),)
    descales = (None, None) if kern.fp8 else ()  # the kernel's q_descale, k_descale
    if kern.fp8_v is not None:                    # and v_descale
        descales += (None,)
    if fp8 and kern.fp8_v is not None and kern.fp8_v(H // k.shape[1], k.shape[0] / B):
        cfg = replace(cfg, fp8_v=True)
        descales = tuple(descale)
    elif fp8:  # V in bf16 once a call, v_descale folded in: P V is the 16-bit product
        # (after the check: the V pass reads the key offsets)
        q_descale, k_descale, v_descale = descale
        v = dequantize_rows(v, v_descale, cu_k)
        descales = (q_descale, k_descale) + descales[2:]
    num_programs = kern.programs(cfg, n_tiles, q.device)
    fn = kern.compiled(q.dtype, D, bool(causal), bool(broadcast_q), cfg)
    fn(q, k, v, out, lse, None if broadcast_q else cu_q, cu_k, pairs, count, *descales,
       *table, *sched, scale * math.log2(math.e), L_t, H_t // k.shape[1], nblk, num_programs)
    return out, lse


def persistent_programs(cfg, n_tiles: int, device) -> int:
    """One CTA per SM, no more than the tiles, at least one."""
    return max(1, min(num_sms(device), n_tiles))


# --------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------

def bwd_args(dtype, head_dim: int, windows: bool = False, dkv_fp32: bool = False):
    """The backward main kernel's symbolic tensors: q, k, v, dO, lse, delta, the fp32
    dQ accumulator, dK, dV (dkv_fp32: fp32 accumulators), cu_q, cu_k and the KV-tile list
    (tile_b, tile_n, n_tiles); key windows: the window order, table int32 [3, n_win] and
    count in its place."""
    import cutlass
    import cutlass.cute as cute
    nq, nk, no, nacc, h, hkv = (cute.sym_int32() for _ in range(6))
    q, k, v, do = tok(dtype, nq, h, head_dim), tok(dtype, nk, hkv, head_dim), \
        tok(dtype, nk, hkv, head_dim), tok(dtype, no, h, head_dim)
    gt = cutlass.Float32 if dkv_fp32 else dtype
    dk, dv = tok(gt, nk, hkv, head_dim), tok(gt, nk, hkv, head_dim)
    dq_acc = tok(cutlass.Float32, nacc, h, head_dim)
    lse = fake(cutlass.Float32, (h, no), (cute.sym_int64(), 1), 4)
    delta = fake(cutlass.Float32, (h, no), (cute.sym_int64(), 1), 4)
    nb = cute.sym_int32()
    cu_q = fake(cutlass.Int32, (nb,), (1,), 4)
    cu_k = fake(cutlass.Int32, (nb,), (1,), 4)
    nt = cute.sym_int32()
    tile_b = fake(cutlass.Int32, (nt,), (1,), 4)
    tile_n = fake(cutlass.Int32, (nt,), (1,), 4)
    if windows:
        tile_n = fake(cutlass.Int32, (3, nt), (cute.sym_int64(), 1), 4)
    n_tiles = fake(cutlass.Int32, (1,), (1,), 4)
    return q, k, v, do, lse, delta, dq_acc, dk, dv, cu_q, cu_k, tile_b, tile_n, n_tiles


class BwdCall(NamedTuple):
    """One backward call as an architecture's main kernel launch reads it."""
    q: Any
    k: Any
    v: Any
    dout: Any
    lse: Any
    delta: Any           # rowsum(dO * O) - dlse, [H, Nq] fp32
    dq_acc: Any          # fp32 accumulator viewed [rows, H, D]
    dk: Any
    dv: Any
    cu_q: Any            # None in broadcast-Q mode
    cu_k: Any
    max_k: int
    causal: bool
    scale: float
    broadcast_q: bool
    L_q: int
    n_slots: int         # broadcast-Q: the dQ accumulator's slots (1 otherwise)
    group: int           # query heads per KV head
    grid: int            # programs of the main kernel (jagged.tiles.dq_accumulator)
    sched: Any           # the scheduling buffer (tile counter and handoffs)
    max_q: int = 0       # the longest query sequence (0: not given)
    dq: Any = None       # dQ itself, in q's dtype (key windows store into it)
    parts: int = 1       # CTAs a tile (> 1: dk, dv are fp32 accumulators)
    cfg: Any = None      # the main kernel's config (BwdKernels.plan; None: its own default)


class BwdKernels(NamedTuple):
    """An architecture's backward as `backward` launches it."""
    preprocess: Callable   # (dtype, head_dim, long_k, zero_dkv, into_dq, causal)
                           # -> the compiled preprocess (long_k: key windows, the rows of
                           # longer sequences only; zero_dkv: the split tiles' fp32 dK / dV
                           # too; into_dq: those rows of dQ itself,
                           # jagged.tiles.windows_direct; causal: windows' rows that see no
                           # key too)
    main: Callable         # (BwdCall) -> launch the main kernel
    postprocess: Callable  # (dtype, pdl, dkv) -> the compiled postprocess (post_vec per
                           # thread; pdl: launched as a dependent, jagged.tiles.bwd_dependent;
                           # dkv: the split tiles' dK / dV converted too)
    post_vec: int
    # key windows (None: the architecture has none): (n_keys, batch, max_k, broadcast_q)
    # -> whether the main kernel takes them; their postprocess (dtype, pdl, dkv, causal)
    # -> the compiled rows postprocess; a window's keys (the accumulator's rows are those
    # of longer sequences)
    takes_windows: Callable | None = None
    post_rows: Callable | None = None
    window_keys: int = 0
    # (BwdCall) -> (CTAs a tile: jagged.tiles.bwd_parts / window_parts, the main kernel's
    # config for them), decided once a call; None: whole tiles, the main kernel's default
    plan: Callable | None = None
    # long packed sequences: the postprocess of a config whose dQ accumulator is
    # block-padded (Config.dq_flat: block_m rows a block, jagged.tiles.flat_block),
    # (dtype, head_dim, block_m, dq_t, pdl, dkv) -> the compiled postprocess; None: none
    post_flat: Callable | None = None


class Decisions(NamedTuple):
    """A call site's choices (`backward`): key windows, CTAs a tile, the main kernel's
    config for them."""
    windows: bool
    parts: int
    cfg: Any


_DECIDED: dict = {}  # (architecture, call site, device) -> Decisions


def _decide(kern: BwdKernels, c: BwdCall) -> Decisions:
    """The call's Decisions: kern.takes_windows and
    kern.plan (tiles split over CTAs: dK / dV added into fp32 accumulators, zeroed by the
    preprocess and converted by the postprocess); pure functions of the call's shapes,
    dtype, flags and bounds (`backward` makes them once a call site,
    jagged.launch.once_a_site)."""
    windows = (kern.takes_windows is not None
               and kern.takes_windows(c.k.shape[0], c.cu_k.shape[0] - 1, c.max_k,
                                      c.broadcast_q))
    parts, cfg = kern.plan(c) if kern.plan is not None else (1, None)
    return Decisions(windows, parts, cfg)


def backward(kern: BwdKernels, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal,
             scale, broadcast_q, dlse=None):
    """(dq, dk, dv) in q's dtype: (a) preprocess, (b) the main kernel, (c) postprocess.
    dlse: the gradient on lse (jagged.api), or None."""
    dout = dout.contiguous()
    out = out.contiguous()
    lse = lse.contiguous()
    H, D = q.shape[1], q.shape[2]
    HKV = k.shape[1]
    B = cu_k.shape[0] - 1
    Nq = out.shape[0]
    dev = q.device
    L_q = q.shape[0] if broadcast_q else 0

    dq, dk, dv = grad_buffers(q, k)
    if k.shape[0] == 0 or B == 0 or Nq == 0:
        dk.zero_(); dv.zero_(); dq.zero_()
        return dq, dk, dv

    # (a) preprocess; key windows: the accumulator's rows are the longer sequences' only
    delta = torch.empty((H, Nq), device=dev, dtype=torch.float32)
    n_sms = num_sms(dev)
    # the call as the kernels' choices see it (the tiles' parts, the dQ accumulator's
    # form); the accumulators' fields once they are made
    call = BwdCall(q, k, v, dout, lse, delta, None, dk, dv, cu_q, cu_k, max_k, bool(causal),
                   float(scale), bool(broadcast_q), L_q, 1, H // HKV, n_sms, None,
                   int(max_q or 0))
    site = (kern, q.shape, k.shape, q.dtype, call.max_q, int(max_k), call.causal,
            call.broadcast_q, cu_q is None, B, n_sms, dev)
    windows, parts, cfg = once_a_site(_DECIDED, site, lambda: _decide(kern, call))
    long_k = kern.window_keys if windows else 0
    cus = (cu_q, cu_k) if windows else (None, None)
    call = call._replace(parts=parts, cfg=cfg, dq=dq if windows else None)
    # long packed sequences: a block-padded dQ accumulator (key windows never: their
    # rows postprocess and owned windows' stores take the row accumulator)
    flat = call.cfg if kern.post_flat is not None and not windows and call.cfg.dq_flat else None
    # every real row's dQ a window's direct store: the preprocess zeroes dQ's other rows
    direct = windows and windows_direct(int(max_k), kern.window_keys, call.parts)
    rows = flat_rows(Nq, B, flat.block_m) if flat is not None else (
        call.cfg.block_m if direct else None)
    dq_acc, grid_main, sched = dq_accumulator(Nq, L_q, H, HKV, D, broadcast_q, n_sms, dev,
                                              k.shape[0], rows)
    n_slots = slot_count(dq_acc, broadcast_q)
    call = call._replace(dq_acc=dq_acc.view(-1, H, D), n_slots=n_slots, grid=grid_main,
                         sched=sched)
    dkv_acc = dkv_accumulator(k, call.parts)
    if dkv_acc is not None:
        call = call._replace(dk=dkv_acc[0], dv=dkv_acc[1])
    zeroed = (dq if direct else dq_acc).view(-1, D)
    kern.preprocess(q.dtype, D, long_k, dkv_acc is not None, direct,
                    windows and bool(causal))(
        out.view(-1, D), dout.view(-1, D), delta, zeroed, sched, Nq * H, H,
        zeroed.shape[0], *cus, B, B.bit_length(),
        None if dkv_acc is None else dkv_acc.view(-1, D),
        0 if dkv_acc is None else dkv_acc.numel() // D)
    if dlse is not None:  # the gradient on lse (jagged.api)
        delta -= dlse

    # (b) main
    kern.main(call)

    if direct:  # the windows stored every row, the preprocess zeroed the rest
        return dq, dk, dv

    # (c) postprocess, with a split call's dK / dV
    n_elem = dq.numel()
    dkv = (None, None, None, 0) if dkv_acc is None else (
        dkv_acc.view(2, -1), dk.view(-1), dv.view(-1), dk.numel() // kern.post_vec)
    split = dkv_acc is not None
    if windows:  # the rows the accumulator holds; the windows stored the others
        kern.post_rows(q.dtype, bwd_dependent(broadcast_q), split, bool(causal))(
            dq_acc.view(-1), dq.view(-1), cu_q, cu_k, B, B.bit_length(),
            n_elem // kern.post_vec, H * D // kern.post_vec, float(scale), *dkv)
    elif flat is not None:  # the rows back from the accumulator's blocks
        kern.post_flat(q.dtype, D, flat.block_m, flat.dq_t, bwd_dependent(broadcast_q), split)(
            dq_acc.view(-1), dq, cu_q, dq_acc.shape[0] // flat.block_m, float(scale), *dkv)
    else:
        kern.postprocess(q.dtype, bwd_dependent(broadcast_q), split)(
            dq_acc.view(n_slots, n_elem), dq.view(-1), n_elem // kern.post_vec, n_slots,
            float(scale), *dkv)
    return dq, dk, dv
