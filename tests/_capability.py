"""A CUDA device of a chosen compute capability, mocked on the CPU (the dispatch tests):
the `device` fixture's set(major, minor) makes device 0 report it and empties the
dispatch caches before and after."""
import importlib

import pytest
import torch

import kernels_cute
import kernels_tlx
from jagged import dispatch

STYLE_PKGS = {"cute": kernels_cute, "tlx": kernels_tlx}


@pytest.fixture
def device(monkeypatch):
    """set(major, minor): CUDA device 0 reports that capability; the dispatch caches are
    emptied before and after."""
    for pkg in STYLE_PKGS.values():  # imported before the mock: no import sees it
        for mod in ("fwd_hopper", "bwd_hopper", "fwd_blackwell", "bwd_blackwell"):
            importlib.import_module(f"{pkg.__name__}.{mod}")

    def clear():
        dispatch._CHOSEN.clear()
        dispatch._KERNELS.clear()

    def set_capability(major, minor=0):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability",
                            lambda device=None: (major, minor))
        clear()
    clear()
    yield set_capability
    clear()
