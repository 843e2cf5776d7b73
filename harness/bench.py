"""Benchmark sweep: per (backend, problem, pass) an oracle gate, then a timing.

Each backend runs in its own worker process (`python -m harness worker`), fed one
problem at a time over a pipe, so a crash or a hang becomes an `error` row for that
problem and the sweep goes on with a fresh worker. Rows are merged into
`<out>/results.csv` after every problem, so a partial run is kept.

Per problem the worker
1. gates: `harness.oracle.check` on the same problem with the batch cut to
   `gate_batch` sequences (0: the whole problem); out (and lse for our kernels)
   decides the fwd row, dq/dk/dv the bwd row; a wrong result is `fail`, never timed;
2. times the full problem with `triton.testing.do_bench` (median; it zeroes a 256 MB
   buffer before every timed run to flush L2): fwd is the call on inputs that need
   no grad; bwd is `torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)`
   after one forward with grad, i.e. the backward alone;
3. checks that the full-size outputs are finite (else `fail`).
TFLOP/s = problem.flops(pass) / time.
"""
from __future__ import annotations

import csv
import dataclasses
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

from .problems import Problem

PROBLEM_COLS = ["suite", "mode", "causal", "dtype", "batch", "heads", "kv_heads", "head_dim",
                "max_seqlen_q", "max_seqlen_k", "sparsity", "seed", "total_q", "total_k"]
COLUMNS = (["backend", "pass"] + PROBLEM_COLS +
           ["status", "error", "ms", "tflops", "gpu", "gpu_index", "sm_clock_mhz",
            "sm_clock_max_mhz", "mem_clock_mhz", "torch", "triton", "flash_attn_4",
            "cutlass_dsl", "git_rev", "timestamp"])
KEY = ["backend", "pass", "suite", "mode", "causal", "dtype", "batch", "heads", "kv_heads",
       "head_dim", "max_seqlen_q", "max_seqlen_k", "sparsity", "seed", "gpu"]
PASSES = ("fwd", "bwd")
FWD_CHECKS, BWD_CHECKS = ("out", "lse"), ("dq", "dk", "dv")
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


def problem_cols(p: Problem) -> dict:
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


def _outs(res):
    return res if isinstance(res, tuple) else (res,)


def run_problem(b, fn, p: Problem, passes, *, gate_batch=64, quick=False, timing=True) -> list[dict]:
    """Gate, then (with `timing`) time, one problem on one backend (inside the worker)."""
    from .oracle import check
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    kw = dict(causal=p.causal, softmax_scale=None, broadcast_q=p.mode == "broadcast_q")
    ok, why = b.supports(p)
    if not ok:
        return [row(b.name, p, ps, "unsupported", why) for ps in passes]
    gp = p.replace(batch=gate_batch) if 0 < gate_batch < p.batch else p
    try:
        rep = check(gp.build(dev), fn, backward="bwd" in passes, check_lse=b.own, **kw)
    except Exception as e:
        return [row(b.name, p, ps, "error", f"gate: {type(e).__name__}: {e}") for ps in passes]
    finally:
        _free()
    rows = []
    inp = p.build(dev) if timing else None
    for ps in passes:
        mine = [c for c in rep.checks if c.name in (FWD_CHECKS if ps == "fwd" else BWD_CHECKS)]
        bad = [c for c in mine if not c.ok]
        if bad or not timing:
            rows.append(row(b.name, p, ps, "fail" if bad else "ok", "; ".join(map(str, bad or mine))))
            continue
        try:
            ms, finite = _bench_pass(fn, inp, ps, kw, quick)
            if not finite:
                rows.append(row(b.name, p, ps, "fail", f"non-finite {ps} result at full size"))
                continue
            rows.append(row(b.name, p, ps, "ok", ms=f"{ms:.5f}",
                            tflops=f"{p.flops(ps) / ms * 1e-9:.4g}"))
        except Exception as e:
            rows.append(row(b.name, p, ps, "error", f"{type(e).__name__}: {e}"))
        finally:
            _free()
    return rows


def _bench_pass(fn, inp, ps, kw, quick):
    args = inp.args()
    if ps == "fwd":
        with torch.no_grad():
            out = _outs(fn(*args, **kw))[0]
            ms = _time(lambda: fn(*args, **kw), quick)
        return ms, bool(torch.isfinite(out).all())
    q, k, v = (t.detach().clone().requires_grad_() for t in args[:3])
    out = _outs(fn(q, k, v, *args[3:], **kw))[0]
    grads = torch.autograd.grad(out, (q, k, v), inp.dout, retain_graph=True)
    ms = _time(lambda: torch.autograd.grad(out, (q, k, v), inp.dout, retain_graph=True), quick)
    return ms, all(bool(torch.isfinite(g).all()) for g in grads)


def _free():
    import gc
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def serve(name: str, module: str) -> None:
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
        b = backends.get(name, module)
        ok, why = b.available()
        if ok:
            fn = b.fn()
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
    proto.write(json.dumps({"hello": fn is not None, "why": why, "env": env}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        p = Problem(**req["problem"])
        try:
            rows = run_problem(b, fn, p, req["passes"], gate_batch=req["gate_batch"],
                               quick=req["quick"], timing=req["timing"])
        except Exception as e:  # e.g. out of memory building the inputs
            rows = [row(name, p, ps, "error", f"{type(e).__name__}: {e}") for ps in req["passes"]]
            _free()
        gpu = int(env["gpu_index"]) if env["gpu_index"] else 0
        extra = {**env, **(clocks(gpu) if torch.cuda.is_available() else {})}
        proto.write(json.dumps({"rows": [{**extra, **r} for r in rows]}) + "\n")


# ----------------------------------------------------------------------- parent

class WorkerDied(RuntimeError):
    pass


class Worker:
    """One backend's worker process, restarted after a crash or a timeout."""

    def __init__(self, backend, gpu: int | None, log: Path):
        self.b, self.gpu, self.log = backend, gpu, log
        self.proc, self.env_info, self.why = None, {}, ""

    def start(self, timeout):
        env = {**os.environ, **self.b.env, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env.setdefault("HARNESS_GIT_REV", git_rev())
        if self.gpu is None:
            env["TRITON_INTERPRET"] = "1"  # must be set before triton is imported
        else:
            env.update(CUDA_VISIBLE_DEVICES=str(self.gpu), CUDA_DEVICE_ORDER="PCI_BUS_ID",
                       HARNESS_GPU_INDEX=str(self.gpu))
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.err = open(self.log, "a")
        self.err.write(f"\n=== {time.strftime('%F %T')} worker {self.b.name} gpu {self.gpu}\n")
        self.err.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness", "worker", "--backend", self.b.name,
             "--module", self.b.module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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
        try:
            lines = [l.strip() for l in open(self.log).read().splitlines() if l.strip()]
            return " | ".join(lines[-n:])[-400:]
        except OSError:
            return ""

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


def read_rows(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def merge_rows(path: Path, new: list[dict]) -> None:
    """Replace rows with the same key (backend, pass, problem, gpu), keep the rest."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = lambda r: tuple(str(r.get(c, "")) for c in KEY)
    fresh = {key(r) for r in new}
    rows = [r for r in read_rows(path) if key(r) not in fresh] + new
    cols = COLUMNS + sorted({c for r in rows for c in r} - set(COLUMNS))
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def sweep(backends, problems, passes=PASSES, *, out_dir: Path, gpus=(0,), gate_batch=64,
          quick=False, timeout=600.0, timing=True, progress=True) -> Path:
    """Run every backend over every problem; return the CSV path (results.csv, or
    checks.csv without `timing`). `gpus` None: CPU. With several GPUs, backends are
    spread over them (one worker per GPU at a time)."""
    from tqdm import tqdm
    out_dir = Path(out_dir)
    csv_path = out_dir / ("results.csv" if timing else "checks.csv")
    opts = dict(gate_batch=gate_batch, quick=quick, timing=timing)
    jobs: queue.Queue = queue.Queue()
    for b in backends:
        jobs.put(b)
    lock = threading.Lock()
    bar = tqdm(total=len(backends) * len(problems), disable=not progress, unit="problem",
               dynamic_ncols=True)

    def emit(rows):
        with lock:
            merge_rows(csv_path, rows)
            bar.update(1)

    def lane(gpu):
        while True:
            try:
                b = jobs.get_nowait()
            except queue.Empty:
                return
            w = Worker(b, gpu, out_dir / "logs" / f"{b.name}.log")
            up, unavailable = False, None
            for p in problems:
                bar.set_postfix_str(f"{b.name}: {p.label()}", refresh=False)
                env = {"gpu_index": "" if gpu is None else gpu, "git_rev": git_rev(), **w.env_info}
                try:
                    if unavailable is None and not up:
                        up = w.start(timeout)
                        if not up:
                            unavailable, env = f"not available: {w.why}", {**env, **w.env_info}
                            w.stop()
                    if unavailable is not None:
                        emit([row(b.name, p, ps, "unsupported", unavailable, **env) for ps in passes])
                        continue
                    emit(w.request(p, passes, timeout, **opts))
                except WorkerDied as e:
                    up = False
                    emit([row(b.name, p, ps, "error", str(e), **env) for ps in passes])
            w.stop()

    lanes = [threading.Thread(target=lane, args=(g,)) for g in (gpus or [None])]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    bar.close()
    return csv_path
