"""GPU: the window list kernel alone (jagged.tiles._build_window_tiles, as a replayed call
rebuilds it; the offsets check included), CUDA-event timed over gem-jagged 256 / 0.1 and
512 / 0.1's offsets, both passes' lists (rows: 128-row windows over cu_q; keys: 128-key
windows over cu_k), eager (launch included) and replayed from a CUDA graph of 50 calls
(the kernel's own time); GRAPH_GROUPS: the windows alone (_build_windows, no order).
Runs in either tree (its argument: a label for the lines)."""
import sys
import torch
sys.path.insert(0, ".")
from harness.problems import Problem
import jagged.tiles as tiles
from jagged.tiles import _build_window_tiles


def replayed(fn, n=50):
    """us a call, replayed from a CUDA graph of n calls."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(5):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / (5 * n) * 1000


label = sys.argv[1] if len(sys.argv) > 1 else ""
for n in (256, 512):
    p = Problem(1152, 4, 128, n, sparsity=0.1)
    inp = p.build("cuda")
    cu_q, cu_k = inp.cu_seqlens_q, inp.cu_seqlens_k
    nq, nk = inp.q.shape[0], inp.k.shape[0]
    for name, args in (("fwd", (cu_q, cu_k, nq, n, 128, 64, (nq, nk, n, n))),
                       ("bwd", (cu_k, cu_q, nk, n, 128, 32, None))):
        for _ in range(20):
            _build_window_tiles(*args)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(200):
            _build_window_tiles(*args)
        b.record()
        torch.cuda.synchronize()
        print(f"WINDOW_LIST {label} {n} / 0.1 {name}: {a.elapsed_time(b) / 200 * 1000:.1f} us "
              f"a call (launch included), replayed {replayed(lambda: _build_window_tiles(*args)):.2f}"
              f" us", flush=True)
        if hasattr(tiles, "_build_windows") and name == "fwd":
            t = replayed(lambda: tiles._build_windows(cu_q, cu_q, nq, n, 128))
            print(f"GRAPH_GROUPS {label} {n} / 0.1: {t:.2f} us replayed", flush=True)
