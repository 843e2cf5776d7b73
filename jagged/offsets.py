"""The device-side check of `cu_seqlens_*` (jagged.validate), as Triton functions that
kernels call: the check's own one-program kernel (`launch_check`), and the forward
tile-list kernels of jagged.tiles, which run it first so that a call launches one kernel
fewer.

Its `tl.device_assert`s name the argument; they are compiled in only where a kernel is
built with debug=True (the calling kernels are, with overflow sanitizing off where the
rest of the kernel is tile arithmetic)."""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from .launch import fast


@triton.jit
def _ends_bad(cu, batch, total, NAME: tl.constexpr, TOTAL_NAME: tl.constexpr):
    """Assert that the offsets cu [batch + 1] start at 0 and end at `total`; 0 if so."""
    first = tl.load(cu)
    last = tl.load(cu + batch)
    tl.device_assert(first == 0, NAME + " must start at 0")
    tl.device_assert(last == total, NAME + " must end at " + TOTAL_NAME)
    return (first != 0).to(tl.int32) + (last != total).to(tl.int32)


@triton.jit
def _lengths(cu, b, inb):
    return tl.load(cu + b + 1, mask=inb, other=0) - tl.load(cu + b, mask=inb, other=0)


@triton.jit
def _lengths_bad(n, max_len, NAME: tl.constexpr, MAX_NAME: tl.constexpr):
    """Assert that the lengths n are in [0, max_len]; the count of those that are not."""
    tl.device_assert(n >= 0, NAME + " must not decrease")
    tl.device_assert(n <= max_len, MAX_NAME + " is smaller than a length in " + NAME)
    return tl.sum(((n < 0) | (n > max_len)).to(tl.int32), 0)


@triton.jit
def offsets_ok(cu, batch, total, max_len, BLOCK: tl.constexpr, NAME: tl.constexpr,
               MAX_NAME: tl.constexpr, TOTAL_NAME: tl.constexpr):
    """Assert that the offsets cu [batch + 1] start at 0, end at `total`, never decrease
    and hold no length above max_len; return whether they do (a caller skips its writes
    when they do not, so nothing is written from bad offsets before the assert stops the
    kernel)."""
    bad = _ends_bad(cu, batch, total, NAME, TOTAL_NAME)
    for start in range(0, batch, BLOCK):
        b = start + tl.arange(0, BLOCK)
        bad += _lengths_bad(_lengths(cu, b, b < batch), max_len, NAME, MAX_NAME)
    return bad == 0


@triton.jit
def check_offsets(cu_q, cu_k, batch, n_q, n_k, max_q, max_k, CHECK_Q: tl.constexpr,
                  BLOCK: tl.constexpr):
    """offsets_ok of cu_seqlens_k and (CHECK_Q: not broadcast-Q) cu_seqlens_q, both in one
    pass of BLOCK sequences at a time: each pass's loads of the two arrays in flight
    together (the list kernels that run the check wait on these loads first)."""
    bad = _ends_bad(cu_k, batch, n_k, "cu_seqlens_k", "k.shape[0]")
    if CHECK_Q:
        bad += _ends_bad(cu_q, batch, n_q, "cu_seqlens_q", "q.shape[0]")
    for start in range(0, batch, BLOCK):
        b = start + tl.arange(0, BLOCK)
        inb = b < batch
        n_k_b = _lengths(cu_k, b, inb)
        if CHECK_Q:  # loaded before either sum's barrier
            n_q_b = _lengths(cu_q, b, inb)
            bad += _lengths_bad(n_q_b, max_q, "cu_seqlens_q", "max_seqlen_q")
        bad += _lengths_bad(n_k_b, max_k, "cu_seqlens_k", "max_seqlen_k")
    return bad == 0


@triton.jit(debug=True)  # debug: device_assert is compiled in (this kernel only)
def _offsets_check_kernel(cu_q, cu_k, batch, n_q, n_k, max_q, max_k,
                          CHECK_Q: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """PDL: a kernel queued behind may launch at once (a list-free forward, which waits
    for this check before its first store, jagged.tiles.fwd_direct)."""
    if PDL:
        gdc_launch_dependents()
    check_offsets(cu_q, cu_k, batch, n_q, n_k, max_q, max_k, CHECK_Q, BLOCK)


def launch_check(cu_q, cu_k, n_q, n_k, max_q, max_k, pdl: bool = False):
    """The check alone, one program (cu_q None: broadcast-Q, cu_k checked only); pdl: the
    kernel queued behind may launch at once."""
    batch = cu_k.shape[0] - 1
    fast(_offsets_check_kernel)[(1,)](cu_k if cu_q is None else cu_q, cu_k, batch, n_q, n_k,
                                      max_q, max_k, CHECK_Q=cu_q is not None, BLOCK=1024,
                                      PDL=pdl, num_warps=4)
