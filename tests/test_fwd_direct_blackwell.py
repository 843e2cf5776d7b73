"""The Blackwell forwards' list-free one-wave path (jagged.tiles.fwd_direct), as the Hopper
ones' (test_fwd_direct.py): TLX's DIRECT and CuteDSL's Config.direct, on the CPU.

- builds for sm_100a: no counter atomic (TLX) or CLC query (CuteDSL); the dependent
  launch's wait only where the stores are (TLX: in the correction task, ahead of each
  of its stores; CuteDSL: after the loads' reads, before every global store), TMEM,
  shared memory and spills as the list builds;
- each host's launch under a mocked compute capability 10.0 (the kernels a recorder,
  the tile list in the interpreter): one wave queues the offsets check alone, then the
  direct kernel as a programmatic dependent, no list kernel; one more tile than
  programs takes the list;
- the tile decode of both styles (TLX in the interpreter, CuteDSL on ints) against the
  bottom-right causal cut: every (pair, head) once, a pair past its queries visits no
  block.
"""
import re

import pytest
import torch
import triton
import triton.language as tl

from _blackwell import (check_cute, check_tcgen05, cute_run, cute_variant,
                        first_then_matrix, xfail_spills)
from _capability import device  # noqa: F401  (a fixture)
from _cute import have_dsl
from _interp import interp
from harness.problems import offsets
from jagged import dispatch, tiles
from kernels_tlx import fwd_blackwell as fb

CUDA0 = torch.device("cuda", 0)


# ----------------------------------------------------------------------------- TLX builds
# (head_dim, bucket, causal, broadcast_q, dtype[, pack]), as test_fwd_blackwell_tlx's
TLX_VARIANTS = [
    (64, "short", True, False, "bf16"),
    (128, "long", False, False, "bf16"),
    (128, "short", True, True, "bf16"),
    (64, "long", True, False, "fp16"),
    (64, "short", False, True, "bf16", 8),
    (128, "long", True, True, "bf16", 4),
]
SPILL_BOUND = 200  # test_fwd_blackwell_tlx's: the softmax at 88 registers


def _tlx_direct(d, bucket, causal, bq, dt, pack=1):
    from harness.compile_check import compile_kernel
    cfg = fb.CONFIGS[(d, bucket, causal)]
    const = dict(fb.kernel_args(cfg, d, causal, bq, pack, direct=True), pairs_ptr=None,
                 count_ptr=None, sched_ptr=None)
    name = (f"bw fwd direct D{d} {bucket} {'causal' if causal else 'full'}"
            f"{' bq' if bq else ''}{f' pack {pack}' if pack > 1 else ''} {dt}")
    return compile_kernel(fb.fwd_kernel, fb.signature(cfg, d, dt, direct=True), const,
                          arch=100, num_warps=4, num_stages=1, name=name)


def _regions(ttgir: str) -> tuple[str, str]:
    """(the warp_specialize op's default region, its partitions) of a TTGIR."""
    head, rest = ttgir.split("ttg.warp_specialize(", 1)
    default, parts = rest.split("partition0(", 1)
    return default, parts


@pytest.mark.parametrize("v", first_then_matrix(TLX_VARIANTS),
                         ids=lambda v: "-".join(map(str, v)))
def test_tlx_direct_compiles_sm100(v):
    """No tile counter (no atomic), no handoff; the griddepcontrol.wait in the
    correction (the default task) alone, once ahead of its epilogue and once ahead of a
    keyless tile's stores: every global store of the kernel follows one, and the load,
    mma and softmax tasks wait for nothing."""
    rep = _tlx_direct(*v)
    cols = check_tcgen05(rep)
    assert 2 * (fb.CONFIGS[tuple(v[:3])].block_n + v[0]) <= max(cols)
    assert rep.ptx.count("griddepcontrol.wait") == 2, rep.row()
    assert "atom." not in rep.ptx, "a tile-counter atomic in the direct build"
    default, parts = _regions(rep.ttgir)
    assert "griddepcontrol.wait" not in parts and "tt.store" not in parts
    first_wait = default.index("griddepcontrol.wait")
    assert "tt.store" not in default[:first_wait]
    for chunk in default.split("griddepcontrol.wait")[1:]:
        assert "tt.store" in chunk
    xfail_spills(rep, SPILL_BOUND, "softmax at 88 registers (OptimizePartitionWarps)")


# ----------------------------------------------------------------------------- CuteDSL builds
_ok, _why = have_dsl()
needs_dsl = pytest.mark.skipif(not _ok, reason=_why)

# the build script of test_fwd_blackwell_cute, recording the launch's use_pdl
_CUTE_BODY = """
    from kernels_cute import fwd_blackwell as F
    cfg = F.Config(**{cfg!r})
    k = F.build(dt, {D}, {causal}, {bq}, cfg)
    pdl, launch = [], k.launch

    def recorded(kernel, n, stream, use_pdl=False):
        pdl.append(use_pdl)
        return launch(kernel, n, stream, use_pdl=use_pdl)

    k.launch = recorded
    F.compile_forward(dt, {D}, {causal}, {bq}, cfg, kernel=k)
    print("INFO " + json.dumps(dict(tmem_total=k.tmem_total, tmem_o=k.tmem_o,
          smem=k.shared_storage.size_in_bytes(), cluster=list(k.cluster_shape),
          threads=k.num_threads, pdl=pdl, clc=k.clc)))
    print("COMPILED")
"""
CUTE_DEFAULT = [(128, False, False, "bf16", {"direct": True})]
CUTE_MATRIX = [(64, True, True, "fp16", {"direct": True}),
               (128, True, True, "bf16", {"pack": 8, "direct": True}),
               (64, False, False, "bf16", {"direct": True, "early_release": False})]


def _check_cute_direct(variant, info, ptx, log):
    """As the list builds (test_fwd_blackwell_cute: MMAs, TMEM, shared memory, 512
    threads at 128 registers, no spills), a dependent launch with no CLC query; its two
    griddepcontrol.wait (one a half's `store`) before every global store, the loads'
    global reads (offsets) ahead of them."""
    D = variant[0]
    check_cute(variant, info, ptx, log, 4 * D // 16 + 2 * 128 // 16, 512, 128)
    assert info["tmem_total"] == 256 + 2 * D
    assert info["pdl"] == [True] and info["clc"] is False
    assert "clusterlaunchcontrol" not in ptx
    waits = [m.start() for m in re.finditer(r"griddepcontrol\.wait;", ptx)]
    assert len(waits) == 2, len(waits)
    stores = [m.start() for m in re.finditer(r"\bst\.global", ptx)]
    assert stores and min(stores) > waits[0]
    assert re.search(r"\bld\.global", ptx[:waits[0]]), "no read ahead of the wait"


@needs_dsl
def test_cute_direct_builds(tmp_path):
    cute_run(CUTE_DEFAULT, lambda v: cute_variant(tmp_path, _CUTE_BODY, v),
             _check_cute_direct)


@needs_dsl
@pytest.mark.matrix
def test_cute_direct_builds_matrix(tmp_path):
    cute_run(CUTE_MATRIX, lambda v: cute_variant(tmp_path, _CUTE_BODY, v),
             _check_cute_direct)


# ----------------------------------------------------------------------------- host launches
def _call(heads, dtype):
    """Three sequences (300, 200, 5 rows): 2 query blocks of 256 a sequence, 6 pairs."""
    lq = torch.tensor([300, 200, 5])
    cu = offsets(lq)
    q = torch.zeros(int(cu[-1]), heads, 128, dtype=dtype)
    k = torch.zeros(int(cu[-1]), 2, 128, dtype=dtype)
    return q, k, cu


def _record_lists(monkeypatch, events):
    """The offsets check queued alone, and a tile-list kernel built, as events."""
    build = tiles._build_fwd_tiles
    monkeypatch.setattr(tiles, "check_offsets_async",
                        lambda *a: events.append(("check", a)))
    monkeypatch.setattr(tiles, "_build_fwd_tiles",
                        lambda *a: events.append(("list", a)) or build(*a))


@interp
@pytest.mark.parametrize("heads", [4, 64])
def test_tlx_host_launches_direct(device, monkeypatch, heads):  # noqa: F811
    """Under compute capability 10.0 the TLX style's forward is fwd_blackwell; a call whose
    tiles fit one wave queues the offsets check, then launches DIRECT as a programmatic
    dependent (no counter, no list, count or scheduling buffer; a program a tile). One
    more tile than programs builds the list (whose kernel checks the offsets)."""
    device(10, 0)
    assert dispatch.style_kernels("tlx", "fwd", CUDA0) is fb
    events = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: events.append(("kernel", (grid, args, kw)))

    monkeypatch.setattr(fb, "fast", lambda fn: Recorder())
    monkeypatch.setattr(fb, "num_sms", lambda dev: 148)
    _record_lists(monkeypatch, events)
    q, k, cu = _call(heads, torch.bfloat16)
    fb.forward(q, k, k, cu, cu, 300, 300, True, 0.125, False)
    one_wave = 6 * heads <= 148
    assert [e for e, _ in events] == (["check", "kernel"] if one_wave else ["list", "kernel"])
    grid, args, kw = events[-1][1]
    assert kw["DIRECT"] == one_wave and kw["launch_pdl"]
    cfg = fb.pick_config(128, 300, True, k.shape[0] / 3)
    assert kw == fb.kernel_args(cfg, 128, True, False, 1, one_wave) | {
        "num_warps": 4, "num_stages": 1, "launch_pdl": True}
    if one_wave:
        assert events[0][1] == (cu, cu, q.shape[0], k.shape[0], 300, 300)
        assert not kw["DYNAMIC"] and args[7:10] == (None, None, None)
        assert grid == (6 * heads,) and args[11] == heads and args[13] == 2  # H, NBLK
    else:
        assert kw["DYNAMIC"] == cfg.dynamic and grid == (148,)
        assert args[7].dtype == torch.int64 and args[8].shape == (1,)


@interp
@pytest.mark.parametrize("heads", [4, 64])
def test_cute_host_launches_direct(device, monkeypatch, heads):  # noqa: F811
    """Under compute capability 10.0 the CuteDSL style's forward is fwd_blackwell; a call
    whose tiles fit one wave queues the offsets check, then calls the Config.direct build
    (its launch a programmatic dependent: test_cute_direct_builds) on the unused list
    stand-ins, a CTA a tile; no list kernel. One more tile than programs takes the list
    and a CLC grid over its upper bound."""
    from kernels_cute import host
    device(10, 0)
    F = dispatch.style_kernels("cute", "fwd", CUDA0)
    assert F.__name__ == "kernels_cute.fwd_blackwell" and F.KERNELS.direct
    events = []
    monkeypatch.setattr(F, "KERNELS", F.KERNELS._replace(
        compiled=lambda *key: lambda *a: events.append(("kernel", (key, a)))))
    monkeypatch.setattr(host, "num_sms", lambda dev: 148)
    _record_lists(monkeypatch, events)
    q, k, cu = _call(heads, torch.bfloat16)
    F.forward(q, k, k, cu, cu, 300, 300, True, 0.125, False)
    one_wave = 6 * heads <= 148
    assert [e for e, _ in events] == (["check", "kernel"] if one_wave else ["list", "kernel"])
    key, args = events[-1][1]
    cfg = key[-1]
    assert cfg.direct == one_wave and cfg.clc
    if one_wave:
        assert events[0][1] == (cu, cu, q.shape[0], k.shape[0], 300, 300)
        assert args[7:9] == host._unused_list(q.device)
    else:
        assert args[7].dtype == torch.int64 and args[8].shape == (1,)
    assert args[-3:] == (heads // 2, 2, 6 * heads)  # group, nblk, programs


# ----------------------------------------------------------------------------- tile decode
LQ, LK = [300, 0, 1, 700, 256], [300, 90, 1, 700, 40]


def _cut(causal, b, m0, bm, bn):
    """(n_bulk of each 128-row half, n_end) of the tile at (b, m0) from the bottom-right
    causal cut; (0, 0, 0) past the sequence's queries."""
    from jagged.seqinfo import causal_kv_end_ref
    lq, lk = LQ[b], LK[b]
    if m0 >= lq:
        return 0, 0, 0
    if not causal:
        return lk // bn, lk // bn, -(-lk // bn)
    end = int(causal_kv_end_ref(m0 + bm, lq, lk))
    full = [int(causal_kv_end_ref(m0 + s * 128 + 1, lq, lk)) for s in range(2)]
    n_end = -(-end // bn)
    return min(full[0] // bn, n_end), min(full[1] // bn, n_end), n_end


def _cu(lens):
    return offsets(torch.tensor(lens))


@pytest.mark.parametrize("causal", [False, True])
def test_cute_tile_of_direct(causal):
    """CuteDSL's tile_of with DIRECT on ints (a CTA a tile): every (pair, head) of the
    batch once, in pair order; each half's unmasked blocks and the tile's last block as
    the causal cut gives them, and no block for a pair past its queries (a zero-length
    sequence's too)."""
    from kernels_cute import fwd_blackwell as F
    BM, BN, H = 256, 128, 2
    nblk = -(-max(LQ) // BM)
    n = len(LQ) * nblk
    sched = F.Sched(None, (n,), _cu(LQ).tolist(), _cu(LK).tolist(), 0, H, 1, nblk)
    got = []
    for t in range(n * H):
        T = F.tile_of(t, sched, BM, BN, causal, False, 1, True)
        b = [i for i in range(len(LQ)) if _cu(LQ)[i] == T.seq.q_start and
             LQ[i] == T.seq.len_q and LK[i] == T.seq.len_k][-1]
        got.append((b, T.m0, T.h))
        assert (T.n_bulk0, T.n_bulk1, T.n_end) == _cut(causal, b, T.m0, BM, BN), (t, T)
    assert got == [(p // nblk, p % nblk * BM, h) for c in range(0, n, nblk)
                   for h in range(H) for p in range(c, c + nblk)]


@triton.jit
def _tlx_decode(cu_q, cu_k, out, H, NBLK, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    tiles = fb.Tiles(None, None, cu_q, cu_k, 0, H, 1, NBLK, None)
    t = tl.program_id(0)
    tile = fb._tile(t, tiles, fb._pairs(tiles, True), BLOCK_N, CAUSAL, False, 1, True)
    tl.store(out + 5 * t, tile.b)
    tl.store(out + 5 * t + 1, tile.m0)
    tl.store(out + 5 * t + 2, tile.h)
    tl.store(out + 5 * t + 3, tile.n_bulk)
    tl.store(out + 5 * t + 4, tile.n_end)


@interp
@pytest.mark.parametrize("causal", [False, True])
def test_tlx_tile_direct(causal):
    """TLX's DIRECT decode as its tasks run it (in the interpreter): program t of a grid
    of every (pair, head) counts the pairs from the grid (`_pairs`) and decodes tile t
    (`_tile`, BLOCK_M 256): every (pair, head) once; the KV split as the causal cut
    gives it, and no block past a sequence's queries."""
    BN, H = 128, 2
    nblk = -(-max(LQ) // 256)
    n = len(LQ) * nblk
    out = torch.full((5 * n * H,), -7, dtype=torch.int32)
    _tlx_decode[(n * H,)](_cu(LQ), _cu(LK), out, H, nblk, BN, causal)
    got = [tuple(r) for r in out.view(-1, 5).tolist()]
    assert sorted((b, m0, h) for b, m0, h, _, _ in got) == sorted(
        (b, m * 256, h) for b in range(len(LQ)) for m in range(nblk) for h in range(H))
    for b, m0, h, n_bulk, n_end in got:
        want = _cut(causal, b, m0, 256, BN)
        assert (n_bulk, n_end) == (want[0], want[2]), (b, m0, h)


# ----------------------------------------------------------------------------- B200
@pytest.mark.gpu
@pytest.mark.parametrize("style", ["tlx", "cute"])
@pytest.mark.parametrize("idx", range(6))
def test_b200_direct(style, idx, monkeypatch):
    """The list-free forwards against the oracle on a B200 (out and lse), on the Hopper
    matrix's one-wave problems (test_gpu_matrix.direct_problems); each call is checked to
    take the path."""
    import importlib
    from _blackwell import forward_fn, skip_unless_b200
    from harness.oracle import check
    from test_gpu_matrix import direct_problems
    skip_unless_b200()
    if style == "cute" and not have_dsl()[0]:
        pytest.skip(have_dsl()[1])
    fwd = importlib.import_module(f"kernels_{style}.fwd_blackwell")
    owner = fb if style == "tlx" else importlib.import_module("kernels_cute.host")
    taken = []
    monkeypatch.setattr(owner, "fwd_direct",
                        lambda *a, **k: taken.append(tiles.fwd_direct(*a, **k)) or taken[-1])
    p, lengths = direct_problems()[idx]
    bq = p.mode == "broadcast_q"
    rep = check(p.build("cuda", lengths=lengths), forward_fn(fwd.forward), causal=p.causal,
                broadcast_q=bq, backward=False)
    assert rep.ok, f"{style} {p.label()}\n{rep}"
    assert taken and all(taken), taken
