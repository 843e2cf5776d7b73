"""The CuteDSL Hopper forward compiles for sm_90a on a CPU-only machine.

CuteDSL compiles without a GPU when CUTE_DSL_ARCH names the target; the kernel is
compiled on symbolic (fake) tensors, so no device memory is touched. The PTX is kept
(CUTE_DSL_KEEP=ptx) and checked for what the design relies on: wgmma, TMA bulk-tensor
loads, setmaxnreg (warp specialization), a store barrier per consumer warpgroup and the
KV mask as one select per score; the fp8 build also for its e4m3 S = Q K^T, its TMA
byte counts and (from the cubin the DSL built) no spills.
"""
import os
import re
import textwrap

import pytest

from _cute import ROOT, compile_in_subprocess, have_dsl

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
    (64, False, False, "long", "bf16"), (64, True, False, "long", "bf16"),
    (64, True, False, "short", "bf16"),
    (128, False, False, "long", "bf16"), (128, True, True, "long", "bf16"),
    (128, False, True, "short", "fp16"), (128, True, False, "short", "bf16")])
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


@needs_dsl
@pytest.mark.parametrize("D,causal,bq,bucket", [
    (128, True, False, "long"), (64, False, False, "long"), (128, False, True, "short"),
    (64, True, True, "short")])
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
