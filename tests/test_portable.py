"""jagged.portable against the oracle: forward and backward, every mode.

CPU tests run in the Triton interpreter (tests/conftest.py) on small problems whose
lengths are given explicitly, to hit zero-length, length-1 and odd lengths, causal
with len_q > len_k and len_q < len_k, GQA/MQA, both head dims and both dtypes.
"""
import os

import pytest
import torch
import triton
import triton.language as tl

from harness.oracle import check
from harness.problems import Problem, offsets
from jagged.portable import jagged_attention
from jagged.seqinfo import col_q_range, row_kv_range, row_seq


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
    # mean lengths 26 and 13: the forward over row windows
    ("short-windows", Problem(batch=512, heads=4, head_dim=128, max_seqlen_q=256, sparsity=0.1)),
    ("short-windows-causal-gqa", Problem(batch=512, heads=8, kv_heads=2, head_dim=64,
                                         max_seqlen_q=128, sparsity=0.1, causal=True)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("p", [c[1] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES])
def test_gpu_against_oracle(p):
    run_check(p, device="cuda")


# Short sequences: the forward over windows of packed rows (several sequences a program).
# On the CPU a block is 16 rows, so a mean length of at most 8 takes the windows.
WINDOW_CASES = [
    ("self-short", Problem(batch=12, heads=2, head_dim=64, max_seqlen_q=11),
     ([3, 0, 11, 1, 7, 2, 0, 9, 5, 1, 4, 6],) * 2),
    ("self-causal-gqa-fp16", Problem(batch=10, heads=4, kv_heads=2, head_dim=128, max_seqlen_q=14,
                                     causal=True, dtype="fp16"),
     ([14, 1, 2, 0, 5, 9, 3, 1, 0, 6],) * 2),
    # 20 empty sequences and 17 of length 1 inside one 16-row window: more offsets than a
    # pass of row_seq reads
    ("self-empties-and-ones", Problem(batch=40, heads=2, head_dim=64, max_seqlen_q=9),
     ([9] + [0] * 20 + [1] * 17 + [3, 2],) * 2),
    ("cross-causal-mixed", Problem(batch=9, heads=2, head_dim=64, max_seqlen_q=8, max_seqlen_k=21,
                                   mode="cross", causal=True),
     ([8, 0, 3, 5, 1, 7, 0, 2, 6], [21, 4, 0, 2, 9, 3, 5, 0, 12])),
    ("cross-mqa-lq>lk", Problem(batch=8, heads=4, kv_heads=1, head_dim=64, max_seqlen_q=12,
                                max_seqlen_k=5, mode="cross", causal=True, dtype="fp16"),
     ([12, 4, 6, 0, 9, 1, 3, 5], [5, 1, 2, 3, 0, 1, 5, 4])),
    # short queries over long keys: query windows (forward, dQ), per-sequence dK / dV
    ("cross-causal-long-keys", Problem(batch=6, heads=2, head_dim=64, max_seqlen_q=7,
                                       max_seqlen_k=40, mode="cross", causal=True),
     ([7, 1, 0, 5, 3, 2], [40, 17, 9, 0, 33, 26])),
]


@pytest.mark.parametrize("p, lengths", [c[1:] for c in WINDOW_CASES],
                         ids=[c[0] for c in WINDOW_CASES])
def test_windows_against_oracle(p, lengths):
    from jagged.portable import _config
    from jagged.tiles import windowed
    BM = _config("fwd", p.head_dim, torch.device("cpu"))[0]
    assert windowed(sum(lengths[0]), p.batch, p.max_seqlen_q, BM, False)
    run_check(p, lengths)  # forward and backward


def test_windowed_choice():
    """Windows for short packed queries only: not broadcast-Q, not one sequence, not
    a mean above half a block."""
    from jagged.tiles import windowed
    assert windowed(30552, 1152, 256, 128, False)           # gem 256 / 0.1
    assert not windowed(30552, 1152, 256, 128, True)
    assert not windowed(147000, 1152, 256, 128, False)      # gem 256 / 0.5
    assert not windowed(40, 1, 64, 128, False)


@triton.jit
def _row_probe(cu_q, cu_k, win, out, n_win, BM: tl.constexpr, CAUSAL: tl.constexpr):
    w = tl.program_id(0)
    s0 = tl.load(win + w)
    s1 = tl.load(win + n_win + w)
    rows = tl.load(win + 2 * n_win + w) + tl.arange(0, BM)
    own = rows < tl.load(cu_q + s1 + 1)  # a window's rows: up to its last sequence's end
    seq = row_seq(cu_q, s0, s1, rows, 4)
    lo, hi = row_kv_range(cu_q, cu_k, seq, rows, CAUSAL)
    tl.store(out + rows, seq, mask=own)
    tl.store(out + n_win * BM + rows, lo, mask=own)
    tl.store(out + 2 * n_win * BM + rows, hi, mask=own)


@triton.jit
def _col_probe(cu_q, cu_k, win, out, n_win, BN: tl.constexpr, CAUSAL: tl.constexpr):
    w = tl.program_id(0)
    s1 = tl.load(win + n_win + w)
    cols = tl.load(win + 2 * n_win + w) + tl.arange(0, BN)
    own = cols < tl.load(cu_k + s1 + 1)
    seq = row_seq(cu_k, tl.load(win + w), s1, cols, 4)
    lo, hi = col_q_range(cu_q, cu_k, seq, cols, CAUSAL)
    tl.store(out + cols, seq, mask=own)
    tl.store(out + n_win * BN + cols, lo, mask=own)
    tl.store(out + 2 * n_win * BN + cols, hi, mask=own)


@pytest.mark.parametrize("lanes", [2048, 256])
@pytest.mark.parametrize("runs", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_windows_pack_whole_sequences(monkeypatch, seed, runs, lanes):
    """tiles.windows (one program: a search a sequence, pointer doubling over the groups
    in registers; runs: batches over several of its passes, as beyond GROUP_SEQS; lanes:
    RUN_LANES, 256 storing two windows of every group a step at 128 sequences a pass, one
    at 512, so longer sequences' windows take several steps) against
    the greedy packing done one sequence at a time, on random batches: empty sequences in
    runs, sequences of exactly a block, longer ones (their blocks windows of their own),
    one sequence, rows past the last sequence; every window within a block and within the
    room window_count leaves."""
    import random
    import jagged.tiles
    from jagged.tiles import window_count, windows, windows_reference
    if runs:  # passes of 15 sequences
        monkeypatch.setattr(jagged.tiles, "GROUP_SEQS", 16)
    monkeypatch.setattr(jagged.tiles, "RUN_LANES", lanes)
    rng = random.Random(seed)
    for _ in range(6):
        BM = rng.choice([4, 8, 16])
        B = rng.choice([1, 2, 7, 40, 300])
        draw = [lambda: 0, lambda: rng.randint(1, BM // 2), lambda: BM,
                lambda: rng.randint(BM + 1, 5 * BM), lambda: rng.randint(1, BM)]
        weights = [3, 6, 1, 1 if seed % 2 else 0, 4]
        lens = [rng.choices(draw, weights)[0]() for _ in range(B)]
        cu = offsets(torch.tensor(lens))
        n_rows = int(cu[-1]) + rng.choice([0, 3])
        win = windows(cu, n_rows, max(lens + [1]), BM)
        assert win.shape[1] == window_count(n_rows, BM, B)
        assert torch.equal(win, windows_reference(cu, n_rows, BM)), (seed, BM, lens)
        live = int((win[0] >= 0).sum())
        for w in range(live):
            s0, s1, start = (int(x) for x in win[:, w])
            end = int(cu[s1 + 1])
            assert start >= int(cu[s0]) and end - start <= BM or s0 == s1


@pytest.mark.parametrize("causal", [False, True])
def test_row_ranges_and_windows(causal):
    """tiles.windows and seqinfo.row_seq / row_kv_range against their references, with
    empty sequences everywhere (first, last, runs) and rows past the last sequence."""
    from jagged.seqinfo import col_q_range_ref, row_kv_range_ref
    from jagged.tiles import windows, windows_reference

    g = torch.Generator().manual_seed(7 + causal)
    lq = torch.randint(0, 6, (30,), generator=g)
    lq[:3] = 0
    lq[-2:] = 0
    lq[10:17] = 0
    lk = torch.randint(0, 9, (30,), generator=g)
    cu_q, cu_k = offsets(lq), offsets(lk)
    BM, n_rows = 8, int(cu_q[-1]) + 5
    win = windows(cu_q, n_rows, int(lq.max()), BM)
    assert torch.equal(win, windows_reference(cu_q, n_rows, BM))
    live = int((win[0] >= 0).sum())
    assert (win[:, live:] == -1).all()
    # whole sequences a window, or one block of a longer one; every row in one window
    spans = [(int(win[2, w]), int(cu_q[int(win[1, w]) + 1])) for w in range(live)]
    assert all(0 <= min(e - s, BM) for s, e in spans)
    covered = torch.zeros(int(cu_q[-1]), dtype=torch.int32)
    for s, e in spans:
        covered[s:min(e, s + BM)] += 1
    assert (covered == 1).all()
    out = torch.empty(3, win.shape[1] * BM, dtype=torch.int32)
    _row_probe[(live,)](cu_q, cu_k, win, out, win.shape[1], BM=BM, CAUSAL=causal)
    rows = torch.arange(int(cu_q[-1]))
    seq, lo, hi = row_kv_range_ref(cu_q, cu_k, rows, causal)
    assert torch.equal(out[0, rows].long(), seq) and (lq[seq] > 0).all()
    assert torch.equal(out[1, rows].long(), lo) and torch.equal(out[2, rows].long(), hi)
    # key windows: the query rows each key column meets
    n_cols = int(cu_k[-1])
    kwin = windows(cu_k, n_cols, int(lk.max()), BM)
    assert torch.equal(kwin, windows_reference(cu_k, n_cols, BM))
    out = torch.empty(3, kwin.shape[1] * BM, dtype=torch.int32)
    k_live = int((kwin[0] >= 0).sum())
    _col_probe[(k_live,)](cu_q, cu_k, kwin, out, kwin.shape[1], BN=BM, CAUSAL=causal)
    cols = torch.arange(n_cols)
    seq, lo, hi = col_q_range_ref(cu_q, cu_k, cols, causal)
    assert torch.equal(out[0, cols].long(), seq) and (lk[seq] > 0).all()
    assert torch.equal(out[1, cols].long(), lo) and torch.equal(out[2, cols].long(), hi)


@triton.jit
def _stray(x, y, n, B: tl.constexpr):
    i = tl.arange(0, B)
    tl.store(y + i, tl.load(x + i, mask=i < n), mask=i < n)


def test_bounds_check_stops_a_stray_access():
    """The interpreter's bounds check (tests/conftest.py, every CPU test): lanes masked
    off pass, a load past the storage raises."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only")
    x, y = torch.arange(8.0), torch.empty(8)
    _stray[(1,)](x, y, 8, B=16)
    assert torch.equal(y, x)
    with pytest.raises(Exception, match="_stray: load of 4 lanes outside"):
        _stray[(1,)](x, y, 12, B=16)


@triton.jit
def _desc_copy(d, y, B: tl.constexpr):
    i = tl.arange(0, B)
    tl.store(y + i[:, None] * B + i[None, :], d.load([0, 0]))


def test_bounds_check_follows_descriptors():
    """A host TensorDescriptor's base is one of the launch's storages."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only")
    from triton.tools.tensor_descriptor import TensorDescriptor
    x, y = torch.randn(16, 16), torch.empty(16, 16)
    _desc_copy[(1,)](TensorDescriptor.from_tensor(x, [16, 16]), y, B=16)
    assert torch.equal(y, x)
