"""jagged.kvcache_attention's default call path on the GPU (`pytest -m gpu`), both styles:
it never syncs the host, CUDA-graph capture replays equal to eager (the decode loop's
usual form), torch.compile(fullgraph=True) traces it, the result is the same with and
without splits, and bad values fail on the device naming the argument."""
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import jagged

STYLES = ("tlx", "cute")


def need(style):
    from jagged.dispatch import style_available
    ok, why = style_available(style)
    if not ok:
        pytest.skip(f"{style}: {why}")


def inputs(paged=True, B=3, L_q=2, H=8, H_kv=2, D=128, page_size=16, max_len=700, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch.bfloat16
    q = torch.randn(B, L_q, H, D, device="cuda", generator=g, dtype=dt)
    n = torch.tensor([max_len, 1, max_len // 3][:B], device="cuda", dtype=torch.int32)
    if paged:
        max_pages = math.ceil(max_len / page_size)
        pages = B * max_pages + 5
        k = torch.randn(pages, page_size, H_kv, D, device="cuda", generator=g, dtype=dt)
        v = torch.randn(pages, page_size, H_kv, D, device="cuda", generator=g, dtype=dt)
        pt = torch.randperm(pages, device="cuda", generator=g)[:B * max_pages]
        pt = pt.view(B, max_pages).to(torch.int32)
    else:
        k = torch.randn(B, max_len, H_kv, D, device="cuda", generator=g, dtype=dt)
        v = torch.randn(B, max_len, H_kv, D, device="cuda", generator=g, dtype=dt)
        pt = None
    return dict(q=q, k_cache=k, v_cache=v, cache_seqlens=n, page_table=pt)


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [True, False])
@pytest.mark.parametrize("style", STYLES)
def test_no_host_sync_and_splits_agree(style, paged):
    need(style)
    a = inputs(paged)
    one, lse1 = jagged.kvcache_attention(**a, backend=style, num_splits=1, return_lse=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        many, lse = jagged.kvcache_attention(**a, backend=style, num_splits=4, return_lse=True)
        auto = jagged.kvcache_attention(**a, backend=style)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(many, one, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(auto, one, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, lse1, atol=1e-3, rtol=1e-3)
    assert lse.shape == (3, 8, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("style", STYLES)
def test_cuda_graph_replay(style):
    need(style)
    a = inputs()
    run = lambda: jagged.kvcache_attention(**a, backend=style)  # noqa: E731
    want = run()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = run()
    a["cache_seqlens"].add_(3)  # the decode step: lengths move, the graph reads them
    graph.replay()
    torch.testing.assert_close(got, run(), atol=0, rtol=0)
    assert not torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("style", STYLES)
def test_compile_fullgraph(style):
    need(style)
    a = inputs()
    f = torch.compile(lambda q, k, v, n, pt: jagged.kvcache_attention(
        q, k, v, n, page_table=pt, backend=style), fullgraph=True, backend="aot_eager")
    got = f(a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["page_table"])
    torch.testing.assert_close(got, jagged.kvcache_attention(**a, backend=style), atol=0, rtol=0)


BAD = [
    ("pt[1, 0] = 10**6", "page_table points outside the page pool"),
    ("n[0] = 10**6", "cache_seqlens exceeds the cache capacity"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("change, msg", BAD)
@pytest.mark.parametrize("style", STYLES)
def test_bad_values_fail_on_device(style, change, msg):
    need(style)
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        import jagged
        from test_gpu_kvcache import inputs
        a = inputs()
        pt, n = a["page_table"], a["cache_seqlens"]
        {change}
        out = jagged.kvcache_attention(**a, backend={style!r})
        torch.cuda.synchronize()
        print("NO ERROR")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "NO ERROR" not in r.stdout
    assert msg in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]
