"""Compile-only checks (no GPU): the TLX Hopper forward for sm_90a (wgmma present, no
spills or local memory, shared memory within 227 KB) over its config table, and the
portable kernel's forward for sm_100a (Blackwell) when jagged.portable exists."""
import pytest

pytest.importorskip("triton")

from harness.compile_check import SMEM_LIMIT, compile_kernel  # noqa: E402

try:
    from kernels_tlx import fwd_hopper as fh
except Exception as e:  # pragma: no cover
    pytest.skip(f"kernels_tlx.fwd_hopper unavailable: {e}", allow_module_level=True)

# (head_dim, length bucket, causal, broadcast_q, dtype, GQA group); the GQA group
# is a runtime argument of the kernel (kept here for the names)
FWD_CONFIGS = [
    (64, "long", False, False, "bf16", 1),
    (64, "long", True, False, "bf16", 2),
    (128, "long", False, False, "bf16", 1),
    (128, "long", True, False, "bf16", 1),
    (128, "long", False, True, "fp16", 4),
    (128, "short", False, False, "bf16", 1),
    (64, "short", True, True, "fp16", 1),
]


def compile_fwd(d, bucket, causal, bq, dt, group, arch=90):
    cfg = fh.bucket_config(d, bucket, causal)
    name = f"fwd D{d} {bucket} {'causal' if causal else 'full'}{' bq' if bq else ''} {dt} g{group}"
    return compile_kernel(fh.fwd_kernel, fh.signature(cfg, d, dt),
                          fh.kernel_args(cfg, d, causal, bq), arch=arch,
                          num_warps=4, num_stages=1, name=name)


@pytest.mark.parametrize("d,bucket,causal,bq,dt,group", FWD_CONFIGS)
def test_fwd_hopper_sm90(d, bucket, causal, bq, dt, group):
    rep = compile_fwd(d, bucket, causal, bq, dt, group)
    print(rep.row())
    assert rep.has_mma and rep.mma == "wgmma", rep.row()
    assert not rep.spills, f"spills / local memory: {rep.row()}"
    assert rep.total_smem <= SMEM_LIMIT[90], rep.row()
    # P packed two a cvt (_pack_p), not per element
    assert f"cvt.rn.{'bf16' if dt == 'bf16' else 'f16'}x2.f32" in rep.ptx, rep.row()
    # producer gives registers back, consumers take them (warp specialization)
    assert len(rep.setmaxnreg) >= 2, rep.row()


def test_fwd_kv3_variant_fits_sm90():
    """The A/B variant of PERF.md's forward plan (JAGGED_FWD_CONFIG=num_buffers_kv=3,
    num_buffers_q=1) fits in shared memory and does not spill at the non-causal default, so
    a GPU run can time it (with the tail steps compiled, mask_first=0, it spills 4
    instructions since _pack_p: session 15)."""
    from dataclasses import replace
    cfg = replace(fh.bucket_config(128, "long", False), num_buffers_kv=3, num_buffers_q=1)
    rep = compile_kernel(fh.fwd_kernel, fh.signature(cfg, 128, "bf16"),
                         fh.kernel_args(cfg, 128, False, False), arch=90, num_warps=4,
                         num_stages=1, name="fwd D128 long kv3 q1")
    print(rep.row())
    assert rep.has_mma and not rep.spills and rep.total_smem <= SMEM_LIMIT[90], rep.row()


def _commits_per_turn(ptx: str) -> list[int]:
    """wgmma commit groups between each ping-pong barrier wait and the next arrive."""
    import re
    out, inside = [], None
    for line in ptx.splitlines():
        if re.search(r"\bbar\.sync\s+(9|10|11), 256;", line):
            inside = 0
        elif inside is not None and "wgmma.commit_group" in line:
            inside += 1
        elif inside is not None and re.search(r"\bbar\.arrive\s+(9|10|11), 256;", line):
            out.append(inside)
            inside = None
    return out


def test_fwd_overlap_leaves_the_pipeliner():
    """`overlap` (the long buckets' default; non-causal since session 15) keeps the KV loops out of Triton's
    pipeliner, whose wait-0 after every dot serializes S_j and P_{j-1} V_{j-1} (PTX
    wait-0 16 -> 8, session 13); it must stay spill-free where it is not the default."""
    from dataclasses import replace
    for d, bucket, causal in ((128, "long", False), (64, "long", True), (128, "short", False)):
        cfg = replace(fh.bucket_config(d, bucket, causal), overlap=False)
        args = (fh.fwd_kernel, fh.signature(cfg, d, "bf16"))
        kw = dict(arch=90, num_warps=4, num_stages=1)
        base = compile_kernel(*args, fh.kernel_args(cfg, d, causal, False), **kw)
        ov = compile_kernel(*args, fh.kernel_args(replace(cfg, overlap=True), d, causal, False), **kw)
        print(base.row(), "\n", ov.row(), base.mma_wait0, ov.mma_wait0)
        assert ov.mma_wait0 < base.mma_wait0 and not ov.spills, (d, bucket, causal)
        # the issue turn (named-barrier wait .. arrive) holds both wgmma groups of a step
        # with overlap (S0 PV0 S1 PV1); handing it over after S cost 12-18 % at gem
        assert max(_commits_per_turn(ov.ptx)) == 2, (d, bucket, causal)
        assert max(_commits_per_turn(base.ptx)) == 1, (d, bucket, causal)
    for d in (64, 128):
        for causal in (False, True):
            assert fh.pick_config(d, 8192, causal, False).overlap
        assert not fh.pick_config(d, 64, False, False).overlap  # the short bucket


def test_fwd_defaults_by_causality():
    """Session 14's defaults: `mask_first` (the masked last KV block as the peeled first
    step) non-causal only; `overlap` on the long buckets (non-causal since session 15).
    Both together causal (opt-in) compile spill-free, so an A/B can time them."""
    from dataclasses import replace
    for d in (64, 128):
        for max_k in (64, 8192):
            assert fh.pick_config(d, max_k, False, False).mask_first
            assert not fh.pick_config(d, max_k, True, False).mask_first
    cfg = replace(fh.bucket_config(128, "long", True), mask_first=True, overlap=True)
    rep = compile_kernel(fh.fwd_kernel, fh.signature(cfg, 128, "bf16"),
                         fh.kernel_args(cfg, 128, True, False), arch=90, num_warps=4,
                         num_stages=1, name="fwd causal mask_first overlap")
    print(rep.row())
    assert rep.has_mma and not rep.spills and rep.total_smem <= SMEM_LIMIT[90], rep.row()


def test_fwd_three_consumers_compile():
    """`block_m=192` (the D = 64 long non-causal default, WIDE_NONCAUSAL; FA4's D = 64
    tile): three consumer warpgroups of 64 rows at 160 registers take the issue turn in a
    ring (named barriers 9 -> 10 -> 11 -> 9). Non-causal it is spill-free (the default
    table's test above); causal the masked tail step spills ~13 registers (session 15's
    SASS), so causal keeps 128 rows."""
    import re
    from dataclasses import replace
    for causal in (False, True):
        cfg = replace(fh.bucket_config(64, "long", causal), block_m=192)
        rep = compile_kernel(fh.fwd_kernel, fh.signature(cfg, 64, "bf16"),
                             fh.kernel_args(cfg, 64, causal, False), arch=90, num_warps=4,
                             num_stages=1, name=f"fwd D64 192 causal={causal}")
        print(rep.row())
        assert rep.has_mma and rep.total_smem <= SMEM_LIMIT[90] and 160 in rep.setmaxnreg
        assert set(re.findall(r"\bbar\.sync\s+(9|10|11), 256;", rep.ptx)) == {"9", "10", "11"}
        assert max(_commits_per_turn(rep.ptx)) == (2 if cfg.overlap else 1), causal
    assert fh.kernel_args(fh.bucket_config(128, "long", False), 128, False, False)[
        "CONSUMER_REGS"] == 240
    with pytest.raises(ValueError, match="block_m=100"):
        fh.kernel_args(replace(cfg, block_m=100), 64, False, False)


def test_config_table_covers_head_dims():
    for d in (64, 128):
        for max_k in (1, 64, 65, 8192):
            for causal in (False, True):
                cfg = fh.pick_config(d, max_k, causal, False)
                wide = d == 64 and max_k > 64 and not causal  # WIDE_NONCAUSAL
                assert cfg.block_m == (192 if wide else 128) and cfg.block_n in (64, 128)
                assert 2 <= cfg.num_buffers_kv <= 3


@pytest.mark.parametrize("arch", [90, 100])
@pytest.mark.parametrize("d,causal,dense_q", [(64, False, False), (128, True, False),
                                              (128, False, True)])
def test_portable_fwd_compiles(arch, d, causal, dense_q):
    """The portable forward compiles to the tensor-core MMA of each target (wgmma on
    sm_90a, tcgen05 on sm_100a); on Blackwell it is the kernel that must at least
    compile, since the TLX Hopper kernels are wgmma-only."""
    from jagged import portable
    sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "LSE": "*fp32",
           "CU_Q": "*i32", "CU_K": "*i32", "qk_scale": "fp32", "n_out": "i32",
           "dense_len_q": "i32"}
    sig.update({n: "i32" for n in ("stride_qt", "stride_qh", "stride_kt", "stride_kh",
                                    "stride_ot", "stride_oh")})
    rep = compile_kernel(portable.fwd_kernel, sig,
                         dict(GROUP=1, D=d, BLOCK_M=128, BLOCK_N=64, CAUSAL=causal,
                              DENSE_Q=dense_q), arch=arch, num_warps=8, num_stages=3,
                         name=f"portable fwd D{d} sm_{arch}")
    print(rep.row())
    assert rep.total_smem <= SMEM_LIMIT[arch], rep.row()
    assert rep.has_mma and not rep.spills, rep.row()


@pytest.mark.parametrize("causal,bq", [(False, False), (True, True)])
@pytest.mark.parametrize("n_pairs", [100, 3000, 8192, 9000])  # sorted in-kernel (3 sizes), looped
@pytest.mark.parametrize("which", ["fwd", "bwd"])
def test_schedule_kernels_sm90(which, n_pairs, causal, bq):
    """The tile-key kernels compile for the GPU with the launch options they get, and do
    not spill (the interpreter accepts more, e.g. non-constexpr globals, so the CPU
    schedule tests alone do not prove this)."""
    from jagged.tiles import _tile_keys_kernel, sort_launch
    opts = sort_launch(n_pairs)
    sig = dict(cu_q="*i32", cu_k="*i32", keys_ptr="*i64", tiles_ptr="*i32", count_ptr="*i32",
               n_pairs="i32", n_stride="i32", NB="i32", L_q="i32")
    const = dict(BLOCK_M=128, BLOCK_N=128, CAUSAL=causal, BROADCAST_Q=bq,
                 KV_TILES=which == "bwd", BLOCK=opts["BLOCK"], SORT=opts["SORT"],
                 SEQ_ORDER=which == "bwd" and causal)
    sig.update({k: "constexpr" for k in const})
    rep = compile_kernel(_tile_keys_kernel, sig, const, arch=90, num_warps=opts["num_warps"],
                         name=f"{which} tile keys n={n_pairs}")
    assert not rep.spills and not rep.stack_bytes, rep.row()
