"""The TLX Blackwell backward (kernels_tlx/bwd_blackwell.py), compiled for sm_100a on the CPU
(no B200 here: it has not run).

Default run: one variant (D = 128, non-causal, bf16, H = H_kv = 4) and the host checks.
`-m matrix` compiles every other variant (causal, broadcast-Q, GQA / MQA, D = 64, fp16;
~6-10 s each). `-m gpu` on a B200 runs it against the oracle, gradients through out and lse.

Each compile must show: tcgen05.mma and tcgen05.alloc in the PTX, every alloc matched by a
dealloc and the allocation permit relinquished, the kernel's TMEM columns within the 512
it allocates, shared memory within the limit. Spills: Triton 3.8's OptimizePartitionWarps
pass (sm_100 only) gives the 1-warp mma and load tasks 24 registers and the 4-warp
reduce_dq and store 88, whatever they request; the mma warp spills its smem descriptors.
An xfail, bounded by SPILL_BOUND.
"""
import functools
import re

import pytest
import torch

pytest.importorskip("triton")

from harness.compile_check import SMEM_LIMIT, compile_kernel  # noqa: E402
from kernels_tlx import bwd_blackwell as bb  # noqa: E402

# (head_dim, causal, broadcast_q, dtype, H, H_kv); H / H_kv are constexprs (one build each)
VARIANTS = [
    (128, False, False, "bf16", 4, 4),
    (128, True, False, "bf16", 4, 4),
    (128, False, True, "bf16", 4, 4),
    (128, True, True, "fp16", 4, 4),
    (128, False, False, "fp16", 8, 2),
    (128, True, False, "bf16", 8, 1),
    (64, False, False, "bf16", 4, 4),
    (64, True, False, "fp16", 4, 4),
    (64, False, True, "bf16", 4, 4),
    (64, True, True, "bf16", 8, 2),
    (64, True, False, "bf16", 8, 2),
]
SPILL_BOUND = 400  # spill instructions (LDL + STL), most in the 24-register mma warp


@functools.lru_cache(maxsize=None)
def compile_bwd(d, causal, bq, dt, h, hkv):
    cfg = bb.CONFIGS[d]
    name = (f"bw bwd D{d} {'causal' if causal else 'full'}{' bq' if bq else ''} {dt} "
            f"H{h}/{hkv}")
    return compile_kernel(bb.bwd_kernel, bb.signature(d, cfg, dt),
                          bb.kernel_args(cfg, h, hkv, d, causal, bq), arch=100, num_warps=4,
                          num_stages=1, name=name)


def _check(d, causal, bq, dt, h, hkv):
    rep = compile_bwd(d, causal, bq, dt, h, hkv)
    print(rep.row())
    ptx = rep.ptx
    assert rep.mma == "tcgen05" and rep.has_mma, rep.row()
    # S^T, dP^T, dV, dK, dQ: at least one tcgen05.mma each (a k-step each at least)
    assert rep.mma_count >= 5 * (min(d, bb.BLOCK_M.value) // 16), rep.row()
    cols = [int(x) for x in re.findall(
        r"tcgen05\.alloc\.cta_group::1\.sync\.aligned\.shared::cta\.b32\s+\[[^\]]+\],\s*(\d+);",
        ptx)]
    assert cols and all(c <= 512 for c in cols), cols
    assert bb.tmem_cols(d) <= max(cols), (bb.tmem_cols(d), cols)
    n_alloc = len(re.findall(r"tcgen05\.alloc\.", ptx))
    assert n_alloc >= 1 and len(re.findall(r"tcgen05\.dealloc\.", ptx)) >= n_alloc, \
        "a TMEM allocation is never freed"
    assert "tcgen05.relinquish_alloc_permit" in ptx
    assert rep.total_smem <= SMEM_LIMIT[100], rep.row()
    assert rep.total_smem >= bb.smem_bytes(bb.CONFIGS[d], d)
    # dV += P^T dO reads P^T from TMEM (the A operand's kind); dQ is reduce-added by TMA
    assert re.search(r"tcgen05\.mma\.cta_group::1\.kind::f16\s+\[[^\]]+\],\s*\[", ptx), \
        "no MMA with its A operand in TMEM"
    assert "cp.reduce.async.bulk.tensor" in ptx and ".add" in ptx
    return rep


@pytest.mark.parametrize("v", VARIANTS[:1] + [pytest.param(v, marks=pytest.mark.matrix)
                                               for v in VARIANTS[1:]],
                         ids=lambda v: "-".join(map(str, v)))
def test_compiles_sm100(v):
    rep = _check(*v)
    if rep.spills:
        assert rep.spill_insts <= SPILL_BOUND, rep.row()
        pytest.xfail(f"24-register mma / load warps, 88-register reduce_dq / store "
                     f"(OptimizePartitionWarps): {rep.row()}")


def test_config_table():
    assert set(bb.CONFIGS) == {64, 128}
    for d, cfg in bb.CONFIGS.items():
        assert bb.tmem_cols(d) <= 512
        assert bb.smem_bytes(cfg, d) <= SMEM_LIMIT[100] - 4096, (d, bb.smem_bytes(cfg, d))
        args = bb.kernel_args(cfg, 8, 2, d, True, False)
        assert args["DYNAMIC"] and not bb.kernel_args(cfg, 8, 2, d, True, True)["DYNAMIC"]
    with pytest.raises(ValueError, match="head_dim=96"):
        bb.kernel_args(bb.CONFIGS[128], 4, 4, 96, False, False)
    from dataclasses import replace
    with pytest.raises(ValueError, match="slices"):
        bb.kernel_args(replace(bb.CONFIGS[64], dq_slice=48), 4, 4, 64, False, False)


def test_shares_hopper_pre_and_postprocess():
    """delta, the accumulator's zeroing and dQ's slot sum are the Hopper kernel's own."""
    from kernels_tlx import bwd_hopper as bh
    assert bb._bwd_preprocess is bh._bwd_preprocess
    assert bb._bwd_postprocess is bh._bwd_postprocess


def test_empty_inputs_on_cpu():
    """No keys or no batch: zeros, no launch (TMA cannot describe an empty tensor)."""
    q = torch.randn(3, 2, 64)
    k = torch.randn(0, 2, 64)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    cuk = torch.tensor([0, 0], dtype=torch.int32)
    dq, dk, dv = bb.backward(torch.randn(3, 2, 64), q, k, k.clone(), torch.randn(3, 2, 64),
                             torch.randn(2, 3), cu, cuk, 3, 0, False, 0.125, False)
    assert dq.shape == q.shape and (dq == 0).all() and dk.shape == k.shape


# ----------------------------------------------------------------------------- B200
def _blackwell():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10


@functools.lru_cache(maxsize=None)
def _attention():
    """The portable forward with this backward, as one autograd op (so a failure is the
    backward's)."""
    from jagged import portable
    from jagged.api import make_jagged_attention
    return make_jagged_attention("tlx_bw_bwd_check", portable.fwd, bb.backward)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["self", "cross", "broadcast_q"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("kv_heads", [4, 1])
@pytest.mark.parametrize("max_len", [100, 1000])
def test_b200_oracle(mode, causal, head_dim, dtype, kv_heads, max_len):
    """dQ, dK, dV against the oracle on a B200, gradients through out and lse, every mode:
    self, cross, broadcast-Q, causal, GQA / MQA, D 64 / 128, bf16 / fp16, short and long
    sequences (zero-length and length-1 ones planted)."""
    if not _blackwell():
        pytest.skip("needs a B200 (compute capability 10.x)")
    from harness.oracle import check
    from harness.problems import Problem
    p = Problem(batch=7, heads=4, kv_heads=kv_heads, head_dim=head_dim, max_seqlen_q=max_len,
                max_seqlen_k=None if mode == "self" else max_len + 37, sparsity=0.6,
                mode=mode, causal=causal, dtype=dtype, seed=head_dim + max_len)
    lq, lk = (t.clone() for t in p.lengths())
    lk[1] = 0
    lk[2] = 1
    if mode != "broadcast_q":
        lq[2] = 1
        lq[3] = 0
    if mode == "self":
        lk = lq.clone()
    inp = p.build("cuda", lengths=(lq, lk))
    attn = _attention()

    def fn(q, k, v, cu_q, cu_k, max_q, max_k, causal, softmax_scale, broadcast_q):
        return attn(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                    softmax_scale=softmax_scale, broadcast_q=broadcast_q, return_lse=True)

    g = torch.Generator(device="cuda").manual_seed(3)
    n_out = inp.cu_seqlens_k.shape[0] - 1 if mode == "broadcast_q" else None
    rows = n_out * inp.q.shape[0] if n_out is not None else inp.q.shape[0]
    dlse = torch.randn(inp.q.shape[1], rows, device="cuda", generator=g)
    rep = check(inp, fn, causal=causal, broadcast_q=mode == "broadcast_q", backward=True,
                dlse=dlse)
    assert rep.ok, f"{p.label()} lengths={(lq.tolist(), lk.tolist())}\n{rep}"
