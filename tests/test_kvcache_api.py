"""jagged.kvcache: validation (errors naming the argument), the host and device value
checks, the split count, the combine kernel, and one call through `run` with the TLX
style's kernel, in the Triton interpreter (CPU).
"""
import contextlib
import dataclasses
import math
import os

import pytest
import torch

from jagged import kvcache as kc

interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="CPU interpreter test (TRITON_INTERPRET=1)")


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
    (dict(q="float"), TypeError, "q must be bfloat16 or float16"),
    (dict(k_cache="fp16"), TypeError, "q, k_cache, v_cache must share one dtype"),
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


@contextlib.contextmanager
def interpreter_asserts():
    from triton.runtime import interpreter
    b = interpreter.interpreter_builder
    old = b.options
    b.options = dataclasses.replace(old, debug=True)
    try:
        yield
    finally:
        b.options = old


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


# ------------------------------------------------------------------ splits and combine
def test_choose_splits():
    assert kc.choose_splits(1, 8, 32768, 132) == 33     # 264 programs / 8 heads
    assert kc.choose_splits(256, 8, 32768, 132) == 1    # the batch fills the GPU
    assert kc.choose_splits(1, 8, 1024, 132) == 2       # at least 512 keys a split
    assert kc.choose_splits(1, 1, 1 << 20, 132) == kc.MAX_SPLITS
    assert kc.choose_splits(1, 8, 100, 132) == 1


@interp
def test_combine_matches_logsumexp():
    g = torch.Generator().manual_seed(1)
    S, N, H, D = 5, 19, 3, 64
    o = torch.randn(S, N, H, D, generator=g)
    lse = torch.randn(S, H, N, generator=g) * 3
    lse[1:3] = -math.inf                    # splits that saw no key
    lse[:, 0, 4] = -math.inf                # a row no split saw
    o[:, 4, 0] = 0.0
    out = torch.full((N, H, D), float("nan")).bfloat16()
    lse_out = torch.full((H, N), float("nan"))
    kc.combine(o, lse, out, lse_out)
    want_lse = torch.logsumexp(lse, 0)
    w = torch.nan_to_num(torch.exp(lse - want_lse[None]), nan=0.0)   # [S, H, N]
    want = torch.einsum("shn,snhd->nhd", w, o)
    assert torch.equal(torch.isinf(lse_out), torch.isinf(want_lse))
    fin = torch.isfinite(want_lse)
    torch.testing.assert_close(lse_out[fin], want_lse[fin], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    assert torch.all(out[4, 0] == 0)


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


def test_combine_compiles_for_sm90():
    from harness.compile_check import compile_kernel
    rep = compile_kernel(kc._combine_kernel, signature={
        "o_part": "*fp32", "lse_part": "*fp32", "out": "*bf16", "lse": "*fp32",
        "n_rows": "i32", "n_splits": "i32"},
        constexprs={"H": 32, "D": 128, "S_POW2": 64, "BLOCK_R": 16}, arch=90, num_warps=4)
    assert not rep.spills, rep
    assert rep.fits(), rep


@interp
def test_compile_fullgraph_traces_the_call(monkeypatch):
    """torch.compile(fullgraph=True) traces kvcache_attention with no graph break (the
    style resolved as on a GPU; the op runs the TLX kernel in the interpreter)."""
    monkeypatch.setattr(kc, "resolve", lambda backend, device_index: "tlx")
    a = inputs(lengths=(13, 2))
    f = torch.compile(lambda q, k, v, n, pt: kc.kvcache_attention(
        q, k, v, n, page_table=pt, num_splits=3), fullgraph=True, backend="aot_eager")
    got = f(a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["page_table"])
    want = kc.kvcache_attention(**a, num_splits=3)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
