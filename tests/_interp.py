"""Helpers for tests in the Triton interpreter (TRITON_INTERPRET=1)."""
import contextlib
import dataclasses
import os

import pytest

interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                            reason="CPU interpreter test (TRITON_INTERPRET=1)")


@contextlib.contextmanager
def interpreter_asserts():
    """The interpreter compiles no device_assert unless its options ask for debug (the
    GPU builds of the check kernels set debug=True themselves)."""
    from triton.runtime import interpreter
    b = interpreter.interpreter_builder
    old = b.options
    b.options = dataclasses.replace(old, debug=True)
    try:
        yield
    finally:
        b.options = old


@contextlib.contextmanager
def interpreter_bounds():
    """Bounds checks under the interpreter: each load, store and atomic a kernel issues
    (its active lanes) must fall in the storage of one of the launch's tensor arguments,
    else the launch raises (an InterpreterError around an IndexError naming the kernel
    and the address). A compiled kernel's stray access may land in mapped memory and
    corrupt it silently, or fault in a later launch; here it stops at the access."""
    import numpy as np
    from triton.runtime import interpreter as I
    state = {"fn": "?", "spans": np.zeros((0, 2), np.uint64)}
    b, grid = I.InterpreterBuilder, I.GridExecutor
    hooks = ("create_masked_load", "create_masked_store", "create_atomic_rmw",
             "create_atomic_cas")
    if not hasattr(grid, "_init_args_hst") or not all(hasattr(b, h) for h in hooks):
        yield  # another interpreter: unchecked (test_portable's stray-load test fails)
        return
    saved = (grid._init_args_hst, b.create_masked_load, b.create_masked_store,
             b.create_atomic_rmw, b.create_atomic_cas)
    init0, load0, store0, rmw0, cas0 = saved

    def storages(x, out):
        if isinstance(x, (tuple, list)):
            for y in x:
                storages(y, out)
        elif hasattr(x, "untyped_storage"):
            s = x.untyped_storage()
            out.append((s.data_ptr(), s.data_ptr() + s.nbytes()))
        elif hasattr(getattr(x, "base", None), "untyped_storage"):  # a TensorDescriptor
            storages(x.base, out)
        return out

    def init(self, args_dev, kwargs):
        args, kw = init0(self, args_dev, kwargs)
        state["fn"] = getattr(self.fn, "__name__", "?")
        state["spans"] = np.array(storages([args, list(kw.values())], []),
                                  np.uint64).reshape(-1, 2)
        return args, kw

    def check(ptrs, mask, what):
        p = np.asarray(ptrs.data)
        if mask is not None:
            p = p[np.broadcast_to(np.asarray(mask.data, bool), p.shape)]
        p = p.astype(np.uint64).ravel()
        s = state["spans"]
        inside = ((p[:, None] >= s[None, :, 0]) & (p[:, None] < s[None, :, 1])).any(1)
        if not inside.all():
            raise IndexError(f"{state['fn']}: {what} of {int((~inside).sum())} lanes outside "
                             f"every argument's storage, first at {int(p[~inside][0]):#x}")

    def load(self, ptrs, mask, other, *a, **kw):
        check(ptrs, mask, "load")
        return load0(self, ptrs, mask, other, *a, **kw)

    def store(self, ptrs, value, mask, *a, **kw):
        check(ptrs, mask, "store")
        return store0(self, ptrs, value, mask, *a, **kw)

    def rmw(self, op, ptr, val, mask, *a, **kw):
        check(ptr, mask, "atomic")
        return rmw0(self, op, ptr, val, mask, *a, **kw)

    def cas(self, ptr, cmp, val, *a, **kw):
        check(ptr, None, "atomic")
        return cas0(self, ptr, cmp, val, *a, **kw)

    grid._init_args_hst = init
    b.create_masked_load, b.create_masked_store = load, store
    b.create_atomic_rmw, b.create_atomic_cas = rmw, cas
    try:
        yield
    finally:
        (grid._init_args_hst, b.create_masked_load, b.create_masked_store,
         b.create_atomic_rmw, b.create_atomic_cas) = saved
