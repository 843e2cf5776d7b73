"""GPU: both styles over windows of whole sequences (jagged.tiles.windows), forward and
backward, against the oracle: fresh random inputs, outputs poisoned by the oracle's
check. Short sequences with longer ones among them (a longer sequence's key blocks are
windows of their own and reduce-add dQ; the others' windows store it), empty and
one-row sequences, rows past the last sequence, GQA, causal, cross, fp16, D = 64 and
128."""
import sys
import torch
sys.path.insert(0, ".")
from harness.backends import KINDS
from harness.oracle import check
from harness.problems import Problem
import kernels_tlx.bwd_hopper as T

g = torch.Generator().manual_seed(0)
short = lambda n, hi: torch.randint(0, hi, (n,), generator=g).tolist()  # noqa: E731
cases = [  # (problem, (len_q, len_k))
    (Problem(300, 4, 128, 256, kv_heads=2, sparsity=0.1, seed=1), None),
    (Problem(300, 4, 64, 512, kv_heads=4, sparsity=0.1, causal=True, seed=2), None),
    (Problem(200, 8, 128, 128, kv_heads=2, sparsity=0.25, dtype="fp16", seed=3), None),
    (Problem(80, 4, 128, 700, kv_heads=2, causal=True, seed=4),
     ([0, 1, 700, 0, 129, 128, 127, 1] + short(72, 40),) * 2),
    (Problem(80, 2, 64, 300, seed=5), ([300, 0, 0, 2, 255, 256, 257] + short(73, 30),) * 2),
    (Problem(60, 4, 64, 40, max_seqlen_k=400, mode="cross", causal=True, seed=6),
     (short(60, 40), [400, 3, 0, 140] + short(56, 50))),
    (Problem(60, 2, 128, 150, max_seqlen_k=20, mode="cross", dtype="fp16", seed=7),
     ([150] + short(59, 60), short(60, 20))),
]
bad = 0
for style in sys.argv[1].split(","):
    fn = KINDS["jagged"][style].fn()
    for p, lens in cases:
        if lens is None:
            inp = p.build("cuda")
        else:
            inp = p.build("cuda", lengths=tuple(torch.tensor(x) for x in lens))
        assert T.takes_windows(inp.k.shape[0], p.batch, inp.max_seqlen_k, False), p.label()
        r = check(inp, fn, causal=p.causal)
        bad += not r.ok
        print(style, p.label(), "OK" if r.ok else "BAD\n" + str(r), flush=True)
print("GATE_WINDOWS", "PASS" if bad == 0 else f"FAIL {bad}")
