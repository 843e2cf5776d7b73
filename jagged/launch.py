"""`fast(kernel)[grid](*args, **kw)`: a Triton launch with less host work per call.

Short sequences are host-bound: a `JITFunction.run` of the forward kernel takes ~41 us of
host time on the H200 node, of which Triton's argument binder (the exact specialization)
takes 7 and the compiled kernel's launcher (TMA descriptors and cuLaunchKernelEx) 11; the
rest is per-call bookkeeping (knob reads, the cache-key string, the global-value check,
launch hooks). At gem 256 / 0.1 a launch plan takes an API forward call from 85.8 to
59.2 us and `autograd.grad` from 351.0 to 247.7 us, with bit-identical outputs.

A launch plan per call shape, without the binder. Its key is everything Triton's
specialization depends on for the call, no coarser: the device, uTLX's stages hook, the
instrumentation mode, the function's debug flag; per positional runtime argument its
class as native_specialize_impl sees it (tensor: dtype and 16-byte alignment of
data_ptr(); int: ==1, %16==0 and i32/i64/u64 range, the range only if do_not_specialize;
TensorDescriptor: base dtype, block shape, rank; float, bool, None: the type); positional
constexprs by (type, value); the keywords (constexprs and options) by value and type. A
key's first call goes through `JITFunction.run` and records the kernel it launched; later
calls flatten the arguments as CudaLauncher does (descriptors encoded by Triton's
make_tensordesc_arg; a `tma_desc` keeps its encoding for the kernel's descriptor
metadata) and call the raw C launcher with the grid, stream and the kernel's
metadata. A launch hook (a profiler), Triton's debug mode, pre-run hooks, a callable grid,
an argument of another kind, runtime arguments by keyword, a kernel with global or
profile scratch, or gsan: Triton's path. It skips Triton's check that the kernel's
globals are unchanged; `VERIFY = True` runs the binder on every plan launch as well and
raises if its cache key, kernel, globals or bound values disagree with the plan's (tests).

`fast_at(kernel, site)[grid](...)`: the calls of one call site whose `site` (their shapes,
dtypes, flags and bounds) fixes every argument's specialization launch the site's plan
without the key, once their tensors are 16-byte aligned as when it was recorded (the key
is ~5 us of Python a launch). Under VERIFY each site launch is checked against the key.

Plans read Triton internals (the binder's specialization rules, CudaLauncher's argument
flattening), so they are on by default only on the Triton they were checked against, bit
for bit, on the H200 (VERIFIED_TRITON); any other version takes Triton's path.
JAGGED_FAST_LAUNCH=0 (read once, at import) takes Triton's path everywhere; so does
`set_fast(False)`.
"""
from __future__ import annotations

import os
from typing import Callable

import torch
import triton
from triton import knobs
from triton.runtime import driver
from triton.runtime.jit import JITFunction, compute_cache_key
from triton.tools.tensor_descriptor import TensorDescriptor

VERIFIED_TRITON = "3.8."
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _default_fast() -> bool:
    return (triton.__version__.startswith(VERIFIED_TRITON)
            and os.environ.get("JAGGED_FAST_LAUNCH") != "0")


FAST = _default_fast()  # launch plans (True) or Triton's own path
VERIFY = False          # check every plan launch against the binder (tests)
SITES = 256             # entries a per-site memo holds before it starts over (not an LRU)


def set_fast(on: bool) -> None:
    """Launch plans (True) or Triton's own launch path (False)."""
    global FAST
    FAST = bool(on)


def hooked(rt=knobs.runtime) -> bool:
    """A launch hook is set: None means none up to Triton 3.5, an empty chain from 3.8."""
    hook = rt.launch_enter_hook
    return hook is not None and bool(getattr(hook, "calls", True))


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for a grid: triton.cdiv is a constexpr function, ~3 us a host call."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The least power of two >= n >= 1 (triton.next_power_of_2, without its host cost)."""
    return 1 << (n - 1).bit_length()


class _Unhandled(Exception):
    """An argument the plan key does not cover: the call goes through Triton."""


_KW = object()  # a tail slot read from the call's keywords
_I32, _I64 = 1 << 31, 1 << 63


def _int_class(a: int) -> int:
    """Triton's integer type for a runtime int: i32, i64 or u64 (native_specialize_impl)."""
    if -_I32 <= a < _I32:
        return 0
    if -_I64 <= a < _I64:
        return 1
    if 0 <= a < 1 << 64:
        return 2
    raise _Unhandled(a)


# ---------------------------------------------------------------- TMA descriptor cache
_BOXES_MAX = 256
_make_tensordesc_arg = None


def _encoded(d, meta, mkey):
    """The launcher's flattened descriptor, [CUtensorMap, *shape, *strides], as Triton's
    make_tensordesc_arg builds it. A `tma_desc` keeps its own for the kernel's descriptor
    metadata (the object stands for one address, geometry and block, so the bytes are
    those a fresh encode gives); any other descriptor is encoded per launch."""
    enc = getattr(d, "encoded", None)
    if enc is not None and enc[0] is mkey:
        return enc[1]
    hit = tuple(_make_tensordesc_arg(d, meta, None))
    if type(d.base) is _Address:
        d.encoded = (mkey, hit)
    return hit


class _Address:
    """A descriptor's base as the launch reads it: the address and dtype of a tensor the
    caller holds for the call, so a cached descriptor keeps no tensor alive."""
    __slots__ = ("ptr", "dtype")

    def __init__(self, ptr: int, dtype):
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr


_BOXES: dict = {}


def tma_desc(t: torch.Tensor, shape: tuple, strides: tuple, block: tuple) -> TensorDescriptor:
    """TensorDescriptor(t, shape, strides, block), cached by (address, dtype, geometry,
    block): a host builds it per call (2-7 us each), and a hit also reuses the launch's
    encoded map (`_encoded`). Its base is the address alone: Triton's specialization and
    launcher read nothing else. The interpreter, which reads the tensor, gets a plain one."""
    if INTERPRET:
        return TensorDescriptor(t, list(shape), list(strides), list(block))
    key = (t.data_ptr(), t.dtype, shape, strides, block)
    d = _BOXES.get(key)
    if d is None:
        if len(_BOXES) >= _BOXES_MAX:
            _BOXES.clear()
        d = _BOXES[key] = TensorDescriptor(_Address(key[0], t.dtype), list(shape),
                                           list(strides), list(block))
    return d


def _meta_key(meta: dict):
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in meta.items()))


class _Plan:
    __slots__ = ("kernel", "function", "packed", "coop", "pdl", "annotations", "signature",
                 "launch", "descs", "tail", "cache_key")


class _Fast:
    def __init__(self, fn):
        self.fn = fn
        self.plans = {}  # plan key -> _Plan, or False (always Triton's path)
        # per parameter: 2 constexpr, 1 runtime not specialized, 0 runtime specialized
        self.kinds = tuple(2 if p.is_constexpr else 1 if p.do_not_specialize else 0
                           for p in fn.params)
        self.sites = {}  # (call site, device) -> (plan, positions of tensor arguments)
        self.launches = self.records = self.fallbacks = self.site_launches = 0

    def __getitem__(self, grid):
        return lambda *args, **kw: self.run(grid, args, kw)

    def run(self, grid, args, kw):
        if not FAST:
            return self.fn[grid](*args, **kw)
        return self.run_plan(grid, args, kw)

    def key(self, dev, args, kw, _T=torch.Tensor, _D=TensorDescriptor, _int=int, _float=float):
        """Everything Triton's choice of compiled kernel depends on for this call, at
        least as fine as the binder's specialization (finer is only a spare plan). Per
        position the kind (constexpr or not) is fixed, so keys of different argument
        types cannot meet: an int is 0..3 ((==1) | (%16==0) << 1) or 8 (not specialized)
        in the i32 range, a tuple beyond; a tensor (dtype, aligned); a descriptor (dtype,
        block, rank); a float "f", a bool "b"; a positional constexpr (type, value)."""
        rt = knobs.runtime
        kinds = self.kinds
        if len(args) > len(kinds):
            raise _Unhandled("too many arguments")
        k = [dev, rt.add_stages_inspection_hook, knobs.compilation.instrumentation_mode,
             self.fn.debug]
        append = k.append
        for a, kind in zip(args, kinds):
            t = type(a)
            if kind == 2:
                append((t, a))
            elif t is _T:
                append((a.dtype, not a.data_ptr() & 15))
            elif t is _int:
                if -2147483648 <= a < 2147483648:
                    append(8 if kind else (a == 1) | ((not a & 15) << 1))
                else:
                    append((_int_class(a),) if kind else (_int_class(a), a == 1, not a & 15))
            elif t is _D:
                append((a.base.dtype, tuple(a.block_shape), len(a.shape)))
            elif t is _float:
                append("f")
            elif t is bool:
                append("b")
            elif a is None:
                append(None)
            elif isinstance(a, _T):  # a Parameter, a subclass
                append((t, a.dtype, not a.data_ptr() & 15))
            else:
                raise _Unhandled(t)
        if kw:
            append(tuple(kw.items()))
            append(tuple(map(type, kw.values())))
        return tuple(k)

    def off_plans(self, grid) -> bool:
        """Whether a call takes Triton's path: under a runtime hook or debug, with the
        kernel's pre-run hooks, or over a callable grid."""
        rt = knobs.runtime
        return hooked(rt) or rt.debug or self.fn.pre_run_hooks or callable(grid)

    def run_plan(self, grid, args, kw):
        if self.off_plans(grid):
            self.fallbacks += 1
            return self.fn[grid](*args, **kw)
        dev = driver.active.get_current_device()
        key, plan = self.lookup(dev, args, kw)
        return self.run_keyed(key, plan, dev, grid, args, kw)

    def lookup(self, dev, args, kw):
        """(this call's plan key, its plan or None); (None, False) for an argument of
        another kind, or an unhashable one."""
        try:
            key = self.key(dev, args, kw)
            return key, self.plans.get(key)
        except (_Unhandled, TypeError):
            return None, False

    def run_keyed(self, key, plan, dev, grid, args, kw):
        """The launch through `plan`: recorded first where None, Triton's path where
        False."""
        if plan is None:
            return self.record(key, dev, grid, args, kw)
        if plan is False:
            self.fallbacks += 1
            return self.fn[grid](*args, **kw)
        if VERIFY:
            self.verify(plan, dev, args, kw)
        return self.launch(plan, dev, grid, args, kw)

    def launch(self, plan, dev, grid, args, kw):
        """The plan's raw launch with this call's arguments."""
        flat = self.flatten(plan, args, kw)
        g0 = grid[0]
        n = len(grid)
        plan.launch(g0, grid[1] if n > 1 else 1, grid[2] if n > 2 else 1,
                    driver.active.get_current_stream(dev), plan.function, plan.coop, plan.pdl,
                    plan.packed, None, None, None, None, None, plan.annotations, plan.signature,
                    flat)
        self.launches += 1
        return plan.kernel

    def at(self, site):
        """This kernel's launcher for the calls of one call site that share `site`: a
        hashable from the caller which fixes every argument's specialization but the
        tensors' 16-byte alignment (the constexprs and options, which positions hold
        tensors of which dtypes and which hold None, each int's ==1 / %16 / range class:
        e.g. the call's shapes, dtypes and flags, from which the site computes them). Its
        calls skip the plan key (~5 us of Python a launch over ~25 arguments): the site's
        plan is launched once every tensor is found 16-byte aligned, as when it was
        recorded; otherwise, and under a hook or VERIFY (which checks the site's plan
        against the key's), the plan path."""
        return _AtSite(self, site)

    def run_site(self, site, grid, args, kw):
        if not FAST:
            return self.fn[grid](*args, **kw)
        fn = self.fn
        if self.off_plans(grid):
            self.fallbacks += 1
            return fn[grid](*args, **kw)
        dev = driver.active.get_current_device()
        hit = self.sites.get((site, dev))
        if hit is not None and not VERIFY:
            plan, tensors = hit
            if not _or_ptrs(args, tensors) & 15:
                self.site_launches += 1
                return self.launch(plan, dev, grid, args, kw)
        key, plan = self.lookup(dev, args, kw)
        kernel = self.run_keyed(key, plan, dev, grid, args, kw)
        if key is None:
            return kernel
        plan = self.plans.get(key)
        if hit is not None and VERIFY and plan is not hit[0]:
            raise AssertionError(f"launch site {site!r} of {fn.__name__}: its plan is not "
                                 "the key's (the site does not fix the specialization)")
        tensors = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        if isinstance(plan, _Plan) and not _or_ptrs(args, tensors) & 15:
            _remember(self.sites, (site, dev), (plan, tensors))
        return kernel

    @staticmethod
    def flatten(plan, args, kw):
        """The kernel arguments as CudaLauncher hands them to the C launcher: every
        parameter in order (constexprs too: the annotations skip them), each tensor
        descriptor expanded in place to its encoded map, shape and strides."""
        tail = tuple([kw[name] if default is _KW else default for name, default in plan.tail])
        if not plan.descs:  # a tuple, as CudaLauncher's *args
            return args + tail if tail else args
        flat, prev = [], 0  # a list, as make_tensordesc_args builds it
        for pos, meta, mkey in plan.descs:
            flat += args[prev:pos]
            flat += _encoded(args[pos], meta, mkey)
            prev = pos + 1
        flat += args[prev:]
        flat += tail
        return flat

    def record(self, key, dev, grid, args, kw):
        """A key's first call: Triton compiles (or fetches) and launches; its kernel and
        launcher become the key's plan (False: stay on Triton's path)."""
        kernel = self.fn[grid](*args, **kw)
        self.records += 1
        plan = self.make_plan(kernel, dev, args, kw) if kernel is not None else None
        if plan is not None:
            if len(self.plans) >= 512:
                self.plans.clear()
            self.plans[key] = plan
        return kernel

    def make_plan(self, kernel, dev, args, kw):
        global _make_tensordesc_arg
        import triton.backends.nvidia.driver as nvd
        fn = self.fn
        la = kernel.run
        if not isinstance(la, nvd.CudaLauncher):
            return False
        if la.global_scratch_size or la.profile_scratch_size or la.gsan_enabled:
            return False  # scratch allocations per launch: Triton's path does them
        params = fn.params
        by_name = {p.name: p for p in params}
        for name in kw:  # runtime parameters by keyword are not in the key
            p = by_name.get(name)
            if p is not None and (not p.is_constexpr or p.num < len(args)):
                return None
        tail = []
        for p in params[len(args):]:
            if p.name in kw:
                tail.append((p.name, _KW))
            elif p.has_default:
                tail.append((p.name, p.default))
            else:
                return None
        metas = list(getattr(kernel.metadata, "tensordesc_meta", None) or ())
        pos = [i for i, a in enumerate(args) if type(a) is TensorDescriptor]
        if len(pos) != len(metas):
            return False  # no descriptor metadata: Triton decomposes them (holds tensors)
        launch = la.launch
        if pos:  # wrap_handle_tensordesc's closure: the raw C launcher inside it
            try:
                launch = launch.__closure__[launch.__code__.co_freevars.index("launcher")]
                launch = launch.cell_contents
            except (AttributeError, ValueError, TypeError):
                return False
            _make_tensordesc_arg = nvd.make_tensordesc_arg
        p = _Plan()
        p.kernel, p.function, p.packed = kernel, kernel.function, kernel.packed_metadata
        p.coop, p.pdl = la.launch_cooperative_grid, la.launch_pdl
        p.annotations, p.signature, p.launch = la.arg_annotations, la.kernel_signature, launch
        p.descs = tuple((i, m, _meta_key(m)) for i, m in zip(pos, metas))
        p.tail = tuple(tail)
        p.cache_key = self.triton_key(dev, args, kw)[0]
        return p

    def triton_key(self, dev, args, kw):
        """JITFunction.run's own cache key for this call, and the binder's bound values."""
        fn = self.fn
        kernel_cache, key_cache, _, _, binder = fn.device_caches[dev]
        kw = dict(kw)
        kw["debug"] = kw.get("debug", fn.debug) or knobs.runtime.debug
        kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        bound, spec, options = binder(*args, **kw)
        if knobs.runtime.add_stages_inspection_hook is not None:
            spec.append(f'("custom_pipeline", {knobs.runtime.add_stages_inspection_hook()[1]})')
        return compute_cache_key(key_cache, spec, options), bound, spec

    def verify(self, plan, dev, args, kw):
        """VERIFY: the binder's specialization of this call picks
        the plan's kernel, the kernel's globals are unchanged, and the values flattened
        are the binder's (descriptors aside)."""
        fn = self.fn
        ck, bound, spec = self.triton_key(dev, args, kw)
        if ck != plan.cache_key or fn.device_caches[dev][0].get(ck) is not plan.kernel:
            raise AssertionError(f"launch plan of {fn.__name__}: the binder's specialization "
                                 f"{spec} is not the plan's ({plan.cache_key})")
        missing = object()
        for (name, _), (val, g) in fn.used_global_vals.items():
            if g.get(name, missing) != val:
                raise AssertionError(f"{fn.__name__}: global {name} changed since compile")
        vals = list(bound.values())
        mine = list(args) + [kw[n] if d is _KW else d for n, d in plan.tail]
        if len(vals) != len(mine) or any(
                a is not b and (isinstance(a, torch.Tensor) or type(a) is not type(b) or a != b)
                for a, b in zip(vals, mine)):
            raise AssertionError(f"{fn.__name__}: plan arguments differ from the binder's")


def _or_ptrs(args, positions) -> int:
    """The bitwise or of the addresses of args' tensors at `positions` (0 for none)."""
    bits = 0
    for i in positions:
        bits |= args[i].data_ptr()
    return bits


class _AtSite:
    __slots__ = ("fast", "site")

    def __init__(self, fast, site):
        self.fast, self.site = fast, site

    def __getitem__(self, grid):
        return lambda *args, **kw: self.fast.run_site(self.site, grid, args, kw)


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


def once_a_site(memo: dict, key, decide: Callable):
    """decide(), made once per `key` (a call site and device: the shapes, dtypes, flags and
    bounds its result is a pure function of) and kept in `memo`, which starts over at
    SITES entries. The backwards' host decisions (both styles): on autograd's device
    thread, whose caches are cold, each decision's code costs more than on the calling
    thread."""
    hit = memo.get(key)
    return _remember(memo, key, decide()) if hit is None else hit


def _remember(memo: dict, key, value):
    """memo[key] = value, in a per-site memo that starts over at SITES entries."""
    if len(memo) >= SITES:
        memo.clear()
    memo[key] = value
    return value


def fast_at(fn, site):
    """`fast(fn)` for the calls of one call site that share `site` (`_Fast.at`; None:
    `fast(fn)` itself); `fn` as is under the interpreter."""
    f = fast(fn)
    return f.at(site) if site is not None and isinstance(f, _Fast) else f
