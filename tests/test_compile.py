"""Compile-only checks (no GPU): the TLX Hopper forward for sm_90a (wgmma present, no
spills or local memory, shared memory within 227 KB) over its config table, the portable
kernel's forward for sm_90a and sm_100a (Blackwell), and the tile-list kernels. CI builds
a few representatives of each; the other variants run under `-m matrix`."""
import functools
import re
from dataclasses import replace

import pytest

pytest.importorskip("triton")

from harness.compile_check import SMEM_LIMIT, compile_kernel  # noqa: E402
from jagged.tiles import FWD_CAUSAL_SHORT_MAX_K  # noqa: E402

try:
    from kernels_tlx import fwd_hopper as fh
except Exception as e:  # pragma: no cover
    pytest.skip(f"kernels_tlx.fwd_hopper unavailable: {e}", allow_module_level=True)

# (head_dim, length bucket, causal, broadcast_q, dtype): the default builds of every
# config in fh.CONFIGS, broadcast-Q and fp16 spot checks (the GQA group is a runtime
# argument of the kernel: no build of its own)
FWD_CONFIGS = [
    (64, "long", False, False, "bf16"),
    (64, "long", True, False, "bf16"),
    (64, "short", False, False, "bf16"),
    (64, "short", True, True, "fp16"),
    (128, "long", False, False, "bf16"),
    (128, "long", True, False, "bf16"),
    (128, "long", False, True, "fp16"),
    (128, "short", False, False, "bf16"),
    (128, "short", True, False, "bf16"),
]
# in CI: three consumers with `overlap` (long), and an fp16 broadcast-Q causal build
# without it (short); the same builds serve test_fwd_issue_turn / _three_consumers
FWD_CI = [(64, "long", False, False, "bf16"), (64, "short", True, True, "fp16")]


def ci_first(variants, ci):
    """pytest params: `ci` as they are, the other variants under `-m matrix`."""
    return [v if v in ci else pytest.param(*v, marks=pytest.mark.matrix) for v in variants]


@functools.lru_cache(maxsize=None)
def compile_fwd(d, bucket, causal, bq, dt, arch=90):
    cfg = fh.CONFIGS[(d, bucket, causal)]
    name = f"fwd D{d} {bucket} {'causal' if causal else 'full'}{' bq' if bq else ''} {dt}"
    return compile_kernel(fh.fwd_kernel, fh.signature(cfg, d, dt),
                          fh.kernel_args(cfg, d, causal, bq), arch=arch,
                          num_warps=4, num_stages=1, name=name)


@pytest.mark.parametrize("d,bucket,causal", [
    (128, "short", False), pytest.param(64, "long", True, marks=pytest.mark.matrix)])
def test_fwd_hopper_direct_sm90(d, bucket, causal):
    """The list-free build (jagged.tiles.fwd_direct): no tile-list read, no spills, and
    the dependent launch's wait in the consumers only, before their stores (the producer
    runs under the offsets check)."""
    cfg = fh.CONFIGS[(d, bucket, causal)]
    sig = dict(fh.signature(cfg, d, "bf16"), pairs_ptr="constexpr", count_ptr="i32")
    rep = compile_kernel(fh.fwd_kernel, sig,
                         dict(fh.kernel_args(cfg, d, causal, False, direct=True),
                              pairs_ptr=None), arch=90, num_warps=4, num_stages=1,
                         name=f"fwd direct D{d} {bucket} {'causal' if causal else 'full'}")
    print(rep.row())
    assert rep.has_mma and rep.mma == "wgmma", rep.row()
    assert not rep.spills, f"spills / local memory: {rep.row()}"
    consumers = cfg.block_m // fh.SPLIT_M.value
    assert rep.ptx.count("griddepcontrol.wait") == consumers, rep.row()


@pytest.mark.parametrize("d", [128, 64])
def test_fwd_hopper_dynamic_sm90(d):
    """Causal packed lists from the tile counter (jagged.tiles.fwd_dynamic): the two
    atomics (the counter, the finished programs), the KV step loops as the static build's
    and spill-free (D = 128 keeps a few spill instructions outside them: the program id
    and the issue-turn barrier ids across the tasks' register split)."""
    from harness.sass_steps import parse, step_loops
    cfg = fh.CONFIGS[(d, "long", True)]
    rep = compile_kernel(fh.fwd_kernel, fh.signature(cfg, d, "bf16"),
                         fh.kernel_args(cfg, d, True, False, dynamic=True), arch=90,
                         num_warps=4, num_stages=1, name=f"fwd dynamic D{d} causal")
    print(rep.row())
    assert rep.has_mma and rep.mma == "wgmma" and rep.fits(), rep.row()
    assert rep.ptx.count("atom.") == 2, rep.row()
    static = compile_fwd(d, "long", True, False, "bf16")
    kv_steps = lambda r: [body for body in step_loops(parse(r.sass))
                          if any(x.op.startswith("HGMMA") for x in body)]
    # the KV step loops (a copy in each consumer) unchanged; the tile loops take the
    # handoff
    lens = [len(body) for body in kv_steps(static)]
    step_lens = {n for n in lens if lens.count(n) == 2}
    assert len(step_lens) == 2 and step_lens <= set(map(len, kv_steps(rep))), lens
    assert not any(x.op.startswith(("LDL", "STL")) for body in kv_steps(rep) for x in body)
    assert rep.spill_insts <= 16, rep.row()


@pytest.mark.parametrize("d,bucket,causal,bq,dt", ci_first(FWD_CONFIGS, FWD_CI))
def test_fwd_hopper_sm90(d, bucket, causal, bq, dt):
    rep = compile_fwd(d, bucket, causal, bq, dt)
    print(rep.row())
    assert rep.has_mma and rep.mma == "wgmma", rep.row()
    assert not rep.spills, f"spills / local memory: {rep.row()}"
    assert rep.total_smem <= SMEM_LIMIT[90], rep.row()
    # a programmatic dependent launch: every role (producer, each consumer) waits for
    # the kernels ahead before its first global access
    roles = 1 + fh.CONFIGS[(d, bucket, causal)].block_m // fh.SPLIT_M.value
    assert rep.ptx.count("griddepcontrol.wait") == roles, rep.row()
    # P packed two a cvt (_pack_p), not per element
    assert f"cvt.rn.{'bf16' if dt == 'bf16' else 'f16'}x2.f32" in rep.ptx, rep.row()
    # producer gives registers back, consumers take them (warp specialization)
    assert len(rep.setmaxnreg) >= 2, rep.row()


@pytest.mark.parametrize("d,causal,dt", [  # two in CI, the rest in `make test-matrix`
    (128, True, "fp16"), (128, True, "fp8e4nv"),
    *(pytest.param(*v, marks=pytest.mark.matrix) for v in ((64, False, "bf16"),
                                                           (64, True, "bf16"),
                                                           (128, False, "bf16"),
                                                           (64, False, "fp8e4nv")))])
def test_fwd_windows_sm90(d, causal, dt):
    """The forward over row windows (short queries): wgmma, no spills, shared memory
    within the limit; fp8: S = Q K^T an e4m3 wgmma, each row's descales gathered."""
    cfg = fh.WINDOW_CONFIG
    fp8 = dt == "fp8e4nv"
    rep = compile_kernel(fh.fwd_kernel, fh.signature(cfg, d, dt, windows=True),
                         fh.kernel_args(cfg, d, causal, False, fp8=fp8, windows=True),
                         arch=90, num_warps=4, num_stages=1,
                         name=f"fwd windows D{d} {'causal' if causal else 'full'} {dt}")
    print(rep.row())
    assert rep.has_mma and rep.mma == "wgmma", rep.row()
    assert not rep.spills, f"spills / local memory: {rep.row()}"
    assert rep.total_smem <= SMEM_LIMIT[90], rep.row()
    assert ("e4m3.e4m3" in rep.ptx) == fp8, rep.row()


def _commits_per_turn(ptx: str) -> list[int]:
    """wgmma commit groups between each ping-pong barrier wait and the next arrive."""
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


@pytest.mark.parametrize("d,bucket,causal,bq,dt", ci_first(
    FWD_CI + [(128, "long", False, False, "bf16"), (64, "long", True, False, "bf16"),
              (128, "short", False, False, "bf16")], FWD_CI))
def test_fwd_issue_turn(d, bucket, causal, bq, dt):
    """`overlap` (the long buckets) keeps the KV loops out of Triton's pipeliner, whose
    wait-0 after every dot would serialize S_j and P_{j-1} V_{j-1}, and a consumer's
    issue turn (named-barrier wait .. arrive) holds both wgmma groups of a step (S0 PV0
    S1 PV1; handed over after S, the tensor pipe ran S0 S1 PV0 PV1, 5-18 % slower at
    gem). Without it (the short buckets) a turn holds one."""
    cfg = fh.CONFIGS[(d, bucket, causal)]
    rep = compile_fwd(d, bucket, causal, bq, dt)
    assert max(_commits_per_turn(rep.ptx)) == (2 if cfg.overlap else 1), rep.row()
    # wgmma waits of 0 a consumer (PTX): 3 non-causal, 4 causal with overlap; 5 and 8
    # with a wait 0 after every dot of the KV loops
    per_consumer = rep.mma_wait0 // (cfg.block_m // 64)
    assert (per_consumer <= 4) == cfg.overlap, (rep.mma_wait0, rep.row())


def test_fwd_config_table():
    """The measured defaults: `mask_first` non-causal only; `overlap` on the long buckets;
    192-row tiles (three consumers) at D = 64, long, non-causal only."""
    assert set(fh.CONFIGS) == {(d, b, c) for d in (64, 128) for b in ("short", "long")
                               for c in (False, True)}
    for (d, bucket, causal), cfg in fh.CONFIGS.items():
        assert cfg.mask_first == (not causal)
        assert cfg.overlap == (bucket == "long")
        assert cfg.block_m == (192 if (d, bucket, causal) == (64, "long", False) else 128)
        assert cfg.block_n == (128 if bucket == "long" else 64)
        assert 2 <= cfg.num_buffers_kv <= 3
    for d in (64, 128):
        for max_k in (1, 64, 65, 512, 513, 8192):
            for causal in (False, True):
                cfg = fh.pick_config(d, max_k, causal)
                short = max_k <= 64 or (causal and max_k <= FWD_CAUSAL_SHORT_MAX_K)
                assert cfg is fh.CONFIGS[(d, "short" if short else "long", causal)]
        # the mean KV length picks the short bucket without causal masking only; causal,
        # the longest sequence does
        assert fh.pick_config(d, 8192, False, mean_k=100.0).block_n == 64
        assert fh.pick_config(d, 8192, True, mean_k=100.0).block_n == 128
        assert fh.pick_config(d, 512, True, mean_k=500.0).block_n == 64


def test_fwd_three_consumers():
    """`block_m=192`: three consumer warpgroups of 64 rows at 160 registers take the issue
    turn in a ring (named barriers 9 -> 10 -> 11 -> 9); a block_m other than 128 or 192 is
    refused on the host."""
    rep = compile_fwd(64, "long", False, False, "bf16")
    assert 160 in rep.setmaxnreg, rep.setmaxnreg
    assert set(re.findall(r"\bbar\.sync\s+(9|10|11), 256;", rep.ptx)) == {"9", "10", "11"}
    assert fh.kernel_args(fh.CONFIGS[(128, "long", False)], 128, False, False)[
        "CONSUMER_REGS"] == 240
    with pytest.raises(ValueError, match="block_m=100"):
        fh.kernel_args(replace(fh.CONFIGS[(64, "long", False)], block_m=100), 64, False, False)


# in CI: the forward and the windows forward, each for both targets
@pytest.mark.parametrize("d,causal,dense_q,window,arch", ci_first(
    [(*v, arch) for arch in (90, 100) for v in ((64, False, False, False),
                                                (128, True, False, False),
                                                (128, False, True, False),
                                                (128, True, False, True))],
    [(64, False, False, False, 90), (64, False, False, False, 100),
     (128, True, False, True, 90), (128, True, False, True, 100)]))
def test_portable_fwd_compiles(arch, d, causal, dense_q, window):
    """The portable forward compiles to the tensor-core MMA of each target (wgmma on
    sm_90a, tcgen05 on sm_100a); on Blackwell it is the kernel that must at least
    compile, since the TLX Hopper kernels are wgmma-only."""
    from jagged import portable
    sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "LSE": "*fp32",
           "CU_Q": "*i32", "CU_K": "*i32", "qk_scale": "fp32", "n_out": "i32",
           "L_q": "i32"}
    sig.update({n: "i32" for n in ("stride_qt", "stride_qh", "stride_kt", "stride_kh",
                                    "stride_ot", "stride_oh")})
    if window:  # the forward over row windows (short sequences)
        sig.update(WIN="*i32", n_win="i32")
    rep = compile_kernel(portable.fwd_window_kernel if window else portable.fwd_kernel, sig,
                         dict(GROUP=1, D=d, BLOCK_M=128, BLOCK_N=32 if window else 64,
                              CAUSAL=causal, DENSE_Q=dense_q), arch=arch, num_warps=8,
                         num_stages=3,
                         name=f"portable fwd{' window' if window else ''} D{d} sm_{arch}")
    print(rep.row())
    assert rep.total_smem <= SMEM_LIMIT[arch], rep.row()
    assert rep.has_mma and not rep.spills, rep.row()


# batch 1152 and 4096 sort in the kernel, 4097 loops, 13 writes runs of 16 blocks; in CI
# the largest in-kernel sort (fwd), the loop (bwd) and the runs (broadcast-Q bwd)
@pytest.mark.parametrize("which,batch,nb,causal,bq", ci_first(
    [(w, b, n, c, q) for w in ("fwd", "bwd")
     for b, n in ((1152, 4), (4096, 2), (4097, 1), (13, 128))
     for c, q in ((False, False), (True, False), (True, True))],
    [("fwd", 4096, 2, True, True), ("bwd", 4097, 1, False, False),
     ("bwd", 13, 128, False, True)]))
def test_schedule_kernels_sm90(which, batch, nb, causal, bq):
    """The tile-key kernels compile for the GPU with the launch options they get, and do
    not spill (the interpreter accepts more, e.g. non-constexpr globals, so the CPU
    schedule tests alone do not prove this). The forward's lists check the offsets
    (checked_launch: the asserts compiled in, no overflow checks), the backward's not."""
    from jagged.tiles import _tile_keys_kernel, checked_launch, sort_launch
    opts = sort_launch(batch, nb)
    assert opts["SORT"] == (batch <= 4096)
    check = checked_launch((1, 1, 1, 1) if which == "fwd" else None)[1]
    sig = dict(cu_q="*i32", cu_k="*i32", keys_ptr="*i64", tiles_ptr="*i32", count_ptr="*i32",
               n_pairs="i32", n_stride="i32", NB="i32", L_q="i32", n_q="i32", n_k="i32",
               max_q="i32", max_k="i32")
    const = dict(BLOCK_M=128, BLOCK_N=128, CAUSAL=causal, BROADCAST_Q=bq,
                 KV_TILES=which == "bwd", BLOCK=opts["BLOCK"], SORT=opts["SORT"],
                 RUN=opts.get("RUN", 1), WAIT_LAST=which == "bwd",
                 CHECK=check.get("CHECK", False), PDL=True)
    sig.update({k: "constexpr" for k in const})
    rep = compile_kernel(_tile_keys_kernel, sig, const, arch=90, num_warps=opts["num_warps"],
                         name=f"{which} tile keys B={batch} NB={nb}",
                         **{k: check[k] for k in ("debug", "sanitize_overflow") if k in check})
    assert not rep.spills and not rep.stack_bytes, rep.row()
    assert ("__assertfail" in rep.ptx) == (which == "fwd"), rep.row()
    # the attention kernel (the forward's, the backward's main) is its programmatic dependent
    assert "griddepcontrol.launch_dependents" in rep.ptx, rep.row()
    # the backward's, itself the preprocess's dependent, waits for it after its last store
    waits = rep.ptx.rfind("griddepcontrol.wait")
    assert (waits > rep.ptx.rfind("st.global")) if which == "bwd" else waits < 0, rep.row()


@pytest.mark.parametrize("order,seqs", [  # the largest pass in CI
    (True, 4096),
    *(pytest.param(*v, marks=pytest.mark.matrix)
      for v in ((False, 2048), (True, 128), (False, 128)))])
def test_windows_kernel_sm90(order, seqs):
    """The window builder (portable windows; with ORDER the Hopper kernels' window list,
    its counting sort by work, which checks the offsets) compiles for the GPU without
    spills, `seqs` sequences a pass in registers."""
    from jagged.tiles import ORDER_LANES, _group_warps, _windows_kernel, checked_launch
    check = checked_launch((1, 1, 1, 1) if order else None)[1]
    sig = dict(cu="*i32", win_ptr="*i32", order_ptr="*i32" if order else "constexpr",
               count_ptr="*i32" if order else "constexpr", B="i32", n_win="i32",
               SPAN="i32", ROUNDS="i32", cu_k="*i32" if order else "constexpr", n_q="i32",
               n_k="i32", max_q="i32", max_k="i32")
    const = dict(BLOCK_M=128, SEQS=seqs, ORDER=order, BLOCK_N=64, LANES=ORDER_LANES,
                 CHECK=check.get("CHECK", False), PDL=order)
    if not order:
        const.update(order_ptr=None, count_ptr=None, cu_k=None)
    sig.update({k: "constexpr" for k in const})
    rep = compile_kernel(_windows_kernel, sig, const, arch=90,
                         num_warps=_group_warps(max(2 * ORDER_LANES if order else 0, seqs)),
                         name=f"windows order={order} SEQS={seqs}",
                         **{k: check[k] for k in ("debug", "sanitize_overflow") if k in check})
    print(rep.row())
    assert not rep.spills and not rep.stack_bytes, rep.row()
    assert ("griddepcontrol.launch_dependents" in rep.ptx) == order, rep.row()
