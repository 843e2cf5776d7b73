"""Compiled CuteDSL kernels kept on disk, so a new process loads a kernel (~0.3 s) instead
of compiling it again (~10 s a build).

A build is exported as an object file (`export_to_c`) under
`<dir>/<fingerprint>/<key hash>.o` and loaded back with `cute.runtime.load_module`. The
fingerprint covers what a build depends on besides its key: this package's and `jagged`'s
sources, the DSL and TVM-FFI versions, Python's version, the target (CUTE_DSL_ARCH, or the
current GPU's capability) and every CUTE_DSL_* setting; a change of any of them starts
a new folder. Files are written under a temporary name and renamed into place, so
processes compiling the same build at once never read a partial file. An entry that
does not load is compiled again and replaced.

JAGGED_CUTE_CACHE=0 turns the disk off (compiled kernels then live for the process);
JAGGED_CUTE_CACHE_DIR moves it (default `$XDG_CACHE_HOME/jagged-attention/cute`, or
`~/.cache/...`).
"""
import functools
import hashlib
import os
import sys
from pathlib import Path
from typing import Callable

EXPORT_NAME = "func"
_PACKAGES = ("kernels_cute", "jagged")


def enabled() -> bool:
    return os.environ.get("JAGGED_CUTE_CACHE", "1") != "0"


def root() -> Path:
    base = os.environ.get("JAGGED_CUTE_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(xdg) / "jagged-attention" / "cute"


@functools.cache
def _sources_hash() -> str:
    h = hashlib.sha256()
    top = Path(__file__).resolve().parent.parent
    for pkg in _PACKAGES:
        for f in sorted((top / pkg).glob("*.py")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _target() -> str:
    """What the DSL compiles for: CUTE_DSL_ARCH, else the current GPU."""
    arch = os.environ.get("CUTE_DSL_ARCH")
    if arch:
        return arch
    import torch
    if torch.cuda.is_available():
        return "sm_%d%d" % torch.cuda.get_device_capability()
    return "none"


def fingerprint() -> str:
    from importlib.metadata import version
    parts = [_sources_hash(), sys.version.split()[0], _target()]
    for dist in ("nvidia-cutlass-dsl", "apache-tvm-ffi"):
        try:
            parts.append(f"{dist}={version(dist)}")
        except Exception:  # not installed as a distribution (a source tree)
            parts.append(f"{dist}=?")
    parts += sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith("CUTE_DSL_"))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def entry(make: Callable, key: tuple) -> Path:
    """The object file of make(*key): its name hashes the builder and the key's repr
    (dtypes, ints, bools and Config tuples, whose reprs are stable)."""
    name = f"{make.__module__}.{make.__qualname__}{key!r}"
    return root() / fingerprint() / (hashlib.sha256(name.encode()).hexdigest()[:32] + ".o")


# role: host
@functools.cache
def _preload_runtime():
    """The DSL's runtime libraries, loaded globally: a module loaded from a file resolves
    its symbols against them."""
    import ctypes

    import cutlass.cute as cute
    for lib in cute.runtime.find_runtime_libraries(enable_tvm_ffi=False):
        if Path(lib).exists():
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)


# role: host
def load(path: Path):
    """The function exported in `path`, or None (missing or unloadable)."""
    if not path.is_file():
        return None
    try:
        import cutlass.cute as cute
        _preload_runtime()
        return getattr(cute.runtime.load_module(str(path), enable_tvm_ffi=True), EXPORT_NAME)
    except Exception:
        return None


# role: host
def store(path: Path, fn) -> bool:
    """Export `fn` to `path` (a temporary file renamed into place); False if it failed."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.o")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fn.export_to_c(object_file_path=str(tmp), function_name=EXPORT_NAME)
        if tmp.stat().st_size == 0:
            raise OSError("empty object file")
        os.replace(tmp, path)
        return True
    except Exception:
        tmp.unlink(missing_ok=True)
        return False


def load_or_compile(make: Callable, key: tuple):
    """make(*key), from the disk when an entry loads, else compiled and stored."""
    if not enabled():
        return make(*key)
    path = entry(make, key)
    fn = load(path)
    if fn is None:
        fn = make(*key)
        store(path, fn)
    return fn
