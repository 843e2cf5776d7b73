"""One process, one fuzz problem: the TLX backward's host time a call, issued the tool's way
(`jagged_attention`) and the bench's way (the backend wrapper with return_lse), host_ms
over 10 and 100 calls, in alternating rounds, then after the bench's oracle gate and
after do_bench; the launch plans' counters (plan launches / first calls / Triton's path)
per kernel; and a cProfile of 200 calls each way (top functions by own time).

    source .gpu1/activate.sh; PYTHONPATH=. python scripts/ab/host_pair.py --match "B40 H8/8 D64"
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch
import triton.testing

import jagged
from harness import backends
from harness.bench import _free, call_kw, host_ms, pass_call
from harness.oracle import check
from harness.problems import fuzz_problems
from jagged import launch


def counters():
    return {f.fn.__name__: (f.launches, f.records, f.fallbacks) for f in launch._FAST.values()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--match", default="B40 H8/8 D64")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    p = next(p for p in fuzz_problems(40, a.seed) if a.match in p.label())
    kw = call_kw(p)
    wrapper = backends.get("tlx").fn()

    def plain(*args, **k):
        return jagged.jagged_attention(*args, backend="tlx", **k)

    inp = p.build("cuda")
    calls = {"tool": pass_call(plain, inp, "bwd", kw)[0],
             "bench": pass_call(wrapper, inp, "bwd", kw)[0]}
    print(p.label(), torch.cuda.get_device_name(), "FAST", launch.FAST, flush=True)

    def report(tag):
        for ints in ((False, True) if hasattr(launch, "INT_POINTERS") else (None,)):
            if ints is not None:  # branch host-ints: tensors to the launcher as addresses
                launch.INT_POINTERS = ints
            report1(f"{tag} {'ints' if ints else 'tens'}")

    def report1(tag):
        for name, call in calls.items():
            c0 = counters()
            h10 = host_ms(call, 10) * 1e3
            h100 = host_ms(call, 100) * 1e3
            c1 = counters()
            d = {k: tuple(x - y for x, y in zip(v, c0.get(k, (0, 0, 0)))) for k, v in c1.items()}
            d = {k: v for k, v in d.items() if any(v)}
            print(f"{tag:14s} {name:6s} n=10 {h10:7.1f} us  n=100 {h100:7.1f} us  "
                  f"(plan, first, triton) {d}", flush=True)

    for r in range(a.rounds):
        report(f"round {r}")
    gp = p.replace(batch=64) if 64 < p.batch else p
    rep = check(gp.build("cuda"), wrapper, backward=True, check_lse=True, **kw)
    _free()
    print("gate", "ok" if rep.ok else "FAIL", flush=True)
    for r in range(a.rounds):
        report(f"after gate {r}")
    for name, call in calls.items():
        ms = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
        print(f"do_bench {name}: {ms:.4f} ms, then n=10 {host_ms(call, 10) * 1e3:.1f} us",
              flush=True)
    if hasattr(launch, "INT_POINTERS"):
        launch.INT_POINTERS = True
    for name, call in calls.items():
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            call()
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
        print(f"== cProfile {name}, 200 calls\n" + s.getvalue()[-4500:], flush=True)
    last, orig = launch_args()
    calls["bench"]()
    torch.cuda.synchronize()
    launch._Fast.flatten = staticmethod(orig)
    time_launches(last)  # last: it reruns kernels on stale buffers (timing only)


def launch_args():
    """The raw C launcher of the last plan launch of the preprocess and the main kernel,
    timed with the tensors as flattened (the launcher calls data_ptr() and
    cuPointerGetAttribute on each) and with their addresses as ints (neither)."""
    from kernels_tlx import bwd_hopper as bh
    from triton.runtime import driver
    last = {}
    orig = launch._Fast.flatten

    def rec(plan, args, kw):
        flat = orig(plan, args, kw)
        last[plan.kernel.name if hasattr(plan.kernel, "name") else id(plan)] = (plan, flat)
        return flat
    launch._Fast.flatten = staticmethod(rec)
    return last, orig


def time_launches(last, n=200):
    import time
    from triton.runtime import driver
    dev = driver.active.get_current_device()
    stream = driver.active.get_current_stream(dev)
    for name, (plan, flat) in sorted(last.items(), key=lambda x: str(x[0])):
        ints = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in flat]
        nt = sum(isinstance(a, torch.Tensor) for a in flat)
        res = {}
        for tag, fl in (("tensors", list(flat)), ("ints", ints), ("tensors", list(flat)),
                        ("ints", ints)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                plan.launch(1, 1, 1, stream, plan.function, plan.coop, plan.pdl, plan.packed,
                            None, None, None, None, None, plan.annotations, plan.signature, fl)
            dt = (time.perf_counter() - t0) / n * 1e6
            res[tag] = min(res.get(tag, 1e9), dt)
            torch.cuda.synchronize()
        print(f"launch {str(name)[:40]:40s} {len(flat)} args, {nt} tensors: "
              f"tensors {res['tensors']:.2f} us, ints {res['ints']:.2f} us", flush=True)


if __name__ == "__main__":
    main()
