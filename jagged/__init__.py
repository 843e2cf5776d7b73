"""Jagged (variable-length, packed) flash attention for NVIDIA GPUs.

    out = jagged.jagged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, *, causal=False, softmax_scale=None,
                                  broadcast_q=False, return_lse=False, backend="auto",
                                  check_offsets=False, q_descale=None, k_descale=None,
                                  v_descale=None)

q [total_q, H, D], k / v [total_k, H_kv, D] (H a multiple of H_kv), cu_seqlens_* int32
[B + 1] prefix sums from 0; bf16 or fp16, D 64 or 128; causal is bottom-right aligned
(query i of a sequence sees key j iff j <= i + len_k - len_q). broadcast_q=True: q is one
dense [L_q, H, D] shared by every sequence, cu_seqlens_q is None, out is [B * L_q, H, D].
lse is [H, total_q] fp32 (natural log; -inf on rows that see no key). Gradients flow to
q, k, v through out and lse.

fp8 (forward only): q, k, v all float8_e4m3fn with descales (FlashAttention's names),
each fp32 contiguous [B, H_kv] on q's device or None (ones): the real values are
q[row of sequence b, h] * q_descale[b, h // (H / H_kv)], k[row of b, h_kv] *
k_descale[b, h_kv], v likewise; out is bf16. Descales with 16-bit inputs raise. A call
with grad enabled and an fp8 input requiring grad raises a RuntimeError. A style
without an fp8 kernel for the device raises NotImplementedError (cute and tlx have
Hopper's); "auto" takes the first style with one (cute on Hopper; the portable kernel
anywhere).

`backend`: "auto" (the fastest style that runs on q's device, see jagged.dispatch),
"cute", "tlx" or "portable". `which(q)` says which one "auto" takes, `available()`
which styles run here, and `kernel_arch(device)` which kernels the two styles run on a
device: "hopper" (compute capability 9.x), "blackwell" (10.x: compiled and
model-checked, not yet run on a B200) or None (only the portable kernel). The call never
synchronizes the host; `check_offsets=True` adds a synchronous check of the offsets'
values (jagged.validate says which error appears when).
"""
from __future__ import annotations

from .dispatch import available, kernel_arch, resolve, style_fn
from .fp8 import FP8
from .kvcache import kvcache_attention

__all__ = ["jagged_attention", "kvcache_attention", "available", "kernel_arch", "which"]


def which(q, backend: str = "auto") -> str:
    """The style `jagged_attention(q, ..., backend=backend)` runs."""
    return resolve(backend, q.device.index if q.is_cuda else -1, q.dtype == FP8)


def jagged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, softmax_scale=None, broadcast_q=False, return_lse=False,
                     backend="auto", check_offsets=False, q_descale=None, k_descale=None,
                     v_descale=None):
    fn = style_fn(which(q, backend))
    return fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
              softmax_scale=softmax_scale, broadcast_q=broadcast_q, return_lse=return_lse,
              check_offsets=check_offsets, q_descale=q_descale, k_descale=k_descale,
              v_descale=v_descale)


jagged_attention.__doc__ = __doc__
