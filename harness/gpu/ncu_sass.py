"""Where one kernel's warps stall, by code region: reads the SASS source page of an ncu
report (per-instruction warp-state samples) and prints one line per run of instructions
with the same execution count (a loop body, a per-tile prologue, the store, ...), with
its share of all samples, its top stall reasons and the instructions that name it.

On the GPU node:

    ncu --clock-control none --kernel-name regex:'^fwd_kernel$' --launch-skip 12 \\
        --launch-count 1 --section WarpStateStats --section SourceCounters -o rep \\
        python -m harness profile --backends tlx --passes fwd --match "Lq1024 Lk1024 s0.5"
    ncu -i rep.ncu-rep --page source --csv --print-source sass > rep_sass.csv

then anywhere:  python -m harness.gpu.ncu_sass rep_sass.csv [--min 0.4]

Samples are per warp, so compare kernels by the stall mix and by samples per issued
instruction ("selected") within a region, not by raw counts: a kernel with more
producer warps spreads the same time over more warps.
"""
from __future__ import annotations

import argparse
import csv
from collections import Counter

NAMING = ("HGMMA", "MUFU", "BAR.", "SYNCS", "WARPGROUP", "UTMA", "LDG", "STG", "STS", "LDS",
          "STSM")


def opcode(sass: str) -> str:
    """The opcode of one SASS line ("@!P0 BRA 0x..." -> "BRA")."""
    parts = sass.split()
    return parts[1] if parts and parts[0].startswith("@") else (parts[0] if parts else "")


def read(path: str) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(open(path)))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return rows[start], rows[start + 1:]


def regions(path: str, min_pct: float = 0.4) -> list[str]:
    hdr, data = read(path)
    col = {c: i for i, c in enumerate(hdr)}
    samples = "Warp Stall Sampling (All Samples)"
    execs = col["Instructions Executed"]
    stalls = [c for c in hdr if c.startswith("stall_") and "Not Issued" not in c]
    n = lambda r, c: int(r[col[c]] or 0)
    total = sum(n(r, samples) for r in data) or 1
    out = [f"{path}: {len(data)} instructions, {total} samples"]
    a = 0
    for b in range(1, len(data) + 1):
        if b < len(data) and data[b][execs] == data[a][execs]:
            continue
        share = 100 * sum(n(r, samples) for r in data[a:b]) / total
        if share >= min_pct:
            why = Counter({s[6:]: sum(n(r, s) for r in data[a:b]) for s in stalls})
            sel = why["selected"] or 1
            ops = Counter(opcode(r[1]) for r in data[a:b])
            named = {k: v for k, v in ops.items() if k.startswith(NAMING)}
            mix = ", ".join(f"{k} {v / sel:.2f}" for k, v in why.most_common(5))
            out.append(f"[{a:5d},{b:5d}) {b - a:4d} instr  exec {data[a][execs]:>8s}  "
                       f"{share:5.1f} %  per issue: {mix}  | {dict(named)}")
        a = b
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m harness.gpu.ncu_sass")
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--min", type=float, default=0.4, help="smallest region shown (%% of samples)")
    a = ap.parse_args(argv)
    for p in a.csv:
        print("\n".join(regions(p, a.min)) + "\n")


if __name__ == "__main__":
    main()
