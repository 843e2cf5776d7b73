"""Which kernel style runs where. The core imports neither style: it finds them by
module name, lazily, so importing the core touches no DSL and no driver.

`backend="auto"` takes the first style of `AUTO_ORDER` that runs on the device. On
Hopper CuteDSL comes first: on the H200 sweep it is 1.15x TLX (geometric mean) on the
gem-jagged forward, 1.12x on broadcast-Q, 1.01x on llm-dense, and 1.00-1.03x on the
backward suites (reports/h200/results.csv).
"""
from __future__ import annotations

import importlib
import warnings

import torch

# name -> (module with `jagged_attention` and `available()`, what it needs, capability majors)
STYLES = {
    "cute": ("kernels_cute", "CuteDSL (nvidia-cutlass-dsl)", (9,)),
    "tlx": ("kernels_tlx", "Triton + TLX (triton-utlx)", (9,)),
    "portable": ("jagged.portable", "Triton", None),
}
AUTO_ORDER = ("cute", "tlx")


def style_available(name: str, device=None) -> tuple[bool, str]:
    """(True, "") when style `name` can run on `device` (default: the current CUDA
    device), else (False, why not). Imports the style's module, no kernel compile."""
    if name not in STYLES:
        raise ValueError(f"backend={name!r}: expected 'auto' or one of {sorted(STYLES)}")
    module, what, majors = STYLES[name]
    if majors is not None:
        if not torch.cuda.is_available():
            return False, "needs a CUDA GPU"
        major, minor = torch.cuda.get_device_capability(device)
        if major not in majors:
            return False, (f"needs compute capability {' or '.join(f'{m}.x' for m in majors)}, "
                           f"found {major}.{minor}")
    try:
        importlib.import_module(module)
    except Exception as e:  # a missing or broken package: say which
        return False, f"{what} not importable: {type(e).__name__}: {e}"
    return True, ""


def available(device=None) -> dict[str, tuple[bool, str]]:
    """{style: (runs here, why not)} for every style."""
    return {name: style_available(name, device) for name in STYLES}


_CHOSEN: dict = {}
_FNS: dict = {}  # style -> its jagged_attention, filled by resolve (traceable lookups)


@torch.compiler.assume_constant_result
def resolve(backend: str, device_index: int) -> str:
    """The style `backend` names on CUDA device `device_index` (-1: the CPU). "auto"
    takes the first of AUTO_ORDER that runs there, else the portable kernel with a
    warning (once per device) naming why; a named style that cannot run raises."""
    key = (backend, device_index)
    hit = _CHOSEN.get(key)
    if hit is not None:
        return hit
    device = None if device_index < 0 else device_index
    if backend != "auto":
        ok, why = (True, "") if device is None and backend == "portable" else \
            style_available(backend, device)
        if not ok:
            raise RuntimeError(f"backend={backend!r} cannot run here: {why}")
        name = backend
    else:
        whys = []
        for cand in AUTO_ORDER:
            ok, why = style_available(cand, device) if device is not None else (False, "CPU tensors")
            if ok:
                name = cand
                break
            whys.append(f"{cand}: {why}")
        else:
            name = "portable"
            warnings.warn("jagged_attention(backend='auto') runs the portable Triton kernel: "
                          + "; ".join(whys), RuntimeWarning, stacklevel=3)
    style_fn(name)
    _CHOSEN[key] = name
    return name


def style_fn(name: str):
    """The `jagged_attention` of style `name` (a dict lookup once resolved, so that
    torch.compile traces the call without an import)."""
    fn = _FNS.get(name)
    if fn is None:
        fn = _FNS[name] = importlib.import_module(STYLES[name][0]).jagged_attention
    return fn
