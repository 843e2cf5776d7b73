"""The CuteDSL Hopper forward compiles for sm_90a on a CPU-only machine.

CuteDSL compiles without a GPU when CUTE_DSL_ARCH names the target; the kernel is
compiled on symbolic (fake) tensors, so no device memory is touched. The PTX is kept
(CUTE_DSL_KEEP=ptx) and checked for what the design relies on: wgmma, TMA bulk-tensor
loads, setmaxnreg (warp specialization), a store barrier per consumer warpgroup and the
KV mask as one select per score; the fp8 build also for its e4m3 S = Q K^T, its TMA
byte counts and (from the cubin the DSL built) no spills. The row-windows build too (its
masks, no bulk loop, no spills); and, on plain ints, the window schedule and per-row key
ranges against jagged's torch references, and the host's launch of either build.
"""
import os
import re
import textwrap

import pytest

from _cute import ROOT, compile_in_subprocess, have_dsl
from _interp import interp

_ok, _why = have_dsl()
needs_dsl = pytest.mark.skipif(not _ok, reason=_why)

# one subprocess per build: CUTE_DSL_* must be set before the DSL is imported
_SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {root!r})
    from kernels_cute import fwd_hopper as F
    dt = {{"bf16": torch.bfloat16, "fp16": torch.float16,
           "fp8": torch.float8_e4m3fn}}[{dtype!r}]
    F.compile_forward(dt, {D}, {causal}, {bq}, F.CONFIGS[({D}, {bucket!r}, {causal})])
    print("COMPILED")
""")


@needs_dsl
@pytest.mark.parametrize("D,causal,bq,bucket,dtype", [
    # in CI: 192 rows (three consumers) non-causal with 128-key blocks, and 128 rows causal
    # with 64-key blocks; the rest in `make test-matrix`
    (64, False, False, "long", "bf16"), (128, True, False, "short", "bf16"),
    *(pytest.param(*v, marks=pytest.mark.matrix) for v in (
        (64, True, False, "long", "bf16"), (64, True, False, "short", "bf16"),
        (128, False, False, "long", "bf16"), (128, True, True, "long", "bf16"),
        (128, False, True, "short", "fp16")))])
def test_forward_default_builds(tmp_path, D, causal, bq, bucket, dtype):
    """The default build of a (D, bucket, causal) cell. Each consumer warpgroup stores its
    own 64 O rows behind a 128-thread named barrier (no 256-thread epilogue barrier, as
    TLX), and the KV mask is one select per score (as TLX's tl.where; an `if` per score
    lowered to select chains: ~2000 selp in the 128-key build). 192-row tiles (D = 64
    long): three consumer warpgroups at 160 registers (24 * 128 + 160 * 384 <= 64K) take
    their wgmma turns in a ring whose barrier ids are computed at run time, so the PTX
    shows only consumer 0's pre-arrive."""
    script = _SCRIPT.format(root=ROOT, D=D, causal=causal, bq=bq, bucket=bucket, dtype=dtype)
    path = compile_in_subprocess(tmp_path, script, timeout=900)
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    mma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.(bf16|f16)", ptx)
    assert mma, "no wgmma in the PTX"
    assert re.search(r"cp\.async\.bulk\.tensor", ptx), "no TMA load in the PTX"
    regs = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)
    block_m = 192 if (D, bucket) == (64, "long") else 128
    assert sorted(regs) == [("dec", "24"), ("inc", "160" if block_m == 192 else "240")], regs
    assert re.search(r"bar\.arrive\s+2,\s*256;", ptx), "consumer 0's first turn"
    syncs = re.findall(r"bar\.sync\s+(\S+),\s*(\d+);", ptx)
    # the per-warpgroup epilogue barrier, and no 256-thread epilogue barrier (id 1)
    assert any(n == "128" for _, n in syncs), syncs
    assert ("1", "256") not in syncs, syncs
    # one select per masked score: S has block_n / 2 scores a thread, masked in two
    # places causal (the first block and the tail step), in one non-causal (mask_first:
    # no tail code), so at least places * block_n / 2 (a mask folded away at trace time
    # would leave ~30: the kernel's other selects); the `if` mask had ~2000 (128 keys)
    block_n = 128 if bucket == "long" else 64
    places = 2 if causal else 1
    selp = len(re.findall(r"\bselp\.", ptx))
    assert places * block_n // 2 <= selp <= places * block_n + 64, selp
    # a programmatic dependent of the list kernel: one wait, before any global access
    assert len(re.findall(r"griddepcontrol\.wait;", ptx)) == 1


@needs_dsl
@pytest.mark.parametrize("D,causal,bq,bucket", [  # one in CI, the rest in `make test-matrix`
    (128, True, False, "long"),
    *(pytest.param(*v, marks=pytest.mark.matrix) for v in (
        (64, False, False, "long"), (128, False, True, "short"), (64, True, True, "short")))])
def test_forward_fp8_builds(tmp_path, D, causal, bq, bucket):
    """The fp8 build (e4m3 q and k): S = Q K^T an e4m3 x e4m3 -> fp32 wgmma (k32 steps),
    P V the bf16 one (P packed to bf16); the TMA byte counts those of an e4m3 Q slot and
    K block and a bf16 V block; the consumers' registers as the 16-bit build's; no spills
    in the cubin. Its SharedStorage (asserted equal to smem_bytes when traced) fits:
    test_forward_configs."""
    from kernels_cute import fwd_hopper as F
    cfg = F.CONFIGS[(D, bucket, causal)]
    script = _SCRIPT.format(root=ROOT, D=D, causal=causal, bq=bq, bucket=bucket, dtype="fp8")
    path = compile_in_subprocess(tmp_path, script, timeout=900)
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    mma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k\d+\.f32\.\w+\.\w+)", ptx)
    e4m3 = [m for m in mma if m == f"m64n{cfg.block_n}k32.f32.e4m3.e4m3"]
    bf16 = [m for m in mma if m == f"m64n{D}k16.f32.bf16.bf16"]
    print(f"D={D} causal={causal} bq={bq} {bucket}: e4m3 wgmma x{len(e4m3)}, "
          f"bf16 wgmma x{len(bf16)}")
    assert e4m3 and bf16 and len(e4m3) + len(bf16) == len(mma), sorted(set(mma))
    assert "cvt.rn.bf16x2.f32" in ptx
    # expect_tx of Q (block_m x D e4m3), K (block_n x D e4m3) and V (block_n x D bf16)
    tx = re.findall(r"mov\.b32\s+(%r\d+),\s*(\d+);\s*\n\s*mbarrier\.arrive\.expect_tx\S*"
                    r"\s+\S+,\s*\[[^\]]+\],\s*(%r\d+);", ptx)
    assert sorted(int(n) for r, n, r2 in tx if r == r2) == \
        sorted([cfg.block_m * D, cfg.block_n * D, 2 * cfg.block_n * D]), tx
    regs = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)
    assert sorted(regs) == [("dec", "24"), ("inc", "160" if cfg.block_m == 192 else "240")]
    cubin = path[:-len(".ptx")] + ".cubin"
    if os.path.exists(cubin):
        from harness.compile_check import _resource_usage
        use = _resource_usage(open(cubin, "rb").read())
        print(use)
        assert use["STACK"] + use["LOCAL"] + use["spill_insts"] == 0, use


def test_forward_configs():
    """The measured table: one config per (D, bucket, causal), mask_first exactly where
    the call is non-causal, 192-row tiles at D = 64 long, 64-key blocks in the short
    bucket, each within the shared-memory limit (16-bit and fp8); pick_config reads the
    table through the shared bucket rule."""
    from jagged.arch import SMEM_LIMIT
    from jagged.tiles import fwd_bucket, fwd_consumers
    from kernels_cute import fwd_hopper as F
    assert set(F.CONFIGS) == {(d, b, c) for d in (64, 128) for b in ("short", "long")
                              for c in (False, True)}
    for (d, bucket, causal), cfg in F.CONFIGS.items():
        assert cfg.mask_first == (not causal)
        assert cfg.block_m == (192 if (d, bucket) == (64, "long") else 128)
        assert cfg.block_n == (64 if bucket == "short" else 128)
        fwd_consumers(cfg.block_m, F.LOAD_REGS)               # 2 or 3 consumers fit
        for fp8 in (False, True):                              # fp8: the bf16 O buffers
            assert F.smem_bytes(d, cfg, fp8) <= SMEM_LIMIT[90], (d, bucket, causal, fp8)
    assert F.smem_bytes(128, F.CONFIGS[(128, "long", True)], True) == 193 * 1024
    for d in (64, 128):
        for causal in (False, True):
            for max_k, mean_k in ((64, None), (8192, None), (2048, 100.0)):
                assert F.pick_config(d, max_k, causal, mean_k) == \
                    F.CONFIGS[(d, fwd_bucket(max_k, mean_k, causal), causal)]


@needs_dsl
def test_seqinfo_matches_the_core():
    """kernels_cute.seqinfo (the kernels' sequence and causal ranges, traced on the DSL's
    integers) computes what jagged.seqinfo's references do, on plain ints: every row /
    key against self (len_q = len_k), more queries than keys and more keys than queries,
    empty sequences included; and SeqlenInfo.of reads the offsets as seq_range does
    (broadcast-Q: the dense query, out rows b * L_q on)."""
    import torch
    from jagged import seqinfo as core
    from kernels_cute import seqinfo as S
    for len_q in (0, 1, 5, 64, 130):
        for len_k in (0, 1, 5, 64, 200):
            for x in range(-3, 260, 7):
                assert S.causal_kv_end(x, len_q, len_k) == \
                    int(core.causal_kv_end_ref(x, len_q, len_k)), (x, len_q, len_k)
                assert S.causal_q_start(x, len_q, len_k) == \
                    int(core.causal_q_start_ref(x, len_q, len_k)), (x, len_q, len_k)
                assert S.causal_visible(x, x + 3, len_q, len_k) == \
                    bool(core.causal_visible_ref(x, x + 3, len_q, len_k))
    cu_q, cu_k = [0, 5, 5, 12], [0, 7, 30, 31]
    starts_q, lens_q = core.seq_range_ref(torch.tensor(cu_q))
    starts_k, lens_k = core.seq_range_ref(torch.tensor(cu_k))
    for b in range(3):
        seq = S.SeqlenInfo.of(b, cu_q, cu_k, 0, False)
        assert (seq.q_start, seq.out_start, seq.len_q) == (starts_q[b], starts_q[b], lens_q[b])
        assert (seq.k_start, seq.len_k) == (starts_k[b], lens_k[b])
        seq = S.SeqlenInfo.of(b, None, cu_k, 9, True)
        assert (seq.q_start, seq.out_start, seq.len_q) == (0, 9 * b, 9)
        assert seq.causal_kv_end(9) == core.causal_kv_end_ref(9, 9, seq.len_k)


# ----------------------------------------------------------------------------- row windows

_WINDOW_SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {root!r})
    from kernels_cute import fwd_hopper as F
    dt = {{"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}}[{dtype!r}]
    F.compile_forward(dt, {D}, {causal}, False, F.window_config({D}))
    print("COMPILED")
""")


@needs_dsl
@pytest.mark.parametrize("D,causal,dtype", [  # two in CI, the rest in `make test-matrix`
    (128, True, "fp16"), (128, True, "fp8"),
    *(pytest.param(*v, marks=pytest.mark.matrix) for v in (
        (64, False, "bf16"), (64, True, "bf16"), (128, False, "bf16"), (128, True, "bf16"),
        (64, False, "fp8")))])
def test_forward_window_builds(tmp_path, D, causal, dtype):
    """The row-windows build (window_config): every KV block masked, so the wgmmas are
    those of the first step, one tail step and the last PV (no bulk-loop code); the mask
    one unsigned compare and one select a score in both masked places (first step, tail);
    the consumers' registers as the short build's; no spills in the cubin; its
    SharedStorage (asserted equal to smem_bytes when traced) within the limit. fp8: S an
    e4m3 wgmma (k32), P V in bf16."""
    from jagged.arch import SMEM_LIMIT
    from kernels_cute import fwd_hopper as F
    cfg = F.window_config(D)
    assert F.smem_bytes(D, cfg, dtype == "fp8") <= SMEM_LIMIT[90]
    script = _WINDOW_SCRIPT.format(root=ROOT, D=D, causal=causal, dtype=dtype)
    path = compile_in_subprocess(tmp_path, script, timeout=900)
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    kind = "f16" if dtype == "fp16" else "bf16"
    mma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.(\w+)\.", ptx)
    qk = [m for m in mma if m == (str(cfg.block_n), kind)]
    pv = [m for m in mma if m == (str(D), kind)]
    if dtype == "fp8":                                     # S in e4m3, 32 deep a wgmma
        qk = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{cfg.block_n}k32\.f32"
                        r"\.e4m3\.e4m3", ptx)
        assert (len(qk), len(pv), len(mma)) == (2 * D // 32, 2 * cfg.block_n // 16,
                                                len(pv)), (qk, mma)
    elif D == cfg.block_n:                                 # one shape for both products
        assert len(mma) == len(qk) == 2 * D // 16 + 2 * cfg.block_n // 16, mma
    else:
        assert (len(qk), len(pv), len(mma)) == (2 * D // 16, 2 * cfg.block_n // 16,
                                                len(qk) + len(pv)), mma
    regs = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)
    assert sorted(regs) == [("dec", "24"), ("inc", "240")], regs
    scores = 2 * cfg.block_n // 2                          # two masked places
    unsigned = len(re.findall(r"\bsetp\.(?:lt|ge)\.u32\b", ptx))
    # -inf as a float or (fp16 build) as its bits
    minus_inf = len(re.findall(r"\bselp\.(?:f32|b32)\s+%r\d+,\s*%r\d+,\s*"
                               r"(?:0fFF800000|-8388608),", ptx))
    assert scores <= unsigned <= scores + 8 and scores <= minus_inf <= scores + 8, \
        (unsigned, minus_inf)
    cubin = path[:-len(".ptx")] + ".cubin"
    if os.path.exists(cubin):
        from harness.compile_check import _resource_usage
        use = _resource_usage(open(cubin, "rb").read())
        print(f"windows D={D} causal={causal} {dtype}: {use}, smem "
              f"{F.smem_bytes(D, cfg, dtype == 'fp8')} B")
        assert use["STACK"] + use["LOCAL"] + use["spill_insts"] == 0, use


def test_window_config():
    """Row windows: the short bucket's tile, mask_first off, and only where
    jagged.tiles.windowed says so, never fp8 or broadcast-Q."""
    from jagged.tiles import windowed
    from kernels_cute import fwd_hopper as F
    for d in (64, 128):
        cfg = F.window_config(d)
        short = F.CONFIGS[(d, "short", True)]
        assert cfg.windows and not cfg.mask_first and not short.windows
        assert (cfg.block_m, cfg.block_n, cfg.num_buffers_kv, cfg.num_buffers_q) == \
            (short.block_m, short.block_n, short.num_buffers_kv, short.num_buffers_q)
    for n_rows, batch, max_q in ((26 * 100, 100, 60), (64 * 10, 10, 64), (65 * 10, 10, 90),
                                 (5, 1, 5), (40, 40, 1)):
        for bq in (False, True):
            assert F.takes_windows(n_rows, n_rows, batch, max_q, bq) == \
                windowed(n_rows, batch, max_q, 128, bq)
    assert F.takes_windows(26 * 100, 26 * 100, 100, 60, False)
    assert not F.takes_windows(26 * 100, 129 * 100, 100, 60, False)  # long keys


class _Ints:
    """A tensor read as the kernel reads it (t[i], t[i, j]), in plain ints."""
    def __init__(self, t):
        self.t = t

    def __getitem__(self, i):
        return int(self.t[i])


@needs_dsl
@pytest.mark.parametrize("causal", [False, True])
def test_window_coords_match_the_reference(monkeypatch, causal):
    """schedule.window_coords and the compute role's row ranges (seqinfo.row_seq_chunk,
    row_kv_range, mirrored as `row_ranges` runs them), on plain ints against jagged's
    torch references: every (live window, head) tile once per grid size; a window's first
    row, real rows and first key; its KV blocks cover every key its rows see and stop at
    its last sequence's keys; each row's key columns those of row_kv_range_ref (none past
    the real rows), and the unsigned mask keeps exactly them. The lengths include empty
    sequences, single rows, a sequence over several windows, and a causal last sequence
    cut by its window before it sees any key (its first sequence's rows still read)."""
    import cutlass.cute as cute
    import torch
    from jagged.seqinfo import row_kv_range_ref
    from jagged.tiles import window_tiles_reference
    from kernels_cute import schedule as Sch
    from kernels_cute import seqinfo as S

    BM, BN, H, group = 128, 64, 3, 3
    g = torch.Generator().manual_seed(7 + causal)
    lq = torch.randint(0, 50, (60,), generator=g)
    lk = torch.randint(0, 90, (60,), generator=g)
    lq[:2], lk[:2] = torch.tensor([10, 1000]), torch.tensor([100, 10])  # the cut last sequence
    lq[5:12] = torch.tensor([0, 1, 0, 0, 300, 1, 0])
    lk[5:12] = torch.tensor([3, 0, 0, 7, 40, 1, 0])
    cu_q = torch.cat([torch.zeros(1, dtype=torch.int64), lq.cumsum(0)])
    cu_k = torch.cat([torch.zeros(1, dtype=torch.int64), lk.cumsum(0)])
    total = int(cu_q[-1])
    order, count, win = window_tiles_reference(cu_q, cu_k, total + 300, BM, BN)  # dead ones
    n_live = int(count)
    cq, ck = _Ints(cu_q), _Ints(cu_k)

    for P in (1, 5, 132):
        monkeypatch.setattr(cute.arch, "grid_dim", lambda: (P, 1, 1))
        seen = []
        for p in range(P):
            for t in range(p, n_live * H, P):
                c = Sch.window_coords(t, _Ints(order), n_live, _Ints(win), cq, ck, H, group,
                                      BM, BN, causal)
                seen.append((c[3].q_start, c[0]))
        assert sorted(seen) == sorted((int(win[2, w]), h) for w in order[:n_live]
                                      for h in range(H))

    for idx in range(n_live):
        h, hk, m0, seq, n_bulk, n_end, s_first, s_last = Sch.window_coords(
            idx * H + 2, _Ints(order), n_live, _Ints(win), cq, ck, H, group, BM, BN, causal)
        w = int(order[idx])
        start = int(win[2, w])
        rows = torch.arange(start, min(start + BM, int(cu_q[int(win[1, w]) + 1])))
        ref_seq, ref_lo, ref_hi = row_kv_range_ref(cu_q, cu_k, rows, causal)
        assert (h, hk, m0, n_bulk) == (2, 0, 0, 0)
        # the window's sequences: its rows' own, and empty ones around them
        f, l = int(ref_seq[0]), int(ref_seq[-1])
        assert s_first <= f and l <= s_last
        assert (lq[s_first:f] == 0).all() and (lq[l + 1:s_last + 1] == 0).all()
        assert seq.q_start == seq.out_start == start and seq.len_q == len(rows)
        assert seq.k_start == int(cu_k[s_first])
        seen_keys = ref_hi > ref_lo
        if seen_keys.any():                 # the blocks read cover every key a row sees
            assert int(ref_hi[seen_keys].max()) <= seq.k_start + n_end * BN
        assert n_end == -(-max(int(cu_k[s_last + 1]) - seq.k_start, 0) // BN) or causal
        assert seq.k_start + (n_end - 1) * BN < max(int(cu_k[s_last + 1]), seq.k_start + 1)
        for row in range(BM):               # row_ranges, as the compute role runs it
            packed = seq.q_start + row
            s = s_first
            for j0 in range(s_first + 1, s_last + 1, S.ROW_SEQ_CHUNK):
                s = S.row_seq_chunk(cq, j0, s_last, packed, s)
            lo, hi = S.row_kv_range(cq, ck, s, packed, causal)
            hi = hi if row < seq.len_q else lo
            if row < seq.len_q:
                assert (s, lo, hi) == (int(ref_seq[row]), int(ref_lo[row]), int(ref_hi[row]))
            kv_lo, kv_hi = lo - seq.k_start, hi - seq.k_start
            for n in range(n_end):          # window_mask
                width = max(kv_hi - kv_lo, 0)
                for col in range(BN):
                    keep = (col - (kv_lo - n * BN)) % 2 ** 32 < width
                    assert keep == (lo <= seq.k_start + n * BN + col < hi), (row, n, col)


@interp
@pytest.mark.parametrize("short", [True, False])
def test_host_forward_launches_windows(short):
    """host.forward (the tile lists in the interpreter, the kernel a recorder): short
    packed queries launch the window_config build on window_tiles' order, count and
    table (nblk: the windows; programs over windows x heads); otherwise the pair build
    with no table (None); a forward without windows (takes_windows None, Blackwell)
    passes no table argument at all."""
    import torch
    from harness.problems import offsets
    from jagged.tiles import fwd_tiles, window_tiles
    from kernels_cute import fwd_hopper as F
    from kernels_cute import host

    calls = []

    def compiled(*key):
        return lambda *args: calls.append((key, args))

    H, D = 4, 64
    lq = torch.tensor([26, 0, 31, 1, 40, 26] * 4) if short else torch.tensor([300, 200, 5])
    cu = offsets(lq)
    q = torch.zeros(int(cu[-1]), H, D, dtype=torch.bfloat16)
    k = torch.zeros(int(cu[-1]), 2, D, dtype=torch.bfloat16)
    max_q = int(lq.max())
    for windows in (True, False):
        calls.clear()
        kern = host.FwdKernels(F.pick_config, compiled, lambda cfg, n, dev: n, fp8=True,
                               **(dict(takes_windows=F.takes_windows,
                                       window_config=F.window_config) if windows else {}))
        host.forward(kern, q, k, k, cu, cu, max_q, max_q, True, 0.125, False)
        (key, args), = calls
        scalars = args[-5:]
        if windows and short:
            order, count, win = window_tiles(cu, cu, q.shape[0], max_q, 128, 64)
            assert key == (q.dtype, D, True, False, F.window_config(D))
            assert all(torch.equal(a, b) for a, b in zip(args[7:9], (order, count)))
            assert args[9:11] == (None, None) and torch.equal(args[11], win)
            assert scalars[1:] == (0, 2, win.shape[1], win.shape[1] * H)
        else:
            cfg = F.pick_config(D, max_q, True, k.shape[0] / len(lq))
            pairs, count, nblk = fwd_tiles(cu, cu, len(lq), max_q, None, cfg.block_m,
                                           cfg.block_n, True)
            assert key == (q.dtype, D, True, False, cfg) and not cfg.windows
            assert torch.equal(args[7], pairs) and torch.equal(args[8], count)
            assert args[9:] == ((None, None, None) if windows else (None, None)) + scalars
            assert scalars[1:] == (0, 2, nblk, len(lq) * nblk * H)


def _variant_ptx(tmp_path, D, causal, bq, bucket, **fields):
    """(PTX, its path) of fwd_hopper's CONFIGS[(D, bucket, causal)] build with `fields`
    replaced (bf16), compiled in a subprocess; skips when the DSL kept no PTX."""
    script = textwrap.dedent(f"""
        import sys, torch
        from dataclasses import replace
        sys.path.insert(0, {ROOT!r})
        from kernels_cute import fwd_hopper as F
        cfg = replace(F.CONFIGS[({D}, {bucket!r}, {causal})], **{fields!r})
        F.compile_forward(torch.bfloat16, {D}, {causal}, {bq}, cfg)
        print("COMPILED")
    """)
    path = compile_in_subprocess(tmp_path, script, timeout=900)
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    return open(path).read(), path


@needs_dsl
def test_forward_packed_build(tmp_path):
    """A broadcast-Q build that packs 8 GQA heads into a tile's rows (Config.pack): its O
    and LSE go through fragments.packed_views, causal with the query row's cut; it
    compiles for sm_90a with its wgmma and TMA loads."""
    ptx, _ = _variant_ptx(tmp_path, 64, True, True, "short", pack=8)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16", ptx)
    assert re.search(r"cp\.async\.bulk\.tensor", ptx), "no TMA load in the PTX"


@needs_dsl
@pytest.mark.parametrize("causal", [False, pytest.param(True, marks=pytest.mark.matrix)])
def test_forward_direct_build(tmp_path, causal):
    """The list-free build (Config.direct, jagged.tiles.fwd_direct): its one wait for the
    kernel ahead (the offsets check) sits before the consumers' stores, so the load warp
    runs under the check. No spills in the cubin."""
    ptx, path = _variant_ptx(tmp_path, 128, causal, False, "short", direct=True)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16", ptx)
    waits = [m.start() for m in re.finditer(r"griddepcontrol\.wait;", ptx)]
    assert len(waits) == 1, len(waits)
    # after the consumers' last PV wgmma of a tile, before the O stores
    assert ptx.rfind("wgmma.mma_async", 0, waits[0]) > 0
    assert re.search(r"st\.global", ptx[waits[0]:])
    cubin = path[:-len(".ptx")] + ".cubin"
    if os.path.exists(cubin):
        from harness.compile_check import _resource_usage
        use = _resource_usage(open(cubin, "rb").read())
        assert use["STACK"] + use["LOCAL"] + use["spill_insts"] == 0, use
