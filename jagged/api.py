"""`make_jagged_attention`: one style's forward and backward made into the public,
differentiable, `torch.compile`-traceable function.

    jagged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     *, causal=False, softmax_scale=None, broadcast_q=False,
                     return_lse=False, check_offsets=False, q_descale=None,
                     k_descale=None, v_descale=None) -> out  (or (out, lse))

A style supplies
    fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q[, descale])
        -> (out, lse)
    bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q,
        dlse=None) -> (dq, dk, dv)
with out [Nq, H, D] in q's dtype and lse [H, Nq] fp32 (-inf on rows with no key).
`dlse` is the gradient on lse (None when lse is unused). It enters the backward only
through delta = rowsum(dO * O) - dlse, since d lse_i / d s_ij = P_ij:
dS = P * (dP - delta) either way.

fp8 (q, k, v all float8_e4m3fn) is forward only: the style's fwd gets
`descale=(q_descale, k_descale, v_descale)`, each fp32 [B, H_kv] (a missing one is
ones), and returns bf16 out. A 16-bit call passes no `descale` keyword: the style's
forward runs exactly as without fp8 support. A call with grad enabled and an fp8
input requiring grad raises a RuntimeError, and so would a backward through an fp8
forward.

The call never synchronizes the host unless `check_offsets=True` (see jagged.validate),
so it can be captured in a CUDA graph and traced by torch.compile(fullgraph=True): the
forward and backward are the custom ops `jagged_attn::{style}_fwd` / `_bwd`, and the
offsets check runs inside the forward op.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .fp8 import fill_descales
from .validate import (FP8, HEAD_DIMS, check_offsets_async, check_offsets_host, default_scale,
                       validate, validate_descales)

FORWARD_ONLY = ("fp8 inputs (float8_e4m3fn) are forward only: call jagged_attention under "
                "torch.no_grad() or with q, k, v that do not require grad")


def make_jagged_attention(name: str, fwd: Callable, bwd: Callable, head_dims=HEAD_DIMS,
                          checks_offsets: bool = False):
    """Register `fwd`/`bwd` as the custom op `jagged_attn::{name}` with autograd and a
    fake (meta) kernel, and return the public `jagged_attention` function: the op under
    torch.compile, a plain autograd.Function (same forward, backward) in eager mode.
    checks_offsets: `fwd` runs the device-side offsets check itself, before anything
    reads the offsets (inside its tile-list kernel, jagged.tiles `check=`), so the call
    does not queue jagged.validate's kernel ahead of it."""

    def call_bwd(dout, q, k, v, out, lse, dlse, *rest):
        return bwd(dout, q, k, v, out, lse, *rest, dlse=dlse)

    def checked_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q, **descale):
        # descale: an fp8 call's `descale=` keyword; a 16-bit call passes none
        if not checks_offsets:
            check_offsets_async(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k)
        return fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q, **descale)

    @torch.library.custom_op(f"jagged_attn::{name}_fwd", mutates_args=())
    def op_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               cu_q: Optional[torch.Tensor], cu_k: torch.Tensor, max_q: int, max_k: int,
               causal: bool, scale: float, broadcast_q: bool,
               q_descale: Optional[torch.Tensor] = None, k_descale: Optional[torch.Tensor] = None,
               v_descale: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        args = (q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q)
        if q_descale is None:  # 16-bit (an fp8 call always has its three descales)
            return checked_fwd(*args)
        return checked_fwd(*args, descale=(q_descale, k_descale, v_descale))

    @op_fwd.register_fake
    def _(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q, *descales):
        nq = (cu_k.shape[0] - 1) * q.shape[0] if broadcast_q else q.shape[0]
        dt = torch.bfloat16 if q.dtype == FP8 else q.dtype
        return (q.new_empty(nq, *q.shape[1:], dtype=dt),
                q.new_empty(q.shape[1], nq, dtype=torch.float32))

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

    # role: host
    def save(ctx, inputs, out, lse):
        q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q = inputs[:10]
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.args = (max_q, max_k, causal, scale, broadcast_q)
        # an unused output's gradient stays None: no zeros kernel per call for the lse
        # that most callers never use
        ctx.set_materialize_grads(False)
        ctx.n_inputs = len(inputs)

    def grads(ctx, dout, dlse, call_bwd):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        if q.dtype == FP8:
            raise RuntimeError(FORWARD_ONLY)
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        dq, dk, dv = call_bwd(dout, q, k, v, out, lse, dlse, cu_q, cu_k, *ctx.args)
        # the op's inputs past q, k, v (offsets, sizes, flags, descales) get no gradient
        return (dq, dk, dv) + (None,) * (ctx.n_inputs - 3)

    op_fwd.register_autograd(lambda ctx, dout, dlse: grads(ctx, dout, dlse, op_bwd),
                             setup_context=lambda ctx, inputs, output: save(ctx, inputs, *output))

    class Eager(torch.autograd.Function):
        """The same forward and backward without the custom op's dispatch, which costs
        ~65 us of host time per call (measured on the CPU box; more on the H200 node),
        as much as a short sequence's whole kernel. torch.compile traces the op."""

        @staticmethod
        def forward(ctx, *inputs):
            out, lse = checked_fwd(*inputs)
            save(ctx, inputs, out, lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, dlse):
            return grads(ctx, dout, dlse, call_bwd)

    def fp8_call(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q, batch,
                 q_descale, k_descale, v_descale):
        """The forward of an fp8 call: no autograd (forward only), the descales filled."""
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            raise RuntimeError(FORWARD_ONLY)
        descale = fill_descales(batch, k.shape[1], q.device, q_descale, k_descale, v_descale)
        args = (q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q)
        if torch.compiler.is_compiling():
            return op_fwd(*args, *descale)
        return checked_fwd(*args, descale=descale)

    def jagged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                         causal=False, softmax_scale=None, broadcast_q=False, return_lse=False,
                         check_offsets=False, q_descale=None, k_descale=None, v_descale=None):
        batch = validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         broadcast_q=broadcast_q, head_dims=head_dims)
        fp8 = validate_descales(q, k, batch, q_descale, k_descale, v_descale)
        if check_offsets:
            check_offsets_host(None if broadcast_q else cu_seqlens_q, cu_seqlens_k, q.shape[0],
                               k.shape[0], max_seqlen_q, max_seqlen_k)
        scale = default_scale(q.shape[2], softmax_scale)
        if fp8:
            out, lse = fp8_call(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                int(max_seqlen_k), bool(causal), scale, bool(broadcast_q), batch,
                                q_descale, k_descale, v_descale)
            return (out, lse) if return_lse else out
        if torch.compiler.is_compiling():
            op = op_fwd
        elif torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            op = Eager.apply
        else:  # nothing to differentiate: autograd.Function.apply costs ~35 us of host a call
            op = checked_fwd  # a third of a short forward's
        out, lse = op(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                      int(max_seqlen_k), bool(causal), scale, bool(broadcast_q))
        return (out, lse) if return_lse else out

    jagged_attention.__doc__ = __doc__
    return jagged_attention
