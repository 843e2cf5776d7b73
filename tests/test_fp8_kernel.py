"""fp8 (e4m3) prefill: `jagged.fp8.dequantize_rows` in the interpreter, the TLX Hopper
forward's fp8 build compiled for sm_90a (S = Q K^T an e4m3 wgmma, P V bf16, no spills,
shared memory within the limit; the CuteDSL build's: tests/test_cute_compile.py), and on
the GPU (`-m gpu`) both styles' `fwd_hopper.forward` with descales against an fp32
reference on the dequantized values; CuteDSL's both ways V reaches P V (converted tile by
tile in the kernel, or the once-a-call V pass: kernels_cute.fwd_hopper.fp8_v_tiles; the
V-tile builds: tests/test_cute_fp8_v_tiles.py)."""
import importlib
import math

import pytest
import torch
import triton
import triton.language as tl

from harness.problems import offsets
from jagged.fp8 import FP8, dequantize_rows
from _interp import interp

E4M3_MAX = 448.0


def random_e4m3(*shape, gen=None) -> torch.Tensor:
    """Random e4m3 codes, never zero (0x00, 0x80) nor NaN (0x7f, 0xff)."""
    codes = torch.randint(1, 127, shape, generator=gen, dtype=torch.int16)  # 0x01..0x7e
    sign = torch.randint(0, 2, shape, generator=gen, dtype=torch.int16) * 128
    return (codes + sign).to(torch.uint8).view(FP8)


def dequantize_ref(x, descale, cu):
    y = torch.zeros(x.shape, dtype=torch.float32)
    for b in range(len(cu) - 1):
        s, e = int(cu[b]), int(cu[b + 1])
        y[s:e] = x[s:e].float() * descale[b][None, :, None]
    return y


# ----------------------------------------------------------------------------- dequantize_rows
@interp
@pytest.mark.parametrize("lengths,tail", [([0, 5, 0, 33, 1, 0], 4), ([40], 0), ([0, 0], 3),
                                          ([7, 0, 19], 0)])
@pytest.mark.parametrize("hkv", [1, 4])
@pytest.mark.parametrize("d", [64, 128])
def test_dequantize_rows(d, hkv, lengths, tail):
    """x * descale[b(row), h] per row; empty sequences take no row; rows past the last
    sequence (tail) are 0."""
    gen = torch.Generator().manual_seed(d + 7 * hkv + len(lengths))
    cu = offsets(torch.tensor(lengths))
    n = int(cu[-1]) + tail
    x = random_e4m3(n, hkv, d, gen=gen)
    descale = torch.rand(len(lengths), hkv, generator=gen) * 4 + 0.01
    y = dequantize_rows(x, descale, cu)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    want = dequantize_ref(x, descale, cu)
    assert torch.equal(y, want.to(torch.bfloat16))  # fp32 product, rounded to nearest
    assert (y[int(cu[-1]):] == 0).all()
    assert (y[: int(cu[-1])] != 0).all()  # every code is nonzero, every descale too


@interp
def test_dequantize_rows_strided():
    """A head-sliced view (strides of its own) reads the same values as a copy."""
    gen = torch.Generator().manual_seed(3)
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    full = random_e4m3(10, 6, 64, gen=gen)
    x = full[:, 1:5]
    descale = torch.rand(3, 4, generator=gen) + 0.5
    torch.testing.assert_close(dequantize_rows(x, descale, cu),
                               dequantize_rows(x.contiguous(), descale, cu), rtol=0, atol=0)


def test_dequantize_rows_sm90():
    """The kernel compiles for the GPU (the interpreter accepts more) without spills."""
    from harness.compile_check import compile_kernel
    from jagged import fp8
    sig = {"x_ptr": "*fp8e4nv", "descale_ptr": "*fp32", "cu_ptr": "*i32", "y_ptr": "*bf16",
           "n_rows": "i32", "H": "i32", "B": "i32", "steps": "i32", "stride_xt": "i32",
           "stride_xh": "i32"}
    rep = compile_kernel(fp8._dequantize_kernel, sig,
                         dict(D=128, BLOCK_D=128, BLOCK_R=fp8.BLOCK_ROWS), arch=90,
                         num_warps=4, name="dequantize_rows D128")
    print(rep.row())
    assert not rep.spills, rep.row()
    assert "cvt.rn.f16x2.e4m3x2" in rep.ptx, rep.row()  # e4m3 converts in pairs


# ----------------------------------------------------------------------------- compile (sm_90a)
# (head_dim, length bucket, causal, broadcast_q): one quick build, the rest under -m matrix
FP8_BUILDS = [(128, "long", True, False)]
FP8_MATRIX = [(64, "long", False, False), (128, "long", False, False), (64, "long", True, False),
              (128, "short", False, True), (64, "short", True, False),
              (128, "short", True, False), (64, "short", False, True)]


def compile_fp8(d, bucket, causal, bq):
    from harness.compile_check import compile_kernel
    from kernels_tlx import fwd_hopper as fh
    cfg = fh.CONFIGS[(d, bucket, causal)]
    name = f"fwd fp8 D{d} {bucket} {'causal' if causal else 'full'}{' bq' if bq else ''}"
    return cfg, compile_kernel(fh.fwd_kernel, fh.signature(cfg, d, "fp8e4nv"),
                               fh.kernel_args(cfg, d, causal, bq, fp8=True), arch=90,
                               num_warps=4, num_stages=1, name=name)


def wgmma_lines(ptx: str, operand: str) -> list[str]:
    return [ln for ln in ptx.splitlines()
            if "wgmma.mma_async" in ln and f".{operand}.{operand}" in ln]


@pytest.mark.parametrize("build", FP8_BUILDS + [pytest.param(b, marks=pytest.mark.matrix)
                                                for b in FP8_MATRIX],
                         ids=lambda b: "D{}-{}-{}{}".format(
                             b[0], b[1], "causal" if b[2] else "full", "-bq" if b[3] else ""))
def test_fwd_fp8_sm90(build):
    """S = Q K^T an e4m3 x e4m3 -> fp32 wgmma (k32 steps), P V the bf16 one; no spills;
    shared memory within the limit and below the 16-bit build's (Q and K in e4m3 and the
    bf16 O staging buffers: less than Q and K in bf16)."""
    pytest.importorskip("triton")
    from harness.compile_check import SMEM_LIMIT
    d, bucket, causal, bq = build
    cfg, rep = compile_fp8(d, bucket, causal, bq)
    e4m3, bf16 = wgmma_lines(rep.ptx, "e4m3"), wgmma_lines(rep.ptx, "bf16")
    print(rep.row(), f"e4m3 wgmma x{len(e4m3)} bf16 wgmma x{len(bf16)}")
    assert e4m3 and bf16 and len(e4m3) + len(bf16) == rep.mma_count, rep.row()
    assert all(f"n{cfg.block_n}k32.f32.e4m3" in ln for ln in e4m3), e4m3[0]
    assert all(f"n{d}k16.f32.bf16" in ln for ln in bf16), bf16[0]
    assert "cvt.rn.bf16x2.f32" in rep.ptx, rep.row()  # P packed to bf16 two a cvt
    assert not rep.spills, f"spills / local memory: {rep.row()}"
    assert rep.total_smem <= SMEM_LIMIT[90], rep.row()
    n_c = cfg.block_m // 64
    bf16_smem = 2 * d * (64 * n_c * cfg.num_buffers_q + 2 * cfg.block_n * cfg.num_buffers_kv)
    assert rep.total_smem < bf16_smem, rep.row()
    assert len(rep.setmaxnreg) >= 2, rep.row()


# ----------------------------------------------------------------------------- GPU
def quantize(x, cu, group, gen):
    """x [N, H, D] fp32 -> (e4m3, descale fp32 [B, H // group]): per (sequence, kv head),
    descale = amax / 448 (1 for an empty one). cu an int B: x is one dense block
    (broadcast Q) shared by B sequences, whose descales differ by random factors."""
    n, h, d = x.shape
    hkv = h // group
    xg = x.view(n, hkv, group, d)
    if isinstance(cu, int):  # dense, shared by cu sequences
        amax = xg.abs().amax(dim=(0, 2, 3)).clamp_min(1e-6)
        xq = (xg / (amax / E4M3_MAX)[None, :, None, None]).view(n, h, d).to(FP8)
        factor = torch.rand(cu, hkv, generator=gen) * 1.5 + 0.5
        return xq, (amax / E4M3_MAX)[None, :] * factor
    xq = torch.empty(n, h, d, dtype=FP8)
    descale = torch.ones(len(cu) - 1, hkv)
    for b in range(len(cu) - 1):
        s, e = int(cu[b]), int(cu[b + 1])
        if e > s:
            amax = xg[s:e].abs().amax(dim=(0, 2, 3)).clamp_min(1e-6)
            descale[b] = amax / E4M3_MAX
            xq[s:e] = (xg[s:e] / descale[b][None, :, None, None]).view(e - s, h, d).to(FP8)
    return xq, descale


def attention_ref(q, k, v, causal, scale, dtype):
    """One sequence, every head: q [Lq, H, D], k / v [Lk, H, D] (GQA expanded), each op in
    `dtype` -> (o fp32 [Lq, H, D], lse fp32 [H, Lq]); a row that sees no key: 0, -inf."""
    lq, lk = q.shape[0], k.shape[0]
    q, k, v = (t.to(dtype).transpose(0, 1) for t in (q, k, v))
    s = (q @ k.transpose(1, 2)) * scale
    keep = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
    if causal:
        i = torch.arange(lq, device=q.device)[:, None]
        keep = torch.arange(lk, device=q.device)[None, :] <= i + (lk - lq)
    s = s.masked_fill(~keep, float("-inf"))
    seen = keep.any(1)
    lse = torch.logsumexp(s.float(), -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    o = (p @ v).float().transpose(0, 1)
    o[~seen] = 0.0
    lse[:, ~seen] = float("-inf")
    return o, lse


GPU_CASES = {  # name: (lengths q, lengths k); None: k's lengths are q's
    "self": ([0, 1, 300, 129, 64, 0, 517, 2], None),
    "cross": ([5, 0, 1, 200, 130, 64, 90], [0, 7, 1, 333, 64, 250, 3]),
    "short": ([0, 1, 17, 64, 33, 50], None),   # row windows: each row its own descales
}


def _poison(*shapes_dtypes):
    """Fill and free blocks the size of the outputs: the forward's torch.empty is likely
    to reuse them, so rows it never writes show as NaN."""
    blocks = [torch.full(s, float("nan"), dtype=dt, device="cuda") for s, dt in shapes_dtypes]
    del blocks


STYLES = ["cute", "tlx"]


def fwd_hopper_of(style: str):
    """The Hopper forward module of a style (kernels_<style>.fwd_hopper)."""
    return importlib.import_module(f"kernels_{style}.fwd_hopper")


def run_fp8_case(style, d, causal, case, broadcast_q, heads=8, hkv=2, seed=0):
    fwd_hopper = fwd_hopper_of(style)
    gen = torch.Generator().manual_seed(seed)
    len_q, len_k = GPU_CASES[case]
    len_k = len_k or len_q
    B = len(len_k)
    group = heads // hkv
    cu_k = offsets(torch.tensor(len_k))
    if broadcast_q:
        L_q = 96
        cu_q = None
        q32 = torch.randn(L_q, heads, d, generator=gen)
        q8, qd = quantize(q32, B, group, gen)
        n_out, max_q = B * L_q, L_q
    else:
        cu_q = offsets(torch.tensor(len_q))
        q32 = torch.randn(int(cu_q[-1]), heads, d, generator=gen)
        q8, qd = quantize(q32, cu_q, group, gen)
        n_out, max_q = int(cu_q[-1]), max(len_q)
    k8, kd = quantize(torch.randn(int(cu_k[-1]), hkv, d, generator=gen) * 2, cu_k, 1, gen)
    v8, vd = quantize(torch.randn(int(cu_k[-1]), hkv, d, generator=gen), cu_k, 1, gen)
    scale = 1.0 / math.sqrt(d)

    dev = [t.cuda() for t in (q8, k8, v8, cu_k, qd, kd, vd)]
    q8c, k8c, v8c, cu_kc, qdc, kdc, vdc = dev
    cu_qc = cu_q.cuda() if cu_q is not None else None
    _poison(((n_out, heads, d), torch.bfloat16), ((heads, n_out), torch.float32))
    out, lse = fwd_hopper.forward(q8c, k8c, v8c, cu_qc, cu_kc, max_q, max(len_k), causal, scale,
                                  broadcast_q, descale=(qdc, kdc, vdc))
    torch.cuda.synchronize()
    assert out.dtype == torch.bfloat16 and out.shape == (n_out, heads, d)
    assert lse.dtype == torch.float32 and lse.shape == (heads, n_out)
    assert not out.isnan().any(), "rows of out left unwritten (NaN)"
    assert not lse.isnan().any(), "lse left unwritten (NaN)"

    errs = {"o": [0.0, 0.0], "lse": [0.0, 0.0]}  # max |kernel - fp32|, max |bf16 - fp32|
    for b in range(B):
        ks, ke = int(cu_k[b]), int(cu_k[b + 1])
        if broadcast_q:
            qs, qe, os_ = 0, L_q, b * L_q
        else:
            qs, qe = int(cu_q[b]), int(cu_q[b + 1])
            os_ = qs
        if qe == qs:
            continue
        qr = (q8c[qs:qe].float().view(qe - qs, hkv, group, d)
              * qdc[b][None, :, None, None]).view(qe - qs, heads, d)
        kr = (k8c[ks:ke].float() * kdc[b][None, :, None]).repeat_interleave(group, 1)
        vr = (v8c[ks:ke].float() * vdc[b][None, :, None]).repeat_interleave(group, 1)
        o32, l32 = attention_ref(qr, kr, vr, causal, scale, torch.float32)
        o16, l16 = attention_ref(qr, kr, vr, causal, scale, torch.bfloat16)
        o_k = out[os_:os_ + qe - qs].float()
        l_k = lse[:, os_:os_ + qe - qs]
        seen = torch.isfinite(l32)
        assert torch.equal(torch.isfinite(l_k), seen), f"sequence {b}: rows with no key differ"
        assert (o_k[~seen.T] == 0).all(), f"sequence {b}: a row with no key is not 0"
        for name, got, want, ref16 in (("o", o_k, o32, o16), ("lse", l_k[seen], l32[seen],
                                                              l16[seen])):
            if got.numel():
                errs[name][0] = max(errs[name][0], (got - want).abs().max().item())
                errs[name][1] = max(errs[name][1], (ref16 - want).abs().max().item())
    for name, (err, err16) in errs.items():
        tol = 2 * err16 + 1e-3
        print(f"{name}: max err {err:.3e}, bf16 reference {err16:.3e}, tol {tol:.3e}")
        assert err <= tol, f"{name}: max error {err:.3e} > {tol:.3e} (bf16 reference {err16:.3e})"


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("style", STYLES)
def test_fwd_fp8_gpu(style, d, causal, case):
    """e4m3 q / k / v with descales per (sequence, kv head), GQA 4:1, jagged lengths with
    0 and 1 (cross: sequences with no keys, causal rows that see none); "short" runs on
    row windows."""
    len_q, len_k = GPU_CASES[case]
    n_k = sum(len_k or len_q)
    assert fwd_hopper_of(style).takes_windows(sum(len_q), n_k, len(len_q), max(len_q),
                                              False) == (case == "short")
    run_fp8_case(style, d, causal, case, broadcast_q=False, seed=d + causal)


@pytest.mark.gpu
@pytest.mark.parametrize("d,causal", [(128, False), (64, True)])
@pytest.mark.parametrize("style", STYLES)
def test_fwd_fp8_gpu_broadcast_q(style, d, causal):
    """Broadcast-Q: one dense e4m3 q, its descale still the tile's sequence's."""
    run_fp8_case(style, d, causal, "cross", broadcast_q=True, seed=100 + d)


@pytest.fixture(params=["tiles", "pass"])
def cute_v(request, monkeypatch):
    """CuteDSL's fp8 forward with V converted in the kernel ("tiles": the V pass then
    fails the test if it runs) or by the once-a-call V pass ("pass"), whatever
    fp8_v_tiles would pick. -> the way."""
    from kernels_cute import fwd_hopper as F, host
    tiles = request.param == "tiles"
    monkeypatch.setattr(F, "FP8_V_TILES_MAX", math.inf if tiles else -1)
    if tiles:
        def no_pass(*args):
            raise AssertionError("the V pass ran with V tiles on")
        monkeypatch.setattr(host, "dequantize_rows", no_pass)
    return request.param


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_fwd_fp8_cute_v_gpu(d, causal, case, cute_v):
    """test_fwd_fp8_gpu's cases, CuteDSL, each way V reaches P V ("short": row windows,
    each row its own v_descale with V tiles)."""
    run_fp8_case("cute", d, causal, case, broadcast_q=False, seed=d + causal)


@pytest.mark.gpu
@pytest.mark.parametrize("d,causal", [(128, False), (64, True)])
def test_fwd_fp8_cute_v_gpu_broadcast_q(d, causal, cute_v):
    run_fp8_case("cute", d, causal, "cross", broadcast_q=True, seed=100 + d)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_fwd_fp8_v_tiles_nan_rows_gpu(d, causal, monkeypatch):
    """NaN codes (0x7f) in the last sequence's V rows: the conversion zeroes V rows past
    a sequence's keys (the next sequence's, in its last KV block), so the other
    sequences' out and lse are the call's without those codes, bit for bit."""
    from kernels_cute import fwd_hopper as F
    monkeypatch.setattr(F, "FP8_V_TILES_MAX", math.inf)
    gen = torch.Generator().manual_seed(7 + d)
    lens, heads, hkv = [300, 129, 77], 8, 2
    cu = offsets(torch.tensor(lens))
    n, last = int(cu[-1]), int(cu[-2])
    q8, qd = quantize(torch.randn(n, heads, d, generator=gen), cu, heads // hkv, gen)
    k8, kd = quantize(torch.randn(n, hkv, d, generator=gen), cu, 1, gen)
    v8, vd = quantize(torch.randn(n, hkv, d, generator=gen), cu, 1, gen)
    v_nan = v8.clone()
    v_nan.view(torch.uint8)[last:] = 0x7F
    dev = lambda *ts: [t.cuda() for t in ts]
    q8, k8, cu, qd, kd, vd = dev(q8, k8, cu, qd, kd, vd)
    outs = [F.forward(q8, k8, v.cuda(), cu, cu, max(lens), max(lens), causal, d ** -0.5,
                      False, descale=(qd, kd, vd)) for v in (v8, v_nan)]
    torch.cuda.synchronize()
    (o0, l0), (o1, l1) = outs
    assert not o0.isnan().any() and o1[last:].isnan().all()
    assert torch.equal(o0[:last], o1[:last]) and torch.equal(l0[:, :last], l1[:, :last])


@pytest.mark.gpu
@pytest.mark.parametrize("style", STYLES)
def test_fwd_16bit_unchanged_gpu(style):
    """Without descale the 16-bit path: bf16 in, bf16 out, no fp8 build involved."""
    fwd_hopper = fwd_hopper_of(style)
    torch.manual_seed(0)
    cu = torch.tensor([0, 0, 100, 101, 300], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(300, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse = fwd_hopper.forward(q, k, v, cu, cu, 199, 199, True, 0.125, False)
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
