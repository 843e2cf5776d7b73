"""Where one backend's time goes on one problem: the host's time to issue a call, the
GPU kernels' time per call (torch.profiler), the sweep's do_bench median, and the call
replayed from a CUDA graph with the kernels in that graph (the tile lists' too).

A diagnostic for cells whose time does not follow their work: when the host's time per
call is above the kernels' time, the GPU waits for launches and do_bench times the host.
A backward's host time is also given on the calling thread (autograd's multithreading
off), which separates the engine's hand-off from the backend's own issue time; `--host`
profiles it there.
Every problem passes the oracle gate first. Several backends (and `--rounds`) make an
A/B: per problem the backends run in turn, round after round, and a summary table gives
each one's mean against the first backend's.

    python -m harness profile --backends tlx,cute --suite gem-jagged --match "Lq256 Lk256 s0.1"
"""
from __future__ import annotations

import math
import time
from collections import defaultdict

import torch

from ..bench import (_time, call_kw, default_device, graph_time_ms, host_ms, pass_call,
                     run_problem)
from ..problems import Problem


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def kernel_times(call, n: int) -> dict[str, float]:
    """Mean GPU time per call (ms) of each kernel name over n calls (empty without a GPU)."""
    from torch.profiler import ProfilerActivity, profile
    if not torch.cuda.is_available():
        return {}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
        _sync()
    out = defaultdict(float)
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        us = getattr(e, "self_cuda_time_total", 0.0) if us is None else us
        if us > 0:
            out[e.key] += us / n / 1e3
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def host_profile(call, n: int, top: int = 25) -> str:
    """cProfile of n calls: the `top` functions by own time (where the host's time per
    call goes when it is above the kernels'), then torch.profiler's CPU ops by self time.
    Autograd's multithreading is off meanwhile: the engine runs a CUDA backward on a
    device thread of its own, which cProfile (per thread) would not see."""
    import cProfile
    import io
    import pstats
    pr = cProfile.Profile()
    with torch.autograd.set_multithreading_enabled(False):
        pr.enable()
        for _ in range(n):
            call()
        pr.disable()
    _sync()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(top)
    if torch.cuda.is_available():  # the runtime calls under them (launches, allocations, syncs)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(n):
                call()
            _sync()
        buf.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
    return buf.getvalue()


def calling_thread_ms(call, n: int) -> float:
    """host_ms with autograd's multithreading off: a backward then runs on the calling
    thread instead of the engine's device thread. The difference is the engine's hand-off,
    which every backend pays alike (fuzz B24 H2/2 D128 on the H200: 80-150 us a call)."""
    with torch.autograd.set_multithreading_enabled(False):
        return host_ms(call, n)


def replay_times(fn, inp, pass_: str, kw, n: int) -> tuple[float | None, dict[str, float]]:
    """(do_bench ms of the call replayed from a CUDA graph, mean GPU time per replay of
    each kernel in it), captured as the sweep's graph_ms is (`harness.bench`'s
    graph_time_ms, on the stream the call is made on): the graph holds what a captured
    call runs, the tile lists too (an eager call reuses them), and the replayed time less
    the kernels' sum is their launches' gaps. (None, {}) where the call cannot be
    captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call, _ = pass_call(fn, inp, pass_, kw)
    got = graph_time_ms(call, False, lambda replay, quick: (_time(replay, quick),
                                                            kernel_times(replay, n)),
                        stream=side)
    return got or (None, {})


def profile_one(fn, p: Problem, pass_: str, n: int = 10, host: bool = False) -> dict:
    kw = call_kw(p)
    inp = p.build(default_device())
    call, _ = pass_call(fn, inp, pass_, kw)
    t_host = host_ms(call, n)  # issue only: the GPU may still be running when the loop ends
    kernels = kernel_times(call, n)
    graph_ms, graph_kernels = replay_times(fn, inp, pass_, kw, n) if kernels else (None, {})
    return dict(host_ms=t_host, gpu_ms=sum(kernels.values()), bench_ms=_time(call, False),
                kernels=kernels, cprofile=host_profile(call, n) if host else "",
                thread_ms=calling_thread_ms(call, n) if pass_ == "bwd" else None,
                graph_ms=graph_ms, graph_kernels=graph_kernels)


def _profile_backend(name, b, fn, p: Problem, passes, n, gate_batch, host,
                     records: list) -> list[str]:
    """Gate one problem (the sweep's own gate), then one line per pass; each timed pass is
    also appended to `records` (for `ab_summary`)."""
    bad = [r for r in run_problem(b, fn, p, passes, gate_batch=gate_batch, timing=False)
           if r["status"] != "ok"]
    if bad:
        print(line := f"{name} {p.label()}: not profiled: {bad[0]['status']} "
                      f"{bad[0]['error']}", flush=True)
        return [line]
    lines = []
    for ps in passes:
        r = profile_one(fn, p, ps, n, host)
        top = ", ".join(f"{k[:40]} {v:.3f}" for k, v in list(r["kernels"].items())[:5])
        own = "" if r["thread_ms"] is None else f" ({r['thread_ms']:.3f} on the calling thread)"
        lines.append(f"{name:8s} {ps} {p.label():55s} host {r['host_ms']:7.3f} ms{own}  "
                     f"gpu {r['gpu_ms']:7.3f} ms  do_bench {r['bench_ms']:7.3f} ms  | {top}")
        print(lines[-1], flush=True)
        if r["graph_ms"] is not None:
            gk = r["graph_kernels"]
            top = ", ".join(f"{k[:40]} {v:.4f}" for k, v in gk.items())
            lines.append(f"{'':8s} {ps} replayed {r['graph_ms']:.4f} ms, its kernels "
                         f"{sum(gk.values()):.4f} ({len(gk)}): {top}")
            print(lines[-1], flush=True)
        if r["cprofile"]:
            print(r["cprofile"], flush=True)
        records.append(dict(backend=name, problem=p.label(), pass_=ps, gpu_ms=r["gpu_ms"],
                            bench_ms=r["bench_ms"], graph_ms=r["graph_ms"]))
    return lines


def _warm(fn, p: Problem, passes, seconds: float = 1.0) -> None:
    """Run the problem's calls untimed for about `seconds` before its first measurement:
    a process's first measurement reads up to 9 % lower in kernel time than later rounds
    of the same code (TLX 2048 / 0.5: 5.690 against 6.220 ms), so an A/B starts on a GPU
    that has been busy. Nothing to warm without a GPU."""
    if not torch.cuda.is_available():
        return
    kw = call_kw(p)
    inp = p.build(default_device())
    for ps in passes:
        call, _ = pass_call(fn, inp, ps, kw)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds / len(passes):
            for _ in range(10):
                call()
            _sync()


def ab_summary(records: list[dict]) -> list[str]:
    """The A/B table printed last: per (pass, problem) and backend, the rounds run and the
    mean kernel time (torch.profiler) and do_bench, with the change against the first
    backend. Kernel time is the steadier of the two (do_bench of one build moves 2-6 %
    between rounds on the H200)."""
    groups: dict = {}
    for r in records:
        groups.setdefault((r["pass_"], r["problem"]), {}).setdefault(r["backend"], []).append(r)
    mean = lambda rs, k: sum(x[k] for x in rs) / len(rs)

    def pct(v, base):  # blank without a usable base (no GPU: kernel time 0)
        ok = base and math.isfinite(base) and math.isfinite(v)
        return f"{100 * (v / base - 1):+6.1f} %" if ok else " " * 8

    lines = ["A/B summary (means over rounds; % against the first backend):",
             f"{'pass':4s} {'backend':20s} {'rounds':>6s} {'gpu ms':>9s} {'':8s} "
             f"{'do_bench ms':>11s} {'':8s} {'replayed ms':>11s}"]
    for (ps, label), by_backend in groups.items():
        lines.append(f"{ps:4s} {label}")
        first = next(iter(by_backend))
        base = by_backend[first]
        for name, rs in by_backend.items():
            g, t = mean(rs, "gpu_ms"), mean(rs, "bench_ms")
            d_g = pct(g, mean(base, "gpu_ms")) if name != first else " " * 8
            d_t = pct(t, mean(base, "bench_ms")) if name != first else " " * 8
            rep = _replayed(rs, base, name != first)
            lines.append(f"{'':4s} {name[:20]:20s} {len(rs):6d} {g:9.3f} {d_g} "
                         f"{t:11.3f} {d_t} {rep}".rstrip())
    return lines


def _replayed(rs: list[dict], base: list[dict], against: bool) -> str:
    """The A/B table's replayed column: the mean over rounds (blank where a round had no
    graph), with its change against the first backend's."""
    xs, bs = [r.get("graph_ms") for r in rs], [r.get("graph_ms") for r in base]
    if not xs or None in xs:
        return ""
    m = sum(xs) / len(xs)
    d = (f"{100 * (m / (sum(bs) / len(bs)) - 1):+6.1f} %"
         if against and bs and None not in bs else "")
    return f"{m:11.4f} {d}"


def run(backend_names, problems, passes, n=10, gate_batch=64, rounds: int = 1,
        host: bool = False) -> list[str]:
    """Per problem, every backend gated and profiled, `rounds` times in turn (backend
    after backend, round after round, in one process); with more than one backend or
    round the A/B summary table (`ab_summary`) is printed last. `host`: also print a
    cProfile of the calls."""
    from .. import backends
    lines, records, fns = [], [], {}
    for name in backend_names:
        b = backends.get(name)
        ok, why = b.available()
        if ok:
            fns[name] = (b, b.fn())
        else:
            lines.append(f"{name}: unavailable ({why})")
            print(lines[-1], flush=True)
    ab = len(fns) > 1 or rounds > 1
    for p in problems:
        if ab and fns:
            _warm(next(iter(fns.values()))[1], p, passes)
        for _ in range(rounds):
            for name, (b, fn) in fns.items():
                lines += _profile_backend(name, b, fn, p, passes, n, gate_batch, host, records)
    if ab and records:
        print("\n".join(ab_summary(records)), flush=True)
    return lines
