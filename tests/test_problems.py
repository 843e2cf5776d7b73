import pytest
import torch

from harness.problems import Problem, causal_pairs, jagged_lengths, offsets, suites
from harness.suites import suite


@pytest.mark.parametrize("s", [0.1, 0.3, 0.5, 0.9, 1.0])
def test_mean_length_follows_sparsity(s):
    lens = jagged_lengths(20000, 1000, s, torch.Generator().manual_seed(0)).float()
    assert abs(lens.mean().item() - s * 1000) < 0.02 * 1000
    assert lens.max() <= 1000 and lens.min() >= (1 if s < 0.5 else round((2 * s - 1) * 1000))


def test_dense_is_full_length():
    p = Problem(batch=5, heads=2, head_dim=64, max_seqlen_q=77, sparsity=1.0)
    assert p.lengths()[0].tolist() == [77] * 5


@pytest.mark.parametrize("mode", ["self", "cross", "broadcast_q"])
def test_build_shapes_offsets_and_determinism(mode):
    p = Problem(batch=6, heads=4, kv_heads=2, head_dim=64, max_seqlen_q=50, sparsity=0.5,
                max_seqlen_k=None if mode == "self" else 30, mode=mode, seed=3)
    a, b = p.build(), p.build()
    for x, y in zip(a.args()[:3], b.args()[:3]):
        assert torch.equal(x, y)
    lq, lk = p.lengths()
    assert a.cu_seqlens_k.dtype == torch.int32 and a.cu_seqlens_k[0] == 0
    assert a.cu_seqlens_k[-1] == a.k.shape[0] == lk.sum()
    assert (a.cu_seqlens_k[1:] >= a.cu_seqlens_k[:-1]).all()
    assert a.k.shape[1:] == (2, 64) and a.q.shape[1:] == (4, 64)
    if mode == "broadcast_q":
        assert a.cu_seqlens_q is None and a.q.shape[0] == 50
        assert a.dout.shape[0] == 6 * 50
    else:
        assert a.cu_seqlens_q[-1] == a.q.shape[0] == lq.sum() == a.dout.shape[0]
    if mode == "self":
        assert torch.equal(lq, lk)
    assert a.max_seqlen_k >= int(lk.max()) and a.max_seqlen_q >= int(lq.max())
    assert not torch.equal(a.q, p.replace(seed=4).build().q)
    assert a.q.abs().sum() > 0


def test_causal_pairs_brute_force():
    gen = torch.Generator().manual_seed(0)
    lq, lk = torch.randint(0, 20, (200,), generator=gen), torch.randint(0, 20, (200,), generator=gen)
    brute = [sum(1 for i in range(a) for j in range(b) if j <= i + b - a)
             for a, b in zip(lq.tolist(), lk.tolist())]
    assert causal_pairs(lq, lk).tolist() == brute


def test_flops_exact():
    p = Problem(batch=4, heads=3, head_dim=64, max_seqlen_q=32, sparsity=0.5, seed=1)
    lq, lk = p.lengths()
    assert p.flops("fwd") == 4 * 3 * 64 * int((lq * lk).sum())
    assert p.flops("bwd") == 2.5 * p.flops("fwd")
    pc = p.replace(causal=True)
    assert pc.flops("fwd") == 4 * 3 * 64 * int(causal_pairs(lq, lk).sum()) < p.flops("fwd")


def test_offsets_and_suites():
    assert offsets(torch.tensor([2, 0, 3])).tolist() == [0, 2, 2, 5]
    assert {"gem-jagged", "gem-cross", "llm-dense", "smoke"} <= set(suites())
    gem = suite("gem-jagged")
    assert {p.sparsity for p in gem} == {0.1, 0.5, 0.9} and all(p.batch == 1152 for p in gem)
    gem64 = suite("gem-jagged-d64")                  # the same grid at D = 64 (bf16 only)
    assert [p.replace(head_dim=128, suite="gem-jagged") for p in gem64] == \
        [p for p in gem if p.dtype == "bf16"]
    assert {p.head_dim for p in gem64} == {64}
    with pytest.raises(ValueError, match="unknown suite"):
        suite("nope")
    with pytest.raises(ValueError, match="mode"):
        Problem(batch=1, heads=1, head_dim=64, max_seqlen_q=4, mode="bogus")


def test_fp8_problem_is_its_bf16_twin_quantized():
    """fp8: the bf16 twin's values quantized per (sequence, KV head), descale = amax / 448
    (q: a KV head's query heads share one); the dequantized values within e4m3's
    rounding of the twin's."""
    p = Problem(batch=4, heads=4, kv_heads=2, head_dim=64, max_seqlen_q=30, sparsity=0.5,
                causal=True, dtype="fp8")
    f, b = p.build(lengths=([9, 0, 30, 4], [9, 0, 30, 4])), \
        p.replace(dtype="bf16").build(lengths=([9, 0, 30, 4], [9, 0, 30, 4]))
    assert (f.q.dtype, f.k.dtype, f.v.dtype) == (torch.float8_e4m3fn,) * 3
    assert f.out_dtype == torch.bfloat16 and set(f.descales()) == {"q_descale", "k_descale", "v_descale"}
    assert b.descales() == {} and b.out_dtype == torch.bfloat16
    for x, ref, ds, lens, G in ((f.q, b.q, f.q_descale, f.lengths_q, 2),
                                (f.k, b.k, f.k_descale, f.lengths_k, 1),
                                (f.v, b.v, f.v_descale, f.lengths_k, 1)):
        assert ds.shape == (4, 2) and ds.dtype == torch.float32 and ds.is_contiguous()
        assert float(ds[1].sub(1).abs().max()) == 0  # an empty sequence: 1
        seq = torch.repeat_interleave(torch.arange(4), lens)
        real = x.float() * ds.repeat_interleave(G, 1)[seq][..., None]
        amax = ref.float().abs()
        for s in (0, 2, 3):  # each (sequence, KV head)'s amax lands on 448
            rows = amax[seq == s].reshape(int(lens[s]), 2, -1)
            torch.testing.assert_close(ds[s], rows.amax(dim=(0, 2)) / 448)
        assert float((real - ref.float()).abs().max()) <= float(amax.max()) / 16


def test_fp8_rows_in_the_suites():
    """llm-dense and gem-jagged carry an fp8 twin of every bf16 problem; quick keeps two
    fp8 cells a suite."""
    from harness.__main__ import quick_subset
    s = suites()
    for name in ("llm-dense", "gem-jagged"):
        bf16 = [p for p in s[name] if p.dtype == "bf16"]
        fp8 = [p for p in s[name] if p.dtype == "fp8"]
        assert fp8 == [p.replace(dtype="fp8") for p in bf16]
        quick = [p for p in quick_subset(s[name]) if p.dtype == "fp8"]
        assert 1 <= len(quick) <= 2
