"""kernels_tlx.launch.fast: one launcher per kernel (its compiled-kernel cache must
outlive the call that made it), and the interpreter's functions launched as they are."""
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from kernels_tlx.launch import fast


@triton.jit
def _k(x_ptr, BLOCK: tl.constexpr):
    pass


def test_fast_is_one_launcher_per_kernel():
    f = fast(_k)
    assert fast(_k) is f
    if isinstance(_k, JITFunction):
        assert f is not _k and f.fn is _k and f.kernels == {}
    else:  # TRITON_INTERPRET=1: no compiled kernel to call directly
        assert f is _k


def test_no_hook_by_default_and_a_hook_is_seen():
    """The fast path's guard: until session 11 it compared Triton 3.8's (empty) hook chain
    with None, so the fast path never ran."""
    from types import SimpleNamespace

    from triton import knobs

    from kernels_tlx.launch import hooked
    assert not hooked(knobs.runtime)
    assert not hooked(SimpleNamespace(launch_enter_hook=None))
    assert hooked(SimpleNamespace(launch_enter_hook=print))
    chain = type(knobs.runtime.launch_enter_hook)
    if chain is not type(None):
        c = chain()
        assert not hooked(SimpleNamespace(launch_enter_hook=c))
        c.add(print)
        assert hooked(SimpleNamespace(launch_enter_hook=c))
