"""The oracle against an independent padded-and-masked computation."""
import math

import pytest
import torch

from harness.oracle import check, compare, reference
from harness.problems import Problem


def padded_attention(inp, causal, broadcast_q):
    """Pad every sequence to the batch max, mask padding (and the causal triangle), fp64."""
    lq, lk = inp.lengths_q.tolist(), inp.lengths_k.tolist()
    B, H, Hkv, D = len(lk), inp.q.shape[1], inp.k.shape[1], inp.q.shape[2]
    Mq, Mk = max(lq + [1]), max(lk + [1])
    q, k, v = (t.double().requires_grad_() for t in (inp.q, inp.k, inp.v))
    cq = [0] * B if broadcast_q else torch.tensor([0] + lq).cumsum(0).tolist()
    ck = torch.tensor([0] + lk).cumsum(0).tolist()

    def pad(x, start, n, m):  # rows [start, start+n) of x, zero-padded to m rows
        return torch.nn.functional.pad(x[start:start + n], (0, 0, 0, 0, 0, m - n))

    Q = torch.stack([pad(q, cq[b], lq[b], Mq) for b in range(B)])
    K = torch.stack([pad(k, ck[b], lk[b], Mk) for b in range(B)]).repeat_interleave(H // Hkv, 2)
    V = torch.stack([pad(v, ck[b], lk[b], Mk) for b in range(B)]).repeat_interleave(H // Hkv, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", Q, K) / math.sqrt(D)
    i, j = torch.arange(Mq)[:, None], torch.arange(Mk)[None, :]
    mask = torch.stack([(j < lk[b]) & ((j <= i + lk[b] - lq[b]) | (not causal)) for b in range(B)])
    p = torch.softmax(s.masked_fill(~mask[:, None], float("-inf")), -1).nan_to_num(0.0)
    o = torch.einsum("bhqk,bkhd->bqhd", p, V)
    out = torch.cat([o[b, :lq[b]] for b in range(B)])
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), inp.dout.double())
    return out, dq, dk, dv


@pytest.mark.parametrize("problem,lengths", [
    (Problem(batch=4, heads=2, head_dim=64, max_seqlen_q=9, sparsity=0.5), None),
    (Problem(batch=3, heads=4, kv_heads=2, head_dim=64, max_seqlen_q=7, causal=True), ([5, 0, 7], [5, 0, 7])),
    (Problem(batch=3, heads=2, head_dim=64, max_seqlen_q=6, max_seqlen_k=9, mode="cross", causal=True), ([6, 1, 4], [3, 9, 0])),
    (Problem(batch=3, heads=2, kv_heads=1, head_dim=64, max_seqlen_q=5, max_seqlen_k=8, mode="broadcast_q"), None),
])
def test_reference_matches_padded(problem, lengths):
    inp = problem.build(lengths=lengths)
    bq = problem.mode == "broadcast_q"
    ref = reference(inp, causal=problem.causal, broadcast_q=bq)
    out, dq, dk, dv = padded_attention(inp, problem.causal, bq)
    for name, want in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        torch.testing.assert_close(ref[name], want, rtol=1e-9, atol=1e-9, msg=name)
    # rows that see no key: lse -inf and out 0 (cross case: the third sequence has no keys)
    empty = torch.isinf(ref["lse"])
    assert (ref["out"].permute(1, 0, 2)[empty] == 0).all()
    if problem.mode == "cross":
        assert empty[:, -4:].all() and not empty[:, 6:7].any()


def test_check_passes_lowp_and_catches_errors():
    p = Problem(batch=3, heads=2, head_dim=64, max_seqlen_q=12, sparsity=0.5, seed=2)
    inp = p.build()
    lowp = reference(inp, compute_dtype=torch.bfloat16, backward=False)

    def good(*a, **kw):
        return lowp["out"].to(torch.bfloat16)

    assert check(inp, good, backward=False).ok

    def unwritten(*a, **kw):
        out = lowp["out"].to(torch.bfloat16).clone()
        out[-1, -1, -1] = float("nan")
        return out

    rep = check(inp, unwritten, backward=False)
    assert not rep.ok and rep.checks[0].worst == (inp.q.shape[0] - 1, 1, 63)

    def off(*a, **kw):
        return (lowp["out"] * 1.05).to(torch.bfloat16)

    assert not check(inp, off, backward=False).ok


def test_compare_reports_shape_mismatch_and_infs():
    ref = torch.tensor([1.0, float("-inf")])
    assert compare("lse", torch.tensor([1.0, float("-inf")]), ref, ref, torch.float32).ok
    assert not compare("lse", torch.tensor([1.0, 0.0]), ref, ref, torch.float32).ok
    assert not compare("out", torch.zeros(3), ref, ref, torch.float32).ok


def test_single_key_rows_allow_fp32_noise_in_dk_only():
    """With one key per sequence the true dk is exactly 0; a flash kernel leaves fp32
    rounding noise there (dP and delta summed in different orders): that passes, a
    real error does not."""
    p = Problem(batch=2, heads=2, head_dim=64, max_seqlen_q=40, max_seqlen_k=1, mode="cross",
                sparsity=1.0, seed=5)
    inp = p.build()
    ref = reference(inp)
    assert float(ref["dk"].abs().max()) < 1e-12

    def with_dk_error(err):
        class F(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                return ref["out"].to(q.dtype)

            @staticmethod
            def backward(ctx, g):
                noise = err * torch.randn(ref["dk"].shape, dtype=torch.float64)
                return (ref["dq"].to(inp.q.dtype), (ref["dk"] + noise).to(inp.q.dtype),
                        ref["dv"].to(inp.q.dtype))

        return lambda q, k, v, *a, **kw: F.apply(q, k, v)

    assert check(inp, with_dk_error(1e-5)).ok  # about 3e-5 at most: over the 1e-5 floor
    assert not check(inp, with_dk_error(1e-2)).ok


def flash_style_grads(inp, causal, delta_scale=1.0):
    """fp64 gradients of one sequence (B = 1) formed as a flash kernel forms them: delta
    from the O rounded to the output dtype; `delta_scale` scales the rounding's effect."""
    q, k, v, do = (t.double() for t in (inp.q, inp.k, inp.v, inp.dout))
    sc = 1 / math.sqrt(q.shape[-1])
    lq, lk = q.shape[0], k.shape[0]
    s = torch.einsum("qhd,khd->hqk", q, k) * sc
    if causal:
        s = s.masked_fill(torch.arange(lk)[None] > torch.arange(lq)[:, None] + lk - lq, -math.inf)
    p = s.softmax(-1)
    o = torch.einsum("hqk,khd->qhd", p, v)
    o_stored = o + delta_scale * (o.to(inp.q.dtype).double() - o)
    dp = torch.einsum("qhd,khd->hqk", do, v)
    ds = p * (dp - (do * o_stored).sum(-1).T[..., None])
    return (o.to(inp.q.dtype), torch.einsum("hqk,khd->qhd", ds, k) * sc,
            torch.einsum("hqk,qhd->khd", ds, q) * sc, torch.einsum("hqk,qhd->khd", p, do))


def test_delta_from_the_stored_output_is_allowed_and_bounded():
    """A query that sees two keys with a nearly one-hot P (matrix seed 973477401, problem
    129, whose CuteDSL dq / dk failed by 2x the tolerance on the H200): delta formed from
    the bf16-rounded O alone moves dq and dk past the low-precision reference's error. The
    oracle allows exactly that effect, and no more."""
    p = Problem(batch=1, heads=1, head_dim=64, max_seqlen_q=64, max_seqlen_k=64,
                mode="cross", causal=True, seed=311560220)
    inp = p.build(lengths=([1], [2]))

    def flash(delta_scale):
        o, dq, dk, dv = flash_style_grads(inp, True, delta_scale)

        class F(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                return o

            @staticmethod
            def backward(ctx, g):
                return dq.to(inp.q.dtype), dk.to(inp.q.dtype), dv.to(inp.q.dtype)

        return lambda q, k, v, *a, **kw: F.apply(q, k, v)

    ref, lowp = reference(inp, causal=True), reference(inp, causal=True, compute_dtype=inp.q.dtype)
    _, dq, _, _ = flash_style_grads(inp, True)
    # without the allowance this is a failure: the rounding alone is past 2x lowp's error
    assert not compare("dq", dq, ref["dq"], lowp["dq"], inp.q.dtype).ok
    assert check(inp, flash(1.0), causal=True).ok
    assert not check(inp, flash(8.0), causal=True).ok


WHOLE = 1 << 62  # a budget every sequence's heads fit at once


@pytest.mark.parametrize("problem,lengths,with_dlse", [
    (Problem(batch=2, heads=8, kv_heads=2, head_dim=16, max_seqlen_q=24, causal=True, seed=3),
     None, False),
    (Problem(batch=3, heads=6, kv_heads=2, head_dim=16, max_seqlen_q=9, max_seqlen_k=23,
             mode="cross", causal=True, seed=4), ([9, 0, 4], [3, 23, 0]), True),
    (Problem(batch=3, heads=4, kv_heads=1, head_dim=16, max_seqlen_q=11, max_seqlen_k=17,
             mode="broadcast_q", seed=5), None, True),
])
def test_reference_in_head_chunks_matches_all_heads_at_once(problem, lengths, with_dlse):
    """Chunks of one head, of part of a KV group (G > 2 here) and of whole groups: out,
    lse and dq are the same numbers; dk / dv of a group split over chunks differ by
    rounding only."""
    inp = problem.build(lengths=lengths)
    kw = dict(causal=problem.causal, broadcast_q=problem.mode == "broadcast_q")
    gen = torch.Generator().manual_seed(1)
    if with_dlse:
        kw["dlse"] = torch.randn(problem.heads, inp.dout.shape[0], generator=gen, dtype=torch.float64)
    per_head = 8 * max(inp.max_seqlen_q, len(inp.q)) * inp.max_seqlen_k  # fp64 scores of one head
    G = problem.heads // problem.hkv
    for dt in (None, torch.bfloat16):
        whole = reference(inp, compute_dtype=dt, score_bytes=WHOLE, **kw)
        for budget, split in ((1, True), (per_head * (G - 1), True), (per_head * G, False)):
            got = reference(inp, compute_dtype=dt, score_bytes=budget // (2 if dt else 1), **kw)
            tol = 1e-12 if dt is None else 1e-2
            for name in ("out", "lse", "dq", "dk", "dv"):
                if split and name in ("dk", "dv"):
                    torch.testing.assert_close(got[name], whole[name], rtol=tol, atol=tol, msg=name)
                else:
                    assert torch.equal(got[name], whole[name]), (dt, budget, name)


def test_head_chunks_of_the_llm_shapes():
    """fp32 scores under 2 GiB a chunk: Llama-70B's heads (64 over 8 KV heads) in one group a
    chunk at 8k tokens, two heads at 16k; a budget under one head still takes one."""
    from harness.oracle import SCORE_BYTES, _head_chunks
    assert _head_chunks(64, 8, 4 * 8192 ** 2, SCORE_BYTES) == [(8 * g, 8 * g + 8, g, g + 1)
                                                                for g in range(8)]
    assert _head_chunks(64, 8, 4 * 16384 ** 2, SCORE_BYTES) == [(h, h + 2, h // 8, h // 8 + 1)
                                                                 for h in range(0, 64, 2)]
    assert _head_chunks(6, 2, 4 * 1024 ** 2, SCORE_BYTES) == [(0, 6, 0, 2)]
    assert _head_chunks(4, 1, 100, 1) == [(h, h + 1, 0, 1) for h in range(4)]


def test_a_failed_check_holds_no_tensors(monkeypatch):
    """The exception out of `check` (an out-of-memory error, say) keeps none of the
    references, inputs or graphs alive while a caller holds it; the frames of an
    exception the caller was handling are left alone."""
    import weakref

    import harness.oracle as oracle
    p = Problem(batch=2, heads=2, head_dim=16, max_seqlen_q=8, seed=1)
    inp = p.build()
    alive = []
    real = oracle.reference

    def recorded(*a, **kw):
        r = real(*a, **kw)
        alive.extend(weakref.ref(t) for t in r.values())
        return r

    def failing(q, k, v, *a, **kw):
        out = (q * 2).sum(-1, keepdim=True) * v[:1]  # a graph through q and v
        alive.extend(weakref.ref(t) for t in (q, out))
        raise RuntimeError("CUDA out of memory. Tried to allocate 13.11 GiB")

    def handled(x):
        raise KeyError("the caller's")

    monkeypatch.setattr(oracle, "reference", recorded)
    try:
        handled(torch.zeros(3))
    except KeyError as outer:
        with pytest.raises(RuntimeError, match="Tried to allocate") as info:
            check(inp, failing)
        assert outer.__traceback__.tb_next.tb_frame.f_locals["x"] is not None
    assert len(alive) == 12 and info.value.__traceback__ is not None
    assert [w for w in alive if w() is not None] == []

    def attend_fails(*a):
        alive.append(weakref.ref(a[0]))
        raise RuntimeError("out of memory in the reference")

    alive.clear()
    monkeypatch.setattr(oracle, "_attend", attend_fails)
    with pytest.raises(RuntimeError, match="in the reference"):
        check(inp, failing)
    assert len(alive) == 1 and alive[0]() is None


@pytest.mark.gpu
def test_gate_of_a_long_many_head_problem_fits_and_a_failure_frees_it():
    """varlen-llm's B10 H64/8 D128 L8192 causal problem gated on 4 sequences (up to 7415
    tokens): both references, forward and backward, peak under 24 GiB over the inputs,
    and a check that fails leaves no reference tensor allocated while its exception is
    held (what stays is the first matmuls' cuBLAS workspace: 64 MiB on the H200)."""
    import gc

    from harness.problems import varlen_llm
    p = next(x for x in varlen_llm() if x.max_seqlen_q == 8192 and x.heads == 64).replace(batch=4)
    inp = p.build("cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()

    def failing(*a, **kw):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (raised by the test)")

    with pytest.raises(torch.cuda.OutOfMemoryError) as info:
        check(inp, failing, causal=True)
    gc.collect()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak < 24 << 30, f"peak {peak / 2 ** 30:.2f} GiB"
    left = torch.cuda.memory_allocated() - base
    assert left <= 128 << 20 and info.value is not None, f"{left / 2 ** 20:.0f} MiB left"


FP8_SHAPES = [dict(mode="self", causal=True), dict(mode="cross", max_seqlen_k=20),
              dict(mode="broadcast_q", max_seqlen_q=8, max_seqlen_k=20)]


@pytest.mark.parametrize("shape", FP8_SHAPES)
def test_fp8_oracle_on_the_portable_kernel(shape):
    """fp8 problems through the oracle with the portable kernel (CPU interpreter): the
    reference on the dequantized values accepts it, and a call that drops a descale
    fails."""
    from jagged.portable import jagged_attention
    p = Problem(**{**dict(batch=3, heads=4, kv_heads=2, head_dim=64, max_seqlen_q=24,
                          sparsity=0.5, dtype="fp8"), **shape})
    inp = p.build()
    kw = dict(causal=p.causal, broadcast_q=p.mode == "broadcast_q", backward=False)
    rep = check(inp, jagged_attention, **kw)
    assert rep.ok, str(rep)

    def no_v_descale(*a, v_descale, **k):
        return jagged_attention(*a, v_descale=None, **k)
    assert not check(inp, no_v_descale, **kw).ok
    with pytest.raises(ValueError, match="forward only"):
        check(inp, jagged_attention, causal=p.causal, broadcast_q=kw["broadcast_q"])
