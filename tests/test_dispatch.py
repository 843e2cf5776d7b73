"""Dispatch by compute capability, on the CPU with a mocked device: 9.x runs each style's
Hopper kernels, 10.x its Blackwell ones, anything else (8.x, consumer Blackwell 12.x)
the portable kernel under "auto" with one warning naming why, and a named style there
raises. Importing the packages makes no driver call."""
import importlib
import inspect
import subprocess
import sys
import textwrap
import types
import warnings

import pytest
import torch

import jagged
import kernels_tlx
from _capability import STYLE_PKGS, device  # noqa: F401  (a fixture)
from _cute import ROOT
from jagged import dispatch
from jagged.validate import HEAD_DIMS

CUDA0 = torch.device("cuda", 0)


def _routes(monkeypatch, style, arch):
    """The style's forward and backward, called as jagged.api calls them, reach the
    `arch` kernels' forward / backward."""
    pkg = STYLE_PKGS[style]
    seen = []
    for role, fn in (("fwd", "forward"), ("bwd", "backward")):
        mod = importlib.import_module(f"{pkg.__name__}.{role}_{arch}")
        monkeypatch.setattr(mod, fn, lambda *a, _r=role, **k: seen.append(_r) or _r)
    q = types.SimpleNamespace(device=CUDA0)
    assert pkg._forward(q, None, None) == "fwd"
    assert pkg._backward(q, None, dlse=None) == "bwd"
    return seen == ["fwd", "bwd"]


@pytest.mark.parametrize("cap,arch", [((9, 0), "hopper"), ((10, 0), "blackwell"),
                                      ((10, 3), "blackwell")])
def test_capability_picks_the_kernels(device, monkeypatch, cap, arch):
    device(*cap)
    assert jagged.kernel_arch(0) == arch
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dispatch.resolve("auto", 0) == "cute"
        assert jagged.available(0)["tlx"] == (True, "")
    for style, pkg in STYLE_PKGS.items():
        assert pkg.available(0) == (True, "") and pkg.kernel_arch(0) == arch
        assert dispatch.resolve(style, 0) == style
        for role in ("fwd", "bwd"):
            mod = dispatch.style_kernels(style, role, CUDA0)
            assert mod.__name__ == f"{pkg.__name__}.{role}_{arch}"
        assert _routes(monkeypatch, style, arch)
    assert dispatch.style_arch("portable", 0) == "portable"


@pytest.mark.parametrize("cap", [(8, 0), (8, 9), (12, 0), (12, 1), (7, 5)])
def test_other_capabilities_run_the_portable_kernel(device, cap):
    """Consumer Blackwell (12.x) has no tcgen05 / TMEM: not the sm_100a kernels."""
    device(*cap)
    found = f"found {cap[0]}.{cap[1]}"
    why = f"needs compute capability 9.x or 10.x, {found}"
    assert jagged.kernel_arch(0) is None
    with pytest.warns(RuntimeWarning) as rec:
        assert dispatch.resolve("auto", 0) == "portable"
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert "runs the portable Triton kernel" in msg and f"cute: {why}" in msg \
        and f"tlx: {why}" in msg, msg
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dispatch.resolve("auto", 0) == "portable"  # once per device
    for style, pkg in STYLE_PKGS.items():
        assert pkg.available(0) == (False, why) and pkg.kernel_arch(0) is None
        with pytest.raises(RuntimeError, match=f"backend='{style}' cannot run here: {why}"):
            dispatch.resolve(style, 0)
        with pytest.raises(RuntimeError, match=f"{pkg.__name__} cannot run on cuda:0: {why}"):
            dispatch.style_kernels(style, "fwd", CUDA0)
    assert dispatch.resolve("portable", 0) == "portable"


def test_without_a_gpu(device, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert jagged.kernel_arch() is None
    assert kernels_tlx.available() == (False, "needs a CUDA GPU")
    with pytest.raises(RuntimeError, match="kernels_cute cannot run on cpu: needs CUDA tensors"):
        dispatch.style_kernels("cute", "bwd", torch.device("cpu"))


def test_a_caller_with_hopper_kernels_only(device):
    """archs=("hopper",) (the KV-cache's decode kernels): 10.x is refused, saying why."""
    device(10, 0)
    assert dispatch.style_available("cute", 0, archs=("hopper",)) == \
        (False, "needs compute capability 9.x, found 10.0")
    device(9, 0)
    assert dispatch.style_available("tlx", 0, archs=("hopper",)) == (True, "")


@pytest.mark.parametrize("style", sorted(STYLE_PKGS))
def test_every_arch_has_both_kernels_and_every_mode(style):
    """Each architecture a style lists has a forward and a backward with the Hopper
    host signatures (jagged.api's contract; an architecture with an fp8 forward takes
    `descale` last), and config defaults for every head dim the
    API accepts, causal or not (dtypes, GQA, broadcast-Q and lse are runtime or
    compile-time arguments of every build: tests/test_*_blackwell_*.py compile them)."""
    pkg = STYLE_PKGS[style].__name__
    archs = dispatch.STYLES[style][2]
    assert set(archs) == set(dispatch.ARCHS.values())
    ref = {}
    for arch in archs:
        fwd = importlib.import_module(f"{pkg}.fwd_{arch}")
        bwd = importlib.import_module(f"{pkg}.bwd_{arch}")
        fwd_sig = inspect.signature(fwd.forward)
        if arch in (dispatch.FP8_ARCHS.get(style) or ()):  # an fp8 forward: the descales too
            assert list(fwd_sig.parameters)[-1] == "descale", (arch, fwd_sig)
            fwd_sig = fwd_sig.replace(parameters=list(fwd_sig.parameters.values())[:-1])
        sig = (fwd_sig, inspect.signature(bwd.backward))
        assert ref.setdefault("sig", sig) == sig, (arch, sig)
        for d in HEAD_DIMS:
            for causal in (False, True):
                for max_k, mean_k in ((64, 40.0), (8192, 5000.0)):
                    fwd.pick_config(d, max_k, causal, mean_k)
            if arch == "blackwell":
                bwd.pick_config(d)


@pytest.mark.parametrize("style", sorted(STYLE_PKGS))
def test_blackwell_forward_refuses_other_dtypes(style):
    """An element type the Blackwell kernels are not built for (fp8) is an error naming
    it, never a launch."""
    fwd = importlib.import_module(f"{STYLE_PKGS[style].__name__}.fwd_blackwell")
    q = torch.zeros(4, 2, 64).to(torch.float8_e4m3fn)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(TypeError, match="Blackwell forward takes bf16 or fp16, got "
                                        "torch.float8_e4m3fn"):
        fwd.forward(q, q, q, cu, cu, 4, 4, False, 0.125, False)


def test_import_makes_no_driver_call():
    """Importing the core and both styles asks the driver nothing and imports no DSL."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        import torch

        def boom(*a, **k):
            raise AssertionError("driver call at import")
        for name in ("is_available", "get_device_capability", "get_device_properties",
                     "device_count", "current_device", "init", "_lazy_init"):
            setattr(torch.cuda, name, boom)
        import jagged, kernels_tlx, kernels_cute
        assert "cutlass" not in sys.modules
        print("IMPORTED")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert "IMPORTED" in r.stdout, (r.stdout + r.stderr)[-3000:]


def test_import_leaves_dynamo_out_and_marks_as_dynamo_does():
    """`import jagged` does not load torch._dynamo (seconds), and `constant_result` marks a
    function exactly as torch.compiler.assume_constant_result does (compared once dynamo
    is loaded, on this torch)."""
    code = textwrap.dedent("""
        import sys
        import jagged
        from jagged.dispatch import constant_result
        assert "torch._dynamo" not in sys.modules, "import jagged loaded torch._dynamo"
        def ours(): return 1
        def theirs(): return 1
        constant_result(ours)
        import torch
        torch.compiler.assume_constant_result(theirs)
        assert vars(ours) == vars(theirs) and vars(ours), (vars(ours), vars(theirs))
        print("PASSED")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert "PASSED" in r.stdout, (r.stdout + r.stderr)[-2000:]
