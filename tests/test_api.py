"""Input validation of the public op (each bad input names its argument), the two
levels of the offsets check, backend dispatch, and tracing through the op with
torch.library.opcheck / torch.compile."""
import warnings

import pytest
import torch

from harness.problems import Problem
from jagged.portable import jagged_attention
from _interp import interpreter_asserts


@pytest.fixture
def inp():
    return Problem(batch=3, heads=2, head_dim=64, max_seqlen_q=8).build(lengths=([5, 0, 8],) * 2)


@pytest.fixture
def bq():
    return Problem(batch=2, heads=2, head_dim=64, max_seqlen_q=4, max_seqlen_k=6,
                   mode="broadcast_q").build(lengths=([4, 4], [6, 3]))


def call(inp, **over):
    a = dict(q=inp.q, k=inp.k, v=inp.v, cu_seqlens_q=inp.cu_seqlens_q,
             cu_seqlens_k=inp.cu_seqlens_k, max_seqlen_q=inp.max_seqlen_q,
             max_seqlen_k=inp.max_seqlen_k)
    kw = {k: over.pop(k) for k in ("causal", "broadcast_q", "check_offsets", "softmax_scale")
          if k in over}
    a.update(over)
    return jagged_attention(*a.values(), **kw)


def test_valid_input_runs(inp):
    assert call(inp).shape == inp.q.shape


# offsets with bad values: (override, the synchronous check's message, the device check's)
BAD_OFFSETS = [
    (dict(cu_seqlens_k=[0, 5, 3, 13]), "cu_seqlens_k is not monotonic", "cu_seqlens_k must not decrease"),
    (dict(cu_seqlens_q=[0, 5, 5, 12]), "cu_seqlens_q ends at 12", "cu_seqlens_q must end at q.shape[0]"),
    (dict(cu_seqlens_q=[1, 5, 5, 13]), "cu_seqlens_q must start at 0", "cu_seqlens_q must start at 0"),
    (dict(max_seqlen_q=7), "max_seqlen_q=7 is smaller", "max_seqlen_q is smaller than a length in cu_seqlens_q"),
    (dict(max_seqlen_k=4), "max_seqlen_k=4 is smaller", "max_seqlen_k is smaller than a length in cu_seqlens_k"),
]


def offsets_override(over):
    return {k: torch.tensor(v, dtype=torch.int32) if isinstance(v, list) else v
            for k, v in over.items()}


@pytest.mark.parametrize("over, host_msg, _", BAD_OFFSETS)
def test_bad_offsets_checked_on_host(inp, over, host_msg, _):
    """check_offsets=True: a ValueError naming the argument, before any launch."""
    with pytest.raises(ValueError, match=host_msg.replace("(", r"\(")):
        call(inp, check_offsets=True, **offsets_override(over))


@pytest.mark.parametrize("over, _, device_msg", BAD_OFFSETS)
def test_bad_offsets_checked_on_device(inp, over, _, device_msg):
    """The default path: the device-side assertion names the argument (the interpreter
    raises it as an InterpreterError; on a GPU it is a device-side assert)."""
    from triton.runtime.errors import InterpreterError
    with interpreter_asserts(), pytest.raises(InterpreterError, match=device_msg.replace("[", r"\[")):
        call(inp, **offsets_override(over))


def test_good_offsets_pass_the_device_check(inp, bq):
    with interpreter_asserts():
        assert call(inp, causal=True).shape == inp.q.shape
        assert call(bq, broadcast_q=True).shape == (8, 2, 64)


def test_device_check_is_not_repeated(inp, monkeypatch):
    """Offsets already checked (same tensors, same version) are not checked again; a
    write through torch bumps the version, so they are."""
    from jagged import offsets
    calls = []
    real = offsets._offsets_check_kernel
    monkeypatch.setattr(offsets, "_offsets_check_kernel", type("K", (), {
        "__getitem__": lambda self, grid: (lambda *a, **k: calls.append(1) or real[grid](*a, **k))})())
    cu_q = inp.cu_seqlens_q.clone()
    call(inp, cu_seqlens_q=cu_q)
    call(inp, cu_seqlens_q=cu_q)
    assert len(calls) == 1
    cu_q.add_(0)
    call(inp, cu_seqlens_q=cu_q)
    assert len(calls) == 2


@pytest.mark.parametrize("make, exc, name", [
    (lambda i: dict(q=i.q.float()), TypeError, "q must be bfloat16, float16 or float8_e4m3fn"),
    (lambda i: dict(v=i.v.half()), TypeError, "share one dtype"),
    (lambda i: dict(cu_seqlens_q=i.cu_seqlens_q.long()), TypeError, "cu_seqlens_q must be int32"),
    (lambda i: dict(k=i.k.to("meta")), ValueError, "k is on meta"),
    (lambda i: dict(q=i.q[..., :48].repeat(1, 1, 2).contiguous()), ValueError, "head_dim 96"),
    (lambda i: dict(q=i.q.transpose(0, 1).contiguous().transpose(0, 1)), ValueError,
     "q must be contiguous"),
    (lambda i: dict(max_seqlen_k=2.0), TypeError, "max_seqlen_k must be a non-negative int"),
    (lambda i: dict(q=i.q[:, :1].repeat(1, 3, 1)), ValueError,
     "q heads (3) must be a multiple of k heads (2)"),
    (lambda i: dict(cu_seqlens_k=i.cu_seqlens_k[:3]), ValueError, "the same batch"),
    (lambda i: dict(softmax_scale=-0.125), ValueError, "softmax_scale must be a positive"),
    (lambda i: dict(softmax_scale=float("nan")), ValueError, "softmax_scale must be a positive"),
])
def test_bad_input(inp, make, exc, name):
    """Checked on the host with no device access, whatever check_offsets says."""
    with pytest.raises(exc, match=name.replace("(", r"\(").replace(")", r"\)")):
        call(inp, **make(inp))


def test_dispatch(inp):
    """"auto" on CPU tensors runs the portable kernel and warns once, naming why; a named
    style that cannot run raises; an unknown name is an error."""
    import jagged
    from jagged import dispatch
    dispatch._CHOSEN.clear()
    with pytest.warns(RuntimeWarning, match="portable Triton kernel: cute: CPU tensors"):
        assert jagged.which(inp.q) == "portable"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jagged.which(inp.q) == "portable"  # once
        out = jagged.jagged_attention(inp.q, inp.k, inp.v, inp.cu_seqlens_q, inp.cu_seqlens_k,
                                      inp.max_seqlen_q, inp.max_seqlen_k, backend="portable")
    torch.testing.assert_close(out, call(inp))
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="backend='tlx' cannot run here: needs a CUDA GPU"):
            dispatch.resolve("tlx", 0)
    with pytest.raises(ValueError, match="backend='nope'"):
        dispatch.resolve("nope", -1)
    ok = jagged.available()
    assert set(ok) == {"cute", "tlx", "portable"} and ok["portable"] == (True, "")


def test_broadcast_q_rejects_cu_seqlens_q(bq):
    with pytest.raises(ValueError, match="cu_seqlens_q must be None"):
        call(bq, cu_seqlens_q=torch.tensor([0, 4, 8], dtype=torch.int32), broadcast_q=True)
    with pytest.raises(ValueError, match="max_seqlen_q=3 is smaller than L_q=4"):
        call(bq, max_seqlen_q=3, broadcast_q=True)
    assert call(bq, broadcast_q=True).shape == (8, 2, 64)


def test_opcheck(inp):
    """Schema, fake (meta) kernel and autograd registration of the custom op."""
    args = (inp.q.requires_grad_(), inp.k, inp.v, inp.cu_seqlens_q, inp.cu_seqlens_k,
            inp.max_seqlen_q, inp.max_seqlen_k, True, 0.125, False)
    torch.library.opcheck(torch.ops.jagged_attn.portable_fwd.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_torch_compile_traces(inp):
    """torch.compile (aot_eager: graph capture + autograd, no codegen) through the op."""
    def f(q, k, v):
        return call(inp, q=q, k=k, v=v, causal=True).float().square().sum()

    q1, q2 = (inp.q.clone().requires_grad_() for _ in range(2))
    eager = torch.autograd.grad(f(q1, inp.k, inp.v), q1)[0]
    compiled = torch.autograd.grad(torch.compile(f, backend="aot_eager")(q2, inp.k, inp.v), q2)[0]
    torch.testing.assert_close(compiled, eager)


def test_torch_compile_fullgraph_through_dispatch(inp):
    """The public entry with backend="auto", compiled with fullgraph=True (a graph break
    is an error), forward and backward: equal to eager."""
    import jagged

    def f(q, k, v):
        return jagged.jagged_attention(q, k, v, inp.cu_seqlens_q, inp.cu_seqlens_k,
                                       inp.max_seqlen_q, inp.max_seqlen_k,
                                       causal=True).float().square().sum()

    torch._dynamo.reset()
    q1, q2 = (inp.q.clone().requires_grad_() for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # auto -> portable on the CPU
        eager = torch.autograd.grad(f(q1, inp.k, inp.v), q1)[0]
        compiled = torch.autograd.grad(
            torch.compile(f, backend="aot_eager", fullgraph=True)(q2, inp.k, inp.v), q2)[0]
    torch.testing.assert_close(compiled, eager)


@pytest.mark.parametrize("mode,causal", [("self", False), ("self", True), ("cross", True),
                                         ("broadcast_q", False)])
def test_gradient_through_lse(mode, causal):
    """A loss on the returned lse (as when partial attentions are merged) gets the
    oracle's dq/dk/dv, including rows that see no key (cross causal, len_q > len_k)."""
    from harness.oracle import compare, reference
    p = Problem(batch=3, heads=2, kv_heads=1, head_dim=64, max_seqlen_q=20,
                max_seqlen_k=None if mode == "self" else 12, sparsity=0.5, mode=mode,
                causal=causal, dtype="fp16", seed=4)
    inp = p.build()
    bq = mode == "broadcast_q"
    n_out = inp.dout.shape[0]
    dlse = torch.randn(p.heads, n_out, generator=torch.Generator().manual_seed(9))
    q, k, v = (t.detach().clone().requires_grad_() for t in (inp.q, inp.k, inp.v))
    out, lse = jagged_attention(q, k, v, inp.cu_seqlens_q, inp.cu_seqlens_k, inp.max_seqlen_q,
                                inp.max_seqlen_k, causal=causal, broadcast_q=bq, return_lse=True)
    grads = torch.autograd.grad((out, lse), (q, k, v), (inp.dout, dlse))
    kw = dict(causal=causal, broadcast_q=bq, dlse=dlse)
    ref, lowp = reference(inp, **kw), reference(inp, compute_dtype=inp.q.dtype, **kw)
    for name, g in zip(("dq", "dk", "dv"), grads):
        c = compare(name, g, ref[name], lowp[name], inp.q.dtype)
        assert c.ok, str(c)
    without = reference(inp, causal=causal, broadcast_q=bq)  # the lse term matters here
    assert (ref["dq"] - without["dq"]).abs().max() > 10 * compare(
        "dq", grads[0], ref["dq"], lowp["dq"], inp.q.dtype).tol


def test_gradient_through_lse_only(inp):
    """Only lse in the loss: out's gradient is zero, the result still matches the oracle."""
    from harness.oracle import compare, reference
    dlse = torch.randn(inp.q.shape[1], inp.q.shape[0], generator=torch.Generator().manual_seed(3))
    q = inp.q.detach().clone().requires_grad_()
    _, lse = jagged_attention(q, inp.k, inp.v, inp.cu_seqlens_q, inp.cu_seqlens_k,
                              inp.max_seqlen_q, inp.max_seqlen_k, return_lse=True)
    (dq,) = torch.autograd.grad(lse, q, dlse)
    zero = type(inp)(**{**inp.__dict__, "dout": torch.zeros_like(inp.dout)})
    ref = reference(zero, dlse=dlse)
    lowp = reference(zero, compute_dtype=inp.q.dtype, dlse=dlse)
    c = compare("dq", dq, ref["dq"], lowp["dq"], inp.q.dtype)
    assert c.ok, str(c)


def test_oracle_check_with_dlse(inp):
    """harness.oracle.check passes the gradient on lse through (the GPU matrix uses it)."""
    import functools
    from harness.oracle import check
    dlse = torch.randn(inp.q.shape[1], inp.q.shape[0], generator=torch.Generator().manual_seed(2))
    rep = check(inp, functools.partial(jagged_attention, return_lse=True), dlse=dlse)
    assert rep.ok, str(rep)


def test_gradient_buffers_do_not_alias(inp):
    """The styles' backward outputs (jagged.tiles.grad_buffers, as TLX's `_prepare` holds
    them) are three allocations: torch.compile rejects a custom op whose outputs alias."""
    from jagged.tiles import grad_buffers
    from kernels_tlx.bwd_hopper import _prepare
    p = _prepare(inp.q, inp.q, inp.k, inp.v, inp.q, torch.zeros(2, inp.q.shape[0]),
                 inp.cu_seqlens_k, False)
    for grads in (grad_buffers(inp.q, inp.k), (p.dq, p.dk, p.dv)):
        storages = {g.untyped_storage().data_ptr() for g in grads}
        assert len(storages) == 3
        assert [g.shape for g in grads] == [inp.q.shape, inp.k.shape, inp.v.shape]
        assert all(g.is_contiguous() for g in grads[1:])
