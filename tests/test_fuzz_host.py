"""Both styles' host paths, Hopper and Blackwell, over the fuzz draws of many seeds (the
benchmark runs with any seed): each forward and backward call decides its config, lists,
windows and parts without raising, launches its main kernel once, and every Triton grid
it launches is one the driver accepts. Kernels are recorded, not run (no GPU, no
compile)."""
import importlib

import pytest
import torch

from harness.problems import fuzz_problems, offsets
from jagged import offsets as joffsets
from jagged import tiles
from _launches import record_launches

SEEDS = range(50)  # 2000 draws (seeds 0-499 ran clean once, outside the suite)


def _inputs(p):
    """CPU tensors of problem p's shapes (values unused: nothing runs)."""
    lq, lk = p.lengths()
    bq = p.mode == "broadcast_q"
    cu_k = offsets(lk)
    if bq:
        cu_q, n_q = None, int(lq[0])
        n_out = n_q * len(lk)
    else:
        cu_q = offsets(lq)
        n_q = n_out = int(cu_q[-1])
    dt = p.torch_dtype
    q = torch.empty(n_q, p.heads, p.head_dim, dtype=dt)
    k = torch.empty(int(cu_k[-1]), p.hkv, p.head_dim, dtype=dt)
    o = torch.empty(n_out, p.heads, p.head_dim, dtype=dt)
    lse = torch.empty(p.heads, n_out)
    return q, k, o, lse, cu_q, cu_k, bq


def _draws():
    return [p for s in SEEDS for p in fuzz_problems(40, s)]


@pytest.mark.parametrize("arch", ["hopper", "blackwell"])
def test_tlx_host_paths_over_fuzz_seeds(monkeypatch, arch):
    tf = importlib.import_module(f"kernels_tlx.fwd_{arch}")
    tb = importlib.import_module(f"kernels_tlx.bwd_{arch}")
    from kernels_tlx import bwd_hopper, fwd_hopper  # Blackwell's pre- and postprocess
    grids = []
    mods = {tf, tb, fwd_hopper, bwd_hopper, tiles}
    launches = record_launches(monkeypatch, *mods, joffsets, grids=grids)
    for m in mods:
        monkeypatch.setattr(m, "num_sms", lambda dev: 132, raising=False)
    for p in _draws():
        q, k, o, lse, cu_q, cu_k, bq = _inputs(p)
        for name, call in (
                ("fwd_kernel", lambda: tf.forward(q, k, k, cu_q, cu_k, p.max_seqlen_q, p.max_k,
                                                  p.causal, 0.1, bq)),
                ("bwd_kernel", lambda: tb.backward(o, q, k, k, o, lse, cu_q, cu_k,
                                                   p.max_seqlen_q, p.max_k, p.causal, 0.1,
                                                   bq))):
            launches.clear()
            grids.clear()
            call()
            names = [n for n, _, _ in launches]
            assert names.count(name) == 1, (p.label(), names)
            for g in grids:
                assert all(type(x) is int for x in g) and 1 <= g[0] < 2 ** 31, (p.label(), g)
                assert all(1 <= x < 2 ** 16 for x in g[1:]), (p.label(), g)


@pytest.mark.parametrize("arch", ["hopper", "blackwell"])
def test_cute_host_paths_over_fuzz_seeds(monkeypatch, arch):
    from kernels_cute import host
    monkeypatch.setattr(host, "_DECIDED", {})  # no site decided by an earlier test
    cf = importlib.import_module(f"kernels_cute.fwd_{arch}")
    cb = importlib.import_module(f"kernels_cute.bwd_{arch}")
    calls = []

    def recorder(*key):
        return lambda *args: calls.append(key)

    record_launches(monkeypatch, tiles, joffsets)
    monkeypatch.setattr(host, "compiled", lambda cache, make, *key: recorder(make.__name__))
    monkeypatch.setattr(host, "num_sms", lambda dev: 132)
    fwd = cf.KERNELS._replace(compiled=lambda *key: recorder("forward"))
    bwd = cb.KERNELS._replace(**{f: recorder for f in ("preprocess", "postprocess",
                                                      "post_rows", "post_flat")
                                 if getattr(cb.KERNELS, f) is not None})
    for p in _draws():
        q, k, o, lse, cu_q, cu_k, bq = _inputs(p)
        calls.clear()
        host.forward(fwd, q, k, k, cu_q, cu_k, p.max_seqlen_q, p.max_k, p.causal, 0.1, bq)
        assert calls == [("forward",)], p.label()
        calls.clear()
        host.backward(bwd, o, q, k, k, o, lse, cu_q, cu_k, p.max_seqlen_q, p.max_k, p.causal,
                      0.1, bq)
        assert calls.count(("compile_main",)) == 1, (p.label(), calls)
