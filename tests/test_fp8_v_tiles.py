"""fp8 with V tiles (kernels_tlx.fwd_hopper.FP8_V_IN_KERNEL, an experiment switch, off by
default): V stays e4m3, the producer converts each tile to f16 in shared memory and
v_descale scales O. On the CPU: the builds for sm_90a with the switch (e4m3 S, f16 P V,
e4m3 -> f16 in pairs, no spills, shared memory within the limit), the host's launch
(recorded; no V pass with the switch, the V pass without it), the barrier protocol's
model with the conversion stage (clean over random jagged lists; planted bugs caught).
On the GPU: tests/test_fp8_kernel.py (`-m gpu`, test_fwd_fp8_v_tiles_*)."""
import re
import zlib

import pytest
import torch

from _interp import interp
from harness import protocol as P
from harness.protocol import ProtocolError, Problem, Wait
from jagged.fp8 import FP8

# (head_dim, length bucket, causal, broadcast_q): one in CI, the rest under -m matrix
BUILDS = [(128, "long", True, False)]
MATRIX = [(d, b, c, q) for d in (64, 128) for b in ("long", "short") for c in (False, True)
          for q in (False, True) if (d, b, c, q) not in BUILDS]


def compile_v_tiles(d, bucket, causal, bq, fp8_v=True):
    from harness.compile_check import compile_kernel
    from kernels_tlx import fwd_hopper as fh
    cfg = fh.CONFIGS[(d, bucket, causal)]
    name = (f"fwd fp8{' v-tiles' if fp8_v else ''} D{d} {bucket} "
            f"{'causal' if causal else 'full'}{' bq' if bq else ''}")
    return cfg, compile_kernel(fh.fwd_kernel, fh.signature(cfg, d, "fp8e4nv", fp8_v=fp8_v),
                               fh.kernel_args(cfg, d, causal, bq, fp8=True, fp8_v=fp8_v),
                               arch=90, num_warps=4, num_stages=1, name=name)


@pytest.mark.parametrize("build", BUILDS + [pytest.param(b, marks=pytest.mark.matrix)
                                            for b in MATRIX],
                         ids=lambda b: "D{}-{}-{}{}".format(
                             b[0], b[1], "causal" if b[2] else "full", "-bq" if b[3] else ""))
def test_fwd_fp8_v_tiles_sm90(build):
    """S = Q K^T the e4m3 wgmma, P V an f16 one (P packed to f16 two a cvt); V converted
    from e4m3 in pairs, 8 values a producer thread a pass (one 8-byte shared load, one
    16-byte store); shared memory within the limit; no spills, but for the causal
    broadcast-Q builds: two values the consumers carry across their setmaxnreg go
    through local memory (4 instructions; the default fp8 build at D 128 long spills 7)."""
    from harness.compile_check import SMEM_LIMIT
    d, bucket, causal, bq = build
    cfg, rep = compile_v_tiles(d, bucket, causal, bq)
    ptx = rep.ptx
    mmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k\d+)\.f32\.(\w+)\.(\w+)", ptx)
    print(rep.row(), sorted(set(mmas)))
    assert len(mmas) == rep.mma_count, rep.row()
    assert {m for m in mmas if m[1] != "f16"} == {(f"m64n{cfg.block_n}k32", "e4m3", "e4m3")}
    assert {m for m in mmas if m[1] == "f16"} == {(f"m64n{d}k16", "f16", "f16")}
    assert "bf16" not in "".join(m[1] for m in mmas)
    convert_passes = cfg.block_n * d // 1024
    # two call sites of the conversion (in the KV loop, a tile's last block)
    assert ptx.count("cvt.rn.f16x2.e4m3x2") == 2 * convert_passes * 4, rep.row()
    assert len(re.findall(r"ld\.shared\.v4\.b16", ptx)) == 2 * convert_passes, rep.row()
    assert "cvt.rn.f16x2.f32" in ptx, rep.row()  # (O is bf16: its cvt stays)
    assert "fence.proxy.async" in ptx, rep.row()
    assert rep.total_smem <= SMEM_LIMIT[90], rep.row()
    if causal and bq:
        _, base = compile_v_tiles(d, bucket, causal, bq, fp8_v=False)
        assert rep.spill_insts <= max(base.spill_insts, 4), (rep.row(), base.row())
    else:
        assert not rep.spills, f"spills / local memory: {rep.row()}"
    assert len(rep.setmaxnreg) >= 2, rep.row()


# ----------------------------------------------------------------------------- host
@interp
@pytest.mark.parametrize("switch", [False, True], ids=["pass", "tiles"])
def test_forward_launch(monkeypatch, switch):
    """fwd_hopper.forward's launch (recorded): with the switch no V pass runs, the kernel
    gets V in e4m3, v_descale and FP8_V; without it the V pass runs once and the kernel
    gets its bf16 V and no v_descale."""
    from kernels_tlx import fwd_hopper as fh
    launches, passes = [], []

    class Recorder:
        def __init__(self, fn):
            pass

        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, args, kw))

    def v_pass(v, descale, cu):
        passes.append((v, descale, cu))
        return torch.zeros(v.shape, dtype=torch.bfloat16)

    monkeypatch.setattr(fh, "fast", Recorder)
    monkeypatch.setattr(fh, "num_sms", lambda dev: 132)
    monkeypatch.setattr(fh, "dequantize_rows", v_pass)
    monkeypatch.setattr(fh, "FP8_V_IN_KERNEL", switch)
    cu = torch.tensor([0, 300, 500, 505], dtype=torch.int32)
    q = torch.zeros(505, 8, 128).to(FP8)
    k = torch.zeros(505, 2, 128).to(FP8)
    v = torch.ones(505, 2, 128).to(FP8)
    ds = tuple(torch.full((3, 2), x) for x in (0.5, 0.25, 2.0))
    fh.forward(q, k, v, cu, cu, 300, 300, True, 0.125, False, descale=ds)
    (grid, args, kw), = launches
    assert kw["FP8"] and kw["FP8_V"] == switch
    desc_v, v_descale = args[2], args[18]
    if switch:
        assert passes == [] and v_descale is ds[2]
        assert desc_v.base is v and desc_v.base.dtype == FP8
    else:
        assert len(passes) == 1 and passes[0][0] is v and passes[0][1] is ds[2]
        assert v_descale is None and desc_v.base.dtype == torch.bfloat16
    assert args[15] is ds[0] and args[16] is ds[1]  # q, k descales: the qk scale's


def test_forward_default_off():
    from kernels_tlx import fwd_hopper as fh
    assert fh.FP8_V_IN_KERNEL is False
    assert fh.kernel_args(fh.CONFIGS[(128, "long", False)], 128, False, False,
                          fp8=True)["FP8_V"] is False


# ----------------------------------------------------------------------------- protocol
def _configs(style):
    import importlib
    return importlib.import_module(f"kernels_{style}.fwd_hopper").CONFIGS


MODELS = {style: P.MODELS[f"{style}_fwd_hopper_v_tiles"][0] for style in ("tlx", "cute")}
KEYS = [(d, b, c) for d in (64, 128) for b in ("long", "short") for c in (False, True)]


@pytest.mark.parametrize("style", ["tlx", "cute"])
@pytest.mark.parametrize("key", KEYS, ids=lambda k: f"{k[0]}-{k[1]}-{'causal' if k[2] else 'full'}")
def test_protocol_clean(style, key):
    """No deadlock, race or stale read over random jagged lists and interleavings, with
    the conversion stage of either style."""
    runs, steps = P.sweep(MODELS[style], _configs(style)[key], problems=10, seeds=4,
                          seed=zlib.crc32(repr((style, key)).encode()) & 0xFFFF,
                          head_dim=key[0])
    assert runs == 40 and steps > 0


# one CTA, two tiles of five KV blocks each (the rings wrap), two consumers
LONG = Problem((128, 128), (600, 600), heads=1, causal=False)


def _reject(style, cfg, seeds=range(60), **kw):
    """The reports of the seeds whose interleaving hits the bug (some do not: a missing
    wait breaks only the interleavings where the waited event comes late); at least one."""
    reports = []
    for seed in seeds:
        try:
            P.check(lambda sim: MODELS[style](sim, LONG, cfg, 1), [seed], **kw)
        except ProtocolError as e:
            reports.append((e.kind, str(e)))
    assert reports, "no interleaving found the bug"
    return reports


def _drop(role_part, pred):
    return lambda role, op: None if role_part in role and pred(op) else op


def test_protocol_bugs_caught():
    style = "tlx"
    cfg = _configs(style)[(128, "long", False)]  # 2 consumers, 2 stages

    # the producer writes the f16 slot without waiting for the consumers to free it (the
    # K ring's wait leaves the last P V on the slot in flight)
    for kind, msg in _reject(style, cfg, mutate=_drop("load", lambda op: type(op) is Wait
                                               and "v_empty" in op.bar)):
        assert kind in ("race", "stale", "aliasing", "arrival")
        assert "cta0.v[" in msg or "cta0.v_full[" in msg

    # it converts before the e4m3 tile landed (mostly it has: the conversion runs a block
    # behind the copies)
    for kind, msg in _reject(style, cfg, seeds=range(200), mutate=_drop("load", lambda op: type(op) is Wait
                                               and "v8_full" in op.bar)):
        assert kind in ("race", "stale") and "cta0.v8[" in msg

    # an e4m3 stage too few: the next copy lands in the slot still to be converted
    def one_slot(role, op):
        if type(op) is P.Tma:
            return op._replace(writes={b.replace("v8[1]", "v8[0]"): t
                                       for b, t in op.writes.items()})
        if type(op) is P.Read:
            return op._replace(buf=op.buf.replace("v8[1]", "v8[0]"))
        if type(op) is P.Arrive:
            return op._replace(release=tuple(b.replace("v8[1]", "v8[0]") for b in op.release))
        return op
    for kind, msg in _reject(style, cfg, mutate=one_slot):
        assert kind in ("race", "stale") and "cta0.v8[0]" in msg

    # the consumers reading V on the e4m3 copy's barrier, not the conversion's: they
    # read the f16 slot before (or while) the producer writes it
    def early(role, op):
        if "consumer" in role and type(op) is Wait and "v_full" in op.bar:
            return op._replace(bar=op.bar.replace("v_full", "v8_full"))
        return op
    for kind, msg in _reject(style, cfg, mutate=early):
        assert kind in ("race", "stale", "aliasing")


def test_protocol_bugs_caught_cute():
    """The CuteDSL model: four converting warps, each releasing its part of a slot."""
    style = "cute"
    cfg = _configs(style)[(128, "long", False)]  # 2 consumers, 2 stages

    # a converting warp writes its f16 part without waiting for the consumers to free it
    for kind, msg in _reject(style, cfg, mutate=_drop("convert", lambda op: type(op) is Wait
                                               and "v_empty" in op.bar)):
        assert kind in ("race", "stale", "aliasing", "arrival")

    # a converting warp reads before the e4m3 tile landed
    for kind, msg in _reject(style, cfg, seeds=range(200), mutate=_drop(
            "convert", lambda op: type(op) is Wait and "v8_full" in op.bar)):
        assert kind in ("race", "stale") and "cta0.v8[" in msg

    # the load warp copies into an e4m3 slot the other warps may still be reading
    for kind, msg in _reject(style, cfg, seeds=range(200), mutate=_drop(
            "load", lambda op: type(op) is Wait and "v8_empty" in op.bar)):
        assert kind in ("race", "stale", "aliasing") and "cta0.v8[" in msg

    # the consumers reading V on the e4m3 copy's barrier, not the conversion's
    def early(role, op):
        if "compute" in role and type(op) is Wait and "v_full" in op.bar:
            return op._replace(bar=op.bar.replace("v_full", "v8_full"))
        return op
    for kind, msg in _reject(style, cfg, mutate=early):
        assert kind in ("race", "stale", "aliasing")
