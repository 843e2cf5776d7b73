"""Sustained speed, SM clock and power of one backend per problem: is a gap cycles or
clock? The H200 boosts to 1980 MHz and slows under load (a process's first timing reads
up to 15 % faster than later ones), so two kernels that need the same
cycles can differ in speed by how much power they draw. Per (backend, problem): the
oracle gate, then back-to-back calls for `seconds` while `nvidia-smi` samples the
clock, power and the active clock-event reasons; reported over the second half (a
warm GPU): TFLOP/s, median MHz, W, and TFLOP/s scaled to 1980 MHz (the cycle count's
measure: equal there means equal cycles).

    python -m harness clocks --backends tlx,cute,fa4 --suite llm-dense --match "B8 H16/16 D128"

`--passes bwd` (or fwd,bwd) times the backward the same way (as bench times it: the
backward alone after one forward). `--gemm` first measures the ceiling the same way: a
plain bf16 matmul (torch, GEMM_N^3) back to back, a row of backend `gemm` (the charts draw
it as the sustained ceiling: 681 TFLOP/s at 1485 MHz on the H200, against a ~790 burst).
"""
from __future__ import annotations

import csv
import re
import statistics
import subprocess
import threading
import time
from pathlib import Path

import torch

from ..bench import call_kw, default_device, pass_call, run_problem
from ..problems import Problem

FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"
BOOST_MHZ = 1980.0
GEMM_N = 8192
GEMM_PROBLEM = f"bf16 {GEMM_N}^3 matmul (torch)"


class Sampler:
    """`nvidia-smi -lms` in the background: (host time, MHz, W, degrees C, reasons)."""

    def __init__(self, period_ms: int = 100):
        self.rows: list[tuple] = []
        query = ["nvidia-smi", "-i", str(torch.cuda.current_device()),
                 "--format=csv,noheader,nounits"]
        fields = FIELDS
        if subprocess.run(query + [f"--query-gpu={fields}"], capture_output=True).returncode:
            fields = fields.rsplit(",", 1)[0] + ",pstate"  # an older driver's field names
        self.proc = subprocess.Popen(query + [f"--query-gpu={fields}", "-lms", str(period_ms)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            row = parse(line)
            if row:
                self.rows.append((time.perf_counter(), *row))

    def between(self, t0: float, t1: float) -> list[tuple]:
        return [r for r in self.rows if t0 <= r[0] <= t1]

    def close(self):
        self.proc.terminate()


def parse(line: str) -> tuple | None:
    """One `nvidia-smi` csv line -> (MHz, W, degrees C, reasons), None if not a sample
    (a header, "[N/A]", an error line)."""
    parts = [x.strip() for x in line.split(",")]
    try:
        return float(parts[0]), float(parts[1]), float(parts[2]), parts[3]
    except (ValueError, IndexError):
        return None


def sustain(call, seconds: float) -> tuple[list[float], float, float]:
    """Calls back to back for `seconds`: (ms of each call by CUDA events, host time of the
    half-way mark, host time at the end)."""
    ms, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(10)]
        for a, b in evs:
            a.record()
            call()
            b.record()
        torch.cuda.synchronize()
        ms += [a.elapsed_time(b) for a, b in evs]
    t1 = time.perf_counter()
    return ms, t0 + (t1 - t0) / 2, t1


def one(b, fn, p: Problem, seconds: float, sampler: Sampler, ps: str = "fwd") -> dict | str:
    """The gate, then `seconds` of calls of pass `ps`: a row (TFLOP/s, MHz, W, ...) or why
    not."""
    bad = [r for r in run_problem(b, fn, p, [ps], timing=False) if r["status"] != "ok"]
    if bad:
        return f"not run: {bad[0]['status']} {bad[0]['error'][:80]}"
    call, _ = pass_call(fn, p.build(default_device()), ps, call_kw(p))
    return sustained(call, p.flops(ps), seconds, sampler)


def gemm(seconds: float, sampler: Sampler, n: int = GEMM_N) -> dict | str:
    """The ceiling measured as the kernels are: a bf16 n^3 matmul on random inputs, back to
    back for `seconds` after a warm-up (one call's cuBLAS choice, then the power cap)."""
    a, b = (torch.randn(n, n, device=default_device(), dtype=torch.bfloat16) for _ in range(2))
    for _ in range(10):
        torch.mm(a, b)
    return sustained(lambda: torch.mm(a, b), 2.0 * n ** 3, seconds, sampler)


def sustained(call, flops: float, seconds: float, sampler: Sampler) -> dict | str:
    """`seconds` of calls: TFLOP/s (median call of the second half), the clock, power and
    clock-event reasons sampled meanwhile."""
    ms, mid, end = sustain(call, seconds)
    late = ms[len(ms) // 2:]
    tflops = flops / statistics.median(late) / 1e9
    s = sampler.between(mid, end)
    if not s:
        return f"{tflops:7.1f} TFLOP/s ({len(late)} calls), no samples"
    mhz = statistics.median(r[1] for r in s)
    return dict(tflops=round(tflops, 1), mhz=mhz, watts=round(statistics.median(r[2] for r in s)),
                temp_c=max(r[3] for r in s), at_boost=round(tflops * BOOST_MHZ / mhz, 1),
                calls=len(late), samples=len(s), reasons=" ".join(sorted({r[4] for r in s})))


def line(name: str, label: str, m: dict | str, ps: str = "fwd") -> str:
    if isinstance(m, str):
        return f"{name:5s} {ps} {label:55s} {m}"
    return (f"{name:5s} {ps} {label:55s} {m['tflops']:7.1f} TFLOP/s {m['mhz']:6.0f} MHz "
            f"{m['watts']:5.0f} W {m['temp_c']:3.0f} C  at {BOOST_MHZ:.0f} MHz "
            f"{m['at_boost']:7.1f}  ({m['calls']} calls, {m['samples']} samples, reasons "
            f"{m['reasons']})")


# (backend, pass, problem, ..., [variant] (a row of an A/B))
LINE = re.compile(r"(\S+)\s+(fwd|bwd)\s+(.+?)\s+([\d.]+) TFLOP/s\s+(\d+) MHz\s+(\d+) W\s+(\d+) C\s+at \d+ MHz"
                  r"\s+([\d.]+)\s+\((\d+) calls, (\d+) samples, reasons ([^)]*)\)\s*(?:\[(.*)\])?$")
COLUMNS = ["backend", "problem", "variant", "tflops", "mhz", "watts", "temp_c", "at_boost",
           "calls", "samples", "reasons", "git_rev", "pass"]


def read_log(path, git_rev: str) -> list[dict]:
    """The rows of a `clocks` log (its printed lines), for runs made without --out."""
    rows = []
    for text in Path(path).read_text().splitlines():
        m = LINE.match(text.strip())
        if m:
            g = m.groups()
            rows.append(dict(zip(COLUMNS, [g[0], g[2], g[11] or "", float(g[3]), float(g[4]),
                                           float(g[5]), float(g[6]), float(g[7]), int(g[8]),
                                           int(g[9]), g[10], git_rev, g[1]])))
    return rows


def append_rows(csv_path, rows: list[dict]) -> None:
    """Add rows to `csv_path` (`clocks.csv` beside results.csv; `plots` charts it)."""
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    new = not csv_path.exists()
    with csv_path.open("a", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        if new:
            w.writeheader()
        w.writerows(rows)


def run(backend_names, problems, seconds: float = 4.0, out=None, passes=("fwd",),
        with_gemm: bool = False) -> list[str]:
    """`out`: also append the rows to out/clocks.csv. `passes`: fwd and / or bwd.
    `with_gemm`: the sustained GEMM row (`gemm`) first."""
    from .. import backends
    from ..bench import git_rev
    rev, fns = git_rev(), {}
    sampler, lines, rows = Sampler(), [], []
    try:
        if with_gemm:
            m = gemm(seconds, sampler)
            lines.append(line("gemm", GEMM_PROBLEM, m))
            print(lines[-1], flush=True)
            if isinstance(m, dict):
                rows.append(dict(backend="gemm", problem=GEMM_PROBLEM, variant="",
                                 git_rev=rev, **m, **{"pass": "fwd"}))
        for p in problems:
            for ps in passes:
                for name in backend_names:
                    b = backends.get(name)
                    ok, why = b.available()
                    if ok and name not in fns:
                        fns[name] = b.fn()
                    m = one(b, fns[name], p, seconds, sampler, ps) if ok else why
                    lines.append(line(name, p.label(), m, ps))
                    print(lines[-1], flush=True)
                    if isinstance(m, dict):
                        rows.append(dict(backend=name, problem=p.label(), variant="",
                                         git_rev=rev, **m, **{"pass": ps}))
    finally:
        sampler.close()
        if out and rows:
            append_rows(Path(out) / "clocks.csv", rows)
    return lines
