"""Which kernel style runs where, and which of its kernels. The core imports neither
style: it finds them by module name, lazily, so importing the core touches no DSL and
no driver.

A style has kernels per architecture (`fwd_<arch>`, `bwd_<arch>` in its package):
"hopper" on compute capability 9.x, "blackwell" on 10.x (tcgen05 and tensor memory:
data-center Blackwell; consumer Blackwell, 12.x, has neither and gets the portable
kernel). `kernel_arch(device)` says which a device gets.

`backend="auto"` takes the first style of `AUTO_ORDER` that runs on the device (for fp8
inputs: the first that also has an fp8 forward there, `FP8_ARCHS`). On
Hopper CuteDSL comes first: on the H200 sweeps it is 1.11x / 1.10x TLX (geometric mean,
forward / backward) on gem-jagged, 1.12x / 1.02x on broadcast-Q and 1.00x on llm-dense
(reports/h200/results.csv). For fp8 inputs the same order stands: at llm-dense B4
H32/8 CuteDSL's fp8 forward is within 2-4 % of TLX's, measured in two runs. On Blackwell the
same order stands, unmeasured: those kernels are compiled and model-checked, not yet
run on a B200.
"""
from __future__ import annotations

import importlib
import sys
import warnings

import torch

# capability major -> the architecture of the kernels that run there
ARCHS = {9: "hopper", 10: "blackwell"}

# name -> (module with `jagged_attention` and `available()`, what it needs, the
# architectures it has kernels for; None: every device, the CPU interpreter included)
STYLES = {
    "cute": ("kernels_cute", "CuteDSL (nvidia-cutlass-dsl)", ("hopper", "blackwell")),
    "tlx": ("kernels_tlx", "Triton + TLX (triton-utlx)", ("hopper", "blackwell")),
    "portable": ("jagged.portable", "Triton", None),
}
AUTO_ORDER = ("cute", "tlx")
# name -> the architectures it has an fp8 (e4m3) forward for (None: every device); a
# style not named has none and raises NotImplementedError on fp8 inputs
FP8_ARCHS = {"cute": ("hopper",), "tlx": ("hopper",), "portable": None}


def kernel_arch(device=None) -> str | None:
    """The architecture whose kernels run on CUDA device `device` (default: the current
    one): "hopper" (9.x), "blackwell" (10.x), or None (no CUDA GPU, or another
    capability: only the portable kernel runs there). Asks the driver."""
    if not torch.cuda.is_available():
        return None
    return ARCHS.get(torch.cuda.get_device_capability(device)[0])


def _needs(archs) -> str:
    majors = [f"{m}.x" for m, a in ARCHS.items() if a in archs]
    return f"needs compute capability {' or '.join(majors)}"


def style_available(name: str, device=None, archs=None) -> tuple[bool, str]:
    """(True, "") when style `name` can run on `device` (default: the current CUDA
    device), else (False, why not). `archs`: the architectures the caller needs kernels
    for (default: every one the style has; a caller with Hopper-only kernels passes
    ("hopper",)). Imports the style's module, no kernel compile."""
    if name not in STYLES:
        raise ValueError(f"backend={name!r}: expected 'auto' or one of {sorted(STYLES)}")
    module, what, has = STYLES[name]
    if has is not None:
        archs = has if archs is None else tuple(a for a in has if a in archs)
        if not torch.cuda.is_available():
            return False, "needs a CUDA GPU"
        major, minor = torch.cuda.get_device_capability(device)
        if ARCHS.get(major) not in archs:
            return False, f"{_needs(archs)}, found {major}.{minor}"
    try:
        importlib.import_module(module)
    except Exception as e:  # a missing or broken package: say which
        return False, f"{what} not importable: {type(e).__name__}: {e}"
    return True, ""


def style_arch(name: str, device=None) -> str | None:
    """The architecture of the kernels style `name` runs on `device` ("hopper" or
    "blackwell"), None where it does not run; the portable style: "portable"."""
    if STYLES[name][2] is None:
        return "portable"
    return kernel_arch(device) if style_available(name, device)[0] else None


def style_fp8(name: str, device=None) -> tuple[bool, str]:
    """(True, "") when style `name` has an fp8 forward for `device`'s architecture,
    else (False, why not). Asks the driver only for a style with per-arch kernels."""
    if name not in FP8_ARCHS:
        return False, "no fp8 forward"
    archs = FP8_ARCHS[name]
    if archs is None or kernel_arch(device) in archs:
        return True, ""
    return False, f"fp8 kernels for {', '.join(archs)} only"


def available(device=None) -> dict[str, tuple[bool, str]]:
    """{style: (runs here, why not)} for every style (`style_arch` says which kernels)."""
    return {name: style_available(name, device) for name in STYLES}


def constant_result(fn):
    """torch.compiler.assume_constant_result (torch.compile folds fn's result into the
    graph), without importing torch._dynamo at import time (about 1.2 s of every `import
    jagged`): that decorator only marks the function, as this does until dynamo is
    loaded (tests/test_dispatch.py compares the two)."""
    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(fn)
    fn._dynamo_marked_constant = True
    return fn


_CHOSEN: dict = {}
_FNS: dict = {}  # style -> its jagged_attention, filled by resolve (traceable lookups)
_KERNELS: dict = {}  # (style, "fwd" | "bwd", device index) -> the kernel module


@constant_result
def resolve(backend: str, device_index: int, fp8: bool = False) -> str:
    """The style `backend` names on CUDA device `device_index` (-1: the CPU). "auto"
    takes the first of AUTO_ORDER that runs there (with `fp8`: and has an fp8 forward
    there), else the portable kernel with a warning (once per device) naming why; a
    named style that cannot run raises (one without fp8 raises when called)."""
    key = (backend, device_index, fp8)
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
            if ok and fp8:
                ok, why = style_fp8(cand, device)
            if ok:
                name = cand
                break
            whys.append(f"{cand}: {why}")
        else:
            name = "portable"
            what = " for fp8 inputs" if fp8 else ""
            warnings.warn(f"jagged_attention(backend='auto'){what} runs the portable Triton "
                          "kernel: " + "; ".join(whys), RuntimeWarning, stacklevel=3)
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


def style_kernels(name: str, role: str, device: torch.device):
    """Style `name`'s `role` ("fwd" or "bwd") module for `device`'s architecture:
    `<package>.<role>_<arch>`, looked up once per device. A device it has no kernels
    for raises, saying why."""
    key = (name, role, device.index)
    mod = _KERNELS.get(key)
    if mod is None:
        ok, why = style_available(name, device.index) if device.type == "cuda" else \
            (False, f"needs CUDA tensors, got {device.type}")
        if not ok:
            raise RuntimeError(f"{STYLES[name][0]} cannot run on {device}: {why}")
        arch = kernel_arch(device.index)
        mod = _KERNELS[key] = importlib.import_module(f"{STYLES[name][0]}.{role}_{arch}")
    return mod


def style_calls(name: str):
    """(forward, backward) of style `name`, what its package hands `make_jagged_attention`:
    the kernels of the device's architecture; fp8 inputs (`descale`, passed only for fp8
    calls) where FP8_ARCHS has kernels for it, else NotImplementedError."""
    def forward(q, *args, **descale):
        if descale:
            ok, why = style_fp8(name, q.device.index)
            if not ok:
                raise NotImplementedError(f"fp8 inputs: the {name} style has {why}; use "
                                          "backend='portable'")
        return style_kernels(name, "fwd", q.device).forward(q, *args, **descale)

    def backward(dout, *args, **kw):
        return style_kernels(name, "bwd", dout.device).backward(dout, *args, **kw)
    return forward, backward
