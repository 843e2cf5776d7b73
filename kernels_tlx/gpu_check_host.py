"""Where the host's time per call goes, TLX forward and backward (GPU only).

A cell whose kernels take less than the host needs to issue them is timed at the host's
speed (PERF.md session 8: 256 / 0.1 took 0.16 ms of host a forward for 0.11 ms of
kernel). This times each piece of one call alone, as mean microseconds per call over
many issues (perf_counter, no sync inside the loop), and each Triton launch inside the
real calls (JITFunction.run wrapped), so a change to the host path can be aimed.

    python -m kernels_tlx.gpu_check_host [--match "Lq256 Lk256 s0.1"] [--n 200]
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from harness.api import validate
from harness.bench import pass_call
from harness.problems import suite


def per_call_us(fn, n: int) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return dt


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


@triton.jit
def _nop(x_ptr, n, BLOCK: tl.constexpr):
    pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--match", default="Lq256 Lk256 s0.1")
    ap.add_argument("--suite", default="gem-jagged")
    ap.add_argument("--n", type=int, default=200)
    a = ap.parse_args()
    from kernels_tlx import fwd_hopper, jagged_attention
    from kernels_tlx import bwd_hopper
    p = next(p for p in suite(a.suite) if a.match in p.label())
    inp = p.build("cuda")
    q, k, v, cu_q, cu_k, mq, mk = inp.args()
    scale = q.shape[2] ** -0.5
    n = a.n
    rows = []

    def fwd_api():
        with torch.no_grad():
            return jagged_attention(q, k, v, cu_q, cu_k, mq, mk)
    rows.append(("fwd: API call (no_grad)", per_call_us(fwd_api, n)))
    rows.append(("  validate", per_call_us(lambda: validate(q, k, v, cu_q, cu_k, mq, mk), n)))
    fwd_args = (q, k, v, cu_q, cu_k, mq, mk, False, scale, False)
    rows.append(("  fwd_hopper.forward", per_call_us(lambda: fwd_hopper.forward(*fwd_args), n)))
    rows.append(("  two torch.empty", per_call_us(
        lambda: (torch.empty_like(q), torch.empty(4, 100, device="cuda")), n)))
    cfg = fwd_hopper.pick_config(q.shape[2], mk, False, False, k.shape[0] / (cu_k.shape[0] - 1))
    rows.append(("  pick_config", per_call_us(
        lambda: fwd_hopper.pick_config(q.shape[2], mk, False, False, 1.0), n)))
    rows.append(("  build_tiles (cached)", per_call_us(lambda: fwd_hopper.build_tiles(
        cu_q, cu_k, cu_k.shape[0] - 1, mq, None, cfg.block_m, cfg.block_n, False), n)))
    TD = fwd_hopper.TensorDescriptor
    rows.append(("  one TensorDescriptor()", per_call_us(
        lambda: TD(k, [k.shape[0], k.shape[1] * k.shape[2]], [k.shape[1] * k.shape[2], 1],
                   [cfg.block_n, k.shape[2]]), n)))
    with LaunchTimes() as lt:
        per_call_us(lambda: fwd_hopper.forward(*fwd_args), n)
    rows += lt.rows(n + 1)
    rows += launch_parts(*lt.last["fwd_kernel"], n)
    x = torch.empty(16, device="cuda")
    rows.append(("  baseline: a 2-argument Triton launch", per_call_us(
        lambda: _nop[(1,)](x, 16, BLOCK=16), n)))

    call, _ = pass_call(jagged_attention, inp, "bwd", dict(causal=False))
    rows.append(("bwd: autograd.grad", per_call_us(call, n)))
    dout = inp.dout
    with torch.no_grad():
        out, lse = fwd_hopper.forward(*fwd_args)
    bwd_args = (dout, q, k, v, out, lse, cu_q, cu_k, mq, mk, False, scale, False)
    rows.append(("  bwd_hopper.backward", per_call_us(lambda: bwd_hopper.backward(*bwd_args), n)))
    with LaunchTimes() as lt:
        per_call_us(lambda: bwd_hopper.backward(*bwd_args), n)
    rows += lt.rows(n + 1)
    rows += launch_parts(*lt.last["_bwd_main_ws"], n)
    with LaunchTimes() as lt:
        per_call_us(call, n)
    rows += [(r[0] + " (in autograd.grad)", r[1]) for r in lt.rows(n + 1)]

    print(f"\nhost us per call, {p.label()}, {torch.cuda.get_device_name()}, "
          f"triton {triton.__version__}, torch {torch.__version__}")
    for name, us in rows:
        print(f"{name:48s} {us:8.1f}")


if __name__ == "__main__":
    main()
