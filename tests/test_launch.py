"""jagged.launch.fast: one launcher per kernel (its compiled-kernel cache must
outlive the call that made it), and the interpreter's functions launched as they are."""
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from jagged.launch import fast


@triton.jit
def _k(x_ptr, BLOCK: tl.constexpr):
    pass


def test_fast_is_one_launcher_per_kernel():
    f = fast(_k)
    assert fast(_k) is f
    if isinstance(_k, JITFunction):
        assert f is not _k and f.fn is _k and f.plans == {}
    else:  # TRITON_INTERPRET=1: no compiled kernel to call directly
        assert f is _k


def test_no_hook_by_default_and_a_hook_is_seen():
    """The plan path's guard: Triton 3.8's hook chain is never None, and an empty one is
    no hook."""
    from types import SimpleNamespace

    from triton import knobs

    from jagged.launch import hooked
    assert not hooked(knobs.runtime)
    assert not hooked(SimpleNamespace(launch_enter_hook=None))
    assert hooked(SimpleNamespace(launch_enter_hook=print))
    chain = type(knobs.runtime.launch_enter_hook)
    if chain is not type(None):
        c = chain()
        assert not hooked(SimpleNamespace(launch_enter_hook=c))
        c.add(print)
        assert hooked(SimpleNamespace(launch_enter_hook=c))


# ---------------------------------------------------------------- launch plans
# Exercised on the CPU with the CUDA driver stubbed: the binder, JITFunction.run,
# CudaLauncher and Triton's C++ make_tensordesc_args run for real; compiling,
# cuTensorMapEncodeTiled and the C launch are stubs that record.
import pytest  # noqa: E402
import torch  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from jagged import launch  # noqa: E402


def _py_kernel(desc_a, x_ptr, y_ptr, n, m, scale, flag, desc_b,
               BLOCK: tl.constexpr, MODE: tl.constexpr = 0):
    pass


def _py_kernel_nospec(x_ptr, n, m, BLOCK: tl.constexpr):
    pass


class _Utils:
    calls: list = []

    @staticmethod
    def launch(*a):
        _Utils.calls.append(a)

    @staticmethod
    def fill_tma_descriptor_tiled(ptr, swizzle, elem_size, elem_type, block, shape, strides, pad):
        return ("map", ptr, swizzle, elem_size, elem_type, tuple(block), tuple(shape),
                tuple(strides), pad)

    @staticmethod
    def build_signature_metadata(sig):
        return bytes(len(sig))


class _Driver:
    utils = _Utils()

    def get_current_device(self):
        return 0

    def get_current_stream(self, dev=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


class _FakeKernel:
    """What JITFunction.run and the plan touch on a CompiledKernel; `run` is Triton's own
    CudaLauncher over the stub driver. Descriptor i gets swizzle i + 1, so a plan that
    mixed up the descriptors' metadata would encode differently."""

    def __init__(self, fn, signature, constexprs):
        import triton.backends.nvidia.driver as nvd
        descs = [s for s in signature.values() if isinstance(s, str) and s.startswith("tensordesc")]
        metas = [dict(swizzle=i + 1, elem_size=2, elem_type=10, fp4_padded=False,
                      block_size=[int(x) for x in s[s.index("[") + 1:s.index("]")].split(",")])
                 for i, s in enumerate(descs)]
        self.metadata = SimpleNamespace(
            tensordesc_meta=metas or None, global_scratch_size=0, global_scratch_align=1,
            profile_scratch_size=0, profile_scratch_align=1, launch_cooperative_grid=False,
            launch_pdl=False, num_ctas=1, instrumentation_mode="")
        src = SimpleNamespace(fn=fn, signature=signature, constants=constexprs)
        self.run = nvd.CudaLauncher(src, self.metadata)
        self.function, self.packed_metadata = 1234, (4, 1, 0)

    def launch_metadata(self, grid, stream, *args):
        return None


def _fake_compile(fn):
    def compile_(key, signature, device, constexprs, options, attrs, warmup):
        k = fn.device_caches[device][0][key] = _FakeKernel(fn, signature, constexprs)
        return k
    fn._do_compile = compile_
    return fn


@pytest.fixture
def stub():
    try:
        import triton.backends.nvidia.driver as nvd
        from triton.runtime import driver
    except Exception as e:  # pragma: no cover
        pytest.skip(f"cannot stub Triton's CUDA driver: {e}")
    names = ("PyKernelArg", "ARG_CONSTEXPR", "ARG_KERNEL", "ARG_TUPLE")
    saved = (driver._active, {n: getattr(nvd, n) for n in names}, launch.FAST,
             launch.VERIFY)
    driver.set_active(_Driver())
    if nvd.PyKernelArg is None:  # no libcuda here: the launcher's argument annotations
        nvd.PyKernelArg = lambda nested_tuple=None, type=None: (type, nested_tuple)
        nvd.ARG_CONSTEXPR, nvd.ARG_KERNEL, nvd.ARG_TUPLE = 0, 1, 2
    _Utils.calls.clear()
    launch._BOXES.clear()
    try:
        yield
    finally:
        driver._active = saved[0]
        for n, v in saved[1].items():
            setattr(nvd, n, v)
        launch.FAST, launch.VERIFY = saved[2:]


def _buf(offset_bytes=0, n=4096, dtype=torch.bfloat16):
    b = torch.zeros(n + 64, dtype=dtype)
    return b[offset_bytes // b.element_size():][:n]


def _args(x=None, y=None, n=32, m=5, a=None, b=None):
    from triton.tools.tensor_descriptor import TensorDescriptor
    a = _buf() if a is None else a
    b = _buf() if b is None else b
    da = TensorDescriptor(a.view(64, 64), [64, 64], [64, 1], [16, 64])
    db = TensorDescriptor(b.view(32, 128), [32, 128], [128, 1], [32, 64])
    return (da, _buf() if x is None else x, _buf() if y is None else y, n, m, 0.5, True, db)


def _triton_key(fn, args, kw):
    return launch._Fast(fn).triton_key(0, args, kw)[0]


def test_plan_key_follows_the_specialization(stub):
    fn = JITFunction(_py_kernel)
    f = launch._Fast(fn)
    kw = dict(BLOCK=64, num_warps=4)
    base = f.key(0, _args(), kw)
    same = [  # same specialization: same plan
        (_args(x=_buf(32), n=48, m=7), kw),  # other aligned pointers, ints of the same class
        (_args(n=64 * 1024), kw),
        (_args(a=_buf(64)), kw)]  # another (aligned) descriptor base
    other = [  # another specialization: another plan
        (_args(x=_buf(2)), kw),  # 16-byte alignment of a pointer
        (_args(y=_buf(8)), kw),
        (_args(n=1), kw),  # an int == 1
        (_args(n=33), kw),  # an int % 16
        (_args(m=16), kw),
        (_args(m=1), kw),
        (_args(n=1 << 31), kw),  # i64
        (_args(x=_buf(dtype=torch.float16)), kw),  # dtype
        (_args(), dict(kw, BLOCK=128)),  # a constexpr
        (_args(), dict(kw, BLOCK=64, MODE=1)),  # a defaulted constexpr given
        (_args(), dict(kw, num_warps=8))]  # an option
    for a, k in same:
        assert f.key(0, a, k) == base
        assert _triton_key(fn, a, k) == _triton_key(fn, _args(), kw)
    for a, k in other:
        assert f.key(0, a, k) != base
    # sound: whatever two calls share a plan key, Triton picks the same kernel for both
    calls = [(_args(), kw)] + same + other
    for i, (a1, k1) in enumerate(calls):
        for a2, k2 in calls[i + 1:]:
            if f.key(0, a1, k1) == f.key(0, a2, k2):
                assert _triton_key(fn, a1, k1) == _triton_key(fn, a2, k2)
    # True and 1 hash alike: a constexpr's type is in the key
    assert f.key(0, _args(), dict(kw, MODE=True)) != f.key(0, _args(), dict(kw, MODE=1))


def test_plan_key_do_not_specialize(stub):
    fn = JITFunction(_py_kernel_nospec, do_not_specialize=["m"])
    f = launch._Fast(fn)
    x = _buf()
    k = f.key(0, (x, 16, 1), dict(BLOCK=8))
    assert f.key(0, (x, 16, 7), dict(BLOCK=8)) == k  # m: no ==1 / %16 class
    assert f.key(0, (x, 16, 1 << 40), dict(BLOCK=8)) != k  # but its integer type counts
    assert f.key(0, (x, 1, 1), dict(BLOCK=8)) != k
    assert _triton_key(fn, (x, 16, 1), dict(BLOCK=8)) == _triton_key(fn, (x, 16, 7), dict(BLOCK=8))


def _launch(fn, plan, args, kw, grid=(7, 3)):
    launch.set_fast(plan)
    _Utils.calls.clear()
    launch.fast(fn)[grid](*args, **kw)
    assert len(_Utils.calls) == 1
    return _Utils.calls[0]


def _same_launch(plan_call, triton_call):
    # (gx, gy, gz, stream, function, coop, pdl, packed metadata, launch metadata, enter hook,
    #  exit hook, global scratch, profile scratch, annotations, kernel signature, args)
    assert plan_call[:8] == triton_call[:8]
    assert plan_call[8:11] == (None, None, None)  # hooks: only when set (then Triton's path)
    assert plan_call[11:] == triton_call[11:]


@pytest.mark.parametrize("tail", [dict(BLOCK=64), dict(BLOCK=64, MODE=3)])
def test_plan_launch_equals_tritons(stub, tail):
    fn = _fake_compile(JITFunction(_py_kernel))
    f = launch.fast(fn)
    args, kw = _args(n=48), dict(tail, num_warps=4)
    ref = _launch(fn, False, args, kw)  # Triton's own path (compiles: the fake kernel)
    assert f.launches == 0
    assert _launch(fn, True, args, kw) == ref  # records: through Triton
    assert f.launches == 0 and f.records == 1
    _same_launch(_launch(fn, True, args, kw), ref)  # the plan
    assert f.launches == 1
    kargs = ref[-1]
    assert kargs[0][0] == "map" and kargs[0][2] == 1  # desc_a: the first descriptor's meta
    assert kargs[-2 - 4 - 1][2] == 2  # desc_b (map, 2 dims, 2 strides, then constexprs)
    # other tensors, same specialization: the plan again, args as Triton's
    args2 = _args(x=_buf(32), n=64, m=9, a=_buf(16))
    ref2 = _launch(fn, False, args2, kw)
    _same_launch(_launch(fn, True, args2, kw), ref2)
    assert f.launches == 2 and f.records == 1
    # a 1-d grid, and a hit in the descriptor cache is the same encoding
    _same_launch(_launch(fn, True, args2, kw, grid=(5,)), _launch(fn, False, args2, kw, grid=(5,)))


def test_plan_falls_back(stub):
    from triton import knobs
    fn = _fake_compile(JITFunction(_py_kernel))
    f = launch.fast(fn)
    args, kw = _args(), dict(BLOCK=64)
    _launch(fn, True, args, kw)
    _launch(fn, True, args, kw)
    assert f.launches == 1
    knobs.runtime.launch_enter_hook.add(_hook := (lambda md: None))
    try:
        _launch(fn, True, args, kw)  # a profiler's hook: Triton's path
    finally:
        knobs.runtime.launch_enter_hook.remove(_hook)
    assert f.launches == 1 and f.fallbacks == 1
    _launch(fn, True, args[:-1] + (args[-1].base,), kw)  # a pointer for desc_b: a new plan
    assert f.records == 2 and len(f.plans) == 2
    _launch(fn, True, args[:3] + ((3, 4),) + args[4:], kw)  # a kind the key lacks (a tuple)
    assert f.launches == 1 and f.fallbacks == 2 and len(f.plans) == 2


def test_verify_checks_the_plan(stub):
    fn = _fake_compile(JITFunction(_py_kernel))
    f = launch.fast(fn)
    args, kw = _args(), dict(BLOCK=64)
    launch.VERIFY = True
    _launch(fn, True, args, kw)
    _launch(fn, True, args, kw)  # verified: the binder agrees
    assert f.launches == 1
    (plan,) = f.plans.values()
    plan.cache_key = "another"  # as if the key had merged two specializations
    with pytest.raises(AssertionError, match="specialization"):
        _launch(fn, True, args, kw)


def _launch_at(fn, site, args, kw, grid=(7, 3)):
    launch.set_fast(True)
    _Utils.calls.clear()
    launch.fast_at(fn, site)[grid](*args, **kw)
    assert len(_Utils.calls) == 1
    return _Utils.calls[0]


def test_a_site_launches_its_plan_without_the_key(stub, monkeypatch):
    fn = _fake_compile(JITFunction(_py_kernel))
    f = launch.fast(fn)
    args, kw = _args(n=48), dict(BLOCK=64, num_warps=4)
    ref = _launch(fn, False, args, kw)  # Triton's own path
    _launch_at(fn, "s", args, kw)  # records the plan, then the site
    assert f.records == 1 and f.site_launches == 0 and len(f.sites) == 1
    keys = []
    monkeypatch.setattr(f, "key", lambda *a: keys.append(a) or launch._Fast.key(f, *a))
    args2 = _args(x=_buf(32), n=64, m=9, a=_buf(16))  # other tensors, same classes
    _same_launch(_launch_at(fn, "s", args2, kw), _launch(fn, False, args2, kw))
    assert f.site_launches == 1 and keys == []  # no key computed
    _same_launch(_launch_at(fn, "s", args, kw), ref)
    assert f.site_launches == 2 and keys == []
    # a tensor off 16 bytes: the plan path, which picks its own specialization
    args3 = _args(x=_buf(2))
    _launch_at(fn, "s", args3, kw)  # records that specialization's plan
    _same_launch(_launch_at(fn, "s", args3, kw), _launch(fn, False, args3, kw))
    assert f.site_launches == 2 and keys
    # another site: recorded on its own
    _launch_at(fn, ("t", 1), args, kw)
    assert len(f.sites) == 2


def test_verify_checks_a_site(stub):
    """A site that does not fix the specialization (here n's class) is caught under
    VERIFY, which checks each site launch's plan against the key's."""
    fn = _fake_compile(JITFunction(_py_kernel))
    launch.VERIFY = True
    _launch_at(fn, "s", _args(n=48), dict(BLOCK=64))
    _launch_at(fn, "s", _args(n=64), dict(BLOCK=64))  # same class (%16): verified
    with pytest.raises(AssertionError, match="does not fix the specialization"):
        _launch_at(fn, "s", _args(n=1), dict(BLOCK=64))


def test_fast_at_without_a_site_is_fast():
    assert launch.fast_at(_k, None) is launch.fast(_k)


def test_plans_by_default_on_the_verified_triton(monkeypatch):
    """Plans are the default only on the Triton they were checked against on the GPU;
    JAGGED_FAST_LAUNCH=0 takes Triton's path there too."""
    monkeypatch.delenv("JAGGED_FAST_LAUNCH", raising=False)
    monkeypatch.setattr(triton, "__version__", launch.VERIFIED_TRITON + "0")
    assert launch._default_fast()
    monkeypatch.setattr(triton, "__version__", "9.9.0")
    assert not launch._default_fast()
    monkeypatch.setattr(triton, "__version__", launch.VERIFIED_TRITON + "0")
    monkeypatch.setenv("JAGGED_FAST_LAUNCH", "0")
    assert not launch._default_fast()
    monkeypatch.setenv("JAGGED_FAST_LAUNCH", "1")
    assert launch._default_fast()


def test_kernels_take_runtime_arguments_by_position():
    """A launch plan needs every runtime argument positional (one by keyword takes
    Triton's path, ~40 us of host time a launch): the kernels launched through `fast`
    list their runtime parameters before their constexprs, as their calls pass them."""
    import importlib
    import inspect
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    launched = set()
    for path in [*root.glob("jagged/*.py"), *root.glob("kernels_tlx/*.py")]:
        for name in re.findall(r"\bfast(?:_at)?\((\w+)[,)]", path.read_text()):
            mod = ".".join(path.relative_to(root).with_suffix("").parts)
            launched.add((mod, name))
    assert ("kernels_tlx.bwd_hopper", "bwd_kernel") in launched
    checked = 0
    for mod, name in sorted(launched):
        fn = getattr(importlib.import_module(mod), name, None)
        if not hasattr(fn, "fn"):  # not a kernel (launch.py's own text)
            continue
        checked += 1
        params = inspect.signature(fn.fn).parameters.values()  # jitted or interpreted
        kinds = [str(p.annotation).endswith("constexpr") for p in params]
        assert kinds == sorted(kinds), f"{mod}.{name}: a runtime parameter after a constexpr"
    assert checked >= 8, sorted(launched)


def test_cached_descriptors_launch_as_fresh_ones(stub, monkeypatch):
    """tma_desc: one object per (address, dtype, geometry, block), holding no tensor; its
    launches, first (Triton's path) and planned (its own encoded map), equal those of
    plain TensorDescriptors over the same tensors."""
    import gc
    import weakref
    from triton.tools.tensor_descriptor import TensorDescriptor
    monkeypatch.setattr(launch, "INTERPRET", False)  # the suite's default: the interpreter
    fn = _fake_compile(JITFunction(_py_kernel))
    f = launch.fast(fn)
    a, b = _buf(), _buf(32)
    kw = dict(BLOCK=64, num_warps=4)

    mid = _args(a=a, b=b)[1:7]  # the same tensors and scalars in each call

    def cached(a, b):
        return (launch.tma_desc(a, (64, 64), (64, 1), (16, 64)), *mid,
                launch.tma_desc(b, (32, 128), (128, 1), (32, 64)))

    def plain(a, b):
        return (TensorDescriptor(a, [64, 64], [64, 1], [16, 64]), *mid,
                TensorDescriptor(b, [32, 128], [128, 1], [32, 64]))

    args = cached(a, b)
    assert args[0] is launch.tma_desc(a, (64, 64), (64, 1), (16, 64))
    assert args[0] is not launch.tma_desc(a, (64, 64), (64, 1), (32, 64))
    ref = _launch(fn, False, plain(a, b), kw)
    assert _launch(fn, False, args, kw) == ref   # Triton's path
    assert _launch(fn, True, args, kw) == ref    # records
    _same_launch(_launch(fn, True, args, kw), ref)    # the plan, encoding its map
    _same_launch(_launch(fn, True, cached(a, b), kw), ref)  # the map kept on the object
    assert f.launches == 2
    assert args[0].encoded[1][0] == ref[-1][0] and args[-1].encoded[1][0] == ref[-1][-7]
    t = _buf()
    gone = weakref.ref(t)
    launch.tma_desc(t, (64, 64), (64, 1), (16, 64))
    del t
    gc.collect()
    assert gone() is None
