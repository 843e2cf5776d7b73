"""The forward's dense baseline: the uTLX Hopper ping-pong persistent tutorial kernel and
ours on the same dense problem (bf16, D = 128, non-causal), timed in one process.

    python -m harness.gpu.tlx_tutorial [--batch 8 --heads 16 --seqlen 8192]

The tutorial takes [B, H, N, D] (each head's rows contiguous); ours takes the packed
[B * N, H, D] of the jagged API, and also runs on the tutorial's layout as B * H
sequences of one head, which separates the layout from the kernel. Every output is
checked against the tutorial's before the times are printed.
"""
from __future__ import annotations

import argparse

import torch
import triton


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seqlen", type=int, default=8192)
    a = ap.parse_args(argv)
    from tlx.tutorials.hopper_fa_ws_pipelined_pingpong_persistent import attention as tutorial
    from kernels_tlx import jagged_attention
    B, H, N, D = a.batch, a.heads, a.seqlen, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    scale = D ** -0.5
    packed = [t.transpose(1, 2).reshape(B * N, H, D).contiguous() for t in (q, k, v)]
    cu = torch.arange(0, (B + 1) * N, N, device="cuda", dtype=torch.int32)

    # ours on the tutorial's own layout: each (b, h) is a sequence of one head
    flat = [t.reshape(B * H * N, 1, D) for t in (q, k, v)]
    cu_flat = torch.arange(0, (B * H + 1) * N, N, device="cuda", dtype=torch.int32)
    variants = {
        "tutorial": lambda: tutorial(q, k, v, scale),
        "ours [B*N,H,D]": lambda: jagged_attention(*packed, cu, cu, N, N, softmax_scale=scale),
        "ours [B*H*N,1,D]": lambda: jagged_attention(*flat, cu_flat, cu_flat, N, N,
                                                     softmax_scale=scale),
    }
    ref = tutorial(q, k, v, scale)
    for name, fn in list(variants.items())[1:]:
        got = fn().reshape(ref.shape) if "*H*" in name else fn().reshape(B, N, H, D).transpose(1, 2)
        err = (got.float() - ref.float()).abs().max().item()
        assert err < 2e-2, f"{name} and the tutorial differ by {err}"
    flops = 4 * B * H * N * N * D
    # twice round, so a clock that drifts during the run shows as a change between rounds
    for rnd in range(2):
        for name, fn in variants.items():
            ms = triton.testing.do_bench(fn, warmup=100, rep=500)
            print(f"round {rnd} {name:17s} B{B} H{H} N{N} D{D} bf16 fwd: {ms:.3f} ms  "
                  f"{flops / ms / 1e9:.1f} TFLOP/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
