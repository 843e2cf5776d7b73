"""The CuteDSL Hopper backward (kernels_cute/bwd_hopper.py) compiles for sm_90a on a CPU.

Like tests/test_cute_compile.py: CUTE_DSL_ARCH=sm_90a, compiled on symbolic tensors in
a subprocess (CUTE_DSL_* must be set before the DSL is imported), PTX kept and checked
for what the design relies on. The cubin the DSL built gives registers and spills (else
the ptxas on PATH, where there is one). The address checks run the layout algebra at
trace time against the hardware's rules. The key-windows build too (no counter, the
unsigned mask, no spills); and, on plain ints, the window schedule and per-column row
ranges against jagged's torch references, and the host's launch of either build.
"""
import math
import os
import re
import textwrap
from dataclasses import replace

import pytest

from _cute import ROOT, compile_in_subprocess, have_dsl, ptxas_report, traced_check
from jagged.tiles import FLAT_MEAN_Q
from _interp import interp

_ok, _why = have_dsl()
needs_dsl = pytest.mark.skipif(not _ok, reason=_why)


@pytest.fixture(autouse=True)
def _fresh_decisions(monkeypatch):
    """No call site decided by an earlier test (kernels_cute.host imports no DSL): each
    test's monkeypatched choices count."""
    from kernels_cute import host
    monkeypatch.setattr(host, "_DECIDED", {})


INF = math.inf

_SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {root!r})
    from kernels_cute import bwd_hopper as B
    dt = {{"bf16": torch.bfloat16, "fp16": torch.float16}}[{dtype!r}]
    {call}
    print("COMPILED")
""")


def _compile(tmp_path, call, dtype="bf16"):
    script = _SCRIPT.format(root=ROOT, dtype=dtype, call=call)
    return compile_in_subprocess(tmp_path, script, timeout=300)


def _ptxas(path):
    """(registers, spill bytes) of the kernel: from the cubin CuteDSL itself built (kept
    beside the PTX; its own compiler, the one the GPU runs), else from the PTX through the
    ptxas on PATH, or None. The PATH's ptxas can disagree (CUDA 13.0's spills 16 bytes in
    the D = 128 non-causal broadcast-Q build whose cubin has none)."""
    cubin = path[:-len(".ptx")] + ".cubin"
    if os.path.exists(cubin):
        from harness.compile_check import _resource_usage
        use = _resource_usage(open(cubin, "rb").read())
        return use["REG"], use["STACK"] + use["LOCAL"] + use["spill_insts"]
    r = ptxas_report(path)
    if r is None or r.returncode != 0 or not r.registers:
        return None
    return r.registers[0], r.spill_bytes


def _no_step_spills(path, res, step_loads=0):
    """Spill-free step loops. A packed build's load warp (24 registers) may keep its
    tile-slot pointer (tile_counter.publish_tile) in one stack slot across its tile loop:
    a store and a load a tile, at most 24 bytes in all. In the step loops (SASS): no
    local stores, at most `step_loads` local loads."""
    if res is None or res[1] == 0:
        return
    assert res[1] <= 24, f"register spills: {res}"
    from harness.compile_check import sass_of
    from harness.sass_steps import parse, step_loops
    loops = step_loops(parse(sass_of(path[:-len(".ptx")] + ".cubin")))
    local = [x.op for body in loops for x in body if x.op.startswith(("STL", "LDL"))]
    assert loops and not [o for o in local if o.startswith("STL")], local
    assert len(local) <= step_loads, f"spills in the step: {res} {local}"


def _ptxas_advisories(path):
    """ptxas -v lines that say it serialized wgmmas (C7515-C7517: an injected
    warpgroup.wait), or None without ptxas."""
    r = ptxas_report(path)
    return None if r is None else r.advisories


def _kv_loads(ptx):
    """(immediate, stage shift) of the K and V TMA loads (the first two bulk-tensor loads:
    `load_kv` is traced before `load_q`): the smem address is reg + immediate, and where
    reg = base + (stage << shift) the shift (None: the address is the smem base itself)."""
    out = []
    for reg, imm in re.findall(r"cp\.async\.bulk\.tensor\.\w+\.shared::cta\.global\S*\s+"
                               r"\[(%r\d+)\+(\d+)\]", ptx)[:2]:
        shift = None
        d = re.search(rf"add\.s32\s+{reg}, %r\d+, (%r\d+);", ptx)
        if d:
            m = re.search(rf"shl\.b32\s+{d.group(1)}, %r\d+, (\d+);", ptx)
            shift = int(m.group(1)) if m else -1
        out.append((int(imm), shift))
    return out


def _count(pattern, ptx):
    return len(re.findall(pattern, ptx))


@needs_dsl
@pytest.mark.parametrize("D,causal,bq,dtype,mean_q", [
    # in CI: both head dims (their steps and K/V stages; D = 64's 64-row step by its mean
    # query rows), the tile counter (packed) and without it (broadcast-Q), fp16;
    # the rest in `make test-matrix`
    (128, True, False, "bf16", INF), (128, False, False, "bf16", INF),
    (64, True, True, "fp16", INF), (64, True, False, "bf16", 100.0),
    *(pytest.param(*v, marks=pytest.mark.matrix) for v in (
        (128, False, False, "fp16", 600.0), (128, False, True, "fp16", INF),
        (128, True, True, "bf16", INF), (64, False, False, "bf16", INF),
        (64, True, False, "bf16", INF), (64, False, True, "bf16", INF),
        (64, False, True, "bf16", 100.0)))])
def test_bwd_main_default_builds(tmp_path, D, causal, bq, dtype, mean_q):
    """The default main kernel of a (D, mode): spill-free step loops (`_no_step_spills`)
    with no ptxas-injected wgmma wait, and in its PTX:
    - tiles from the counter (an atomic add) exactly in the packed builds
      (jagged.tiles.bwd_dynamic);
    - dQ partials reduced in D / 32 TMA reduce-adds of bm x 32 fp32 a step, written by
      bm * D / 512 st.shared.v2 a compute thread (dQ^T, 80 rows: bm * D / 256
      st.shared.b32), plus the load warp's lse / delta rows (`ld_rows` a lane, in pairs),
      addresses: test_dq_smem_addresses; long packed sequences (Config.dq_flat): a 1-D
      bulk add a warpgroup, bm * D / 1024 st.shared.v4 a thread (test_dq_flat_order);
    - lse / delta read from sLD (2 * bm / 8 ld.shared.v2: 2 x bm / 16 query columns a
      thread), none of the 32 lse / delta shuffles (shfl.idx, c = 0x31f = 799) the step
      would need without them; the load warp's rows go out before its arrive.expect_tx
      (bar.warp.sync between); addresses: test_ld_addresses;
    - dK, dV through sV (stmatrix) as D / 8 16-byte stores a thread (64 rows x D x 2
      tensors / 128 threads / 8), no per-element ones;
    - one expect_tx each for K + V and Q + dO; K at smem 1024, one stage (D = 64: two
      stages, K and V at base + (stage << 14));
    - at D = 64, 128-row steps: S^T / dP^T at N = 128 (4 + 4 m64n128k16), dV / dK / dQ
      at N = D = 64 (K = 128: 8 each, dQ split by query rows);
    - at D = 128 without causal masking, 80-row steps: S^T / dP^T / dQ^T at N = 80 (8 +
      8 + 8 m64n80k16), dV / dK at N = D = 128 (K = 80: 5 each)."""
    from kernels_cute import bwd_hopper as B
    cfg = B.pick_config(D, mean_q, causal, bq)
    bm = cfg.block_m
    assert cfg.dq_t == (D == 128 and not causal and not bq and mean_q >= B.PLAIN_MEAN_Q)
    path = _compile(tmp_path, f"B.compile_main(dt, {D}, {causal}, {bq}, "
                              f"B.pick_config({D}, float('{mean_q}'), {causal}, {bq}))", dtype)
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    # causal packed 128-row steps: a masked and an unmasked copy of the compute step
    copies = 2 if bm == 128 and causal and not bq else 1
    assert re.search(r"cp\.async\.bulk\.tensor", ptx), "no TMA load in the PTX"
    assert re.search(r"setmaxnreg\.inc", ptx) and re.search(r"setmaxnreg\.dec", ptx)
    assert bool(re.search(r"atom\.global(\.relaxed\.gpu)?\.add\.u32", ptx)) == \
        (not bq)
    red = r"cp\.reduce\.async\.bulk\.tensor\.\w+\.global\.shared::cta\.add"
    flat_red = r"cp\.reduce\.async\.bulk\.global\.shared::cta\.bulk_group\.add\.f32"
    assert cfg.dq_flat == (not bq and mean_q >= FLAT_MEAN_Q)
    if cfg.dq_flat:   # a 1-D bulk add a warpgroup, 16-byte stores of its partial
        assert _count(red, ptx) == 0 and _count(flat_red, ptx) == B.NUM_MMA_WG
        assert _count(r"st\.shared\.v4\.(b32|f32)", ptx) == bm * D // 1024 * copies
    else:
        assert _count(red, ptx) == D // B.DQ_WIDE and _count(flat_red, ptx) == 0
    dq_stores = 0 if cfg.dq_t or cfg.dq_flat else bm * D // 512 * copies
    assert _count(r"st\.shared\.v2\.(b32|f32)", ptx) == dq_stores + B.ld_rows(bm)
    assert _count(r"st\.shared\.(b32|f32)", ptx) == (
        bm * D // 256 if cfg.dq_t and not cfg.dq_flat else 0)
    assert _count(r"ld\.shared\.v2\.(b32|f32)", ptx) == 2 * bm // 8 * copies
    assert not re.search(r"shfl\.sync\.idx\.b32\s+%r\d+, %r\d+, \d+, 799,", ptx)
    assert "bar.warp.sync" in ptx
    assert "stmatrix.sync.aligned" in ptx
    assert _count(r"st\.global\.v4\.b32", ptx) == D // 8
    assert not re.search(r"st\.global(\.\w+)?\.(b16|u16)", ptx), "per-element dK/dV stores"
    assert _count(r"mbarrier\.arrive\.expect_tx", ptx) == 2   # K/V, Q/dO
    stage = B.BLOCK_N * D * 2
    if cfg.kv_stages == 2:        # D = 64: one TMA box a tile each for K and V
        assert stage == 1 << 14
        assert _kv_loads(ptx) == [(1024, 14), (1024 + 2 * stage, 14)], _kv_loads(ptx)
    else:                         # D = 128: K's first box (of two 64-column boxes)
        assert _kv_loads(ptx)[0] == (1024, None), _kv_loads(ptx)
    if bm == 128:
        assert _count(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16", ptx) == 8 * copies
        assert _count(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16", ptx) == 24 * copies
    elif cfg.dq_t:
        assert _count(r"wgmma\.mma_async\.sync\.aligned\.m64n80k16", ptx) == 24
        assert _count(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16", ptx) == 10
    else:
        assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16", ptx)
    res, adv = _ptxas(path), _ptxas_advisories(path)
    print(f"D={D} causal={causal} bq={bq} {dtype}: ptxas (registers, spill bytes): {res}, "
          f"advisories {adv}")
    # fp16 at 80 rows from the tile counter: one 8-byte reload a step (against the
    # round-robin, which has none, fuzz B62 H4/1 1024 / 0.9 -1.0 %, cross B2 H16/8 -0.4 %
    # replayed on the H200)
    _no_step_spills(path, res, step_loads=int(cfg.dq_t and dtype == "fp16"))
    assert not adv, adv
    # a programmatic dependent launch: one wait before any global access, then the trigger
    # that lets the postprocess launch under it
    assert _count(r"griddepcontrol\.wait;", ptx) == 1
    assert _count(r"griddepcontrol\.launch_dependents;", ptx) == 1


@needs_dsl
@pytest.mark.matrix
@pytest.mark.parametrize("causal", [False, True])
def test_bwd_d64_step_order(tmp_path, causal):
    """The default D = 64 step (`Config.sdp_together`): spill-free steps, no ptxas-injected
    wgmma wait, and S^T and dP^T in flight together in the step loop's SASS (FA4's order:
    two m64n128k16 groups before the first wait)."""
    from harness.sass_steps import before_first_wait, parse, step_loops
    from kernels_cute import bwd_hopper as B
    assert B.pick_config(64).sdp_together
    path = _compile(tmp_path, f"B.compile_main(dt, 64, {causal}, False, B.pick_config(64))")
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    res, adv = _ptxas(path), _ptxas_advisories(path)
    if res is not None:
        _no_step_spills(path, res)
    assert not adv, adv
    cubin = path[:-len(".ptx")] + ".cubin"
    if os.path.exists(cubin):
        from harness.compile_check import sass_of
        head = before_first_wait(min(step_loops(parse(sass_of(cubin))), key=len))
        sdp = sum(int(t.partition("x16x")[2] or 1) for t in head
                  if t.startswith("HGMMA.64x128x16"))
        assert head.count("WARPGROUP.ARRIVE") == 2 and sdp == 8, head


def test_bwd_sdp_together_is_a_128_row_order():
    from kernels_cute import bwd_hopper as B
    B.check_config(64, B.Config(128, 2, sdp_together=True))
    with pytest.raises(ValueError, match="128-row"):
        B.check_config(128, B.Config(64, 1, sdp_together=True))


def test_bwd_configs():
    """The measured table: 128-row steps with two K/V stages at D = 64 (S^T and dP^T
    together; 64 rows up to jagged.tiles.BWD_MID_MEAN_Q query rows a sequence), 64 rows
    with one at D = 128, 80 rows (dQ^T) for its long sequences without causal masking
    (`takes_plain`); the smem model (the kernel asserts the struct equals it) fits,
    and the steps the kernel does not build are ValueErrors on the host."""
    from jagged.tiles import BWD_MID_MEAN_Q
    from kernels_cute import bwd_hopper as B
    flat = dict(dq_flat=True)   # long packed sequences (FLAT_MEAN_Q): block-padded dQ
    assert B.pick_config(64) == B.Config(block_m=128, kv_stages=2, sdp_together=True, **flat)
    assert B.pick_config(64, causal=True) == B.pick_config(64)
    assert B.pick_config(128, causal=True) == B.Config(block_m=64, kv_stages=1, **flat)
    assert B.pick_config(128) == B.Config(block_m=80, kv_stages=1, dq_t=True, ds_stages=2,
                                          **flat)
    assert B.pick_config(128, broadcast_q=True) == B.Config(block_m=64, kv_stages=1)
    assert B.pick_config(64, BWD_MID_MEAN_Q) == B.Config(block_m=64, kv_stages=2)
    assert B.pick_config(64, BWD_MID_MEAN_Q + 1) == replace(B.pick_config(64), dq_flat=False)
    assert B.pick_config(128, 16.0) == B.Config(block_m=64, kv_stages=1)
    assert B.pick_config(128, FLAT_MEAN_Q - 1).dq_flat is False
    assert B.pick_config(128, FLAT_MEAN_Q).dq_flat is True
    # and a wave of query blocks at least (its postprocess: a CTA a block)
    assert B.pick_config(128, FLAT_MEAN_Q, n_q=132 * 80, n_sms=132).dq_flat is True
    assert B.pick_config(128, FLAT_MEAN_Q, n_q=132 * 80 - 1, n_sms=132).dq_flat is False
    assert B.pick_config(64, FLAT_MEAN_Q, n_q=132 * 128 - 1, n_sms=132).dq_flat is False
    # jagged: from PLAIN_MEAN_Q query rows a sequence; dense: the 80-row blocks must pad
    # less than PLAIN_ROW_COST makes up
    assert B.pick_config(128, B.PLAIN_MEAN_Q - 1, max_q=2048).block_m == 64
    assert B.pick_config(128, B.PLAIN_MEAN_Q, max_q=2048).block_m == 80
    assert [B.pick_config(128, float(n), max_q=n).block_m
            for n in (256, 512, 640, 768, 1024, 4096)] == [64, 64, 80, 64, 80, 80]
    assert B.window_config(64).block_m == 128
    assert B.smem_bytes(64, B.pick_config(64)) == 195 * 1024
    assert B.smem_bytes(64, B.Config(128, 1)) == 163 * 1024
    assert B.smem_bytes(128, B.pick_config(128, causal=True)) == 178 * 1024
    assert B.smem_bytes(128, B.pick_config(128)) == 227 * 1024     # two dS^T stages: full
    assert B.smem_bytes(128, B.Config(80, 1, dq_t=True)) == 207 * 1024
    assert B.smem_bytes(128, B.Config(64, 2)) == 242 * 1024          # over the limit
    for (D, _), cfg in B.CONFIGS.items():
        B.check_config(D, cfg)
    for D, cfg, why in ((128, B.Config(128, 1), "block_m = 128 at D = 128"),
                        (128, B.Config(64, 2), "shared memory"),
                        (64, B.Config(32, 1), "block_m = 32"),
                        (128, B.Config(80, 1), "takes dq_t"),
                        (64, B.Config(80, 1, dq_t=True), "dq_t at D = 64"),
                        (64, B.Config(64, 3), "kv_stages = 3"),
                        (64, B.Config(64, 2, ds_stages=3), "ds_stages = 3"),
                        (64, B.Config(128, 2, windows=True, dq_flat=True), "dq_flat")):
        with pytest.raises(ValueError, match=why):
            B.check_config(D, cfg)
    # the load warp's lse / delta rows cover a step's rows once (2 or 4 a lane; at 80
    # rows, the ones under bm)
    for bm in (64, 80, 128):
        rows = [B.ld_row(l, e) for l in range(32) for e in range(B.ld_rows(bm))]
        assert sorted(r for r in rows if r < bm) == list(range(bm))


@needs_dsl
@pytest.mark.parametrize("D,causal,mean_q,dtype,parts", [(64, False, 16384, "bf16", 2),
                                                         (128, True, 4096, "bf16", 8),
                                                         pytest.param(128, False, 4096, "fp16", 4,
                                                                      marks=pytest.mark.matrix)])
def test_bwd_split_compile(tmp_path, D, causal, mean_q, dtype, parts):
    """The build whose tiles are split over CTAs (jagged.tiles.bwd_parts; `store_add`): dK
    and dV added into fp32 from registers, D / 2 red.global.add.v2.f32 a thread (each
    warpgroup's 64 x D accumulators over 128 threads, two tensors, pairs), no 16-byte
    stores (those are the 16-bit dK / dV), spill-free step loops and no wgmma ptxas
    serialized; its step (pick_config(split=True)): 64 rows at D = 128, 128 rows one dot
    after another at D = 64."""
    from kernels_cute import bwd_hopper as B
    cfg = B.pick_config(D, mean_q, causal, False, split=True)
    assert cfg.block_m == (128 if D == 64 else 64) and not cfg.dq_t and not cfg.sdp_together
    path = _compile(tmp_path, f"B.compile_main(dt, {D}, {causal}, False, "
                              f"B.pick_config({D}, {mean_q}, {causal}, False, split=True), "
                              f"parts={parts})", dtype)
    _check_split_build(path, D)


def _check_split_build(path, D):
    """A split build's PTX: D / 2 red.global.add.v2.f32 a thread and no 16-byte stores,
    spill-free step loops, no ptxas advisory."""
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    assert _count(r"red\.global\.add\.v2\.f32", ptx) == D // 2
    assert _count(r"st\.global\.v4\.b32", ptx) == 0
    _no_step_spills(path, _ptxas(path))
    assert not _ptxas_advisories(path)


@needs_dsl
@pytest.mark.parametrize("D,causal", [(64, True), pytest.param(128, False,
                                                           marks=pytest.mark.matrix)])
def test_bwd_window_split_compile(tmp_path, D, causal):
    """Key windows split over CTAs (jagged.tiles.window_parts > 1): the window build with
    `store_add`'s fp32 adds in place of the store, its dots one after another, spill-free
    in the step loop, with no ptxas advisory."""
    from kernels_cute import bwd_hopper as B
    cfg = B.window_config(D, split=True)
    assert cfg.windows and not cfg.sdp_together
    path = _compile(tmp_path, f"B.compile_main(dt, {D}, {causal}, False, "
                              f"B.window_config({D}, split=True), parts=8)")
    _check_split_build(path, D)


@needs_dsl
def test_dkv_fragment_coordinates(tmp_path):
    """`store_add`'s addressing: in the dK / dV wgmma's C fragment, every thread's element
    i = v0 + 2 v1 + 4 j sits at (row + 8 v1, column + v0 + 8 j) from its element 0, at
    both head dims."""
    traced_check(tmp_path, "dkv_check", """
        import cutlass, cutlass.cute as cute
        from cutlass.cute.nvgpu import warpgroup
        import cutlass.utils.hopper_helpers as sm90
        from kernels_cute import bwd_hopper as B

        FOUND = {}

        def run():
            bad, n = [], 0
            for D in (64, 128):
                tiled = sm90.make_trivial_tiled_mma(
                    cutlass.BFloat16, cutlass.BFloat16, warpgroup.OperandMajorMode.K,
                    warpgroup.OperandMajorMode.MN, cutlass.Float32,
                    atom_layout_mnk=(B.NUM_MMA_WG, 1, 1), tiler_mn=(64, D),
                    a_source=warpgroup.OperandSource.RMEM)
                for t in range(128 * B.NUM_MMA_WG):
                    crd = tiled.get_slice(t).partition_C(
                        cute.make_identity_tensor((B.BLOCK_N, D)))
                    r0, c0 = crd[0]
                    for i in range(cute.size(crd)):
                        n += 1
                        want = (r0 + 8 * (i // 2 % 2), c0 + i % 2 + 8 * (i // 4))
                        if tuple(crd[i]) != want:
                            bad.append((D, t, i, tuple(crd[i]), want))
            FOUND["bad"], FOUND["n"] = bad, n
    """, """
        assert F["n"] == 256 * (32 + 64), F["n"]
        assert not F["bad"], F["bad"][:10]
    """)


@needs_dsl
def test_bwd_pre_post_compile(tmp_path):
    """The preprocess (delta, dQ zeroing; key windows: the longer sequences' rows, or
    under jagged.tiles.windows_direct dQ's own rows past the last sequence) and
    postprocess (slot sum, cast; key windows: the rows the accumulator holds) kernels;
    split tiles and windows: with their fp32 dK / dV zeroed and converted."""
    _compile(tmp_path, "B.compile_preprocess(dt, 64); B.compile_preprocess(dt, 128); "
                       "B.compile_preprocess(dt, 128, B.BLOCK_N); "
                       "B.compile_preprocess(dt, 128, 0, True); "
                       "B.compile_preprocess(dt, 64, B.BLOCK_N, True); "
                       "B.compile_preprocess(dt, 128, B.BLOCK_N, False, True); "
                       "B.compile_preprocess(dt, 64, B.BLOCK_N, False, True); "
                       "B.compile_preprocess(dt, 128, B.BLOCK_N, False, True, True); "
                       "B.compile_preprocess(dt, 64, B.BLOCK_N, True, False, True); "
                       "B.compile_postprocess(dt); B.compile_postprocess(dt, False); "
                       "B.compile_postprocess(dt, True, True); "
                       "B.compile_post_rows(dt); B.compile_post_rows(dt, True, True); "
                       "B.compile_post_rows(dt, True, False, True)")


@needs_dsl
@pytest.mark.parametrize("D", [64, 128])
def test_bwd_preprocess_loads_ahead(tmp_path, D):
    """The preprocess's delta CTA (PRE_GROUPS row groups): every group's 16-byte loads of
    O and dO are issued before the first shuffle of a row's sum; spill-free."""
    from kernels_cute import bwd_hopper as B
    path = _compile(tmp_path, f"B.compile_preprocess(dt, {D})")
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    loads = [m.start() for m in re.finditer(r"ld\.global(\.\w+)*\.v4", ptx)]
    assert len(loads) == 2 * B.PRE_GROUPS, len(loads)
    assert max(loads) < ptx.index("shfl.sync")
    res = _ptxas(path)
    assert res is None or res[1] == 0, res


@needs_dsl
@pytest.mark.parametrize("dkv,causal", [(False, False), (True, False), (False, True)])
def test_bwd_post_rows_searches_ahead(tmp_path, dkv, causal):
    """Key windows' PostRows: each thread's one search of its token's sequence (loads of
    the offsets; causal: with its last query row) comes before the wait for the main
    kernel, the accumulator's reads (16-byte) after it; spill-free."""
    path = _compile(tmp_path, f"B.compile_post_rows(dt, True, {dkv}, {causal})")
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    wait = ptx.index("griddepcontrol.wait;")
    assert _count(r"griddepcontrol\.wait;", ptx) == 1
    assert re.search(r"ld\.global(\.\w+)*\.(b32|s32|u32)", ptx[:wait])
    assert not re.search(r"ld\.global(\.\w+)*\.v4", ptx[:wait])
    assert re.search(r"ld\.global(\.\w+)*\.v4", ptx[wait:])
    res = _ptxas(path)
    assert res is None or res[1] == 0, res


@needs_dsl
@pytest.mark.parametrize("D,causal,dkv", [(128, False, False), (128, True, True),
                                          (64, False, False)])
def test_bwd_post_flat_compile(tmp_path, D, causal, dkv):
    """PostFlat of each dq_flat step (D = 128: 80 rows dQ^T, 64 rows causal; D = 64:
    128 rows), with the split tiles' dK / dV share (CastDKV): spill-free; a thread's
    accumulator fragment in bm * D / 1024 16-byte loads, the rows out in 16-byte stores
    (to the sequence's end: one predicated st.global.v4 in a loop), none per element."""
    from kernels_cute import bwd_hopper as B
    cfg = B.pick_config(D, 4096.0, causal)
    assert cfg.dq_flat
    path = _compile(tmp_path, f"B.compile_post_flat(dt, {D}, {cfg.block_m}, {cfg.dq_t}, "
                              f"True, {dkv})")
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    # CastDKV: POST_VEC floats of dK and of dV a step (two loads, one store each)
    assert _count(r"ld\.global\.v4\.(b32|f32)", ptx) == cfg.block_m * D // 1024 + dkv * 4
    assert _count(r"st\.global\.v4\.b32", ptx) == 1 + dkv * 2
    assert not re.search(r"st\.global(\.\w+)?\.(b16|u16)", ptx)
    assert _count(r"griddepcontrol\.wait;", ptx) == 1
    res = _ptxas(path)
    assert res is None or res[1] == 0, res


@needs_dsl
def test_dq_flat_order(tmp_path):
    """Config.dq_flat's partial, at each step it serves (D = 128: 64 rows, the warpgroups
    split the columns, and 80 rows, dQ^T; D = 64: 128 rows, split by rows): thread t of
    the compute warpgroups (the dQ wgmma's C partition) writes register i to float
    `flat_copy`(t, i) of the buffers (the bulk add copies them as they are; PostFlat
    reads the same positions back into the same partition): every (row, col) of the bm x
    D block exactly once; a thread's registers in its own warpgroup's buffer, 4 at a time
    into 16 contiguous bytes (st.shared.v4), a warp's store covering 512 contiguous bytes
    (all 32 banks, 4 wavefronts: the minimum for 512 bytes)."""
    traced_check(tmp_path, "flat_check", """
        import cutlass, cutlass.cute as cute
        from kernels_cute import bwd_hopper as B
        from kernels_cute.fragments import flat_copy

        FOUND = {}

        def run():
            for key, D, cfg in ((64, 64, B.pick_config(64)),
                                (128, 128, B.pick_config(128, causal=True)),
                                (129, 128, B.pick_config(128))):
                bm, dq_t = cfg.block_m, cfg.dq_t
                tiled = B.dq_mma(cutlass.BFloat16, D, bm, dq_t)
                half = bm * D // B.NUM_MMA_WG
                flat = cute.make_identity_tensor((half, B.NUM_MMA_WG))
                seen, own, vec, warp = {}, [], [], {}
                for t in range(128 * B.NUM_MMA_WG):
                    C = tiled.get_slice(t).partition_C(
                        cute.make_identity_tensor((D, bm) if dq_t else (bm, D)))
                    Fp = flat_copy(128, B.NUM_MMA_WG).get_slice(t).partition_D(flat)
                    n = cute.size(C)
                    assert cute.size(Fp) == n, (cute.size(Fp), n)
                    pos = []
                    for i in range(n):
                        rc = tuple(C[i])[::-1] if dq_t else tuple(C[i])
                        f = tuple(Fp[i])
                        seen[rc] = seen.get(rc, 0) + 1
                        if f[1] != t // 128:
                            own.append((t, i, f))
                        pos.append(f[1] * half + f[0])
                    for i in range(0, n, 4):
                        if pos[i:i + 4] != list(range(pos[i], pos[i] + 4)) or pos[i] % 4:
                            vec.append((t, i))
                        warp.setdefault((t // 32, i), []).append(pos[i])
                spans = [k for k, a in warp.items()
                         if sorted(a) != list(range(min(a), min(a) + 128, 4))]
                FOUND[key] = dict(
                    once=sorted(seen) == [(r, c) for r in range(bm) for c in range(D)]
                    and set(seen.values()) == {1},
                    own=own, vec=vec, spans=spans, n=len(warp))
    """, """
        for key in (64, 128, 129):
            f = F[key]
            assert f["once"], key
            assert not f["own"], f["own"][:5]
            assert not f["vec"], f["vec"][:5]
            assert not f["spans"], f["spans"][:5]
    """)


@needs_dsl
@pytest.mark.parametrize("bm", [64, 80, 128])
def test_ld_addresses(tmp_path, bm):
    """sLD's addresses (lse*log2e and delta staged by the load warp), at 64, 80 and 128
    query rows a step: the load warp's rows (`ld_row`) cover the step's rows once; every compute
    thread's read of accumulator column c (`ld_thread_offset` + `ld_column`, bytes) is the
    sLD element (query column of that accumulator element in the sdp wgmma's C partition,
    x, stage) of the kernel's layout, for both accumulator rows (the dP^T accumulator
    starts at -delta[c] in both); XOR with ld_flip is the other stage; reads are 8-byte
    aligned (they are ld.shared.v2)."""
    traced_check(tmp_path, "ld_check", f"""
        BM = {bm}""" + """
        import cutlass, cutlass.cute as cute
        from cutlass.cute.nvgpu import warpgroup
        import cutlass.utils.hopper_helpers as sm90
        from kernels_cute.fragments import acc_rows_cols
        from kernels_cute import bwd_hopper as B

        FOUND = {}

        def run():
            L = cute.make_layout(B.ld_shape(BM))
            rows = [B.ld_row(l, e) for l in range(32) for e in range(B.ld_rows(BM))]
            FOUND["rows"] = sorted(r for r in rows if r < BM) == list(range(BM))
            tiled = sm90.make_trivial_tiled_mma(
                cutlass.BFloat16, cutlass.BFloat16, warpgroup.OperandMajorMode.K,
                warpgroup.OperandMajorMode.K, cutlass.Float32,
                atom_layout_mnk=(B.NUM_MMA_WG, 1, 1), tiler_mn=(64, BM))
            bad, n = [], 0
            sld = {}  # crd2idx((q, x, s), L), each traced once (tracing is the slow part)
            for t in range(128 * B.NUM_MMA_WG):
                tScS = acc_rows_cols(tiled.get_slice(t).partition_C(
                    cute.make_identity_tensor((B.BLOCK_N, BM))))
                lane = t % 32
                cols = [[tScS[r, c][1] for c in range(cute.size(tScS, mode=[1]))]
                        for r in range(cute.size(tScS, mode=[0]))]
                for s in range(B.Q_STAGES):
                    off = B.ld_thread_offset(lane, s, BM)
                    if off % 8 or off ^ B.ld_flip(BM) != B.ld_thread_offset(lane, 1 - s, BM):
                        bad.append(("offset", t, s, off))
                    for r, qs in enumerate(cols):
                        for c, q in enumerate(qs):
                            for x in range(2):
                                n += 1
                                got = off + 4 * (x * BM + B.ld_column(c))
                                if (q, x, s) not in sld:
                                    sld[q, x, s] = 4 * cute.crd2idx((q, x, s), L)
                                if got != sld[q, x, s]:
                                    bad.append((t, s, r, c, x, got))
            FOUND["bad"], FOUND["n"] = bad, n
    """, f"""
        assert F["rows"], "load-warp rows"
        assert F["n"] == 256 * 2 * 2 * {bm // 4} * 2, F["n"]      # threads, stages, rows, cols, x
        assert not F["bad"], F["bad"][:10]
    """)


@needs_dsl
def test_element_swizzled_matches_the_hardware_swizzle(tmp_path):
    """`element_swizzled` (the store's sV read view) addresses the bytes TMA and stmatrix
    wrote: the 128B swizzle XORs byte-address bits 4-6 with bits 7-9. (The atom's byte
    swizzle on element offsets compiles, and permutes every dK / dV on the GPU.)"""
    # the DSL compiles from source files only
    traced_check(tmp_path, "swizzle_check", """
        import cutlass, cutlass.cute as cute
        from cutlass.cute.nvgpu import warpgroup
        from cutlass.utils import LayoutEnum
        import cutlass.utils.hopper_helpers as sm90
        from kernels_cute.fragments import element_swizzled

        # (row, col) whose element_swizzled offset is not the hardware's; plain Python,
        # traced inside `check` (the DSL rewrites control flow in jit functions only)
        def mismatches(dt, D):
            atom = warpgroup.make_smem_layout_atom(
                sm90.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dt, D), dt)
            L = cute.tile_to_shape(atom, (128, D), (0, 1))
            E = element_swizzled(L, dt)
            bad = []
            for r in range(16):
                for c in range(D):
                    b = 2 * cute.crd2idx((r, c), L.outer)
                    if cute.crd2idx((r, c), E) != (b ^ (((b >> 7) & 7) << 4)) // 2:
                        bad.append((r, c))
            return bad

        FOUND = {}

        def run():
            for dt in (cutlass.BFloat16, cutlass.Float16):
                for D in (64, 128):
                    FOUND[(str(dt), D)] = mismatches(dt, D)
    """, """
        assert len(F) == 4, F
        assert not any(F.values()), F
    """)


@needs_dsl
def test_dq_smem_addresses(tmp_path):
    """The fp32 dQ partial in smem, at each step the kernel takes (D = 128: 64 rows, the
    warpgroups split the columns, and 80 rows, dQ^T with the warpgroups' 64 columns as M;
    D = 64: 128 rows, split by rows): the compute threads (the dQ wgmma's C partition,
    partition_C of `dq_store_view`, the layout the kernel writes through; dQ^T: its
    (column, row) elements at (row, column)) put each (row, col) of the bm x D tile
    exactly once, at the byte the TMA reduce box reads for it: D / 32 boxes of bm x 32
    fp32, 128 B rows, hardware 128B swizzle (byte bits 4-6 ^= bits 7-9). The layout the
    TMA atom is built from (`dq_smem_layout`) carries that swizzle (S<3,4,3>, in bytes)
    over the same row-major boxes. dQ: each thread's two columns of a pair are adjacent
    (one STS.64), and every warp store instruction covers each of the 32 banks exactly
    twice (2 wavefronts, the minimum for 256 bytes); dQ^T: one STS.32 an element, each
    covering the 32 banks once. Controls: the unswizzled and the byte-counted (wrong)
    swizzle views must fail the same check."""
    traced_check(tmp_path, "dq_check", """
        import cutlass, cutlass.cute as cute
        from cutlass.cute.nvgpu import warpgroup
        import cutlass.utils.hopper_helpers as sm90
        from kernels_cute import bwd_hopper as B

        FOUND = {}

        def hw_byte(r, c, bm):
            box, b = c // B.DQ_WIDE, r * 4 * B.DQ_WIDE + (c % B.DQ_WIDE) * 4
            return box * 4 * B.DQ_WIDE * bm + (b ^ (((b >> 7) & 7) << 4))

        def run():
            for D, cfg in ((64, B.pick_config(64)), (128, B.pick_config(128, causal=True)),
                           (129, B.pick_config(128))):
                D, key, bm, dq_t = min(D, 128), D, cfg.block_m, cfg.dq_t
                L = B.dq_smem_layout(D, bm)
                sw = L.inner
                FOUND[(key, "swizzle")] = (sw.num_bits, sw.num_base, sw.num_shift)
                # the boxes: row-major bm x 32 fp32, one after the other
                FOUND[(key, "outer")] = [
                    (r, c) for r in range(bm) for c in range(D)
                    if cute.crd2idx((r, c), L.outer) !=
                    (c // B.DQ_WIDE) * B.DQ_WIDE * bm + r * B.DQ_WIDE + c % B.DQ_WIDE]
                split = (B.NUM_MMA_WG, 1, 1) if bm > 64 else (1, B.NUM_MMA_WG, 1)
                tiler = (64, D) if bm > 64 else (64, D // B.NUM_MMA_WG)
                if dq_t:
                    tiler = (64, bm)
                tiled = sm90.make_trivial_tiled_mma(
                    cutlass.BFloat16, cutlass.BFloat16, warpgroup.OperandMajorMode.MN,
                    warpgroup.OperandMajorMode.MN, cutlass.Float32, atom_layout_mnk=split,
                    tiler_mn=tiler)
                # each thread's (row, col) a register, traced once for the three views
                # (tracing is the slow part)
                coords = []
                for t in range(128 * B.NUM_MMA_WG):
                    C = tiled.get_slice(t).partition_C(
                        cute.make_identity_tensor((D, bm) if dq_t else (bm, D)))
                    coords.append([tuple(C[i])[::-1] if dq_t else tuple(C[i])
                                   for i in range(cute.size(C))])
                views = {"kernel": B.dq_store_view(L), "plain": L.outer,
                         "byteswz": cute.make_composed_layout(L.inner, 0, L.outer)}
                for name, V in views.items():
                    seen, bad, pairs, insn, at = {}, [], [], {}, {}

                    def byte(r, c):
                        if (r, c) not in at:
                            at[r, c] = 4 * cute.crd2idx((r, c), V)
                        return at[r, c]

                    for t, C in enumerate(coords):
                        for i, (r, c) in enumerate(C):
                            got = byte(r, c)
                            seen[(r, c)] = seen.get((r, c), 0) + 1
                            if got != hw_byte(r, c, bm):
                                bad.append((t, i, r, c, got, hw_byte(r, c, bm)))
                            if dq_t:         # one STS.32 an element
                                insn.setdefault((t // 32, i), []).append(got)
                            elif i % 2 == 0:   # register pair i, i + 1: one STS.64
                                r1, c1 = C[i + 1]
                                if r1 != r or c1 != c + 1 or got % 8 or \\
                                        byte(r1, c1) != got + 4:
                                    pairs.append((t, i))
                                insn.setdefault((t // 32, i), []).append(got)
                    banks = []    # instructions reaching a bank other than 128 B / 128 B
                    for k, a in insn.items():
                        words = [w // 4 for x in a for w in ((x,) if dq_t else (x, x + 4))]
                        if sorted(w % 32 for w in words) != \\
                                sorted(list(range(32)) * (1 if dq_t else 2)):
                            banks.append(k)
                    FOUND[(key, name)] = dict(
                        once=sorted(seen) == [(r, c) for r in range(bm) for c in range(D)]
                        and set(seen.values()) == {1},
                        bad=bad, pairs=pairs, banks=banks, n=len(insn), bm=bm)
    """, """
        for key in (64, 128, 129):                 # 129: D = 128, the 80-row dQ^T step
            D = min(key, 128)
            assert F[(key, "swizzle")] == (3, 4, 3), F[(key, "swizzle")]
            assert not F[(key, "outer")], F[(key, "outer")][:10]
            k = F[(key, "kernel")]
            assert k["once"], "not every (row, col) exactly once"
            assert not k["bad"], k["bad"][:10]
            assert not k["pairs"], k["pairs"][:10]
            assert not k["banks"], k["banks"][:10]
            per = 256 if key == 129 else 512       # STS.32 / STS.64 a thread
            assert k["n"] == 8 * (k["bm"] * D // per), k["n"]   # 8 warps
            for ctl in ("plain", "byteswz"):       # a wrong swizzle fails the check
                assert F[(key, ctl)]["once"] and F[(key, ctl)]["bad"], ctl
        assert F[(129, "kernel")]["bm"] == 80
    """)


# ----------------------------------------------------------------------------- key windows

@needs_dsl
@pytest.mark.parametrize("D,causal,dtype", [  # one in CI, the rest in `make test-matrix`
    (64, False, "bf16"),
    *(pytest.param(*v, marks=pytest.mark.matrix) for v in (
        (64, True, "bf16"), (128, False, "bf16"), (128, True, "bf16"), (128, True, "fp16")))])
def test_bwd_window_builds(tmp_path, D, causal, dtype):
    """The key-windows build (window_config): tiles round-robin, never from the counter
    (no atomic add, causal or not); P^T masked by one unsigned compare a score (bm / 2
    a compute thread a step: 64 keys x bm queries / 128 threads); the default build's
    dQ reduces, dK / dV stores and wgmma shapes; an owned window's dQ in 4-byte column
    pairs (`store_dq`: bm x D / 256 threads / 2 a thread); no spills in the cubin; its
    SharedStorage (asserted equal to smem_bytes when traced) within the limit."""
    from jagged.arch import SMEM_LIMIT
    from kernels_cute import bwd_hopper as B
    cfg = B.window_config(D)
    bm = cfg.block_m
    assert B.smem_bytes(D, cfg) <= SMEM_LIMIT[90]
    path = _compile(tmp_path, f"B.compile_main(dt, {D}, {causal}, False, B.window_config({D}))",
                    dtype)
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    assert not re.search(r"atom\.global(\.relaxed\.gpu)?\.add\.u32", ptx)
    unsigned = _count(r"\bsetp\.(?:lt|ge)\.u32\b", ptx)
    assert bm // 2 <= unsigned <= bm // 2 + 8, unsigned
    red = r"cp\.reduce\.async\.bulk\.tensor\.\w+\.global\.shared::cta\.add"
    assert _count(red, ptx) == D // B.DQ_WIDE
    assert _count(r"st\.global\.v4\.b32", ptx) == D // 8
    assert _count(r"st\.global\.b32", ptx) == bm * D // 512
    assert _count(r"mbarrier\.arrive\.expect_tx", ptx) == 2
    if bm == 128:
        assert _count(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16", ptx) == 8
        assert _count(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16", ptx) == 24
    res, adv = _ptxas(path), _ptxas_advisories(path)
    print(f"windows D={D} causal={causal} {dtype}: ptxas (registers, spill bytes): {res}, "
          f"advisories {adv}, smem {B.smem_bytes(D, cfg)} B")
    if res is not None:
        assert res[1] == 0, f"register spills: {res}"
    assert not adv, adv


def test_bwd_window_config():
    """Key windows: the head dim's long-sequence step (causal masking's, never the
    80-row one) with windows on, and only where jagged.tiles.windowed over the keys
    (128-key blocks, up to a mean of BWD_WINDOW_MEAN_FRACTION of one) says so, never
    broadcast-Q."""
    from jagged.tiles import BWD_WINDOW_MEAN_FRACTION, windowed
    from kernels_cute import bwd_hopper as B
    for d in (64, 128):
        cfg, base = B.window_config(d), B.pick_config(d, causal=True)
        assert cfg.windows and not base.windows
        assert (cfg.block_m, cfg.kv_stages) == (base.block_m, base.kv_stages)
        B.check_config(d, cfg)
    for n_keys, batch, max_k in ((26 * 100, 100, 60), (64 * 10, 10, 64), (65 * 10, 10, 90),
                                 (128 * 10, 10, 128), (129 * 10, 10, 200), (5, 1, 5),
                                 (40, 40, 1)):
        for bq in (False, True):
            assert B.takes_windows(n_keys, batch, max_k, bq) == \
                windowed(n_keys, batch, max_k, 128, bq, BWD_WINDOW_MEAN_FRACTION)
    assert B.takes_windows(26 * 1152, 1152, 256, False)        # gem-jagged 256
    assert not B.takes_windows(26 * 1152, 1152, 256, True)
    assert B.takes_windows(128 * 100, 100, 128, False)         # every sequence a tile
    assert not B.takes_windows(129 * 100, 100, 256, False)


class _Ints:
    """A tensor read as the kernel reads it (t[i], t[i, j]), in plain ints."""
    def __init__(self, t):
        self.t = t

    def __getitem__(self, i):
        return int(self.t[i])


def _col_ranges(S, cq, ck, seq, s_first, s_last, col, causal):
    """`col_ranges` for one key column (in the window) as the compute role runs it:
    (its sequence, packed rows lo, hi), hi = lo past the window's real columns."""
    packed = seq.k_start + col
    s = s_first
    for j0 in range(s_first + 1, s_last + 1, S.ROW_SEQ_CHUNK):
        s = S.row_seq_chunk(ck, j0, s_last, packed, s)
    lo, hi = S.col_q_range(cq, ck, s, packed, causal)
    return s, lo, (hi if col < seq.len_k else lo)


@needs_dsl
@pytest.mark.parametrize("causal", [False, True])
def test_kv_window_coords_match_the_reference(causal):
    """schedule.kv_window_coords and the compute role's column ranges
    (seqinfo.row_seq_chunk over the key offsets, col_q_range, mirrored as `col_ranges`
    runs them), on plain ints against jagged's torch references: every (live window, KV
    head) tile once per grid size under the round-robin; a window's first column, real
    columns, first / last sequence, its rows all those of the sequences it spans (a
    first sequence that starts before the window included) in n_m blocks from m_lo: 0
    without causal masking; causal, the Q block of its first sequence's first row that
    sees its first key (a window of several sequences too), no row before it seeing any
    of its columns;
    each column's rows those of col_q_range_ref (none past the real columns), and the
    unsigned mask (`window_keep`) over every step keeps exactly the (row, column) pairs of
    one sequence that attention sees (bottom-right causal). The lengths include empty
    sequences, single keys, a sequence over several windows, queries without keys and
    keys without queries."""
    import torch
    from jagged.seqinfo import causal_visible_ref, col_q_range_ref
    from jagged.tiles import window_tiles_reference
    from kernels_cute import schedule as Sch
    from kernels_cute import seqinfo as S
    from kernels_cute.bwd_hopper import Sched

    BN, HKV = 128, 3
    g = torch.Generator().manual_seed(11 + causal)
    lq = torch.randint(0, 50, (60,), generator=g)
    lk = torch.randint(0, 90, (60,), generator=g)
    lq[:2], lk[:2] = torch.tensor([10, 300]), torch.tensor([100, 10])
    lq[5:12] = torch.tensor([0, 1, 0, 9, 40, 1, 0])
    lk[5:12] = torch.tensor([3, 0, 0, 7, 300, 1, 5])
    lq[20], lk[20] = 260, 260     # causal: its later blocks' walks start past its first rows
    # the window after it: three sequences, the first of 150 rows over 10 keys (causal, the
    # walk starts at its row 140)
    lq[21:24], lk[21:24] = torch.tensor([150, 5, 5]), torch.tensor([10, 30, 40])
    # a window of this one sequence (90 + 120 keys each side exceed a window): causal, its
    # walk starts at its row 280, the first that sees a key
    lq[29:32], lk[29:32] = torch.tensor([5, 400, 5]), torch.tensor([90, 120, 90])
    cu_q = torch.cat([torch.zeros(1, dtype=torch.int64), lq.cumsum(0)])
    cu_k = torch.cat([torch.zeros(1, dtype=torch.int64), lk.cumsum(0)])
    total_k = int(cu_k[-1])
    for BM in (64, 128):
        # key windows: the table over the key offsets, sorted by the query blocks spanned
        order, count, win = window_tiles_reference(cu_k, cu_q, total_k + 300, BN, BM)
        n_live, cuts, several = int(count), 0, 0
        sched = Sched(_Ints(order), _Ints(win), None, _Ints(cu_q), _Ints(cu_k), 0, 3 * HKV,
                      HKV, 3, None, None, 1)
        for P in (1, 5, 132):              # tile_range's packed round-robin
            seen = [Sch.kv_window_coords(t, sched, BM, BN, causal)
                    for p in range(P) for t in range(p, n_live * HKV, P)]
            assert sorted((c[3].k_start, c[1]) for c in seen) == \
                sorted((int(win[2, w]), hk) for w in order[:n_live] for hk in range(HKV))
        for idx in range(n_live):
            s_first, hk, n0, seq, m_lo, n_m, s_last = Sch.kv_window_coords(
                idx * HKV + 2, sched, BM, BN, causal)
            w = int(order[idx])
            start = int(win[2, w])
            cols = torch.arange(start, min(start + BN, int(cu_k[int(win[1, w]) + 1])))
            ref_seq, ref_lo, ref_hi = col_q_range_ref(cu_q, cu_k, cols, causal)
            # s_first's first row seeing the window's first key
            cut = max(start - int(cu_k[s_first + 1]) + int(lq[s_first]), 0)
            assert (hk, n0, m_lo) == (2, 0, cut // BM * BM if causal else 0)
            cuts += m_lo > 0
            several += m_lo > 0 and s_first != s_last
            # the window's sequences: its rows' own, and empty ones around them
            f, l = int(ref_seq[0]), int(ref_seq[-1])
            assert s_first <= f and l <= s_last
            assert (lk[s_first:f] == 0).all() and (lk[l + 1:s_last + 1] == 0).all()
            assert seq.k_start == start and seq.len_k == len(cols)
            assert seq.q_start == seq.out_start == int(cu_q[s_first])
            assert seq.q_start + seq.len_q == int(cu_q[s_last + 1])
            assert n_m == -(-(seq.len_q - m_lo) // BM)
            for col in range(BN):
                s, lo, hi = _col_ranges(S, _Ints(cu_q), _Ints(cu_k), seq, s_first, s_last,
                                        col, causal)
                if col < seq.len_k:
                    assert (s, lo, hi) == (int(ref_seq[col]), int(ref_lo[col]),
                                           int(ref_hi[col]))
                    assert seq.q_start <= lo and hi <= seq.q_start + seq.len_q
                q_lo, q_w = lo - seq.q_start, max(hi - lo, 0)
                # the pairs attention sees: one sequence, bottom-right causal
                q0, q1, k0 = int(cu_q[s]), int(cu_q[s + 1]), int(cu_k[s])
                rows = torch.arange(seq.q_start, seq.q_start + m_lo + n_m * BM)
                sees = (rows >= q0) & (rows < q1) & (col < seq.len_k)
                if causal:
                    sees &= causal_visible_ref(rows - q0, seq.k_start + col - k0,
                                               int(lq[s]), int(lk[s]))
                assert not sees[:m_lo].any(), (w, col)              # the rows cut see none
                keep = [(q - (q_lo - m_lo - m * BM)) % 2 ** 32 < q_w  # window_range, _keep
                        for m in range(n_m) for q in range(BM)]
                assert keep == sees[m_lo:].tolist(), (w, col)
        assert (cuts > 0) == causal and (several > 0) == causal


@pytest.mark.parametrize("causal", [False, True])
def test_dq_accumulated_rows(causal):
    """seqinfo.dq_accumulated (the preprocess's and PostRows' `accumulated` after their
    search: the last sequence starting at or before the row), on plain ints: the rows
    past the last sequence, those of sequences of more than long_k keys and, causal, the
    rows that see no key of their sequence (bottom-right), the TLX twin's `_accumulated`
    rows."""
    import bisect
    import torch
    from harness.problems import offsets
    from kernels_cute import seqinfo as S

    g = torch.Generator().manual_seed(4)
    lq = torch.randint(0, 40, (50,), generator=g)
    lk = torch.randint(0, 20, (50,), generator=g)
    lq[:4], lk[:4] = torch.tensor([30, 0, 5, 12]), torch.tensor([25, 3, 0, 12])
    cu_q, cu_k = offsets(lq), offsets(lk)
    B, long_k, extra = len(lq), 16, 9
    n = int(cu_q[-1]) + extra
    seq = torch.repeat_interleave(torch.arange(B), lq)
    row = torch.arange(int(cu_q[-1])) - cu_q[seq]
    want = lk[seq] > long_k
    if causal:  # row i sees key 0 iff i >= len_q - len_k
        want |= row < lq[seq] - lk[seq]
    want = torch.cat([want, torch.ones(extra, dtype=torch.bool)])
    cq, ck = _Ints(cu_q), _Ints(cu_k)
    starts = cu_q.tolist()
    got = [bool(S.dq_accumulated(cq, ck, B, bisect.bisect_right(starts, tok) - 1, tok,
                                 long_k, causal)) for tok in range(n)]
    assert got == want.tolist()
    assert want.any() and not want.all()


@interp
@pytest.mark.parametrize("kind", ["direct", "windows", "tiles"])
def test_host_backward_launches_windows(monkeypatch, kind):
    """host.backward with bwd_hopper's main (the tile lists in the interpreter, the
    kernels recorders): short packed keys launch the window_config build, never from
    the counter, on window_tiles over the key offsets (order, table, count in the tile
    list's places), dQ itself passed for the owned windows' stores, the preprocess zeroing
    and the rows postprocess converting the longer sequences' rows only ("windows": one
    sequence of more than a window's keys); every sequence within a window's keys
    ("direct", jagged.tiles.windows_direct): the preprocess zeroes dQ's own rows and no
    postprocess launches; otherwise, and always in broadcast-Q, the default build for the
    mean query rows on kv_tiles, between the whole preprocess and postprocess."""
    import torch
    from harness.problems import offsets
    from jagged.tiles import bwd_dynamic, dq_slots, kv_tiles, window_tiles
    from kernels_cute import bwd_hopper as B
    from kernels_cute import host

    calls = []

    def recorder(*key):
        return lambda *args: calls.append((key, args))

    monkeypatch.setattr(host, "compiled", lambda cache, make, *key: recorder(*key))
    monkeypatch.setattr(host, "num_sms", lambda dev: 132)
    monkeypatch.setattr(B, "bwd_parts", lambda *a: 1)   # whole tiles (split: below)
    monkeypatch.setattr(B, "window_parts", lambda *a: 1)
    kern = B.KERNELS._replace(preprocess=recorder, postprocess=recorder, post_rows=recorder,
                              post_flat=recorder)
    H, HKV, D = 4, 2, 64
    lk = torch.tensor({"direct": [26, 0, 31, 1, 40, 26] * 4,
                       "windows": [26, 0, 31, 1, 40, 26] * 4 + [300],
                       "tiles": [300, 200, 5]}[kind])
    lq = lk.flip(0)
    cu_k, cu_q = offsets(lk), offsets(lq)
    max_k = int(lk.max())
    k = torch.zeros(int(cu_k[-1]), HKV, D, dtype=torch.bfloat16)
    for bq in (False, True):
        n_q = 7 if bq else int(cu_q[-1])
        n_out = n_q * len(lk) if bq else n_q
        q = torch.zeros(n_q, H, D, dtype=torch.bfloat16)
        o = torch.zeros(n_out, H, D, dtype=torch.bfloat16)
        lse = torch.zeros(H, n_out)
        for causal in (False, True):
            calls.clear()
            host.backward(kern, o, q, k, k, o, lse, None if bq else cu_q, cu_k, n_q, max_k,
                          causal, 0.125, bq)
            windows = kind != "tiles" and not bq
            direct = kind == "direct" and not bq
            assert len(calls) == (2 if direct else 3)
            (pre, pre_args), (main, args) = calls[:2]
            assert pre == (q.dtype, D, B.BLOCK_N if windows else 0, False, direct,
                           windows and causal)
            B_ = len(lk)
            assert pre_args[7] == pre_args[3].shape[0]   # n_dq_rows: the zeroed tensor's
            assert pre_args[8:] == ((cu_q, cu_k) if windows else (None, None)) + (
                B_, B_.bit_length(), None, 0)
            if windows:
                assert args[20].shape == q.shape and args[20].dtype == q.dtype
            else:
                assert args[20] is None
            if direct:   # the preprocess zeroes dQ's own rows: the tensor the windows store
                assert pre_args[3].dtype == q.dtype and pre_args[3].shape == (n_q * H, D)
                assert pre_args[3].data_ptr() == args[20].data_ptr()
            else:
                # the postprocess launches as the main kernel's dependent in the packed modes
                assert pre_args[3].dtype == torch.float32
                (post, post_args), = calls[2:]
                assert post == ((q.dtype, not bq, False, causal) if windows
                                else (q.dtype, not bq, False))
            if not bq:   # the fp32 accumulator; direct: it only backs the dQ descriptor
                assert args[6].shape == ((B.window_config(D).block_m if direct else n_q), H, D)
            if windows and not direct:   # the rows postprocess: the offsets, vectors a token
                assert post_args[2:4] == (cu_q, cu_k) and post_args[4:6] == (B_, B_.bit_length())
                assert post_args[7] == H * D // B.POST_VEC
            if windows:
                cfg = B.window_config(D)
                order, count, win = window_tiles(cu_k, cu_q, k.shape[0], max_k, B.BLOCK_N,
                                                 cfg.block_m)
                assert main == (q.dtype, D, causal, False, cfg, False, "", 1)
                assert all(torch.equal(a, b) for a, b in zip(args[11:14], (order, win, count)))
            else:   # the step by the mean query rows (bq: its 7 rows, the 64-row step)
                cfg = B.pick_config(D, n_q if bq else n_q / len(lk))
                assert cfg.block_m == (64 if bq else 128)
                tiles = kv_tiles(None if bq else cu_q, cu_k, n_q if bq else 0, max_k, causal,
                                 cfg.block_m, B.BLOCK_N)
                assert main == (q.dtype, D, causal, bq, cfg, bwd_dynamic(bq), "", 1)
                assert all(torch.equal(a, b) for a, b in zip(args[11:14], tiles))
            # broadcast-Q: one dQ slot per SLOT_KEYS keys (jagged.tiles.dq_slots)
            slots = dq_slots(132 // HKV, n_q * H * D * 4, k.shape[0]) if bq else 1
            assert args[15:19] == (0.125, n_q if bq else 0, slots, H // HKV)
            assert bq or args[19] == 132


@pytest.mark.parametrize("bq,n_slots", [(False, 1), (True, 1), (True, 3)])
def test_tile_range_slots(monkeypatch, bq, n_slots):
    """`schedule.tile_range` read in plain Python (block and grid indices patched): packed
    CTAs deal tiles x heads round-robin from slot row 0; broadcast-Q CTA p is pinned to
    KV head p % H_kv and its dQ rows start at slot (p // H_kv) % n_slots (as TLX's
    dq_slot_row)."""
    import cutlass.cute as cute
    from kernels_cute import schedule as Sch
    from kernels_cute.bwd_hopper import Sched

    HKV, L_q, P = 2, 64, 12
    sched = Sched(None, None, _Ints([7]), None, None, L_q, 4 * HKV, HKV, 4, None, None,
                  n_slots)
    monkeypatch.setattr(cute.arch, "grid_dim", lambda: (P, 1, 1))
    for p in range(P):
        monkeypatch.setattr(cute.arch, "block_idx", lambda p=p: (p, 0, 0))
        first, step, n_tiles, slot_row, pinned = Sch.tile_range(sched, bq)
        if bq:
            assert (first, step, n_tiles, pinned) == (p // HKV, P // HKV, 7, p % HKV)
            assert slot_row == (p // HKV) % n_slots * L_q
        else:
            assert (first, step, n_tiles, slot_row) == (p, P, 7 * HKV, 0)


def _packed_call(lengths, H, HKV, D):
    """A self-attention call's host inputs for recorded launches: (lengths, offsets,
    tokens, q, k, lse), zeros."""
    import torch
    from harness.problems import offsets
    lk = torch.tensor(lengths)
    cu = offsets(lk)
    n = int(cu[-1])
    return (lk, cu, n, torch.zeros(n, H, D, dtype=torch.bfloat16),
            torch.zeros(n, HKV, D, dtype=torch.bfloat16), torch.zeros(H, n))


def _planned(monkeypatch, sms):
    """(host.BwdKernels with bwd_hopper's main and plan, the plans asked, the main builds
    launched): kernels recorded, sms()'s SMs."""
    from kernels_cute import bwd_hopper as B
    from kernels_cute import host
    plans, mains = [], []
    monkeypatch.setattr(host, "num_sms", lambda dev: sms())
    monkeypatch.setattr(host, "compiled", lambda cache, make, *key: (
        lambda *args: mains.append(key)))
    rec = lambda *key: (lambda *args: None)          # noqa: E731
    plan = lambda c: plans.append(c) or B._plan(c)   # noqa: E731
    return host.BwdKernels(rec, B._main, rec, B.POST_VEC, plan=plan, post_flat=rec), plans, mains


@pytest.mark.parametrize("split", [1, 4])
def test_host_backward_plans_once(monkeypatch, split):
    """host.backward asks bwd_hopper's plan once a call: the main kernel launches the
    config the plan gave (carried in BwdCall.cfg), the split build where the tiles are
    split, and the config is picked once for whole tiles, once more only for a split."""
    from kernels_cute import bwd_hopper as B
    from kernels_cute import host

    picks = []
    pick = B.pick_config
    monkeypatch.setattr(B, "pick_config", lambda *a, **kw: picks.append(a) or pick(*a, **kw))
    monkeypatch.setattr(B, "bwd_parts", lambda *a: split)
    kern, plans, mains = _planned(monkeypatch, lambda: 132)
    lk, cu, n, q, k, lse = _packed_call([600, 900, 700], 4, 2, 128)
    host.backward(kern, q, q, k, k, q, lse, cu, cu, 900, 900, True, 0.125, False)
    assert len(plans) == 1 and len(picks) == (1 if split == 1 else 2)
    (key,) = mains
    assert key[4] == B._config(plans[0]._replace(parts=split), split) and key[7] == split


def test_host_backward_decides_once_a_site(monkeypatch):
    """host.backward makes its decisions (key windows, the plan) once a call site and device:
    a second call of the same shapes, flags and bounds asks no plan and launches the same
    build; other bounds, or another SM count, are another site."""
    from kernels_cute import host

    sms = [132]
    kern, plans, mains = _planned(monkeypatch, lambda: sms[0])
    lk, cu, n, q, k, lse = _packed_call([600, 900, 700], 4, 2, 128)

    def call(max_k):
        host.backward(kern, q, q, k, k, q, lse, cu, cu, 900, max_k, False, 0.125, False)

    call(900)
    call(900)
    assert len(plans) == 1 and mains[0] == mains[1]
    call(1024)
    sms[0] = 16
    call(900)
    assert len(plans) == 3 and len(mains) == 4


@pytest.mark.parametrize("causal", [False, True])
def test_host_backward_head_run(monkeypatch, causal):
    """host.backward with bwd_hopper's plan (kernels recorded): a long non-causal call whose
    rows over all heads exceed the L2 budget (4 x 2048 tokens, H32/8, 67 MB) launches the
    build whose list entries go a KV head at a time in runs (Config.head_run,
    jagged.tiles.bwd_head_run); causal masking keeps the heads innermost."""
    from jagged.tiles import BWD_HEAD_RUN
    from kernels_cute import bwd_hopper as B
    from kernels_cute import host

    mains = []
    monkeypatch.setattr(host, "num_sms", lambda dev: 132)
    monkeypatch.setattr(host, "compiled", lambda cache, make, *key: (
        lambda *args: mains.append(key)))
    rec = lambda *key: (lambda *args: None)          # noqa: E731
    kern = host.BwdKernels(rec, B._main, rec, B.POST_VEC, plan=B._plan, post_flat=rec)
    lk, cu, n, q, k, lse = _packed_call([2048] * 4, 32, 8, 128)
    host.backward(kern, q, q, k, k, q, lse, cu, cu, 2048, 2048, causal, 0.125, False)
    cfgs = [key[4] for key in mains if len(key) > 4 and isinstance(key[4], B.Config)]
    assert [c.head_run for c in cfgs] == [1 if causal else BWD_HEAD_RUN]


def test_host_backward_launches_plain(monkeypatch):
    """host.backward with bwd_hopper's main at D = 128 (kernels recorded): long packed
    sequences without causal masking launch the 80-row build on kv_tiles of 80-row
    blocks (a dense batch only where 80-row blocks pad it little: `takes_plain`);
    causal masking, broadcast-Q and short sequences the 64-row one."""
    import torch
    from jagged.tiles import kv_tiles
    from kernels_cute import bwd_hopper as B
    from kernels_cute import host

    calls = []
    monkeypatch.setattr(host, "compiled", lambda cache, make, *key: (
        lambda *args: calls.append((key, args))))
    monkeypatch.setattr(host, "num_sms", lambda dev: 132)
    monkeypatch.setattr(B, "bwd_parts", lambda *a: 1)   # whole tiles (split: below)
    rec = lambda *key: (lambda *args: None)          # noqa: E731
    kern = host.BwdKernels(rec, B._main, rec, B.POST_VEC, plan=B._plan, post_flat=rec)
    H, HKV, D = 4, 2, 128
    for lengths, causal, block_m in (([600, 900, 700], False, 80), ([600, 900, 700], True, 64),
                                     ([300, 900, 100], False, 64), ([1024] * 2, False, 80),
                                     ([512] * 3, False, 64)):
        lk, cu, n, q, k, lse = _packed_call(lengths, H, HKV, D)
        calls.clear()
        host.backward(kern, q, q, k, k, q, lse, cu, cu, int(lk.max()), int(lk.max()), causal,
                      0.125, False)
        ((_, _, c, bq, cfg, _, _, parts), args), = calls
        assert parts == 1
        assert (c, bq, cfg.block_m, cfg.dq_t) == (causal, False, block_m, block_m == 80)
        tiles = kv_tiles(cu, cu, 0, int(lk.max()), causal, block_m, B.BLOCK_N)
        assert all(torch.equal(a, b) for a, b in zip(args[11:14], tiles))


@interp
@pytest.mark.parametrize("causal", [False, True])
def test_host_backward_launches_split(monkeypatch, causal):
    """host.backward with bwd_hopper's main on a call of few long tiles (kernels recorded):
    the tiles split over CTAs (jagged.tiles.bwd_parts) launch the split build (the 64-row
    step at D = 128, never the 80-row one) on fp32 dK / dV accumulators that the
    preprocess zeroes and the postprocess converts, each into its own gradient (three
    allocations: a custom op's outputs may not alias): three launches, as a whole call."""
    import torch
    from harness.problems import offsets
    from jagged.tiles import bwd_parts
    from kernels_cute import bwd_hopper as B
    from kernels_cute import host

    calls = []

    def recorder(*key):
        return lambda *args: calls.append((key, args))

    monkeypatch.setattr(host, "compiled", lambda cache, make, *key: recorder(*key))
    sms = 48   # the call's 59 query blocks of 64 rows at least a wave: the block-padded dQ
    monkeypatch.setattr(host, "num_sms", lambda dev: sms)
    kern = B.KERNELS._replace(preprocess=recorder, postprocess=recorder, post_rows=recorder,
                              post_flat=recorder)
    H, HKV, D = 4, 1, 128
    lk = torch.tensor([2000, 1800])
    cu = offsets(lk)
    n = int(cu[-1])
    q = torch.zeros(n, H, D, dtype=torch.bfloat16)
    k = torch.zeros(n, HKV, D, dtype=torch.bfloat16)
    lse = torch.zeros(H, n)
    parts = bwd_parts(n, n, 2, HKV, H // HKV, causal, False, 64, B.BLOCK_N, sms, 2000, 2000)
    assert parts > 1
    dq, dk, dv = host.backward(kern, q, q, k, k, q, lse, cu, cu, 2000, 2000, causal, 0.125,
                               False)
    (pre, pa), (main, args), (post, qa) = calls
    # long sequences: the block-padded dQ accumulator (test_host_backward_launches_flat)
    cfg = replace(B.CONFIGS[(D, "long")], dq_flat=True)
    assert cfg.block_m == 64 and B.pick_config(D, n / 2, causal, False, 2000).block_m == (
        64 if causal else 80)
    assert main[:6] == (q.dtype, D, causal, False, cfg, True) and main[7] == parts
    acc_k, acc_v = args[7], args[8]
    assert acc_k.dtype == acc_v.dtype == torch.float32 and acc_k.shape == k.shape
    assert acc_v.data_ptr() == acc_k.data_ptr() + acc_k.numel() * 4
    assert pre == (q.dtype, D, 0, True, False, False)
    assert post == (q.dtype, D, cfg.block_m, cfg.dq_t, True, True)
    assert pa[-2].data_ptr() == acc_k.data_ptr() and pa[-2].shape == (2 * n * HKV, D)
    assert pa[-1] == 2 * n * HKV
    acc, gk, gv, n_vec = qa[5:]
    assert acc.data_ptr() == acc_k.data_ptr() and acc.shape == (2, k.numel())
    assert gk.data_ptr() == dk.data_ptr() and gv.data_ptr() == dv.data_ptr()
    assert n_vec == k.numel() // B.POST_VEC
    assert dk.untyped_storage().data_ptr() != dv.untyped_storage().data_ptr()


@interp
def test_host_backward_launches_flat(monkeypatch):
    """host.backward with bwd_hopper's main (kernels recorded): packed sequences of at
    least FLAT_MEAN_Q query rows on average launch the dq_flat build of their step (80 rows
    plain, 64 causal) on a block-padded accumulator of flat_rows rows, zeroed whole by the
    preprocess, and PostFlat over its blocks; shorter ones, calls of fewer query blocks
    than SMs and broadcast-Q keep the row accumulator and the row postprocess; key windows
    never take it, however long their query sequences (the window build, the rows
    postprocess)."""
    import torch
    from harness.problems import offsets
    from jagged.tiles import flat_rows
    from kernels_cute import bwd_hopper as B
    from kernels_cute import host

    calls = []

    def recorder(*key):
        return lambda *args: calls.append((key, args))

    monkeypatch.setattr(host, "compiled", lambda cache, make, *key: recorder(*key))
    monkeypatch.setattr(B, "bwd_parts", lambda *a: 1)
    monkeypatch.setattr(B, "window_parts", lambda *a: 1)
    kern = B.KERNELS._replace(preprocess=recorder, postprocess=recorder, post_rows=recorder,
                              post_flat=recorder)
    H, HKV, D = 4, 2, 128
    for lengths, causal, bm, sms in (([600, 900, 700], False, 80, 16),
                                     ([600, 900, 700], True, 64, 16),
                                     ([300, 100, 200], False, 0, 16), ([512] * 3, True, 64, 16),
                                     ([600, 900, 700], False, 0, 132)):  # 27 blocks
        monkeypatch.setattr(host, "num_sms", lambda dev: sms)
        lk, cu, n, q, k, lse = _packed_call(lengths, H, HKV, D)
        calls.clear()
        dq, _, _ = host.backward(kern, q, q, k, k, q, lse, cu, cu, int(lk.max()),
                                 int(lk.max()), causal, 0.125, False)
        (pre, ra), (main, args), (post, pa) = calls
        cfg = main[4]
        acc = args[6]
        assert pre == (q.dtype, D, 0, False, False, False)
        assert ra[3].data_ptr() == acc.data_ptr() and ra[5:7] == (n * H, H)
        assert ra[7] == acc.shape[0] * H       # every accumulator row zeroed
        if bm:
            rows = flat_rows(n, len(lengths), bm)
            assert cfg.dq_flat and cfg.block_m == bm and acc.shape == (rows, H, D)
            assert post == (q.dtype, D, bm, cfg.dq_t, True, False)
            assert pa[0].data_ptr() == acc.data_ptr() and pa[0].numel() == rows * H * D
            assert pa[1] is dq and pa[2] is cu and pa[3] == rows // bm and pa[4] == 0.125
        else:
            assert not cfg.dq_flat and acc.shape == (n, H, D)
            assert post == (q.dtype, True, False) and pa[2] == dq.numel() // B.POST_VEC
    assert not B.pick_config(D, 4096.0, broadcast_q=True).dq_flat
    # one sequence of more than a window's keys: the rows postprocess runs
    lq, lk = torch.tensor([600, 900, 700] * 8 + [600]), torch.tensor([26, 40, 31] * 8 + [300])
    cu_q, cu_k = offsets(lq), offsets(lk)
    n_q, n_k = int(cu_q[-1]), int(cu_k[-1])
    assert n_q / len(lq) >= FLAT_MEAN_Q and B.takes_windows(n_k, len(lk), 300, False)
    q = torch.zeros(n_q, H, D, dtype=torch.bfloat16)
    k = torch.zeros(n_k, HKV, D, dtype=torch.bfloat16)
    calls.clear()
    host.backward(kern, q, q, k, k, q, torch.zeros(H, n_q), cu_q, cu_k, 900, 300, False,
                  0.125, False)
    (pre, ra), (main, args), (post, pa) = calls
    assert main[4] == B.window_config(D) and args[6].shape == (n_q, H, D)
    assert pre[2] == B.BLOCK_N and ra[7] == n_q * H
    assert post == (q.dtype, True, False, False) and pa[2:4] == (cu_q, cu_k)


@needs_dsl
@pytest.mark.parametrize("D", [128, 64])
def test_head_run_builds(tmp_path, D):
    """A build whose list entries go a KV head at a time in runs (Config.head_run,
    jagged.tiles.bwd_head_run; schedule.head_run_coords) compiles non-causal (the calls
    that take runs) with its steps spill-free, the run's divisions by the last run's
    length in its tile coords: more integer divisions than the heads-innermost build,
    none added to a step."""
    from kernels_cute import bwd_hopper as B
    from jagged.tiles import BWD_HEAD_RUN
    causal = False
    cfg = B.pick_config(D, float("inf"), causal, False)
    paths = {}
    for run in (1, BWD_HEAD_RUN):
        (tmp_path / str(run)).mkdir()
        path = _compile(tmp_path / str(run), f"B.compile_main(dt, {D}, {causal}, False, "
                        f"__import__('dataclasses').replace(B.pick_config({D}, "
                        f"float('inf'), {causal}, False), head_run={run}))")
        if path is None:
            pytest.skip("compiled, but the DSL kept no PTX to inspect")
        paths[run] = open(path).read()
        if run > 1:
            _no_step_spills(path, _ptxas(path))
    divs = {run: len(re.findall(r"\b(div|rem)\.s32", ptx)) for run, ptx in paths.items()}
    assert divs[BWD_HEAD_RUN] > divs[1], divs
    assert cfg.head_run == 1  # pick_config leaves it to _plan
