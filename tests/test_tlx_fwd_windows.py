"""The TLX Hopper forward's row windows, emulated in the Triton interpreter: the kernel's
own tile decoding (`_coords` -> schedule.window_coords), row bounds (`_row_bounds`) and
masked softmax (`_softmax`, WINDOWS) over its window list (jagged.tiles.window_tiles),
with plain loads and dots in place of TMA and wgmma, against the oracle. The GPU tests
(tests/test_gpu_matrix.py, test_windows) run the kernel itself."""
import pytest
import torch
import triton
import triton.language as tl

from harness.oracle import check
from harness.problems import Problem
from _interp import interp

fh = pytest.importorskip("kernels_tlx.fwd_hopper")

LN2 = 0.6931471805599453


@triton.jit
def _consumer(q, k, v, o, lse, tiles, tile, qk_scale, scales, n_q, n_k, n_out,
              cid: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
              FP8: tl.constexpr):
    rows = fh._row_bounds(tiles, tile, qk_scale, scales, cid, CAUSAL, FP8)
    qr = tile.q_start + cid * 64 + tl.arange(0, 64)
    d = tl.arange(0, D)
    qv = tl.load(q + (qr * tiles.H + tile.h)[:, None] * D + d[None, :],
                 mask=(qr < n_q)[:, None], other=0.0)
    m_i = tl.full([64], float("-inf"), tl.float32)
    l_i = tl.zeros([64], tl.float32)
    acc = tl.zeros([64, D], tl.float32)
    for j in range(0, tile.n_end):
        kr = tile.k_start + j * BLOCK_N + tl.arange(0, BLOCK_N)
        at = (kr * (tiles.H // tiles.GROUP) + tile.hk)[:, None] * D + d[None, :]
        kv = tl.load(k + at, mask=(kr < n_k)[:, None], other=0.0)
        vv = tl.load(v + at, mask=(kr < n_k)[:, None], other=0.0)
        qk = tl.dot(qv.to(tl.float32), tl.trans(kv.to(tl.float32)))  # interpreter: fp32 dots
        p, alpha, m_i, l_i = fh._softmax(qk, m_i, l_i, qk_scale, rows, j * BLOCK_N,
                                         tile.len_q, tile.len_k, BLOCK_N, True, CAUSAL, True)
        acc = acc * alpha[:, None] + tl.dot(p.to(vv.dtype).to(tl.float32), vv.to(tl.float32))
    # fh.store's arithmetic and row bound, without its shared-memory staging
    empty = l_i == 0.0
    l_use = tl.where(empty, 1.0, l_i)
    lse_v = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_use)) * LN2)
    r = cid * 64 + tl.arange(0, 64)
    out_rows = tile.out_start + r
    tl.store(o + (out_rows * tiles.H + tile.h)[:, None] * D + d[None, :],
             (acc / l_use[:, None]).to(o.dtype.element_ty), mask=(r < tile.len_q)[:, None])
    tl.store(lse + tile.h * n_out + out_rows, lse_v, mask=r < tile.len_q)


@triton.jit
def _emulate(q, k, v, o, lse, cu_q, cu_k, order, count, win, n_win, H, GROUP, qk_scale,
             q_descale, k_descale, n_q, n_k, D: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, FP8: tl.constexpr):
    tiles = fh.Tiles(order, tl.load(count), cu_q, cu_k, 0, H, GROUP, n_win, win)
    t = tl.program_id(0)
    if t < tiles.n_pairs * H:
        tile = fh._coords(t, tiles, BLOCK_M, BLOCK_N, CAUSAL, False, True)
        scales = fh.Scales(q_descale, k_descale)
        for cid in tl.static_range(2):
            _consumer(q, k, v, o, lse, tiles, tile, qk_scale, scales, n_q, n_k, n_q, cid, D,
                      BLOCK_N, CAUSAL, FP8)


def emulated_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal=False, softmax_scale=None,
                     broadcast_q=False, q_descale=None, k_descale=None, v_descale=None):
    """fp8 (descales given): e4m3 q and k, V dequantized as fh.forward does."""
    from jagged.fp8 import dequantize_rows
    from jagged.tiles import window_tiles
    cfg = fh.WINDOW_CONFIG
    n_q, H, D = q.shape
    scale = softmax_scale if softmax_scale is not None else D ** -0.5
    assert fh.takes_windows(n_q, k.shape[0], cu_q.shape[0] - 1, max_q, broadcast_q)
    order, count, win = window_tiles(cu_q, cu_k, n_q, max_q, cfg.block_m, cfg.block_n)
    fp8 = q_descale is not None
    if fp8:
        v = dequantize_rows(v, v_descale, cu_k)
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16 if fp8 else q.dtype)
    lse = torch.full((H, n_q), float("nan"), dtype=torch.float32)
    _emulate[(win.shape[1] * H,)](q.detach(), k.detach(), v.detach(), out, lse, cu_q, cu_k,
                                  order, count, win, win.shape[1], H, H // k.shape[1],
                                  scale * 1.4426950408889634, q_descale, k_descale, n_q,
                                  k.shape[0], D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                                  CAUSAL=causal, FP8=fp8)
    return out, lse


def _short(n, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, (n,), generator=g).tolist()


CASES = [  # (id, problem, (len_q, len_k)): windows spanning many sequences, empties, ones
    ("self-d64", Problem(batch=40, heads=2, head_dim=64, max_seqlen_q=40),
     ([0, 1, 37, 0, 0] + _short(35, 0, 12, 1),) * 2),
    ("self-causal-gqa-d128", Problem(batch=30, heads=4, kv_heads=2, head_dim=128,
                                     max_seqlen_q=60, causal=True),
     ([60] + _short(28, 0, 9, 2) + [1],) * 2),
    ("cross-causal-mixed", Problem(batch=24, heads=2, head_dim=64, max_seqlen_q=30,
                                   max_seqlen_k=90, mode="cross", causal=True),
     (_short(24, 0, 30, 3), _short(24, 0, 90, 4))),
    # a window ending among rows that see no key (len_q > len_k, causal): the earlier
    # sequences' keys are still read
    ("cross-causal-blind-tail", Problem(batch=3, heads=2, head_dim=64, max_seqlen_q=100,
                                        max_seqlen_k=150, mode="cross", causal=True),
     ([60, 100, 5], [150, 2, 7])),
    ("cross-lq>lk", Problem(batch=50, heads=2, kv_heads=1, head_dim=64, max_seqlen_q=20,
                            max_seqlen_k=6, mode="cross", causal=True),
     (_short(50, 0, 20, 5), _short(50, 0, 6, 6))),
    # fp8: every sequence its own descales, a window's rows each their own
    ("fp8-self-gqa-d64", Problem(batch=40, heads=4, kv_heads=2, head_dim=64,
                                 max_seqlen_q=40, dtype="fp8"),
     ([0, 1, 37, 0, 0] + _short(35, 0, 12, 7),) * 2),
    ("fp8-cross-causal-d128", Problem(batch=24, heads=2, head_dim=128, max_seqlen_q=30,
                                      max_seqlen_k=90, mode="cross", causal=True, dtype="fp8"),
     (_short(24, 0, 30, 8), _short(24, 0, 90, 9))),
]


@interp
@pytest.mark.parametrize("p, lengths", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_window_consumer_math_against_oracle(p, lengths):
    inp = p.build(lengths=lengths)
    rep = check(inp, emulated_forward, causal=p.causal, backward=False)
    assert rep.ok, f"{p.label()}\n{rep}"
