"""GPU: both styles' backward on calls whose tiles split over CTAs (bwd_parts > 1: fp32
dK / dV accumulators, each converted into its own gradient) against the oracle."""
import sys
import torch
sys.path.insert(0, ".")
from harness.backends import KINDS
from harness.oracle import check
from harness.problems import Problem
from jagged.tiles import bwd_parts

bad = 0
for style in ("tlx", "cute"):
    fn = KINDS["jagged"][style].fn()
    for causal in (False, True):
        p = Problem(2, 4, 128, 2000, kv_heads=1, causal=causal, seed=3)
        inp = p.build("cuda", lengths=(torch.tensor([2000, 1800]),) * 2)
        n = inp.q.shape[0]
        print(style, causal, "parts", bwd_parts(n, n, 2, 1, 4, causal, False, 64, 64, 132, 2000, 2000))
        r = check(inp, fn, causal=causal)
        bad += not r.ok
        print(style, p.label(), "OK" if r.ok else "BAD\n" + str(r), flush=True)
print("GATE_SPLIT", "PASS" if bad == 0 else f"FAIL {bad}")
