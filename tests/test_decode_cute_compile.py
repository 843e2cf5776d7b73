"""The CuteDSL KV-cache decode kernel (kernels_cute/decode_hopper.py).

CPU: every default config compiles for sm_90a (CUTE_DSL_ARCH=sm_90a, symbolic tensors,
one fresh subprocess: CUTE_DSL_* are read at import), with no spill, the loads as
16-byte cp.async and the products as mma.sync; the smem of a CTA lets two CTAs share an
SM (one at 128 rows). The same for an fp8 (e4m3) cache with an fp8 or a bf16 q: the
cache bytes by 16-byte cp.async, converted (e4m3x2 -> f16x2) before 16-bit mma.sync;
at 16 and 32 rows (D 128) with an e4m3 q the swapped tile (Config.swap): S^T = K Q^T an e4m3
wgmma, O^T += V^T P^T an f16 one, no mma.sync, V alone converted; at 64 rows (D 128; D 64
by config) with an e4m3 q the unswapped wgmma tile (Config.wgmma_s): S = Q K^T an e4m3
wgmma, O += P V an f16 one with P from registers. GPU (`-m gpu`): the
kernel against an fp32 torch reference on tiny
shapes in every mode: contiguous and paged caches (page sizes 1, 16, 64, pages
shuffled), dense and packed q, causal and not, one and three splits (merged here by
logsumexp), empty caches, GQA 1, 4 and 8 (tiles of 16 to 128 rows, and two 128-row
tiles), D 64 and 128, bf16 and fp16; the same through jagged.kvcache_attention; the
headline bandwidth (run with -s to see it).
"""
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from _cute import ROOT, have_dsl
from harness.problems import offsets

_ok, _why = have_dsl()
needs_dsl = pytest.mark.skipif(not _ok, reason=_why)

SM_SMEM = 228 * 1024          # an H100 / H200 SM's shared memory
CTA_SMEM_MAX = 227 * 1024     # the most one CTA may use
CTA_RESERVED = 1024           # reserved per resident CTA
DSL_STATIC = 1024             # the static smem of a CuteDSL kernel (cuobjdump: SHARED)

# dtype names of the builds: (q, cache)
_DTYPES = {"bfloat16": ("bfloat16", "bfloat16"), "float16": ("float16", "float16"),
           "fp8": ("float8_e4m3fn", "float8_e4m3fn"), "bf16/fp8": ("bfloat16", "float8_e4m3fn")}

# (D, block_m, causal, paged, packed, split, dtype): every config, every flag both ways,
# and the decode path (one query row, GQA <= 16, split) on both cache kinds
_BUILDS = [
    (64, 16, True, True, False, False, "bfloat16"),
    (64, 32, False, False, True, True, "float16"),
    (64, 64, True, False, True, False, "bfloat16"),
    (128, 16, True, True, False, True, "bfloat16"),
    (128, 16, True, False, False, True, "bfloat16"),
    (128, 16, False, True, True, False, "float16"),
    (128, 32, True, True, True, True, "bfloat16"),
    (128, 64, False, False, False, False, "float16"),
    (64, 128, False, True, False, True, "float16"),
    (128, 128, True, True, True, False, "bfloat16"),
]
# fp8 caches: every config with each q dtype, the flags varied across them (an fp8 q at
# 16 and 32 rows, D 128: the swapped tile, each flag both ways; at 64 rows, D 128: the
# unswapped wgmma tile, each flag both ways)
_FP8_BUILDS = [
    (64, 32, True, True, False, False, "fp8"),
    (128, 32, False, False, False, False, "fp8"),
    (128, 16, True, True, True, False, "fp8"),
    (64, 16, True, True, False, False, "fp8"),
    (64, 16, False, False, True, True, "bf16/fp8"),
    (64, 32, False, False, True, True, "fp8"),
    (64, 32, True, True, False, False, "bf16/fp8"),
    (64, 64, True, False, True, False, "fp8"),
    (64, 64, False, True, False, True, "bf16/fp8"),
    (64, 128, False, True, False, True, "fp8"),
    (64, 128, True, False, True, False, "bf16/fp8"),
    (128, 16, True, True, False, True, "fp8"),
    (128, 16, True, False, False, True, "bf16/fp8"),
    (128, 16, False, False, True, False, "fp8"),
    (128, 16, False, True, True, False, "bf16/fp8"),
    (128, 32, True, True, True, True, "fp8"),
    (128, 32, False, False, False, False, "bf16/fp8"),
    (128, 64, False, False, False, False, "fp8"),
    (128, 64, True, True, True, True, "fp8"),
    (128, 64, True, False, True, False, "fp8"),
    (128, 64, False, True, False, True, "fp8"),
    (128, 64, True, True, True, True, "bf16/fp8"),
    (128, 128, True, True, True, False, "fp8"),
    (128, 128, False, False, False, True, "bf16/fp8"),
]
# the unswapped wgmma tile at D 64 (off the table: D 64 keeps mma.sync by default), its
# Config beside the table's (64-key blocks; no 16-bit K block: 11 stages, 100 KB)
D64_WGMMA = dict(wgmma_s=True, q8_stages=11)
_FP8_WGMMA_D64_BUILDS = [
    (64, 64, True, True, False, True, "fp8", D64_WGMMA),
    (64, 64, False, False, True, False, "fp8", D64_WGMMA),
]


def test_configs():
    """The table: keyed by (D, block_m); warps_m warps along the rows (16 each), the rest
    split the keys (16 keys at least each); the fp32 O of `store` fits the K slots; up to
    64 rows 4 warps and two CTAs an SM (the 16-bit 64-row tile at D 128: one), 128 rows
    8 warps and one, as programs_per_sm says; pick_config takes the smallest tile holding
    group * len_q rows."""
    from kernels_cute import decode_hopper as K
    assert set(K.CONFIGS) == {(d, m) for d in (64, 128) for m in (16, 32, 64, 128)}
    for (d, m), cfg in K.CONFIGS.items():
        assert cfg.block_m == m == 16 * cfg.warps_m
        assert cfg.block_n % (16 * cfg.key_groups) == 0
        assert m * d * 4 * cfg.key_groups <= K.smem_kv_bytes(cfg, d)
        ctas = K.programs_per_sm(d, m, False)
        assert ctas == (2 if (d, m) != (128, 64) and m <= 64 else 1), (d, m)
        assert cfg.warps == (4 if m <= 64 else 8)
        assert cfg.q_in_kv_slot == (m <= 64)
        used = K.smem_bytes(cfg, d) + DSL_STATIC
        assert used <= CTA_SMEM_MAX and ctas * (used + CTA_RESERVED) <= SM_SMEM, (d, m)
        # >= 32 KB of K + V in flight per CTA while one block computes
        assert (cfg.stages - 1) * 2 * cfg.block_n * d * 2 >= 32 * 1024
    # fp8: the bf16 table's tiles and warps, at most its keys (so its registers); the fp8 slots and
    # the one 16-bit block within the same CTA limits; fp32 O of `store` in the fp8 slots
    assert set(K.FP8_CONFIGS) == set(K.CONFIGS)
    # swapped (an e4m3 q, 16 and 32 rows at D 128): keys a multiple of the wgmma's M (64), a ring
    # at least as deep, both q dtypes' builds within the same limits; the same for the
    # unswapped wgmma tile (an e4m3 q, 64 rows at D 128: one warpgroup, keys a multiple of
    # the P V wgmma's K, 16)
    for (d, m), cfg in K.FP8_CONFIGS.items():
        bf = K.CONFIGS[(d, m)]
        assert (cfg.block_m, cfg.warps_m, cfg.warps) == (bf.block_m, bf.warps_m, bf.warps)
        assert cfg.block_n <= bf.block_n
        assert cfg.swap == (d == 128 and m <= 32) == cfg.swapped(True)
        assert not cfg.swapped(False)
        assert cfg.wgmma_s == (d == 128 and m == 64) == cfg.wgmma(True)
        assert not cfg.wgmma(False) and not (cfg.swap and cfg.wgmma_s)
        assert cfg.k8(True) == (cfg.swap or cfg.wgmma_s) and not cfg.k8(False)
        ctas = K.programs_per_sm(d, m, True)
        assert ctas == (2 if m <= 64 else 1), (d, m)
        for q8 in (False, True):
            stages = cfg.kv_stages(q8)
            assert K.store_bytes(cfg, d, q8) <= 2 * K.smem_kv_bytes(cfg, d, 1, q8)
            used = K.smem_bytes(cfg, d, 1, q8) + DSL_STATIC
            assert used <= CTA_SMEM_MAX and ctas * (used + CTA_RESERVED) <= SM_SMEM, (d, m)
            assert (stages - 1) * 2 * cfg.block_n * d >= 32 * 1024
            assert stages >= bf.stages
        if cfg.swap:
            assert cfg.block_n % 64 == 0 and cfg.warps == 4
        if cfg.wgmma_s:
            assert cfg.block_n % 16 == 0 and cfg.warps == cfg.warps_m == 4
        if cfg.k8(True):
            assert cfg.kv_stages(True) >= cfg.stages
    # the D 64 wgmma tile of the compile checks (D64_WGMMA) fits the same limits
    cfg = dataclasses.replace(K.FP8_CONFIGS[(64, 64)], **D64_WGMMA)
    assert cfg.wgmma(True) and not cfg.wgmma(False)
    used = K.smem_bytes(cfg, 64, 1, True) + DSL_STATIC
    assert 2 * (used + CTA_RESERVED) <= SM_SMEM
    assert K.store_bytes(cfg, 64, True) <= 2 * K.smem_kv_bytes(cfg, 64, 1, True)
    for d in (64, 128):
        assert K.pick_config(d, 5, fp8=True) == K.FP8_CONFIGS[(d, 16)]
        assert K.pick_config(d, 1) == K.pick_config(d, 16) == K.CONFIGS[(d, 16)]
        assert K.pick_config(d, 17) == K.pick_config(d, 32) == K.CONFIGS[(d, 32)]
        assert K.pick_config(d, 33) == K.pick_config(d, 64) == K.CONFIGS[(d, 64)]
        assert K.pick_config(d, 65) == K.pick_config(d, 160) == K.CONFIGS[(d, 128)]


_SCRIPT = textwrap.dedent("""
    import dataclasses, json, sys, torch
    sys.path.insert(0, {root!r})
    from kernels_cute import decode_hopper as K
    dtypes = {dtypes!r}
    for D, m, causal, paged, packed, split, dt, *over in {builds!r}:
        q_dt, kv_dt = (getattr(torch, n) for n in dtypes[dt])
        fp8 = kv_dt == torch.float8_e4m3fn
        cfg = dataclasses.replace((K.FP8_CONFIGS if fp8 else K.CONFIGS)[(D, m)],
                                  **(over[0] if over else {{}}))
        fn = K.compile_decode(q_dt, D, cfg, causal, paged, packed, split, kv_dtype=kv_dt)
        a = fn.artifacts
        print("BUILD", json.dumps(dict(key=[D, m, causal, paged, packed, split, dt, *over],
                                       ptx=a.PTX, cubin=(a.CUBIN or b"").hex())), flush=True)
    print("COMPILED")
""")


def _resources(cubin_hex):
    """(registers, spill bytes + spill instructions) from the cubin (cuobjdump), or None."""
    try:
        from harness.compile_check import _resource_usage
        use = _resource_usage(bytes.fromhex(cubin_hex))
    except Exception:  # no cuobjdump here
        return None
    return use["REG"], use["STACK"] + use["LOCAL"] + use["spill_insts"]


@needs_dsl
@pytest.mark.parametrize("builds", [
    pytest.param([b for b in _BUILDS if b[:2] == (128, 16) and b[5]], id="decode-path"),
    pytest.param([b for b in _FP8_BUILDS if b[:2] == (128, 16) and b[5]],
                 id="fp8-decode-path"),
    pytest.param([b for b in _FP8_BUILDS if b[:2] == (128, 64) and b[6] == "fp8"]
                 + _FP8_WGMMA_D64_BUILDS, id="fp8-wgmma"),
    pytest.param(_BUILDS, id="every-config", marks=pytest.mark.matrix),
    pytest.param(_FP8_BUILDS, id="fp8-every-config", marks=pytest.mark.matrix)])
def test_decode_default_builds(tmp_path, builds):
    """Each default config compiles for sm_90a (every dtype, every flag both ways): per
    key group one 16-row mma.sync m16n8k16 tile, K and V gathered by 16-byte cp.async.cg
    (L2 only) through the page table, no local memory, no spill. FP8: 16-bit products
    (f16 for an fp8 q, bf16 for a bf16 one), every cache element converted once a block
    (cvt e4m3x2 -> f16x2), the descales read once. Swapped (an e4m3 q at 16 and 32
    rows): no mma.sync; in each of the two KV loops (bulk, masked tail) S^T = K Q^T as
    e4m3 wgmmas m64nMk32 (block_n / 64 x D / 32) and O^T += V^T P^T as f16 ones m64nMk16
    (D / 64 x block_n / 16), P^T by stmatrix, V alone converted, the slots and P^T
    fenced for the async proxy. wgmma (an e4m3 q at 64 rows): no mma.sync; in each loop
    S = Q K^T as e4m3 wgmmas m64nBNk32 (D / 32) and O += P V as f16 ones m64nDk16 with A
    (P) from registers (block_n / 16), V alone converted, the slots fenced."""
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin",
               CUTE_DSL_DUMP_DIR=str(tmp_path), CUTE_DSL_DISABLE_FILE_CACHING="1")
    r = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=ROOT, builds=builds,
                                                             dtypes=_DTYPES)],
                       env=env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    if "COMPILED" not in r.stdout:
        tail = (r.stdout + r.stderr)[-3000:]
        if "libcuda" in tail or "CUDA driver" in tail:
            pytest.skip(f"CuteDSL cannot compile here: {tail[-300:]}")
        raise AssertionError(f"compile failed:\n{tail}")
    found = [json.loads(ln[6:]) for ln in r.stdout.splitlines() if ln.startswith("BUILD ")]
    assert len(found) == len(builds)
    from kernels_cute import decode_hopper as K
    for b in found:
        D, m, causal, paged, packed, split, dt, *over = b["key"]
        q_dt, kv_dt = _DTYPES[dt]
        fp8 = kv_dt == "float8_e4m3fn"
        cfg = dataclasses.replace((K.FP8_CONFIGS if fp8 else K.CONFIGS)[(D, m)],
                                  **(over[0] if over else {}))
        ptx = b["ptx"]
        mma = re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.(bf16|f16)", ptx)
        threads = 32 * cfg.warps
        if fp8 and cfg.swapped(q_dt == "float8_e4m3fn"):
            assert not mma and "mma.sync" not in ptx, b["key"]
            wg = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k(\d+)\.f32\.(\w+)\.(\w+)",
                            ptx)
            n_s = cfg.block_n // 64 * D // 32
            n_o = D // 64 * cfg.block_n // 16
            assert sorted(set(wg)) == [(str(m), "16", "f16", "f16"),
                                       (str(m), "32", "e4m3", "e4m3")], (b["key"], set(wg))
            assert wg.count((str(m), "32", "e4m3", "e4m3")) == 2 * n_s, b["key"]
            assert wg.count((str(m), "16", "f16", "f16")) == 2 * n_o, b["key"]
            assert re.search(r"stmatrix\.sync\.aligned\.m8n8\.x4", ptx), b["key"]
            assert "fence.proxy.async" in ptx, b["key"]
            # V alone, once a block in each loop (and the q stays e4m3)
            per_block = cfg.block_n * D // threads // 2
            assert len(re.findall(r"cvt\.rn\.f16x2\.e4m3x2", ptx)) == 2 * per_block, b["key"]
        elif fp8 and cfg.wgmma(q_dt == "float8_e4m3fn"):
            assert not mma and "mma.sync" not in ptx, b["key"]
            wg = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k(\d+)\.f32\.(\w+)\.(\w+)",
                            ptx)
            bn = str(cfg.block_n)
            assert sorted(set(wg)) == sorted({(str(D), "16", "f16", "f16"),
                                              (bn, "32", "e4m3", "e4m3")}), (b["key"], set(wg))
            assert wg.count((bn, "32", "e4m3", "e4m3")) == 2 * D // 32, b["key"]
            assert wg.count((str(D), "16", "f16", "f16")) == 2 * cfg.block_n // 16, b["key"]
            # P V's A from registers (a register list, not a descriptor), S's from smem
            rs = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.f16\.f16\s*"
                            r"\{[^}]*\},\s*\{", ptx)
            assert len(rs) == 2 * cfg.block_n // 16, b["key"]
            assert "stmatrix" not in ptx and "fence.proxy.async" in ptx, b["key"]
            per_block = cfg.block_n * D // threads // 2
            assert len(re.findall(r"cvt\.rn\.f16x2\.e4m3x2", ptx)) == 2 * per_block, b["key"]
        else:
            # QK: BNg/8 n-atoms x D/16 k-steps; PV: D/8 n-atoms x BNg/16 k-steps
            bng = cfg.block_n // cfg.key_groups
            assert len(mma) == bng // 8 * D // 16 + D // 8 * bng // 16, (b["key"], len(mma))
            assert set(mma) == {"bf16" if q_dt == "bfloat16" else "f16"}
            assert "wgmma" not in ptx, b["key"]
            assert re.search(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans", ptx), b["key"]
        if fp8 and not cfg.k8(q_dt == "float8_e4m3fn"):
            # K and V of a block, 2 elements a cvt, once (plus an fp8 q's, once a tile)
            per_block = 2 * cfg.block_n * D // threads // 2
            q_cvts = m * D // threads // 2 if q_dt == "float8_e4m3fn" else 0
            assert len(re.findall(r"cvt\.rn\.f16x2\.e4m3x2", ptx)) == per_block + q_cvts, \
                b["key"]
        assert re.search(r"cp\.async\.cg\.shared\.global(\.L2::\w+)?\s+\[[^]]+\],\s*\[[^]]+\],"
                         r"\s*16", ptx), b["key"]
        assert ".local" not in ptx, b["key"]
        # page table reads (one per gathered row) only where the cache is paged
        # (scalar loads: an fp8 q's 8-byte loads are ld.global.v2)
        reads = len(re.findall(r"ld\.global(?:\.(?!v\d)\w+)*\.[bs]32", ptx))
        rows_a_thread = cfg.block_n * D // (16 if fp8 else 8) // threads
        fixed = 3 + (3 if fp8 else 0)     # seqlens, cu_seqlens_q; fp8: the descales
        assert (reads >= rows_a_thread) if paged else (reads <= fixed), (b["key"], reads)
        res = _resources(b["cubin"])
        if res is not None:
            regs, spills = res
            assert spills == 0, (b["key"], res)
            assert regs <= 255, (b["key"], res)


# --------------------------------------------------------------------------------------
# GPU: against an fp32 reference
# --------------------------------------------------------------------------------------

def _reference(q, k_cache, v_cache, seqk, page_table, cu_q, len_q, causal, scale):
    """fp32 out [Nq, H, D] and lse [H, Nq] on the gathered cache."""
    Nq, H, D = q.shape
    H_kv = k_cache.shape[2]
    g = H // H_kv
    out = torch.zeros(Nq, H, D, dtype=torch.float32, device=q.device)
    lse = torch.full((H, Nq), -math.inf, dtype=torch.float32, device=q.device)
    for b in range(seqk.shape[0]):
        n_k = int(seqk[b])
        q0, n_q = (int(cu_q[b]), int(cu_q[b + 1] - cu_q[b])) if cu_q is not None else \
            (b * len_q, len_q)
        if n_q == 0 or n_k == 0:
            continue
        j = torch.arange(n_k, device=q.device)
        if page_table is None:
            k, v = k_cache[b, :n_k], v_cache[b, :n_k]
        else:
            ps = k_cache.shape[1]
            pages = page_table[b, j // ps].long()
            k, v = k_cache[pages, j % ps], v_cache[pages, j % ps]
        k = k.float().repeat_interleave(g, dim=1)           # [n_k, H, D]
        v = v.float().repeat_interleave(g, dim=1)
        qs = q[q0:q0 + n_q].float()                          # [n_q, H, D]
        s = torch.einsum("ihd,jhd->hij", qs, k) * scale      # [H, n_q, n_k]
        if causal:
            i = torch.arange(n_q, device=q.device)[:, None]
            s = s.masked_fill(j[None, :] > i + n_k - n_q, -math.inf)
        l = torch.logsumexp(s, dim=-1)                       # [H, n_q]
        p = torch.exp(s - l[..., None]).nan_to_num(0.0)
        out[q0:q0 + n_q] = torch.einsum("hij,jhd->ihd", p, v)
        lse[:, q0:q0 + n_q] = l
    return out, lse


def _case(D, group, layout, qmode, causal, splits, dtype, seed=0):
    """Run the kernel and the reference on one tiny problem; returns both."""
    from kernels_cute import decode_hopper as K
    dev = "cuda"
    gen = torch.Generator(device="cpu").manual_seed(seed)
    H_kv = 2
    H = H_kv * group
    seqk = torch.tensor([0, 1, 77, 300, 129], dtype=torch.int32)
    B = seqk.shape[0]
    if qmode == "packed":
        n_q = torch.tensor([3, 0, 5, 1, 20], dtype=torch.int32)
        cu_q = offsets(n_q)
        len_q = int(n_q.max())
        Nq = int(cu_q[-1])
    else:
        len_q = int(qmode[len("dense"):])
        cu_q, Nq = None, B * len_q
    cap = 320
    if layout == "contiguous":
        shape, page_table = (B, cap, H_kv, D), None
    else:
        ps = int(layout[len("paged"):])
        per = -(-cap // ps)
        page_table = torch.randperm(B * per, generator=gen).to(torch.int32).view(B, per)
        shape = (B * per, ps, H_kv, D)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    q = torch.randn(Nq, H, D, generator=gen).to(dtype)
    scale = D ** -0.5
    q, k_cache, v_cache, seqk = (t.to(dev) for t in (q, k_cache, v_cache, seqk))
    page_table = None if page_table is None else page_table.to(dev)
    cu_q = None if cu_q is None else cu_q.to(dev)

    nan = float("nan")
    out = torch.full((Nq, H, D), nan, dtype=dtype, device=dev)
    lse = torch.full((H, Nq), nan, dtype=torch.float32, device=dev)
    if splits == 1:
        K.forward(q, k_cache, v_cache, seqk, page_table, cu_q, out, lse, None, None,
                  len_q=len_q, causal=causal, scale=scale, num_splits=1)
    else:
        o_part = torch.full((splits, Nq, H, D), nan, dtype=torch.float32, device=dev)
        lse_part = torch.full((splits, H, Nq), nan, dtype=torch.float32, device=dev)
        K.forward(q, k_cache, v_cache, seqk, page_table, cu_q, out, lse, o_part, lse_part,
                  len_q=len_q, causal=causal, scale=scale, num_splits=splits)
        torch.cuda.synchronize()
        # every split writes every row: no NaN left anywhere; empty splits 0 / -inf
        assert not o_part.isnan().any() and not lse_part.isnan().any()
        no_key = (lse_part == -math.inf).transpose(1, 2)               # [S, Nq, H]
        assert (o_part[no_key] == 0).all()
        lse = torch.logsumexp(lse_part, dim=0)
        w = torch.exp(lse_part - lse[None]).nan_to_num(0.0)            # [S, H, Nq]
        out = (w.transpose(1, 2)[..., None] * o_part).sum(0).to(dtype)
    torch.cuda.synchronize()
    ref_out, ref_lse = _reference(q, k_cache, v_cache, seqk, page_table, cu_q, len_q,
                                  causal, scale)
    return out, lse, ref_out, ref_lse


_GPU_CASES = [
    # (D, group, layout, qmode, causal, splits, dtype)
    (128, 4, "contiguous", "dense1", True, 1, torch.bfloat16),
    (128, 4, "contiguous", "dense1", False, 3, torch.bfloat16),
    (128, 4, "paged1", "dense1", True, 3, torch.bfloat16),
    (128, 4, "paged16", "dense3", True, 1, torch.bfloat16),
    (128, 4, "paged64", "packed", True, 3, torch.bfloat16),
    (128, 4, "paged16", "packed", False, 1, torch.float16),
    (128, 1, "contiguous", "dense3", True, 3, torch.float16),
    (128, 1, "paged64", "dense1", False, 1, torch.bfloat16),
    (128, 4, "contiguous", "packed", True, 1, torch.bfloat16),
    (128, 4, "paged1", "dense16", True, 3, torch.bfloat16),
    (128, 4, "paged16", "dense8", True, 3, torch.bfloat16),
    (64, 4, "contiguous", "dense8", False, 1, torch.float16),
    (128, 8, "paged16", "dense16", True, 3, torch.bfloat16),
    (64, 8, "contiguous", "packed", False, 1, torch.bfloat16),
    (128, 8, "paged1", "packed", True, 1, torch.float16),
    (64, 4, "contiguous", "dense1", True, 3, torch.bfloat16),
    (64, 4, "paged16", "dense3", False, 1, torch.bfloat16),
    (64, 1, "paged1", "packed", True, 1, torch.float16),
    (64, 4, "paged64", "packed", False, 3, torch.bfloat16),
    (64, 1, "contiguous", "dense1", False, 1, torch.float16),
    (64, 4, "paged1", "dense16", True, 1, torch.bfloat16),
]


@pytest.mark.gpu
@pytest.mark.parametrize("D,group,layout,qmode,causal,splits,dtype", _GPU_CASES)
def test_decode_matches_reference(D, group, layout, qmode, causal, splits, dtype):
    out, lse, ref_out, ref_lse = _case(D, group, layout, qmode, causal, splits, dtype)
    assert not out.isnan().any(), "rows left unwritten (NaN)"
    assert not lse.isnan().any(), "lse rows left unwritten (NaN)"
    # rows that see no key: 0 and -inf
    empty = ref_lse == -math.inf
    assert (lse[empty] == -math.inf).all(), "a row without keys has a finite lse"
    assert (out.float().transpose(0, 1)[empty] == 0).all(), "a row without keys is not 0"
    # out rounding plus P in the input dtype, on outputs up to ~4.5 (one key: a V row)
    tol = 3e-2 if dtype == torch.bfloat16 else 6e-3
    err = (out.float() - ref_out).abs().max().item()
    lse_err = (lse[~empty] - ref_lse[~empty]).abs().max().item() if (~empty).any() else 0.0
    assert err <= tol, f"max |out - ref| = {err:.3g}"
    assert lse_err <= 1e-3, f"max |lse - ref| = {lse_err:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [None, 16])
def test_decode_through_the_core(page_size):
    """jagged.kvcache_attention(backend="cute") with the splits it chooses: a 4k-key
    sequence next to a short one, GQA 32/8, dense q [B, L_q, H, D], lse [B, H, L_q]."""
    import jagged
    dev, dt, D, H, H_kv, L_q = "cuda", torch.bfloat16, 128, 32, 8, 2
    gen = torch.Generator(device="cpu").manual_seed(1)
    seqk = torch.tensor([4096, 33], dtype=torch.int32)
    B, cap = 2, 4096
    if page_size is None:
        k_cache = torch.randn(B, cap, H_kv, D, generator=gen).to(dt)
        page_table = None
    else:
        per = cap // page_size
        page_table = torch.randperm(B * per, generator=gen).to(torch.int32).view(B, per).to(dev)
        k_cache = torch.randn(B * per, page_size, H_kv, D, generator=gen).to(dt)
    v_cache = torch.randn(k_cache.shape, generator=gen).to(dt)
    q = torch.randn(B, L_q, H, D, generator=gen).to(dt)
    q, k_cache, v_cache, seqk = (t.to(dev) for t in (q, k_cache, v_cache, seqk))
    out, lse = jagged.kvcache_attention(q, k_cache, v_cache, seqk, page_table=page_table,
                                        return_lse=True, backend="cute")
    ref_out, ref_lse = _reference(q.view(-1, H, D), k_cache, v_cache, seqk, page_table, None,
                                  L_q, True, D ** -0.5)
    assert (out.float().view(-1, H, D) - ref_out).abs().max().item() <= 3e-2
    assert (lse - ref_lse.view(H, B, L_q).permute(1, 0, 2)).abs().max().item() <= 1e-3


@pytest.mark.gpu
def test_decode_bandwidth():
    """K + V bytes read per second at the headline shape (B 1, 32k keys, L_q 1, GQA 32/8,
    D 128, bf16; splits chosen) on a contiguous cache and pages of 16 and 1, against a
    device copy of the same bytes; printed (run with -s). Passes above 40 % of the copy:
    a floor that catches a serialized pipeline, not the target (84 %)."""
    import triton
    import jagged
    dev, dt, D, H, H_kv, n = "cuda", torch.bfloat16, 128, 32, 8, 32768
    seqk = torch.tensor([n], dtype=torch.int32, device=dev)
    q = torch.randn(1, 1, H, D, device=dev, dtype=dt)
    kv_bytes = 2 * n * H_kv * D * 2
    src = torch.empty(kv_bytes // 2, dtype=dt, device=dev)
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src))
    copy_bw = 2 * kv_bytes / copy_ms / 1e9            # read + write
    lines = [f"copy {copy_bw:.2f} TB/s (read + write)"]
    for ps in (None, 16, 1):
        if ps is None:
            k = torch.randn(1, n, H_kv, D, device=dev, dtype=dt)
            pt = None
        else:
            per = n // ps
            k = torch.randn(per, ps, H_kv, D, device=dev, dtype=dt)
            pt = torch.randperm(per, device=dev).to(torch.int32).view(1, per)
        v = torch.randn_like(k)
        ms = triton.testing.do_bench(lambda: jagged.kvcache_attention(
            q, k, v, seqk, page_table=pt, backend="cute"))
        bw = kv_bytes / ms / 1e9
        lines.append(f"{'contiguous' if ps is None else f'page {ps}'}: {ms * 1e3:.1f} us, "
                     f"{bw:.2f} TB/s = {bw / copy_bw:.0%} of the copy")
        assert bw >= 0.4 * copy_bw, lines
    print("\n" + "\n".join(lines))


# --------------------------------------------------------------------------------------
# GPU, fp8 cache: against an fp32 reference on the dequantized inputs
# --------------------------------------------------------------------------------------

E4M3_MAX = 448.0


def _quantize(x, groups):
    """x fp32 -> (e4m3 x, descale [B, H_kv]): groups[b][h] is the index (a tuple of ints
    and slices) of the elements that descale[b, h] = amax / 448 covers."""
    xq = torch.empty_like(x, dtype=torch.float8_e4m3fn)
    scales = torch.ones(len(groups), len(groups[0]), dtype=torch.float32)
    for b, row in enumerate(groups):
        for h, idx in enumerate(row):
            amax = x[idx].abs().max().item() if x[idx].numel() else 0.0
            d = amax / E4M3_MAX if amax > 0 else 1.0
            scales[b, h] = d
            xq[idx] = (x[idx] / d).to(torch.float8_e4m3fn)
    return xq, scales


def _fp8_case(D, group, layout, qmode, causal, splits, q_fp8, seed=0, dev="cuda",
              config=None):
    """An fp8 cache (and an fp8 q when q_fp8, else bf16), its values spread over decades
    per (sequence, kv head) so the descales differ: the kernel's out (bf16) and lse
    beside the fp32 reference on the dequantized inputs. config: in place of the
    table's."""
    from kernels_cute import decode_hopper as K
    gen = torch.Generator(device="cpu").manual_seed(seed)
    H_kv = 2
    H = H_kv * group
    seqk = torch.tensor([0, 1, 77, 300, 129], dtype=torch.int32)
    B, cap = seqk.shape[0], 320
    if qmode == "packed":
        n_q = torch.tensor([3, 0, 5, 1, 20], dtype=torch.int32)
        cu_q = offsets(n_q)
        len_q, Nq = int(n_q.max()), int(cu_q[-1])
        q_rows = [(int(cu_q[b]), int(cu_q[b + 1])) for b in range(B)]
    else:
        len_q = int(qmode[len("dense"):])
        cu_q, Nq = None, B * len_q
        q_rows = [(b * len_q, (b + 1) * len_q) for b in range(B)]

    def spread(shape, dims):
        """randn with a magnitude of 10^U(-2, 1) per index of `dims`."""
        mag = 10 ** (torch.rand(dims, generator=gen) * 3 - 2)
        return torch.randn(shape, generator=gen), mag

    kl, km = spread((B, cap, H_kv, D), (B, H_kv))
    vl, vm = spread((B, cap, H_kv, D), (B, H_kv))
    kl, vl = kl * km[:, None, :, None], vl * vm[:, None, :, None]
    kv_groups = [[(b, slice(None), h) for h in range(H_kv)] for b in range(B)]
    kq, k_descale = _quantize(kl, kv_groups)
    vq, v_descale = _quantize(vl, kv_groups)
    k_deq = kq.float() * k_descale[:, None, :, None]
    v_deq = vq.float() * v_descale[:, None, :, None]

    q = torch.randn(Nq, H, D, generator=gen)
    q_descale = torch.ones(B, H_kv)
    if q_fp8:
        q_groups = [[(slice(r0, r1), slice(h * group, (h + 1) * group)) for h in range(H_kv)]
                    for r0, r1 in q_rows]
        q, q_descale = _quantize(q, q_groups)
        q_deq = q.float() * q_descale.repeat_interleave(
            torch.tensor([r1 - r0 for r0, r1 in q_rows]), dim=0).repeat_interleave(
            group, dim=1)[..., None]
    else:
        q = q.to(torch.bfloat16)
        q_deq = q.float()

    if layout == "contiguous":
        k_cache, v_cache, page_table = kq, vq, None
    else:
        ps = int(layout[len("paged"):])
        per = -(-cap // ps)
        page_table = torch.randperm(B * per, generator=gen).to(torch.int32).view(B, per)
        k_cache = torch.zeros(B * per, ps, H_kv, D, dtype=torch.uint8)
        v_cache = torch.zeros(B * per, ps, H_kv, D, dtype=torch.uint8)
        j = torch.arange(cap)
        for b in range(B):     # the scatter on bytes (no fp8 index_put)
            pg = page_table[b, j // ps].long()
            k_cache[pg, j % ps] = kq[b].view(torch.uint8)
            v_cache[pg, j % ps] = vq[b].view(torch.uint8)
        k_cache, v_cache = k_cache.view(torch.float8_e4m3fn), v_cache.view(torch.float8_e4m3fn)
    scale = D ** -0.5
    ref_out, ref_lse = _reference(q_deq.to(dev), k_deq.to(dev), v_deq.to(dev), seqk.to(dev),
                                  None, None if cu_q is None else cu_q.to(dev), len_q,
                                  causal, scale)
    q, k_cache, v_cache, seqk = (t.to(dev) for t in (q, k_cache, v_cache, seqk))
    page_table = None if page_table is None else page_table.to(dev)
    cu_q = None if cu_q is None else cu_q.to(dev)
    descale = tuple(t.to(dev) for t in (q_descale, k_descale, v_descale))

    nan = float("nan")
    out = torch.full((Nq, H, D), nan, dtype=torch.bfloat16, device=dev)
    lse = torch.full((H, Nq), nan, dtype=torch.float32, device=dev)
    if splits == 1:
        K.forward(q, k_cache, v_cache, seqk, page_table, cu_q, out, lse, None, None,
                  len_q=len_q, causal=causal, scale=scale, num_splits=1, descale=descale,
                  config=config)
    else:
        o_part = torch.full((splits, Nq, H, D), nan, dtype=torch.float32, device=dev)
        lse_part = torch.full((splits, H, Nq), nan, dtype=torch.float32, device=dev)
        K.forward(q, k_cache, v_cache, seqk, page_table, cu_q, None, None, o_part, lse_part,
                  len_q=len_q, causal=causal, scale=scale, num_splits=splits, descale=descale,
                  config=config)
        torch.cuda.synchronize()
        assert not o_part.isnan().any() and not lse_part.isnan().any()
        lse = torch.logsumexp(lse_part, dim=0)
        w = torch.exp(lse_part - lse[None]).nan_to_num(0.0)
        out = (w.transpose(1, 2)[..., None] * o_part).sum(0).to(torch.bfloat16)
    torch.cuda.synchronize()
    return out, lse, ref_out, ref_lse


_FP8_GPU_CASES = [
    # (D, group, layout, qmode, causal, splits, q_fp8)
    (128, 4, "contiguous", "dense1", True, 1, True),
    (128, 4, "paged16", "dense1", True, 3, True),
    (128, 4, "paged1", "dense3", False, 1, False),
    (128, 4, "paged64", "packed", True, 3, False),
    (128, 8, "paged16", "dense16", True, 3, True),
    (128, 1, "contiguous", "dense1", False, 3, False),
    (128, 8, "contiguous", "packed", True, 1, True),
    (64, 4, "contiguous", "dense1", True, 3, True),
    (64, 4, "paged16", "dense8", False, 1, False),
    (64, 8, "paged1", "packed", True, 1, True),
    (64, 4, "paged64", "dense16", True, 3, False),
    (64, 1, "contiguous", "dense3", False, 1, True),
    # an e4m3 q at 32 rows (swapped at D 128): causal with splits, GQA 8 x 3 rows, packed
    (128, 4, "paged16", "dense8", True, 3, True),
    (64, 8, "contiguous", "dense3", False, 1, True),
    (128, 1, "paged1", "packed", True, 3, True),
    # an e4m3 q at 64 rows (the unswapped wgmma tile at D 128): GQA 4 x 16 rows causal
    # with splits, GQA 8 x 8 rows, GQA 2 x up to 20 packed rows on pages of 1
    (128, 4, "paged16", "dense16", True, 3, True),
    (128, 8, "contiguous", "dense8", False, 1, True),
    (128, 2, "paged1", "packed", True, 1, True),
    (128, 4, "paged64", "dense16", False, 3, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("D,group,layout,qmode,causal,splits,q_fp8", _FP8_GPU_CASES)
def test_decode_fp8_matches_reference(D, group, layout, qmode, causal, splits, q_fp8):
    """Out (bf16) and lse against fp32 on the dequantized inputs: the products see the
    exact e4m3 values, so the error is P's rounding (f16 / bf16) and the bf16 out, as
    with a bf16 cache; scaled by the largest |V| (values spread over decades). An e4m3
    q at 16, 32 and 64 rows (D 128: the swapped and the wgmma tiles) takes its scores
    from an fp8 wgmma, whose accumulation keeps fewer bits than fp32 (TLX's twin: lse
    within 3.8e-3 of float64 on an H100): its lse is allowed 1e-2, as TLX's, far below
    what e4m3 costs q itself."""
    _check_fp8(*_fp8_case(D, group, layout, qmode, causal, splits, q_fp8), q_fp8)


@pytest.mark.gpu
@pytest.mark.parametrize("group,layout,qmode,causal,splits", [
    (4, "paged16", "dense16", True, 3), (8, "contiguous", "dense8", False, 1),
    (2, "paged1", "packed", True, 1)])
def test_decode_fp8_wgmma_d64(group, layout, qmode, causal, splits):
    """The unswapped wgmma tile at D 64 (an e4m3 q, 64 rows; off the table, by config:
    D64_WGMMA), as test_decode_fp8_matches_reference."""
    from kernels_cute import decode_hopper as K
    cfg = dataclasses.replace(K.FP8_CONFIGS[(64, 64)], **D64_WGMMA)
    _check_fp8(*_fp8_case(64, group, layout, qmode, causal, splits, True, config=cfg), True)


def _check_fp8(out, lse, ref_out, ref_lse, q_fp8):
    """test_decode_fp8_matches_reference's checks."""
    assert out.dtype == torch.bfloat16
    assert not out.isnan().any() and not lse.isnan().any(), "rows left unwritten (NaN)"
    empty = ref_lse == -math.inf
    assert (lse[empty] == -math.inf).all(), "a row without keys has a finite lse"
    assert (out.float().transpose(0, 1)[empty] == 0).all(), "a row without keys is not 0"
    # per row: relative to the row's largest reference value (rows of different
    # sequences / heads differ by decades)
    ref_mag = ref_out.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
    err = ((out.float() - ref_out).abs() / ref_mag).max().item()
    lse_err = (lse[~empty] - ref_lse[~empty]).abs().max().item() if (~empty).any() else 0.0
    assert err <= 2e-2, f"max |out - ref| / row max = {err:.3g}"
    lse_tol = 1e-2 if q_fp8 else 2e-3
    assert lse_err <= lse_tol, f"max |lse - ref| = {lse_err:.3g}"


@pytest.mark.gpu
def test_decode_fp8_bandwidth():
    """The headline shape (B 1, 32k keys, L_q 1, GQA 32/8, D 128, splits chosen) with an
    fp8 cache (fp8 q) against the bf16 cache: time, bytes per second of the fp8 cache
    against a device copy, and the speedup in tokens per second; printed (run with -s).
    Passes above 40 % of the copy and 1.2x the bf16 cache (floors that catch a serialized
    pipeline or a conversion-bound loop, not the targets: 80 %, 1.8x)."""
    import triton
    import jagged
    dev, D, H, H_kv, n = "cuda", 128, 32, 8, 32768
    seqk = torch.tensor([n], dtype=torch.int32, device=dev)
    src = torch.empty(n * H_kv * D, dtype=torch.bfloat16, device=dev)   # fp8 K + V bytes
    dst = torch.empty_like(src)
    copy_bw = 2 * src.numel() * 2 / triton.testing.do_bench(lambda: dst.copy_(src)) / 1e9
    lines = [f"copy {copy_bw:.2f} TB/s (read + write)"]
    for ps in (None, 16):
        shape = (1, n, H_kv, D) if ps is None else (n // ps, ps, H_kv, D)
        pt = None if ps is None else \
            torch.randperm(n // ps, device=dev).to(torch.int32).view(1, n // ps)
        k16 = torch.randn(shape, device=dev, dtype=torch.bfloat16)
        v16 = torch.randn_like(k16)
        q16 = torch.randn(1, 1, H, D, device=dev, dtype=torch.bfloat16)
        k8, v8, q8 = (t.to(torch.float8_e4m3fn) for t in (k16, v16, q16))
        ones = torch.ones(1, H_kv, device=dev)
        ms16 = triton.testing.do_bench(lambda: jagged.kvcache_attention(
            q16, k16, v16, seqk, page_table=pt, backend="cute"))
        ms8 = triton.testing.do_bench(lambda: jagged.kvcache_attention(
            q8, k8, v8, seqk, page_table=pt, q_descale=ones, k_descale=ones,
            v_descale=ones, backend="cute"))
        bw8 = 2 * n * H_kv * D / ms8 / 1e9
        where = "contiguous" if ps is None else f"page {ps}"
        lines.append(f"{where}: fp8 {ms8 * 1e3:.1f} us ({bw8:.2f} TB/s = "
                     f"{bw8 / copy_bw:.0%} of the copy), bf16 {ms16 * 1e3:.1f} us: "
                     f"{ms16 / ms8:.2f}x tokens/s")
        assert bw8 >= 0.4 * copy_bw and ms16 / ms8 >= 1.2, lines
    print("\n" + "\n".join(lines))
