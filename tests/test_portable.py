"""jagged.portable against the oracle: forward and backward, every mode.

CPU tests run in the Triton interpreter (tests/conftest.py) on small problems whose
lengths are given explicitly, to hit zero-length, length-1 and odd lengths, causal
with len_q > len_k and len_q < len_k, GQA/MQA, both head dims and both dtypes.
"""
import pytest
import torch

from harness.oracle import check
from harness.problems import Problem
from jagged.portable import jagged_attention


def run_check(p: Problem, lengths=None, device="cpu", softmax_scale=None):
    inp = p.build(device=device, lengths=lengths)
    rep = check(inp, lambda *a, **kw: jagged_attention(*a, return_lse=True, **kw),
                causal=p.causal, broadcast_q=p.mode == "broadcast_q", softmax_scale=softmax_scale)
    assert rep.ok, f"{p.label()} lengths={lengths}\n{rep}"


# (id, problem, (len_q, len_k) or None); max_seqlen_* are raised to the given lengths
CASES = [
    ("self-bf16-d64", Problem(batch=3, heads=2, head_dim=64, max_seqlen_q=40), ([37, 1, 20],) * 2),
    ("self-fp16-d128-causal-empty", Problem(batch=3, heads=2, head_dim=128, max_seqlen_q=33,
                                            causal=True, dtype="fp16"), ([33, 0, 17],) * 2),
    ("self-bf16-d128-gqa-causal", Problem(batch=3, heads=4, kv_heads=2, head_dim=128,
                                          max_seqlen_q=29, causal=True), ([29, 16, 3],) * 2),
    ("self-fp16-d64-mqa", Problem(batch=2, heads=4, kv_heads=1, head_dim=64, max_seqlen_q=21,
                                  dtype="fp16"), ([21, 6],) * 2),
    ("self-len1-causal", Problem(batch=3, heads=2, head_dim=64, max_seqlen_q=1, causal=True),
     ([1, 1, 1],) * 2),
    ("self-all-empty", Problem(batch=2, heads=2, head_dim=64, max_seqlen_q=8), ([0, 0],) * 2),
    ("self-drawn-lengths", Problem(batch=4, heads=2, head_dim=64, max_seqlen_q=48, sparsity=0.5,
                                   seed=3), None),
    ("cross-bf16-empty-q-and-k", Problem(batch=3, heads=2, head_dim=64, max_seqlen_q=24,
                                         max_seqlen_k=17, mode="cross"), ([24, 5, 0], [17, 0, 9])),
    ("cross-causal-lq>lk", Problem(batch=2, heads=2, head_dim=64, max_seqlen_q=30, max_seqlen_k=12,
                                   mode="cross", causal=True), ([30, 9], [12, 4])),
    ("cross-causal-lq<lk-fp16", Problem(batch=2, heads=2, head_dim=64, max_seqlen_q=12,
                                        max_seqlen_k=31, mode="cross", causal=True, dtype="fp16"),
     ([7, 12], [31, 20])),
    ("cross-causal-gqa-d128-mixed", Problem(batch=4, heads=4, kv_heads=2, head_dim=128,
                                            max_seqlen_q=20, max_seqlen_k=19, mode="cross",
                                            causal=True, dtype="fp16"),
     ([1, 20, 0, 5], [19, 1, 3, 0])),
    ("bcast-bf16-d64", Problem(batch=3, heads=2, head_dim=64, max_seqlen_q=16, max_seqlen_k=30,
                               mode="broadcast_q"), ([16] * 3, [30, 0, 7])),
    ("bcast-fp16-d128-gqa-causal", Problem(batch=4, heads=4, kv_heads=2, head_dim=128,
                                           max_seqlen_q=13, max_seqlen_k=25, mode="broadcast_q",
                                           causal=True, dtype="fp16"), ([13] * 4, [5, 25, 13, 0])),
    ("bcast-lq1-bf16", Problem(batch=3, heads=2, head_dim=64, max_seqlen_q=1, max_seqlen_k=18,
                               mode="broadcast_q", causal=True), ([1] * 3, [18, 1, 0])),
]


@pytest.mark.parametrize("p, lengths", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_against_oracle(p, lengths):
    run_check(p, lengths)


def test_softmax_scale():
    p = Problem(batch=2, heads=2, head_dim=64, max_seqlen_q=19, max_seqlen_k=23, mode="cross",
                causal=True)
    run_check(p, ([19, 4], [23, 2]), softmax_scale=0.3)


def test_max_seqlen_above_real_lengths():
    """Declared maxima larger than every sequence: the extra blocks must do nothing."""
    p = Problem(batch=2, heads=2, head_dim=64, max_seqlen_q=64, max_seqlen_k=80, mode="cross")
    run_check(p, ([5, 17], [9, 3]))


def test_plain_output_and_grad():
    """Without return_lse the op returns `out` alone and still differentiates."""
    inp = Problem(batch=2, heads=2, head_dim=64, max_seqlen_q=9).build(lengths=([9, 4],) * 2)
    q = inp.q.clone().requires_grad_()
    out = jagged_attention(q, inp.k, inp.v, *inp.args()[3:])
    assert isinstance(out, torch.Tensor) and out.shape == inp.q.shape
    out.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad.float()).all()


# ----------------------------------------------------------------------------- GPU

GPU_CASES = [
    ("gem-jagged", Problem(batch=64, heads=4, head_dim=128, max_seqlen_q=512, sparsity=0.5)),
    ("gem-jagged-fp16-d64", Problem(batch=64, heads=4, head_dim=64, max_seqlen_q=512,
                                    sparsity=0.5, dtype="fp16")),
    ("causal-gqa", Problem(batch=8, heads=8, kv_heads=2, head_dim=128, max_seqlen_q=1024,
                           sparsity=0.9, causal=True)),
    ("cross-short-kv", Problem(batch=64, heads=4, head_dim=128, max_seqlen_q=512,
                               max_seqlen_k=64, mode="cross", sparsity=0.5, causal=True)),
    ("bcast", Problem(batch=64, heads=4, head_dim=128, max_seqlen_q=64, max_seqlen_k=512,
                      mode="broadcast_q", sparsity=0.5)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("p", [c[1] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES])
def test_gpu_against_oracle(p):
    run_check(p, device="cuda")
