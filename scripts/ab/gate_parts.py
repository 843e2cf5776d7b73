"""GPU: both styles' split backward (bwd_parts forced to P) against the oracle: fresh
random inputs, outputs poisoned by the oracle's check; lengths around the part edges."""
import sys, torch
sys.path.insert(0, ".")
from harness.problems import Problem
from harness.oracle import check
from harness.backends import KINDS
import kernels_tlx.bwd_hopper as T
import kernels_cute.bwd_hopper as C

probs = [Problem(2, 8, 64, 3000, kv_heads=2, sparsity=0.5, seed=1),
         Problem(3, 4, 128, 2500, kv_heads=1, sparsity=0.3, causal=True, seed=2),
         Problem(2, 2, 128, 4096, max_seqlen_k=512, mode="cross", causal=True, seed=3),
         Problem(4, 4, 64, 700, dtype="fp16", causal=True, seed=4),
         Problem(3, 4, 128, 1500, kv_heads=2, dtype="fp16", seed=5),
         Problem(3, 8, 128, 900, kv_heads=1, causal=True, dtype="fp16", seed=6)]
fixed = [[1, 63, 64, 65, 127, 128, 129, 300, 0, 1000], [200, 3, 0, 80, 333, 2049]]
bad = 0
for style in sys.argv[1].split(","):
    fn = KINDS["jagged"][style].fn()
    for P in (2, 4, 8):
        T.bwd_parts = C.bwd_parts = (lambda P: lambda *a: P)(P)
        cases = [(p, None) for p in (probs if P == 2 else probs[:3] + probs[-1:])]
        cases += [(Problem(len(l), 4, d, max(l), kv_heads=2, causal=c), torch.tensor(l))
                  for l in fixed for d in (64, 128) for c in (False, True)][:8 if P == 2 else 2]
        for p, lens in cases:
            inp = p.build("cuda") if lens is None else p.build("cuda", lengths=(lens, lens))
            r = check(inp, fn, causal=p.causal)
            bad += not r.ok
            print(style, "P", P, p.label(), "" if lens is None else lens.tolist(),
                  "OK" if r.ok else "BAD\n" + str(r), flush=True)
print("GATE_PARTS", "PASS" if bad == 0 else f"FAIL {bad}")
