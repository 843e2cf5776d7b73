"""The TLX Hopper forward's online softmax step (`fwd_hopper._softmax`) in the Triton
interpreter, masked and not, causal (bottom right) and not, against a torch reference of
the same step in the log2 domain: two KV blocks in a row from a row state that has seen
no key, including rows that see none of the block and rows that see no key at all. The
window masks are covered with the whole window consumer in test_tlx_fwd_windows.py."""
import math

import pytest
import torch
import triton
import triton.language as tl

from _interp import interp

fh = pytest.importorskip("kernels_tlx.fwd_hopper")
pytestmark = interp

M, N = 64, 64


@triton.jit
def _two_steps(qk_ptr, out_ptr, m_ptr, l_ptr, a_ptr, qk_scale, m0, n0, len_q, len_k,
               M: tl.constexpr, N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    r = tl.arange(0, M)
    c = tl.arange(0, N)
    m_i = tl.full([M], float("-inf"), tl.float32)
    l_i = tl.zeros([M], tl.float32)
    rows = m0 + r
    for j in tl.static_range(2):
        qk = tl.load(qk_ptr + j * M * N + r[:, None] * N + c[None, :])
        p, alpha, m_i, l_i = fh._softmax(qk, m_i, l_i, qk_scale, rows, n0 + j * N, len_q,
                                         len_k, N, MASKED, CAUSAL)
        tl.store(out_ptr + j * M * N + r[:, None] * N + c[None, :], p)
        tl.store(a_ptr + j * M + r, alpha)
    tl.store(m_ptr + r, m_i)
    tl.store(l_ptr + r, l_i)


def reference(qk, scale, m0, n0, len_q, len_k, masked, causal):
    """p, alpha per block and the final (m, l), log2 domain; a row with no key so far
    keeps m = -inf and takes exponents against 0 (the kernel's guard)."""
    m = torch.full((M,), -math.inf)
    l = torch.zeros(M)
    ps, alphas = [], []
    rows = torch.arange(M) + m0
    for j in range(2):
        s = qk[j] * scale
        if masked:
            col = n0 + j * N + torch.arange(N)
            limit = torch.full((M,), len_k)
            if causal:
                limit = torch.minimum(rows + (len_k - len_q + 1), torch.tensor(len_k))
            s = s.masked_fill(col[None, :] >= limit[:, None], -math.inf)
        m_new = torch.maximum(m, s.max(1).values)
        m_use = torch.where(m_new == -math.inf, torch.zeros(()), m_new)
        p = torch.exp2(s - m_use[:, None])
        alpha = torch.exp2(m - m_use)
        l = l * alpha + p.sum(1)
        m = m_new
        ps.append(p)
        alphas.append(alpha)
    return ps, alphas, m, l


@pytest.mark.parametrize("masked,causal,m0,n0,len_q,len_k", [
    (False, False, 0, 0, 64, 128),
    (True, False, 0, 64, 64, 100),      # the sequence ends inside the second block
    (True, False, 0, 0, 64, 0),         # no key at all: m stays -inf, l 0
    (True, True, 0, 0, 64, 64),         # the diagonal
    (True, True, 64, 64, 200, 150),     # len_q > len_k: the first rows see no key
    (True, True, 0, 0, 30, 90),         # len_q < len_k, rows past len_q
])
def test_softmax_step(masked, causal, m0, n0, len_q, len_k):
    g = torch.Generator().manual_seed(7)
    qk = torch.randn(2, M, N, generator=g) * 4
    scale = 0.125 * 1.4426950408889634
    p = torch.empty(2, M, N)
    m, l, a = torch.empty(M), torch.empty(M), torch.empty(2, M)
    _two_steps[(1,)](qk, p, m, l, a, scale, m0, n0, len_q, len_k, M=M, N=N, MASKED=masked,
                     CAUSAL=causal)
    ps, alphas, m_ref, l_ref = reference(qk, scale, m0, n0, len_q, len_k, masked, causal)
    for j in range(2):
        torch.testing.assert_close(p[j], ps[j], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a[j], alphas[j], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m, m_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(l, l_ref, rtol=1e-5, atol=1e-5)
    if len_k == 0:
        assert torch.isinf(m).all() and (l == 0).all()
