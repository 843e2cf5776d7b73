"""CuteDSL jagged flash attention.

`jagged_attention` (see harness.api for the signature) runs the warp-specialized
persistent Hopper forward (`fwd_hopper`, CuteDSL) and, by default, the portable Triton
kernel's backward. JAGGED_CUTE_BWD=hopper opts in to the CuteDSL Hopper backward
(`bwd_hopper`; compiled for sm_90a on a CPU, not yet run on a GPU). `available()` says
whether this machine can run it. Importing this package makes no driver call and does
not import the DSL.
"""
from __future__ import annotations

import os

from harness.api import make_jagged_attention


def _forward(*args):
    from . import fwd_hopper
    return fwd_hopper.forward(*args)


def _backward(*args):
    if os.environ.get("JAGGED_CUTE_BWD", "portable") == "hopper":  # opt-in, read per call
        from . import bwd_hopper
        return bwd_hopper.backward(*args)
    from kernels_tlx import portable  # the portable Triton backward (default)
    return portable.bwd(*args)


def available() -> tuple[bool, str]:
    """(True, "") when the CuteDSL Hopper forward can run here, else (False, why not)."""
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
        import cutlass.cute  # noqa: F401
    except Exception as e:
        return False, f"CuteDSL (nvidia-cutlass-dsl) not importable: {type(e).__name__}: {e}"
    return True, ""


jagged_attention = make_jagged_attention("cute", _forward, _backward)

__all__ = ["jagged_attention", "available"]
