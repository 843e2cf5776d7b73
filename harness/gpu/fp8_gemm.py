"""The fp8 GEMM ceiling: e4m3 x e4m3 -> bf16 through `torch._scaled_mm` (cuBLASLt),
measured as `harness.gpu.clocks` measures the bf16 one (back to back for `seconds`,
the clock sampled), a row of backend `gemm-fp8`. The fp8 prefill forward's S = Q K^T
runs at this rate; P V stays 16-bit.

    python -m harness clocks --gemm      (the bf16 row, then this one)

Operands as cuBLASLt's fp8 GEMM takes them: A row-major, B column-major (the transpose
of a row-major matrix), scales fp32 scalars, out bf16.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .clocks import GEMM_N, Sampler, append_rows, line, sustained

FP8 = torch.float8_e4m3fn
GEMM8_PROBLEM = f"e4m3 {GEMM_N}^3 matmul (torch._scaled_mm, bf16 out)"


def operands(n: int, device) -> tuple:
    """(a [n, n] row-major, b [n, n] column-major, scale_a, scale_b): e4m3 values of
    N(0, 1) draws, unit scales."""
    a = torch.randn(n, n, device=device).to(FP8)
    b = torch.randn(n, n, device=device).to(FP8).t()
    one = torch.ones((), device=device, dtype=torch.float32)
    return a, b, one, one.clone()


def matmul(a, b, scale_a, scale_b) -> torch.Tensor:
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)


def gemm_fp8(seconds: float, sampler: Sampler, n: int = GEMM_N) -> dict | str:
    """Sustained TFLOP/s of the n^3 e4m3 matmul (2 n^3 flops a call), after a warm-up."""
    args = operands(n, "cuda")
    for _ in range(10):
        matmul(*args)
    return sustained(lambda: matmul(*args), 2.0 * n ** 3, seconds, sampler)


def run(seconds: float = 4.0, out=None) -> list[str]:
    """The row, printed; `out`: also appended to out/clocks.csv."""
    from ..bench import git_rev
    sampler = Sampler()
    try:
        m = gemm_fp8(seconds, sampler)
    except Exception as e:  # an fp8 GEMM this torch / GPU refuses: say so, in the row's place
        m = f"not run: {type(e).__name__}: {str(e)[:120]}"
    finally:
        sampler.close()
    text = line("gemm-fp8", GEMM8_PROBLEM, m)
    print(text, flush=True)
    if out and isinstance(m, dict):
        append_rows(Path(out) / "clocks.csv", [dict(backend="gemm-fp8", problem=GEMM8_PROBLEM,
                                                    variant="", git_rev=git_rev(), **m,
                                                    **{"pass": "fwd"})])
    return [text]
