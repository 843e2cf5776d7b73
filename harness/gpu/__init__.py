"""Device-only tools: GPU checks of each style, host-time and profiling runs, ncu, the
sanitizers and the clocks/ceiling log. Each is a `python -m harness.gpu.<tool>` module;
none is imported by the library."""
