"""GPU: both styles' block-padded dQ accumulator (Config.dq_flat) forced on every packed
call their steps take it at (jagged.tiles.FLAT_MEAN_Q = 0), against the oracle: fresh
random inputs, outputs poisoned by the oracle's check; lengths around the 64 / 80 /
128-row blocks, empty and one-row sequences, GQA, causal, cross, fp16, D = 64 and 128;
then with tiles split over 2 and 4 programs as well."""
import sys, torch
sys.path.insert(0, ".")
from harness.problems import Problem
from harness.oracle import check
from harness.backends import KINDS
import jagged.tiles
import kernels_cute.bwd_hopper as C
import kernels_tlx.bwd_hopper as T

jagged.tiles.FLAT_MEAN_Q = 0.0
probs = [Problem(2, 8, 128, 3000, kv_heads=2, sparsity=0.9, seed=1),
         Problem(3, 4, 128, 2500, kv_heads=1, sparsity=0.7, causal=True, seed=2),
         Problem(2, 2, 128, 4096, max_seqlen_k=512, mode="cross", causal=True, seed=3),
         Problem(4, 4, 64, 1500, dtype="fp16", causal=True, seed=4),
         Problem(3, 4, 64, 2000, kv_heads=2, seed=5),
         Problem(6, 4, 128, 900, kv_heads=4, dtype="fp16", seed=6),
         Problem(40, 4, 128, 300, kv_heads=2, sparsity=0.3, seed=7)]
fixed = [[1, 63, 64, 65, 79, 80, 81, 127, 128, 129, 300, 0, 1000],
         [200, 3, 0, 160, 333, 2049, 1]]
bad = 0
for style, P in [(s, P) for s in sys.argv[1].split(",") for P in (1, 2, 4)]:
    fn = KINDS["jagged"][style].fn()
    T.bwd_parts = C.bwd_parts = (lambda P: lambda *a: P)(P)
    cases = [(p, None) for p in (probs if P == 1 else probs[:3])]
    cases += [(Problem(len(l), 4, d, max(l), kv_heads=2, causal=c), torch.tensor(l))
              for l in fixed for d in (64, 128) for c in (False, True)][:8 if P == 1 else 2]
    for p, lens in cases:
        inp = p.build("cuda") if lens is None else p.build("cuda", lengths=(lens, lens))
        r = check(inp, fn, causal=p.causal)
        bad += not r.ok
        print(style, "P", P, p.label(), "" if lens is None else lens.tolist(),
              "OK" if r.ok else "BAD\n" + str(r), flush=True)
print("GATE_FLAT", "PASS" if bad == 0 else f"FAIL {bad}")
