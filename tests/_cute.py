"""Shared by the CuteDSL compile tests: the repo root and whether the DSL imports."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def have_dsl() -> tuple[bool, str]:
    try:
        import cutlass.cute  # noqa: F401
        return True, ""
    except Exception as e:  # not installed, or a broken install
        return False, f"CuteDSL not importable: {type(e).__name__}: {e}"
