"""The CuteDSL Blackwell backward (kernels_cute/bwd_blackwell.py) compiles for sm_100a on a
CPU-only machine; on a B200 (`-m gpu`) it matches the oracle.

Each build compiles in a fresh process with CUTE_DSL_ARCH=sm_100a (the DSL reads it at
import) on symbolic tensors, keeps its PTX, and is checked for what the design relies on:
tcgen05 MMAs (exactly the count the mma role issues: S^T and dP^T over D / 16 k-blocks,
dV, dK and dQ over 128 / 16), one TMEM allocation of 512 columns freed once with the
layout within them, 1-CTA MMAs, shared memory within 227 KB, no spills or stack (ptxas -v
on the PTX). GQA, dlse and the lengths are runtime values: one build serves them. By
default one build (D 128, packed, bf16); with `-m matrix` every (D, causal, broadcast-Q,
dtype).
"""
import os
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from _cute import ROOT, have_dsl

_ok, _why = have_dsl()
needs_dsl = pytest.mark.skipif(not _ok, reason=_why)

SMEM_LIMIT = 227 * 1024
TMEM_COLS = 512

_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, {root!r})
    import cutlass.utils, cutlass.utils.hardware_info as hw

    class _Sms:  # the SM count without a driver (nothing here should ask for it)
        def __init__(self, *a): pass
        def get_device_multiprocessor_count(self): return 148
        def get_max_active_clusters(self, n, *a): return 148 // n
    cutlass.utils.HardwareInfo = hw.HardwareInfo = _Sms

    from kernels_cute import bwd_blackwell as F
    dt = {{"bf16": torch.bfloat16, "fp16": torch.float16}}[{dtype!r}]
    k = F.build(dt, {D}, {causal}, {bq})
    F.compile_main(dt, {D}, {causal}, {bq}, kernel=k)
    print("INFO " + json.dumps(dict(
        tmem_total=k.tmem_total, tmem=[k.tmem_s, k.tmem_dp, k.tmem_dv, k.tmem_dk, k.tmem_p,
                                       k.tmem_dq],
        smem=k.shared_storage.size_in_bytes(), cluster=list(k.cluster_shape),
        threads=k.num_threads)))
    print("COMPILED")
""")

DEFAULT = [(128, False, False, "bf16")]
MATRIX = [(d, c, b, dt) for d in (64, 128) for c in (False, True) for b in (False, True)
          for dt in ("bf16", "fp16") if (d, c, b, dt) not in DEFAULT]


def _ptxas():
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "ptxas-blackwell")


def _build(tmp_path, variant):
    """Compile one variant in its own process -> (info dict, PTX text, ptxas -v log)."""
    import json
    D, causal, bq, dtype = variant
    d = tmp_path / f"d{D}_c{int(causal)}_b{int(bq)}_{dtype}"
    d.mkdir()
    env = dict(os.environ, CUTE_DSL_ARCH="sm_100a", CUTE_DSL_KEEP="ptx,cubin",
               CUTE_DSL_DUMP_DIR=str(d), CUTE_DSL_DISABLE_FILE_CACHING="1")
    script = _SCRIPT.format(root=ROOT, D=D, causal=causal, bq=bq, dtype=dtype)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                       text=True, timeout=600, cwd=str(d))
    if "COMPILED" not in r.stdout:
        return None, None, (r.stdout + r.stderr)[-3000:]
    info = json.loads(r.stdout.split("INFO ", 1)[1].splitlines()[0])
    ptx_path = next(str(d / f) for f in os.listdir(d) if f.endswith(".ptx"))
    ptx = open(ptx_path).read()
    log = subprocess.run([_ptxas(), "-v", "-arch=sm_100a", "-O3", ptx_path, "-o", os.devnull],
                         capture_output=True, text=True).stderr
    return info, ptx, log


def _check(variant, info, ptx, log):
    D, causal, bq, dtype = variant
    assert ptx is not None, f"{variant} did not compile:\n{log}"
    mma = re.findall(r"tcgen05\.mma\.cta_group::1\.kind::f16", ptx)
    assert len(mma) == 2 * D // 16 + 3 * 128 // 16, len(mma)
    assert len(re.findall(r"tcgen05\.alloc\.cta_group::1", ptx)) == 1
    assert len(re.findall(r"tcgen05\.dealloc\.cta_group::1", ptx)) == 1
    assert len(re.findall(r"tcgen05\.relinquish_alloc_permit", ptx)) == 1
    assert "cta_group::2" not in ptx                        # 1-CTA MMAs, 1-CTA clusters
    assert "cp.reduce.async.bulk.tensor" in ptx             # the dQ reduce-add
    assert info["cluster"] == [1, 1, 1] and info["threads"] == 384
    # S^T, dP^T, dV, dK; P^T over S^T's upper half, dQ over dP^T
    assert info["tmem"] == [0, 128, 256, 256 + D, 64, 128], info
    assert info["tmem_total"] == 256 + 2 * D <= TMEM_COLS
    assert info["smem"] <= SMEM_LIMIT, info
    assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log), log
    assert re.search(r"\b0 bytes stack frame", log), log
    used = int(re.search(r"Used (\d+) registers", log).group(1))
    assert used <= 168, used                                # 384 threads


def _run(tmp_path, variants):
    with ThreadPoolExecutor(max_workers=2) as ex:
        results = list(ex.map(lambda v: _build(tmp_path, v), variants))
    if all(p is None and ("libcuda" in l or "CUDA driver" in l) for _, p, l in results):
        pytest.skip("CuteDSL cannot compile here")
    for v, (info, ptx, log) in zip(variants, results):
        _check(v, info, ptx, log)


@needs_dsl
def test_default_build(tmp_path):
    _run(tmp_path, DEFAULT)


@needs_dsl
@pytest.mark.matrix
def test_compile_matrix(tmp_path):
    _run(tmp_path, MATRIX)


def test_configs():
    """One Q / dO ring depth per head dim, within the smem limit (checked at compile)."""
    from kernels_cute import bwd_blackwell as F
    assert set(F.CONFIGS) == {64, 128}
    assert F.pick_config(64).q_stages == 2 and F.pick_config(128).q_stages == 1


# ------------------------------------------------------------------------------ B200
def _problems():
    from harness.problems import Problem
    ps = []
    for d in (64, 128):
        for causal in (False, True):
            for mode in ("self", "cross", "broadcast_q"):
                for dt in ("bf16", "fp16"):
                    ps.append(Problem(batch=5, heads=4, kv_heads=2 if d == 64 else 4,
                                      head_dim=d, max_seqlen_q=300,
                                      max_seqlen_k=None if mode == "self" else 513,
                                      sparsity=0.5, mode=mode, causal=causal, dtype=dt,
                                      seed=len(ps)))
    return ps


@pytest.mark.gpu
@pytest.mark.parametrize("idx", range(24))
def test_matches_oracle_on_b200(idx):
    """Every mode against the oracle (dq, dk, dv, with a gradient on lse), zero-length and
    length-1 sequences planted in every third problem."""
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 10:
        pytest.skip("needs a B200 (compute capability 10.x)")
    from harness.oracle import check
    from kernels_cute import bwd_blackwell as B
    from kernels_cute import fwd_blackwell as F
    p = _problems()[idx]
    lengths = None
    if idx % 3 == 2:
        lq, lk = (t.clone() for t in p.lengths())
        lk[0], lk[1] = 0, 1
        if p.mode != "broadcast_q":
            lq[1] = 1
            lq[2] = 0
        if p.mode == "self":
            lk = lq.clone()
        lengths = (lq, lk)
    inp = p.build("cuda", lengths=lengths)

    class _Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, bq):
            out, lse = F.forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, bq)
            ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
            ctx.args = (max_q, max_k, causal, scale, bq)
            return out, lse

        @staticmethod
        def backward(ctx, dout, dlse):
            q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
            max_q, max_k, causal, scale, bq = ctx.args
            dq, dk, dv = B.backward(dout, q, k, v, out, lse, cu_q if not bq else None, cu_k,
                                    max_q, max_k, causal, scale, bq, dlse)
            return dq, dk, dv, None, None, None, None, None, None, None

    def fn(q, k, v, cu_q, cu_k, max_q, max_k, causal, softmax_scale, broadcast_q):
        scale = softmax_scale or q.shape[-1] ** -0.5
        return _Fn.apply(q, k, v, cu_q if cu_q is not None else cu_k, cu_k, max_q, max_k,
                         causal, scale, broadcast_q)

    dlse = None
    if idx % 2 == 1:  # a gradient on lse too
        dlse = torch.randn(p.heads, inp.dout.shape[0], device="cuda",
                           generator=torch.Generator("cuda").manual_seed(idx))
    rep = check(inp, fn, causal=p.causal, broadcast_q=p.mode == "broadcast_q", backward=True,
                dlse=dlse)
    assert rep.ok, f"{p.label()} lengths={lengths}\n{rep}"
