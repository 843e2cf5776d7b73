"""jagged.kvcache: validation (errors naming the argument), the host and device value
checks, the split count, and calls through `run` (partials and the combine of
jagged/kvcache_kernels.py) with the TLX style's kernel, in the Triton interpreter
(CPU). fp8: the descales' validation, what the core hands a style (a recording
forward), a call through `run` and one traced by torch.compile.
"""
import math

import types

import pytest
import torch

from jagged import kvcache as kc
from _interp import interp, interpreter_asserts


def inputs(B=2, L_q=2, H=4, H_kv=2, D=64, page_size=4, pages=16, max_pages=4, seed=0,
           dtype=torch.bfloat16, lengths=(5, 9)):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, L_q, H, D, generator=g).to(dtype)
    k = torch.randn(pages, page_size, H_kv, D, generator=g).to(dtype)
    v = torch.randn(pages, page_size, H_kv, D, generator=g).to(dtype)
    pt = torch.randperm(pages, generator=g)[:B * max_pages].view(B, max_pages).to(torch.int32)
    n = torch.tensor(lengths, dtype=torch.int32)
    return dict(q=q, k_cache=k, v_cache=v, cache_seqlens=n, page_table=pt)


def reference(q, k_cache, v_cache, cache_seqlens, page_table, causal, scale):
    """float64 attention on the gathered cache; q [B, L_q, H, D]."""
    B, L_q, H, D = q.shape
    page_size, H_kv = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(B, L_q, H, D, dtype=torch.float64)
    lse = torch.full((B, H, L_q), -math.inf, dtype=torch.float64)
    for b in range(B):
        n = int(cache_seqlens[b])
        j = torch.arange(n)
        rows = page_table[b, j // page_size].long() * page_size + j % page_size
        k = k_cache.reshape(-1, H_kv, D)[rows].double().repeat_interleave(H // H_kv, 1)
        v = v_cache.reshape(-1, H_kv, D)[rows].double().repeat_interleave(H // H_kv, 1)
        s = torch.einsum("qhd,khd->hqk", q[b].double(), k) * scale
        if causal:
            i = torch.arange(L_q)[:, None]
            s = s.masked_fill(j[None, :] > i + n - L_q, -math.inf)
        m = torch.logsumexp(s, -1)
        p = torch.where(torch.isfinite(m)[..., None], torch.exp(s - m[..., None]), 0.0)
        out[b] = torch.einsum("hqk,khd->qhd", p, v)
        lse[b] = m
    return out, lse


# ------------------------------------------------------------------ validation
BAD = [
    (dict(q="float"), TypeError, "q must have the cache's dtype torch.bfloat16"),
    (dict(k_cache="fp16"), TypeError, "v_cache must have k_cache's dtype torch.float16"),
    (dict(k_cache="fp16", v_cache="fp16"), TypeError, "q must have the cache's dtype"),
    (dict(k_cache="float", v_cache="float"), TypeError,
     "k_cache must be bfloat16, float16 or float8_e4m3fn"),
    (dict(q="fp8"), TypeError, r"q must have the cache's dtype .* \(a float8_e4m3fn q needs"),
    (dict(q="fp16", k_cache="fp8", v_cache="fp8"), TypeError,
     "q must be float8_e4m3fn or bfloat16 with a float8_e4m3fn cache"),
    (dict(k_cache="fp8"), TypeError, "v_cache must have k_cache's dtype torch.float8_e4m3fn"),
    (dict(q="d96"), ValueError, "head_dim 96"),
    (dict(q="heads3"), ValueError, r"q heads \(3\) must be a multiple of k_cache heads \(2\)"),
    (dict(cache_seqlens="int64"), TypeError, "cache_seqlens must be 1-D int32"),
    (dict(page_table="int64"), TypeError, "page_table must be a 2-D int32"),
    (dict(page_table="rows"), ValueError, "page_table has 1 rows, cache_seqlens 2"),
    (dict(q="3d"), ValueError, r"q must be \[B, L_q, H, D\]"),
    (dict(num_splits=-1), TypeError, "num_splits must be a non-negative int"),
    (dict(page_table=None), ValueError, "k_cache holds 16 sequences, cache_seqlens 2"),
]


def _broken(over):
    a = inputs()
    kw = {}
    for name, how in over.items():
        if name == "num_splits":
            kw[name] = how
        elif how is None:
            a[name] = None
        elif how == "float":
            a[name] = a[name].float()
        elif how == "fp16":
            a[name] = a[name].half()
        elif how == "fp8":
            a[name] = a[name].to(torch.float8_e4m3fn)
        elif how == "d96":
            a[name] = torch.randn(2, 2, 4, 96).bfloat16()
        elif how == "heads3":
            a[name] = torch.randn(2, 2, 3, 64).bfloat16()
        elif how == "int64":
            a[name] = a[name].long()
        elif how == "rows":
            a[name] = a[name][:1].contiguous()
        elif how == "3d":
            a[name] = a[name][0]
    return a, kw


@pytest.mark.parametrize("over, exc, msg", BAD)
def test_validate_names_the_argument(over, exc, msg):
    a, kw = _broken(over)
    with pytest.raises(exc, match=msg):
        kc.validate(a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["page_table"],
                    None, None, kw.get("num_splits", 0))


def test_forward_only_and_cpu_errors():
    a = inputs()
    a["q"].requires_grad_(True)
    with pytest.raises(RuntimeError, match="forward only"):
        kc.kvcache_attention(**a)
    a["q"].requires_grad_(False)
    with pytest.raises(RuntimeError, match="runs on CUDA tensors"):
        kc.kvcache_attention(**a)
    with pytest.raises(ValueError, match="backend='x'"):
        kc.kvcache_attention(**a, backend="x")


BAD_VALUES = [  # (change, host message, device message)
    ("past_pool", r"page_table\[1, 2\] = 99 is outside the page pool",
     "page_table points outside the page pool"),
    ("over_capacity", r"cache_seqlens\[0\] = 17 exceeds the cache's capacity",
     "cache_seqlens exceeds the cache capacity"),
    ("negative", r"cache_seqlens\[1\] = -1 is negative", "cache_seqlens must not be negative"),
]


def _bad_values(change):
    a = inputs()
    if change == "past_pool":
        a["page_table"][1, 2] = 99  # page 2 of sequence 1 (9 keys, pages 0..2) is used
        a["page_table"][0, 3] = 99  # page 3 of sequence 0 (5 keys) is not: never read
    elif change == "over_capacity":
        a["cache_seqlens"][0] = 17
    else:
        a["cache_seqlens"][1] = -1
    return a


@pytest.mark.parametrize("change, host_msg, _", BAD_VALUES)
def test_check_inputs_host(change, host_msg, _):
    a = _bad_values(change)
    with pytest.raises(ValueError, match=host_msg):
        kc.check_inputs_host(4, a["k_cache"], a["cache_seqlens"], a["page_table"], None, 2, 16)


@interp
@pytest.mark.parametrize("change, _, device_msg", BAD_VALUES)
def test_check_inputs_on_device(change, _, device_msg):
    from triton.runtime.errors import InterpreterError
    a = _bad_values(change)
    with interpreter_asserts(), pytest.raises(InterpreterError, match=device_msg):
        kc.check_inputs_async(4, a["k_cache"], a["cache_seqlens"], a["page_table"], None, 2, 16)


@interp
def test_check_inputs_on_device_passes_good_input():
    a = inputs()
    a["page_table"][0, 3] = 99  # unused page: not checked
    with interpreter_asserts():
        kc.check_inputs_async(4, a["k_cache"], a["cache_seqlens"], a["page_table"], None, 2, 16)


# ------------------------------------------------------------------ splits
def test_choose_splits():
    assert kc.choose_splits(1, 8, 32768, 132) == 16     # 128 of 132 SMs, one wave
    assert kc.choose_splits(8, 8, 32768, 132) == 2      # not 3: 192 programs, two waves
    assert kc.choose_splits(3, 8, 32768, 132) == 5
    assert kc.choose_splits(256, 8, 32768, 132) == 1    # the batch fills the GPU
    assert kc.choose_splits(1, 8, 1024, 132) == 2       # at least 512 keys a split
    assert kc.choose_splits(1, 1, 1 << 20, 132) == kc.MAX_SPLITS
    assert kc.choose_splits(1, 8, 100, 132) == 1
    assert kc.choose_splits(1, 8, 32768, 132, rows=4 * 16) == 16  # one row block
    assert kc.choose_splits(1, 8, 32768, 132, rows=8 * 32) == 8   # two row blocks
    assert kc.choose_splits(8, 8, 32768, 132, rows=4, per_sm=2) == 4  # two programs an SM


@pytest.mark.parametrize("style", ["tlx", "cute"])
def test_programs_per_sm(style):
    """Each style's rule: 1 or 2 programs an SM, two for fp8 tiles up to 64 rows."""
    mod = kc.style_decode(style)
    for d in (64, 128):
        for rows in (4, 16, 32, 64, 128, 512):
            for fp8 in (False, True):
                assert mod.programs_per_sm(d, rows, fp8) in (1, 2)
        assert mod.programs_per_sm(d, 64, True) == 2 and mod.programs_per_sm(d, 128, True) == 1


# ------------------------------------------------------------------ a call through run
@interp
@pytest.mark.parametrize("splits", [1, 3])
def test_run_with_tlx_kernel(splits):
    from kernels_tlx.decode_hopper import forward
    a = inputs(lengths=(5, 0) if splits == 1 else (13, 2))
    scale = 0.125
    q3 = a["q"].reshape(-1, 4, 64)
    out, lse = kc.run(forward, q3, a["k_cache"], a["v_cache"], a["cache_seqlens"],
                      a["page_table"], None, 2, True, scale, splits)
    want, want_lse = reference(a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"],
                               a["page_table"], True, scale)
    torch.testing.assert_close(out.view(a["q"].shape).double(), want, atol=2e-2, rtol=2e-2)
    got_lse = lse.view(4, 2, 2).permute(1, 0, 2).double()
    assert torch.equal(torch.isinf(got_lse), torch.isinf(want_lse))
    fin = torch.isfinite(want_lse)
    torch.testing.assert_close(got_lse[fin], want_lse[fin], atol=1e-3, rtol=1e-3)


@interp
def test_compile_fullgraph_traces_the_call(monkeypatch):
    """torch.compile(fullgraph=True) traces kvcache_attention with no graph break (the
    style resolved as on a GPU; the op runs the TLX kernel in the interpreter)."""
    monkeypatch.setattr(kc, "resolve", lambda backend, device_index, fp8=False: "tlx")
    a = inputs(lengths=(13, 2))
    f = torch.compile(lambda q, k, v, n, pt: kc.kvcache_attention(
        q, k, v, n, page_table=pt, num_splits=3), fullgraph=True, backend="aot_eager")
    got = f(a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["page_table"])
    want = kc.kvcache_attention(**a, num_splits=3)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


# ------------------------------------------------------------------ fp8: descales
F8 = torch.float8_e4m3fn


def fp8_inputs(q_fp8=True, **kw):
    a = inputs(**kw)
    for name in ("k_cache", "v_cache") + (("q",) if q_fp8 else ()):
        a[name] = a[name].to(F8)
    return a


def _ds(B=2, H_kv=2, value=1.0):
    return torch.full((B, H_kv), value)


BAD_DESCALES = [  # (q fp8, cache fp8, keywords, error, message)
    (False, True, dict(q_descale=_ds()), ValueError,
     "q_descale is only for a float8_e4m3fn q, got torch.bfloat16"),
    (False, False, dict(k_descale=_ds()), ValueError,
     "k_descale is only for a float8_e4m3fn k_cache / v_cache, got torch.bfloat16"),
    (False, False, dict(v_descale=_ds()), ValueError, "v_descale is only for a float8_e4m3fn"),
    (True, True, dict(q_descale=1.0), TypeError, "q_descale must be a torch.Tensor or None"),
    (True, True, dict(k_descale=_ds().double()), TypeError,
     "k_descale must be float32 \\[B, H_kv\\], got torch.float64"),
    (True, True, dict(v_descale=torch.ones(2)), ValueError,
     r"v_descale must be \[B, H_kv\] = \[2, 2\], got \(2,\)"),
    (True, True, dict(k_descale=_ds(B=3)), ValueError, r"k_descale must be \[B, H_kv\] = \[2, 2\]"),
    (True, True, dict(q_descale=_ds(H_kv=4)), ValueError, r"q_descale must be \[B, H_kv\]"),
    (True, True, dict(k_descale=torch.ones(2, 2).t()), ValueError,
     "k_descale must be contiguous"),
    (True, True, dict(v_descale=torch.ones(2, 2, device="meta")), ValueError,
     "v_descale is on meta but q is on cpu"),
]


@pytest.mark.parametrize("q_fp8, cache_fp8, kw, exc, msg", BAD_DESCALES)
def test_bad_descales_name_the_argument(q_fp8, cache_fp8, kw, exc, msg):
    """Raised on the host before anything is allocated or launched (on the CPU, before
    the style is even looked up)."""
    a = fp8_inputs(q_fp8) if cache_fp8 else inputs()
    with pytest.raises(exc, match=msg):
        kc.kvcache_attention(**a, **kw)


def test_fp8_validation_returns_the_mode():
    for q_fp8, cache_fp8, want in ((True, True, True), (False, True, True), (False, False, False)):
        a = fp8_inputs(q_fp8) if cache_fp8 else inputs()
        assert kc.validate_descales(a["q"], a["k_cache"], 2, None, None, None) is want


def _fake_style(monkeypatch):
    """The core's call with a recording style forward (`tlx`), no device check, the
    splits given: what the core hands a style."""
    seen = []

    def forward(q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, out, lse,
                o_part, lse_part, **kw):
        seen.append(dict(q=q, k_cache=k_cache, out=out, o_part=o_part, **kw))
        for t in (out, lse, o_part, lse_part):
            if t is not None:
                t.zero_()

    monkeypatch.setattr(kc, "resolve", lambda backend, device_index: "tlx")
    monkeypatch.setattr(kc, "check_inputs_async", lambda *a, **k: None)
    monkeypatch.setitem(kc._MODULES, "tlx", types.SimpleNamespace(forward=forward))
    return seen


@pytest.mark.parametrize("splits", [1, 3])
def test_descales_reach_the_style(monkeypatch, splits):
    seen = _fake_style(monkeypatch)
    a = fp8_inputs()
    kd = _ds(value=0.5)
    out = kc.kvcache_attention(**a, num_splits=splits, k_descale=kd)
    call = seen[-1]
    qd, kd_seen, vd = call["descale"]
    assert kd_seen is kd                                     # passed as given
    for t in (qd, vd):                                       # the missing ones: ones
        assert t.dtype == torch.float32 and t.shape == (2, 2) and bool((t == 1).all())
    assert out.dtype == torch.bfloat16 and out.shape == a["q"].shape
    target = call["out"] if splits == 1 else call["o_part"]
    assert target.dtype == (torch.bfloat16 if splits == 1 else torch.float32)
    assert call["q"].dtype == F8 and call["k_cache"].dtype == F8
    assert call["num_splits"] == splits


def test_bf16_q_over_fp8_cache_and_plain_calls(monkeypatch):
    seen = _fake_style(monkeypatch)
    a = fp8_inputs(q_fp8=False)
    out = kc.kvcache_attention(**a, num_splits=1, v_descale=_ds(value=2.0))
    qd, kd, vd = seen[-1]["descale"]
    assert bool((qd == 1).all()) and bool((kd == 1).all())
    assert bool((vd == 2).all()) and out.dtype == torch.bfloat16
    out = kc.kvcache_attention(**inputs(dtype=torch.float16), num_splits=2)
    assert "descale" not in seen[-1] and out.dtype == torch.float16  # no descale, as before


@interp
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("q_fp8", [True, False], ids=["fp8-q", "bf16-q"])
def test_run_fp8_with_tlx_kernel(splits, q_fp8):
    """The core's run (partials, combine) with the TLX kernel on an fp8 cache with
    descales, against float64 on the dequantized values."""
    from kernels_tlx.decode_hopper import forward
    a = fp8_inputs(q_fp8, lengths=(13, 2))
    g = torch.Generator().manual_seed(splits)
    qd, kd, vd = (torch.rand(2, 2, generator=g) + 0.5 for _ in range(3))
    if not q_fp8:
        qd = torch.ones(2, 2)
    q3 = a["q"].reshape(-1, 4, 64)
    out, lse = kc.run(forward, q3, a["k_cache"], a["v_cache"], a["cache_seqlens"],
                      a["page_table"], None, 2, True, 0.125, splits, (qd, kd, vd))
    assert out.dtype == torch.bfloat16
    # dequantized: per (sequence, kv head); q heads 2h, 2h + 1 share kv head h
    qx = a["q"].double() * qd.double().repeat_interleave(2, 1)[:, None, :, None]
    pages = a["page_table"].long()
    kx = a["k_cache"].double().clone()
    vx = a["v_cache"].double().clone()
    for b in range(2):
        kx[pages[b]] *= kd[b].double()[None, None, :, None]
        vx[pages[b]] *= vd[b].double()[None, None, :, None]
    want, want_lse = reference(qx, kx, vx, a["cache_seqlens"], a["page_table"], True, 0.125)
    torch.testing.assert_close(out.view(a["q"].shape).double(), want, atol=2e-2, rtol=2e-2)
    got_lse = lse.view(4, 2, 2).permute(1, 0, 2).double()
    torch.testing.assert_close(got_lse, want_lse, atol=1e-4, rtol=1e-4)


@interp
def test_compile_fullgraph_traces_an_fp8_call(monkeypatch):
    """torch.compile(fullgraph=True) traces an fp8 call with descales (the op's Optional
    tensor arguments), giving the eager call's bits."""
    monkeypatch.setattr(kc, "resolve", lambda backend, device_index, fp8=False: "tlx")
    a = fp8_inputs(lengths=(13, 2))
    kd = torch.full((2, 2), 0.75)
    f = torch.compile(lambda q, k, v, n, pt, kd: kc.kvcache_attention(
        q, k, v, n, page_table=pt, num_splits=3, k_descale=kd), fullgraph=True,
        backend="aot_eager")
    got = f(a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["page_table"], kd)
    want = kc.kvcache_attention(**a, num_splits=3, k_descale=kd)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_auto_order(monkeypatch):
    """backend="auto": TLX first, the other style when the first cannot run."""
    up = {"tlx": True, "cute": True}
    monkeypatch.setattr(kc, "style_available",
                        lambda name, dev, archs=None: (up[name], "" if up[name] else "absent"))
    monkeypatch.setattr(kc, "style_forward", lambda name: None)
    monkeypatch.setattr(kc, "_CHOSEN", {})
    assert kc.resolve("auto", 0) == "tlx"
    up["tlx"] = False
    monkeypatch.setattr(kc, "_CHOSEN", {})
    assert kc.resolve("auto", 0) == "cute"
    up["cute"] = False
    monkeypatch.setattr(kc, "_CHOSEN", {})
    with pytest.raises(RuntimeError, match="tlx: absent; cute: absent"):
        kc.resolve("auto", 0)


def test_max_tile_rows_is_both_styles_largest_tile():
    """choose_splits counts row blocks of MAX_TILE_ROWS: each style's largest row tile."""
    from kernels_cute import decode_hopper as cute_dh
    from kernels_tlx import decode_hopper as tlx_dh
    assert tlx_dh.ROW_TILES[-1] == kc.MAX_TILE_ROWS == cute_dh.tile_rows(10 ** 6)
