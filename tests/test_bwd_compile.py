"""Compile-only checks of kernels_tlx.bwd_hopper for sm_90a (no GPU needed):
wgmma present, no spills, shared memory within 227 KB."""
import pytest

triton = pytest.importorskip("triton")

try:
    from harness.compile_check import compile_kernel
except Exception as e:  # pragma: no cover
    pytest.skip(f"harness.compile_check unavailable: {e}", allow_module_level=True)

from kernels_tlx import bwd_hopper as bw

CONFIGS = [(d, c, bq, dt) for d in (64, 128) for c in (False, True) for bq in (False, True)
           for dt in ("bf16",)] + [(128, True, False, "fp16"), (64, False, True, "fp16")]


def main_signature(dt, d):
    cfg = bw.config(d)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    sig = {"q_desc": f"tensordesc<{dt}[{bm},{d}]>", "k_desc": f"tensordesc<{dt}[{bn},{d}]>",
           "v_desc": f"tensordesc<{dt}[{bn},{d}]>", "do_desc": f"tensordesc<{dt}[{bm},{d}]>",
           "lse_ptr": "*fp32", "delta_ptr": "*fp32", "dq_desc": f"tensordesc<fp32[{bm},{d}]>", "dq_acc_ptr": "*fp32",
           "dk_ptr": f"*{dt}", "dv_ptr": f"*{dt}"}
    sig.update({n: "*i32" for n in ("cu_q_ptr", "cu_k_ptr", "tile_b_ptr", "tile_n_ptr", "n_tiles_ptr")})
    sig.update(scale="fp32", L_q="i32", stride_k_tok="i32", stride_k_h="i32", stride_lse_h="i32")
    return sig


def compile_main(d, causal, bq, dt="bf16", H=4, HKV=2):
    cfg = bw.config(d)
    return compile_kernel(
        bw._bwd_main, main_signature(dt, d),
        constexprs=dict(H=H, HKV=HKV, D=d, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                        CAUSAL=causal, BROADCAST_Q=bq, TMA_REDUCE=True),
        arch=90, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        name=f"bwd_main D{d} {'causal' if causal else 'full'} {'bq' if bq else 'packed'} {dt}")


@pytest.mark.parametrize("d,causal,bq,dt", CONFIGS)
def test_main_compiles_to_wgmma(d, causal, bq, dt):
    rep = compile_main(d, causal, bq, dt)
    print(rep.row())
    assert rep.has_mma, "no wgmma in the PTX"
    assert rep.fits(), f"shared memory {rep.total_smem} B > 227 KB"
    if d == 128 and rep.spills:  # known: ~70-90 spill insts at 255 regs (see module doc)
        pytest.xfail(f"D=128 plain kernel spills: {rep.row()}")
    assert not rep.spills, f"spills: {rep.row()}"


@pytest.mark.parametrize("d", (64, 128))
def test_pre_post_compile(d):
    pre = compile_kernel(
        bw._bwd_preprocess,
        {"out_ptr": "*bf16", "dout_ptr": "*bf16", "delta_ptr": "*fp32", "dq_acc_ptr": "*fp32",
         "n_rows": "i32", "stride_o_tok": "i32", "stride_o_h": "i32", "stride_do_tok": "i32",
         "stride_do_h": "i32", "stride_delta_h": "i32"},
        constexprs=dict(H=4, D=d, ROWS=16, ZERO_DQ=True), arch=90, num_warps=4)
    post = compile_kernel(
        bw._bwd_postprocess,
        {"dq_acc_ptr": "*fp32", "dq_ptr": "*bf16", "n_elem": "i32", "n_slots": "i32",
         "slot_stride": "i32", "scale": "fp32"},
        constexprs=dict(BLOCK=1024), arch=90, num_warps=4)
    assert not pre.spills and not post.spills


if __name__ == "__main__":
    for cfg in CONFIGS:
        print(compile_main(*cfg).row())


# ---- warp-specialized TLX kernel (impl="ws")
def ws_signature(dt, d):
    cfg = bw.config(d)
    bm, bnc = cfg["BLOCK_M"], cfg["BLOCK_N"] // 2
    sig = {"q_desc": f"tensordesc<{dt}[{bm},{d}]>", "k_desc": f"tensordesc<{dt}[{bnc},{d}]>",
           "v_desc": f"tensordesc<{dt}[{bnc},{d}]>", "do_desc": f"tensordesc<{dt}[{bm},{d}]>",
           "lse_ptr": "*fp32", "delta_ptr": "*fp32", "dq_desc": f"tensordesc<fp32[{bm},{d}]>",
           "dk_ptr": f"*{dt}", "dv_ptr": f"*{dt}"}
    sig.update({n: "*i32" for n in ("cu_q_ptr", "cu_k_ptr", "tile_b_ptr", "tile_n_ptr", "n_tiles_ptr")})
    sig.update(scale="fp32", L_q="i32", stride_k_tok="i32", stride_k_h="i32", stride_lse_h="i32")
    return sig


def compile_ws(d, causal, bq, dt="bf16", H=4, HKV=2):
    pytest.importorskip("triton.language.extra.tlx")
    from kernels_tlx import bwd_hopper_ws as ws
    cfg = bw.config(d)
    return compile_kernel(
        ws._bwd_main_ws, ws_signature(dt, d),
        constexprs=dict(H=H, HKV=HKV, D=d, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                        CAUSAL=causal, BROADCAST_Q=bq),
        arch=90, num_warps=4, num_stages=1,
        name=f"bwd_main_ws D{d} {'causal' if causal else 'full'} {'bq' if bq else 'packed'}")


@pytest.mark.parametrize("d,causal,bq", [(64, False, False), (64, True, True),
                                         pytest.param(128, True, False, marks=pytest.mark.xfail(
                                             reason="D=128 consumers spill at 232 regs (known)",
                                             strict=False))])
def test_ws_compiles(d, causal, bq):
    rep = compile_ws(d, causal, bq)
    print(rep.row())
    assert rep.has_mma and rep.setmaxnreg
    assert rep.fits(), f"shared memory {rep.total_smem} B > 227 KB"
    assert not rep.spills, f"spills: {rep.row()}"
