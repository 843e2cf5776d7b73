"""A forward whose tiles fit one wave runs without a tile list (jagged.tiles.fwd_direct):
the rule, each Hopper host's launch of its list-free build (the kernels a recorder, the
check in the interpreter) and CuteDSL's tile decode on plain ints (TLX's runs in the
interpreter, test_tlx_schedule.py), on the CPU. The builds' PTX: test_compile.py and
test_cute_compile.py (`direct`); on the GPU, test_gpu_matrix.py::test_direct runs them
through the oracle."""
import pytest
import torch

from _interp import interp
from harness.problems import offsets
from jagged import tiles
from jagged.tiles import fwd_direct


def test_rule():
    assert fwd_direct(132, 132) and not fwd_direct(133, 132)
    assert not fwd_direct(4, 132, listed=True)  # row windows, fp8: their list stays


@interp
@pytest.mark.parametrize("heads", [4, 64])
def test_tlx_forward_launches_direct(monkeypatch, heads):
    """fwd_hopper.forward's launch (recorded; the check in the interpreter): a call whose
    (sequence, query block, head) tiles fit one wave of programs launches the DIRECT build
    with no list (pairs None, count: every pair) and queues the offsets check itself;
    one more tile than programs builds the list (its kernel checks the offsets)."""
    from kernels_tlx import fwd_hopper as fh
    launches, checks = [], []

    class Recorder:
        def __init__(self, fn):
            pass

        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, args, kw))

    monkeypatch.setattr(fh, "fast_at", lambda fn, site: Recorder(fn))
    monkeypatch.setattr(fh, "num_sms", lambda dev: 132)
    monkeypatch.setattr(tiles, "check_offsets_async", lambda *a: checks.append(a))
    lq = torch.tensor([300, 200, 5])  # 3 query blocks of 128 a sequence: 9 pairs
    cu = offsets(lq)
    q = torch.zeros(int(cu[-1]), heads, 128, dtype=torch.float16)
    k = torch.zeros(int(cu[-1]), 2, 128, dtype=torch.float16)
    fh.forward(q, k, k, cu, cu, 300, 300, True, 0.125, False)
    (grid, args, kw), = launches
    one_wave = 9 * heads <= 132
    assert kw["DIRECT"] == one_wave and len(checks) == one_wave
    pairs, count = args[7], args[8]
    if one_wave:
        assert pairs is None and count == 9 and grid == (9 * heads,)
        assert checks[0] == (cu, cu, q.shape[0], k.shape[0], 300, 300)
    else:
        assert pairs.dtype == torch.int64 and count.shape == (1,) and grid == (132,)
    assert kw["launch_pdl"]


@interp
@pytest.mark.parametrize("heads", [4, 64])
def test_cute_forward_launches_direct(monkeypatch, heads):
    """host.forward on a kernel set with `direct` (Hopper's; the kernel a recorder, the
    check in the interpreter): a call whose (sequence, query block, head) tiles fit one
    wave of programs launches the Config.direct build with the unused list stand-ins and
    queues the offsets check itself, no list kernel; one more tile than programs takes
    the list, as does a set without `direct`."""
    import torch
    from jagged.tiles import fwd_tiles
    from kernels_cute import fwd_hopper as F
    from kernels_cute import host

    calls, checks = [], []
    monkeypatch.setattr(host, "num_sms", lambda dev: 132)
    monkeypatch.setattr(tiles, "check_offsets_async", lambda *a: checks.append(a))

    def compiled(*key):
        return lambda *args: calls.append((key, args))

    lq = torch.tensor([300, 200, 5])  # 3 query blocks of 128 a sequence: 9 pairs
    cu = offsets(lq)
    q = torch.zeros(int(cu[-1]), heads, 128, dtype=torch.bfloat16)
    k = torch.zeros(int(cu[-1]), 2, 128, dtype=torch.bfloat16)
    for direct in (True, False):
        calls.clear(), checks.clear()
        kern = host.FwdKernels(F.pick_config, compiled, lambda cfg, n, dev: n, fp8=True,
                               direct=direct)
        host.forward(kern, q, k, k, cu, cu, 300, 300, True, 0.125, False)
        (key, args), = calls
        cfg = key[-1]
        one_wave = direct and 9 * heads <= 132
        assert cfg.direct == one_wave
        assert len(checks) == one_wave  # else the list kernel checks (fwd_tiles' check=)
        if one_wave:
            assert checks[0][:2] == (cu, cu) and checks[0][2:] == (q.shape[0], k.shape[0],
                                                                   300, 300)
            assert args[7:9] == host._unused_list(q.device)
        else:
            pairs, count, _ = fwd_tiles(cu, cu, 3, 300, None, cfg.block_m, cfg.block_n, True)
            assert torch.equal(args[7], pairs) and torch.equal(args[8], count)
        assert args[-3:-1] == (2 if heads == 4 else 32, 3)  # group, nblk


class _Ints:
    """A tensor read as the kernel reads it (t[i]), in plain ints."""
    def __init__(self, t):
        self.t = t

    def __getitem__(self, i):
        return int(self.t[i])


@pytest.mark.parametrize("causal", [False, True])
def test_cute_tile_coords_direct(monkeypatch, causal):
    """CuteDSL's schedule.tile_coords with DIRECT, on plain ints (one program a tile, as a
    one-wave launch): every (pair, head) of the batch once; a real pair's KV walk as the
    bottom-right causal cut gives it, and a pair past its sequence's queries (zero-length
    sequences too) visits no block."""
    cute = pytest.importorskip("cutlass.cute")
    from jagged.seqinfo import causal_kv_end_ref
    from kernels_cute import schedule as Sch
    lq, lk = torch.tensor([130, 0, 64, 200, 1]), torch.tensor([40, 90, 0, 300, 64])
    cq = _Ints(torch.cat([torch.zeros(1, dtype=torch.int64), lq.cumsum(0)]))
    ck = _Ints(torch.cat([torch.zeros(1, dtype=torch.int64), lk.cumsum(0)]))
    H, nblk, BM, BN = 2, 4, 64, 64
    n = len(lq) * nblk
    monkeypatch.setattr(cute.arch, "grid_dim", lambda: (n * H, 1, 1))
    got = []
    for t in range(n * H):
        h, hk, m0, seq, n_bulk, n_end, b = Sch.tile_coords(
            t, None, n, cq, ck, 0, H, 1, nblk, BM, BN, causal, False, 1, True)
        got.append((b, m0, h))
        if m0 >= int(lq[b]):
            assert (n_bulk, n_end) == (0, 0), (b, m0)
        elif causal:
            end = int(causal_kv_end_ref(m0 + BM, lq[b], lk[b]))
            full = int(causal_kv_end_ref(m0 + 1, lq[b], lk[b]))
            assert (n_bulk, n_end) == (full // BN, -(-end // BN)), (b, m0)
        else:
            assert (n_bulk, n_end) == (int(lk[b]) // BN, -(-int(lk[b]) // BN)), (b, m0)
    assert sorted(got) == sorted((b, m * BM, h) for b in range(len(lq)) for m in range(nblk)
                                 for h in range(H))
