"""fp8 (e4m3) inputs of the public API, on the CPU: validation (each bad input names its
argument, nothing read), forward only, the portable style against a float64 reference
on the dequantized values, descales None = ones, the 16-bit call reaching the style
exactly as without fp8 (no `descale` keyword), backend="auto" choosing a style with an
fp8 kernel, the styles passing descale to their Hopper forward (and refusing fp8
elsewhere), and torch.compile through the op."""
import importlib
import types
import warnings

import pytest
import torch

import jagged
from _capability import STYLE_PKGS, device  # noqa: F401  (a fixture)
from harness import oracle
from harness.problems import Inputs, offsets
from jagged import dispatch
from jagged.api import make_jagged_attention
from jagged.portable import jagged_attention as portable

FP8 = torch.float8_e4m3fn


def fp8_inputs(lq, lk, H, Hkv, D, *, broadcast_q=False, seed=0):
    """e4m3 q, k, v with descales [B, H_kv] that differ per sequence and head, and the
    real (dequantized, float64) values as harness Inputs for the oracle. The descales
    are powers of two, so the bf16 dequantized values are exact (Triton's interpreter
    rounds fp32 to bf16 toward zero, a GPU to nearest: exact values test the descales'
    indexing, not that rounding)."""
    gen = torch.Generator().manual_seed(seed)
    lq, lk = torch.tensor(lq), torch.tensor(lk)
    B, nq, nk = len(lk), int(lq[0] if broadcast_q else lq.sum()), int(lk.sum())
    e4m3 = lambda *s: (torch.randn(*s, generator=gen) * 100).clamp(-448, 448).to(FP8)  # noqa: E731
    q, k, v = e4m3(nq, H, D), e4m3(nk, Hkv, D), e4m3(nk, Hkv, D)
    qd, kd, vd = (2.0 ** -torch.randint(5, 9, (B, Hkv), generator=gen).float() for _ in range(3))
    cu_k = offsets(lk)
    cu_q = None if broadcast_q else offsets(lq)
    G = H // Hkv

    def real(x, ds, lens, group=1):  # x [rows, heads, D] of sequences with lens rows each
        seq = torch.repeat_interleave(torch.arange(len(lens)), lens)
        return x.double() * ds.double().repeat_interleave(group, 1)[seq][..., None]

    if broadcast_q:  # the shared q's real values differ per sequence: expanded
        qr = real(q.repeat(B, 1, 1), qd, torch.full((B,), nq), G)
        cu_qr, lq_r = offsets(torch.full((B,), nq)), torch.full((B,), nq)
    else:
        qr, cu_qr, lq_r = real(q, qd, lq, G), cu_q, lq
    ref_inp = Inputs(qr, real(k, kd, lk), real(v, vd, lk), cu_qr, cu_k, int(lq.max()),
                     int(lk.max()), None, lq_r, lk)
    args = (q, k, v, cu_q, cu_k, int(lq.max()), int(lk.max()))
    return args, dict(q_descale=qd, k_descale=kd, v_descale=vd), ref_inp


def check_against_reference(out, lse, ref_inp, causal):
    """The harness rule: error against the float64 reference at most 2x PyTorch's
    computing in bf16 on the same dequantized values, plus a floor."""
    ref = oracle.reference(ref_inp, causal=causal, backward=False)
    lowp = oracle.reference(ref_inp, causal=causal, backward=False, compute_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    for c in (oracle.compare("out", out, ref["out"], lowp["out"], torch.bfloat16),
              oracle.compare("lse", lse, ref["lse"], lowp["lse"], torch.float32)):
        assert c.ok, str(c)


CASES = [  # (len_q, len_k, H, H_kv, D, causal)
    ([5, 0, 9], [7, 3, 9], 2, 2, 64, False),
    ([5, 0, 9], [7, 0, 9], 4, 2, 128, True),
    ([17, 1, 3], [17, 1, 20], 4, 1, 64, True),
]


@pytest.mark.parametrize("lq, lk, H, Hkv, D, causal", CASES)
def test_portable_fp8_matches_reference(lq, lk, H, Hkv, D, causal):
    args, ds, ref_inp = fp8_inputs(lq, lk, H, Hkv, D)
    out, lse = portable(*args, causal=causal, return_lse=True, **ds)
    check_against_reference(out, lse, ref_inp, causal)


def test_portable_fp8_broadcast_q():
    """broadcast_q: each sequence sees the shared q times its own q_descale row."""
    args, ds, ref_inp = fp8_inputs([4, 4, 4], [6, 0, 9], 4, 2, 64, broadcast_q=True)
    out, lse = portable(*args, broadcast_q=True, return_lse=True, **ds)
    assert out.shape == (12, 4, 64) and lse.shape == (4, 12)
    check_against_reference(out, lse, ref_inp, False)


def test_portable_fp8_public_entry_matches_style():
    args, ds, _ = fp8_inputs([5, 9], [7, 9], 2, 2, 64)
    a = jagged.jagged_attention(*args, causal=True, backend="portable", **ds)
    torch.testing.assert_close(a, portable(*args, causal=True, **ds), rtol=0, atol=0)


def test_missing_descales_are_ones():
    args, ds, _ = fp8_inputs([5, 9], [7, 9], 4, 2, 64)
    ones = torch.ones_like(ds["q_descale"])
    full = portable(*args, q_descale=ones, k_descale=ones, v_descale=ones)
    torch.testing.assert_close(portable(*args), full, rtol=0, atol=0)
    some = portable(*args, k_descale=ds["k_descale"])
    torch.testing.assert_close(some, portable(*args, q_descale=ones, k_descale=ds["k_descale"],
                                              v_descale=ones), rtol=0, atol=0)


# ----------------------------------------------------------------------- validation

def _bf16(args):
    return tuple(t.to(torch.bfloat16) if isinstance(t, torch.Tensor) and t.dtype == FP8 else t
                 for t in args)


BAD = [  # (change (args, descales) -> (args, descales), exception, message)
    (lambda a, d: ((a[0], a[1].to(torch.bfloat16), *a[2:]), d), TypeError, "share one dtype"),
    (lambda a, d: (_bf16(a), d), ValueError, "q_descale is only for float8_e4m3fn"),
    (lambda a, d: (_bf16(a), {"v_descale": d["v_descale"]}), ValueError,
     "v_descale is only for float8_e4m3fn"),
    (lambda a, d: (a, {**d, "k_descale": d["k_descale"].double()}), TypeError,
     "k_descale must be float32"),
    (lambda a, d: (a, {**d, "v_descale": d["v_descale"][:1]}), ValueError,
     r"v_descale must be \[B, H_kv\] = \[2, 2\]"),
    (lambda a, d: (a, {**d, "q_descale": d["q_descale"].to("meta")}), ValueError,
     "q_descale is on meta"),
    (lambda a, d: (a, {**d, "q_descale": d["q_descale"].T.contiguous().T}), ValueError,
     "q_descale must be contiguous"),
    (lambda a, d: (a, {**d, "k_descale": 1.0}), TypeError, "k_descale must be a torch.Tensor"),
]


@pytest.mark.parametrize("change, exc, msg", BAD)
def test_bad_fp8_input(change, exc, msg):
    args, ds, _ = fp8_inputs([5, 9], [7, 9], 4, 2, 64)
    args, ds = change(args, ds)
    with pytest.raises(exc, match=msg):
        portable(*args, **ds)


def test_fp8_is_forward_only():
    args, ds, _ = fp8_inputs([5, 9], [7, 9], 2, 2, 64)
    q = args[0].clone().requires_grad_()
    with pytest.raises(RuntimeError, match="forward only"):
        portable(q, *args[1:], **ds)
    with torch.no_grad():  # the same tensors without grad run
        assert portable(q, *args[1:], **ds).dtype == torch.bfloat16


# --------------------------------------------------------------- the style's forward

def _recording_style():
    """A style whose forward records its keyword arguments (and runs the portable one)."""
    from jagged import portable as p
    seen = []

    def fwd(*a, **kw):
        seen.append(kw)
        return p.fwd(*a, **kw)
    return make_jagged_attention("fp8_test_recorder", fwd, p.bwd), seen


_RECORDER = _recording_style()


def test_style_forward_keywords():
    """A 16-bit call passes no descale keyword; an fp8 call passes the three descales,
    the missing ones one shared ones tensor [B, H_kv]."""
    fn, seen = _RECORDER
    args, ds, _ = fp8_inputs([5, 9], [7, 9], 4, 2, 64)
    fn(*_bf16(args))
    assert seen[-1] == {}
    fn(*args, k_descale=ds["k_descale"])
    qd, kd, vd = seen[-1]["descale"]
    assert kd is ds["k_descale"] and qd is vd and qd.shape == (2, 2)
    assert qd.dtype == torch.float32 and bool((qd == 1).all())


def test_fake_kernel_and_compile():
    """torch.compile (aot_eager, fullgraph) through the op on fp8 inputs: the fake
    kernel's bf16 out, the same values as eager."""
    args, ds, _ = fp8_inputs([5, 9], [7, 9], 4, 2, 64)

    def f(*a):
        return portable(*a, causal=True, return_lse=True, **ds)

    torch._dynamo.reset()
    with torch.no_grad():
        eager = f(*args)
        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(*args)
    assert compiled[0].dtype == torch.bfloat16
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    torch.library.opcheck(torch.ops.jagged_attn.portable_fwd.default,
                          (*args, True, 0.125, False, *ds.values()),
                          test_utils=("test_faketensor",))


# ------------------------------------------------------------------------- dispatch

def test_auto_fp8_takes_a_style_with_fp8(device, monkeypatch):
    device(9)
    assert dispatch.resolve("auto", 0) == "cute"
    assert dispatch.resolve("auto", 0, True) == "cute"
    q = types.SimpleNamespace(device=torch.device("cuda", 0), is_cuda=True, dtype=FP8)
    assert jagged.which(q) == "cute"
    with monkeypatch.context() as m:  # a style without an fp8 forward is passed over
        m.delitem(dispatch.FP8_ARCHS, "cute")
        dispatch._CHOSEN.clear()
        assert dispatch.resolve("auto", 0, True) == "tlx"
        assert dispatch.resolve("auto", 0) == "cute"
    device(10)  # the fp8 forwards are Hopper's: the portable kernel, with a warning
    with pytest.warns(RuntimeWarning, match="for fp8 inputs runs the portable"):
        assert dispatch.resolve("auto", 0, True) == "portable"
    assert dispatch.resolve("auto", 0) == "cute"
    assert dispatch.FP8_ARCHS == {"cute": ("hopper",), "tlx": ("hopper",), "portable": None}


@pytest.mark.parametrize("style", sorted(STYLE_PKGS))
def test_style_passes_descale_through(style, device, monkeypatch):
    device(9)
    pkg = STYLE_PKGS[style]
    mod = importlib.import_module(f"{pkg.__name__}.fwd_hopper")
    seen = []
    monkeypatch.setattr(mod, "forward", lambda *a, **kw: seen.append(kw) or "out")
    q = types.SimpleNamespace(device=torch.device("cuda", 0))
    assert pkg._forward(q, 1, 2) == "out" and seen[-1] == {}
    pkg._forward(q, 1, 2, descale=("q", "k", "v"))
    assert seen[-1] == {"descale": ("q", "k", "v")}
    device(10)
    with pytest.raises(NotImplementedError,
                       match=f"{style} style has fp8 kernels for hopper only"):
        pkg._forward(q, 1, 2, descale=("q", "k", "v"))


@pytest.mark.parametrize("style", sorted(STYLE_PKGS))
def test_style_refuses_fp8_on_the_cpu(style):
    args, ds, _ = fp8_inputs([5, 9], [7, 9], 2, 2, 64)
    with pytest.raises(NotImplementedError, match=f"{style} style has fp8 kernels for hopper"):
        STYLE_PKGS[style].jagged_attention(*args, **ds)


def test_auto_on_cpu_runs_portable_fp8():
    args, ds, _ = fp8_inputs([5, 9], [7, 9], 2, 2, 64)
    dispatch._CHOSEN.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = jagged.jagged_attention(*args, **ds)
    torch.testing.assert_close(out, portable(*args, **ds), rtol=0, atol=0)
