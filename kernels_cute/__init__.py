"""CuteDSL jagged flash attention.

`jagged_attention` (the signature is `jagged.jagged_attention`'s, without `backend`)
runs the warp-specialized persistent Hopper forward (`fwd_hopper`) and backward
(`bwd_hopper`). `available()` says whether this machine can run it. Importing this
package makes no driver call and does not import the DSL.
"""
from __future__ import annotations

from jagged.api import make_jagged_attention
from jagged.dispatch import style_available


def _forward(*args):
    from . import fwd_hopper
    return fwd_hopper.forward(*args)


def _backward(*args, **kw):
    from . import bwd_hopper
    return bwd_hopper.backward(*args, **kw)


def available() -> tuple[bool, str]:
    """(True, "") when the CuteDSL Hopper kernels can run here, else (False, why not)."""
    return style_available("cute")


jagged_attention = make_jagged_attention("cute", _forward, _backward)

__all__ = ["jagged_attention", "available"]
