"""The plain-Triton parts of kernels_tlx.bwd_hopper under the Triton interpreter (CPU): the
preprocess and postprocess kernels, and the backward's schedule (kernels_tlx.schedule:
kv_tile_coords, tile_range). The warp-specialized main kernel needs a GPU (its default
builds are compile-checked in test_bwd_compile.py); the backward's math is checked on the
CPU through jagged.portable.

fp16 only: Triton 3.8's interpreter keeps bf16 as raw uint16.
"""
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU interpreter test (TRITON_INTERPRET=1)")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from _launches import record_launches  # noqa: E402
from harness.problems import offsets  # noqa: E402
from jagged.tiles import FLAT_MEAN_Q, kv_tiles_reference  # noqa: E402
from kernels_tlx import bwd_hopper as bw  # noqa: E402
from kernels_tlx.schedule import (KVTiles, dq_slot_row, kv_tile_coords, part_steps,  # noqa: E402
                                   tile_range)


@pytest.fixture(autouse=True)
def _fresh_decisions(monkeypatch):
    """No site decided by an earlier test: each test's monkeypatched choices count."""
    monkeypatch.setattr(bw, "_DECIDED", {})


@pytest.mark.parametrize("n_dq_of,zero_dkv", [(3, False), (3, True), (0.5, False)])
@pytest.mark.parametrize("d", [64, 128])
def test_preprocess(d, n_dq_of, zero_dkv):
    """delta = rowsum(dO * O) in fp32, [H, Nq]; the preprocess also zeroes the accumulator's
    n_dq_rows rows (n_dq_of = 3: three times n_rows and more, through its grid-stride loop;
    0.5: half of them, as a broadcast-Q call of fewer dQ slots than sequences) and the tile
    counter; ZERO_DKV the split tiles' dK / dV accumulators, here over three times the
    grid's rows, and not a row past either."""
    g = torch.Generator().manual_seed(d)
    nq, H = 37, 3
    out = torch.randn(nq, H, d, generator=g).half()
    dout = torch.randn(nq, H, d, generator=g).half()
    delta = torch.full((H, nq), float("nan"))
    n_dq = int(n_dq_of * nq * H) + 3           # rows of D
    dq_acc = torch.full((n_dq + 1, d), float("nan"))
    sched = torch.full((4,), 7, dtype=torch.int32)
    n_kv = 3 * nq * H + 5
    dkv_acc = torch.full((n_kv + 1, d), float("nan"))
    rows = 32 if d <= 64 else 16
    bw._bwd_preprocess[(triton.cdiv(nq * H, rows),)](
        out, dout, delta, dq_acc, sched, nq * H, out.stride(0), out.stride(1),
        dout.stride(0), dout.stride(1), delta.stride(0), None, None, 0, 0, dkv_acc, n_kv,
        n_dq, H=H, D=d, ROWS=rows, ZERO_DKV=zero_dkv)
    want = (out.float() * dout.float()).sum(-1).T
    torch.testing.assert_close(delta, want, rtol=1e-5, atol=1e-4)
    assert (dq_acc[:n_dq] == 0).all() and sched[0] == 0 and (sched[1:] == 7).all()
    assert dq_acc[n_dq].isnan().all()
    assert (dkv_acc[:n_kv] == 0).all() if zero_dkv else dkv_acc[:n_kv].isnan().all()
    assert dkv_acc[n_kv].isnan().all()


def _window_preprocess(g, zeroed, cu_q, cu_k, long_k):
    """The key windows' preprocess (LONG_K = long_k) on random O and dO of `zeroed`'s
    shape ([tokens, H, D]), zeroing into `zeroed`; its delta checked -> the tile counter
    buffer (7s but the first)."""
    nq, H, d = zeroed.shape
    B = cu_q.shape[0] - 1
    out = torch.randn(nq, H, d, generator=g).half()
    dout = torch.randn(nq, H, d, generator=g).half()
    delta = torch.full((H, nq), float("nan"))
    sched = torch.full((4,), 7, dtype=torch.int32)
    bw._bwd_preprocess[(bw.pre_programs(nq, H, 32, True),)](
        out, dout, delta, zeroed, sched, nq * H, out.stride(0), out.stride(1),
        dout.stride(0), dout.stride(1), delta.stride(0), cu_q, cu_k, B, B.bit_length(),
        None, 0, nq * H, H=H, D=d, ROWS=32, LONG_K=long_k)
    torch.testing.assert_close(delta, (out.float() * dout.float()).sum(-1).T, rtol=1e-5,
                               atol=1e-4)
    return sched


@pytest.mark.parametrize("many", [False, True])
def test_pre_post_rows_of_long_sequences(many):
    """Key windows (LONG_K): the preprocess zeroes, and _bwd_post_rows converts, only the
    rows of sequences of more than LONG_K keys and the rows past the last sequence; the
    owned windows' rows stay untouched (NaN) in the accumulator and in dQ. many: several
    programs of WIN_TOK tokens, sequences across their bounds."""
    g = torch.Generator().manual_seed(3)
    lq = torch.tensor([2, 5, 3, 0, 4, 6, 0, 1])
    lk = torch.tensor([3, 9, 0, 8, 20, 1, 30, 0])
    if many:
        lq = torch.randint(0, 9, (40,), generator=g)
        lk = torch.randint(0, 17, (40,), generator=g)
    cu_q, cu_k = offsets(lq), offsets(lk)
    B, H, d, long_k, extra = len(lq), 3, 64, 8, 3
    nq = int(cu_q[-1]) + extra
    seq = torch.repeat_interleave(torch.arange(B), lq)
    want = torch.cat([lk[seq] > long_k, torch.ones(extra, dtype=torch.bool)])
    assert want.any() and not want.all() and (nq > 3 * bw.WIN_TOK.value) == many
    dq_acc = torch.full((nq, H, d), float("nan"))
    _window_preprocess(g, dq_acc, cu_q, cu_k, long_k)
    assert (dq_acc[want] == 0).all() and dq_acc[~want].isnan().all()
    acc = torch.randn(nq, H, d, generator=g)
    dq = torch.full((nq, H, d), float("nan"), dtype=torch.float16)
    # windows split over programs: the dK / dV accumulators converted in the same launch
    n_kv = 700
    dkv_acc = torch.randn(2, n_kv, generator=g)
    dk, dv = (torch.full((n_kv,), float("nan"), dtype=torch.float16) for _ in range(2))
    bw._bwd_post_rows[(triton.cdiv(nq, bw.WIN_TOK.value),)](
        acc, dq, cu_q, cu_k, B, B.bit_length(), nq, H * d, 0.5, dkv_acc, dk, dv, n_kv,
        LONG_K=long_k, COLS=128, DKV=True)
    torch.testing.assert_close(dq[want].float(), (acc[want] * 0.5).half().float())
    assert dq[~want].isnan().all()
    torch.testing.assert_close(dk.float(), dkv_acc[0].half().float())
    torch.testing.assert_close(dv.float(), dkv_acc[1].half().float())


def test_preprocess_zeroes_dq_direct():
    """Key windows under jagged.tiles.windows_direct (every sequence within LONG_K keys):
    the preprocess zeroes dQ's own rows, in q's dtype, past the last sequence, and no
    other row (the windows store those); the delta and the tile counter as ever."""
    g = torch.Generator().manual_seed(5)
    lq = torch.randint(0, 9, (40,), generator=g)
    lk = torch.randint(0, 9, (40,), generator=g)
    cu_q, cu_k = offsets(lq), offsets(lk)
    H, d, long_k, extra = 3, 64, 8, 37
    n_real = int(cu_q[-1])
    nq = n_real + extra
    dq = torch.full((nq, H, d), float("nan"), dtype=torch.float16)
    sched = _window_preprocess(g, dq, cu_q, cu_k, long_k)
    assert (dq[n_real:] == 0).all() and dq[:n_real].isnan().all()
    assert sched[0] == 0 and (sched[1:] == 7).all()


def test_postprocess():
    """dQ = scale * the sum of the slots, in the output dtype."""
    g = torch.Generator().manual_seed(0)
    n_slots, L_q, H, d = 3, 5, 2, 64
    acc = torch.randn(n_slots, L_q, H, d, generator=g)
    dq = torch.empty(L_q, H, d, dtype=torch.float16)
    bw._bwd_postprocess[(triton.cdiv(dq.numel(), 256),)](
        acc, dq, dq.numel(), n_slots, L_q * H * d, 0.125, None, None, None, 0, BLOCK=256)
    torch.testing.assert_close(dq.float(), (acc.sum(0) * 0.125).half().float())


@triton.jit
def _walk(tile_b, tile_n, n_tiles_ptr, cu_q, cu_k, L_q, n_slots, out_ptr, HKV: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
          BROADCAST_Q: tl.constexpr,
          PARTS: tl.constexpr = 1, G: tl.constexpr = 1):
    """Every tile of every program's static walk: its program, coordinates, dQ slot row
    and steps [j0, j1) of a group of G query heads, 14 int64 values a tile at
    out_ptr + 14 * tile."""
    pid = tl.program_id(0)
    tiles = KVTiles(tile_b, tile_n, n_tiles_ptr, cu_q, cu_k, L_q, None, n_slots)
    first, step, n = tile_range(pid, tl.num_programs(0), n_tiles_ptr, HKV, BROADCAST_Q,
                                PARTS)
    for t in range(first, n, step):
        tile = kv_tile_coords(t, pid, tiles, HKV, BLOCK_M, BLOCK_N, CAUSAL, BROADCAST_Q,
                              PARTS)
        if BROADCAST_Q:
            t = t * HKV + tile.hk  # a slot per (tile, head)
        j0, j1 = part_steps(t, G * tile.n_m, PARTS)
        vals = (pid, tile.b, tile.hk, tile.n0, tile.len_k, tile.len_q, tile.k_start,
                tile.q_start, tile.o_start, tile.m_lo, tile.n_m,
                pid * 0 + dq_slot_row(pid, tiles, HKV, BROADCAST_Q), pid * 0 + j0, pid * 0 + j1)
        for i in tl.static_range(14):
            tl.store(out_ptr + 14 * t + i, vals[i])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bq,n_slots,parts", [(False, 1, 1), (True, 1, 1), (True, 2, 1),
                                              (True, 3, 1), (False, 1, 2), (False, 1, 4),
                                              (False, 1, 8)])
def test_kv_tile_walk(causal, bq, n_slots, parts):
    """Each (KV tile, KV head) is visited once, by the program tile_range deals it to, and
    its Q blocks [m_lo, m_lo + n_m * BLOCK_M) are the blocks holding a row that sees one
    of its keys (bottom-right causal, len_q above and below len_k). Broadcast-Q: the
    programs of a KV head share n_slots dQ slots round-robin (dq_slot_row). Split into
    `parts` (jagged.tiles.bwd_parts): each (tile, head) is visited once a part, and its
    parts' steps (schedule.part_steps; G query heads x its Q blocks) run back to back, in
    order, over the tile's steps, floor or ceil of steps / parts each."""
    BM, BN, HKV, n_prog, G = 32, 128, 2, 6, 3
    lk = torch.tensor([300, 1, 0, 129, 40])
    lq = torch.tensor([64] * 5) if bq else torch.tensor([100, 1, 3, 129, 200])
    cu_q, cu_k = (None if bq else offsets(lq)), offsets(lk)
    L_q = 64 if bq else 0
    tile_b, tile_n, n_tiles = kv_tiles_reference(cu_q, cu_k, L_q, int(lk.max()), causal, BM, BN)
    n = int(n_tiles)
    out = torch.full((n * HKV * parts, 14), -1, dtype=torch.int64)
    _walk[(n_prog,)](tile_b, tile_n, n_tiles, cu_k if bq else cu_q, cu_k, L_q, n_slots, out,
                     HKV=HKV, BLOCK_M=BM, BLOCK_N=BN, CAUSAL=causal, BROADCAST_Q=bq,
                     PARTS=parts, G=G)
    assert (out[:, 0] >= 0).all(), "a (tile, head, part) never visited"
    for tp in range(0, n * HKV * parts, parts):
        t = tp // parts
        for p in range(parts):  # round-robin over tiles x heads x parts
            assert out[tp + p, 0] == (tp + p) % n_prog
        vals = out[tp:tp + parts]
        assert (vals[:, 1:12] == vals[0, 1:12]).all()
        pid, b, hk, n0, len_k, len_q, k_start, q_start, o_start, m_lo, n_m, slot_row = \
            vals[0, :12].tolist()
        steps = [list(range(j0, j1)) for j0, j1 in vals[:, 12:].tolist()]
        assert sum(steps, []) == list(range(G * n_m)), steps
        assert all(len(x) in (G * n_m // parts, -(-G * n_m // parts)) for x in steps)
        assert slot_row == ((pid // HKV) % n_slots * L_q if bq else 0)
        base = t // HKV
        assert (b, n0) == (int(tile_b[base]), int(tile_n[base]) * BN)
        assert hk == t % HKV
        if bq:  # pinned: program p owns head p % HKV and every (n_prog // HKV)-th tile
            assert pid % HKV == hk and base % (n_prog // HKV) == pid // HKV
        else:  # round-robin over tiles x heads (x parts, above)
            assert pid == (t * parts) % n_prog
        assert (len_k, len_q) == (int(lk[b]), int(lq[b]))
        assert k_start == int(cu_k[b]) and q_start == (0 if bq else int(cu_q[b]))
        assert o_start == (b * L_q if bq else q_start)
        # rows that see a key of [n0, n0 + BN): i >= n - (len_k - len_q) for some n
        keys = torch.arange(n0, min(n0 + BN, len_k))
        rows = torch.arange(len_q)
        sees = (keys[None, :] <= rows[:, None] + (len_k - len_q)).any(1) if causal else \
            torch.ones(len_q, dtype=torch.bool)
        blocks = sorted({int(i) // BM for i in rows[sees]})
        want = list(range(blocks[0], blocks[-1] + 1)) if blocks else []
        got = list(range(m_lo // BM, m_lo // BM + n_m))
        assert m_lo % BM == 0 and got == want, (b, n0, got, want)


@pytest.mark.parametrize("arch", ["hopper", "blackwell"])
@pytest.mark.parametrize("bq", [False, True])
def test_host_launches_the_dependent_chain(monkeypatch, bq, arch):
    """backward's launches, Hopper's and Blackwell's (recorded): the KV list's key kernel
    after the preprocess as its programmatic dependent, waiting for it last (WAIT_LAST);
    in the packed modes the main kernel and the postprocess launch as programmatic
    dependents (jagged.tiles.bwd_dependent), in broadcast-Q as plain launches. Their
    kernels wait for the kernel ahead either way (the compile tests' PTX checks)."""
    import jagged.tiles as T
    from jagged.tiles import bwd_dependent
    from kernels_tlx import bwd_blackwell as bb
    launches = record_launches(monkeypatch, bw, bb, T)
    monkeypatch.setattr(bw, "num_sms", lambda dev: 132)
    monkeypatch.setattr(bw, "PDL", True)  # as on the GPU (the interpreter has none)
    monkeypatch.setattr(T, "PDL", True)
    H, HKV, D = 4, 2, 128
    lk = torch.tensor([300, 200, 5])
    cu_k = offsets(lk)
    cu_q = None if bq else cu_k
    n_q = 7 if bq else int(cu_k[-1])
    n_out = n_q * len(lk) if bq else n_q
    q = torch.zeros(n_q, H, D, dtype=torch.float16)
    k = torch.zeros(int(cu_k[-1]), HKV, D, dtype=torch.float16)
    o = torch.zeros(n_out, H, D, dtype=torch.float16)
    (bw if arch == "hopper" else bb).backward(o, q, k, k, o, torch.zeros(H, n_out), cu_q,
                                              cu_k, n_q, int(lk.max()), False, 0.125, bq)
    kw = {name: kwargs for name, _, kwargs in launches}
    assert list(kw) == ["_bwd_preprocess", "_tile_keys_kernel", "bwd_kernel",
                        "_bwd_postprocess"]
    assert kw["_bwd_preprocess"]["PDL"] and not kw["_bwd_preprocess"].get("launch_pdl")
    keys = kw["_tile_keys_kernel"]
    assert keys["KV_TILES"] and keys["launch_pdl"] and keys["WAIT_LAST"] and keys["PDL"]
    assert bwd_dependent(bq) == (not bq)
    assert kw["bwd_kernel"]["launch_pdl"] == (not bq)
    assert kw["_bwd_postprocess"]["launch_pdl"] == (not bq) and kw["_bwd_postprocess"]["PDL"]


@pytest.mark.parametrize("causal", [False, True])
def test_host_head_run(monkeypatch, causal):
    """backward's main launch (recorded) deals a KV head's list entries in runs
    (HEAD_RUN, jagged.tiles.bwd_head_run) for a long non-causal call whose rows over all
    heads exceed the L2 budget (4 x 2048 tokens, H32/8, 67 MB), the heads innermost when
    causal."""
    import jagged.tiles as T
    launches = record_launches(monkeypatch, bw, T)
    monkeypatch.setattr(bw, "num_sms", lambda dev: 132)
    H, HKV, D = 32, 8, 128
    lk = torch.tensor([2048] * 4)
    cu = offsets(lk)
    q = torch.zeros(int(cu[-1]), H, D, dtype=torch.float16)
    k = torch.zeros(int(cu[-1]), HKV, D, dtype=torch.float16)
    bw.backward(q, q, k, k, q, torch.zeros(H, q.shape[0]), cu, cu, 2048, 2048, causal,
                0.125, False)
    (kw,) = [kw for name, _, kw in launches if name == "bwd_kernel"]
    assert kw["HEAD_RUN"] == (1 if causal else T.BWD_HEAD_RUN) > 0


@pytest.mark.parametrize("windows,long", [(False, False), (True, False), (False, True)])
def test_host_split_launches(monkeypatch, windows, long):
    """A call whose tiles (or key windows) are split over programs launches what a whole
    one does: the preprocess zeroes the fp32 dK / dV accumulators and the postprocess
    converts them, each into its own gradient, no launch of their own; long packed
    sequences (jagged.tiles.FLAT_MEAN_Q query rows and more on average) keep the row
    accumulator and _bwd_postprocess."""
    launches = record_launches(monkeypatch, bw)
    monkeypatch.setattr(bw, "num_sms", lambda dev: 132)
    monkeypatch.setattr(bw, "bwd_parts", lambda *a: 4)
    monkeypatch.setattr(bw, "window_parts", lambda *a: 4)
    monkeypatch.setattr(bw, "window_tiles", lambda *a: (None, None, torch.zeros(3, 2)))
    monkeypatch.setattr(bw, "window_rows", lambda *a: None)
    H, HKV, D = 4, 2, 64
    lk = torch.tensor([30, 20, 5] if windows else [1300, 900, 5] if long else [300, 200, 5])
    cu = offsets(lk)
    n = int(cu[-1])
    assert bw.takes_windows(n, len(lk), int(lk.max()), False) == windows
    assert (n / len(lk) >= FLAT_MEAN_Q) == long
    q = torch.zeros(n, H, D, dtype=torch.float16)
    k = torch.zeros(n, HKV, D, dtype=torch.float16)
    _, dk, dv = bw.backward(q, q, k, k, q, torch.zeros(H, n), cu, cu, int(lk.max()),
                            int(lk.max()), True, 0.125, False)
    post_name = "_bwd_post_rows" if windows else "_bwd_postprocess"
    (pre, pa, pk), (main, ma, mk), (post, qa, qk) = (x for x in launches
                                                     if x[0] != "_window_rows")
    assert (pre, main, post) == ("_bwd_preprocess", "bwd_kernel", post_name)
    assert pk["ZERO_DKV"] and mk["PARTS"] == 4 and qk["DKV"]
    assert pa[3].shape == (n, H, D)                    # the dQ accumulator: a row a token
    acc = pa[15]
    assert acc.dtype == torch.float32 and acc.shape == (2, n, HKV, D) and pa[16] == 2 * n * HKV
    assert ma[7].data_ptr() == acc.data_ptr() and ma[8].data_ptr() == acc[1].data_ptr()
    at = 9 if windows else 6
    assert qa[at] is acc and qa[at + 1] is dk and qa[at + 2] is dv and qa[at + 3] == dk.numel()
    assert dk.untyped_storage().data_ptr() != dv.untyped_storage().data_ptr()


@pytest.mark.parametrize("long", [False, True])
def test_host_windows_direct(monkeypatch, long):
    """Key windows whose sequences all fit a window's keys, whole windows
    (jagged.tiles.windows_direct): the preprocess zeroes dQ itself (the tensor returned)
    and no postprocess launches; with one longer sequence the preprocess zeroes the fp32
    accumulator's rows and _bwd_post_rows converts them."""
    launches = record_launches(monkeypatch, bw)
    monkeypatch.setattr(bw, "num_sms", lambda dev: 132)
    monkeypatch.setattr(bw, "window_parts", lambda *a: 1)
    monkeypatch.setattr(bw, "window_tiles", lambda *a: (None, None, torch.zeros(3, 2)))
    monkeypatch.setattr(bw, "window_rows", lambda *a: None)
    H, HKV, D = 4, 2, 64
    lk = torch.tensor([30, 20, 5] + ([300] if long else []))
    cu = offsets(lk)
    n = int(cu[-1])
    assert bw.takes_windows(n, len(lk), int(lk.max()), False)
    q = torch.zeros(n, H, D, dtype=torch.float16)
    k = torch.zeros(n, HKV, D, dtype=torch.float16)
    dq, _, _ = bw.backward(q, q, k, k, q, torch.zeros(H, n), cu, cu, int(lk.max()),
                           int(lk.max()), True, 0.125, False)
    names = [x[0] for x in launches]
    assert names == ["_bwd_preprocess", "bwd_kernel"] + (["_bwd_post_rows"] if long else [])
    (_, pa, pk), (_, ma, _) = launches[:2]
    assert pk["LONG_K"] == bw.BLOCK_N and pa[17] == n * H
    if long:
        assert pa[3].dtype == torch.float32 and pa[3].data_ptr() == ma[6].base.data_ptr()
        assert ma[6].base.shape == (n, H, D)
    else:
        assert pa[3] is dq and ma[22] is dq
        # the fp32 accumulator only backs the dQ descriptor: one block
        assert ma[6].base.shape == (bw.window_config(D).block_m, H, D)


def test_postprocess_converts_split_dkv():
    """Tiles split over programs (jagged.tiles.bwd_parts): the host's postprocess also
    casts the fp32 dK / dV accumulators, each into its own gradient (scale already applied
    by the parts), in the dQ launch (its grid-stride loop: more key rows than query rows
    here)."""
    from jagged.tiles import dkv_accumulator
    g = torch.Generator().manual_seed(1)
    nq, nk, H, HKV, d = 9, 70, 4, 2, 64
    q = torch.empty(nq, H, d, dtype=torch.float16)
    k = torch.empty(nk, HKV, d, dtype=torch.float16)
    out = torch.randn(nq, H, d, generator=g).half()
    p = bw._prepare(out, q, k, k, out, torch.zeros(H, nq), torch.tensor([0, nk]), False)
    dq_acc = torch.randn(nq, H, d, generator=g)
    acc = dkv_accumulator(k, 2)
    acc.copy_(torch.randn(acc.shape, generator=g))
    bw._postprocess(p, dq_acc, 0.5, False, acc)
    torch.testing.assert_close(p.dq.float(), (dq_acc * 0.5).half().float())
    torch.testing.assert_close(p.dk.float(), acc[0].half().float())
    torch.testing.assert_close(p.dv.float(), acc[1].half().float())


def test_window_lists_once_per_offsets(monkeypatch):
    """An eager call on the offsets tensors of the call before launches neither the key
    windows' list kernel nor `_window_rows` (window_lists keeps both, per_offsets); new
    offsets, another causality, or a bumped offsets tensor build them again."""
    from jagged import tiles
    launches = record_launches(monkeypatch, bw, tiles)
    monkeypatch.setattr(bw, "num_sms", lambda dev: 132)
    H, HKV, D = 4, 2, 64
    lk = torch.tensor([30, 20, 5, 41])
    cu = offsets(lk)
    n = int(cu[-1])
    assert bw.takes_windows(n, len(lk), int(lk.max()), False)
    q = torch.zeros(n, H, D, dtype=torch.float16)
    k = torch.zeros(n, HKV, D, dtype=torch.float16)

    def built(causal, cu_q, cu_k):
        launches.clear()
        bw.backward(q, q, k, k, q, torch.zeros(H, n), cu_q, cu_k, int(lk.max()),
                    int(lk.max()), causal, 0.125, False)
        names = [x[0] for x in launches]
        assert names[-2:] == ["bwd_kernel", "_bwd_post_rows"], names
        return {"_windows_kernel", "_window_rows"} & set(names)

    monkeypatch.setattr(tiles, "_TILE_CACHE", type(tiles._TILE_CACHE)())
    both = {"_windows_kernel", "_window_rows"}
    assert built(True, cu, cu) == both
    assert built(True, cu, cu) == set()
    assert built(False, cu, cu) == {"_window_rows"}      # the list itself is causal-free
    assert built(True, cu.clone(), cu) == both
    cu.add_(0)                                           # in place: a new version
    assert built(True, cu, cu) == both
