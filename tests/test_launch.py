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
