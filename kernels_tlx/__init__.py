"""Triton + TLX jagged flash attention.

`jagged_attention` (see harness.api for the signature) runs the warp-specialized
persistent Hopper forward (`fwd_hopper`) and the persistent Hopper backward
(`bwd_hopper`).
`available()` says whether this machine can run it. Importing this package makes no
driver call.
"""
from __future__ import annotations

from harness.api import make_jagged_attention


def _forward(*args):
    from . import fwd_hopper
    return fwd_hopper.forward(*args)


def _backward(*args):
    from . import bwd_hopper
    return bwd_hopper.backward(*args)


def available() -> tuple[bool, str]:
    """(True, "") when the TLX Hopper forward can run here, else (False, why not)."""
    try:
        import torch
    except Exception as e:  # pragma: no cover
        return False, f"torch not importable: {e}"
    if not torch.cuda.is_available():
        return False, "needs a CUDA GPU"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return False, f"needs compute capability 9.x (Hopper), found {major}.{minor}"
    try:
        import triton.language.extra.tlx  # noqa: F401
    except Exception as e:
        return False, f"TLX (triton-utlx) not importable: {e}"
    return True, ""


jagged_attention = make_jagged_attention("tlx", _forward, _backward)

__all__ = ["jagged_attention", "available"]
