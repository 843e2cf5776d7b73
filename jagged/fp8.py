"""fp8 (e4m3) inputs: the dtype and the dequantization both styles share.

The real value of an fp8 row of sequence b and kv head h is x[row, h] * descale[b, h]
(FA's descales, fp32 [B, H_kv]). `dequantize_rows` writes those values in bf16: the TLX
forward uses it for V (its P V product stays 16-bit), the portable style for q, k, v.
A row's sequence is found on the device (a binary search over cu_seqlens), so nothing
here syncs the host.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, fast, next_pow2
from .seqinfo import sequence_of

FP8 = torch.float8_e4m3fn

BLOCK_ROWS = 32  # (token, head) rows a program


def check_descale(name: str, t, batch: int, kv_heads: int, device) -> None:  # role: host
    """Raise TypeError/ValueError naming descale `name` unless it is an fp32, contiguous
    [B, H_kv] tensor on `device` (q's). Reads no value."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32 [B, H_kv], got {t.dtype}")
    if tuple(t.shape) != (batch, kv_heads):
        raise ValueError(f"{name} must be [B, H_kv] = [{batch}, {kv_heads}], got "
                         f"{tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def fill_descales(batch: int, kv_heads: int, device, q_descale, k_descale, v_descale):
    """The three descales of an fp8 call, each missing one a ones tensor (one fresh
    allocation a call, shared: nothing held across calls or CUDA graphs)."""
    ones = None
    if q_descale is None or k_descale is None or v_descale is None:
        ones = torch.ones(batch, kv_heads, device=device, dtype=torch.float32)
    return tuple(ones if t is None else t for t in (q_descale, k_descale, v_descale))


@triton.jit
def _bf16_nearest(y):  # role: compute
    """fp32 -> bf16 rounded to the nearest (ties to even) by its bits: the same result
    compiled and in the interpreter (whose cast truncates)."""
    bits = y.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _dequantize_kernel(x_ptr, descale_ptr, cu_ptr, y_ptr, n_rows, H, B, steps,
                       stride_xt, stride_xh,
                       D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    """y[token, h] = x[token, h] * descale[b(token), h] for BLOCK_R (token, head) rows;
    tokens outside every sequence get 0. y is contiguous [N, H, D]."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = r < n_rows
    token = r // H
    h = r % H
    b = sequence_of(token, cu_ptr, B, steps)
    inside = live & (b < B) & (token >= tl.load(cu_ptr))
    scale = tl.load(descale_ptr + tl.minimum(b, B - 1) * H + h, mask=inside, other=0.0)
    d = tl.arange(0, BLOCK_D)
    cols = (d < D)[None, :]
    src = x_ptr + token.to(tl.int64)[:, None] * stride_xt + (h * stride_xh)[:, None] + d[None, :]
    x = tl.load(src, mask=inside[:, None] & cols, other=0.0).to(tl.float32)
    # x * 0 is NaN for a NaN code: rows outside the sequences are zero whatever they hold
    y = tl.where(inside[:, None], x * scale[:, None], 0.0)
    dst = y_ptr + r.to(tl.int64)[:, None] * D + d[None, :]
    tl.store(dst, _bf16_nearest(y), mask=live[:, None] & cols)


def dequantize_rows(x: torch.Tensor, descale: torch.Tensor,
                    cu_seqlens: torch.Tensor) -> torch.Tensor:
    """x e4m3 [N, H_kv, D], descale fp32 [B, H_kv], cu_seqlens int32 [B + 1] -> bf16
    [N, H_kv, D] = x * descale[b(row), h]; rows outside every sequence are 0."""
    N, H, D = x.shape
    B = cu_seqlens.shape[0] - 1
    y = torch.empty(N, H, D, dtype=torch.bfloat16, device=x.device)
    if N * H * D == 0:
        return y
    if B <= 0:
        return y.zero_()
    if x.stride(2) != 1:
        x = x.contiguous()
    n_rows = N * H
    grid = (cdiv(n_rows, BLOCK_ROWS),)
    fast(_dequantize_kernel)[grid](x, descale, cu_seqlens, y, n_rows, H, B, B.bit_length(),
                             x.stride(0), x.stride(1), D=D,
                             BLOCK_D=next_pow2(D), BLOCK_R=BLOCK_ROWS)
    return y
