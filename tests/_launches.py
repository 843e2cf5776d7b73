"""Launches recorded instead of run: the host paths' tests on the CPU."""


def record_launches(monkeypatch, *modules, grids: list | None = None) -> list:
    """Each module's `fast(kernel)[grid](*args, **kw)` and `fast_at(kernel, site)[grid](...)`
    (jagged.launch) recorded, not run: the returned list fills with (kernel name, args,
    kw) as the host launches, and `grids` (if given) with each launch's grid."""
    launches = []

    class Recorder:
        def __init__(self, fn):
            self.name = fn.fn.__name__ if hasattr(fn, "fn") else fn.__name__

        def __getitem__(self, grid):
            if grids is not None:
                grids.append(tuple(grid))
            return lambda *args, **kw: launches.append((self.name, args, kw))

    for m in modules:
        if hasattr(m, "fast"):
            monkeypatch.setattr(m, "fast", Recorder)
        if hasattr(m, "fast_at"):  # a call site's launcher (jagged.launch.fast_at)
            monkeypatch.setattr(m, "fast_at", lambda fn, site: Recorder(fn))
    return launches
