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
