"""One small problem of each mode, forward and backward, for compute-sanitizer.

    compute-sanitizer --tool memcheck  python3 -m harness.sanitize --impl tlx
    compute-sanitizer --tool racecheck python3 -m harness.sanitize --impl tlx

Small on purpose (the sanitizers slow kernels down by orders of magnitude), but each
has several query blocks and KV tiles, a zero-length and a length-1 sequence, so the
tile loops, the masked tails and the dQ reduction all run. Every result also goes
through the oracle, so a clean sanitizer log is never reported for a wrong answer.
Exit status 1 when any problem fails the oracle.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .oracle import check
from .problems import Problem

IMPLS = {"tlx": "kernels_tlx", "cute": "kernels_cute", "triton": "kernels_tlx.portable"}
L = (lambda *x: list(x))


def problems() -> list[tuple[str, Problem, tuple]]:
    """(mode name, problem, (len_q, len_k)); fp16, since the CPU interpreter (the CPU
    test's path) computes bf16 dots wrongly."""
    P = lambda **kw: Problem(batch=4, dtype="fp16", **kw)  # noqa: E731
    lens = L(0, 1, 150, 70)
    return [
        ("self", P(heads=2, head_dim=128, max_seqlen_q=150, seed=1), (lens, lens)),
        ("causal GQA", P(heads=4, kv_heads=2, head_dim=64, max_seqlen_q=150, causal=True, seed=2),
         (lens, lens)),
        ("cross", P(heads=2, head_dim=128, max_seqlen_q=150, max_seqlen_k=200, mode="cross",
                    seed=3), (L(150, 1, 0, 60), L(200, 3, 7, 0))),
        ("cross causal MQA", P(heads=4, kv_heads=1, head_dim=64, max_seqlen_q=150, max_seqlen_k=140,
                               mode="cross", causal=True, seed=4), (L(150, 5, 0, 70), L(20, 140, 3, 0))),
        ("broadcast-Q", P(heads=2, head_dim=128, max_seqlen_q=80, max_seqlen_k=200,
                          mode="broadcast_q", seed=5), (L(80, 80, 80, 80), L(200, 0, 1, 130))),
        ("broadcast-Q causal", P(heads=2, kv_heads=1, head_dim=64, max_seqlen_q=33, max_seqlen_k=200,
                                 mode="broadcast_q", causal=True, seed=6),
         (L(33, 33, 33, 33), L(0, 1, 200, 17))),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.sanitize")
    ap.add_argument("--impl", choices=sorted(IMPLS), default="tlx")
    ap.add_argument("--only", default="", help="run the modes whose name contains this")
    ap.add_argument("--device", default="cuda", help="cpu: the portable kernel in the interpreter")
    a = ap.parse_args(argv)
    mod = importlib.import_module(IMPLS[a.impl])
    if callable(getattr(mod, "available", None)):
        ok, why = mod.available()
        if not ok:
            sys.exit(f"{a.impl} unavailable: {why}")
    bad = 0
    for name, p, (lq, lk) in problems():
        if a.only not in name:
            continue
        inp = p.build(a.device, lengths=(lq, lk))
        rep = check(inp, mod.jagged_attention, causal=p.causal, broadcast_q=p.mode == "broadcast_q")
        bad += not rep.ok
        print(f"{'PASS' if rep.ok else 'FAIL'} {a.impl} {name}: {p.label()} q={lq} k={lk}", flush=True)
        if not rep.ok:
            print(rep)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
