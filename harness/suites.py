"""Every benchmark suite by name: the jagged suites (harness.problems) and the decode
suite (harness.decode)."""
from __future__ import annotations

from . import decode, problems


def suite(name: str) -> list:
    """A jagged suite's problems, or a decode suite's cells."""
    all_ = {**problems.suites(), **decode.suites()}
    if name not in all_:
        raise ValueError(f"unknown suite {name!r}; known: {', '.join(all_)}")
    return all_[name]
