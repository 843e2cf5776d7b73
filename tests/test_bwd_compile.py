"""Compile-only checks of kernels_tlx.bwd_hopper for sm_90a (no GPU needed): the default
builds (bwd_hopper.CONFIGS x causal x broadcast-Q, bf16, and fp16 spot checks) have their
wgmmas, no spill, shared memory within 227 KB and the structure their step is built on.
CI builds CI_CASES, the first key-window build and one head dim's pre/postprocess; the
rest run under `-m matrix`. The main-kernel compiles run batched in two subprocesses (one
Triton import each)."""
import os
import pickle
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

triton = pytest.importorskip("triton")
pytest.importorskip("triton.language.extra.tlx")

try:
    from harness.compile_check import compile_kernel, tlx_bwd_job
except Exception as e:  # pragma: no cover
    pytest.skip(f"harness.compile_check unavailable: {e}", allow_module_level=True)

from kernels_tlx import bwd_hopper as bw  # noqa: E402

MODES = [(c, bq) for c in (False, True) for bq in (False, True)]
# (head dim, bucket, causal, broadcast-Q, dtype)
CASES = [(d, b, c, bq, "bf16") for d, b in bw.CONFIGS for c, bq in MODES]
CASES += [(128, "long", True, False, "fp16"), (64, "long", False, True, "fp16")]
# in CI: each config (32-, 64- and 128-row steps at D = 64, the Q loop in and out of the
# pipeliner), the tile counter (causal packed) and without it, broadcast-Q, fp16
CI_CASES = [(64, "short", False, False, "bf16"), (64, "long", True, False, "bf16"),
            (64, "mid", True, True, "bf16"), (128, "short", True, True, "bf16"),
            (128, "long", True, False, "fp16")]
MATRIX_CASES = [c for c in CASES if c not in CI_CASES]
# key windows (bw.window_config, packed, static walk): (head dim, causal, dtype)
# the key-window builds: both head dims, causal and not, both 16-bit dtypes (the first in
# CI)
WINDOW_CASES = [(64, True, "bf16"), (128, False, "bf16"), (128, True, "fp16")]


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


# the builds of a set compile together when its first test asks for them: the CI set in
# CI, the matrix set only under `-m matrix`
@pytest.fixture(scope="module")
def reports():
    return dict(zip(CI_CASES, compile_batch([tlx_bwd_job(*c) for c in CI_CASES])))


@pytest.fixture(scope="module")
def matrix_reports():
    return dict(zip(MATRIX_CASES, compile_batch([tlx_bwd_job(*c) for c in MATRIX_CASES])))


def _window_jobs(cases):
    return dict(zip(cases, compile_batch([tlx_bwd_job(d, None, c, False, dt, windows=True)
                                          for d, c, dt in cases])))


@pytest.fixture(scope="module")
def window_reports():
    return _window_jobs(WINDOW_CASES[:1])


@pytest.fixture(scope="module")
def matrix_window_reports():
    return _window_jobs(WINDOW_CASES[1:])


def _ids(cases):
    return ["-".join(map(str, c)) for c in cases]


WAIT0 = "wgmma.wait_group.sync.aligned 0;"


@pytest.mark.parametrize("case", CI_CASES + [pytest.param(c, marks=pytest.mark.matrix)
                                             for c in MATRIX_CASES],
                         ids=_ids(CI_CASES + MATRIX_CASES))
def test_main_compiles(request, case):
    d, bucket, causal, bq, dt = case
    cfg = bw.CONFIGS[(d, bucket)]
    rep = request.getfixturevalue("reports" if case in CI_CASES else "matrix_reports")[case]
    assert not isinstance(rep, str), rep
    print(rep.row())
    assert rep.has_mma, "no wgmma in the PTX"
    assert rep.fits(), f"shared memory {rep.total_smem} B > 227 KB"
    if bw.sdp_together(cfg, bq):
        _sdp_together_step(rep, causal)
    else:
        assert not rep.spills, f"spills: {rep.row()}"
    # packed builds take their tiles from the counter (jagged.tiles.bwd_dynamic)
    assert ("atom.global.gpu.relaxed.add" in rep.ptx) == (not bq)
    ttgir = rep.ttgir
    if cfg.block_m == 32:
        # a 1-warp reduce_dq task (its setmaxnreg), the consumers at 232 registers
        assert 232 in rep.setmaxnreg and "num_warps(1)" in ttgir, rep.setmaxnreg
        _lse_carried(ttgir, cfg.block_m)
    else:
        # reduce_dq folded into the load task: 3 warpgroups, 240 registers a consumer
        assert 240 in rep.setmaxnreg and "num_warps(1)" not in ttgir, rep.setmaxnreg
    # bulk reduce instructions: 32-row steps have one reduce site (the reduce_dq task),
    # the others two (in the load task's step loop and after it); at D = 64 and 32 or 64
    # rows the consumers' dQ is summed into one box a step (a box of 32 rows lowers to
    # two)
    reduces = {(64, "short"): 2, (128, "short"): 4, (64, "mid"): 2, (64, "long"): 4,
               (128, "long"): 4}
    assert rep.ptx.count("cp.reduce.async.bulk") == reduces[(d, bucket)]
    if cfg.block_m == 128:  # S^T / dP^T of 128 rows: N = 128 wgmmas
        assert "wgmma.mma_async.sync.aligned.m64n128k16" in rep.ptx
    if cfg.num_stages == 0:  # the Q loop out of the pipeliner: its own waits of 0 a
        # consumer step (dV and dK waited with dQ in flight: 64 rows 1; 128 rows: 2 in
        # FA4's order, 4 one dot after another)
        per = 1 if cfg.block_m == 64 else (2 if bw.sdp_together(cfg, bq) else 4)
        # causal packed 128-row steps: a masked and an unmasked copy of the step
        copies = 2 if cfg.block_m == 128 and causal and not bq else 1
        assert rep.ptx.count(WAIT0) == per * copies * bw.NUM_CONSUMERS.value, \
            rep.ptx.count(WAIT0)
    _dependent(rep, cfg.block_m)
    if causal and not bq:
        _causal_mask(rep, cfg.block_m)


def _causal_mask(rep, block_m):
    """The causal triangle at P^T's use (bw._causal_select: a setp / selp a score). Causal
    packed 128-row steps run masked and unmasked copies of the step (one of each a
    consumer): the masked one carries a compare and a select for each of a thread's 64
    scores (182 instructions over the unmasked one), not the predicates packed into
    integer registers ahead of the wgmma wait (473 over it)."""
    from harness.sass_steps import parse, step_loops
    assert "setp.le.s32 p," in rep.ptx
    if block_m == 128:
        steps = sorted(len(s) for s in step_loops(parse(rep.sass)))[:4]
        assert steps[-1] < steps[0] + 4 * 64, steps


def _dependent(rep, block_m):
    """A programmatic dependent launch: every role (load, each consumer, the 1-warp
    reduce_dq at 32-row steps) waits for the kernel ahead before its first global access,
    and triggers the postprocess's launch."""
    roles = 1 + bw.NUM_CONSUMERS.value + (block_m == 32)
    assert rep.ptx.count("griddepcontrol.wait") == roles, rep.row()
    assert rep.ptx.count("griddepcontrol.launch_dependents") == roles, rep.row()


@pytest.mark.parametrize("case", WINDOW_CASES[:1] + [
    pytest.param(c, marks=pytest.mark.matrix) for c in WINDOW_CASES[1:]],
    ids=_ids(WINDOW_CASES))
def test_windows_compile(request, case):
    """The key-window builds: the short bucket's structure (32-row steps, the 1-warp
    reduce_dq task, LSE / delta carried a step ahead), spill-free, and a static walk (no
    tile counter, causal too)."""
    d, causal, dt = case
    rep = request.getfixturevalue("window_reports" if case == WINDOW_CASES[0]
                                  else "matrix_window_reports")[case]
    assert not isinstance(rep, str), rep
    print(rep.row())
    assert rep.has_mma, "no wgmma in the PTX"
    assert rep.fits(), f"shared memory {rep.total_smem} B > 227 KB"
    assert not rep.spills, f"spills: {rep.row()}"
    assert "atom.global.gpu.relaxed.add" not in rep.ptx
    assert bw.window_config(d).block_m == 32
    assert 232 in rep.setmaxnreg and "num_warps(1)" in rep.ttgir, rep.setmaxnreg
    _lse_carried(rep.ttgir, 32)
    assert rep.ptx.count("cp.reduce.async.bulk") == (2 if d == 64 else 4)
    _dependent(rep, 32)


def _lse_carried(ttgir: str, bm: int):
    """32-row steps: each consumer's Q loop carries the next step's LSE and delta, [bm]
    vectors in a slice of the S^T accumulator layout (loaded in it: no conversion)."""
    vec = rf"tensor<{bm}xf32, #ttg\.slice<\{{dim = 0, parent = #mma\d*\}}>>"
    loops = [ln for ln in ttgir.splitlines()
             if "scf.for" in ln and len(re.findall(vec, ln.split("->")[-1])) == 2]
    assert len(loops) == 2, f"Q loops carrying LSE / delta: {len(loops)}"
    loads = re.findall(rf"tt\.load %\S+, %\S+, %\S+ : (tensor<{bm}x!tt\.ptr<f32>, [^>]*>>)",
                       ttgir)
    assert loads and all("slice<{dim = 0, parent = #mma" in t for t in loads), loads


def test_replicas_get_their_own_dq_stage(reports):
    """The two consumer replicas (async_task(replicate=2)) must use dq_smem[0] / dq_full[0]
    and dq_smem[1] / dq_full[1]: the replica id read inside the jit helper `compute` (traced
    once) would give both replicas 0, and dq_full[1] would never arrive (a hang). In the
    TTGIR each replica is its own 4-warp partition; `dqc = dq_smem[cid]` indexes the
    staging buffer by a constant, which must be 0 in one and 1 in the other."""
    rep = reports[(64, "short", False, False, "bf16")]
    parts = re.split(r"\n\s*partition\d+\(", rep.ttgir)[1:]
    compute = [p for p in parts if re.search(r"\)\s*num_warps\(4\)", p)]
    idx = sorted(int(m) for p in compute
                 for m in re.findall(r"%dqc = ttg\.memdesc_index %\w+\[%c(\d+)_i32", p))
    assert len(compute) == 2 and idx == [0, 1], f"dq_smem index per consumer replica: {idx}"


def _sdp_together_step(rep, causal):
    """The 128-row step in FA4's order (bw._step_rows): S^T and dP^T issued before the
    first wgmma wait of the step loop, its spills the measured ones (none without causal
    masking, 8 instructions with it; the rest around the loop, once a tile)."""
    from harness.sass_steps import before_first_wait, parse, step_loops
    step = min(step_loops(parse(rep.sass)), key=len)
    spills = sum(1 for x in step if x.op.startswith(("LDL", "STL")))
    assert spills <= (8 if causal else 0), f"{spills} spill instructions a step: {rep.row()}"
    head = before_first_wait(step)
    assert head.count("WARPGROUP.ARRIVE") == 2 and head.count("HGMMA.64x128x16x4") == 2, head


def test_config_table():
    """The measured steps: 32 rows up to SHORT_MEAN_K keys a sequence, else 128 rows at
    D = 64 (64, two K/V stages, up to jagged.tiles.BWD_MID_MEAN_Q query rows a sequence)
    and 64 at D = 128 (the Q loop out of the pipeliner there); one K/V stage where two do
    not fit."""
    from jagged.tiles import BWD_MID_MEAN_Q
    assert bw.pick_config(128, bw.SHORT_MEAN_K) is bw.CONFIGS[(128, "short")]
    assert bw.pick_config(128, bw.SHORT_MEAN_K + 1) is bw.CONFIGS[(128, "long")]
    assert bw.pick_config(64, 26.5).block_m == 32 and bw.pick_config(64, 2048.0).block_m == 128
    assert bw.pick_config(128, 8192.0).block_m == 64
    # the mid bucket: D = 64 by mean query rows (keys past SHORT_MEAN_K)
    assert bw.pick_config(64, 102.0, 102.0) is bw.CONFIGS[(64, "mid")]
    assert bw.pick_config(64, 2048.0, BWD_MID_MEAN_Q) is bw.CONFIGS[(64, "mid")]
    assert bw.pick_config(64, 209.0, BWD_MID_MEAN_Q + 1) is bw.CONFIGS[(64, "long")]
    assert bw.pick_config(64, 40.0, 100.0) is bw.CONFIGS[(64, "short")]
    assert bw.pick_config(128, 102.0, 102.0) is bw.CONFIGS[(128, "long")]
    for (d, b), cfg in bw.CONFIGS.items():
        assert cfg.block_m in (32, 64, 128) and (cfg.block_m < 128 or d == 64)
        assert cfg.kv_stages == (2 if cfg.block_m == 32 or b == "mid" else 1)
        assert cfg.num_stages == (0 if cfg.block_m > 32 else 1)
        assert cfg.sdp_together == (cfg.block_m == 128)
    assert bw.dq_rows(128) == 64 and bw.dq_rows(64) == 64 and bw.dq_rows(32) == 32
    assert bw.dq_cols(128) == 64 and bw.dq_cols(64) == 64


def test_window_decision():
    """Key windows for packed calls whose mean keys are at most a tile (gem 256 / 0.1:
    1152 sequences, mean ~26; every sequence 128 keys), never broadcast-Q or one sequence;
    they run the short bucket's 32-row steps."""
    assert bw.takes_windows(1152 * 26, 1152, 256, False)
    assert not bw.takes_windows(1152 * 26, 1152, 256, True)
    assert not bw.takes_windows(26, 1, 26, False)
    assert not bw.takes_windows(8 * 2048, 8, 4096, False)
    assert bw.takes_windows(128 * 10, 10, 128, False)
    assert not bw.takes_windows(129 * 10, 10, 256, False)
    for d in (64, 128):
        assert bw.window_config(d) is bw.CONFIGS[(d, "short")]


# the preprocess's arguments; the offsets (cu_q_ptr, cu_k_ptr) only over key windows
PRE_SIG = {"out_ptr": "*bf16", "dout_ptr": "*bf16", "delta_ptr": "*fp32", "dq_acc_ptr": "*fp32",
           "sched_ptr": "*i32", "n_rows": "i32", "stride_o_tok": "i32", "stride_o_h": "i32",
           "stride_do_tok": "i32", "stride_do_h": "i32", "stride_delta_h": "i32",
           "cu_q_ptr": "*i32", "cu_k_ptr": "*i32", "B": "i32", "ROUNDS": "i32",
           "dkv_acc_ptr": "*fp32", "n_kv_rows": "i32", "n_dq_rows": "i32"}
POST_SIG = {"dq_acc_ptr": "*fp32", "dq_ptr": "*bf16", "n_elem": "i32", "n_slots": "i32",
            "slot_stride": "i32", "scale": "fp32"}
ROWS_SIG = {"dq_acc_ptr": "*fp32", "dq_ptr": "*bf16", "cu_q_ptr": "*i32", "cu_k_ptr": "*i32",
            "B": "i32", "ROUNDS": "i32", "n_tok": "i32", "HD": "i32", "scale": "fp32"}
# split tiles' fp32 dK / dV accumulators, converted in the postprocesses (whole tiles:
# no accumulator, as the host passes it)
DKV_SIG = {"dkv_acc_ptr": "*fp32", "dk_ptr": "*bf16", "dv_ptr": "*bf16", "n_kv": "i32"}


def _dkv(split: bool):
    """(signature, constexprs) of the postprocesses' dK / dV arguments."""
    if split:
        return DKV_SIG, {"DKV": True}
    return dict(DKV_SIG, dkv_acc_ptr="constexpr"), {"dkv_acc_ptr": None, "DKV": False}


@pytest.mark.parametrize("d,split", (pytest.param(64, False, marks=pytest.mark.matrix),
                                     (128, False), (128, True)))
def test_pre_post_compile(d, split):
    """Spill-free; split: with the split tiles' fp32 dK / dV zeroed and converted."""
    pre_sig = dict(PRE_SIG, cu_q_ptr="constexpr", cu_k_ptr="constexpr")
    pre_const = dict(cu_q_ptr=None, cu_k_ptr=None, H=4, D=d, ROWS=16,
                     LONG_K=0, PDL=True, ZERO_DKV=split, CAUSAL=False)
    if not split:
        pre_sig["dkv_acc_ptr"], pre_const["dkv_acc_ptr"] = "constexpr", None
    pre = compile_kernel(bw._bwd_preprocess, pre_sig, constexprs=pre_const, arch=90,
                         num_warps=4)
    sig, const = _dkv(split)
    post = compile_kernel(bw._bwd_postprocess, dict(POST_SIG, **sig),
                          constexprs=dict(const, BLOCK=1024, PDL=True), arch=90, num_warps=4)
    assert not pre.spills and not post.spills
    # the chain of dependent launches: the preprocess lets the main kernel launch under
    # it; the postprocess, launched under the main kernel, waits for it
    assert "griddepcontrol.launch_dependents" in pre.ptx, pre.row()
    assert post.ptx.count("griddepcontrol.wait") == 1, post.row()


@pytest.mark.parametrize("split,causal", ((False, False), (True, False), (False, True)))
def test_window_pre_post_compile(split, causal):
    """Key windows' preprocess (zeroing the rows of long sequences only; causal: and the
    rows that see no key) and rows postprocess (_bwd_post_rows), spill-free, in the same
    chain of dependent launches; split: with the split windows' fp32 dK / dV zeroed and
    converted."""
    pre = compile_kernel(
        bw._bwd_preprocess, PRE_SIG,
        constexprs=dict(H=4, D=128, ROWS=16, LONG_K=bw.BLOCK_N, PDL=True,
                        ZERO_DKV=split, CAUSAL=causal), arch=90, num_warps=4)
    sig, const = _dkv(split)
    post = compile_kernel(
        bw._bwd_post_rows, dict(ROWS_SIG, **sig),
        constexprs=dict(const, LONG_K=bw.BLOCK_N, COLS=bw.POST_COLS, PDL=True,
                        CAUSAL=causal), arch=90, num_warps=4)
    assert not pre.spills and not post.spills, (pre.row(), post.row())
    assert "griddepcontrol.launch_dependents" in pre.ptx, pre.row()
    assert post.ptx.count("griddepcontrol.wait") == 1, post.row()
    # the post's search reads only the offsets: ahead of the wait; every store after it
    wait = post.ptx.index("griddepcontrol.wait")
    assert "ld.global" in post.ptx[:wait] and "st.global" not in post.ptx[:wait]
    assert "ld.global" in post.ptx[wait:] and "st.global" in post.ptx[wait:]


def test_window_direct_preprocess_compile():
    """Key windows under jagged.tiles.windows_direct: the preprocess zeroes dQ's own rows
    (bf16) past the last sequence, spill-free, and lets the main kernel launch under it
    (the call's last kernel: no postprocess follows). Its zero rows are 2-byte values: half
    the 16-byte stores of the fp32 accumulator's build."""
    const = dict(dkv_acc_ptr=None, H=4, D=128, ROWS=16, LONG_K=bw.BLOCK_N,
                 PDL=True, ZERO_DKV=False, CAUSAL=False)
    sig = dict(PRE_SIG, dkv_acc_ptr="constexpr")
    pre = compile_kernel(bw._bwd_preprocess, dict(sig, dq_acc_ptr="*bf16"), constexprs=const,
                         arch=90, num_warps=4)
    acc = compile_kernel(bw._bwd_preprocess, sig, constexprs=const, arch=90, num_warps=4)
    assert not pre.spills, pre.row()
    assert "griddepcontrol.launch_dependents" in pre.ptx, pre.row()
    n16 = pre.ptx.count("st.global.v4.b32")
    assert n16 and 2 * n16 == acc.ptx.count("st.global.v4.b32"), (pre.row(), acc.row())


@pytest.mark.parametrize("causal", (pytest.param(False, marks=pytest.mark.matrix), True))
def test_window_rows_compile(causal):
    """The key windows' column-rows kernel (bw.window_rows), spill-free."""
    rep = compile_kernel(
        bw._window_rows,
        {"cu_q_ptr": "*i32", "cu_k_ptr": "*i32", "win_ptr": "*i32", "n_win": "i32",
         "col_rows_ptr": "*i32"},
        constexprs=dict(BLOCK_N=bw.BLOCK_N, CAUSAL=causal, PDL=True), arch=90, num_warps=4)
    assert not rep.spills, rep.row()
    assert "griddepcontrol.launch_dependents" in rep.ptx, rep.row()



# tiles split over programs (jagged.tiles.bwd_parts): (head dim, bucket, causal, parts)
SPLIT_CASES = [(64, "long", False, 2), (128, "long", True, 2), (64, "long", True, 4),
               (64, "short", False, 2), (128, "long", True, 8)]


@pytest.fixture(scope="module")
def split_reports():
    """case -> (the split build, the same build whole)."""
    reps = compile_batch([tlx_bwd_job(d, b, c, False, parts=p) for d, b, c, p in SPLIT_CASES]
                         + [tlx_bwd_job(d, b, c, False) for d, b, c, _ in SPLIT_CASES])
    n = len(SPLIT_CASES)
    return {case: (reps[i], reps[n + i]) for i, case in enumerate(SPLIT_CASES)}


def _step_spills(rep) -> list:
    """Spill instructions in each consumer copy's step loop, then the load task's loop
    (the longest)."""
    from harness.sass_steps import parse, step_loops
    return [sum(1 for x in body if x.op.startswith(("LDL", "STL")))
            for body in sorted(step_loops(parse(rep.sass)), key=len)]


def _check_adds(rep, whole, d):
    """A split build against its whole twin: both compiled, dK / dV added by 16-byte fp32
    atomics (per consumer copy, each compiled on its own: 16-row slices x 2 halves x dK,
    dV, D / 64 vectors a thread a slice), in the same shared memory."""
    assert not isinstance(rep, str), rep
    assert not isinstance(whole, str), whole
    print(rep.row())
    nc, bnc = bw.NUM_CONSUMERS.value, bw.BLOCK_N // bw.NUM_CONSUMERS.value
    adds = rep.ptx.count("atom.global.gpu.relaxed.add.v4.f32")
    assert adds == nc * (bnc // 16) * 2 * 2 * (d // 64), adds
    assert rep.total_smem == whole.total_smem


@pytest.mark.parametrize("case", SPLIT_CASES, ids=_ids(SPLIT_CASES))
def test_split_builds(split_reports, case):
    """The builds whose tiles are split over programs: dK / dV added into fp32 by 16-byte
    atomics, no 16-bit stores, in the whole build's shared memory, with its step-loop
    spills; the 128-row causal step spills 9 instructions more (17 against 8), and the
    load task's loop (24 registers; it forms each part's Q rows) up to 3 more."""
    d, bucket, causal, parts = case
    rep, whole = split_reports[case]
    _check_adds(rep, whole, d)
    assert "st.global.v4" in whole.ptx and "st.global.v4" not in rep.ptx
    more = 9 if (d, bucket, causal) == (64, "long", True) else 0
    split, base = _step_spills(rep), _step_spills(whole)
    # a loop a consumer (two, masked and not, at causal packed 128-row steps), the load's
    assert len(split) == len(base) == (5 if (d, bucket, causal) == (64, "long", True) else 3)
    assert all(a <= b + more for a, b in zip(split[:-1], base[:-1])), (split, base)
    assert split[-1] <= base[-1] + 3, (split, base)


@pytest.mark.parametrize("d", [64, pytest.param(128, marks=pytest.mark.matrix)])
def test_window_split_builds(d):
    """Key windows split over programs (jagged.tiles.window_parts > 1): the window build
    with store_add's 16-byte fp32 atomics, in its whole twin's shared memory; step-loop
    spills at most one a consumer step more (D = 128: 1 against 0) and 4 more in the load
    task's loop (only calls of a few windows take it)."""
    rep, whole = compile_batch([tlx_bwd_job(d, None, True, False, H=8, HKV=1, windows=True,
                                            parts=p) for p in (8, 1)])
    _check_adds(rep, whole, d)
    assert "atom.global.gpu.relaxed.add.v4.f32" not in whole.ptx
    split, base = _step_spills(rep), _step_spills(whole)
    assert len(split) == len(base) == 3, (split, base)
    assert all(a <= b + 1 for a, b in zip(split[:2], base[:2])), (split, base)
    assert split[2] <= base[2] + 4, (split, base)


@pytest.mark.parametrize("d", [128, 64])
def test_head_run_builds(d):
    """A build whose list entries go a KV head at a time in runs (HEAD_RUN,
    jagged.tiles.bwd_head_run; schedule.head_run_coords) against the heads-innermost one:
    both compile (non-causal, the calls that take runs), the run's build with no more
    spills in its step loops, more integer divisions (the last run's length) in its tile
    coords and the same shared memory."""
    from jagged.tiles import BWD_HEAD_RUN
    run, inner = compile_batch([tlx_bwd_job(d, "long", False, False, H=16, HKV=8,
                                            head_run=r) for r in (BWD_HEAD_RUN, 1)])
    assert not isinstance(run, str), run
    assert not isinstance(inner, str), inner
    print(run.row())
    assert run.has_mma and run.fits and run.total_smem == inner.total_smem
    assert sum(_step_spills(run)[:-1]) <= sum(_step_spills(inner)[:-1]), \
        (_step_spills(run), _step_spills(inner))
    divs = [len(re.findall(r"\b(div|rem)\.s32", r.ptx)) for r in (run, inner)]
    assert divs[0] > divs[1], divs
