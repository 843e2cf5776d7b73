"""The decode's launch order (jagged.kvcache `wants_order`, the rank in
jagged/kvcache_kernels.py, both styles' batch coordinate mapped through it).

CPU: the value check's rank against torch's stable descending sort (ties, empty caches,
caches of one key, B = 1, batches past one rank step, paged grids of several chunks) in
the Triton interpreter; when the core asks for an order; the TLX kernel with an order
(a permutation gives the unordered results, a map that repeats a sequence leaves the
skipped one unwritten: the kernel reads order[p], not p); the core's call handing the
check's order to the style; both styles' ordered builds compiled for sm_90a, each with
the one extra load of the batch coordinate's sequence.

`-m gpu` (H200): the order on the device against the sort, each style's ordered call
bit for bit against the same call in index order, the oracle on a jagged multi-wave
batch, a CUDA-graph capture and no host sync in the call.
"""
import json
import math
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from jagged import kvcache as kc
from jagged import kvcache_kernels as kk
from _interp import interp, interpreter_asserts


def longest_first(n) -> torch.Tensor:
    """The expected order: lengths descending, ties by index."""
    return torch.sort(torch.as_tensor(n), descending=True, stable=True).indices.to(torch.int32)


def queue_order(n, page_table=None, page_size=4, device="cpu"):
    """The order the value check writes for lengths n (capacity: the largest length)."""
    seqlens = torch.tensor(n, dtype=torch.int32, device=device)
    cap = max(max(n), 1)
    if page_table is None:
        k_cache = torch.zeros(len(n), cap, 1, 64, dtype=torch.bfloat16, device=device)
    else:
        k_cache = torch.zeros(page_table.numel(), page_size, 1, 64, dtype=torch.bfloat16,
                              device=device)
        cap = page_table.shape[1] * page_size
    order = torch.full((len(n),), -1, dtype=torch.int32, device=device)
    kk.check_inputs_async(len(n), k_cache, seqlens, page_table, None, 1, cap, order)
    return order.cpu()


def _lengths(B, seed, hi=40):
    """Jagged lengths with many ties, empty caches and caches of one key."""
    g = torch.Generator().manual_seed(seed)
    n = torch.randint(0, hi, (B,), generator=g)
    n[torch.rand(B, generator=g) < 0.2] = 0
    n[torch.rand(B, generator=g) < 0.2] = 1
    return n.tolist()


# ------------------------------------------------------------------ the rank
LENGTHS = [
    ("B1", [7]),
    ("B1-empty", [0]),
    ("all-equal", [5, 5, 5, 5]),
    ("all-empty", [0, 0, 0]),
    ("ties-zeros-ones", [0, 1, 0, 1, 9, 9, 2, 1]),
    ("ascending", list(range(17))),
    ("random-300", _lengths(300, 1)),
]


@interp
@pytest.mark.parametrize("n", [n for _, n in LENGTHS], ids=[i for i, _ in LENGTHS])
def test_rank_matches_stable_sort(n):
    with interpreter_asserts():
        got = queue_order(n)
    assert torch.equal(got, longest_first(n)), (n, got)


@interp
def test_rank_past_one_step():
    """More sequences than one rank step compares (RANK_BLOCK): the steps add up."""
    n = _lengths(kk.RANK_BLOCK + 37, 2, hi=6)
    assert torch.equal(queue_order(n), longest_first(n))


@interp
def test_rank_in_a_paged_grid():
    """A page table wider than one check chunk: only chunk 0 of a sequence ranks it."""
    n = [3000, 7, 3000, 0, 1]
    max_pages = kk.CHECK_BLOCK + 200
    pt = torch.arange(len(n) * max_pages, dtype=torch.int32).view(len(n), max_pages)
    with interpreter_asserts():
        got = queue_order(n, pt, page_size=4)
    assert torch.equal(got, longest_first(n))


# ------------------------------------------------------------------ when the core orders
def test_wants_order():
    # (batch, kv heads, rows, splits, slots): past one wave and two sequences
    assert kc.wants_order(64, 8, 4, 1, 132)           # 512 programs: 3.9 waves
    assert kc.wants_order(64, 8, 4, 1, 264)           # two an SM: 1.9 waves
    assert not kc.wants_order(8, 8, 4, 2, 132)        # 128 programs: one wave
    assert not kc.wants_order(16, 8, 4, 1, 132)       # 128 programs: one wave
    assert kc.wants_order(17, 8, 4, 1, 132)           # 136: a second wave
    assert not kc.wants_order(1, 8, 4, 64, 132)       # one sequence: nothing to order
    assert kc.wants_order(8, 8, 4, 3, 132)            # forced splits past one wave
    assert kc.wants_order(2, 1, 8 * 256, 1, 31)       # row blocks count (16 each)
    assert not kc.wants_order(2, 1, 8 * 256, 1, 32)
    assert kc.wants_order(kc.ORDER_MAX_BATCH, 1, 4, 1, 132)
    assert not kc.wants_order(kc.ORDER_MAX_BATCH + 1, 1, 4, 1, 132)  # rank B^2, tail small
    assert kc.wave_slots("tlx", -1, 128, 4, False) == 1  # the interpreter: one at a time


def test_choose_splits_then_order_agree():
    """With the splits the core chooses, a batch that fits one wave is never ordered and
    one past it always is (H200: 132 SMs)."""
    for per_sm in (1, 2):
        slots = 132 * per_sm
        for B in (1, 2, 8, 16, 17, 33, 64, 256):
            s = kc.choose_splits(B, 8, 32768, 132, 4, per_sm)
            assert kc.wants_order(B, 8, 4, s, slots) == (B * 8 > slots), (B, per_sm, s)


# ------------------------------------------------------------------ the TLX kernel
def _tlx_case(n_k, n_q, page_size, seed=0, H=8, H_kv=2, D=64, dtype=torch.float16):
    from test_decode_tlx import build
    return build(n_q, n_k, H, H_kv, D, page_size, dtype, False, seed)


def _tlx_run(q, k_cache, v_cache, seqlens, pt, cu_q, len_q, splits, order):
    """forward's outputs (NaN-poisoned first; splits > 1 combined by the core's combine)."""
    from kernels_tlx import decode_hopper as dh
    Nq, H, D = q.shape
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    lse = torch.full((H, Nq), float("nan"))
    kw = dict(len_q=len_q, causal=True, scale=0.125, num_splits=splits, order=order)
    if splits == 1:
        dh.forward(q, k_cache, v_cache, seqlens, pt, cu_q, out, lse, None, None, **kw)
        return out, lse
    o_part = torch.full((splits, Nq, H, D), float("nan"))
    lse_part = torch.full((splits, H, Nq), float("nan"))
    dh.forward(q, k_cache, v_cache, seqlens, pt, cu_q, None, None, o_part, lse_part, **kw)
    kk.combine(o_part, lse_part, out, lse)
    return out, lse


ORDER_CASES = [  # (id, n_k, n_q, page size, splits): packed q, jagged rows and keys
    ("contig-unsplit", [20, 0, 45, 1, 33], [1, 1, 2, 1, 3], None, 1),
    ("page3-split3", [20, 0, 45, 1, 33], [1, 1, 2, 1, 3], 3, 3),
    ("page16-two-row-blocks", [60, 5, 31], [20, 7, 1], 16, 2),
]


@interp
@pytest.mark.parametrize("case", ORDER_CASES, ids=[c[0] for c in ORDER_CASES])
def test_tlx_with_an_order(case):
    """Every coordinate follows order[p]: a permutation (longest first, and reversed)
    gives the index-order results bit for bit; packed q with different row counts per
    sequence shows a q_start or n_q taken from p instead."""
    from test_decode_tlx import reference
    _, n_k, n_q, page, splits = case
    q, k_cache, v_cache, seqlens, pt, cu_q, ks, vs = _tlx_case(n_k, n_q, page)
    len_q = max(n_q)
    want = _tlx_run(q, k_cache, v_cache, seqlens, pt, cu_q, len_q, splits, None)
    ref_out, ref_lse = reference(q, ks, vs, n_q, q.shape[1], True, 0.125)
    torch.testing.assert_close(want[0].double(), ref_out, atol=3e-3, rtol=3e-3)
    B = len(n_k)
    for order in (longest_first(n_k), torch.arange(B - 1, -1, -1, dtype=torch.int32)):
        got = _tlx_run(q, k_cache, v_cache, seqlens, pt, cu_q, len_q, splits, order)
        for g, w in zip(got, want):
            assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num())


@interp
def test_tlx_reads_the_order():
    """A map that takes sequence 2 twice and never sequence 1: 1's rows stay unwritten
    (NaN), 0's and 2's are right."""
    n_k, n_q = [20, 9, 45], [1, 2, 1]
    q, k_cache, v_cache, seqlens, pt, cu_q, ks, vs = _tlx_case(n_k, n_q, 3)
    want = _tlx_run(q, k_cache, v_cache, seqlens, pt, cu_q, 2, 1, None)
    out, lse = _tlx_run(q, k_cache, v_cache, seqlens, pt, cu_q, 2, 1,
                        torch.tensor([2, 2, 0], dtype=torch.int32))
    rows1 = slice(1, 3)  # sequence 1's query rows
    assert out[rows1].isnan().all() and lse[:, rows1].isnan().all()
    for rows in (slice(0, 1), slice(3, 4)):
        assert torch.equal(out[rows], want[0][rows]) and torch.equal(lse[:, rows], want[1][:, rows])


# ------------------------------------------------------------------ through the core
@interp
@pytest.mark.parametrize("splits", [1, 3])
def test_core_hands_the_check_order_to_the_style(monkeypatch, splits):
    """kvcache_attention on jagged lengths (the interpreter's wave is one program, so
    any batch of two or more is ordered): the style gets the check's longest-first order
    and the result matches the reference; B = 1 passes none."""
    from kernels_tlx import decode_hopper as dh
    from test_kvcache_api import inputs, reference
    seen = []

    def forward(*a, **kw):
        seen.append(kw.get("order"))
        return dh.forward(*a, **kw)

    monkeypatch.setattr(kc, "resolve", lambda backend, device_index: "tlx")
    monkeypatch.setitem(kc._MODULES, "tlx", type("M", (), dict(
        forward=staticmethod(forward), programs_per_sm=staticmethod(dh.programs_per_sm))))
    lengths = (5, 16, 0, 16, 1)
    a = inputs(B=5, pages=32, max_pages=4, lengths=lengths)
    out, lse = kc.kvcache_attention(**a, num_splits=splits, return_lse=True)
    assert torch.equal(seen[-1], longest_first(lengths))
    want, want_lse = reference(**a, causal=True, scale=1 / 8)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)
    fin = torch.isfinite(want_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    torch.testing.assert_close(lse.double()[fin], want_lse[fin], atol=1e-3, rtol=1e-3)
    one = inputs(B=1, lengths=(9,))
    kc.kvcache_attention(**one, num_splits=splits)
    assert seen[-1] is None


# ------------------------------------------------------------------ compiled for sm_90a
def _global_loads(ptx: str) -> int:
    return len(re.findall(r"\bld\.global\b", ptx))


@pytest.mark.parametrize("kind, page", [("gather", 1), ("contig", 1)])
def test_tlx_ordered_build(kind, page):
    """The ordered build compiles like the default one (no spills, the same shared
    memory) and loads one more value: order[p]."""
    from harness.compile_check import compile_kernel
    from kernels_tlx import decode_hopper as dh
    cfg = dh.CONFIGS[(128, 16, kind, 2)]
    reps = []
    for ordered in (False, True):
        reps.append(compile_kernel(
            dh.decode_kernel, dh.signature(cfg, 128, kind, "bf16", True, ordered=ordered),
            dh.kernel_args(cfg, 128, 4, 16, page, kind, True, True, True, ordered=ordered),
            arch=90, num_warps=cfg.num_warps, num_stages=1, name=f"decode {kind} {ordered}"))
    plain, ordered = reps
    assert not ordered.spills, ordered.row()
    assert ordered.total_smem == plain.total_smem, (plain.row(), ordered.row())
    assert _global_loads(ordered.ptx) == _global_loads(plain.ptx) + 1, \
        (_global_loads(plain.ptx), _global_loads(ordered.ptx))


_CUTE_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, {root!r})
    from kernels_cute import decode_hopper as K
    for ordered in (False, True):
        fn = K.compile_decode(torch.bfloat16, 128, K.CONFIGS[(128, 16)], True, True, False,
                              True, ordered=ordered)
        print("BUILD", json.dumps(dict(ordered=ordered, ptx=fn.artifacts.PTX)), flush=True)
    print("COMPILED")
""")


def test_cute_ordered_build(tmp_path):
    """The CuteDSL decode path (paged, split) with and without the order, compiled for
    sm_90a: the ordered build loads one more value (order[p]) and uses no local memory."""
    from _cute import ROOT, have_dsl
    ok, why = have_dsl()
    if not ok:
        pytest.skip(why)
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx",
               CUTE_DSL_DUMP_DIR=str(tmp_path), CUTE_DSL_DISABLE_FILE_CACHING="1")
    r = subprocess.run([sys.executable, "-c", _CUTE_SCRIPT.format(root=ROOT)], env=env,
                       capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    if "COMPILED" not in r.stdout:
        tail = (r.stdout + r.stderr)[-3000:]
        if "libcuda" in tail or "CUDA driver" in tail:
            pytest.skip(f"CuteDSL cannot compile here: {tail[-300:]}")
        raise AssertionError(f"compile failed:\n{tail}")
    ptx = {b["ordered"]: b["ptx"] for b in
           (json.loads(ln[6:]) for ln in r.stdout.splitlines() if ln.startswith("BUILD "))}
    assert ".local" not in ptx[True]
    assert _global_loads(ptx[True]) == _global_loads(ptx[False]) + 1, \
        (_global_loads(ptx[False]), _global_loads(ptx[True]))


# ------------------------------------------------------------------ GPU
def _problem(**kw):
    from harness.decode import DecodeProblem
    return DecodeProblem(**{**dict(batch=64, heads=32, kv_heads=8, head_dim=128,
                                   cache_len=2048, sparsity=0.5, seed=3), **kw})


GPU_PROBLEMS = [  # multi-wave batches (the core orders them), few builds of each style
    dict(),
    dict(page_size=1, num_splits=3),
    dict(len_q=4, packed_q=True, page_size=16),
]


@pytest.mark.gpu
@pytest.mark.parametrize("style", ["tlx", "cute"])
@pytest.mark.parametrize("kw", GPU_PROBLEMS, ids=[str(i) for i in range(len(GPU_PROBLEMS))])
def test_gpu_ordered_call(style, kw):
    """The core orders the call; the oracle passes (NaN past the ends); the same call in
    index order (the core's run without the order) gives the same bits."""
    from harness import backends, decode
    p = _problem(**kw)
    lq, lk = p.lengths()
    lk[:3] = torch.tensor([0, 1, 1])                 # empty caches and caches of one key
    inp = p.build("cuda", lengths=(lq, lk), unused=float("nan"))
    rep = decode.check(inp, p, backends.get(style, kind="decode").fn(), repeat=True)
    assert rep.ok, rep
    H, D = inp.q.shape[-2:]
    q3 = inp.q.reshape(-1, H, D)
    len_q = inp.max_seqlen_q if p.packed_q else p.len_q
    rows = p.heads // p.kv_heads * len_q
    cap = inp.k_cache.shape[1] * (inp.page_table.shape[1] if p.page_size else 1)
    splits = p.num_splits or kc.auto_splits(style, p.batch, p.kv_heads, cap, 0, D, rows,
                                            False)
    assert kc.wants_order(p.batch, p.kv_heads, rows, splits,
                          kc.wave_slots(style, 0, D, rows, False))
    order = torch.empty(p.batch, dtype=torch.int32, device="cuda")
    args = (q3, inp.k_cache, inp.v_cache, inp.cache_seqlens, inp.page_table, inp.cu_seqlens_q)
    kk.check_inputs_async(q3.shape[0], inp.k_cache, inp.cache_seqlens, inp.page_table,
                          inp.cu_seqlens_q, len_q, cap, order)
    assert torch.equal(order.cpu(), longest_first(lk.to(torch.int32)))
    fwd = kc.style_forward(style)
    got = kc.run(fwd, *args, len_q, True, 1 / math.sqrt(D), splits, None, order)
    want = kc.run(fwd, *args, len_q, True, 1 / math.sqrt(D), splits, None, None)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.gpu
@pytest.mark.parametrize("style", ["tlx", "cute"])
def test_gpu_ordered_call_graph_and_no_sync(style):
    """The ordered call issues no host sync and replays from a CUDA graph, new lengths
    (a different order) included."""
    p = _problem()
    inp = p.build("cuda")
    call = lambda: kc.kvcache_attention(*inp.args(), backend=style)  # noqa: E731
    want = call()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = call()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    new = inp.cache_seqlens.flip(0)                  # the same keys, reversed lengths
    inp.cache_seqlens.copy_(torch.minimum(new, inp.cache_seqlens))
    want = call()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
