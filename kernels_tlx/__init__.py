"""Triton + TLX jagged flash attention.

`jagged_attention` (the signature is `jagged.jagged_attention`'s, without `backend`)
runs the warp-specialized persistent kernels of the device's architecture: on compute
capability 9.x the Hopper forward and backward (`fwd_hopper`, `bwd_hopper`), on 10.x
the Blackwell ones (`fwd_blackwell`, `bwd_blackwell`: compiled and model-checked, not
yet run on a B200). `available()` says whether this machine can run it and
`kernel_arch()` which kernels it runs. Importing this package makes no driver call.
fp8 inputs (forward only) run on the Hopper forward (`jagged.dispatch.FP8_ARCHS`).
"""
from __future__ import annotations

from jagged.api import make_jagged_attention
from jagged.dispatch import style_arch, style_available, style_calls

_forward, _backward = style_calls("tlx")


def available(device=None) -> tuple[bool, str]:
    """(True, "") when the TLX kernels can run on `device` (default: the current CUDA
    device), else (False, why not)."""
    return style_available("tlx", device)


def kernel_arch(device=None) -> str | None:
    """"hopper" or "blackwell": the kernels `jagged_attention` runs on `device`; None
    where it does not run."""
    return style_arch("tlx", device)


# the forwards check the offsets in their tile-list kernel (jagged.tiles `check=`)
jagged_attention = make_jagged_attention("tlx", _forward, _backward, checks_offsets=True)

__all__ = ["jagged_attention", "available", "kernel_arch"]
