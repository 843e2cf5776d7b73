"""The list kernels alone (jagged.tiles._build_kv_tiles / _build_fwd_tiles /
_build_window_tiles), run in a tree (PYTHONPATH at it): each list checked against its
reference on the GPU (the windows' against windows_reference), then timed replayed from
a CUDA graph of 20 builds (us a build)."""
import torch
import triton.testing

import jagged.tiles as T
from harness.problems import offsets

torch.manual_seed(0)
dev = "cuda"


def lens(b, mx, frac):  # lengths in [frac * mx, mx]
    return torch.randint(int(frac * mx), mx + 1, (b,))


CASES = [  # (name, B, max_q or L_q, max_k, broadcast-Q, causal)
    ("bq B13 512 / 16384 bwd", 13, 512, 16384, True, False),
    ("llm B8 8192 causal bwd", 8, 8192, 8192, False, True),
    ("fuzz B3 16384 causal fwd", 3, 16384, 16384, False, True),
    ("gem B1152 1024 bwd", 1152, 1024, 1024, False, False),
    ("win B64 8192 / 0.98 fwd", 64, 8192, 8192, False, False),   # windows: long max, short mean
    ("win B300 256 / 0.9 fwd", 300, 256, 256, False, False),
]
print(torch.cuda.get_device_name(), flush=True)
for name, B, mq, mk, bq, causal in CASES:
    lk = lens(B, mk, 0.25)
    lq = torch.full((B,), mq) if bq else (lk if "llm" in name or "fuzz" in name else lens(B, mq, 0.1))
    cu_k = offsets(lk).to(dev)
    cu_q = None if bq else offsets(lq).to(dev)
    if name.startswith("win"):
        lq = torch.randint(1, 40, (B,))
        lq[::17] = mq                      # a few sequences of max_q rows
        cu_q = offsets(lq).to(dev)
        n_rows = int(lq.sum())
        args = (cu_q, cu_q, n_rows, mq, 128, 128, None)
        build = lambda: T._build_window_tiles(*args)
        got = build()
        ok = torch.equal(got[2].cpu(), T.windows_reference(cu_q.cpu(), n_rows, 128))
    elif name.endswith("bwd"):
        args = (cu_q, cu_k, mq if bq else 0, mk, causal, 64, 128)
        build = lambda: T._build_kv_tiles(*args)
        got, want = build(), T.kv_tiles_reference(*args)
        ok = int(got[2]) == int(want[2]) and all(torch.equal(a, b) for a, b in zip(got[:2], want[:2]))
    else:
        args = (cu_q, cu_k, B, mq, None, 128, 128, causal)
        build = lambda: T._build_fwd_tiles(*args, None)
        got, want = build(), T.longest_first_tiles(*args)
        ok = int(got[1]) == int(want[1]) and torch.equal(got[0] & 0xFFFFFFFF, want[0].long())
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        build()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(20):
            build()
    ms = triton.testing.do_bench(g.replay, warmup=20, rep=200, return_mode="median")
    print(f"{name:28s} list {'ok' if ok else 'WRONG'}  {1000 * ms / 20:7.2f} us a build", flush=True)
