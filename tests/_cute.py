"""Shared by the CuteDSL compile tests: the repo root and whether the DSL imports."""
import os
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def have_dsl() -> tuple[bool, str]:
    try:
        import cutlass.cute  # noqa: F401
        return True, ""
    except Exception as e:  # not installed, or a broken install
        return False, f"CuteDSL not importable: {type(e).__name__}: {e}"


def compile_in_subprocess(tmp_path, script: str, timeout: int):
    """Run a compile script with CUTE_DSL_ARCH=sm_90a in a fresh process (the DSL reads
    its settings at import) and return the path of the PTX it kept, or None. Skips the
    test when the DSL cannot compile on this machine."""
    import glob
    import subprocess
    import sys

    import pytest

    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin",
               CUTE_DSL_DUMP_DIR=str(tmp_path), CUTE_DSL_DISABLE_FILE_CACHING="1")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                       text=True, timeout=timeout, cwd=str(tmp_path))
    if "COMPILED" not in r.stdout:
        tail = (r.stdout + r.stderr)[-3000:]
        if "libcuda" in tail or "CUDA driver" in tail:
            pytest.skip(f"CuteDSL cannot compile here: {tail[-300:]}")
        raise AssertionError(f"compile failed:\n{tail}")
    ptx = glob.glob(os.path.join(str(tmp_path), "*.ptx"))
    return ptx[0] if ptx else None


def ptxas_v(path: str):
    """ptxas -v for sm_90a on a kept PTX file: the finished process (its stderr holds the
    resource lines and the advisories), or None without ptxas."""
    import shutil
    import subprocess
    exe = shutil.which("ptxas")
    if exe is None:
        return None
    return subprocess.run([exe, "-arch=sm_90a", "-v", path, "-o", os.devnull],
                          capture_output=True, text=True, timeout=120)


class PtxasReport(NamedTuple):
    """What `ptxas -v` printed for a kept PTX file."""
    returncode: int
    registers: list[int]   # "Used N registers", one per function
    spills: list[int]      # spill store + load bytes, one per function
    advisories: list[str]  # C751x: ptxas serialized wgmmas (an injected warpgroup.wait)
    stderr: str

    @property
    def spill_bytes(self) -> int:
        return sum(self.spills)


def ptxas_report(path: str) -> PtxasReport | None:
    """ptxas_v's output parsed, or None without ptxas."""
    import re
    r = ptxas_v(path)
    if r is None:
        return None
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
    return PtxasReport(
        r.returncode, [int(n) for n in re.findall(r"Used (\d+) registers", r.stderr)],
        [int(a) + int(b) for a, b in spills],
        [ln for ln in r.stderr.splitlines() if re.search(r"C751\d", ln)], r.stderr)


def traced_check(tmp_path, name: str, module_src: str, asserts: str, timeout: int = 300):
    """Plain-Python checks of CuteDSL layouts, run at trace time (the DSL evaluates layout
    algebra inside jit functions only): `module_src` defines FOUND and run() and is written
    as module `name` (the DSL compiles from source files only) with a @cute.jit `check`
    calling run(); a fresh sm_90a process compiles it, then runs `asserts` with F = FOUND."""
    import textwrap
    (tmp_path / f"{name}.py").write_text(
        f"import sys\nsys.path.insert(0, {ROOT!r})\n" + textwrap.dedent(module_src) +
        "\n\n@cute.jit\ndef check():\n    run()\n")
    compile_in_subprocess(tmp_path, (
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
        f"import cutlass.cute as cute, {name}\ncute.compile({name}.check)\n"
        f"F = {name}.FOUND\n" + textwrap.dedent(asserts) + "\nprint('COMPILED')\n"), timeout)
