"""Compile-only checks of kernels_tlx.bwd_hopper for sm_90a (no GPU needed):
wgmma present, no spills, shared memory within 227 KB, for every tile config
(bwd_hopper.CONFIGS) x head dim x (causal, broadcast-Q) mode. The configs listed in
bwd_hopper.SPILL_FREE must compile with zero spill instructions and no stack/local
memory; the others ("base" at D=128, v1) are expected to spill (xfail, kept for A/B).
The main-kernel compiles run batched in two subprocesses (one Triton import each)."""
import pytest

triton = pytest.importorskip("triton")

try:
    from harness.compile_check import compile_kernel
except Exception as e:  # pragma: no cover
    pytest.skip(f"harness.compile_check unavailable: {e}", allow_module_level=True)

from kernels_tlx import bwd_hopper as bw

import os
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

MODES = [(c, bq) for c in (False, True) for bq in (False, True)]
# (config name, head dim, causal, broadcast-Q, dtype): every config x head dim x mode in
# bf16, plus fp16 spot checks
CASES = [(n, d, c, bq, "bf16") for n in bw.CONFIGS for d in (64, 128) for c, bq in MODES]
CASES += [(n, 128, True, False, "fp16") for n in bw.SPILL_FREE[128]]
CASES += [("base", 64, False, True, "fp16")]


def main_signature(dt, d, cfg):
    bm, bn = cfg.block_m, cfg.block_n
    sig = {"q_desc": f"tensordesc<{dt}[{bm},{d}]>", "k_desc": f"tensordesc<{dt}[{bn},{d}]>",
           "v_desc": f"tensordesc<{dt}[{bn},{d}]>", "do_desc": f"tensordesc<{dt}[{bm},{d}]>",
           "lse_ptr": "*fp32", "delta_ptr": "*fp32", "dq_desc": f"tensordesc<fp32[{bm},{d}]>",
           "dq_acc_ptr": "*fp32", "dk_ptr": f"*{dt}", "dv_ptr": f"*{dt}"}
    sig.update({n: "*i32" for n in ("cu_q_ptr", "cu_k_ptr", "tile_b_ptr", "tile_n_ptr", "n_tiles_ptr")})
    sig.update(scale="fp32", L_q="i32", stride_k_tok="i32", stride_k_h="i32", stride_lse_h="i32")
    return sig


def main_job(name, d, causal, bq, dt="bf16", H=4, HKV=2):
    """A harness.compile_check job (the dict `_run_job` takes) for the main kernel."""
    cfg = bw.CONFIGS[name]
    return dict(module=bw.__name__, qualname="_bwd_main", signature=main_signature(dt, d, cfg),
                constexprs=dict(H=H, HKV=HKV, D=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                                CAUSAL=causal, BROADCAST_Q=bq, TMA_REDUCE=True, DQ_T=cfg.dq_t),
                arch=90, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                name=f"{name} D{d} {'causal' if causal else 'full'} {'bq' if bq else 'packed'} {dt}",
                opts={})


_BATCH = ("import pickle, sys\n"
          "from harness.compile_check import _run_job\n"
          "out = []\n"
          "for job in pickle.loads(sys.stdin.buffer.read()):\n"
          "    try:\n"
          "        out.append(_run_job(job))\n"
          "    except Exception as e:\n"
          "        out.append(f'{type(e).__name__}: {e}'[-2000:])\n"
          "sys.stdout.buffer.write(pickle.dumps(out))\n")


def compile_batch(jobs, procs=2):
    """Compile many jobs in `procs` subprocesses (interpreter off, one Triton import
    each, not one per kernel): [CompileReport or error string] in the jobs' order."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in sys.path if p])
    chunks = [jobs[i::procs] for i in range(procs)]

    def run(chunk):
        if not chunk:
            return []
        res = subprocess.run([sys.executable, "-c", _BATCH], input=pickle.dumps(chunk),
                             env=env, capture_output=True)
        if res.returncode != 0:
            err = res.stderr.decode(errors="replace")[-2000:]
            return [f"subprocess failed: {err}"] * len(chunk)
        return pickle.loads(res.stdout)

    with ThreadPoolExecutor(procs) as ex:
        parts = list(ex.map(run, chunks))
    out = [None] * len(jobs)
    for i, part in enumerate(parts):
        out[i::procs] = part
    return out


@pytest.fixture(scope="module")
def reports():
    return dict(zip(CASES, compile_batch([main_job(*c) for c in CASES])))


@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_main_compiles_to_wgmma(reports, case):
    name, d = case[:2]
    rep = reports[case]
    assert not isinstance(rep, str), rep
    print(rep.row())
    assert rep.has_mma, "no wgmma in the PTX"
    assert rep.fits(), f"shared memory {rep.total_smem} B > 227 KB"
    if name not in bw.SPILL_FREE[d]:  # "base" at D=128: 255 regs, 72-91 spill insts (A/B only)
        assert rep.spills, f"{name} D{d} is spill-free now: add it to SPILL_FREE ({rep.row()})"
        pytest.xfail(f"known to spill, kept for A/B: {rep.row()}")
    assert not rep.spills, f"spills: {rep.row()}"


def test_launch_never_specializes_l_q():
    """Compiled as the launch would at L_q = 1 (broadcast-Q, one query head per KV head),
    the Q loop has one trip and the tile loop's K/V get multi-buffered instead: 354 KB
    of shared memory at D = 128, base_s3, an OutOfResources in the GPU matrix. So the
    kernel must not specialize L_q; the compile cases above use it unspecialized."""
    jit = bw._bwd_main  # a JITFunction, or an InterpretedFunction under TRITON_INTERPRET
    assert list(getattr(jit, "kwargs", {}).get("do_not_specialize",
                                                getattr(jit, "do_not_specialize", []))) == ["L_q"]
    job = main_job("base_s3", 128, False, True, H=2, HKV=2)
    del job["signature"]["L_q"]
    job["constexprs"]["L_q"] = 1
    rep = compile_batch([job], procs=1)[0]
    assert not isinstance(rep, str), rep
    assert rep.total_smem > 227 * 1024, rep.row()  # the failure this guards against


def test_defaults_are_known_configs():
    # The defaults are chosen by measurement (bwd_hopper.DEFAULTS); "base_s3" at D=128
    # spills (the xfail above) and still beats every spill-free config on the H200.
    for (d, _), name in bw.DEFAULTS.items():
        assert name in bw.CONFIGS, (d, name)


@pytest.mark.parametrize("d", (64, 128))
def test_pre_post_compile(d):
    pre = compile_kernel(
        bw._bwd_preprocess,
        {"out_ptr": "*bf16", "dout_ptr": "*bf16", "delta_ptr": "*fp32", "dq_acc_ptr": "*fp32",
         "sched_ptr": "*i32", "n_rows": "i32", "stride_o_tok": "i32", "stride_o_h": "i32", "stride_do_tok": "i32",
         "stride_do_h": "i32", "stride_delta_h": "i32"},
        constexprs=dict(H=4, D=d, ROWS=16, ZERO_DQ=True), arch=90, num_warps=4)
    post = compile_kernel(
        bw._bwd_postprocess,
        {"dq_acc_ptr": "*fp32", "dq_ptr": "*bf16", "n_elem": "i32", "n_slots": "i32",
         "slot_stride": "i32", "scale": "fp32"},
        constexprs=dict(BLOCK=1024), arch=90, num_warps=4)
    assert not pre.spills and not post.spills


def table(reps) -> str:
    """Markdown table of the bf16 compile reports, one row per (config, head dim), the
    four modes in the order full/packed, full/bq, causal/packed, causal/bq (PERF.md)."""
    rows = ["| config | BM x BN, warps, stages, dq_t | D | regs | spill insts | stack B | "
            "smem KB | wgmma |", "|---|---|---|---|---|---|---|---|"]
    for name, c in bw.CONFIGS.items():
        for d in (64, 128):
            reps_ = [reps.get((name, d, causal, bq, "bf16")) for causal, bq in MODES]
            if any(r is None or isinstance(r, str) for r in reps_):
                rows.append(f"| {name} | | {d} | ERROR | | | | |")
                continue
            rows.append(f"| {name} | {c.block_m}x{c.block_n}, {c.num_warps}, {c.num_stages}, "
                        f"{int(c.dq_t)} | {d} | {'/'.join(str(r.registers) for r in reps_)} | "
                        f"{'/'.join(str(r.spill_insts) for r in reps_)} | "
                        f"{max(r.stack_bytes for r in reps_)} | "
                        f"{max(r.total_smem for r in reps_) / 1024:.1f} | "
                        f"{'/'.join(sorted({str(r.mma_count) for r in reps_}))} |")
    return "\n".join(rows)


if __name__ == "__main__":  # PYTHONPATH=. python tests/test_bwd_compile.py > table.md
    print(table(dict(zip(CASES, compile_batch([main_job(*c) for c in CASES])))))


# ---- warp-specialized TLX kernel (impl="ws")
def ws_signature(dt, d, bm=None):
    from kernels_tlx import bwd_hopper_ws as ws
    cfg = bw.config(d)
    bm, bnc = bm or cfg["BLOCK_M"], cfg["BLOCK_N"] // 2
    sig = {"q_desc": f"tensordesc<{dt}[{bm},{d}]>", "k_desc": f"tensordesc<{dt}[{bnc},{d}]>",
           "v_desc": f"tensordesc<{dt}[{bnc},{d}]>", "do_desc": f"tensordesc<{dt}[{bm},{d}]>",
           "lse_ptr": "*fp32", "delta_ptr": "*fp32", "dq_desc": f"tensordesc<fp32[{ws.dq_rows(bm)},{ws.dq_cols(d)}]>",
           "dk_ptr": f"*{dt}", "dv_ptr": f"*{dt}"}
    sig.update({n: "*i32" for n in ("cu_q_ptr", "cu_k_ptr", "tile_b_ptr", "tile_n_ptr", "n_tiles_ptr",
                                    "sched_ptr")})
    sig.update(scale="fp32", L_q="i32", stride_k_tok="i32", stride_k_h="i32", stride_lse_h="i32")
    return sig


def compile_ws(d, causal, bq, dt="bf16", H=4, HKV=2, bm=None, diag=False, stages=None,
               dynamic=None, kv_stages=None, dq_sum=True):
    """(CompileReport, TTGIR text) of the ws kernel, compiled as backward(impl="ws") launches
    it (bm: another BLOCK_M, e.g. 64 as JAGGED_BWD_WS_BLOCK_M=64 selects; diag: DIAG_MASK, as
    JAGGED_BWD_WS_DIAG_MASK=1 selects; dynamic: DYNAMIC, by default as bwd_dynamic;
    kv_stages: KV_STAGES_M64, by default as ws_kv_stages; dq_sum: DQ_SUM; stages: the Q
    loop's num_stages, by default as ws_config picks it for the step)."""
    pytest.importorskip("triton.language.extra.tlx")
    from jagged.tiles import bwd_dynamic
    from kernels_tlx import bwd_hopper_ws as ws
    cfg = bw.config(d)
    dynamic = bwd_dynamic(causal, bq) if dynamic is None else dynamic
    kv_stages = kv_stages or bw.ws_kv_stages(d, bm or cfg["BLOCK_M"])
    if stages is None:
        stages = bw.ws_config(d, mean_k=None if (bm or 64) == 64 else 0).num_stages
    rep = compile_kernel(
        ws._bwd_main_ws, ws_signature(dt, d, bm),
        constexprs=dict(H=H, HKV=HKV, D=d, BLOCK_M=bm or cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                        CAUSAL=causal, BROADCAST_Q=bq, DQ_COLS=ws.dq_cols(d), DIAG_MASK=diag,
                        DYNAMIC=dynamic, KV_STAGES_M64=kv_stages, DQ_SUM=dq_sum,
                        Q_LOOP_STAGES=stages),
        arch=90, num_warps=4, num_stages=stages,
        name=f"bwd_main_ws{bm or ''}{' diag' if diag else ''}{' s0' if not stages else ''}"
             f"{' dyn' if dynamic else ''}{f' kv{kv_stages}' if (bm or cfg['BLOCK_M']) == 64 and d == 64 else ''}{'' if dq_sum else ' nosum'} D{d} "
             f"{'causal' if causal else 'full'} {'bq' if bq else 'packed'}")
    return rep, rep.ttgir


@pytest.mark.parametrize("bq", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_ws_compiles(d, causal, bq):
    """The 32-row-step kernel (short mean lengths; else under JAGGED_BWD_WS_BLOCK_M=32)."""
    rep, ttgir = compile_ws(d, causal, bq, bm=32)
    print(rep.row(), f" wait0={ttgir.count('pendings = 0')}")
    assert rep.has_mma and rep.setmaxnreg  # setmaxnreg gone: the register budget was exceeded
    # causal packed builds take their tiles from the counter (jagged.tiles.bwd_dynamic)
    assert ("atom.global.gpu.relaxed.add" in rep.ptx) == (causal and not bq)
    assert rep.fits(), f"shared memory {rep.total_smem} B > 227 KB"
    # D=128 spilled 24-54 instructions in the tile loop while the K_c/V_c descriptors
    # were held across the Q-block loop; 64-row steps or whole-tile dK/dV pointer tensors
    # spilled 500+
    assert not rep.spills, f"spills: {rep.row()}"
    # each consumer's Q loop carries the next step's LSE and delta, [BLOCK_M] vectors in a
    # slice of the S^T accumulator layout (loaded in it: no layout conversion)
    import re
    bm = 32
    vec = rf"tensor<{bm}xf32, #ttg\.slice<\{{dim = 0, parent = #mma\d*\}}>>"
    loops = [ln for ln in ttgir.splitlines()
             if "scf.for" in ln and len(re.findall(vec, ln.split("->")[-1])) == 2]
    assert len(loops) == 2, f"Q loops carrying LSE / delta: {len(loops)}"
    loads = re.findall(rf"tt\.load %\S+, %\S+, %\S+ : (tensor<{bm}x!tt\.ptr<f32>, [^>]*>>)",
                       ttgir)
    assert loads and all("slice<{dim = 0, parent = #mma" in t for t in loads), loads


def test_ws_replicas_get_their_own_dq_stage():
    """The two consumer replicas (async_task(replicate=2)) must use dq_smem[0] / dq_full[0]
    and dq_smem[1] / dq_full[1]. The replica id read inside the jit helper `compute` (traced
    once) gave both replicas 0: dq_full[1] never arrived and the GPU hung (sessions 3-5).
    In the TTGIR each replica is its own 4-warp partition; `dqc = dq_smem[cid]` indexes the
    staging buffer by a constant, which must be 0 in one and 1 in the other."""
    import re
    _, ttgir = compile_ws(64, False, False, bm=32)
    parts = re.split(r"\n\s*partition\d+\(", ttgir)[1:]
    compute = [p for p in parts if re.search(r"\)\s*num_warps\(4\)", p)]
    idx = sorted(int(m) for p in compute
                 for m in re.findall(r"%dqc = ttg\.memdesc_index %\w+\[%c(\d+)_i32", p))
    assert len(compute) == 2 and idx == [0, 1], f"dq_smem index per consumer replica: {idx}"


@pytest.mark.parametrize("dt", ["bf16", "fp16"])
@pytest.mark.parametrize("bq", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_ws_m64_compiles(causal, bq, dt):
    """The 64-row-step variant, the D = 128 default (the Q loop at num_stages=0): one K/V stage,
    lse / delta staged in smem by the load task, dQ reduced by the load task (no reduce warp),
    so 3 warpgroups and 240 registers a consumer. Compiled as is (two K/V stages, lse / delta
    carried, 232 registers) it needed 263 KB and spilled 198 instructions."""
    rep, ttgir = compile_ws(128, causal, bq, dt, bm=64)
    print(rep.row())
    assert rep.has_mma, "no wgmma in the PTX"
    assert 240 in rep.setmaxnreg, rep.setmaxnreg  # gone: the register budget was exceeded
    assert rep.fits(), f"shared memory {rep.total_smem} B > 227 KB"
    assert not rep.spills, f"spills: {rep.row()}"
    assert "num_warps(1)" not in ttgir, "a reduce_dq warp partition: not 384 threads"


@pytest.mark.parametrize("kv_stages", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_ws_m64_d64_compiles(causal, kv_stages):
    """64-row steps at D = 64 (the default since session 18): spill-free in 130 KB with one
    K/V stage, 162 KB with two (the default there; JAGGED_BWD_WS_KV_STAGES=1 for one), the
    consumers' dQ partials summed in smem (DQ_SUM)."""
    rep, ttgir = compile_ws(64, causal, False, bm=64, kv_stages=kv_stages)
    print(rep.row())
    assert rep.has_mma and 240 in rep.setmaxnreg, rep.setmaxnreg
    assert rep.fits() and not rep.spills, rep.row()
    assert "num_warps(1)" not in ttgir, "a reduce_dq warp partition: not 384 threads"
    # DQ_SUM: one dQ box a step at each of the load task's two reduce sites (NC without)
    assert rep.ptx.count("cp.reduce.async.bulk") == 2


@pytest.mark.parametrize("causal", [False, True])
def test_ws_m64_stages0_compiles(causal):
    """JAGGED_BWD_WS_NUM_STAGES=0 at 64-row steps: no pipeliner wgmma pass (fewer wait-0
    after the dots), still spill-free within the same registers and smem. It must reach
    the Q loop (Q_LOOP_STAGES): until session 18 the loop's own num_stages=1 won and the
    switch compiled the same PTX."""
    rep, _ = compile_ws(128, causal, False, bm=64, stages=0)
    base, _ = compile_ws(128, causal, False, bm=64, stages=1)
    print(rep.row())
    assert rep.has_mma and 240 in rep.setmaxnreg, rep.setmaxnreg
    assert rep.fits() and not rep.spills, rep.row()
    wait0 = "wgmma.wait_group.sync.aligned 0;"
    # two consumers: 9 -> 3 waits of 0 each
    assert (rep.ptx.count(wait0), base.ptx.count(wait0)) == (6, 18)


def test_ws_config_env(monkeypatch):
    """The ws tile: 64-row steps (128 at D = 64), 32 at short mean lengths;
    JAGGED_BWD_WS_BLOCK_M (read per call) picks 32, 64 or 128, JAGGED_BWD_WS_KV_STAGES the
    K/V stages of 64-row steps."""
    monkeypatch.delenv(bw.WS_BLOCK_M_ENV, raising=False)
    monkeypatch.delenv(bw.WS_STAGES_ENV, raising=False)
    assert bw.ws_config(128).block_m == 64 and bw.ws_config(64).block_m == 128
    # the Q loop at num_stages=0 only at 64-row steps and D = 128
    assert bw.ws_config(128).num_stages == bw.WS_Q_LOOP_STAGES_D128 == 0
    assert bw.ws_config(64).num_stages == 1
    assert bw.ws_config(128, mean_k=bw.WS_SHORT_MEAN_K).num_stages == 1
    assert bw.ws_config(64, mean_k=bw.WS_SHORT_MEAN_K).block_m == 32
    assert bw.ws_config(128).block_n == bw.ws_config(64).block_n == 128
    assert bw.ws_config(128, mean_k=bw.WS_SHORT_MEAN_K).block_m == 32  # short sequences
    assert bw.ws_config(128, mean_k=bw.WS_SHORT_MEAN_K + 1).block_m == 64
    monkeypatch.setenv(bw.WS_BLOCK_M_ENV, "32")
    assert bw.ws_config(128).block_m == 32 and bw.config(128)["BLOCK_M"] == 32
    monkeypatch.setenv(bw.WS_BLOCK_M_ENV, "64")
    assert bw.ws_config(128, mean_k=1.0).block_m == 64 and bw.ws_config(64).block_m == 64
    monkeypatch.setenv(bw.WS_STAGES_ENV, "0")
    assert bw.ws_config(128).num_stages == 0 and bw.ws_config(128).block_m == 64
    monkeypatch.setenv(bw.WS_STAGES_ENV, "1")
    assert bw.ws_config(128).num_stages == 1
    monkeypatch.setenv(bw.WS_BLOCK_M_ENV, "48")
    with pytest.raises(ValueError):
        bw.ws_config(128)
    monkeypatch.setenv(bw.WS_BLOCK_M_ENV, "64")
    monkeypatch.setenv(bw.WS_STAGES_ENV, "2")
    with pytest.raises(ValueError):
        bw.ws_config(128)
    monkeypatch.delenv(bw.WS_KV_STAGES_ENV, raising=False)
    assert bw.ws_kv_stages(64) == 2 and bw.ws_kv_stages(128) == 1
    monkeypatch.setenv(bw.WS_KV_STAGES_ENV, "1")
    assert bw.ws_kv_stages(64) == bw.ws_kv_stages(128) == 1
    monkeypatch.setenv(bw.WS_KV_STAGES_ENV, "2")  # 263 KB at D = 128: refused
    assert bw.ws_kv_stages(64) == 2
    with pytest.raises(ValueError):
        bw.ws_kv_stages(128)
    monkeypatch.delenv(bw.WS_DQ_SUM_ENV, raising=False)
    assert bw.ws_dq_sum()
    monkeypatch.setenv(bw.WS_DQ_SUM_ENV, "0")
    assert not bw.ws_dq_sum()


def _diag_steps(ifs):
    """scf.if ops that yield the 64 x 64 fp32 P^T block (the DIAG_MASK branch)."""
    return [ln for ln in ifs.splitlines() if "scf.if" in ln and "tensor<64x64xf32" in ln]


@pytest.mark.parametrize("dt", ["bf16", "fp16"])
@pytest.mark.parametrize("bq", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_ws_diag_mask_compiles(causal, bq, dt):
    """JAGGED_BWD_WS_DIAG_MASK=1 at D = 128, 64-row steps: the causal bound inside a branch
    taken only on the steps it cuts (sm_90a, causal bf16: the Q loop of a consumer is 438
    SASS instructions on the other steps, 581 with the mask on every step, 427 non-causal).
    Spill-free at 240 registers, same smem; non-causal compiles as without the switch.
    Built with the Q loop at num_stages=1, as measured: with the D = 128 default of 0
    (session 19) causal spills 4 instructions."""
    rep, ttgir = compile_ws(128, causal, bq, dt, bm=64, diag=True, stages=1)
    print(rep.row())
    assert rep.has_mma and 240 in rep.setmaxnreg, rep.setmaxnreg
    assert rep.fits(), f"shared memory {rep.total_smem} B > 227 KB"
    assert not rep.spills, f"spills: {rep.row()}"
    # one branch per consumer partition when causal, none otherwise
    assert len(_diag_steps(ttgir)) == (2 if causal else 0), _diag_steps(ttgir)


def test_ws_diag_mask_env(monkeypatch):
    monkeypatch.delenv(bw.WS_DIAG_MASK_ENV, raising=False)
    assert not bw.ws_diag_mask(True)
    monkeypatch.setenv(bw.WS_DIAG_MASK_ENV, "1")
    assert bw.ws_diag_mask(True) and not bw.ws_diag_mask(False)
    monkeypatch.setenv(bw.WS_DIAG_MASK_ENV, "yes")
    with pytest.raises(ValueError):
        bw.ws_diag_mask(True)


@pytest.mark.parametrize("bm", [32, 64])
def test_ws_causal_cut_keeps_the_mask(bm):
    """Pure Python (no compile): with DIAG_MASK, compute masks P^T by the key length on every
    step and by the causal bound only where causal_cut says the bound cuts the block. Over
    the schedule's steps (KV tiles, Q blocks from m_lo, both consumers), self and cross
    (bottom-right) lengths, that equals the full causal mask on every row the sequence has
    (rows past it get P = 0 from lse = +inf), and only the steps near the diagonal are cut:
    at most BN / bm + 1 per consumer and tile, whatever its length (the band of a consumer's
    64 keys, and for consumer 1 the rows from m_lo that see none of its keys)."""
    pytest.importorskip("numpy")
    from _causal import assert_cut_keeps_the_mask
    from kernels_tlx import bwd_hopper_ws as ws
    cut_fn = getattr(ws.causal_cut, "fn", ws.causal_cut)  # the jit function's Python body
    n_wg = ws.NUM_CONSUMERS.value
    assert_cut_keeps_the_mask(lambda nc0, m0, off: cut_fn(nc0, m0, off, 128 // n_wg), bm,
                              128, n_wg)


# ---- 128-row steps at D = 64 (the default there since session 20)
M128_CASES = [(c, bq, None, 1, "bf16") for c in (False, True) for bq in (False, True)]
M128_CASES += [(True, False, False, 1, "bf16"),   # causal packed from the static list
               (False, False, None, 0, "bf16"),   # JAGGED_BWD_WS_NUM_STAGES=0
               (True, False, None, 0, "bf16"),
               (True, False, None, 1, "fp16")]


@pytest.mark.parametrize("causal,bq,dynamic,stages,dt", M128_CASES,
                         ids=["-".join(map(str, c)) for c in M128_CASES])
def test_ws_m128_compiles(causal, bq, dynamic, stages, dt):
    """128-row steps at D = 64: 195 KB with one K/V stage, spill-free at 240 registers in
    every mode; the dQ rows split between the consumers, so each reduce-adds its own box
    (two boxes at each of the load task's two reduce sites, no DQ_SUM)."""
    rep, ttgir = compile_ws(64, causal, bq, dt, bm=128, dynamic=dynamic, stages=stages)
    print(rep.row())
    assert rep.has_mma and 240 in rep.setmaxnreg, rep.setmaxnreg
    assert rep.fits() and not rep.spills, rep.row()
    assert "num_warps(1)" not in ttgir, "a reduce_dq warp partition: not 384 threads"
    assert rep.ptx.count("cp.reduce.async.bulk") == 4
    # S^T / dP^T at 128 rows: N = 128 wgmmas (m64n128k16)
    assert "wgmma.mma_async.sync.aligned.m64n128k16" in rep.ptx


def test_ws_m128_config(monkeypatch):
    """JAGGED_BWD_WS_BLOCK_M=128 selects 128-row steps at D = 64 only; they have one K/V
    stage (JAGGED_BWD_WS_KV_STAGES=2 is refused there)."""
    monkeypatch.delenv(bw.WS_KV_STAGES_ENV, raising=False)
    monkeypatch.setenv(bw.WS_BLOCK_M_ENV, "128")
    assert bw.ws_config(64).block_m == 128 and bw.ws_config(64, mean_k=1.0).block_m == 128
    assert bw.config(64)["BLOCK_M"] == 128 and bw.config(64)["BLOCK_N"] == 128
    with pytest.raises(ValueError, match="head dim 64"):
        bw.ws_config(128)
    assert bw.ws_kv_stages(64, 128) == 1 and bw.ws_kv_stages(64, 64) == 2
    monkeypatch.setenv(bw.WS_KV_STAGES_ENV, "2")
    with pytest.raises(ValueError):
        bw.ws_kv_stages(64, 128)
    from kernels_tlx import bwd_hopper_ws as ws
    assert ws.dq_rows(128) == 64 and ws.dq_rows(64) == 64 and ws.dq_rows(32) == 32


def test_ws_m128_refused_at_d128(monkeypatch):
    """backward(impl="ws") at D = 128 under JAGGED_BWD_WS_BLOCK_M=128: a ValueError on the
    host, before any kernel runs (CPU tensors suffice)."""
    import torch
    monkeypatch.setenv(bw.WS_BLOCK_M_ENV, "128")
    n, H, D = 8, 2, 128
    q, k, v, out, dout = (torch.zeros(n, H, D, dtype=torch.bfloat16) for _ in range(5))
    lse = torch.zeros(H, n)
    cu = torch.tensor([0, n], dtype=torch.int32)
    with pytest.raises(ValueError, match="head dim 64"):
        bw.backward(dout, q, k, v, out, lse, cu, cu, n, n, False, D ** -0.5, False, impl="ws")
