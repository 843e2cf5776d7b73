"""The TLX backward's own host Python on the CPU: `bwd_hopper.backward` per call with its
launches stubbed to no-ops, the tile lists built once in the interpreter (cached per
offsets), the TMA descriptors on their cached path. Best of 5 means of 200 calls.

    PYTHONPATH=. python scripts/ab/host_cpu.py 15,8,8,128,256,1 [B,H,HKV,D,L,causal ...]
    PROF=1 ... adds a cProfile of 300 calls
"""
import cProfile
import os
import pstats
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # the list kernels' first build

import torch  # noqa: E402

import jagged.launch as launch  # noqa: E402
from harness.problems import offsets  # noqa: E402
from kernels_tlx import bwd_hopper as bw  # noqa: E402


class Stub:
    def __init__(self, fn, site=None):
        pass

    def __getitem__(self, grid):
        return lambda *args, **kw: None


def call(B, H, HKV, D, L, causal):
    g = torch.Generator().manual_seed(0)
    cu = offsets(torch.full((B,), L))
    n = B * L
    q = torch.randn(n, H, D, generator=g).bfloat16()
    k = torch.randn(n, HKV, D, generator=g).bfloat16()
    o = torch.randn(n, H, D, generator=g).bfloat16()
    lse = torch.randn(H, n)
    return lambda: bw.backward(o, q, k, k, o, lse, cu, cu, L, L, causal, 0.1, False)


def main():
    bw.fast_at = bw.fast = Stub
    bw.num_sms = lambda dev: 132
    for spec in sys.argv[1:] or ["15,8,8,128,256,1"]:
        B, H, HKV, D, L, c = map(int, spec.split(","))
        f = call(B, H, HKV, D, L, bool(c))
        launch.INTERPRET = True
        f()  # the tile lists, interpreted and cached
        launch.INTERPRET = False  # descriptors as on a GPU: cached by address
        f()
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(200):
                f()
            best = min(best, (time.perf_counter() - t) / 200)
        print(f"{spec}: {best * 1e6:.1f} us a call", flush=True)
        if os.environ.get("PROF"):
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(300):
                f()
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
