"""Input checks of the public API.

Three levels, so that the default call never waits on the GPU:
- `validate` (every call, on the host, no device access): types, dtypes, shapes,
  devices, contiguity, the batch sizes of the offsets; a TypeError or ValueError that
  names the argument. `validate_descales`: the fp8 descales' dtype, shape, device and
  layout (no value is read either).
- `check_offsets_async` (every call, on the device, no host sync): one small kernel
  checks that each `cu_seqlens_*` starts at 0, never decreases, ends at its tensor's
  token count and holds no length above its `max_seqlen_*` (jagged.offsets). A bad value
  fails a device-side assertion whose message names the argument; CUDA reports it at
  the next synchronization, and the attention kernels queued behind it write nothing
  (they start after it, or, a list-free forward (jagged.tiles.fwd_direct), run their
  reads under it and wait for it before any store). As with every device-side
  assertion, the process's CUDA context is unusable afterwards. A check of unchanged
  offsets is not repeated (the tile lists' cache, keyed by tensor identity and version).
  The TLX and CuteDSL forwards that build a tile list run the same check inside their
  list kernel instead (`jagged.tiles`, `check=`): one launch fewer a call. It lives in
  jagged.tiles, beside the lists that share its cache.
- `check_offsets_host` (`check_offsets=True`): the same conditions, read on the host
  (one device-to-host copy), raising a ValueError with the offending entry before
  anything is launched.
`default_scale`: the softmax scale, 1 / sqrt(head_dim) or a positive finite number given.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .fp8 import FP8, check_descale
from .tiles import check_offsets_async

DTYPES = (torch.bfloat16, torch.float16, FP8)  # fp8: q, k and v all e4m3, with descales
HEAD_DIMS = (64, 128)


def validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
             broadcast_q=False, head_dims=HEAD_DIMS) -> int:
    """Raise TypeError/ValueError naming the bad argument; return the batch size.
    Reads no tensor value (no device access)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} must be bfloat16, float16 or float8_e4m3fn, got {t.dtype}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be [tokens, heads, head_dim], got shape {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share one dtype (fp8: all three float8_e4m3fn), got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}")
    for name, t in (("k", k), ("v", v), ("cu_seqlens_k", cu_seqlens_k)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    D = q.shape[2]
    if D not in head_dims:
        raise ValueError(f"head_dim {D} (q.shape[2]) not supported; supported: {head_dims}")
    if k.shape[2] != D or v.shape != k.shape:
        raise ValueError(f"k and v must be [total_k, H_kv, {D}], got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of k heads ({k.shape[1]})")
    _check_offsets_tensor("cu_seqlens_k", cu_seqlens_k)
    batch = cu_seqlens_k.shape[0] - 1
    if broadcast_q:
        if cu_seqlens_q is not None:
            raise ValueError("cu_seqlens_q must be None with broadcast_q=True (q is one dense [L_q, H, D])")
    else:
        if not isinstance(cu_seqlens_q, torch.Tensor):
            raise TypeError("cu_seqlens_q must be a torch.Tensor (None only with broadcast_q=True)")
        if cu_seqlens_q.device != q.device:
            raise ValueError(f"cu_seqlens_q is on {cu_seqlens_q.device} but q is on {q.device}")
        _check_offsets_tensor("cu_seqlens_q", cu_seqlens_q)
        if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
            raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries, cu_seqlens_k "
                             f"{cu_seqlens_k.shape[0]}: they must describe the same batch")
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise TypeError(f"{name} must be a non-negative int, got {m!r}")
    if broadcast_q and max_seqlen_q < q.shape[0]:
        raise ValueError(f"max_seqlen_q={max_seqlen_q} is smaller than L_q={q.shape[0]}")
    return batch


def validate_descales(q, k, batch: int, q_descale, k_descale, v_descale) -> bool:
    """Raise TypeError/ValueError naming the bad descale; return whether the call is fp8.
    With fp8 q, k, v (validate checked they share a dtype) each descale is None or fp32,
    contiguous, [B, H_kv] on q's device; with 16-bit inputs every one must be None.
    Reads no value."""
    if q_descale is None and k_descale is None and v_descale is None:
        return q.dtype == FP8
    want = (batch, k.shape[1])
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            continue
        if isinstance(t, torch.Tensor) and q.dtype != FP8:
            raise ValueError(f"{name} is only for float8_e4m3fn q, k, v; got {q.dtype}")
        check_descale(name, t, *want, q.device)
    return True


def _check_offsets_tensor(name, cu):
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D [batch + 1], got shape {tuple(cu.shape)}")
    if not cu.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


# ------------------------------------------------------------------ host (opt-in)
def check_offsets_host(cu_seqlens_q, cu_seqlens_k, n_q, n_k, max_seqlen_q, max_seqlen_k):
    """The full synchronous check (`check_offsets=True`): a ValueError naming the argument
    and the offending entry. cu_seqlens_q None: broadcast-Q, nothing to check for q."""
    _host_check("cu_seqlens_k", cu_seqlens_k, n_k, max_seqlen_k)
    if cu_seqlens_q is not None:
        _host_check("cu_seqlens_q", cu_seqlens_q, n_q, max_seqlen_q)


def _host_check(name, cu, total, max_len):
    c = cu.cpu().to(torch.int64)
    if c[0] != 0:
        raise ValueError(f"{name} must start at 0, got {int(c[0])}")
    lens = c[1:] - c[:-1]
    if (lens < 0).any():
        b = int(torch.nonzero(lens < 0)[0])
        raise ValueError(f"{name} is not monotonic: entry {b + 1} ({int(c[b + 1])}) < entry {b} ({int(c[b])})")
    if c[-1] != total:
        raise ValueError(f"{name} ends at {int(c[-1])} but the tensor has {total} tokens")
    if len(lens) and int(lens.max()) > max_len:
        which = name.replace("cu_seqlens", "max_seqlen")
        raise ValueError(f"{which}={max_len} is smaller than a real length ({int(lens.max())}, "
                         f"sequence {int(lens.argmax())})")


# ------------------------------------------------------------------ device (default)
def forward_without_tiles(out, lse, cu_q, cu_k, check) -> bool:
    """A forward with no tile list to build (no output rows, sequences, keys or queries):
    queue the offsets check alone (`check`: n_q, n_k, max_q, max_k; the list kernel would
    have run it) and write the rows that see no key (O = 0, LSE = -inf). Returns whether
    the call was one; the others build their list with `check=`."""
    n_q, n_k = check[0], check[1]
    batch = cu_k.shape[0] - 1
    if out.shape[0] and batch and n_k and n_q:
        return False
    check_offsets_async(cu_q, cu_k, *check)
    if out.shape[0] and batch:
        out.zero_()
        lse.fill_(float("-inf"))
    return True


def default_scale(head_dim: int, softmax_scale: Optional[float]) -> float:
    """1 / sqrt(head_dim), or softmax_scale: a positive finite number, since the kernels
    take the row max of the raw scores and scale it (a negative scale would flip it)."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    scale = float(softmax_scale)
    if not (0.0 < scale < math.inf):
        raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale!r}")
    return scale
