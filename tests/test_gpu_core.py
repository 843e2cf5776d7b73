"""The default call path on the GPU (`pytest -m gpu`), every style: it never syncs the
host, CUDA-graph capture of the forward and of forward + backward replays equal to
eager, torch.compile(fullgraph=True) traces forward + backward with no graph break,
and bad offsets fail on the device with a message naming the argument."""
import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from harness.problems import Problem

STYLES = ("tlx", "cute", "portable")
PROBLEMS = {  # (mode, causal): a small jagged problem with an empty and a length-1 sequence
    "self-causal": Problem(batch=4, heads=4, kv_heads=2, head_dim=128, max_seqlen_q=300,
                           sparsity=0.5, causal=True, seed=11),
    "cross": Problem(batch=3, heads=2, head_dim=64, max_seqlen_q=100, max_seqlen_k=257,
                     mode="cross", seed=12),
    "broadcast-q": Problem(batch=3, heads=2, head_dim=64, max_seqlen_q=64, max_seqlen_k=200,
                           mode="broadcast_q", seed=13),
    # short sequences: the forward over row windows
    "short-windows": Problem(batch=300, heads=4, kv_heads=2, head_dim=128, max_seqlen_q=128,
                             sparsity=0.1, causal=True, seed=14),
}


def style_fn(style):
    from jagged.dispatch import style_available, style_fn
    ok, why = style_available(style)
    if not ok:
        pytest.skip(f"{style}: {why}")
    return style_fn(style)


def build(p):
    inp = p.build("cuda")
    bq = p.mode == "broadcast_q"
    args = (inp.cu_seqlens_q, inp.cu_seqlens_k, inp.max_seqlen_q, inp.max_seqlen_k)
    kw = dict(causal=p.causal, broadcast_q=bq)
    return inp, args, kw


def fwd_bwd(fn, q, k, v, args, kw, dout):
    out = fn(q, k, v, *args, **kw)
    return (out, *torch.autograd.grad(out, (q, k, v), dout))


def leaves(inp):
    return [t.detach().clone().requires_grad_() for t in (inp.q, inp.k, inp.v)]


def assert_same(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        assert not g.isnan().any(), f"{what}: output {i} has NaN"
        # the backward's fp32 dQ sums may add in another order: dtype tolerances
        torch.testing.assert_close(g, w, msg=f"{what}: output {i}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PROBLEMS))
@pytest.mark.parametrize("style", STYLES)
def test_no_host_sync(style, name):
    fn = style_fn(style)
    inp, args, kw = build(PROBLEMS[name])
    q, k, v = leaves(inp)
    fwd_bwd(fn, q, k, v, args, kw, inp.dout)  # compiles outside the check
    fresh = [t.clone() for t in args[:2] if t is not None]  # new offsets: the checks run again
    args = (fresh[0] if args[0] is not None else None, fresh[-1], *args[2:])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fwd_bwd(fn, q, k, v, args, kw, inp.dout)
        fn(inp.q, inp.k, inp.v, *args, **kw)  # the no-grad path
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def capture(run, n_warm=2):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(n_warm):
            run()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = run()
    return g, outs


@pytest.mark.gpu
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("name", list(PROBLEMS))
@pytest.mark.parametrize("style", STYLES)
def test_cuda_graph(style, name, backward):
    """Capture once, then replay on new values written into the captured inputs: equal
    to eager on those values."""
    fn = style_fn(style)
    p = PROBLEMS[name]
    inp, args, kw = build(p)
    q, k, v = leaves(inp) if backward else (inp.q.clone(), inp.k.clone(), inp.v.clone())
    dout = inp.dout.clone()

    def run():
        if backward:
            return fwd_bwd(fn, q, k, v, args, kw, dout)
        return (fn(q, k, v, *args, **kw),)

    g, outs = capture(run)
    new = dataclasses.replace(p, seed=p.seed + 1).build("cuda", lengths=p.lengths())
    with torch.no_grad():
        for dst, src in zip((q, k, v, dout), (new.q, new.k, new.v, new.dout)):
            dst.copy_(src)
        for o in outs:
            o.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    want = run()
    assert_same(outs, want, f"{style} {name} replay")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", list(PROBLEMS))
@pytest.mark.parametrize("style", STYLES)
def test_compile_fullgraph(style, name, backend):
    """A module calling the op, compiled with fullgraph=True (a graph break is an
    error), forward + backward, equal to eager."""
    fn = style_fn(style)
    inp, args, kw = build(PROBLEMS[name])

    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            return fn(q, k, v, *args, **kw).float().square().sum()

    torch._dynamo.reset()
    m = Attn()
    q1, k1, v1 = leaves(inp)
    q2, k2, v2 = leaves(inp)
    eager = torch.autograd.grad(m(q1, k1, v1), (q1, k1, v1))
    compiled = torch.autograd.grad(torch.compile(m, fullgraph=True, backend=backend)(q2, k2, v2), (q2, k2, v2))
    assert_same(compiled, eager, f"{style} {name} compiled")


BAD = textwrap.dedent("""
    import torch
    from harness.problems import Problem
    from jagged.dispatch import style_fn
    p = Problem(batch=3, heads=4, kv_heads=2, head_dim=64, max_seqlen_q={lq}, mode={mode!r})
    inp = p.build("cuda")
    n = inp.k.shape[0]
    bad = torch.tensor([0, n // 2, n // 4, n], dtype=torch.int32, device="cuda")
    # max_seqlen_k = n: only the order is wrong, one assertion fails
    out = style_fn("{style}")(inp.q, inp.k, inp.v, inp.cu_seqlens_q, bad, inp.max_seqlen_q, n,
                              broadcast_q={mode!r} == "broadcast_q")
    torch.cuda.synchronize()
    print("NOT REACHED", flush=True)
""")


@pytest.mark.gpu
@pytest.mark.parametrize("lq, mode", [(64, "self"), (300, "self"), (2000, "self"),
                                      (16, "broadcast_q")],
                         ids=["windows", "one-wave", "pairs", "broadcast-q"])
@pytest.mark.parametrize("style", STYLES)
def test_bad_offsets_fail_on_device(style, lq, mode):
    """In a child process (a device-side assert leaves the CUDA context unusable): the
    next CUDA call or sync raises (the check runs first on the stream, alone or inside
    the forward's tile-list kernel; a list-free forward of one wave runs its reads under
    it and stores nothing before it), and the assertion names the argument. Short
    queries (the forward's row windows), one wave of (sequence, block) tiles (no list,
    jagged.tiles.fwd_direct), more (the list) and broadcast-Q (packed GQA heads, one
    wave)."""
    style_fn(style)
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", BAD.format(style=style, lq=lq, mode=mode)],
                       capture_output=True, text=True, timeout=600, env=env,
                       cwd=os.path.dirname(os.path.dirname(__file__)))
    assert "NOT REACHED" not in r.stdout, r.stdout + r.stderr[-3000:]
    assert r.returncode != 0
    assert "cu_seqlens_k must not decrease" in r.stderr, r.stderr[-3000:]
