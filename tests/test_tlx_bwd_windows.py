"""The TLX Hopper backward's key windows, emulated in the Triton interpreter: the kernel's
own tile decoding (`_coords` -> schedule.kv_window_coords), each key column's query rows
(`window_rows` / `_window_rows`, read back by `_col_bounds`) and mask (`_keep`, WINDOWS)
over its key-window list (jagged.tiles.window_tiles over cu_k), with plain loads, dots
and atomic adds in place of TMA, wgmma and the bulk dQ reduce, between the kernel's own
preprocess and postprocess, against the oracle. The forward is jagged.portable's."""
import functools

import pytest
import torch
import triton
import triton.language as tl

from harness.oracle import check
from harness.problems import Problem, offsets
from _interp import interp

bw = pytest.importorskip("kernels_tlx.bwd_hopper")
from kernels_tlx.schedule import KVTiles, part_steps  # noqa: E402


@triton.jit
def _kv(k, v, tile, offs_n, n_k, HKV: tl.constexpr, D: tl.constexpr):
    """The tile's keys offs_n: (their rows, K and V in fp32 for the interpreter's dots,
    the inputs' dtype), zero past the tensor's end."""
    kr = tile.k_start + offs_n
    at = (kr * HKV + tile.hk)[:, None] * D + tl.arange(0, D)[None, :]
    kc = tl.load(k + at, mask=(kr < n_k)[:, None], other=0.0)
    vc = tl.load(v + at, mask=(kr < n_k)[:, None], other=0.0).to(tl.float32)
    return kr, kc.to(tl.float32), vc, kc.dtype


@triton.jit
def _step(q, do, lse, delta, kc, vc, tile, bounds, offs_n, j, scale, n_q, H, G,
          D: tl.constexpr, dt: tl.constexpr, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """Step j of a tile (G query heads a KV head) for the keys offs_n (kc, vc in fp32):
    (head, rows offs_m, Q, dO, P^T, and dS^T rounded to the inputs' dtype as the kernel's
    wgmma reads it); TMA's zero fill past the tensors' ends as masks."""
    h = tile.hk * G + j // tile.n_m
    offs_m = tile.m_lo + (j % tile.n_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    rows = tile.q_start + offs_m
    orows = tile.o_start + offs_m
    qb = tl.load(q + (rows * H + h)[:, None] * D + d[None, :], mask=(rows < n_q)[:, None],
                 other=0.0).to(tl.float32)
    dob = tl.load(do + (orows * H + h)[:, None] * D + d[None, :],
                  mask=(orows < n_q)[:, None], other=0.0).to(tl.float32)
    inb = offs_m < tile.len_q
    lse2 = bw.lse_log2(tl.load(lse + h * n_q + orows, mask=inb, other=float("inf")))
    dl = tl.load(delta + h * n_q + orows, mask=inb, other=0.0)
    pt = tl.math.exp2(tl.dot(kc, tl.trans(qb)) * (scale * 1.4426950408889634) - lse2[None, :])
    pt = tl.where(bw._keep(offs_n, offs_m, tile, bounds, True), pt, 0.0)
    dst = (pt * (tl.dot(vc, tl.trans(dob)) - dl[None, :])).to(dt).to(tl.float32)
    return h, offs_m, qb, dob, pt, dst


@triton.jit
def _consumer(q, k, v, do, lse, delta, dq_acc, dk, dv, col_rows, tiles, tile, scale,
              n_q, n_k, owned, j0, j1, H, cid: tl.constexpr, HKV: tl.constexpr,
              D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, PARTS: tl.constexpr):
    """bw.compute's math for consumer cid's 64 keys (32-row steps) over steps [j0, j1),
    TMA's zero fill and clipping past the tensors' ends as masks; an owned window's dQ is
    `_owned_dq`'s. PARTS > 1: dK / dV added into the fp32 accumulators dk, dv."""
    G = H // HKV
    BNC: tl.constexpr = BLOCK_N // 2
    nc0 = tile.n0 + cid * BNC
    offs_n = nc0 + tl.arange(0, BNC)
    bounds = bw._col_bounds(col_rows, tiles, tile, cid * BNC, BNC, BLOCK_N)
    d = tl.arange(0, D)
    kr, kc, vc, dt = _kv(k, v, tile, offs_n, n_k, HKV, D)
    dk_c = tl.zeros([BNC, D], tl.float32)
    dv_c = tl.zeros([BNC, D], tl.float32)
    for j in range(j0, j1):
        h, offs_m, qb, dob, pt, dst = _step(q, do, lse, delta, kc, vc, tile, bounds, offs_n,
                                            j, scale, n_q, H, G, D, dt, BLOCK_M, CAUSAL)
        rows = tile.q_start + offs_m
        dv_c += tl.dot(pt.to(dt).to(tl.float32), dob)
        dk_c += tl.dot(dst, qb)
        # the whole step's box is reduce-added (rows past the tile's hold zeros), clipped
        # at the tensor's end
        tl.atomic_add(dq_acc + (rows * H + h)[:, None] * D + d[None, :],
                      tl.dot(tl.trans(dst), kc), mask=(rows < n_q)[:, None] & ~owned)
    # bw.store's arithmetic and row bound, without its shared-memory staging
    out = (tile.k_start + offs_n)[:, None] * HKV * D + tile.hk * D + d[None, :]
    keep = (offs_n < tile.len_k)[:, None]
    if PARTS > 1:  # bw.store_add's
        tl.atomic_add(dk + out, dk_c * scale, mask=keep)
        tl.atomic_add(dv + out, dv_c, mask=keep)
    else:
        tl.store(dk + out, (dk_c * scale).to(dk.dtype.element_ty), mask=keep)
        tl.store(dv + out, dv_c.to(dv.dtype.element_ty), mask=keep)


@triton.jit
def _owned_dq(q, k, v, do, lse, delta, grads, col_rows, tiles, tile, n_q, n_k, j0, j1,
              H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, DQ_COLS: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """An owned window's dQ as bw.compute forms it: per step, each consumer's DQ_COLS
    columns over all BLOCK_N keys (dQ^T = K[:, cols]^T dS^T), stored by bw._store_dq."""
    G = H // HKV
    offs_n = tl.arange(0, BLOCK_N)
    bounds = bw._col_bounds(col_rows, tiles, tile, 0, BLOCK_N, BLOCK_N)
    kr, kc, vc, dt = _kv(k, v, tile, offs_n, n_k, HKV, D)
    for j in range(j0, j1):
        h, offs_m, qb, dob, pt, dst = _step(q, do, lse, delta, kc, vc, tile, bounds, offs_n,
                                            j, grads.scale, n_q, H, G, D, dt, BLOCK_M, CAUSAL)
        for c in tl.static_range(D // DQ_COLS):
            cols = c * DQ_COLS + tl.arange(0, DQ_COLS)
            kt = tl.load(k + (kr * HKV + tile.hk)[:, None] * D + cols[None, :],
                         mask=(kr < n_k)[:, None], other=0.0).to(tl.float32)
            bw._store_dq(grads, tl.dot(tl.trans(kt), dst), tile, h, offs_m, c * DQ_COLS, H,
                         D)


@triton.jit
def _emulate(q, k, v, do, lse, delta, dq_acc, dq, dk, dv, col_rows, cu_q, cu_k, order,
             count, win, n_win, scale, n_q, n_k, H: tl.constexpr, HKV: tl.constexpr,
             D: tl.constexpr, DQ_COLS: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, PARTS: tl.constexpr):
    """One program per (window, KV head, part) slot t of the static walk."""
    tiles = KVTiles(order, win, count, cu_q, cu_k, n_win, None)
    t = tl.program_id(0)
    if t < tl.load(count) * HKV * PARTS:
        tile = bw._coords(t, t, tiles, HKV, BLOCK_M, BLOCK_N, CAUSAL, False, True, PARTS)
        owned = bw._window_keys(tiles, tile) <= BLOCK_N
        j0, j1 = part_steps(t, (H // HKV) * tile.n_m, PARTS)
        for cid in tl.static_range(2):
            _consumer(q, k, v, do, lse, delta, dq_acc, dk, dv, col_rows, tiles, tile, scale,
                      n_q, n_k, owned, j0, j1, H, cid, HKV, D, BLOCK_M, BLOCK_N, CAUSAL,
                      PARTS)
        if owned:
            grads = bw.Grads(dk, dv, 0, 0, scale, dq)
            _owned_dq(q, k, v, do, lse, delta, grads, col_rows, tiles, tile, n_q, n_k, j0,
                      j1, H, HKV, D, DQ_COLS, BLOCK_M, BLOCK_N, CAUSAL)


def emulated_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale,
                      broadcast_q, dlse=None, parts=None):
    """bw.backward's windows path with the main kernel emulated (_emulate); parts: each
    window split so many ways (None: jagged.tiles.window_parts, as bw.backward). Every
    sequence within a window's keys and the windows whole (jagged.tiles.windows_direct):
    the preprocess zeroes dQ's own rows and no postprocess runs, as in bw.backward."""
    from jagged.tiles import dkv_accumulator, window_parts, window_tiles, windows_direct
    n_q, H, D = q.shape
    n_k, HKV = k.shape[:2]
    B = cu_k.shape[0] - 1
    assert bw.takes_windows(n_k, B, max_k, broadcast_q)
    cfg = bw.window_config(D)
    p = bw._prepare(dout, q, k, v, out, lse, cu_k, broadcast_q)
    if parts is None:
        parts = window_parts(n_q, n_k, HKV, H // HKV, cfg.block_m, bw.BLOCK_N, 132, causal,
                             B)
    dkv_acc = dkv_accumulator(k, parts)
    if dkv_acc is not None:
        dkv_acc.fill_(float("nan"))  # the preprocess zeroes it
    delta = torch.empty((H, n_q), dtype=torch.float32)
    dq_acc = torch.full((n_q, H, D), float("nan"))
    sched = torch.zeros(4, dtype=torch.int32)
    rows = 32 if D <= 64 else 16
    direct = windows_direct(max_k, bw.BLOCK_N, parts)
    p.dq.fill_(float("nan"))  # every query row: by an owned window, the preprocess (direct)
    zeroed = p.dq if direct else dq_acc  # or the postprocess
    bw._bwd_preprocess[(bw.pre_programs(n_q, H, rows, True),)](
        p.out, p.dout, delta, zeroed, sched, n_q * H, p.out.stride(0), p.out.stride(1),
        p.dout.stride(0), p.dout.stride(1), delta.stride(0), cu_q, cu_k, B, B.bit_length(),
        dkv_acc, 0 if dkv_acc is None else dkv_acc.numel() // D, n_q * H, H=H, D=D,
        ROWS=rows, LONG_K=bw.BLOCK_N, ZERO_DKV=dkv_acc is not None,
        CAUSAL=causal)
    if dlse is not None:
        delta -= dlse
    order, count, win = window_tiles(cu_k, cu_q, n_k, max_k, bw.BLOCK_N, cfg.block_m)
    col_rows = bw.window_rows(cu_q, cu_k, win, causal)
    p.dk.fill_(float("nan"))  # every real key row must be stored
    p.dv.fill_(float("nan"))
    dk, dv = (p.dk, p.dv) if dkv_acc is None else (dkv_acc[0], dkv_acc[1])
    _emulate[(win.shape[1] * HKV * parts,)](
        q.detach(), k.detach(), v.detach(), p.dout, p.lse, delta, dq_acc, p.dq, dk, dv,
        col_rows, cu_q, cu_k, order, count, win, win.shape[1], scale, n_q, n_k, H=H,
        HKV=HKV, D=D, DQ_COLS=bw.dq_cols(D), BLOCK_M=cfg.block_m, BLOCK_N=bw.BLOCK_N,
        CAUSAL=causal, PARTS=parts)
    if not direct:
        bw._postprocess(p, dq_acc, scale, broadcast_q, dkv_acc, (cu_q, cu_k), causal)
    return p.dq, p.dk, p.dv


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, parts):
        from jagged import portable
        out, lse = portable.fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, False)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.args = (max_q, max_k, causal, scale, parts)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        max_q, max_k, causal, scale, parts = ctx.args
        dq, dk, dv = emulated_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k,
                                       causal, scale, False, parts=parts)
        return dq, dk, dv, None, None, None, None, None, None, None


def emulated(q, k, v, cu_q, cu_k, max_q, max_k, causal=False, softmax_scale=None,
             broadcast_q=False, parts=None):
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    return _Attention.apply(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, parts)


def _short(n, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, (n,), generator=g).tolist()


# a window whose first sequence starts before it and whose last ends after it (keys
# [0, 30), [30, 230), [230, 240), [240, 420): window 1 = [128, 256) spans 1..3)
SPAN = [30, 200, 10, 180] + [1] * 6 + [0] * 3 + _short(37, 0, 20, 7)

# causal blocks of longer sequences (300 and 200 keys: windows of their own) among short
# ones, cross with len_q > len_k for the 200-key one
LONG_PROBLEM = Problem(batch=40, heads=2, kv_heads=1, head_dim=64, max_seqlen_q=330,
                       max_seqlen_k=300, mode="cross", causal=True)
LONG = ([300, 4, 330] + _short(37, 0, 12, 10), [300, 4, 200] + _short(37, 0, 12, 10))
# windows of several sequences whose first has more rows than keys: causal, their walk
# starts at its first row that sees a key (row 90 of the first window's)
FIRST_CUT = ([100, 20, 5, 80, 3, 60, 70], [10, 30, 50, 20, 40, 60, 5])

CASES = [  # (id, problem, (len_q, len_k))
    ("self-d64-empties-ones", Problem(batch=40, heads=2, head_dim=64, max_seqlen_q=100),
     ([0, 1, 100, 0, 0, 1, 1] + _short(33, 0, 12, 1),) * 2),
    ("self-spanning-d128", Problem(batch=50, heads=1, head_dim=128, max_seqlen_q=200),
     (SPAN,) * 2),
    ("self-causal-gqa-d128", Problem(batch=30, heads=4, kv_heads=2, head_dim=128,
                                     max_seqlen_q=60, causal=True),
     ([60] + _short(28, 0, 9, 2) + [1],) * 2),
    # len_q > len_k, causal: a 128-key window spans ~40 sequences (row_seq's chunks)
    ("cross-causal-lq>lk-gqa", Problem(batch=60, heads=4, kv_heads=1, head_dim=64,
                                       max_seqlen_q=20, max_seqlen_k=6, mode="cross",
                                       causal=True),
     (_short(60, 0, 20, 5), _short(60, 0, 6, 6))),
    # len_q < len_k, causal, and sequences spanning windows
    ("cross-causal-lq<lk", Problem(batch=24, heads=2, head_dim=64, max_seqlen_q=12,
                                   max_seqlen_k=150, mode="cross", causal=True),
     (_short(24, 0, 12, 3), [150, 3, 0, 140] + _short(20, 0, 40, 4))),
    ("cross-spanning-fp16", Problem(batch=50, heads=2, head_dim=64, max_seqlen_q=30,
                                    max_seqlen_k=200, mode="cross", dtype="fp16"),
     (_short(50, 0, 30, 8), SPAN)),
    # many empty sequences inside a window (a span past row_seq's chunk of 16); seed 1:
    # seed 0 puts dv 2 % past the oracle's bound for jagged.portable's backward as well
    ("self-causal-many-empty", Problem(batch=60, heads=2, head_dim=64, max_seqlen_q=90,
                                       causal=True, seed=1),
     ([5] + [0] * 40 + [90, 7] + [0] * 10 + _short(7, 0, 30, 9),) * 2),
    # longer sequences' later key blocks, causal: their walks start past the first rows
    ("self-causal-long-blocks", LONG_PROBLEM, LONG),
    # causal, len_q > len_k by more than a step: windows of one sequence start their walk
    # at its first row that sees a key; the rows before are zeroed by the preprocess
    ("cross-causal-one-sequence-windows", Problem(batch=8, heads=2, kv_heads=1, head_dim=64,
                                                  max_seqlen_q=300, max_seqlen_k=120,
                                                  mode="cross", causal=True),
     ([200, 150, 40, 7, 300, 0, 64, 90], [100, 90, 120, 5, 100, 0, 60, 120])),
    ("cross-causal-first-sequence-cut", Problem(batch=7, heads=2, kv_heads=1, head_dim=64,
                                                 max_seqlen_q=100, max_seqlen_k=60,
                                                 mode="cross", causal=True), FIRST_CUT),
    # a mean of most of a tile (windows up to BWD_WINDOW_MEAN_FRACTION): windows of one
    # sequence of up to 128 keys each, owned, and longer ones' blocks
    ("self-tile-mean", Problem(batch=10, heads=2, kv_heads=1, head_dim=64, max_seqlen_q=256),
     ([129, 127, 3, 256, 77, 128, 0, 140, 95, 64],) * 2),
]


@interp
@pytest.mark.parametrize("p, lengths", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_window_backward_against_oracle(p, lengths):
    inp = p.build(lengths=lengths)
    assert bw.takes_windows(inp.k.shape[0], p.batch, inp.max_seqlen_k, False)
    rep = check(inp, emulated, causal=p.causal, backward=True)
    assert rep.ok, f"{p.label()}\n{rep}"


@interp
@pytest.mark.parametrize("parts", [2, 8])
@pytest.mark.parametrize("case", ["self-d64-empties-ones", "self-causal-gqa-d128",
                                  "cross-causal-lq>lk-gqa", "self-causal-long-blocks"])
def test_window_parts_against_oracle(case, parts):
    """Windows split over programs (jagged.tiles.window_parts > 1): the kernel's own
    decoding of (window, KV head, part) and each part's steps (schedule.part_steps), dK /
    dV added into fp32 accumulators, an owned window's dQ stored step by step, parts with
    no step among them; a longer sequence's causal blocks split after their row cut."""
    p, lengths = next(c[1:] for c in CASES if c[0] == case)
    inp = p.build(lengths=lengths)
    rep = check(inp, functools.partial(emulated, parts=parts), causal=p.causal,
                backward=True)
    assert rep.ok, f"{p.label()} parts {parts}\n{rep}"


def test_window_parts_rule():
    """A call of a few windows whose steps walk a GQA group splits them (fuzz B8 H8/1
    D128 512 / 0.1 causal: 443 tokens); many windows, or few steps a window, do not; nor
    causal windows of one sequence each whose rows mostly see no key (fuzz cross B8 H1/1
    D128 8192 / 128 causal), which walk only the rows that see one."""
    from jagged.tiles import window_parts
    assert window_parts(443, 443, 1, 8, 32, 128, 132) == 8
    assert window_parts(443, 443, 1, 8, 32, 128, 132, True, 8) == 8
    assert window_parts(65536, 1024, 1, 1, 32, 128, 132) == 8
    assert window_parts(65536, 1024, 1, 1, 32, 128, 132, True, 8) == 1
    assert window_parts(30000, 30000, 4, 1, 32, 128, 132) == 1   # gem 256 / 0.1's size
    assert window_parts(5000, 5000, 2, 4, 32, 128, 132) == 1
    assert window_parts(300, 300, 1, 1, 64, 128, 132) == 1


@interp
def test_window_rows_against_reference():
    """`window_rows` against seqinfo.col_q_range_ref per key column (each written by the
    window holding it; `_col_bounds` gives the columns past a window's keys no row)."""
    from jagged.seqinfo import col_q_range_ref
    from jagged.tiles import window_tiles
    def cu(lengths):
        return offsets(torch.tensor(lengths))
    for causal in (False, True):
        lq, lk = _short(50, 0, 30, 8), SPAN
        cu_q, cu_k = cu(lq), cu(lk)
        n_k = int(cu_k[-1])
        _, _, win = window_tiles(cu_k, cu_q, n_k, max(lk), bw.BLOCK_N, 32)
        got = bw.window_rows(cu_q, cu_k, win, causal)
        cols = torch.arange(n_k)
        _, lo, hi = col_q_range_ref(cu_q, cu_k, cols, causal)
        assert torch.equal(got[0, :n_k].long(), lo)
        assert torch.equal(got[1, :n_k].long(), hi)


@triton.jit
def _tile_probe(order, count, win, cu_q, cu_k, n_win, out, HKV: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    tiles = KVTiles(order, win, count, cu_q, cu_k, n_win, None)
    t = tl.program_id(0)
    tile = bw._coords(t, t, tiles, HKV, BLOCK_M, BLOCK_N, CAUSAL, False, True)
    tl.store(out + 3 * t, tile.k_start.to(tl.int32))
    tl.store(out + 3 * t + 1, tile.m_lo)
    tl.store(out + 3 * t + 2, tile.n_m)


@interp
@pytest.mark.parametrize("lengths, cuts", [(LONG, 4), (FIRST_CUT, 1)], ids=["long", "first"])
@pytest.mark.parametrize("causal", [False, True])
def test_window_row_cut(causal, lengths, cuts):
    """kv_window_coords: a causal window (a block of a longer sequence, or whole ones)
    starts its walk at the Q block of its first sequence's first row that sees its first
    key (the tightest block-aligned start); every window without causal masking walks
    all its rows."""
    from jagged.tiles import window_tiles
    lq, lk = lengths
    cu_q, cu_k = (offsets(torch.tensor(x)) for x in lengths)
    n_k = int(cu_k[-1])
    BM = bw.window_config(64).block_m
    order, count, win = window_tiles(cu_k, cu_q, n_k, max(lk), bw.BLOCK_N, BM)
    live = int(count)
    out = torch.zeros(3 * live, dtype=torch.int32)
    _tile_probe[(live,)](order, count, win, cu_q, cu_k, win.shape[1], out, HKV=1, BLOCK_M=BM,
                         BLOCK_N=bw.BLOCK_N, CAUSAL=causal)
    cut = 0
    for t in range(live):
        w = int(order[t])
        s0, s1 = int(win[0, w]), int(win[1, w])
        k_start, m_lo, n_m = (int(x) for x in out[3 * t:3 * t + 3])
        len_q = int(cu_q[s1 + 1] - cu_q[s0])
        want = 0
        if causal:  # s0's first row seeing k_start
            first = k_start - int(cu_k[s0 + 1]) + int(cu_q[s0 + 1] - cu_q[s0])
            want = max(first, 0) // BM * BM
        assert (m_lo, n_m) == (want, -(-(len_q - want) // BM)), (t, s0, s1, k_start)
        cut += want > 0
    # LONG: the later two blocks of 300 keys; both of 200 keys under 330 rows (the last
    # 130 rows see the first key)
    assert cut == (cuts if causal else 0)
