"""CuteDSL jagged flash attention.

`jagged_attention` (see jagged.api for the signature) runs the warp-specialized
persistent Hopper forward (`fwd_hopper`) and backward (`bwd_hopper`), both CuteDSL
(H200, session 3: 100/100 matrix problems forward and backward).
JAGGED_CUTE_BWD=portable runs the portable Triton kernel's backward instead (faster on
gem-jagged today, see PERF.md). `available()` says whether this machine can run it. Importing this package makes no driver call and does
not import the DSL.
"""
from __future__ import annotations

import os

from jagged.api import hopper_available, make_jagged_attention


def _forward(*args):
    from . import fwd_hopper
    return fwd_hopper.forward(*args)


def _backward(*args, **kw):
    if os.environ.get("JAGGED_CUTE_BWD", "hopper") == "portable":  # opt-out, read per call
        from jagged import portable
        return portable.bwd(*args, **kw)
    from . import bwd_hopper
    return bwd_hopper.backward(*args, **kw)


def available() -> tuple[bool, str]:
    """(True, "") when the CuteDSL Hopper kernels can run here, else (False, why not)."""
    return hopper_available("cutlass.cute", "CuteDSL (nvidia-cutlass-dsl)")


jagged_attention = make_jagged_attention("cute", _forward, _backward)

__all__ = ["jagged_attention", "available"]
