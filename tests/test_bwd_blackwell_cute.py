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
import re
from functools import partial

import pytest

from _blackwell import (SMEM_LIMIT, TMEM_COLS, backward_fn, check_on_b200, cute_build,
                        cute_run, problem, skip_unless_b200)
from _cute import have_dsl

_ok, _why = have_dsl()
needs_dsl = pytest.mark.skipif(not _ok, reason=_why)

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

DEFAULT = [(128, False, False, "bf16")]
MATRIX = [(d, c, b, dt) for d in (64, 128) for c in (False, True) for b in (False, True)
          for dt in ("bf16", "fp16") if (d, c, b, dt) not in DEFAULT]


def _build(tmp_path, variant):
    """Compile one variant in its own process -> (info dict, PTX text, ptxas -v log)."""
    D, causal, bq, dtype = variant
    d = tmp_path / f"d{D}_c{int(causal)}_b{int(bq)}_{dtype}"
    return cute_build(d, dtype, _BODY.format(D=D, causal=causal, bq=bq))


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
    cute_run(variants, partial(_build, tmp_path), _check)


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
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["self", "cross", "broadcast_q"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_matches_oracle_on_b200(mode, causal, head_dim, dtype):
    """Every mode against the oracle (dq, dk, dv, with a gradient on lse; the portable
    forward), GQA at D = 64, zero-length and length-1 sequences planted."""
    skip_unless_b200()
    from kernels_cute import bwd_blackwell as B
    check_on_b200(problem(mode, causal, head_dim, dtype, 2 if head_dim == 64 else 4, 300),
                  backward_fn("cute_bw_bwd_check", B.backward), backward=True)
