"""One process, one fuzz problem: the TLX backward's host time a call, issued the tool's way
(harness.gpu.tlx_host: `jagged_attention`, host_ms over 100 calls) and the bench's way
(the backend wrapper with return_lse, host_ms over 10 calls), in alternating rounds,
then again after the bench's oracle gate and after do_bench, so that PERF gap 7's two
readings (the row 1.6x the tool on one H100) meet in one process.

    source .gpu1/activate.sh; PYTHONPATH=. python scripts/ab/host_pair.py --match "B40 H8/8 D64"
"""
from __future__ import annotations

import argparse

import torch
import triton.testing

import jagged
from harness import backends
from harness.bench import _free, call_kw, host_ms, pass_call
from harness.oracle import check
from harness.problems import fuzz_problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--match", default="B40 H8/8 D64")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    p = next(p for p in fuzz_problems(40, a.seed) if a.match in p.label())
    kw = call_kw(p)
    wrapper = backends.get("tlx").fn()

    def plain(*args, **k):
        return jagged.jagged_attention(*args, backend="tlx", **k)

    inp = p.build("cuda")
    calls = {"tool: jagged_attention": pass_call(plain, inp, "bwd", kw)[0],
             "bench: wrapper, return_lse": pass_call(wrapper, inp, "bwd", kw)[0]}

    def report(tag):
        for name, call in calls.items():
            print(f"{tag:14s} {name:28s} n=10 {host_ms(call, 10) * 1e3:7.1f} us   "
                  f"n=100 {host_ms(call, 100) * 1e3:7.1f} us", flush=True)

    print(p.label(), torch.cuda.get_device_name())
    for r in range(a.rounds):
        report(f"round {r}")
    gp = p.replace(batch=64) if 64 < p.batch else p
    rep = check(gp.build("cuda"), wrapper, backward=True, check_lse=True, **kw)
    _free()
    print("gate", "ok" if rep.ok else "FAIL")
    for r in range(a.rounds):
        report(f"after gate {r}")
    for name, call in calls.items():
        ms = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
        print(f"do_bench {name}: {ms:.4f} ms, then n=10 {host_ms(call, 10) * 1e3:.1f} us")


if __name__ == "__main__":
    main()
