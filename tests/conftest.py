"""CPU tests run Triton kernels in the interpreter; `-m gpu` runs them compiled on CUDA.

TRITON_INTERPRET is read when a kernel is decorated, i.e. when its module is
imported, so it is set here, in pytest_configure, before any test module imports
Triton kernels. A value already in the environment wins.
"""
import os

import pytest
import torch


def _selects_gpu(markexpr: str) -> bool:
    return "gpu" in markexpr and "not gpu" not in markexpr


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run with -m gpu on a GPU node)")
    if not _selects_gpu(config.getoption("markexpr", "") or ""):
        os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return
    why = "needs CUDA" if not torch.cuda.is_available() else "TRITON_INTERPRET=1 is set"
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"gpu test: {why}"))


@pytest.fixture(autouse=True)
def _interpreter_bounds():
    """Every interpreted launch stays in its tensor arguments' storages
    (_interp.interpreter_bounds): a stray access raises at the access."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    from _interp import interpreter_bounds
    with interpreter_bounds():
        yield
