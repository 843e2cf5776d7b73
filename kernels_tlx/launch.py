"""`fast(kernel)[grid](*args, **kw)`: a Triton launch with less host work per call.

Short sequences are host-bound: on the H200 node a `JITFunction.run` of the forward
kernel took 40.8 us of host time, of which Triton's argument binder (the exact
specialization) took 7.0 and the compiled kernel's launcher (TMA descriptors and
cuLaunchKernelEx) 11.2 (`gpu_check_host`, PERF.md session 9). The rest is per-call
bookkeeping: knob reads, the cache-key string, the global-value check, launch hooks,
and the timing wrapper's own cost.

Until session 11 this path never ran: its guard took Triton 3.8's empty launch-hook
chain (a `HookChain`, never None) for a profiler and fell back to `JITFunction.run` on
every call, so session 9's "4-5 us saved" compared one path with itself. With the guard
fixed a helper measured, on a CPU with the driver stubbed, a launch at 25.5 -> 13.4 us
(`JITFunction.run` against this); on the GPU it is unmeasured, so it is opt-in until its
GPU check: JAGGED_FAST_LAUNCH=1 (read at import) or `ENABLED = True`.

This keeps the binder, so a launch still runs exactly the kernel Triton would pick (the
key is the binder's specialization and options), and calls the cached compiled kernel's
launcher directly. The first launch of each specialization, and any launch while a
launch hook (a profiler) or Triton's debug mode is set, goes through `JITFunction.run`.
"""
from __future__ import annotations

import os

from triton import knobs
from triton.runtime import driver
from triton.runtime.jit import JITFunction

ENABLED = os.environ.get("JAGGED_FAST_LAUNCH", "0") == "1"


def hooked(rt=knobs.runtime) -> bool:
    """A launch hook is set: None means none up to Triton 3.5, an empty chain from 3.8."""
    hook = rt.launch_enter_hook
    return hook is not None and bool(getattr(hook, "calls", True))


class _Fast:
    def __init__(self, fn):
        self.fn = fn
        self.kernels = {}  # (device, specialization, options) -> compiled kernel

    def __getitem__(self, grid):
        return lambda *args, **kw: self.run(grid, args, kw)

    def run(self, grid, args, kw):
        fn = self.fn
        rt = knobs.runtime
        if not ENABLED or hooked(rt) or rt.debug:
            return fn[grid](*args, **kw)
        dev = driver.active.get_current_device()
        binder = fn.device_caches[dev][4]
        bound, spec, options = binder(*args, **kw)
        key = (dev, tuple(spec), tuple(options.items()))
        kernel = self.kernels.get(key)
        if kernel is None:  # compile (or fetch) and launch the ordinary way, once
            kernel = self.kernels[key] = fn[grid](*args, **kw)
            return kernel
        g = tuple(grid) + (1, 1)
        kernel.run(g[0], g[1], g[2], driver.active.get_current_stream(dev), kernel.function,
                   kernel.packed_metadata, None, None, None, *bound.values())
        return kernel


_FAST: dict[int, _Fast] = {}


def fast(fn):
    """The launcher of the @triton.jit function `fn` (one per function, so its cache
    lasts), indexed by grid like `fn` itself; `fn` as is under the interpreter."""
    if not isinstance(fn, JITFunction):
        return fn
    f = _FAST.get(id(fn))
    if f is None:
        f = _FAST[id(fn)] = _Fast(fn)
    return f
