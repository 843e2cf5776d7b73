"""A/B of launch plans per call site (jagged.launch.fast_at) against every launch through
the plan key, and of the backward's decisions made once a site (kernels_tlx.bwd_hopper
MEMO), in one process: TLX forward and backward host time a call (host_ms of 100,
alternating rounds) and do_bench's eager median, after the oracle gate with both on.
Arms: key (neither), site (plans per site), memo (plans and decisions per site).

    source .gpu1/activate.sh; PYTHONPATH=. python scripts/ab/host_sites.py \
        "B15 H8/8 D128" "B40 H8/8 D64" "B24 H2/2 D128"      (fuzz seed 0; ~2 min)
"""
from __future__ import annotations

import sys

import torch
import triton.testing

from harness import backends
from harness.bench import call_kw, host_ms, pass_call
from harness.oracle import check
from harness.problems import fuzz_problems
from jagged import launch
from kernels_tlx import bwd_hopper

SITE = launch._Fast.run_site


def off(self, site, grid, args, kw):
    return self.run(grid, args, kw)


def main():
    fn = backends.get("tlx").fn()
    probs = fuzz_problems(40, 0)
    print(torch.cuda.get_device_name(), flush=True)
    for m in sys.argv[1:]:
        p = next(p for p in probs if m in p.label())
        kw = call_kw(p)
        rep = check(p.build("cuda"), fn, backward=True, check_lse=True, **kw)
        print(p.label(), "gate", "ok" if rep.ok else f"FAIL {rep}", flush=True)
        inp = p.build("cuda")
        for ps in ("fwd", "bwd"):
            call = pass_call(fn, inp, ps, kw)[0]
            arms = (("key", off, False), ("site", SITE, False), ("memo", SITE, True))
            res = {a[0]: [] for a in arms}
            for r in range(3):
                for name, impl, memo in arms if r % 2 == 0 else arms[::-1]:
                    launch._Fast.run_site, bwd_hopper.MEMO = impl, memo
                    call()
                    res[name].append(host_ms(call, 100) * 1e3)
            ms = {}
            for name, impl, memo in arms + arms[::-1]:
                launch._Fast.run_site, bwd_hopper.MEMO = impl, memo
                t = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
                ms[name] = min(ms.get(name, 1e9), t)
            if ps == "bwd":  # the same on the calling thread (autograd's device thread off)
                with torch.autograd.set_multithreading_enabled(False):
                    for r in range(2):
                        for name, impl, memo in arms:
                            launch._Fast.run_site, bwd_hopper.MEMO = impl, memo
                            call()
                            res[name + " calling thread"] = res.get(
                                name + " calling thread", []) + [host_ms(call, 100) * 1e3]
            launch._Fast.run_site, bwd_hopper.MEMO = SITE, True
            print(f"  {ps}: host us " + "; ".join(
                f"{a} {['%.1f' % x for x in res[a]]}" for a in res) + "; eager ms " +
                " ".join(f"{a} {ms[a]:.4f}" for a in ms), flush=True)
    print({f.fn.__name__: (f.launches, f.site_launches, f.records, f.fallbacks)
           for f in launch._FAST.values()})


if __name__ == "__main__":
    main()
