"""Quantizing the harness's fp8 problems: e4m3 values with a descale per (sequence, KV
head), descale = amax / 448, as FA's fp8 entries take them (decode caches and q; the
jagged suites' q, k, v)."""
from __future__ import annotations

import torch

from jagged.fp8 import FP8

FP8_MAX = 448.0  # the largest e4m3 value: a descale maps amax onto it


def quantize(x: torch.Tensor, owner: torch.Tensor, batch: int) -> tuple:
    """x [units, rows, H_kv, cols] (a cache's pages or sequences, or q's rows with a KV
    head's query heads side by side) -> (e4m3 x / descale, descale fp32 [batch, H_kv]),
    descale = amax / 448 over the units `owner` gives each sequence (a sequence with
    nothing: 1). A unit no sequence owns (owner -1) is scaled by its own amax. In
    slices, so a cache of tens of GB needs little more than its e4m3 copy."""
    U, Hkv = x.shape[0], x.shape[2]
    step = max(1, (1 << 28) // max(1, x[:1].numel()))
    amax = torch.zeros(U, Hkv, device=x.device, dtype=torch.float32)
    for i in range(0, U, step):
        amax[i:i + step] = x[i:i + step].abs().amax(dim=(1, 3)).float()
    owned = owner >= 0
    seq = torch.zeros(batch, Hkv, device=x.device, dtype=torch.float32)
    seq.scatter_reduce_(0, owner[owned][:, None].expand(-1, Hkv), amax[owned], "amax")
    descale = torch.where(seq > 0, seq / FP8_MAX, 1.0).contiguous()
    own = torch.where(amax > 0, amax / FP8_MAX, 1.0)
    unit = torch.where(owned[:, None], descale[owner.clamp(min=0)], own)
    out = torch.empty(x.shape, device=x.device, dtype=FP8)
    for i in range(0, U, step):
        y = x[i:i + step].float() / unit[i:i + step, None, :, None]
        out[i:i + step] = y.clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    return out, descale
