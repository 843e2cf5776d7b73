"""The offsets check inside the forward tile-list kernels (jagged.tiles `check=`), which
the TLX and CuteDSL forwards run instead of jagged.validate's own kernel: in the
interpreter, good offsets give the same lists as an unchecked build, each kind of bad
offsets fails with the message naming the argument, and the CuteDSL host checks on its
early-return paths too. On the GPU: tests/test_gpu_core.py::test_bad_offsets_fail_on_device."""
import pytest
import torch

from _interp import interp, interpreter_asserts
from jagged.tiles import fwd_tiles, window_tiles

pytestmark = interp

I32 = dict(dtype=torch.int32)
CU_Q, CU_K = [0, 5, 5, 13, 20], [0, 7, 9, 9, 30]
GOOD = dict(n_q=20, n_k=30, max_q=8, max_k=21)
# (what to change, the device message); a per_offsets build is cached by tensor identity,
# so each call gets fresh tensors
BAD = [
    (dict(cu_k=[0, 7, 5, 9, 30]), "cu_seqlens_k must not decrease"),
    (dict(cu_k=[1, 7, 9, 9, 30]), "cu_seqlens_k must start at 0"),
    (dict(n_k=31), "cu_seqlens_k must end at k.shape[0]"),
    (dict(max_k=20), "max_seqlen_k is smaller than a length in cu_seqlens_k"),
    (dict(cu_q=[0, 5, 4, 13, 20]), "cu_seqlens_q must not decrease"),
    (dict(n_q=19), "cu_seqlens_q must end at q.shape[0]"),
    (dict(max_q=7), "max_seqlen_q is smaller than a length in cu_seqlens_q"),
]


def build(kind, cu_q=CU_Q, cu_k=CU_K, check=True, **over):
    g = dict(GOOD, **over)
    cq, ck = torch.tensor(cu_q, **I32), torch.tensor(cu_k, **I32)
    chk = (g["n_q"], g["n_k"], g["max_q"], g["max_k"]) if check else None
    if kind == "pairs":
        return fwd_tiles(cq, ck, 4, g["max_q"], None, 128, 64, True, chk)
    return window_tiles(cq, ck, g["n_q"], g["max_q"], 128, 64, chk)


@pytest.mark.parametrize("kind", ["pairs", "windows"])
def test_checked_build_equals_unchecked(kind):
    with interpreter_asserts():
        got = build(kind)
    want = build(kind, check=False)
    for a, b in zip(got, want):
        assert (a == b) if isinstance(a, int) else torch.equal(a, b)


@pytest.mark.parametrize("kind", ["pairs", "windows"])
@pytest.mark.parametrize("over, msg", BAD)
def test_bad_offsets_fail_in_the_tile_kernel(kind, over, msg):
    from triton.runtime.errors import InterpreterError
    with interpreter_asserts(), pytest.raises(InterpreterError, match=msg.replace("[", r"\[")):
        build(kind, **over)


def test_broadcast_q_build_checks_the_key_offsets_only():
    from triton.runtime.errors import InterpreterError
    ck = torch.tensor(CU_K, **I32)
    with interpreter_asserts():
        fwd_tiles(None, ck, 4, 16, 16, 128, 64, False, (16, 30, 16, 21))
        with pytest.raises(InterpreterError, match="max_seqlen_k is smaller"):
            fwd_tiles(None, ck.clone(), 4, 16, 16, 128, 64, False, (16, 30, 16, 20))


@pytest.mark.parametrize("n_k", [30, 0])
def test_cute_host_checks_before_its_kernel(n_k):
    """host.forward with bad key offsets fails in its tile kernel before the kernel (a
    recorder) is called; with no keys at all (no tile list) the check runs alone."""
    from triton.runtime.errors import InterpreterError
    from kernels_cute import fwd_hopper as F
    from kernels_cute import host

    calls = []
    kern = host.FwdKernels(F.pick_config, lambda *key: lambda *a: calls.append(a),
                           lambda cfg, n, dev: n, fp8=True, takes_windows=F.takes_windows,
                           window_config=F.window_config, pack_gqa=True)
    q = torch.zeros(20, 2, 64, dtype=torch.bfloat16)
    k = torch.zeros(n_k, 2, 64, dtype=torch.bfloat16)
    cu_k = [0, 7, 5, 9, 30] if n_k else [0, 0, 0, 0, 1]
    with interpreter_asserts(), pytest.raises(InterpreterError, match="cu_seqlens_k"):
        host.forward(kern, q, k, k, torch.tensor(CU_Q, **I32), torch.tensor(cu_k, **I32),
                     8, 21, False, 0.125, False)
    assert not calls


def test_api_leaves_the_check_to_a_checking_forward():
    """make_jagged_attention(checks_offsets=True) queues no check kernel of its own: the
    style's forward gets the offsets as given (here bad ones, which jagged.validate's
    kernel would reject)."""
    from jagged.api import make_jagged_attention
    seen = []

    def fwd(q, k, v, cu_q, cu_k, *rest):
        seen.append(cu_k.tolist())
        return torch.zeros_like(q), torch.zeros(q.shape[1], q.shape[0])

    attn = make_jagged_attention("tile_check_test", fwd, None, checks_offsets=True)
    q = torch.zeros(20, 2, 64, dtype=torch.bfloat16)
    k = torch.zeros(30, 2, 64, dtype=torch.bfloat16)
    with interpreter_asserts():
        attn(q, k, k, torch.tensor(CU_Q, **I32), torch.tensor([0, 7, 5, 9, 30], **I32), 8, 21)
    assert seen == [[0, 7, 5, 9, 30]]
