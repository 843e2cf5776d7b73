"""One small problem of each mode, forward and backward, for compute-sanitizer.

    compute-sanitizer --tool memcheck  python3 -m harness.gpu.sanitize --impl tlx
    compute-sanitizer --tool racecheck python3 -m harness.gpu.sanitize --impl tlx

Each runs through `jagged.jagged_attention(..., backend=...)`, the default call path.
Small on purpose (the sanitizers slow kernels down by orders of magnitude), but each
has several query blocks and KV tiles, a zero-length and a length-1 sequence, so the
tile loops, the masked tails and the dQ reduction all run. Every result also goes
through the oracle, so a clean sanitizer log is never reported for a wrong answer.
Exit status 1 when any problem fails the oracle.
"""
from __future__ import annotations

import argparse
import functools
import sys

from ..oracle import check
from ..problems import Problem

IMPLS = {"tlx": "tlx", "cute": "cute", "triton": "portable"}  # harness name -> jagged backend


def problems() -> list[tuple[str, Problem, tuple]]:
    """(mode name, problem, (len_q, len_k)); fp16, since the CPU interpreter (the CPU
    test's path) computes bf16 dots wrongly."""
    lens = [0, 1, 150, 70]
    cases = [
        ("self", dict(heads=2, head_dim=128, max_seqlen_q=150), (lens, lens)),
        ("causal GQA", dict(heads=4, kv_heads=2, head_dim=64, max_seqlen_q=150, causal=True),
         (lens, lens)),
        ("cross", dict(heads=2, head_dim=128, max_seqlen_q=150, max_seqlen_k=200, mode="cross"),
         ([150, 1, 0, 60], [200, 3, 7, 0])),
        ("cross causal MQA", dict(heads=4, kv_heads=1, head_dim=64, max_seqlen_q=150,
                                  max_seqlen_k=140, mode="cross", causal=True),
         ([150, 5, 0, 70], [20, 140, 3, 0])),
        ("broadcast-Q", dict(heads=2, head_dim=128, max_seqlen_q=80, max_seqlen_k=200,
                             mode="broadcast_q"), ([80] * 4, [200, 0, 1, 130])),
        ("broadcast-Q causal", dict(heads=2, kv_heads=1, head_dim=64, max_seqlen_q=33,
                                    max_seqlen_k=200, mode="broadcast_q", causal=True),
         ([33] * 4, [0, 1, 200, 17])),
    ]
    return [(name, Problem(batch=4, dtype="fp16", seed=i + 1, **kw), lens)
            for i, (name, kw, lens) in enumerate(cases)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.gpu.sanitize")
    ap.add_argument("--impl", choices=sorted(IMPLS), default="tlx")
    ap.add_argument("--only", default="", help="run the modes whose name contains this "
                    "(a|b: either)")
    ap.add_argument("--device", default="cuda", help="cpu: the portable kernel in the interpreter")
    a = ap.parse_args(argv)
    import jagged
    ok, why = jagged.available()[IMPLS[a.impl]]
    if not ok:
        sys.exit(f"{a.impl} unavailable: {why}")
    fn = functools.partial(jagged.jagged_attention, backend=IMPLS[a.impl])
    bad = 0
    for name, p, (lq, lk) in problems():
        if not any(o in name for o in a.only.split("|")):
            continue
        inp = p.build(a.device, lengths=(lq, lk))
        rep = check(inp, fn, causal=p.causal, broadcast_q=p.mode == "broadcast_q")
        bad += not rep.ok
        print(f"{'PASS' if rep.ok else 'FAIL'} {a.impl} {name}: {p.label()} q={lq} k={lk}", flush=True)
        if not rep.ok:
            print(rep)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
