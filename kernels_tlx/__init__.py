"""Triton + TLX jagged flash attention.

`jagged_attention` (see jagged.api for the signature) runs the warp-specialized
persistent Hopper forward (`fwd_hopper`) and the persistent Hopper backward
(`bwd_hopper`).
`available()` says whether this machine can run it. Importing this package makes no
driver call.
"""
from __future__ import annotations

from jagged.api import hopper_available, make_jagged_attention


def _forward(*args):
    from . import fwd_hopper
    return fwd_hopper.forward(*args)


def _backward(*args, **kw):
    from . import bwd_hopper
    return bwd_hopper.backward(*args, **kw)


def available() -> tuple[bool, str]:
    """(True, "") when the TLX Hopper kernels can run here, else (False, why not)."""
    return hopper_available("triton.language.extra.tlx", "TLX (triton-utlx)")


jagged_attention = make_jagged_attention("tlx", _forward, _backward)

__all__ = ["jagged_attention", "available"]
