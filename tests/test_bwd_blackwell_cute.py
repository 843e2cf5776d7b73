"""The CuteDSL Blackwell backward (kernels_cute/bwd_blackwell.py) compiles for sm_100a on a
CPU-only machine; on a B200 (`-m gpu`) it matches the oracle.

Each build compiles in a fresh process with CUTE_DSL_ARCH=sm_100a (the DSL reads it at
import) on symbolic tensors, keeps its PTX, and is checked for what the design relies on:
tcgen05 MMAs (exactly the count the mma role issues: S^T and dP^T over D / 16 k-blocks,
dV, dK and dQ over 128 / 16), one TMEM allocation of 512 columns freed once with the
layout within them, 1-CTA MMAs, shared memory within 227 KB, no spills or stack (ptxas -v
on the PTX), and the Q loop's split: the bulk step's body has no mask selects (the split's
arithmetic: test_bwd_blackwell_cute_split.py). GQA, dlse and the lengths are runtime
values: one build serves them. By default one build (D 128, packed, bf16); with
`-m matrix` every (D, causal, broadcast-Q, dtype), and the default for sm_103a (B300,
which dispatch sends here too) with the same checks.
"""
import re

import pytest
from _blackwell import (SMEM_LIMIT, TMEM_COLS, b200_matrix, backward_fn, check_cute, check_on_b200,
                        cute_tests, problem, skip_unless_b200)

_BODY = """
    from kernels_cute import bwd_blackwell as F
    k = F.build(dt, {D}, {causal}, {bq})
    F.compile_main(dt, {D}, {causal}, {bq}, kernel=k)
    print("INFO " + json.dumps(dict(
        tmem_total=k.tmem_total, tmem=[k.tmem_s, k.tmem_dp, k.tmem_dv, k.tmem_dk, k.tmem_p,
                                       k.tmem_dq],
        smem=k.shared_storage.size_in_bytes(), cluster=list(k.cluster_shape),
        threads=k.num_threads)))
    print("COMPILED")
"""

DEFAULT = [(128, False, False, "bf16"), (128, False, True, "bf16")]
MATRIX = [(d, c, b, dt) for d in (64, 128) for c in (False, True) for b in (False, True)
          for dt in ("bf16", "fp16") if (d, c, b, dt) not in DEFAULT]


def _check(variant, info, ptx, log):
    D, causal, bq, dtype = variant
    if D == 128 and bq:
        return _check_pair(variant, info, ptx, log)
    # S^T, dP^T over D / 16 k-blocks; dV, dK, dQ over 128 / 16; 384 threads x 168 registers
    check_cute(variant, info, ptx, log, 2 * D // 16 + 3 * 128 // 16, 384, 168)
    assert "cp.reduce.async.bulk.tensor" in ptx             # the dQ reduce-add
    # the Q loop's split: two step bodies of 128 exp2 a thread (its key's P^T row), the
    # masked one first; the mask (P^T = 0: one select an element) in it only, so the
    # bulk body (its exp2 after the last select) has none
    ex2 = [m.start() for m in re.finditer(r"\bex2\.approx", ptx)]
    zero = [m.start() for m in re.finditer(
        r"selp\.f32\s+[^,]+,\s*(?:0f00000000,\s*[^,]+|[^,]+,\s*0f00000000),", ptx)]
    assert len(ex2) == 2 * 128 and len(zero) == 128, (len(ex2), len(zero))
    assert ex2[0] < min(zero) and max(zero) < ex2[128]
    # a programmatic dependent launch: one wait before any global access, one trigger
    assert len(re.findall(r"griddepcontrol\.wait;", ptx)) == 1
    assert len(re.findall(r"griddepcontrol\.launch_dependents;", ptx)) == 1
    # S^T, dP^T, dV, dK; P^T over S^T's upper half, dQ over dP^T
    assert info["tmem"] == [0, 128, 256, 256 + D, 64, 128], info
    assert info["tmem_total"] == 256 + 2 * D <= TMEM_COLS


def _check_pair(variant, info, ptx, log):
    """The pair build (broadcast-Q, D = 128): cta_group::2 throughout, a (2, 1, 1) cluster,
    the leader's MMAs, the dS halves exchanged by one bulk copy a step body."""
    assert ptx is not None, f"{variant} did not compile:\n{log}"
    # S^T, dP^T over D / 16; dV, dK over 128 / 16; dQ over the pair's 2 x 128 keys / 16
    mma = re.findall(r"tcgen05\.mma\.cta_group::2\.kind::f16", ptx)
    assert len(mma) == 2 * 128 // 16 + 2 * 128 // 16 + 2 * 128 // 16, len(mma)
    assert "cta_group::1" not in ptx                  # one group size a kernel (PTX rule)
    for op in (r"alloc\.cta_group::2", r"dealloc\.cta_group::2",
               r"relinquish_alloc_permit\.cta_group::2"):
        assert len(re.findall(r"tcgen05\." + op, ptx)) == 1, op
    # every commit reaches both CTAs' barriers
    commits = re.findall(r"tcgen05\.commit\.[^ ]+", ptx)
    assert len(commits) == 5 and all("multicast::cluster" in c for c in commits), commits
    # the TMA loads signal the leader's barrier (the peer bit cleared)
    loads = re.findall(r"cp\.async\.bulk\.tensor\.\S+\.global\.\S+", ptx)
    assert loads and all(x.endswith("cta_group::2") for x in loads), loads
    assert "and.b32" in ptx and "-16777217" in ptx
    # dS: the other query half to the peer, one copy in each of the two step bodies
    assert len(re.findall(r"cp\.async\.bulk\.shared::cluster\.shared::cta\.mbarrier", ptx)) == 2
    assert "cp.reduce.async.bulk.tensor" in ptx
    assert len(re.findall(r"\bex2\.approx", ptx)) == 2 * 128
    assert info["cluster"] == [2, 1, 1] and info["threads"] == 384
    # S^T, dP^T, dV, dK; P^T over S^T's lower half, dS^T over dP^T's, dQ (64 columns)
    # over dP^T's upper half
    assert info["tmem"] == [0, 128, 256, 384, 0, 192], info
    assert info["tmem_total"] == TMEM_COLS
    assert info["smem"] <= SMEM_LIMIT, info
    assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log), log
    assert re.search(r"\b0 bytes stack frame", log), log
    assert int(re.search(r"Used (\d+) registers", log).group(1)) <= 168


test_default_builds, test_compile_matrix, test_default_build_sm103 = cute_tests(
    _BODY, DEFAULT, MATRIX, _check)

# tiles split over CTAs (jagged.tiles.bwd_parts): the 1-CTA build, 8 parts
_SPLIT_BODY = _BODY.replace("F.build(dt, {D}, {causal}, {bq})",
                            "F.build(dt, {D}, {causal}, {bq}, parts=8)").replace(
    "kernel=k)", "kernel=k, parts=8)")


def _check_split(variant, info, ptx, log):
    """The whole build's checks, but dK / dV added into fp32 from the store's TMEM reads:
    D / 2 red.global.add.v2.f32 each a thread (a key row's column pairs)."""
    D = variant[0]
    check_cute(variant, info, ptx, log, 2 * D // 16 + 3 * 128 // 16, 384, 168)
    assert len(re.findall(r"red\.global\.add\.v2\.f32", ptx)) == D, ptx.count("red.global")
    assert len(re.findall(r"\bex2\.approx", ptx)) == 2 * 128
    assert len(re.findall(r"griddepcontrol\.wait;", ptx)) == 1


test_split_builds, test_split_matrix, _ = cute_tests(
    _SPLIT_BODY, [(128, True, False, "bf16")], [(64, False, False, "fp16")], _check_split)


def test_configs():
    """One Q / dO ring depth per head dim, within the smem limit (checked at compile); the
    pair build for broadcast-Q at D = 128 only."""
    from kernels_cute import bwd_blackwell as F
    assert set(F.CONFIGS) == {64, 128}
    assert F.pick_config(64).q_stages == 2 and F.pick_config(128).q_stages == 1
    for d in (64, 128):
        for bq in (False, True):
            assert F.pick_config(d, bq).two_cta == (d == 128 and bq)


def test_pair_grid():
    """Pairs pinned to KV heads as programs are: an even grid, a multiple of the pairs'
    heads, at least one pair a head."""
    from kernels_cute.bwd_blackwell import pair_grid
    assert pair_grid(148, 1) == 148 and pair_grid(147, 1) == 146
    assert pair_grid(144, 4) == 144 and pair_grid(4, 4) == 8 and pair_grid(148, 37) == 148
    for g in range(1, 300):
        for hkv in (1, 2, 3, 8):
            n = pair_grid(g // hkv * hkv or hkv, hkv)
            assert n % 2 == 0 and (n // 2) % hkv == 0


@pytest.mark.parametrize("D,bq", [(64, False), (64, True), (128, False), (128, True)])
def test_dispatch(monkeypatch, D, bq):
    """On compute capability 10.x (mocked) the CuteDSL backward is this module; its main
    launch builds the pair kernel (a (2, 1, 1) cluster, an even grid of pairs) exactly for
    broadcast-Q at D = 128, the 1-CTA one (1-CTA clusters, the call's grid) otherwise."""
    import torch

    from jagged import dispatch
    from kernels_cute import bwd_blackwell as F, host
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (10, 0))
    assert dispatch.kernel_arch(0) == "blackwell"

    seen = {}

    def compiled(cache, make, dtype, head_dim, causal, broadcast_q, cfg, options, kernel,
                 parts):
        k = F.build(dtype, head_dim, causal, broadcast_q, cfg, parts)
        seen.update(cfg=cfg, cluster=k.cluster_shape, cls=type(k).__name__, parts=parts)
        return lambda *args: seen.update(grid=args[-1])
    monkeypatch.setattr(host, "compiled", compiled)
    monkeypatch.setattr(F, "kv_tiles", lambda *a: (None, None, None))
    H, HKV, grid = 8, 2, 148
    q = torch.zeros(16, H, D, dtype=torch.bfloat16)
    k = torch.zeros(300, HKV, D, dtype=torch.bfloat16)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    call = host.BwdCall(q, k, k, q, None, None, None, None, None, None if bq else cu, cu,
                        200, False, 1.0, bq, 16 if bq else 0, 1, H // HKV, grid, None)
    F._main(call, F._parts(call))
    assert seen["parts"] == 1       # 16 query rows a sequence: whole tiles
    pair = D == 128 and bq
    assert seen["cfg"].two_cta == pair
    assert seen["cls"] == ("BwdBlackwellPair" if pair else "BwdBlackwell")
    assert seen["cluster"] == ((2, 1, 1) if pair else (1, 1, 1))
    assert seen["grid"] == (F.pair_grid(grid, HKV) if pair else grid)
    # the launch hands the cluster shape to the driver
    launched = {}

    class _Kernel:
        def launch(self, **kw):
            launched.update(kw)
    k_ = F.build(torch.bfloat16, D, False, bq)
    k_.launch(_Kernel(), seen["grid"], None)
    assert launched["cluster"] == list(seen["cluster"])
    assert launched["grid"] == [seen["grid"], 1, 1]


# ------------------------------------------------------------------------------ B200
@b200_matrix
def test_matches_oracle_on_b200(mode, causal, head_dim, dtype):
    """Every mode against the oracle (dq, dk, dv, with a gradient on lse; the portable
    forward), GQA at D = 64, zero-length and length-1 sequences planted."""
    skip_unless_b200()
    from kernels_cute import bwd_blackwell as B
    check_on_b200(problem(mode, causal, head_dim, dtype, 2 if head_dim == 64 else 4, 300),
                  backward_fn("cute_bw_bwd_check", B.backward), backward=True)
