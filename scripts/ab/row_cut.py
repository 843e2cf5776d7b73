"""GPU: the causal row cut for longer sequences' key blocks over key windows (branch
window-row-cut) in whichever tree it runs (its argument: a label). Mixes of 300 short
sequences (1-39 tokens) with one longer one (512, 2048, 4096), causal, GQA 8/2, D = 64
and 128: each style's backward against the oracle (outputs poisoned by it), then the
backward replayed from a CUDA graph (harness.bench.graph_time_ms, the default call)."""
import sys
import torch
sys.path.insert(0, ".")
from harness.backends import KINDS
from harness.bench import graph_time_ms
from harness.oracle import check
from harness.problems import Problem

label = sys.argv[1] if len(sys.argv) > 1 else ""
bad = 0
for style in ("tlx", "cute"):
    fn = KINDS["jagged"][style].fn()
    for D in (128, 64):
        for long in (512, 2048, 4096):
            g = torch.Generator().manual_seed(long + D)
            lens = torch.randint(1, 40, (300,), generator=g)
            lens[7] = long
            p = Problem(300, 8, D, long, kv_heads=2, causal=True, seed=long)
            inp = p.build("cuda", lengths=(lens, lens))
            r = check(inp, fn, causal=True)
            bad += not r.ok
            q, k, v = (t.detach().requires_grad_() for t in (inp.q, inp.k, inp.v))
            out = fn(q, k, v, inp.cu_seqlens_q, inp.cu_seqlens_k, inp.max_seqlen_q,
                     inp.max_seqlen_k, causal=True)
            dout = torch.randn_like(out)
            ms = graph_time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout,
                                                           retain_graph=True), False)
            print(f"ROW_CUT {label} {style} D{D} long {long}: {'OK' if r.ok else 'BAD'} "
                  f"bwd replayed {ms:.4f} ms", flush=True)
print("ROW_CUT", label, "PASS" if bad == 0 else f"FAIL {bad}")
