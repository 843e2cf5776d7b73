"""jagged.seqinfo: the Triton helpers (in the interpreter on CPU) equal their torch
references, and the references equal the bottom-right mask counted pair by pair, over
random lengths with 0 and 1, len_q > len_k and len_q < len_k."""
import pytest
import torch
import triton
import triton.language as tl

from harness.problems import offsets
from jagged.seqinfo import (causal_kv_end, causal_kv_end_ref, causal_q_start,
                            causal_q_start_ref, causal_visible, causal_visible_ref,
                            seq_range, seq_range_ref)

R = 64  # rows / keys probed per sequence: past every length drawn below


def _lengths(seed):
    g = torch.Generator().manual_seed(seed)
    lq = torch.randint(0, 40, (24,), generator=g)
    lk = torch.randint(0, 40, (24,), generator=g)
    lq[:6], lk[:6] = torch.tensor([0, 1, 0, 1, 30, 3]), torch.tensor([0, 0, 1, 1, 3, 30])
    return lq, lk


@triton.jit
def _probe(cu_q, cu_k, out, dense_len, DENSE: tl.constexpr, R: tl.constexpr):
    """Per sequence b: out[b, 0:4] the ranges, then causal_kv_end and causal_q_start at
    0..R-1, then causal_visible's R x R pairs."""
    b = tl.program_id(0)
    q0, len_q = seq_range(cu_q, b, dense_len, DENSE)
    k0, len_k = seq_range(cu_k, b, 0, False)
    base = out + b * (4 + 2 * R + R * R)
    tl.store(base, q0)
    tl.store(base + 1, len_q)
    tl.store(base + 2, k0)
    tl.store(base + 3, len_k)
    r = tl.arange(0, R)
    tl.store(base + 4 + r, causal_kv_end(r, len_q, len_k))
    tl.store(base + 4 + R + r, causal_q_start(r, len_q, len_k))
    vis = causal_visible(r[:, None], r[None, :], len_q, len_k)
    tl.store(base + 4 + 2 * R + r[:, None] * R + r[None, :], vis.to(tl.int32))


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_triton_helpers_match_references(dense, seed):
    lq, lk = _lengths(seed)
    B = lq.numel()
    if dense:
        lq = torch.full((B,), 17)
    cu_q, cu_k = offsets(lq), offsets(lk)
    out = torch.full((B, 4 + 2 * R + R * R), -7, dtype=torch.int32)
    _probe[(B,)](cu_k if dense else cu_q, cu_k, out, 17, DENSE=dense, R=R)
    q0, len_q = seq_range_ref(None, 17, B) if dense else seq_range_ref(cu_q)
    k0, len_k = seq_range_ref(cu_k)
    assert torch.equal(out[:, 0], q0.int()) and torch.equal(out[:, 1], len_q.int())
    assert torch.equal(out[:, 2], k0.int()) and torch.equal(out[:, 3], len_k.int())
    r = torch.arange(R)
    lq_, lk_ = len_q[:, None], len_k[:, None]
    assert torch.equal(out[:, 4:4 + R], causal_kv_end_ref(r[None], lq_, lk_).int())
    assert torch.equal(out[:, 4 + R:4 + 2 * R], causal_q_start_ref(r[None], lq_, lk_).int())
    vis = causal_visible_ref(r[None, :, None], r[None, None, :], lq_[:, :, None], lk_[:, :, None])
    assert torch.equal(out[:, 4 + 2 * R:].view(B, R, R), vis.int())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_references_equal_the_mask(seed):
    """Counted pair by pair from 'row i sees key j iff j <= i + len_k - len_q':
    causal_kv_end(row_end) is one past the last key the rows below row_end see (row_end
    >= 1, len_q >= 1), causal_kv_end(m0 + 1) the keys every row from m0 sees, causal_q_start(n0) the
    first row that sees key n0 (len_q if none); all within the sequence."""
    for len_q, len_k in zip(*(x.tolist() for x in _lengths(seed))):
        seen = [[j for j in range(len_k) if j <= i + len_k - len_q] for i in range(len_q)]
        for row_end in range(1, len_q + 3) if len_q else ():  # blocks may pass the end
            rows = seen[:row_end]
            want = max((len(s) for s in rows), default=0)
            assert int(causal_kv_end_ref(row_end, len_q, len_k)) == want, (len_q, len_k, row_end)
        for m0 in range(len_q):
            every = min(len(s) for s in seen[m0:])
            assert int(causal_kv_end_ref(m0 + 1, len_q, len_k)) == every
        for n0 in range(len_k + 2):
            first = next((i for i in range(len_q) if n0 in seen[i]), len_q)
            assert int(causal_q_start_ref(n0, len_q, len_k)) == first, (len_q, len_k, n0)
            if n0 < len_k:
                assert all(bool(causal_visible_ref(i, n0, len_q, len_k)) == (n0 in seen[i])
                           for i in range(len_q))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unmasked_rows_see_their_keys(seed):
    """The backward's mask skip (TLX `_unmasked_from`, CuteDSL `unmasked_from`): the rows
    from causal_q_start(n_end - 1) see every key of [n0, n_end) (n_end <= len_k), and the
    row before it misses one, so a step from there on needs no causal mask, and none
    before."""
    for len_q, len_k in zip(*(x.tolist() for x in _lengths(seed))):
        i, j = torch.arange(len_q)[:, None], torch.arange(len_k)[None, :]
        vis = causal_visible_ref(i, j, len_q, len_k)  # [len_q, len_k]
        for n_end in range(1, len_k + 1):
            first = int(causal_q_start_ref(n_end - 1, len_q, len_k))
            assert bool(vis[first:, :n_end].all()), (len_q, len_k, n_end)  # any n0 < n_end
            if 0 < first < len_q:
                assert not bool(vis[first - 1, n_end - 1])
