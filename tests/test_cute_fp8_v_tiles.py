"""fp8 with V tiles in the CuteDSL Hopper forward (kernels_cute.fwd_hopper.FP8_V_IN_KERNEL,
an experiment switch, off by default; Config.fp8_v): V stays e4m3, the load warpgroup's
four warps convert each tile to f16 in shared memory and v_descale scales O. On the
CPU: the sm_90a builds with the switch (e4m3 S, f16 P V, e4m3 -> f16 in pairs, no
spills, shared memory within the limit), the host's launch (recorded; no V pass with
the switch, the V pass without it); its barrier protocol's model is tested with TLX's
in test_fp8_v_tiles.py. On the GPU:
tests/test_fp8_kernel.py (`-m gpu`, test_fwd_fp8_v_tiles_*, the cute style)."""
import dataclasses
import os
import re
import textwrap

import pytest
import torch

from _cute import ROOT, compile_in_subprocess, have_dsl
from _interp import interp
from jagged.fp8 import FP8

_ok, _why = have_dsl()
needs_dsl = pytest.mark.skipif(not _ok, reason=_why)

# (head_dim, length bucket, causal, broadcast_q): one in CI, the rest under -m matrix
BUILDS = [(128, "long", True, False)]
MATRIX = [(d, b, c, q) for d in (64, 128) for b in ("long", "short") for c in (False, True)
          for q in (False, True) if (d, b, c, q) not in BUILDS]

_SCRIPT = textwrap.dedent("""
    import dataclasses, sys, torch
    sys.path.insert(0, {root!r})
    from kernels_cute import fwd_hopper as F
    cfg = dataclasses.replace(F.CONFIGS[({D}, {bucket!r}, {causal})], fp8_v=True)
    F.compile_forward(torch.float8_e4m3fn, {D}, {causal}, {bq}, cfg)
    print("COMPILED")
""")


@needs_dsl
@pytest.mark.parametrize("build", BUILDS + [pytest.param(b, marks=pytest.mark.matrix)
                                            for b in MATRIX],
                         ids=lambda b: "D{}-{}-{}{}".format(
                             b[0], b[1], "causal" if b[2] else "full", "-bq" if b[3] else ""))
def test_fwd_fp8_v_tiles_sm90(tmp_path, build):
    """S = Q K^T the e4m3 wgmma, P V an f16 one (no bf16 wgmma; O still leaves in bf16);
    V converted from e4m3 in pairs, 8 values a thread a pass (an 8-byte shared load, a
    16-byte store) at its two call sites; the V copy's expect_tx an e4m3 block's bytes;
    shared memory within the limit (the struct equals smem_bytes, asserted when traced);
    no spills."""
    from jagged.arch import SMEM_LIMIT
    from kernels_cute import fwd_hopper as F
    d, bucket, causal, bq = build
    cfg = dataclasses.replace(F.CONFIGS[(d, bucket, causal)], fp8_v=True)
    assert F.smem_bytes(d, cfg, True) <= SMEM_LIMIT[90]
    path = compile_in_subprocess(tmp_path, _SCRIPT.format(root=ROOT, D=d, bucket=bucket,
                                                          causal=causal, bq=bq), timeout=900)
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    mma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k\d+\.f32\.\w+\.\w+)", ptx)
    assert set(mma) == {f"m64n{cfg.block_n}k32.f32.e4m3.e4m3", f"m64n{d}k16.f32.f16.f16"}, \
        sorted(set(mma))
    assert "cvt.rn.f16x2.f32" in ptx and "cvt.rn.bf16x2.f32" in ptx  # P in f16, O in bf16
    passes = cfg.block_n * d // 1024
    assert ptx.count("cvt.rn.f16x2.e4m3x2") == 2 * passes * 4
    assert len(re.findall(r"ld\.shared\.v2\.b32", ptx)) == 2 * passes
    assert "fence.proxy.async" in ptx
    tx = re.findall(r"mov\.b32\s+(%r\d+),\s*(\d+);\s*\n\s*mbarrier\.arrive\.expect_tx\S*"
                    r"\s+\S+,\s*\[[^\]]+\],\s*(%r\d+);", ptx)
    assert sorted(int(n) for r, n, r2 in tx if r == r2) == \
        sorted([cfg.block_m * d, cfg.block_n * d, cfg.block_n * d]), tx
    cubin = path[:-len(".ptx")] + ".cubin"
    if os.path.exists(cubin):
        from harness.compile_check import _resource_usage
        use = _resource_usage(open(cubin, "rb").read())
        print(build, use)
        assert use["STACK"] + use["LOCAL"] + use["spill_insts"] == 0, use


def test_smem_fits():
    """The e4m3 V ring on top of the fp8 build: 225 KB at D 128 long (the current
    stages), within the limit everywhere."""
    from jagged.arch import SMEM_LIMIT
    from kernels_cute import fwd_hopper as F
    for (d, bucket, causal), cfg in F.CONFIGS.items():
        on = dataclasses.replace(cfg, fp8_v=True)
        assert F.smem_bytes(d, on, True) == F.smem_bytes(d, cfg, True) + \
            d * cfg.block_n * cfg.num_buffers_kv
        assert F.smem_bytes(d, on, True) <= SMEM_LIMIT[90], (d, bucket, causal)
    assert F.smem_bytes(128, dataclasses.replace(F.CONFIGS[(128, "long", True)], fp8_v=True),
                        True) == 225 * 1024


# ----------------------------------------------------------------------------- host
@interp
@pytest.mark.parametrize("switch", [False, True], ids=["pass", "tiles"])
def test_forward_launch(monkeypatch, switch):
    """fwd_hopper.forward's launch (recorded): with the switch no V pass runs and the
    build is Config.fp8_v's (its own compile key), the kernel gets V in e4m3 and
    v_descale; without it the V pass runs once, the kernel gets its bf16 V and no
    v_descale, and the build is the default's."""
    from kernels_cute import fwd_hopper as F
    from kernels_cute import host
    launches, builds, passes = [], [], []

    def compiled(*key):
        builds.append(key)
        return lambda *args: launches.append(args)

    def v_pass(v, descale, cu):
        passes.append((v, descale, cu))
        return torch.zeros(v.shape, dtype=torch.bfloat16)

    monkeypatch.setattr(F, "KERNELS", F.KERNELS._replace(compiled=compiled,
                                                         programs=lambda *a: 132))
    monkeypatch.setattr(host, "num_sms", lambda dev: 132)
    monkeypatch.setattr(host, "dequantize_rows", v_pass)
    monkeypatch.setattr(F, "FP8_V_IN_KERNEL", switch)
    cu = torch.tensor([0, 300, 500, 505], dtype=torch.int32)
    q = torch.zeros(505, 8, 128).to(FP8)
    k = torch.zeros(505, 2, 128).to(FP8)
    v = torch.ones(505, 2, 128).to(FP8)
    ds = tuple(torch.full((3, 2), x) for x in (0.5, 0.25, 2.0))
    F.forward(q, k, v, cu, cu, 300, 300, True, 0.125, False, descale=ds)
    (key,), (args,) = builds, launches
    assert key[-1].fp8_v == switch
    assert key[-1] == dataclasses.replace(F.pick_config(128, 300, True, 505 / 3),
                                          fp8_v=switch)
    # q, k, v, out, lse, cu_q, cu_k, pairs, count, q / k / v descale, window table, ...
    assert args[9] is ds[0] and args[10] is ds[1] and args[12] is None
    if switch:
        assert passes == [] and args[2] is v and args[11] is ds[2]
    else:
        assert len(passes) == 1 and passes[0][0] is v and passes[0][1] is ds[2]
        assert args[2].dtype == torch.bfloat16 and args[11] is None


def test_forward_default_off():
    from kernels_cute import fwd_hopper as F
    assert F.FP8_V_IN_KERNEL is False and F.KERNELS.fp8_v() is False
    assert not any(cfg.fp8_v for cfg in F.CONFIGS.values())


def test_bench_switch(monkeypatch):
    """harness `--fp8-v-tiles` (bench.apply_experiments) sets both styles' switch."""
    from harness import bench
    from kernels_cute import fwd_hopper as F
    from kernels_tlx import fwd_hopper as T
    monkeypatch.setattr(F, "FP8_V_IN_KERNEL", False)
    monkeypatch.setattr(T, "FP8_V_IN_KERNEL", False)
    monkeypatch.setenv(bench.FP8_V_TILES_ENV, "1")
    bench.apply_experiments()
    assert F.FP8_V_IN_KERNEL is True and T.FP8_V_IN_KERNEL is True
