"""The CuteDSL Hopper forward compiles for sm_90a on a CPU-only machine.

CuteDSL compiles without a GPU when CUTE_DSL_ARCH names the target; the kernel is
compiled on symbolic (fake) tensors, so no device memory is touched. The PTX is kept
(CUTE_DSL_KEEP=ptx) and checked for the Hopper instructions the design relies on:
wgmma, TMA bulk-tensor loads and setmaxnreg (warp specialization).
"""
import re
import textwrap

import pytest

from _cute import ROOT, compile_in_subprocess, have_dsl

_ok, _why = have_dsl()
pytestmark = pytest.mark.skipif(not _ok, reason=_why)

# one subprocess per config: CUTE_DSL_* must be set before the DSL is imported
_SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {root!r})
    from kernels_cute import fwd_hopper
    dt = {{"bf16": torch.bfloat16, "fp16": torch.float16}}[{dtype!r}]
    fwd_hopper.compile_forward(dt, {D}, {causal}, {bq})
    print("COMPILED")
""")


def _compile(tmp_path, D, causal=False, bq=False, dtype="bf16"):
    script = _SCRIPT.format(root=ROOT, D=D, causal=causal, bq=bq, dtype=dtype)
    ptx = compile_in_subprocess(tmp_path, script, timeout=900)
    return open(ptx).read() if ptx else None


@pytest.mark.parametrize("D", [64, 128])
def test_forward_compiles_sm90a(tmp_path, D):
    ptx = _compile(tmp_path, D)
    if ptx is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    mma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.(bf16|f16)", ptx)
    assert mma, "no wgmma in the PTX"
    tma = re.findall(r"cp\.async\.bulk\.tensor", ptx)
    regs = sorted(set(re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)))
    print(f"D={D}: {len(mma)} wgmma {sorted(set(mma))}, {len(tma)} TMA loads, setmaxnreg {regs}")
    assert re.search(r"cp\.async\.bulk\.tensor", ptx), "no TMA load in the PTX"
    assert re.search(r"setmaxnreg\.inc", ptx) and re.search(r"setmaxnreg\.dec", ptx)


@pytest.mark.parametrize("causal,bq,dtype", [(True, False, "bf16"), (False, True, "fp16"),
                                             (True, True, "bf16")])
def test_forward_compiles_modes(tmp_path, causal, bq, dtype):
    ptx = _compile(tmp_path, 128, causal=causal, bq=bq, dtype=dtype)
    if ptx is not None:
        assert "wgmma.mma_async" in ptx


# The default build of each (D, bucket): each consumer warpgroup stores its own 64 O rows
# behind a 128-thread named barrier (no shared 256-thread epilogue barrier; as TLX), and
# the KV mask is one select per score (as TLX's tl.where; a dynamic `if` per score lowered
# to select chains: ~2000 selp in the 128-key build, ~1000 more SASS per masked block).
# Session 11 made both the only paths (Config.wg_store / where_mask deleted).
_CONFIG_SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {root!r})
    from kernels_cute import fwd_hopper
    cfg = fwd_hopper.bucket_config({D}, {bucket!r}, {causal})
    dt = {{"bf16": torch.bfloat16, "fp16": torch.float16}}[{dtype!r}]
    fwd_hopper.compile_forward(dt, {D}, {causal}, {bq}, cfg)
    print("COMPILED")
""")


@pytest.mark.parametrize("D,causal,bq,bucket,dtype", [
    (64, False, False, "long", "bf16"), (64, True, False, "long", "bf16"),
    (64, True, False, "short", "bf16"),
    (128, False, False, "long", "bf16"), (128, True, False, "long", "bf16"),
    (128, False, False, "short", "bf16"), (128, True, True, "short", "fp16")])
def test_forward_store_and_mask(tmp_path, D, causal, bq, bucket, dtype):
    script = _CONFIG_SCRIPT.format(root=ROOT, D=D, causal=causal, bq=bq, bucket=bucket,
                                   dtype=dtype)
    path = compile_in_subprocess(tmp_path, script, timeout=900)
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    assert "wgmma.mma_async" in ptx
    syncs = re.findall(r"bar\.sync\s+(\S+),\s*(\d+);", ptx)
    # the per-warpgroup epilogue barrier, and no 256-thread epilogue barrier (id 1)
    assert any(n == "128" for _, n in syncs), syncs
    assert ("1", "256") not in syncs, syncs
    # one select per masked score: S has block_n / 2 scores a thread, masked in two
    # places causal (the first block and the tail step), in one non-causal (mask_first:
    # no tail code), so at least places * block_n / 2 (a mask folded away at trace time
    # would leave ~30: the kernel's other selects); the `if` mask had ~2000 (128 keys);
    # D = 128 long non-causal: 94 (172 with the tail, session 14)
    block_n = 128 if bucket == "long" else 64
    places = 2 if causal else 1
    selp = len(re.findall(r"\bselp\.", ptx))
    assert places * block_n // 2 <= selp <= places * block_n + 64, selp


def test_forward_config_env(monkeypatch):
    """JAGGED_FWD_CONFIG sets the remaining integer fields; the deleted switches are
    unknown names (an error, not silently ignored)."""
    from kernels_cute import fwd_hopper
    monkeypatch.delenv("JAGGED_FWD_BUCKET", raising=False)
    monkeypatch.setenv("JAGGED_FWD_CONFIG", "num_buffers_kv=3,head_chunk=2")
    cfg = fwd_hopper.pick_config(128, 4096, False, False)
    assert (cfg.num_buffers_kv, cfg.head_chunk, cfg.block_n) == (3, 2, 128)
    for old in ("where_mask=1", "wg_store=0"):
        monkeypatch.setenv("JAGGED_FWD_CONFIG", old)
        with pytest.raises(ValueError, match="JAGGED_FWD_CONFIG"):
            fwd_hopper.pick_config(128, 4096, False, False)


_MASK_FIRST_SCRIPT = textwrap.dedent("""
    import sys, dataclasses, torch
    sys.path.insert(0, {root!r})
    from kernels_cute import fwd_hopper
    cfg = dataclasses.replace(fwd_hopper.CONFIGS[(128, "long")], mask_first=True)
    fwd_hopper.compile_forward(torch.bfloat16, 128, {causal}, False, cfg)
    print("COMPILED")
""")


def test_forward_mask_first_compiles(tmp_path):
    """Config.mask_first, the non-causal default (TLX's twin), opt-in causal: the masked
    last KV block as the peeled first step compiles causal too."""
    from kernels_cute import fwd_hopper
    for d in (64, 128):
        assert fwd_hopper.pick_config(d, 8192, False, False).mask_first
        assert not fwd_hopper.pick_config(d, 8192, True, False).mask_first
    path = compile_in_subprocess(tmp_path, _MASK_FIRST_SCRIPT.format(root=ROOT, causal=True),
                                 timeout=900)
    if path is not None:
        assert "wgmma.mma_async" in open(path).read()


_BLOCK_M_SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {root!r})
    from kernels_cute import fwd_hopper
    cfg = fwd_hopper.bucket_config(64, "long", True)
    assert cfg.block_m == 192
    fwd_hopper.compile_forward(torch.bfloat16, 64, True, False, cfg)
    print("COMPILED")
""")


def test_forward_block_m_192_compiles(tmp_path):
    """Config.block_m = 192 (the D = 64 long default; FA4's D = 64 tile): three consumer
    warpgroups at 160 registers (24 * 128 + 160 * 384 <= 64K) take their wgmma turns in
    a ring. The turn and epilogue barrier ids are computed from the warpgroup at run time
    (2 + wg, 2 + (wg + 1) % 3; 5 + wg), so the PTX shows only consumer 0's pre-arrive."""
    path = compile_in_subprocess(tmp_path, _BLOCK_M_SCRIPT.format(root=ROOT), timeout=900)
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    assert "wgmma.mma_async" in ptx
    regs = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)
    assert sorted(regs) == [("dec", "24"), ("inc", "160")], regs
    assert re.search(r"bar\.arrive\s+2,\s*256;", ptx)


def test_forward_block_m_env(monkeypatch):
    """The three-consumer tile is the D = 64 long default (both causalities, session 15);
    JAGGED_FWD_CONFIG=block_m=192 selects it elsewhere; any block_m other than 128 or 192
    is a ValueError at pick_config, before a compile."""
    from kernels_cute import fwd_hopper
    monkeypatch.delenv("JAGGED_FWD_BUCKET", raising=False)
    for causal in (False, True):
        assert fwd_hopper.pick_config(64, 8192, causal, False).block_m == 192
        assert fwd_hopper.pick_config(64, 64, causal, False).block_m == 128
        assert fwd_hopper.pick_config(128, 8192, causal, False).block_m == 128
    monkeypatch.setenv("JAGGED_FWD_CONFIG", "block_m=192")
    assert fwd_hopper.pick_config(128, 8192, True, False).block_m == 192
    monkeypatch.setenv("JAGGED_FWD_CONFIG", "block_m=100")
    with pytest.raises(ValueError, match="block_m=100"):
        fwd_hopper.pick_config(64, 8192, True, False)
