"""Where the host's time per call goes, TLX forward and backward (GPU only).

A cell whose kernels take less than the host needs to issue them is timed at the host's
speed (256 / 0.1 took 0.16 ms of host a forward for 0.11 ms of kernel). This times each piece of one call alone, as mean microseconds per call over
many issues (perf_counter, no sync inside the loop), and each Triton launch inside the
real calls (JITFunction.run wrapped), so a change to the host path can be aimed.

    python -m harness.gpu.tlx_host [--match "Lq256 Lk256 s0.1"] [--n 200] [--batch 16]

Rows timed both ways show two columns: launch plans (jagged.launch) and Triton's
JITFunction.run; each the least of two GC-off windows per path. The correctness pass runs
the forward and backward on Triton's path and on plans (not a first call) and compares:
out, lse, dk, dv bit for bit, dq by its max abs difference (atomic order). --verify has
each plan launch checked against the binder too (launch.VERIFY).

A piece whose host time is near its kernels' time may read the GPU's time instead (the
host waits once the launch queue is full): --batch 16 keeps the kernels far shorter.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from jagged.api import validate
from harness.bench import host_ms, pass_call
from harness.suites import suite


def per_call_us(fn, n: int) -> float:
    fn()  # warm: first-call work (compiles, caches) is not per-call host time
    return host_ms(fn, n) * 1e3


class LaunchTimes:
    """JITFunction.run wrapped: host microseconds per launch, by kernel name."""

    def __init__(self):
        self.total, self.count, self._orig = defaultdict(float), defaultdict(int), None
        self.last = {}  # kernel name -> (fn, args, kwargs) of its last launch

    def __enter__(self):
        self._orig = orig = JITFunction.run
        total, count, last = self.total, self.count, self.last

        def run(fn_self, *a, **kw):
            last[fn_self.fn.__name__] = (fn_self, a, kw)
            t0 = time.perf_counter()
            try:
                return orig(fn_self, *a, **kw)
            finally:
                name = fn_self.fn.__name__
                total[name] += time.perf_counter() - t0
                count[name] += 1
        JITFunction.run = run
        return self

    def __exit__(self, *exc):
        JITFunction.run = self._orig

    def rows(self, calls: int):
        return [(f"  launch {k}", self.total[k] / calls * 1e6) for k in self.total]


def launch_parts(fn, args, kw, n):
    """One recorded launch split: Triton's argument binder (specialization), and the
    compiled kernel's launcher alone (descriptor encoding + cuLaunchKernel)."""
    from triton.runtime import driver
    kw = dict(kw)
    grid, _ = kw.pop("grid"), kw.pop("warmup")
    kw.setdefault("debug", False)
    kw.setdefault("instrumentation_mode", "")
    dev = driver.active.get_current_device()
    stream = driver.active.get_current_stream(dev)
    binder = fn.device_caches[dev][4]
    bound, _, _ = binder(*args, **kw)
    ck = fn.run(*args, grid=grid, warmup=False, **kw)
    vals = tuple(bound.values())
    return [("    binder", per_call_us(lambda: binder(*args, **kw), n)),
            ("    compiled launcher", per_call_us(lambda: ck.run(
                grid[0], 1, 1, stream, ck.function, ck.packed_metadata, None, None, None,
                *vals), n))]


def line_times(func, call, n: int, top: int = 12):
    """Host microseconds per call spent on each line of `func` (a Python function) while
    `call` runs it, by a line tracer: absolute values carry the tracer's own cost (a few
    tenths of a microsecond per line and nested call); the ranking is what counts."""
    import linecache
    import sys
    code, acc, state = func.__code__, defaultdict(float), {}

    def local(frame, event, arg):
        now = time.perf_counter()
        if state.get("line") is not None:
            acc[state["line"]] += now - state["t"]
        state["line"] = frame.f_lineno if event == "line" else None
        state["t"] = time.perf_counter()
        return local

    def glob(frame, event, arg):
        if frame.f_code is code:
            state["line"] = None
            return local
        return None
    call()
    torch.cuda.synchronize()
    sys.settrace(glob)
    try:
        for _ in range(n):
            call()
    finally:
        sys.settrace(None)
    torch.cuda.synchronize()
    rows = sorted(acc.items(), key=lambda kv: -kv[1])[:top]
    return [(f"    line {ln}: {linecache.getline(code.co_filename, ln).strip()[:60]}",
             t / n * 1e6) for ln, t in rows]


def same_outputs(fwd, bwd) -> list[str]:
    """Plans against Triton's path: forward and backward outputs, and that plans ran."""
    from jagged import launch
    fast0 = launch.FAST
    out = {}
    for m in (False, True):
        launch.set_fast(m)
        fwd(), bwd()  # plans: the first calls record, the next ones run the plans
        before = {id(f): f.launches for f in launch._FAST.values()}
        with torch.no_grad():
            o, lse = fwd()
            dq, dk, dv = bwd()
        torch.cuda.synchronize()
        ran = {f.fn.__name__: f.launches - before[id(f)] for f in launch._FAST.values()
               if f.launches > before[id(f)]}
        out[m] = (o.clone(), lse.clone(), dq.clone(), dk.clone(), dv.clone(), ran)
    launch.set_fast(fast0)
    (o0, l0, q0, k0, v0, _), (o2, l2, q2, k2, v2, ran) = out[False], out[True]
    eq = lambda a, b: torch.equal(a, b) or bool(  # noqa: E731 (NaN in the same places)
        ((a == b) | (a.isnan() & b.isnan())).all())
    ok = eq(o0, o2) and eq(l0, l2) and eq(k0, k2) and eq(v0, v2)
    stats = {f.fn.__name__: (f.launches, f.records, f.fallbacks, len(f.plans))
             for f in launch._FAST.values()}
    return [f"forward out {'==' if eq(o0, o2) else '!='}, lse {'==' if eq(l0, l2) else '!='}; "
            f"backward dk {'==' if eq(k0, k2) else '!='}, dv {'==' if eq(v0, v2) else '!='}, "
            f"dq max abs diff {(q0.float() - q2.float()).abs().max().item():.3g}: "
            f"{'PASS' if ok else 'FAIL'}",
            f"plan launches in the checked calls: {ran}",
            f"per kernel (plan launches, records, fallbacks, plans): {stats}"]


@triton.jit
def _nop(x_ptr, n, BLOCK: tl.constexpr):
    pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--match", default="Lq256 Lk256 s0.1")
    ap.add_argument("--suite", default="gem-jagged")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--batch", type=int, default=0,
                    help="another batch size (e.g. 16: kernels far shorter than the host's "
                         "work, so a full launch queue cannot make the host wait)")
    ap.add_argument("--verify", action="store_true",
                    help="check every plan launch against Triton's binder (launch.VERIFY)")
    a = ap.parse_args()
    from jagged import launch
    from kernels_tlx import bwd_hopper, fwd_hopper, jagged_attention
    launch.VERIFY = a.verify
    p = next(p for p in suite(a.suite) if a.match in p.label())
    p = p.replace(batch=a.batch) if a.batch else p
    inp = p.build("cuda")
    q, k, v, cu_q, cu_k, mq, mk = inp.args()
    scale = q.shape[2] ** -0.5
    n = a.n
    rows = []  # (what, us with launch plans, on Triton's own path)
    fast0 = launch.FAST
    nan = float("nan")

    def both(name, fn):  # each path twice, ABAB, the least of each (GC off: host_ms)
        best = {}
        for m in (False, True, False, True):
            launch.set_fast(m)
            best[m] = min(best.get(m, float("inf")), per_call_us(fn, n))
        launch.set_fast(fast0)
        rows.append((name, best[True], best[False]))

    def plain(entries):
        rows.extend((name, nan, us) for name, us in entries)

    def traced(call):  # Triton's launches timed alone, inside the real calls
        launch.set_fast(False)
        with LaunchTimes() as lt:
            per_call_us(call, n)
        launch.set_fast(fast0)
        plain(lt.rows(n + 1))
        return lt

    def fwd_api():
        with torch.no_grad():
            return jagged_attention(q, k, v, cu_q, cu_k, mq, mk)
    fwd_args = (q, k, v, cu_q, cu_k, mq, mk, False, scale, False)
    fwd = lambda: fwd_hopper.forward(*fwd_args)  # noqa: E731
    both("fwd: API call (no_grad)", fwd_api)
    both("  fwd_hopper.forward", fwd)
    cfg = fwd_hopper.pick_config(q.shape[2], mk, False, k.shape[0] / (cu_k.shape[0] - 1))
    from triton.tools.tensor_descriptor import TensorDescriptor as TD
    x = torch.empty(16, device="cuda")
    plain([("  validate", per_call_us(lambda: validate(q, k, v, cu_q, cu_k, mq, mk), n)),
           ("  two torch.empty", per_call_us(
               lambda: (torch.empty_like(q), torch.empty(4, 100, device="cuda")), n)),
           ("  build_tiles (cached)", per_call_us(lambda: fwd_hopper.build_tiles(
               cu_q, cu_k, cu_k.shape[0] - 1, mq, None, cfg.block_m, cfg.block_n, False), n)),
           ("  one TensorDescriptor()", per_call_us(
               lambda: TD(k, [k.shape[0], k.shape[1] * k.shape[2]], [k.shape[1] * k.shape[2], 1],
                          [cfg.block_n, k.shape[2]]), n)),
           ("  baseline: a 2-argument Triton launch", per_call_us(
               lambda: _nop[(1,)](x, 16, BLOCK=16), n))])
    lt = traced(fwd)
    plain(launch_parts(*lt.last["fwd_kernel"], n))
    rows.extend((name, us, nan) for name, us in line_times(fwd_hopper.forward, fwd, n))

    call, _ = pass_call(jagged_attention, inp, "bwd", dict(causal=False))
    with torch.no_grad():
        out, lse = fwd()
    bwd_args = (inp.dout, q, k, v, out, lse, cu_q, cu_k, mq, mk, False, scale, False)
    bwd = lambda: bwd_hopper.backward(*bwd_args)  # noqa: E731
    both("bwd: autograd.grad", call)

    def on_calling_thread():  # the engine's device-thread hand-off left out (profile.py)
        with torch.autograd.set_multithreading_enabled(False):
            return call()
    both("  autograd.grad on the calling thread", on_calling_thread)
    both("  bwd_hopper.backward", bwd)
    lt = traced(bwd)
    plain(launch_parts(*lt.last["bwd_kernel"], n))
    rows.extend((name, us, nan) for name, us in line_times(bwd_hopper.backward, bwd, n))
    checks = same_outputs(fwd, bwd)

    print(f"\nhost us per call, {p.label()}, {torch.cuda.get_device_name()}, "
          f"triton {triton.__version__}, torch {torch.__version__}")
    print(f"line times: launch plans {fast0}; launch.VERIFY={launch.VERIFY}")
    print(f"{'':48s} {'plans':>8s} {'triton':>9s}")
    for name, plan_us, slow_us in rows:
        print(f"{name:48s} {plan_us:8.1f} {slow_us:9.1f}")
    print("\ncorrectness, launch plans against Triton's path:")
    for line in checks:
        print("  " + line)


if __name__ == "__main__":
    main()
