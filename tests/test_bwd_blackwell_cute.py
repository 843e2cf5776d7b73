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

from _blackwell import (TMEM_COLS, b200_matrix, backward_fn, check_cute, check_on_b200,
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

DEFAULT = [(128, False, False, "bf16")]
MATRIX = [(d, c, b, dt) for d in (64, 128) for c in (False, True) for b in (False, True)
          for dt in ("bf16", "fp16") if (d, c, b, dt) not in DEFAULT]


def _check(variant, info, ptx, log):
    D, causal, bq, dtype = variant
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


test_default_builds, test_compile_matrix, test_default_build_sm103 = cute_tests(
    _BODY, DEFAULT, MATRIX, _check)


def test_configs():
    """One Q / dO ring depth per head dim, within the smem limit (checked at compile)."""
    from kernels_cute import bwd_blackwell as F
    assert set(F.CONFIGS) == {64, 128}
    assert F.pick_config(64).q_stages == 2 and F.pick_config(128).q_stages == 1


# ------------------------------------------------------------------------------ B200
@b200_matrix
def test_matches_oracle_on_b200(mode, causal, head_dim, dtype):
    """Every mode against the oracle (dq, dk, dv, with a gradient on lse; the portable
    forward), GQA at D = 64, zero-length and length-1 sequences planted."""
    skip_unless_b200()
    from kernels_cute import bwd_blackwell as B
    check_on_b200(problem(mode, causal, head_dim, dtype, 2 if head_dim == 64 else 4, 300),
                  backward_fn("cute_bw_bwd_check", B.backward), backward=True)
