"""`fast(kernel)[grid](*args, **kw)`: a Triton launch with less host work per call.

Short sequences are host-bound: on the H200 node a `JITFunction.run` of the forward
kernel took 40.8 us of host time, of which Triton's argument binder (the exact
specialization) took 7.0 and the compiled kernel's launcher (TMA descriptors and
cuLaunchKernelEx) 11.2 (`gpu_check_host`, PERF.md session 9). The rest is per-call
bookkeeping: knob reads, the cache-key string, the global-value check, launch hooks,
and the timing wrapper's own cost: measured in place, this path saved only 4-5 us a
launch (forward 119.9 -> 115.8 us a call, backward's three launches 247.9 -> 233.8).

This keeps the binder, so a launch still runs exactly the kernel Triton would pick (the
key is the binder's specialization and options), and calls the cached compiled kernel's
launcher directly. The first launch of each specialization, and any launch while a
launch hook (a profiler) or Triton's debug mode is set, goes through `JITFunction.run`.
JAGGED_FAST_LAUNCH=0 (read at import) or `ENABLED = False` turns it off.
"""
from __future__ import annotations

import os

from triton import knobs
from triton.runtime import driver
from triton.runtime.jit import JITFunction

ENABLED = os.environ.get("JAGGED_FAST_LAUNCH", "1") != "0"


class _Fast:
    def __init__(self, fn):
        self.fn = fn
        self.kernels = {}  # (device, specialization, options) -> compiled kernel

    def __getitem__(self, grid):
        return lambda *args, **kw: self.run(grid, args, kw)

    def run(self, grid, args, kw):
        fn = self.fn
        rt = knobs.runtime
        if not ENABLED or rt.launch_enter_hook is not None or rt.debug:
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
