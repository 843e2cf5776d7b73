"""The CuteDSL Blackwell forward (kernels_cute/fwd_blackwell.py) compiles for sm_100a on a
CPU-only machine; on a B200 (`-m gpu`) it matches the oracle.

Each build compiles in a fresh process with CUTE_DSL_ARCH=sm_100a (the DSL reads it at
import) on symbolic tensors, keeps its PTX and cubin, and is checked for what the design
relies on: tcgen05 MMAs (exactly the count the roles issue), one TMEM allocation freed
once (512 columns, the layout within them), CLC queries, the setmaxnreg split filling
the register file, shared memory within 227 KB, no spills or stack (ptxas -v on the PTX),
1-CTA clusters (cta_group::1). GQA and the lengths are runtime values: one build serves
them. By default three builds (two at a time) cover D 64 / 128, causal, broadcast-Q (one
packing GQA heads into a tile's rows), bf16 / fp16; with `-m matrix` every (D, causal,
broadcast-Q, dtype) and the non-default configs (static schedule, late TMEM release)
compile too, and the first default for sm_103a (B300,
which dispatch sends here too) passes the same checks.
"""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from _blackwell import (b200_matrix, check_cute, check_on_b200, cute_tests,
                        forward_fn, packing_call, problem, skip_unless_b200)
from _cute import have_dsl
from _interp import interp

_ok, _why = have_dsl()
needs_dsl = pytest.mark.skipif(not _ok, reason=_why)

_BODY = """
    from kernels_cute import fwd_blackwell as F
    cfg = F.Config(**{cfg!r})
    k = F.build(dt, {D}, {causal}, {bq}, cfg)
    F.compile_forward(dt, {D}, {causal}, {bq}, cfg, kernel=k)
    print("INFO " + json.dumps(dict(tmem_total=k.tmem_total, tmem_o=k.tmem_o,
          smem=k.shared_storage.size_in_bytes(), cluster=list(k.cluster_shape),
          threads=k.num_threads)))
    print("COMPILED")
"""

# the third: broadcast-Q packing 8 GQA heads into a tile's rows (Config.pack), causal
DEFAULT = [(128, False, False, "bf16", {}), (64, True, True, "fp16", {}),
           (128, True, True, "bf16", {"pack": 8})]
MATRIX = [(d, c, b, dt, {}) for d in (64, 128) for c in (False, True) for b in (False, True)
          for dt in ("bf16", "fp16")] + [
    (128, True, False, "bf16", {"clc": False}),
    (64, False, True, "bf16", {"early_release": False})]


def _check(variant, info, ptx, log):
    D, causal, bq, dtype, cfg = variant
    # QK: 2 halves x (prologue + loop) x D / 16 k-steps; PV: 2 halves x 128 / 16;
    # 512 threads x 128 registers
    check_cute(variant, info, ptx, log, 4 * D // 16 + 2 * 128 // 16, 512, 128)
    assert info["tmem_o"] == [256, 256 + D] and info["tmem_total"] == 256 + 2 * D
    # a programmatic dependent of the list kernel: one wait, before any global access
    assert len(re.findall(r"griddepcontrol\.wait;", ptx)) == 1
    clc = cfg.get("clc", True)
    assert ("clusterlaunchcontrol.try_cancel" in ptx) == clc
    incs = [int(v) for v in re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", ptx)]
    decs = sorted(int(v) for v in re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+)", ptx))
    assert len(incs) == 1 and len(decs) == 2, (incs, decs)
    assert 2 * incs[0] + sum(decs) <= 512                  # 4 warpgroups, 64K registers


test_default_builds, test_compile_matrix, test_default_build_sm103 = cute_tests(
    _BODY, DEFAULT, MATRIX, _check)


def test_configs():
    """One default per (D, causal), all on FA4's sm100 shapes; pick_config reads it."""
    from kernels_cute import fwd_blackwell as F
    assert set(F.CONFIGS) == {(d, c) for d in (64, 128) for c in (False, True)}
    for (d, c), cfg in F.CONFIGS.items():
        assert cfg.block_m == 2 * F.HALF_M and cfg.block_n == 128
        assert cfg.num_buffers_kv == 3 and cfg.clc and cfg.early_release
        assert F.pick_config(d, 4096, c, 100.0) is cfg
    assert 2 * F.SOFTMAX_REGS + F.CORRECTION_REGS + F.OTHER_REGS == 512


# ------------------------------------------------------------------------------ B200
@b200_matrix
def test_matches_oracle_on_b200(mode, causal, head_dim, dtype):
    """Every mode against the oracle (out and lse), GQA at D = 64, zero-length and
    length-1 sequences planted."""
    skip_unless_b200()
    from kernels_cute import fwd_blackwell as F
    check_on_b200(problem(mode, causal, head_dim, dtype, 2 if head_dim == 64 else 4, 300),
                  forward_fn(F.forward), backward=False)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_packed_on_b200(causal, head_dim):
    """Broadcast-Q with a short L_q under GQA (L_q 16, H 32 / H_kv 4: 8 heads a tile's
    rows, jagged.tiles.gqa_pack) against the oracle."""
    skip_unless_b200()
    from jagged.tiles import gqa_pack
    from kernels_cute import fwd_blackwell as F
    assert gqa_pack(True, 16, 8, F.Config().block_m) == 8
    check_on_b200(problem("broadcast_q", causal, head_dim, "bf16", 4, 16, heads=32),
                  forward_fn(F.forward), backward=False)


@pytest.mark.gpu
def test_many_tiles_per_cta_on_b200():
    """More tiles than SMs: CLC hands most of them out; the oracle checks them all."""
    skip_unless_b200()
    from harness.oracle import check
    from harness.problems import Problem
    from kernels_cute import fwd_blackwell as F
    for causal in (False, True):
        p = Problem(batch=64, heads=16, kv_heads=4, head_dim=128, max_seqlen_q=2048,
                    sparsity=0.5, causal=causal, seed=7)
        rep = check(p.build("cuda"), forward_fn(F.forward), causal=causal, backward=False)
        assert rep.ok, f"{p.label()}\n{rep}"


def _check_split(T, vis, t):
    """tile_of's KV split against vis [rows, blocks, keys] (which keys each tile row
    sees): n_end - 1 the last block any row sees, [0, n_bulk_s) the blocks every row of
    half s sees."""
    from kernels_cute import fwd_blackwell as F
    HM = F.HALF_M
    any_ = vis.any(2).any(0)
    n_end = int(any_.nonzero().max()) + 1 if any_.any() else 0
    assert T.n_end == n_end, (t, T)
    for s, nb in enumerate((T.n_bulk0, T.n_bulk1)):
        full = vis[s * HM:(s + 1) * HM, :n_end].all(2).all(0).tolist()
        assert nb == (full.index(False) if False in full else n_end), (t, s, T)


def test_tile_decode_covers_the_list():
    """tile_of (traced in every role, run here on ints) visits every (valid pair, head)
    of the shared longest-first list exactly once, in list order (a chunk's pairs, then
    its heads), and its KV split is exact: blocks [0, n_bulk_s) are visible to every row
    of half s, block n_end - 1 to some row of the tile, none past it (bottom-right
    causal; zero-length and length-1 sequences included)."""
    import torch
    from harness.problems import offsets
    from jagged.seqinfo import causal_visible_ref
    from jagged.tiles import longest_first_tiles
    from kernels_cute import fwd_blackwell as F
    BM, BN = 256, 128
    for lq, lk in (([300, 0, 1, 700], [300, 0, 1, 700]), ([5, 1, 600], [900, 0, 130])):
        cu_q, cu_k = offsets(torch.tensor(lq)), offsets(torch.tensor(lk))
        for causal in (False, True):
            pairs, count, nblk = longest_first_tiles(cu_q, cu_k, len(lq), max(lq), None,
                                                     BM, BN, causal)
            n, H = int(count[0]), 3
            sched = F.Sched([int(x) for x in pairs], [n], cu_q.tolist(), cu_k.tolist(), 0,
                            H, 1, nblk)
            seen = []
            for t in range(n * H):
                T = F.tile_of(t, sched, BM, BN, causal, False)
                b = [i for i in range(len(lq)) if cu_q[i] == T.seq.q_start and
                     lq[i] == T.seq.len_q and lk[i] == T.seq.len_k][0]
                seen.append((b * nblk + T.m0 // BM, T.h))
                assert 0 <= T.m0 < lq[b]

                nb_max = -(-lk[b] // BN) + 1
                i = torch.arange(T.m0, T.m0 + BM)[:, None]
                j = torch.arange(nb_max * BN)[None, :]
                vis = (j < lk[b]) & (causal_visible_ref(i, j, lq[b], lk[b]) if causal
                                     else torch.ones_like(i * j, dtype=torch.bool))
                _check_split(T, vis.reshape(BM, nb_max, BN), t)
            assert sorted(seen) == sorted({(int(p), h) for p in pairs[:n] for h in range(H)})
            order = [p for p, _ in seen]
            assert order[:min(nblk, n)] == [int(p) for p in pairs[:min(nblk, n)]]


@interp
def test_host_launches_a_packing_build(monkeypatch):
    """host.forward with this architecture's kernels (the tile list in the interpreter,
    the kernel a recorder): a broadcast-Q GQA call with a short L_q launches the build
    with Config.pack = G on the packed q, L_q * G rows, group 1, B * nblk * H_kv tiles
    (past one wave: the list; one wave runs without, test_fwd_direct_blackwell.py)."""
    from dataclasses import replace

    import torch
    from jagged.tiles import fwd_tiles, pack_heads
    from kernels_cute import fwd_blackwell as F
    from kernels_cute import host

    calls = []
    monkeypatch.setattr(host, "num_sms", lambda dev: 8)
    kern = F.KERNELS._replace(compiled=lambda *key: lambda *a: calls.append((key, a)),
                              programs=lambda cfg, n, dev: n)
    D = 128
    q, k, cu, B, L_q, G, Hkv = packing_call(D)
    H = q.shape[1]
    for causal in (False, True):
        calls.clear()
        host.forward(kern, q, k, k, None, cu, L_q, 100, causal, 0.125, True)
        (key, args), = calls
        cfg = replace(F.pick_config(D, 100, causal), pack=G)
        assert key == (q.dtype, D, causal, True, cfg)
        assert torch.equal(args[0], pack_heads(q, G))
        pairs, count, nblk = fwd_tiles(None, cu, B, L_q * G, L_q * G, cfg.block_m,
                                       cfg.block_n, causal)
        assert torch.equal(args[7], pairs) and torch.equal(args[8], count)
        assert args[-4:] == (L_q * G, 1, nblk, B * nblk * Hkv)
        assert args[3].shape == (B * L_q, H, D) and args[4].shape == (H, B * L_q)


def test_tile_decode_packed():
    """Broadcast-Q packing G heads (Config.pack): tile row r is query row r // G of L_q,
    so tile_of's causal split is that of the query rows a tile holds: blocks [0, n_bulk_s)
    visible to every row of half s, block n_end - 1 to some row, none past it."""
    import torch
    from harness.problems import offsets
    from jagged.seqinfo import causal_visible_ref
    from jagged.tiles import longest_first_tiles
    from kernels_cute import fwd_blackwell as F
    BM, BN, H = 256, 128, 2
    for L_q, G, lk in ((16, 8, [300, 0, 1, 700]), (48, 4, [40, 600, 129])):
        L_t = L_q * G
        cu_k = offsets(torch.tensor(lk))
        pairs, count, nblk = longest_first_tiles(None, cu_k, len(lk), L_t, L_t, BM, BN, True)
        n = int(count[0])
        sched = F.Sched([int(x) for x in pairs], [n], None, cu_k.tolist(), L_t, H, 1, nblk)
        for t in range(n * H):
            T = F.tile_of(t, sched, BM, BN, True, True, G)
            b = T.seq.out_start // L_t
            assert T.seq.len_q == L_t and T.seq.len_k == lk[b]
            nb_max = -(-lk[b] // BN) + 1
            q_row = torch.arange(T.m0, T.m0 + BM)[:, None] // G
            j = torch.arange(nb_max * BN)[None, :]
            vis = (j < lk[b]) & causal_visible_ref(q_row, j, L_q, lk[b])
            _check_split(T, vis.reshape(BM, nb_max, BN), t)


_TMEM_MAP = textwrap.dedent("""
    import cutlass, cutlass.cute as cute
    import cutlass.utils.blackwell_helpers as sm100
    from cutlass import Float32
    from cutlass.cute.nvgpu import tcgen05
    FOUND = {}

    @cute.jit
    def check():
        K = cute.nvgpu.OperandMajorMode.K
        mma = sm100.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, K, K, Float32,
                                           tcgen05.CtaGroup.ONE, (128, 128))
        thr = mma.get_slice(0)
        acc = thr.make_fragment_C(thr.partition_shape_C((128, 128)))[(None, None), 0, 0]
        crd = thr.partition_C(cute.make_identity_tensor((128, 128)))[(None, None), 0, 0]
        tP = cute.make_tensor(acc.iterator + 64,
                              cute.composition(acc.layout, cute.make_layout((128, 64))))
        for t in (0, 37, 127):
            ld = tcgen05.make_tmem_copy(cute.make_copy_atom(
                tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(32)), Float32), acc
            ).get_slice(t)
            c = ld.partition_D(crd)
            st = tcgen05.make_tmem_copy(cute.make_copy_atom(
                tcgen05.copy.St32x32bOp(tcgen05.copy.Repetition(16)), Float32), tP
            ).get_slice(t)
            p = st.partition_S(cute.make_identity_tensor((128, 64)))
            FOUND[t] = ([c[i] for i in range(cute.size(c))], [p[i] for i in range(cute.size(p))],
                        cute.size(c, mode=[2]), cute.size(p, mode=[2]))
""")


@needs_dsl
def test_tmem_register_map(tmp_path):
    """What the softmax relies on (the same atoms as the kernel): thread t of a warpgroup
    reads TMEM lane t = row t of S, its i-th register is column i, 32 to a chunk; P's
    chunk k is the 16 packed words written to S's fp32 columns 64 + 16k on."""
    (tmp_path / "tmem_map.py").write_text(_TMEM_MAP)
    env = dict(os.environ, CUTE_DSL_ARCH="sm_100a", CUTE_DSL_DISABLE_FILE_CACHING="1")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import sys, json
        sys.path.insert(0, {str(tmp_path)!r})
        import cutlass.cute as cute, tmem_map as m
        cute.compile(m.check)
        print("FOUND " + json.dumps({{t: [[list(x) for x in s], [list(x) for x in p], a, b]
                                       for t, (s, p, a, b) in m.FOUND.items()}}))
    """)], env=env, capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert "FOUND " in r.stdout, (r.stdout + r.stderr)[-3000:]
    found = json.loads(r.stdout.split("FOUND ", 1)[1].splitlines()[0])
    for t, (s_crd, p_crd, s_chunks, p_chunks) in found.items():
        assert s_crd == [[int(t), i] for i in range(128)] and s_chunks == 4
        assert p_crd == [[int(t), i] for i in range(64)] and p_chunks == 4
