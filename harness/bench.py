"""Benchmark sweep: per (backend, problem, pass) an oracle gate, then a timing.

The unit of work is a (backend, problem) job. Jobs are queued longest-first by the
problem's FLOPs (summed over the requested passes; `plan`) and handed out to one lane
per GPU (all visible GPUs by default; a CPU run has one lane without a device). A lane
runs one job at a time and keeps one warm worker process (`python -m harness worker`)
per backend it has met, pinned to its GPU with CUDA_VISIBLE_DEVICES and fed one
problem at a time over a pipe, so compiled kernels are reused, and a crash or a hang
becomes an `error` row for that job only: the lane starts a fresh worker for that
backend's next job and goes on. Rows carry the GPU's name (`gpu`, part of the row key)
and its index (`gpu_index`). They are merged into `<out>/results.csv` after every job,
so a partial run is kept, and rewritten in (backend, problem, pass) order at the end:
the same rows and keys as a one-GPU run. `<out>/logs/jobs.jsonl` has each job's start
(order, lane) and end (seconds, statuses).

Per problem the worker
1. gates: `harness.oracle.check` on the same problem with the batch cut to
   `gate_batch` sequences (0: the whole problem); out (and lse for our kernels)
   decides the fwd row, dq/dk/dv the bwd row; a wrong result is `fail`, never timed;
2. times the full problem with `triton.testing.do_bench` (median; it zeroes a 256 MB
   buffer before every timed run to flush L2): fwd is the call on inputs that need
   no grad; bwd is `torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)`
   after one forward with grad, i.e. the backward alone; then the same call captured
   in a CUDA graph and replayed (`graph_ms`: the kernels' cost without the host's),
   empty where the call cannot be captured;
3. checks that the full-size outputs are finite (else `fail`).
TFLOP/s = problem.flops(pass) / time.

Decode cells (`harness.decode.DecodeProblem`, the decode backends of
`harness.backends`) go through the same lanes and workers (`--kind decode`), forward
only, in the suite's order (cells sharing a kernel build together) rather than by FLOPs;
`run_decode_problem` gates and times them, and their rows add the page size,
splits, KV bytes read, KV TB/s and the copy bandwidth measured in the same worker.
"""
from __future__ import annotations

import csv
import dataclasses
import gc
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from . import decode
from .decode import DecodeProblem
from .problems import Problem

PROBLEM_COLS = ["suite", "mode", "causal", "dtype", "batch", "heads", "kv_heads", "head_dim",
                "max_seqlen_q", "max_seqlen_k", "sparsity", "seed", "total_q", "total_k"]
# decode rows only (empty in jagged rows): the cache layout and splits, the K + V bytes
# a call reads, those bytes per second, the copy bandwidth measured by the same worker
DECODE_COLS = ["page_size", "num_splits", "packed_q", "kv_bytes", "kv_tbps", "copy_tbps",
               "graph_ms", "graph_kv_tbps"]
COLUMNS = (["backend", "pass"] + PROBLEM_COLS +
           ["status", "error", "ms", "tflops", "host_ms", "gpu", "gpu_index", "sm_clock_mhz",
            "sm_clock_max_mhz", "mem_clock_mhz", "torch", "triton", "flash_attn_4",
            "cutlass_dsl", "git_rev", "timestamp", "out_err", "out_tol"] + DECODE_COLS)
KEY = ["backend", "pass", "suite", "mode", "causal", "dtype", "batch", "heads", "kv_heads",
       "head_dim", "max_seqlen_q", "max_seqlen_k", "sparsity", "seed", "gpu", "page_size",
       "num_splits", "packed_q"]
PROBLEM_KEY = [c for c in KEY if c not in ("backend", "pass", "gpu")]  # a problem's key
PASSES = ("fwd", "bwd")
FWD_CHECKS, BWD_CHECKS = ("out", "lse", "dtype"), ("dq", "dk", "dv")
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ environment

def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100', no GPU -> 'cpu'."""
    words = []
    for w in name.lower().replace("nvidia", " ").split():
        if re.fullmatch(r"\d+gb|hbm\d?e?|pcie|sxm\d?|nvl|mig.*", w):
            break
        words.append(re.sub(r"[^a-z0-9]+", "-", w))
    return "-".join(words).strip("-") or "cpu"


def git_rev() -> str:
    if os.environ.get("HARNESS_GIT_REV"):
        return os.environ["HARNESS_GIT_REV"]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=REPO, text=True,
                             capture_output=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], cwd=REPO, text=True,
                               capture_output=True, timeout=10).stdout.strip()
        return (rev + ("-dirty" if dirty else "")) if rev else "unknown"
    except Exception:
        return "unknown"


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return ""


def versions() -> dict:
    try:
        import triton
        tv = triton.__version__
    except Exception:
        tv = ""
    return {"torch": torch.__version__, "triton": tv, "flash_attn_4": _version("flash-attn-4"),
            "cutlass_dsl": _version("nvidia-cutlass-dsl")}


def clocks(index: int) -> dict:
    """Current and max SM clock and memory clock (MHz) of physical GPU `index`."""
    q = "clocks.sm,clocks.max.sm,clocks.mem"
    try:
        out = subprocess.run(["nvidia-smi", "-i", str(index), f"--query-gpu={q}",
                              "--format=csv,noheader,nounits"], text=True,
                             capture_output=True, timeout=10).stdout.strip()
        sm, smax, mem = (x.strip() for x in out.splitlines()[0].split(","))
        return {"sm_clock_mhz": sm, "sm_clock_max_mhz": smax, "mem_clock_mhz": mem}
    except Exception:
        return {}


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def problem_cols(p: Problem | DecodeProblem) -> dict:
    if isinstance(p, DecodeProblem):
        return decode.cols(p)
    lq, lk = p.lengths()
    return {"suite": p.suite, "mode": p.mode, "causal": p.causal, "dtype": p.dtype,
            "batch": p.batch, "heads": p.heads, "kv_heads": p.hkv, "head_dim": p.head_dim,
            "max_seqlen_q": p.max_seqlen_q, "max_seqlen_k": p.max_k, "sparsity": p.sparsity,
            "seed": p.seed, "total_q": p.max_seqlen_q if p.mode == "broadcast_q" else int(lq.sum()),
            "total_k": int(lk.sum())}


def row(backend: str, p: Problem, pass_: str, status: str, error: str = "", **kw) -> dict:
    r = {"backend": backend, "pass": pass_, **problem_cols(p), "status": status,
         "error": error[:500], "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S")}
    r.update(kw)
    return r


# ----------------------------------------------------------------------- worker

def _time(fn, quick: bool) -> float:
    if torch.cuda.is_available():
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=10 if quick else 25,
                                             rep=40 if quick else 100, return_mode="median"))
    fn()  # CPU (interpreter): a rough median of a few runs
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[1]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _outs(res):
    return res if isinstance(res, tuple) else (res,)


def call_kw(p: Problem) -> dict:
    """The keyword arguments every backend is called with for problem `p`."""
    return dict(causal=p.causal, softmax_scale=None, broadcast_q=p.mode == "broadcast_q")


FP8_FORWARD_ONLY = "fp8 inputs are forward only (no backward kernel)"


def run_problem(b, fn, p: Problem, passes, *, gate_batch=64, quick=False, timing=True) -> list[dict]:
    """Gate, then (with `timing`) time, one problem on one backend (inside the worker).
    fp8 problems: the fwd pass only (other passes `unsupported`, saying why)."""
    from .backends import dequantizing
    from .oracle import check
    dev = default_device()
    kw = call_kw(p)
    ok, why = b.supports(p)
    if not ok:
        return [row(b.name, p, ps, "unsupported", why) for ps in passes]
    rows = []
    if p.dtype == "fp8":  # forward only; a baseline gets q, k, v dequantized (timed)
        rows = [row(b.name, p, ps, "unsupported", FP8_FORWARD_ONLY) for ps in passes if ps != "fwd"]
        passes = [ps for ps in passes if ps == "fwd"]
        fn = fn if b.own else dequantizing(fn)
        if not passes:
            return rows
    gp = p.replace(batch=gate_batch) if 0 < gate_batch < p.batch else p
    try:
        rep = check(gp.build(dev), fn, backward="bwd" in passes, check_lse=b.own, **kw)
    except Exception as e:
        return rows + [row(b.name, p, ps, "error", f"gate: {type(e).__name__}: {e}")
                       for ps in passes]
    finally:
        _free()
    inp = p.build(dev) if timing else None
    out = next((c for c in rep.checks if c.name == "out"), None)
    for ps in passes:
        mine = [c for c in rep.checks if c.name in (FWD_CHECKS if ps == "fwd" else BWD_CHECKS)]
        bad = [c for c in mine if not c.ok]
        # the gate's out error and its allowance on the fwd row (the report sets fp8's
        # beside bf16's)
        err = dict(out_err=f"{out.max_err:.3e}", out_tol=f"{out.tol:.3e}") \
            if ps == "fwd" and out is not None else {}
        if bad or not timing:
            rows.append(row(b.name, p, ps, "fail" if bad else "ok",
                            "; ".join(map(str, bad or mine)), **err))
            continue
        try:
            ms, host, graph, why, finite = _bench_pass(fn, inp, ps, kw, quick)
            if not finite:
                rows.append(row(b.name, p, ps, "fail", f"non-finite {ps} result at full size"))
                continue
            rows.append(row(b.name, p, ps, "ok", why, ms=f"{ms:.5f}",
                            tflops=f"{p.flops(ps) / ms * 1e-9:.4g}",
                            host_ms="" if host is None else f"{host:.5f}",
                            graph_ms="" if graph is None else f"{graph:.5f}", **err))
        except Exception as e:
            rows.append(row(b.name, p, ps, "error", f"{type(e).__name__}: {e}"))
        finally:
            _free()
    return rows


def pass_call(fn, inp, ps, kw):
    """(a no-argument callable running one pass, the outputs of its first run). fwd: the
    call on inputs that need no grad (out); bwd: the backward alone after one forward
    with grad (dq, dk, dv)."""
    args = inp.args()
    if ps == "fwd":
        kw = {**kw, **inp.descales()}

        def call():
            with torch.no_grad():
                return _outs(fn(*args, **kw))[:1]
        return call, call()
    q, k, v = (t.detach().clone().requires_grad_() for t in args[:3])
    out = _outs(fn(q, k, v, *args[3:], **kw))[0]

    def call():
        return torch.autograd.grad(out, (q, k, v), inp.dout, retain_graph=True)
    return call, call()


def host_ms(call, n: int = 10, windows: int = 3) -> float:
    """The host's time to issue one call (ms; the least over `windows` windows of the mean
    of n, no sync inside): near the row's time, the row times the host, not the kernels.
    The cyclic GC is off inside a window: one full collection (~0.1 s of a process
    holding torch and Triton) landing in a window swamps it. On CPU (the interpreter)
    issuing is running."""
    gpu = torch.cuda.is_available()
    best = float("inf")
    for _ in range(windows):
        if gpu:
            torch.cuda.synchronize()
        was = gc.isenabled()
        gc.disable()
        try:
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            best = min(best, (time.perf_counter() - t0) / n * 1e3)
        finally:
            if was:
                gc.enable()
        if gpu:
            torch.cuda.synchronize()
    return best


def _bench_pass(fn, inp, ps, kw, quick):
    """(median ms, host ms a call or None, median ms under CUDA-graph replay or None
    (no GPU, or the call cannot be captured), why it was not captured or "", whether
    the first outputs were finite)."""
    call, outs = pass_call(fn, inp, ps, kw)
    ms = _time(call, quick)
    gpu = torch.cuda.is_available()
    host = host_ms(call) if gpu else None
    why, graph = [], None
    if gpu:  # a call of its own, made on the stream it is captured on: the backward's
        # ops run on their forward's stream, so a forward on another stream breaks capture
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            gcall, _ = pass_call(fn, inp, ps, kw)
        graph = graph_time_ms(gcall, quick, _time, why, stream=side)
    return ms, host, graph, "; ".join(why), all(bool(torch.isfinite(t).all()) for t in outs)


def _free():
    import gc
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------ decode cells
COPY_BYTES = 1 << 30      # the copy-bandwidth probe: one 1 GiB device-to-device copy
# do_bench (warm-up ms, measured ms), full and --quick: a call takes microseconds to a
# few ms, so even the largest cells get several runs and the smallest hundreds
DECODE_TIMING = {False: (10, 40), True: (5, 20)}
_COPY: dict = {}


def time_ms(fn, quick: bool) -> float:
    """do_bench's median (L2 flushed before each run) at the decode budget; on the CPU
    the bench's rough median."""
    if not torch.cuda.is_available():
        return _time(fn, quick)
    import triton.testing
    warmup, rep = DECODE_TIMING[quick]
    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def graph_time_ms(fn, quick: bool, timer=None, why: list | None = None,
                  stream=None):
    """`timer(replay, quick)` (default `time_ms`: ms) of `fn` captured in a CUDA graph (how a
    decode loop or a captured training step runs: no host work per call); None where
    the call cannot be captured (the reason appended to `why`). `stream`: the stream to
    warm up and capture on (default a new one). The graph is reset after timing, which
    leaves its pool without a user: `_free`'s empty_cache gives the pool back once no
    tensor of it lives (a graph kept past its timing held its pool: 28 GB reserved over
    eight gem-jagged problems on the H200). Each capture takes a private pool (no shared
    handle): torch asserts (use_count > 0) when a capture joins a pool whose graphs are
    all reset but whose blocks a tensor still holds."""
    graph = torch.cuda.CUDAGraph()
    try:
        side = stream or torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph, stream=side):
            fn()
        torch.cuda.synchronize()
    except Exception as e:  # a call that syncs or copies from the host: no column
        torch.cuda.synchronize()
        try:
            graph.reset()
        except RuntimeError:  # nothing captured to release
            pass
        if why is not None:
            why.append(f"not captured in a CUDA graph: {type(e).__name__}: "
                       + " ".join(str(e).split())[:200])
        return None
    try:
        return (timer or time_ms)(graph.replay, quick)
    finally:
        graph.reset()


def copy_tbps() -> float | None:
    """Device-to-device copy bandwidth (TB/s of bytes read + written) of a 1 GiB copy,
    timed as the cells are (`time_ms`); once per process."""
    if not torch.cuda.is_available():
        return None
    dev = torch.cuda.current_device()
    if dev not in _COPY:
        src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda").fill_(1)
        dst = torch.empty_like(src)
        ms = time_ms(lambda: dst.copy_(src), quick=False)
        _COPY[dev] = 2 * COPY_BYTES / (ms * 1e-3) / 1e12
        del src, dst
        torch.cuda.empty_cache()
    return _COPY[dev]


def run_decode_problem(b, fn, p: DecodeProblem, passes=("fwd",), *,
                       gate_batch=decode.GATE_MAX_BATCH,
                quick=False, timing=True) -> list[dict]:
    """Gate (the oracle on `p.gate()`; ours also with lse and a repeated call), then
    time the full cell (inside the worker): do_bench's median of the call that returns
    out only, L2 flushed before each run."""
    dev = default_device()
    ok, why = b.supports(p)
    if not ok:
        return [row(b.name, p, "fwd", "unsupported", why)]
    gp = p.gate(min(gate_batch or p.batch, decode.GATE_MAX_BATCH))
    try:
        rep = decode.check(gp.build(dev), gp, fn, check_lse=b.own, repeat=b.own)
    except decode.Unsupported as e:
        return [row(b.name, p, "fwd", "unsupported", str(e))]
    except Exception as e:
        return [row(b.name, p, "fwd", "error", f"gate: {type(e).__name__}: {e}")]
    finally:
        _free()
    if not rep.ok or not timing:
        return [row(b.name, p, "fwd", "ok" if rep.ok else "fail",
                    "; ".join(map(str, rep.checks if rep.ok else
                                  [c for c in rep.checks if not c.ok])))]
    try:
        inp = p.build(dev)
        first = decode.call(fn, inp, p, return_lse=False)
        first = first[0] if isinstance(first, tuple) else first
        if not bool(torch.isfinite(first).all()):
            return [row(b.name, p, "fwd", "fail", "non-finite out at full size")]
        del first
        run = lambda: decode.call(fn, inp, p, return_lse=False)
        ms = time_ms(run, quick)
        host = host_ms(run) if torch.cuda.is_available() else None
        why = []
        graph = graph_time_ms(run, quick, why=why) if torch.cuda.is_available() else None
        copy = copy_tbps()
        kv = p.kv_bytes() / (ms * 1e-3) / 1e12
        gkv = None if graph is None else p.kv_bytes() / (graph * 1e-3) / 1e12
        return [row(b.name, p, "fwd", "ok", "; ".join(why), ms=f"{ms:.5f}",
                    tflops=f"{p.flops() / ms * 1e-9:.4g}",
                    host_ms="" if host is None else f"{host:.5f}", kv_tbps=f"{kv:.4g}",
                    copy_tbps="" if copy is None else f"{copy:.4g}",
                    graph_ms="" if graph is None else f"{graph:.5f}",
                    graph_kv_tbps="" if gkv is None else f"{gkv:.4g}")]
    except decode.Unsupported as e:
        return [row(b.name, p, "fwd", "unsupported", str(e))]
    except Exception as e:
        return [row(b.name, p, "fwd", "error", f"{type(e).__name__}: {e}")]
    finally:
        _free()


def serve(name: str, module: str, kind: str = "jagged") -> None:
    """Worker loop: JSON requests on stdin, JSON replies on the original stdout (the
    process's own fd 1 goes to stderr, so library prints cannot break the protocol)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from . import backends
    env = {"gpu": device_name(), "gpu_index": os.environ.get("HARNESS_GPU_INDEX", ""),
           "git_rev": git_rev(), **versions()}
    fn, why = None, ""
    try:
        b = backends.get(name, module, kind)
        ok, why = b.available()
        if ok:
            fn = b.fn()
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
    proto.write(json.dumps({"hello": fn is not None, "why": why, "env": env}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        p = (DecodeProblem if kind == "decode" else Problem)(**req["problem"])
        runner = run_decode_problem if kind == "decode" else run_problem
        try:
            rows = runner(b, fn, p, req["passes"], gate_batch=req["gate_batch"],
                          quick=req["quick"], timing=req["timing"])
        except Exception as e:  # e.g. out of memory building the inputs
            rows = [row(name, p, ps, "error", f"{type(e).__name__}: {e}") for ps in req["passes"]]
            _free()
        gpu = int(env["gpu_index"]) if env["gpu_index"].isdigit() else 0
        extra = {**env, **(clocks(gpu) if torch.cuda.is_available() else {})}
        proto.write(json.dumps({"rows": [{**extra, **r} for r in rows]}) + "\n")
        if any(STICKY.search(r.get("error", "")) for r in rows):
            proto.flush()
            os._exit(3)  # the CUDA context is lost: the lane starts a fresh worker


# a CUDA error that poisons the process's context: every later call would fail too
STICKY = re.compile(r"illegal memory access|illegal instruction|misaligned address|"
                    r"unspecified launch failure|device-side assert")


# ----------------------------------------------------------------------- parent

class WorkerDied(RuntimeError):
    pass


def visible_gpus() -> tuple[list[int], bool]:
    """(indices of the GPUs this process sees, fake). HARNESS_FAKE_GPUS=N pretends there
    are N: their lanes carry the indices 0..N-1 but run on the CPU (for tests)."""
    fake = os.environ.get("HARNESS_FAKE_GPUS", "").strip()
    if fake:
        return list(range(int(fake))), True
    return list(range(torch.cuda.device_count() if torch.cuda.is_available() else 0)), False


def select_gpus(spec: str | None, visible: list[int]) -> list[int]:
    """`--gpus`: None or '' -> every visible GPU; 'N' -> the first N; a comma list
    ('0,2', or '3,' for GPU 3 alone) -> exactly those indices."""
    spec = (spec or "").strip()
    if not spec:
        return list(visible)
    if "," not in spec:
        n = int(spec)
        if not 0 < n <= len(visible):
            raise ValueError(f"--gpus {n}: {len(visible)} GPU(s) visible")
        return list(visible[:n])
    want = [int(g) for g in spec.split(",") if g.strip()]
    bad = [g for g in want if g not in visible]
    if bad or len(set(want)) != len(want):
        raise ValueError(f"--gpus {spec}: not visible or repeated: {bad or want}; visible: {visible}")
    return want


def lane_env(gpu: int | None, fake: bool = False, lanes: int = 1, parent=None) -> dict:
    """Environment that pins a lane's workers to its device.

    gpu None: a CPU lane (Triton interpreter). A real GPU: CUDA_VISIBLE_DEVICES is the
    physical GPU behind the parent's index `gpu` (through the parent's own
    CUDA_VISIBLE_DEVICES, if any), and HARNESS_GPU_INDEX (the rows' gpu_index, and
    nvidia-smi's index for the clocks) is that same GPU. A fake GPU: gpu_index is
    `gpu`, CUDA is hidden (CUDA_VISIBLE_DEVICES=''), the worker runs on the CPU.
    With several lanes each worker gets cores/lanes CPU threads unless
    OMP_NUM_THREADS is set already."""
    parent = os.environ if parent is None else parent
    env = {}
    if lanes > 1 and "OMP_NUM_THREADS" not in parent:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // lanes))
    if gpu is None or fake:
        env["TRITON_INTERPRET"] = "1"  # must be set before triton is imported
        if fake:
            env.update(CUDA_VISIBLE_DEVICES="", HARNESS_GPU_INDEX=str(gpu))
        return env
    seen = [x.strip() for x in parent.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    phys = seen[gpu] if "CUDA_VISIBLE_DEVICES" in parent else str(gpu)
    # a parent list is read in the parent's device order; with none, PCI order (nvidia-smi's)
    order = parent.get("CUDA_DEVICE_ORDER") or ("" if "CUDA_VISIBLE_DEVICES" in parent else "PCI_BUS_ID")
    env.update(CUDA_VISIBLE_DEVICES=phys, HARNESS_GPU_INDEX=phys)
    # FA4 keeps its compiled kernels on disk too (off by default in FA4): a fresh worker,
    # or a warm lane's build, is loaded rather than compiled again; run time is unchanged
    env["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] = parent.get(
        "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    if order:
        env["CUDA_DEVICE_ORDER"] = order
    return env


class Worker:
    """One backend's worker process on one lane; `lane_env` pins it to the lane's device."""

    def __init__(self, backend, lane_env: dict, log: Path):
        self.b, self.lane_env, self.log = backend, dict(lane_env), log
        self.proc, self.env_info, self.why = None, {}, ""

    def start(self, timeout):
        env = {**os.environ, **self.b.env, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env.setdefault("HARNESS_GIT_REV", git_rev())
        env.update(self.lane_env)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.err = open(self.log, "a")
        self.err.write(f"\n=== {time.strftime('%F %T')} worker {self.b.name} gpu "
                       f"{self.lane_env.get('HARNESS_GPU_INDEX', 'cpu')}\n")
        self.err.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness", "worker", "--backend", self.b.name,
             "--module", self.b.module, "--kind", self.b.kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.err, text=True, env=env, cwd=REPO)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc, self.lines), daemon=True).start()
        hello = self._read(timeout)
        self.env_info, self.why = hello["env"], hello["why"]
        return hello["hello"]

    @staticmethod
    def _pump(proc, q):
        for line in proc.stdout:
            q.put(line)
        q.put(None)

    def _read(self, timeout):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            raise WorkerDied(f"timeout after {timeout:.0f} s")
        if line is None:
            rc = self.proc.wait()
            self.stop()
            raise WorkerDied(f"worker died (exit code {rc}): {self._tail()}")
        return json.loads(line)

    def _tail(self, n=6):
        """The worker log's last exception line (e.g. `torch.AcceleratorError: CUDA
        error: device-side assert triggered`), else its last lines."""
        try:
            lines = [l.strip() for l in open(self.log).read().splitlines() if l.strip()]
        except OSError:
            return ""
        exc = [l for l in lines if re.match(r"^[\w.]+(Error|Exception)\b", l)]
        return exc[-1][:400] if exc else " | ".join(lines[-n:])[-400:]

    def request(self, p: Problem, passes, timeout, **opts):
        msg = {"problem": dataclasses.asdict(p), "passes": list(passes), **opts}
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)["rows"]

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()  # only our own child, by its handle
            self.proc.wait()
        self.proc = None
        if getattr(self, "err", None):
            self.err.close()
            self.err = None


def read_rows(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def row_key(r: dict, cols=KEY) -> tuple:
    """A row's values in `cols` as the CSV spells them (None and missing: empty)."""
    return tuple("" if r.get(c) is None else str(r[c]) for c in cols)


def merge_rows(path: Path, new: list[dict]) -> None:
    """Replace rows with the same key (backend, pass, problem, gpu), keep the rest."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = {row_key(r) for r in new}
    rows = [r for r in read_rows(path) if row_key(r) not in fresh] + new
    cols = COLUMNS + sorted({c for r in rows for c in r} - set(COLUMNS))
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


@dataclasses.dataclass(frozen=True)
class Job:
    """One (backend, problem) pair: all its passes run in one request to one worker."""
    bi: int            # the backend's position in the sweep's list
    pi: int            # the problem's position
    backend: object
    problem: Problem
    gflop: float       # estimated work: problem FLOPs summed over the requested passes


def plan(backends, problems, passes=PASSES) -> list[Job]:
    """Every (backend, problem) job, longest first by the problem's FLOPs (over
    `passes`); ties keep problem order, then backend order, so one problem's
    backends run side by side on different GPUs. Decode cells keep the suite's order
    (cells that share a kernel build one after another: a build costs more than a cell)."""
    gflop = [sum(p.flops(ps) for ps in passes) * 1e-9 for p in problems]
    jobs = [Job(bi, pi, b, p, gflop[pi]) for pi, p in enumerate(problems)
            for bi, b in enumerate(backends)]
    return sorted(jobs, key=lambda j: ((j.pi, j.bi) if isinstance(j.problem, DecodeProblem)
                                       else (-j.gflop, j.pi, j.bi)))


class Lane:
    """One device (a GPU, a fake GPU or the CPU) running one job at a time. It keeps a
    warm worker per backend it has seen (compiled kernels and caches survive from one
    problem to the next); a crash or a timeout costs the job in hand, and the next job
    of that backend starts a fresh worker."""

    def __init__(self, k: int, gpu: int | None, env: dict, log_dir: Path, n_lanes: int,
                 base: dict, by_lane: bool = False):
        self.k, self.gpu, self.env, self.log_dir = k, gpu, env, log_dir
        self.gpu_index = env.get("HARNESS_GPU_INDEX", "")
        self.suffix = ("" if n_lanes == 1 else
                       f".gpu{self.gpu_index}" if self.gpu_index and not by_lane
                       else f".lane{k}")
        self.base = {**base, "gpu_index": self.gpu_index}  # env columns for rows made here
        self.workers: dict[str, Worker] = {}
        self.unavailable: dict[str, tuple[str, dict]] = {}

    def run(self, job: Job, passes, timeout, opts) -> list[dict]:
        b, p = job.backend, job.problem
        if b.name in self.unavailable:
            why, env = self.unavailable[b.name]
            return [row(b.name, p, ps, "unsupported", why, **env) for ps in passes]
        w = self.workers.get(b.name)
        if w is not None and (w.proc is None or w.proc.poll() is not None):
            w.stop()  # died while idle: start a fresh one rather than lose this job
            w = None
        try:
            if w is None:
                w = Worker(b, self.env, self.log_dir / f"{b.name}{self.suffix}.log")
                up = w.start(timeout)
                self.base.update(w.env_info)  # the GPU's name etc., for rows made here
                if not up:
                    w.stop()
                    self.unavailable[b.name] = (f"not available: {w.why}", dict(self.base))
                    return self.run(job, passes, timeout, opts)
                self.workers[b.name] = w
            return w.request(p, passes, timeout, **opts)
        except (WorkerDied, OSError, ValueError) as e:  # ValueError: a garbled reply
            if w is not None:
                w.stop()
            self.workers.pop(b.name, None)
            msg = str(e) if isinstance(e, WorkerDied) else f"worker: {type(e).__name__}: {e}"
            return [row(b.name, p, ps, "error", msg, **self.base) for ps in passes]

    def close(self):
        for w in self.workers.values():
            w.stop()
        self.workers.clear()


def sweep(backends, problems, passes=PASSES, *, out_dir: Path, gpus=(0,), fake_gpus=False,
          gate_batch=64, quick=False, timeout=600.0, timing=True, progress=True,
          warm=0, resume=False) -> Path:
    """Run every backend over every problem; return the CSV path (results.csv, or
    checks.csv without `timing`).

    The unit of work is a (backend, problem) job; jobs are queued longest-first by
    problem FLOPs (`plan`) and handed to one lane per entry of `gpus`: a GPU index
    (workers pinned with CUDA_VISIBLE_DEVICES) or None (a CPU lane). `fake_gpus`:
    the indices only label the lanes (gpu_index, log names) and the workers run on the
    CPU (tests). Each lane runs one job at a time (timings never share a GPU). Rows are
    merged into the CSV as jobs finish and rewritten at the end in (backend, problem,
    pass) order, so the file has the same rows and keys as a one-lane run (timings and
    gpu_index aside). `<out>/logs/jobs.jsonl` records each job's start (order, lane,
    estimate) and end; worker logs are `logs/<backend>[.gpu<i>|.lane<k>].log`.

    `warm` (timing only): first gate every job in `warm` lanes spread over the devices,
    several to a GPU, so the kernels compile in parallel into the disk caches (Triton's,
    `kernels_cute.disk_cache`, FA4's); their rows go to `logs/warm/checks.csv`. Then the
    timed sweep runs one job a device, its workers loading what the warm lanes built.

    `resume`: leave out the jobs that have a row for every pass in the CSV already (a
    run that was stopped goes on where it stopped)."""
    from tqdm import tqdm
    out_dir = Path(out_dir)
    csv_path = out_dir / ("results.csv" if timing else "checks.csv")
    todo = plan(backends, problems, passes)
    if resume:  # a job is done when each of its passes has a row (the GPU aside)
        cols = ["backend", "pass"] + PROBLEM_KEY
        have = {row_key(r, cols) for r in read_rows(csv_path)}
        todo = [j for j in todo if not all(
            row_key({**problem_cols(j.problem), "backend": j.backend.name, "pass": ps}, cols)
            in have for ps in passes)]
    if warm and timing and todo:
        devs = list(gpus) if gpus else [None]
        sweep([backends[bi] for bi in sorted({j.bi for j in todo})],
              [problems[pi] for pi in sorted({j.pi for j in todo})], passes,
              out_dir=out_dir / "logs" / "warm",
              gpus=[devs[i % len(devs)] for i in range(warm)], fake_gpus=fake_gpus,
              gate_batch=gate_batch, quick=quick, timeout=timeout, timing=False,
              progress=progress)
    opts = dict(gate_batch=gate_batch, quick=quick, timing=timing)
    devices = list(gpus) if gpus else [None]
    base = {"git_rev": git_rev()}
    shared = len(set(devices)) < len(devices)  # several lanes on one device: name by lane
    lanes = [Lane(k, g, lane_env(g, fake_gpus, len(devices)), out_dir / "logs",
                  len(devices), base, by_lane=shared) for k, g in enumerate(devices)]
    pending = list(reversed(todo))  # pop() from the end: longest first
    done: dict[tuple[int, int], list[dict]] = {}
    lock = threading.Lock()
    sweep_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    jlog = open(out_dir / "logs" / "jobs.jsonl", "a", buffering=1)
    bar = tqdm(total=len(todo), disable=not progress, unit="job", dynamic_ncols=True)
    started = [0]
    stop = threading.Event()  # Ctrl-C: no new jobs, and no rows from the jobs it broke

    def log(**kw):
        if not jlog.closed:
            jlog.write(json.dumps({"sweep": sweep_id, "t": round(time.time(), 3), **kw}) + "\n")

    def work(lane: Lane):
        while True:
            with lock:
                if not pending:
                    return
                job = pending.pop()
                seq, started[0] = started[0], started[0] + 1
                info = dict(seq=seq, lane=lane.k, gpu_index=lane.gpu_index,
                            backend=job.backend.name, problem=job.problem.label(),
                            suite=job.problem.suite, gflop=round(job.gflop, 6))
                log(event="start", **info)
                bar.set_postfix_str(f"gpu{lane.gpu_index or lane.k} {job.backend.name}: "
                                    f"{job.problem.label()}", refresh=False)
            t0 = time.perf_counter()
            rows = lane.run(job, passes, timeout, opts)
            if stop.is_set():
                return
            with lock:
                done[job.bi, job.pi] = rows
                merge_rows(csv_path, rows)
                log(event="end", **info, s=round(time.perf_counter() - t0, 3),
                    status=",".join(r["status"] for r in rows))
                bar.update(1)

    def lane_main(lane: Lane):
        try:
            work(lane)
        finally:
            lane.close()

    threads = [threading.Thread(target=lane_main, args=(lane,)) for lane in lanes]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except BaseException:
        stop.set()
        with lock:
            pending.clear()
        raise
    finally:
        bar.close()
        with lock:
            jlog.close()
    # the same order as a one-lane run, whatever order the jobs finished in
    merge_rows(csv_path, [r for bi in range(len(backends)) for pi in range(len(problems))
                          for r in done.get((bi, pi), [])])
    return csv_path
