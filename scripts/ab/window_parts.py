"""GPU (branch windows-next): key windows split over programs (jagged.tiles.window_parts)
in both styles: the oracle on fuzz shapes whose windows the rule splits (8 parts) and on
a mix of long and short sequences with 8 parts forced (windows not owned: dQ through the
accumulator); then each shape's backward replayed from a CUDA graph, the rule against
whole windows (window_parts forced to 1: main's path) and FA4, in this one process."""
import sys
import torch
sys.path.insert(0, ".")
from harness.backends import KINDS
from harness.bench import graph_time_ms
from harness.oracle import check
from harness.problems import Problem, fuzz_problems
import kernels_tlx.bwd_hopper as T
import kernels_cute.bwd_hopper as C

real = {m: m.window_parts for m in (T, C)}


def force(P):
    for m in (T, C):
        m.window_parts = real[m] if P is None else (lambda *a, P=P: P)


def bwd_ms(fn, inp, causal):
    q, k, v = (t.detach().requires_grad_() for t in (inp.q, inp.k, inp.v))
    out = fn(q, k, v, inp.cu_seqlens_q, inp.cu_seqlens_k, inp.max_seqlen_q, inp.max_seqlen_k,
             causal=causal)
    out = out[0] if isinstance(out, tuple) else out
    dout = torch.randn_like(out)
    return graph_time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
                         False)


bad = 0
shapes = [(15, "self B8 H8/1 D128"), (8, "cross B44 H8/1")]
for seed, match in shapes:
    p = next(x for x in fuzz_problems(40, seed) if match in x.label())
    inp = p.build("cuda")
    for style in ("tlx", "cute"):
        fn = KINDS["jagged"][style].fn()
        force(None)
        r = check(inp, fn, causal=p.causal)
        bad += not r.ok
        print("GATE", style, p.label(), "rule", "OK" if r.ok else "BAD\n" + str(r), flush=True)
        if seed == 15:  # a mix with longer sequences, the same build
            force(8)
            lens = torch.tensor([300, 5, 0, 1, 140, 3, 7, 0, 250, 2] + [9] * 10)
            mix = Problem(20, 8, 128, 300, kv_heads=1, causal=True, dtype="fp16", seed=4)
            r = check(mix.build("cuda", lengths=(lens, lens)), fn, causal=True)
            bad += not r.ok
            print("GATE", style, mix.label(), "parts 8", "OK" if r.ok else "BAD\n" + str(r),
                  flush=True)
        force(None)
        new = bwd_ms(fn, inp, p.causal)
        force(1)
        old = bwd_ms(fn, inp, p.causal)
        force(None)
        print(f"WPARTS {style} {p.label()}: whole {old} ms -> split {new} ms", flush=True)
    fa = bwd_ms(KINDS["jagged"]["fa4"].fn(), inp, p.causal)
    print(f"WPARTS fa4 {p.label()}: {fa} ms", flush=True)
print("GATE_WPARTS", "PASS" if bad == 0 else f"FAIL {bad}")
