"""kernels_cute.disk_cache on the CPU: a build compiled in one process is stored and then
loaded (not compiled) by the next, a bad entry is compiled again and replaced, the cache
can be turned off, and the fingerprint follows the target. A one-thread kernel stands in
for the attention kernels (compiled for sm_90a, never launched)."""
import os
import subprocess
import sys
import textwrap

import pytest

from _cute import ROOT, have_dsl
from kernels_cute import disk_cache

_ok, _why = have_dsl()

_TINY = textwrap.dedent("""
    import cutlass, cutlass.cute as cute
    CALLS = []

    @cute.kernel
    def _add_one(x: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        x[tidx] = x[tidx] + cutlass.Float32(1.0)

    @cute.jit
    def _launch(x: cute.Tensor):
        _add_one(x).launch(grid=(1, 1, 1), block=(32, 1, 1))

    def make(n):
        CALLS.append(n)
        from cutlass.cute.runtime import make_fake_tensor
        x = make_fake_tensor(cutlass.Float32, (n,), stride=(1,), assumed_align=4)
        return cute.compile(_launch, x, options="--enable-tvm-ffi")
""")

# one process (the DSL reads CUTE_DSL_ARCH at import); load_or_compile keeps nothing in
# memory, so each call below goes to the disk as a new process would
_STEPS = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    sys.path[:0] = [{tmp!r}, {root!r}]
    import tiny
    from kernels_cute import disk_cache

    def step(**env):
        os.environ.update(env)
        n = len(tiny.CALLS)
        fn = disk_cache.load_or_compile(tiny.make, (32,))
        assert callable(fn)
        return len(tiny.CALLS) - n

    def entries():
        return sorted(Path({cache!r}).rglob("*.o"))

    assert step(JAGGED_CUTE_CACHE="0") == 1 and entries() == []     # off: nothing stored
    assert step(JAGGED_CUTE_CACHE="1") == 1                         # compiled, stored
    (obj,) = entries()
    assert step() == 0                                              # loaded: no compile
    obj.write_bytes(b"not an object file")                          # a damaged entry
    assert step() == 1                                              # compiled again ...
    assert entries() == [obj] and obj.stat().st_size > 100
    assert step() == 0                                              # ... and replaced
    assert not list(Path({cache!r}).rglob("*.tmp.o"))
    print("PASSED")
""")


@pytest.mark.skipif(not _ok, reason=_why)
def test_stored_loaded_replaced_and_off(tmp_path):
    (tmp_path / "tiny.py").write_text(_TINY)
    cache = str(tmp_path / "c")
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", JAGGED_CUTE_CACHE_DIR=cache)
    r = subprocess.run([sys.executable, "-c", _STEPS.format(tmp=str(tmp_path), root=ROOT,
                                                            cache=cache)],
                       env=env, capture_output=True, text=True, timeout=300,
                       cwd=str(tmp_path))
    assert "PASSED" in r.stdout, (r.stdout + r.stderr)[-3000:]


def test_fingerprint_and_entry(monkeypatch, tmp_path):
    monkeypatch.setenv("JAGGED_CUTE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    a = disk_cache.fingerprint()
    assert disk_cache.fingerprint() == a
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_100a")
    assert disk_cache.fingerprint() != a
    b = disk_cache.fingerprint()
    monkeypatch.setenv("CUTE_DSL_KEEP", "ptx")       # any DSL setting starts a new folder
    assert disk_cache.fingerprint() != b

    def make(*key):
        return key
    e1, e2 = disk_cache.entry(make, (128, True)), disk_cache.entry(make, (128, False))
    assert e1 != e2 and e1.parent == e2.parent and e1.parent.parent == tmp_path
    monkeypatch.delenv("JAGGED_CUTE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert disk_cache.root() == tmp_path / "xdg" / "jagged-attention" / "cute"
