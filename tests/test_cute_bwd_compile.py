"""The CuteDSL Hopper backward (kernels_cute/bwd_hopper.py) compiles for sm_90a on a CPU.

Like tests/test_cute_compile.py: CUTE_DSL_ARCH=sm_90a, compiled on symbolic tensors in
a subprocess (CUTE_DSL_* must be set before the DSL is imported), PTX kept and checked
for what the design relies on: wgmma, TMA bulk-tensor loads, the TMA bulk-tensor
reduce-add of dQ, setmaxnreg (warp specialization). Where ptxas is on the PATH the PTX
is also assembled and the test asserts no register spills. Each case takes a few
seconds. (Compiling is all this machine can do: the kernel has not run on a GPU here.)
"""
import os
import re
import shutil
import subprocess
import textwrap

import pytest

from _cute import ROOT, compile_in_subprocess, have_dsl, traced_check

_ok, _why = have_dsl()
pytestmark = pytest.mark.skipif(not _ok, reason=_why)

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
    beside the PTX; its own CUDA 12 compiler, the one the GPU runs), else from the PTX
    through the ptxas on PATH, or None. The PATH's ptxas can disagree: CUDA 13.0's spills
    16 bytes in the D = 128 non-causal broadcast-Q build whose cubin has none (session 11)."""
    cubin = path[:-len(".ptx")] + ".cubin"
    if os.path.exists(cubin):
        from harness.compile_check import _resource_usage
        use = _resource_usage(open(cubin, "rb").read())
        return use["REG"], use["STACK"] + use["LOCAL"] + use["spill_insts"]
    exe = shutil.which("ptxas")
    if exe is None:
        return None
    r = subprocess.run([exe, "-arch=sm_90a", "-v", path, "-o", os.devnull],
                       capture_output=True, text=True, timeout=120)
    regs = re.findall(r"Used (\d+) registers", r.stderr)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
    if r.returncode != 0 or not regs:
        return None
    return int(regs[0]), sum(int(a) + int(b) for a, b in spills)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_bwd_main_compiles_sm90a(tmp_path, monkeypatch, D, causal):
    """The default kernel of each causality (JAGGED_CUTE_BWD_OPTS unset)."""
    monkeypatch.delenv("JAGGED_CUTE_BWD_OPTS", raising=False)
    path = _compile(tmp_path, f"B.compile_main(dt, {D}, {causal}, False)")
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    mma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.(bf16|f16)", ptx)
    assert mma, "no wgmma in the PTX"
    assert re.search(r"cp\.async\.bulk\.tensor", ptx), "no TMA load in the PTX"
    assert re.search(r"cp\.reduce\.async\.bulk\.tensor\.\w+\.global\.shared::cta\.add", ptx), \
        "no TMA reduce-add (dQ) in the PTX"
    assert re.search(r"setmaxnreg\.inc", ptx) and re.search(r"setmaxnreg\.dec", ptx)
    # causal packed builds take their tiles from the counter (jagged.tiles.bwd_dynamic)
    assert bool(re.search(r"atom\.global(\.relaxed\.gpu)?\.add\.u32", ptx)) == causal
    res = _ptxas(path)
    print(f"D={D} causal={causal}: {len(mma)} wgmma {sorted(set(mma))}; "
          f"ptxas (registers, spill bytes): {res}")
    if res is not None:
        assert res[1] == 0, f"register spills: {res}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_bwd_main_ab_switches_compile(tmp_path, D, causal):
    """The other setting of the A/B switches (none; the default is all of them):
    compiles, wgmma, one row-major 64 x D dQ reduce box a step (dqwide off), no spills at
    ptxas."""
    spec = "none"
    path = _compile(tmp_path, f"B.compile_main(dt, {D}, {causal}, False, "
                              f"opts=B.bwd_opts({causal}, {spec!r}))")
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    assert "wgmma.mma_async" in ptx
    red = re.findall(r"cp\.reduce\.async\.bulk\.tensor\.\w+\.global\.shared::cta\.add", ptx)
    assert len(red) == 1, len(red)
    res = _ptxas(path)
    print(f"D={D} causal={causal} {spec}: ptxas (registers, spill bytes): {res}")
    if res is not None:
        assert res[1] == 0, f"register spills: {res}"


@pytest.mark.parametrize("D,causal", [(64, False), (128, False), (128, True)])
def test_bwd_main_dkvsmem_compiles(tmp_path, D, causal):
    """dkvsmem (in the default build): dK, dV leave through sV as 16-byte stores, D / 8 a
    thread (64 rows x D x 2 tensors / 128 threads / 8), and no per-element ones; no spills
    at ptxas. (Off: test_bwd_main_ab_switches_compile.)"""
    spec = ""                                                    # the default
    path = _compile(tmp_path, f"B.compile_main(dt, {D}, {causal}, False, "
                              f"opts=B.bwd_opts({causal}, {spec!r}))")
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    assert "stmatrix.sync.aligned" in ptx
    assert len(re.findall(r"st\.global\.v4\.b32", ptx)) == D // 8
    assert not re.search(r"st\.global(\.\w+)?\.(b16|u16)", ptx), "per-element dK/dV stores"
    assert len(re.findall(r"mbarrier\.arrive\.expect_tx", ptx)) == 2   # K/V, Q/dO
    res = _ptxas(path)
    print(f"D={D} causal={causal} default: ptxas (registers, spill bytes): {res}")
    if res is not None:
        assert res[1] == 0, f"register spills: {res}"


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


@pytest.mark.parametrize("causal", [False, True])
def test_bwd_main_kv2_compiles(tmp_path, causal):
    """kv2 (default at D = 64; the TLX twin's KV_STAGES_M64 = 2): K and V in two stages.
    Against the default build: the K/V TMA loads go to base + (stage << 14) + 1024 (K) and
    + 33792 (V), i.e. K stages at 1024 / 17408, V at 33792 / 50176 (16 KB = BLOCK_N x D x
    2 B a stage; default: K at 1024, V at 17408, no stage term); the K/V expect_tx is still
    one stage (K + V, 32 KB); two more mbarriers (mbar_KV: 2 x 2); spill-free. Shared
    memory: 130 KB (the kernel asserts its struct equals `smem_bytes`); at D = 128 it
    would be 242 KB, a ValueError."""
    from kernels_cute import bwd_hopper as B
    default = "dqord,dkvsmem,lsesmem,dqwide,diagmask"
    spec = default + ",kv2"
    opts = B.bwd_opts(causal, spec)
    assert B.kv_stages(64, opts) == 2 and B.smem_bytes(64, opts) == 130 * 1024
    assert B.smem_bytes(128, opts) == 242 * 1024 > B.SMEM_LIMIT
    with pytest.raises(ValueError, match="kv2 at D = 128"):
        B.kv_stages(128, opts)
    ptx = {}
    for name, sw in (("kv2", spec), ("ref", default)):
        (tmp_path / name).mkdir()
        path, ptx[name] = _compile_spill_free(tmp_path / name, 64, causal, False, "bf16", sw)
    stage = B.BLOCK_N * 64 * 2
    assert stage == 1 << 14
    assert _kv_loads(ptx["ref"]) == [(1024, None), (1024 + stage, None)]
    assert _kv_loads(ptx["kv2"]) == [(1024, 14), (1024 + 2 * stage, 14)]
    tx = lambda p: sorted(int(v) for v in re.findall(
        r"mov\.b32\s+%r\d+, (\d+);\s*mbarrier\.arrive\.expect_tx", p))
    assert tx(ptx["kv2"]) == tx(ptx["ref"]) == [16384, 32768]     # Q + dO, K + V
    inits = {k: len(re.findall(r"mbarrier\.init", p)) for k, p in ptx.items()}
    assert inits["kv2"] == inits["ref"] + 2, inits


def test_bwd_opts_parse(monkeypatch):
    from kernels_cute.bwd_hopper import DEFAULT_OPTS, OPTS, bwd_opts, kv_stages
    monkeypatch.delenv("JAGGED_CUTE_BWD_OPTS", raising=False)
    nc = c = {"dqord", "dkvsmem", "lsesmem", "dqwide", "diagmask"}   # measured defaults
    assert set(OPTS) == nc | {"kv2", "m128"}         # kv2, m128: by head dim, below
    assert DEFAULT_OPTS[False] == nc and DEFAULT_OPTS[True] == c
    assert bwd_opts(False) == nc
    assert bwd_opts(True) == c
    for causal in (False, True):                     # kv2 where it fits, m128: D = 64
        assert bwd_opts(causal, head_dim=64) == DEFAULT_OPTS[causal] | {"kv2", "m128"}
        assert bwd_opts(causal, "-m128", head_dim=64) == DEFAULT_OPTS[causal] | {"kv2"}
        assert bwd_opts(causal, "-m128", head_dim=128) == DEFAULT_OPTS[causal]
        assert bwd_opts(causal, head_dim=128) == DEFAULT_OPTS[causal]
        assert kv_stages(64, bwd_opts(causal, head_dim=64)) == 2
        assert kv_stages(128, bwd_opts(causal, head_dim=128)) == 1
    assert bwd_opts(False, "dqord", head_dim=64) == {"dqord"}   # a spec wins
    assert bwd_opts(False, "") == nc and bwd_opts(True, " ") == c
    assert bwd_opts(False, "none") == frozenset()
    assert bwd_opts(True, "all") == set(OPTS)
    assert bwd_opts(True, " dqord, ") == {"dqord"}
    assert bwd_opts(False, "dqord,dkvsmem,lsesmem,dqwide,diagmask") == nc
    assert bwd_opts(False, "dqord,dkvsmem,lsesmem,dqwide") == {"dqord", "dkvsmem",
                                                                "lsesmem", "dqwide"}
    with pytest.raises(ValueError):
        bwd_opts(False, "qfirst")                                # measured, deleted
    monkeypatch.setenv("JAGGED_CUTE_BWD_OPTS", "")
    assert bwd_opts(False) == nc and bwd_opts(True) == c
    monkeypatch.setenv("JAGGED_CUTE_BWD_OPTS", "none")
    assert bwd_opts(False) == frozenset()
    monkeypatch.setenv("JAGGED_CUTE_BWD_OPTS", "dqord")
    assert bwd_opts(True) == bwd_opts(False) == {"dqord"}
    for bad in ("nope", "lse", "pds2", "q3", "dqblk", "dqord,dqblk", "-nope"):  # lse: on;
        with pytest.raises(ValueError):                                 # others gone
            bwd_opts(False, bad)


def _compile_spill_free(tmp_path, D, causal, bq, dtype, spec):
    """(PTX path, PTX) of the main kernel with switches `spec`: wgmma present and, where
    ptxas is on PATH, no spills and no ptxas-injected wgmma wait."""
    path = _compile(tmp_path, f"B.compile_main(dt, {D}, {causal}, {bq}, "
                              f"opts=B.bwd_opts({causal}, {spec!r}))", dtype)
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16", ptx)
    res, adv = _ptxas(path), _ptxas_advisories(path)
    print(f"D={D} causal={causal} bq={bq} {dtype} {spec}: ptxas (registers, spill bytes): "
          f"{res}, advisories {adv}")
    if res is not None:
        assert res[1] == 0, f"register spills: {res}"
        assert not adv, adv
    return path, ptx


def _loop_sass(path):
    """The loops (backward branches) holding wgmmas, as lists of (address, SASS
    instruction), from the cubin of `path` (ptxas, cuobjdump), or None without them."""
    exe, dump = shutil.which("ptxas"), shutil.which("cuobjdump")
    if exe is None or dump is None:
        return None
    cubin = path + ".cubin"
    r = subprocess.run([exe, "-arch=sm_90a", path, "-o", cubin], capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0:
        return None
    sass = subprocess.run([dump, "-sass", cubin], capture_output=True, text=True,
                          timeout=120).stdout
    ins = [(int(a, 16), t.strip()) for a, t in
           re.findall(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", sass, re.M)]
    at = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (a, t) in enumerate(ins):
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", t)
        if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in at:
            body = ins[at[int(m.group(1), 16)]:i + 1]
            if any("HGMMA" in x for _, x in body):
                loops.append(body)
    return loops


@pytest.mark.parametrize("D,bq,dtype", [(128, False, "bf16"), (64, False, "bf16"),
                                        (128, True, "fp16")])
def test_bwd_main_diagmask_compiles(tmp_path, D, bq, dtype):
    """diagmask (default, causal; the TLX twin's DIAG_MASK): the key-length mask on every
    step, the causal bound in a warp-uniform branch taken only on the steps whose block it
    cuts (`causal_cut`). Spill-free, no ptxas-injected wgmma wait; the Q-step loop (the
    innermost loop with wgmmas) holds the branch over the bound's 32 ISETP + 32 selects
    (sm_90a, D = 128 bf16, the default build: 501 SASS with both paths, 420 on the steps
    that skip it, 492 with the bound on every step, 407 non-causal). Non-causal ignores
    the switch (same PTX)."""
    spec = "dqord,dkvsmem,lsesmem,dqwide,diagmask"                 # the default
    path, _ = _compile_spill_free(tmp_path, D, True, bq, dtype, spec)
    loops = _loop_sass(path)
    if loops:
        step = min(loops, key=len)                       # the Q-step loop
        assert any("HGMMA" in x for _, x in step)
        # the branch over the bound: a forward branch inside the loop whose skipped
        # instructions hold the bound's ISETP and selects (32 each: FSEL, or SEL in one
        # fp16 build) and no wgmma
        at = {a: i for i, (a, _) in enumerate(step)}
        skipped = []
        for i, (a, x) in enumerate(step):
            m = re.match(r"@!?P\d BRA (0x[0-9a-f]+)", x)
            tgt = int(m.group(1), 16) if m else -1
            if tgt > a and tgt in at:
                skipped.append([y for _, y in step[i + 1:at[tgt]]])
        sel = lambda b: sum(bool(re.match(r"F?SEL\b", y)) for y in b)
        body = [b for b in skipped if sel(b) >= 32]
        assert len(body) == 1, [len(b) for b in skipped]
        body = body[0]
        assert sum("ISETP" in y for y in body) >= 32 and not any("HGMMA" in y for y in body)
        print(f"Q-step loop: {len(step)} SASS, {len(step) - len(body) - 1} on uncut steps")
    if D == 128 and not bq:
        # non-causal: the switch changes nothing
        nc = {}
        for name, sw in (("nc", spec), ("ref", "dqord,dkvsmem,lsesmem,dqwide")):
            (tmp_path / name).mkdir()
            nc[name] = _compile(tmp_path / name, "B.compile_main(dt, 128, False, False, "
                                 f"opts=B.bwd_opts(False, {sw!r}))", dtype)
        if all(nc.values()):
            lines = {k: [ln for ln in open(q).read().splitlines() if not ln.startswith("//")]
                     for k, q in nc.items()}
            assert lines["nc"] == lines["ref"], "diagmask changed the non-causal PTX"


def test_causal_cut_keeps_the_mask():
    """Pure Python (no compile), as the TLX twin's test: diagmask's `causal_cut` plus the
    key-length mask equals the full causal mask over the schedule's steps
    (tests/_causal.py)."""
    pytest.importorskip("numpy")
    from _causal import assert_cut_keeps_the_mask
    from kernels_cute.bwd_hopper import BLOCK_M, BLOCK_N, NUM_MMA_WG, causal_cut
    assert_cut_keeps_the_mask(causal_cut, BLOCK_M, BLOCK_N, NUM_MMA_WG)


def _ptxas_advisories(path):
    """ptxas -v lines that say it serialized wgmmas (C7515-C7517: an injected
    warpgroup.wait), or None without ptxas."""
    exe = shutil.which("ptxas")
    if exe is None:
        return None
    r = subprocess.run([exe, "-arch=sm_90a", "-v", path, "-o", os.devnull],
                       capture_output=True, text=True, timeout=120)
    return [ln for ln in r.stderr.splitlines() if re.search(r"C751\d", ln)]


@pytest.mark.parametrize("D,causal,bq,dtype", [(64, False, False, "bf16"),
                                               (128, False, False, "bf16"),
                                               (128, True, False, "bf16"),
                                               (128, False, True, "fp16"),
                                               (128, True, True, "bf16")])
def test_bwd_main_lsesmem_compiles(tmp_path, D, causal, bq, dtype):
    """lsesmem (a default, as the other switches): lse / delta staged in smem by the load
    warp, so the compute loop has none of the 32 lse / delta shuffles (shfl.idx with
    c = 0x31f = 799) but 16 ld.shared.v2 (8 lse, 8 delta); the load warp's rows go out
    before its arrive.expect_tx (bar.warp.sync between); no spills, and no wgmma wait
    injected by ptxas (the dP^T accumulator starts at -delta: one register per element,
    see compute_step)."""
    _, ptx = _compile_spill_free(tmp_path, D, causal, bq, dtype, "")     # the default
    assert not re.search(r"shfl\.sync\.idx\.b32\s+%r\d+, %r\d+, \d+, 799,", ptx)
    assert len(re.findall(r"ld\.shared\.v2\.(b32|f32)", ptx)) == 16
    assert "bar.warp.sync" in ptx
    assert len(re.findall(r"mbarrier\.arrive\.expect_tx", ptx)) == 2   # K/V, Q/dO


@pytest.mark.parametrize("bm", [64, 128])
def test_lsesmem_addresses(tmp_path, bm):
    """lsesmem's sLD addresses, at 64 and (m128) 128 query rows a step: the load warp's
    rows (`ld_row`) cover the step's rows once; every compute thread's read of accumulator column c (`ld_thread_offset` +
    `ld_column`, bytes) is the sLD element (query column of that accumulator element in
    the sdp wgmma's C partition, x, stage) of the kernel's layout, for both accumulator
    rows (the dP^T accumulator starts at -delta[c] in both); XOR with LD_FLIP is the
    other stage; reads are 8-byte aligned (they are ld.shared.v2)."""
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
            rows = sorted(B.ld_row(l, e) for l in range(32) for e in range(BM // 32))
            FOUND["rows"] = rows == list(range(BM))
            tiled = sm90.make_trivial_tiled_mma(
                cutlass.BFloat16, cutlass.BFloat16, warpgroup.OperandMajorMode.K,
                warpgroup.OperandMajorMode.K, cutlass.Float32,
                atom_layout_mnk=(B.NUM_MMA_WG, 1, 1), tiler_mn=(64, BM))
            bad, n = [], 0
            for t in range(128 * B.NUM_MMA_WG):
                tScS = acc_rows_cols(tiled.get_slice(t).partition_C(
                    cute.make_identity_tensor((B.BLOCK_N, BM))))
                lane = t % 32
                for s in range(B.Q_STAGES):
                    off = B.ld_thread_offset(lane, s, BM)
                    if off % 8 or off ^ B.ld_flip(BM) != B.ld_thread_offset(lane, 1 - s, BM):
                        bad.append(("offset", t, s, off))
                    for r in range(cute.size(tScS, mode=[0])):
                        for c in range(cute.size(tScS, mode=[1])):
                            q = tScS[r, c][1]
                            for x in range(2):
                                n += 1
                                got = off + 4 * (x * BM + B.ld_column(c))
                                if got != 4 * cute.crd2idx((q, x, s), L):
                                    bad.append((t, s, r, c, x, got))
            FOUND["bad"], FOUND["n"] = bad, n
    """, f"""
        assert F["rows"], "load-warp rows"
        assert F["n"] == 256 * 2 * 2 * {bm // 4} * 2, F["n"]      # threads, stages, rows, cols, x
        assert not F["bad"], F["bad"][:10]
    """)


@pytest.mark.parametrize("causal,bq,dtype", [(True, False, "bf16"), (False, True, "fp16"),
                                             (True, True, "bf16")])
def test_bwd_main_compiles_modes(tmp_path, causal, bq, dtype):
    path = _compile(tmp_path, f"B.compile_main(dt, 128, {causal}, {bq})", dtype)
    if path is not None:
        assert "wgmma.mma_async" in open(path).read()


def test_bwd_pre_post_compile(tmp_path):
    """The preprocess (delta, dQ zeroing) and postprocess (slot sum, cast) kernels."""
    _compile(tmp_path, "B.compile_preprocess(dt, 64, True); B.compile_preprocess(dt, 128, False); "
                       "B.compile_postprocess(dt)")


def test_backward_dispatch(monkeypatch):
    """The CuteDSL backward is the default; JAGGED_CUTE_BWD=portable picks the portable
    Triton one (read per call)."""
    import sys
    import types
    import kernels_cute
    from jagged import portable
    fake = types.ModuleType("kernels_cute.bwd_hopper")
    fake.backward = lambda *a: "hopper"
    monkeypatch.setitem(sys.modules, "kernels_cute.bwd_hopper", fake)
    monkeypatch.setattr(kernels_cute, "bwd_hopper", fake, raising=False)
    monkeypatch.setattr(portable, "bwd", lambda *a: "portable")
    monkeypatch.delenv("JAGGED_CUTE_BWD", raising=False)
    assert kernels_cute._backward() == "hopper"
    monkeypatch.setenv("JAGGED_CUTE_BWD", "portable")
    assert kernels_cute._backward() == "portable"


def test_element_swizzled_matches_the_hardware_swizzle(tmp_path):
    """`element_swizzled` (dkvsmem's sV read view) addresses the bytes TMA and stmatrix
    wrote: the 128B swizzle XORs byte-address bits 4-6 with bits 7-9. Session 7's view
    used the atom's byte swizzle on element offsets: it compiled, and every dK / dV came
    out permuted on the GPU."""
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


@pytest.mark.parametrize("D,causal,bq,dtype,spec", [                # "": the default
    (128, True, False, "bf16", ""), (128, False, False, "bf16", ""),
    (64, True, False, "bf16", ""), (64, False, False, "bf16", ""),
    (128, True, True, "fp16", ""), (128, False, False, "fp16", ""),
    (128, True, False, "bf16", "dqord,dkvsmem,lsesmem,dqwide")])       # diagmask off
def test_bwd_main_dqwide_compiles(tmp_path, D, causal, bq, dtype, spec):
    """dqwide (a default): D / 32 TMA reduce-adds of 64 x 32 fp32 a step (off: one of
    64 x D), the dQ partial D / 8 st.shared.v2 a thread (2 rows x D / 16 column pairs); no
    spills, no ptxas-injected wgmma wait. Addresses: test_dqwide_addresses."""
    _, ptx = _compile_spill_free(tmp_path, D, causal, bq, dtype, spec)
    red = re.findall(r"cp\.reduce\.async\.bulk\.tensor\.\w+\.global\.shared::cta\.add", ptx)
    assert len(red) == D // 32, len(red)
    # dQ's stores plus lsesmem's 2 (the load warp's lse / delta rows)
    assert len(re.findall(r"st\.shared\.v2\.(b32|f32)", ptx)) == D // 8 + 2


def test_dqwide_addresses(tmp_path):
    """dqwide's fp32 dQ partial in smem: the compute threads (the dQ wgmma's C partition,
    partition_C of `dq_store_view`, the layout the kernel writes through) put each
    (row, col) of the 64 x D tile exactly once, at the byte the TMA reduce box reads for
    it: D / 32 boxes of 64 x 32 fp32, 8 KB each, 128 B rows, hardware 128B swizzle (byte
    bits 4-6 ^= bits 7-9). The layout the TMA atom is built from (`dq_smem_layout`) carries
    that swizzle (S<3,4,3>, in bytes) over the same row-major boxes. Each thread's two
    columns of a pair are adjacent (one STS.64), and every warp store instruction covers
    each of the 32 banks exactly twice (2 wavefronts, the minimum for 256 bytes). Controls:
    the unswizzled and the byte-counted (wrong) swizzle views must fail the same check."""
    traced_check(tmp_path, "dq_check", """
        import cutlass, cutlass.cute as cute
        from cutlass.cute.nvgpu import warpgroup
        import cutlass.utils.hopper_helpers as sm90
        from kernels_cute import bwd_hopper as B

        FOUND = {}

        def hw_byte(r, c):
            box, b = c // B.DQ_WIDE, r * 4 * B.DQ_WIDE + (c % B.DQ_WIDE) * 4
            return box * 4 * B.DQ_WIDE * B.BLOCK_M + (b ^ (((b >> 7) & 7) << 4))

        def run():
            for D in (64, 128):
                L = B.dq_smem_layout(D, {"dqwide"})
                sw = L.inner
                FOUND[(D, "swizzle")] = (sw.num_bits, sw.num_base, sw.num_shift)
                # the boxes: row-major 64 x 32 fp32, one after the other
                FOUND[(D, "outer")] = [
                    (r, c) for r in range(B.BLOCK_M) for c in range(D)
                    if cute.crd2idx((r, c), L.outer) !=
                    (c // B.DQ_WIDE) * B.DQ_WIDE * B.BLOCK_M + r * B.DQ_WIDE + c % B.DQ_WIDE]
                tiled = sm90.make_trivial_tiled_mma(
                    cutlass.BFloat16, cutlass.BFloat16, warpgroup.OperandMajorMode.MN,
                    warpgroup.OperandMajorMode.MN, cutlass.Float32,
                    atom_layout_mnk=(1, B.NUM_MMA_WG, 1), tiler_mn=(64, D // B.NUM_MMA_WG))
                views = {"kernel": B.dq_store_view(L), "plain": L.outer,
                         "byteswz": cute.make_composed_layout(L.inner, 0, L.outer)}
                for name, V in views.items():
                    seen, bad, pairs, insn = {}, [], [], {}
                    for t in range(128 * B.NUM_MMA_WG):
                        C = tiled.get_slice(t).partition_C(
                            cute.make_identity_tensor((B.BLOCK_M, D)))
                        for i in range(cute.size(C)):
                            r, c = C[i]
                            got = 4 * cute.crd2idx((r, c), V)
                            seen[(r, c)] = seen.get((r, c), 0) + 1
                            if got != hw_byte(r, c):
                                bad.append((t, i, r, c, got, hw_byte(r, c)))
                            if i % 2 == 0:   # register pair i, i + 1: one STS.64
                                r1, c1 = C[i + 1]
                                if r1 != r or c1 != c + 1 or got % 8 or \\
                                        4 * cute.crd2idx((r1, c1), V) != got + 4:
                                    pairs.append((t, i))
                                insn.setdefault((t // 32, i), []).append(got)
                    banks = []    # instructions reaching a bank other than twice
                    for k, a in insn.items():
                        words = [w // 4 for x in a for w in (x, x + 4)]
                        if sorted(w % 32 for w in words) != sorted(list(range(32)) * 2):
                            banks.append(k)
                    FOUND[(D, name)] = dict(
                        once=sorted(seen) == [(r, c) for r in range(B.BLOCK_M)
                                              for c in range(D)] and
                        set(seen.values()) == {1},
                        bad=bad, pairs=pairs, banks=banks, n=len(insn))
    """, """
        for D in (64, 128):
            assert F[(D, "swizzle")] == (3, 4, 3), F[(D, "swizzle")]
            assert not F[(D, "outer")], F[(D, "outer")][:10]
            k = F[(D, "kernel")]
            assert k["once"], "not every (row, col) exactly once"
            assert not k["bad"], k["bad"][:10]
            assert not k["pairs"], k["pairs"][:10]
            assert not k["banks"], k["banks"][:10]
            assert k["n"] == 8 * (D // 8), k["n"]    # 8 warps x D / 8 STS.64 a thread
            for ctl in ("plain", "byteswz"):       # a wrong swizzle fails the check
                assert F[(D, ctl)]["once"] and F[(D, ctl)]["bad"], ctl
    """)


def test_bwd_opts_plus_and_step_rows():
    """"+a,b" is the default and a, b; m128 (128 query rows a step, the default at D = 64)
    is built for D = 64
    with lsesmem only (a ValueError elsewhere, on the host); its smem model: 163 KB with one
    K/V stage, 195 KB with kv2 (the struct equals it: the kernel asserts so)."""
    from kernels_cute import bwd_hopper as B
    for causal in (False, True):
        assert B.bwd_opts(causal, "+m128", head_dim=64) == B.default_opts(causal, 64)
        assert B.bwd_opts(causal, "+m128", head_dim=128) == B.default_opts(causal, 128) | {
            "m128"}
    opts = B.bwd_opts(False, "+m128", head_dim=64)
    assert B.step_rows(64, opts) == 128 and B.step_rows(64, opts - {"m128"}) == 64
    assert B.smem_bytes(64, opts) == 195 * 1024 <= B.SMEM_LIMIT            # with kv2
    assert B.smem_bytes(64, opts - {"kv2"}) == 163 * 1024
    with pytest.raises(ValueError, match="m128 is built for D = 64"):
        B.step_rows(128, B.bwd_opts(False, "+m128", head_dim=128))
    with pytest.raises(ValueError, match="with lsesmem"):
        B.step_rows(64, opts - {"lsesmem"})
    # the load warp's lse / delta rows cover the 128 rows once (4 a lane)
    assert sorted(B.ld_row(l, e) for l in range(32) for e in range(4)) == list(range(128))
    assert [B.ld_row(3, e) for e in range(2)] == [6, 7]                   # 64 rows: as before


@pytest.mark.parametrize("causal,bq,dtype,spec", [
    (False, False, "bf16", "+m128"), (True, False, "bf16", "+m128"),
    (False, True, "bf16", "+m128"), (True, True, "fp16", "+m128"),
    (False, False, "bf16", "+m128,kv2"), (True, False, "bf16", "+m128,kv2")])
def test_bwd_main_m128_compiles(tmp_path, causal, bq, dtype, spec):
    """m128 (the D = 64 default since session 21; the TLX twin's M128): spill-free with no
    ptxas-injected wgmma wait in every mode, one K/V stage or kv2; S^T / dP^T at N = 128
    (4 + 4 m64n128k16), dV / dK / dQ at N = D = 64 (K = 128: 8 each, dQ split by query
    rows); the dQ partial still reduced in D / 32 = 2 boxes a step; lse / delta read from
    sLD as 2 x 16 ld.shared.v2 (32 query columns a thread)."""
    _, ptx = _compile_spill_free(tmp_path, 64, causal, bq, dtype, spec)
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16", ptx)) == 8
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16", ptx)) == 24
    red = re.findall(r"cp\.reduce\.async\.bulk\.tensor\.\w+\.global\.shared::cta\.add", ptx)
    assert len(red) == 2, len(red)
    assert len(re.findall(r"ld\.shared\.v2\.(b32|f32)", ptx)) == 32
