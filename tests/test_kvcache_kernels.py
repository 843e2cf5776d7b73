"""The core's small KV-cache kernels (jagged/kvcache_kernels.py): the split-KV combine
against logsumexp at split counts from 1 to MAX_SPLITS, and the device value check
spread over page-table chunks (a bad entry past the first chunk is caught), in the
Triton interpreter; both compiled for sm_90a without spills (the check with and without
the launch order's rank: tests/test_decode_order.py tests that)."""
import math

import pytest
import torch

from jagged import kvcache_kernels as kk
from jagged.kvcache import MAX_SPLITS
from _interp import interp, interpreter_asserts


@interp
@pytest.mark.parametrize("S", [1, 5, 33, MAX_SPLITS])
def test_combine_matches_logsumexp(S):
    g = torch.Generator().manual_seed(S)
    N, H, D = 7, 3, 64
    o = torch.randn(S, N, H, D, generator=g)
    lse = torch.randn(S, H, N, generator=g) * 3
    if S > 1:
        lse[1] = -math.inf                  # a split that saw no key
    lse[:, 0, 4] = -math.inf                # a row no split saw
    o[:, 4, 0] = 0.0
    out = torch.full((N, H, D), float("nan")).bfloat16()
    lse_out = torch.full((H, N), float("nan"))
    kk.combine(o, lse, out, lse_out)
    want_lse = torch.logsumexp(lse, 0)
    w = torch.nan_to_num(torch.exp(lse - want_lse[None]), nan=0.0)   # [S, H, N]
    want = torch.einsum("shn,snhd->nhd", w, o)
    assert torch.equal(torch.isinf(lse_out), torch.isinf(want_lse))
    fin = torch.isfinite(want_lse)
    torch.testing.assert_close(lse_out[fin], want_lse[fin], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    assert torch.all(out[4, 0] == 0)


def _paged(bad_at=None, page_size=1, n_k=(1500, 3)):
    """A page table wider than one check chunk; entry `bad_at` = (b, p) points past
    the pool."""
    max_pages = 1600
    k_cache = torch.zeros(2000, page_size, 1, 64, dtype=torch.bfloat16)
    pt = torch.arange(2 * max_pages, dtype=torch.int32).view(2, max_pages) % 2000
    if bad_at is not None:
        pt[bad_at] = 2000
    return k_cache, torch.tensor(n_k, dtype=torch.int32), pt, max_pages * page_size


@interp
def test_check_catches_a_bad_page_past_the_first_chunk():
    from triton.runtime.errors import InterpreterError
    k_cache, n, pt, cap = _paged(bad_at=(0, kk.CHECK_BLOCK + 100))
    with interpreter_asserts(), pytest.raises(InterpreterError, match="page pool"):
        kk.check_inputs_async(2, k_cache, n, pt, None, 1, cap)


@interp
def test_check_passes_good_input_and_ignores_unused_pages():
    k_cache, n, pt, cap = _paged(bad_at=(1, kk.CHECK_BLOCK + 100))  # past n_k(1) = 3
    with interpreter_asserts():
        kk.check_inputs_async(2, k_cache, n, pt, None, 1, cap)


def test_kernels_compile_for_sm90():
    from harness.compile_check import compile_kernel
    rep = compile_kernel(kk._combine_kernel, signature={
        "o_part": "*fp32", "lse_part": "*fp32", "out": "*bf16", "lse": "*fp32",
        "n_rows": "i32", "n_splits": "i32"},
        constexprs={"H": 32, "D": 128, "S_POW2": MAX_SPLITS}, arch=90, num_warps=8)
    assert not rep.spills, rep
    assert rep.fits(), rep
    for order in (False, True):
        rep = compile_kernel(kk._inputs_check_kernel, signature={
            "cache_seqlens": "*i32", "page_table": "*i32", "cu_q": "*i32", "order": "*i32",
            "batch": "i32", "capacity": "i32", "max_pages": "i32", "num_pages": "i32",
            "page_size": "i32", "n_q": "i32", "max_q": "i32"},
            constexprs={"PAGED": True, "CHECK_Q": True, "ORDER": order,
                        "BLOCK": kk.CHECK_BLOCK, "RANK": kk.RANK_BLOCK}, arch=90, num_warps=4)
        assert not rep.spills, rep
