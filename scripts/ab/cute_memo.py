"""A/B of the CuteDSL backward's decisions once a site (kernels_cute.host._decisions) against
deciding on every call (the memo cleared before each call), one process, arms alternating:
host us a call (host_ms of 100) and do_bench's eager ms, after the oracle gate."""
import sys

import torch
import triton.testing

from harness import backends
from harness.bench import call_kw, host_ms, pass_call
from harness.oracle import check
from harness.problems import fuzz_problems
from kernels_cute import host


def main():
    fn = backends.get("cute").fn()
    probs = fuzz_problems(40, 0)
    print(torch.cuda.get_device_name(), flush=True)
    for m in sys.argv[1:]:
        p = next(p for p in probs if m in p.label())
        kw = call_kw(p)
        rep = check(p.build("cuda"), fn, backward=True, check_lse=True, **kw)
        print(p.label(), "gate", "ok" if rep.ok else f"FAIL {rep}", flush=True)
        inp = p.build("cuda")
        call = pass_call(fn, inp, "bwd", kw)[0]

        def decide():
            host._DECIDED.clear()
            call()
        arms = (("memo", call), ("decide", decide))
        res = {a: [] for a, _ in arms}
        for r in range(4):
            for name, c in arms if r % 2 == 0 else arms[::-1]:
                c()
                res[name].append(host_ms(c, 100) * 1e3)
        with torch.autograd.set_multithreading_enabled(False):
            for r in range(2):
                for name, c in arms:
                    res.setdefault(name + " calling thread", []).append(host_ms(c, 100) * 1e3)
        ms = {}
        for name, c in arms + arms[::-1]:
            t = triton.testing.do_bench(c, warmup=25, rep=100, return_mode="median")
            ms[name] = min(ms.get(name, 1e9), t)
        print("  bwd host us " + "; ".join(f"{a} {['%.1f' % x for x in res[a]]}" for a in res)
              + "; eager ms " + " ".join(f"{a} {ms[a]:.4f}" for a in ms), flush=True)


if __name__ == "__main__":
    main()
