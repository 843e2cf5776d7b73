"""fp8 with V tiles in the CuteDSL Hopper forward (Config.fp8_v, where
kernels_cute.fwd_hopper.fp8_v_tiles picks it): V stays e4m3, the load warpgroup's four
warps convert each tile to f16 in shared memory and v_descale scales O. On the CPU: the
sm_90a builds (e4m3 S, f16 P V, e4m3 -> f16 in pairs, no spills, shared memory within
the limit), the host's launch either way (recorded), the rule, and the barrier
protocol's model with the conversion stage (clean over random jagged lists; planted bugs
caught). On the GPU: tests/test_fp8_kernel.py (`-m gpu`, test_fwd_fp8_cute_v_*,
test_fwd_fp8_v_tiles_nan_rows_gpu)."""
import dataclasses
import os
import re
import textwrap
import zlib

import pytest
import torch

from _cute import ROOT, compile_in_subprocess, have_dsl
from _interp import interp
from harness import protocol as P
from harness.problems import offsets
from harness.protocol import ProtocolError, Problem, Wait
from jagged.fp8 import FP8

_ok, _why = have_dsl()
needs_dsl = pytest.mark.skipif(not _ok, reason=_why)

# (head_dim, length bucket or "windows" (row windows), causal, broadcast_q): two in CI,
# the rest under -m matrix
BUILDS = [(128, "long", True, False), (128, "windows", True, False)]
MATRIX = [(d, b, c, q) for d in (64, 128) for b in ("long", "short") for c in (False, True)
          for q in (False, True) if (d, b, c, q) not in BUILDS] + [(64, "windows", False,
                                                                    False)]

_SCRIPT = textwrap.dedent("""
    import dataclasses, sys, torch
    sys.path.insert(0, {root!r})
    from kernels_cute import fwd_hopper as F
    cfg = F.window_config({D}) if {bucket!r} == "windows" else F.CONFIGS[({D}, {bucket!r},
                                                                          {causal})]
    cfg = dataclasses.replace(cfg, fp8_v=True)
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
    no spills. Row windows: the same, each row its own descales."""
    from jagged.arch import SMEM_LIMIT
    from kernels_cute import fwd_hopper as F
    d, bucket, causal, bq = build
    cfg = F.window_config(d) if bucket == "windows" else F.CONFIGS[(d, bucket, causal)]
    cfg = dataclasses.replace(cfg, fp8_v=True)
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
@pytest.mark.parametrize("heads,lens,tiles", [(8, [300, 200, 5], True),    # G * mean 673
                                              (32, [600, 500, 5], False),   # 5893
                                              (8, [26, 0, 31, 1, 40] * 8, True)],
                         ids=["tiles", "pass", "windows"])
def test_forward_launch(monkeypatch, heads, lens, tiles):
    """fwd_hopper.forward's launch (recorded), two KV heads: with V tiles (fp8_v_tiles) no
    V pass runs and the build is Config.fp8_v's (its own compile key), the kernel gets V
    in e4m3 and v_descale; otherwise the V pass runs once, the kernel gets its bf16 V and
    no v_descale, and the build is the default's. Short sequences take row windows (each
    row its own descales), V tiles or not the same way."""
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
    cu = offsets(torch.tensor(lens))
    n = int(cu[-1])
    q = torch.zeros(n, heads, 128).to(FP8)
    k = torch.zeros(n, 2, 128).to(FP8)
    v = torch.ones(n, 2, 128).to(FP8)
    B = len(lens)
    ds = tuple(torch.full((B, 2), x) for x in (0.5, 0.25, 2.0))
    F.forward(q, k, v, cu, cu, max(lens), max(lens), True, 0.125, False, descale=ds)
    (key,), (args,) = builds, launches
    windows = F.takes_windows(n, n, B, max(lens), False)
    assert windows == (B > 3)
    # q, k, v, out, lse, cu_q, cu_k, pairs, count, q / k / v descale, window table, ...
    assert args[9] is ds[0] and args[10] is ds[1] and (args[12] is None) != windows
    assert key[-1].fp8_v == tiles == F.fp8_v_tiles(heads // 2, n / B)
    cfg = F.window_config(128) if windows else F.pick_config(128, max(lens), True, n / B)
    # causal packed lists take their tiles from the counter (jagged.tiles.fwd_dynamic)
    assert key[-1] == dataclasses.replace(cfg, fp8_v=tiles, dynamic=not windows)
    if tiles:
        assert passes == [] and args[2] is v and args[11] is ds[2]
    else:
        assert len(passes) == 1 and passes[0][0] is v and passes[0][1] is ds[2]
        assert args[2].dtype == torch.bfloat16 and args[11] is None


def test_rule():
    """V tiles while the query rows a KV head serves, G * mean_k, stay within
    FP8_V_TILES_MAX (the V pass's cost against the conversions'), not in any config."""
    from kernels_cute import fwd_hopper as F
    assert F.fp8_v_tiles(1, 1844) and F.fp8_v_tiles(4, 1024) and F.fp8_v_tiles(8, 0.0)
    assert not F.fp8_v_tiles(4, 4096) and not F.fp8_v_tiles(1, 8192)
    assert F.fp8_v_tiles(2, F.FP8_V_TILES_MAX / 2) and not F.fp8_v_tiles(2, F.FP8_V_TILES_MAX)
    assert F.KERNELS.fp8_v is F.fp8_v_tiles
    assert not any(cfg.fp8_v for cfg in F.CONFIGS.values())


# ----------------------------------------------------------------------------- protocol
MODEL = P.MODELS["cute_fwd_hopper_v_tiles"][0]
KEYS = [(d, b, c) for d in (64, 128) for b in ("long", "short") for c in (False, True)]


def _configs():
    from kernels_cute import fwd_hopper as F
    return F.CONFIGS


@pytest.mark.parametrize("key", KEYS, ids=lambda k: f"{k[0]}-{k[1]}-{'causal' if k[2] else 'full'}")
def test_protocol_clean(key):
    """No deadlock, race or stale read over random jagged lists and interleavings, with
    the conversion stage."""
    runs, steps = P.sweep(MODEL, _configs()[key], problems=10, seeds=4,
                          seed=zlib.crc32(repr(("cute", key)).encode()) & 0xFFFF,
                          head_dim=key[0])
    assert runs == 40 and steps > 0


# one CTA, two tiles of five KV blocks each (the rings wrap), two consumers
LONG = Problem((128, 128), (600, 600), heads=1, causal=False)


def _reject(cfg, seeds=range(60), **kw):
    """The reports of the seeds whose interleaving hits the bug (some do not: a missing
    wait breaks only the interleavings where the waited event comes late); at least one."""
    reports = []
    for seed in seeds:
        try:
            P.check(lambda sim: MODEL(sim, LONG, cfg, 1), [seed], **kw)
        except ProtocolError as e:
            reports.append((e.kind, str(e)))
    assert reports, "no interleaving found the bug"
    return reports


def _drop(role_part, pred):
    return lambda role, op: None if role_part in role and pred(op) else op


def test_protocol_bugs_caught():
    """Four converting warps, each releasing its part of a slot."""
    cfg = _configs()[(128, "long", False)]  # 2 consumers, 2 stages

    # a converting warp writes its f16 part without waiting for the consumers to free it
    for kind, msg in _reject(cfg, mutate=_drop("convert", lambda op: type(op) is Wait
                                               and "v_empty" in op.bar)):
        assert kind in ("race", "stale", "aliasing", "arrival")

    # a converting warp reads before the e4m3 tile landed
    for kind, msg in _reject(cfg, seeds=range(200), mutate=_drop(
            "convert", lambda op: type(op) is Wait and "v8_full" in op.bar)):
        assert kind in ("race", "stale") and "cta0.v8[" in msg

    # the load warp copies into an e4m3 slot the other warps may still be reading
    for kind, msg in _reject(cfg, seeds=range(200), mutate=_drop(
            "load", lambda op: type(op) is Wait and "v8_empty" in op.bar)):
        assert kind in ("race", "stale", "aliasing") and "cta0.v8[" in msg

    # the consumers reading V on the e4m3 copy's barrier, not the conversion's
    def early(role, op):
        if "compute" in role and type(op) is Wait and "v_full" in op.bar:
            return op._replace(bar=op.bar.replace("v_full", "v8_full"))
        return op
    for kind, msg in _reject(cfg, mutate=early):
        assert kind in ("race", "stale", "aliasing")
