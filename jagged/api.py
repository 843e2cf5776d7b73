"""The one API every implementation exposes: input checks, and a differentiable,
`torch.compile`-traceable op built from an implementation's forward and backward.

    jagged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     *, causal=False, softmax_scale=None, broadcast_q=False,
                     return_lse=False) -> out  (or (out, lse))

An implementation supplies
    fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q) -> (out, lse)
    bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q,
        dlse=None) -> (dq, dk, dv)
with out [Nq, H, D] in q's dtype and lse [H, Nq] fp32 (-inf on rows with no key).
`dlse` is the gradient on lse (None when lse is unused). It enters the backward only
through delta = rowsum(dO * O) - dlse, since d lse_i / d s_ij = P_ij:
dS = P * (dP - delta) either way.
"""
from __future__ import annotations

import math
import os
from typing import Callable, Optional

import torch

DTYPES = (torch.bfloat16, torch.float16)
HEAD_DIMS = (64, 128)

# Reading the offsets' values costs a device-to-host sync; JAGGED_ATTN_CHECK_OFFSETS=0
# skips those checks (shapes, dtypes and devices are always checked).
CHECK_OFFSETS = os.environ.get("JAGGED_ATTN_CHECK_OFFSETS", "1") != "0"


def validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
             broadcast_q=False, head_dims=HEAD_DIMS, check_offsets=None) -> int:
    """Raise TypeError/ValueError naming the bad argument; return the batch size."""
    for name, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} must be bfloat16 or float16, got {t.dtype}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be [tokens, heads, head_dim], got shape {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
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
        if max_seqlen_q < q.shape[0]:
            raise ValueError(f"max_seqlen_q={max_seqlen_q} is smaller than L_q={q.shape[0]}")
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
    if check_offsets if check_offsets is not None else CHECK_OFFSETS:
        _check_offsets_values("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k)
        if not broadcast_q:
            _check_offsets_values("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q)
    return batch


def _check_offsets_tensor(name, cu):
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D [batch + 1], got shape {tuple(cu.shape)}")
    if not cu.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _check_offsets_values(name, cu, total, max_len):
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


def default_scale(head_dim: int, softmax_scale: Optional[float]) -> float:
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)


def make_jagged_attention(name: str, fwd: Callable, bwd: Callable, head_dims=HEAD_DIMS):
    """Register `fwd`/`bwd` as the custom op `jagged_attn::{name}` with autograd and a
    fake (meta) kernel, and return the public `jagged_attention` function: the op under
    torch.compile, a plain autograd.Function (same forward, backward) in eager mode."""

    def call_bwd(dout, q, k, v, out, lse, dlse, *rest):
        return bwd(dout, q, k, v, out, lse, *rest, dlse=dlse)

    @torch.library.custom_op(f"jagged_attn::{name}_fwd", mutates_args=())
    def op_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               cu_q: Optional[torch.Tensor], cu_k: torch.Tensor, max_q: int, max_k: int,
               causal: bool, scale: float, broadcast_q: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q)

    @op_fwd.register_fake
    def _(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q):
        nq = (cu_k.shape[0] - 1) * q.shape[0] if broadcast_q else q.shape[0]
        return q.new_empty(nq, *q.shape[1:]), q.new_empty(q.shape[1], nq, dtype=torch.float32)

    @torch.library.custom_op(f"jagged_attn::{name}_bwd", mutates_args=())
    def op_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               out: torch.Tensor, lse: torch.Tensor, dlse: Optional[torch.Tensor],
               cu_q: Optional[torch.Tensor], cu_k: torch.Tensor, max_q: int, max_k: int,
               causal: bool, scale: float,
               broadcast_q: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return call_bwd(dout, q, k, v, out, lse, dlse, cu_q, cu_k, max_q, max_k, causal, scale,
                        broadcast_q)

    @op_bwd.register_fake
    def _(dout, q, k, v, out, lse, *rest):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def save(ctx, inputs, out, lse):
        q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q = inputs
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.args = (max_q, max_k, causal, scale, broadcast_q)
        # an unused output's gradient stays None: no zeros kernel per call for the lse
        # that most callers never use
        ctx.set_materialize_grads(False)

    def grads(ctx, dout, dlse, call_bwd):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        dq, dk, dv = call_bwd(dout, q, k, v, out, lse, dlse, cu_q, cu_k, *ctx.args)
        return dq, dk, dv, None, None, None, None, None, None, None

    op_fwd.register_autograd(lambda ctx, dout, dlse: grads(ctx, dout, dlse, op_bwd),
                             setup_context=lambda ctx, inputs, output: save(ctx, inputs, *output))

    class Eager(torch.autograd.Function):
        """The same forward and backward without the custom op's dispatch, which costs
        ~65 us of host time per call (measured on the CPU box; more on the H200 node),
        as much as a short sequence's whole kernel. torch.compile traces the op."""

        @staticmethod
        def forward(ctx, *inputs):
            out, lse = fwd(*inputs)
            save(ctx, inputs, out, lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, dlse):
            return grads(ctx, dout, dlse, call_bwd)

    def jagged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                         causal=False, softmax_scale=None, broadcast_q=False, return_lse=False):
        validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                 broadcast_q=broadcast_q, head_dims=head_dims)
        scale = default_scale(q.shape[2], softmax_scale)
        if torch.compiler.is_compiling():
            op = op_fwd
        elif torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            op = Eager.apply
        else:  # nothing to differentiate: autograd.Function.apply costs ~35 us of host a call
            op = fwd  # (PERF.md session 9), a third of a short forward's
        out, lse = op(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                      int(max_seqlen_k), bool(causal), scale, bool(broadcast_q))
        return (out, lse) if return_lse else out

    jagged_attention.__doc__ = __doc__
    return jagged_attention


def hopper_available(module: str, what: str) -> tuple[bool, str]:
    """(True, "") when this machine has a Hopper GPU and `module` imports, else
    (False, why not). Makes no driver call unless asked."""
    import importlib
    if not torch.cuda.is_available():
        return False, "needs a CUDA GPU"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return False, f"needs compute capability 9.x (Hopper), found {major}.{minor}"
    try:
        importlib.import_module(module)
    except Exception as e:
        return False, f"{what} not importable: {type(e).__name__}: {e}"
    return True, ""
