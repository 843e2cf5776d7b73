"""Where one kernel's warps stall, by code region: reads the SASS source page of an ncu
report (per-instruction warp-state samples) and prints one line per run of instructions
with the same execution count (a loop body, a per-tile prologue, the store, ...), with
its share of all samples, its top stall reasons and the instructions that name it.

On the GPU node, one backend's main kernel per problem (KERNELS names them), profiled
under `harness profile` (the gate first) and summed up in one go:

    python -m harness.gpu.ncu_sass run --backends tlx,cute,fa4 --passes bwd \
        --suite fuzz --match "B2 H8/2 D64 Lq16384" --out DIR

prints each report's headline metrics (duration, clocks, throughput, issue rate), its
regions and its hottest instructions, and leaves `DIR/<backend>_<pass>.ncu-rep` and its SASS page beside it. A page
read elsewhere:  python -m harness.gpu.ncu_sass rep_sass.csv [--min 0.4]
A step loop in cycles an iteration, split by stall reason (step loops of different
rows, across kernels):  python -m harness.gpu.ncu_sass steps rep_sass.csv rep_details.csv
--start <region start> --warps <warps of a CTA running it>

Samples are per warp, so compare kernels by the stall mix and by samples per issued
instruction ("selected") within a region, not by raw counts: a kernel with more
producer warps spreads the same time over more warps.
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
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


SAMPLES = "Warp Stall Sampling (All Samples)"


def page(path: str):
    """(rows, column index, stall columns, count(row, column)) of a SASS page."""
    hdr, data = read(path)
    col = {c: i for i, c in enumerate(hdr)}
    stalls = [c for c in hdr if c.startswith("stall_") and "Not Issued" not in c]
    return data, col, stalls, lambda r, c: int(r[col[c]] or 0)


def regions(path: str, min_pct: float = 0.4) -> list[str]:
    data, col, stalls, n = page(path)
    execs = col["Instructions Executed"]
    total = sum(n(r, SAMPLES) for r in data) or 1
    out = [f"{path}: {len(data)} instructions, {total} samples"]
    a = 0
    for b in range(1, len(data) + 1):
        if b < len(data) and data[b][execs] == data[a][execs]:
            continue
        share = 100 * sum(n(r, SAMPLES) for r in data[a:b]) / total
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


# the kernel a pass's time is spent in, by backend (ncu --kernel-name regex:...); an
# experiment `<style>-x` (harness.backends) runs its style's kernels (`kernel_of`)
KERNELS = {
    ("tlx", "fwd"): "^fwd_kernel$", ("tlx", "bwd"): "^bwd_kernel$",
    ("cute", "fwd"): "FwdHopper", ("cute", "bwd"): "BwdMain",
    ("fa4", "fwd"): "ForwardSm90", ("fa4", "bwd"): "BackwardSm90",
}
# ncu's details page: the metrics a headline shows, by name
HEADLINE = ("Duration", "Elapsed Cycles", "SM Frequency", "Compute (SM) Throughput",
            "Memory Throughput", "DRAM Throughput", "L2 Hit Rate", "Registers Per Thread",
            "Dynamic Shared Memory Per Block", "Issue Slots Busy",
            "Executed Ipc Active", "Warp Cycles Per Issued Instruction",
            "Achieved Active Warps Per SM")
SKIP = 3  # matching launches left out first: the gate's and the warm-up's


def hottest(path: str, n: int = 12) -> list[str]:
    """The n instructions of an ncu SASS page with the most warp-state samples, in address
    order: index, samples, the top three stall reasons, the instruction (which wait a
    region's stalls sit on: a barrier's first user, an FFMA on a load's result)."""
    data, col, stalls, n_of = page(path)
    top = sorted(range(len(data)), key=lambda i: -n_of(data[i], SAMPLES))[:n]
    out = []
    for i in sorted(top):
        r = data[i]
        why = Counter({s[6:]: n_of(r, s) for s in stalls})
        mix = ", ".join(f"{k} {v}" for k, v in why.most_common(3) if v)
        out.append(f"{i:5d} {n_of(r, SAMPLES):8d}  {mix:42s} | {' '.join(r[1].split())}")
    return out


def kernel_of(backend: str, pass_: str) -> str:
    """The KERNELS regex of a backend's pass; an experiment's (`<style>-x`) is its
    style's."""
    style = backend[:-2] if backend.endswith("-x") else backend
    return KERNELS[style, pass_]


def ncu_command(backend: str, pass_: str, suite: str, match: str, rep: str,
                ncu: str = "ncu") -> list[str]:
    """ncu over `harness profile` of one backend and pass: the pass's kernel (KERNELS),
    its SKIP-th matching launch, warp states and per-instruction samples, the memory
    workload (L2 hit rate: a tile order's reuse), clocks as the GPU runs them (not locked
    to base)."""
    return [ncu, "--clock-control", "none", "--kernel-name", f"regex:{kernel_of(backend, pass_)}",
            "--launch-skip", str(SKIP), "--launch-count", "1", "--section", "SpeedOfLight",
            "--section", "WarpStateStats", "--section", "SourceCounters",
            "--section", "LaunchStats", "--section", "Occupancy",
            "--section", "MemoryWorkloadAnalysis", "-f", "-o", rep,
            sys.executable, "-m", "harness", "profile", "--backends", backend,
            "--passes", pass_, "--suite", suite, "--match", match, "--n", "3"]


def details(details_csv: str) -> dict[str, tuple[str, str]]:
    """An ncu details page (`--page details --csv`) as {metric name: (value, unit)}, each
    name's first row. Metric rows may stop before the header's rule columns (ncu fills
    those on rule rows only)."""
    rows = list(csv.reader(open(details_csv)))
    hdr = next(r for r in rows if "Metric Name" in r)
    col = {c: i for i, c in enumerate(hdr)}
    need = max(col["Metric Name"], col["Metric Unit"], col["Metric Value"]) + 1
    got = {}
    for r in rows[rows.index(hdr) + 1:]:
        if len(r) >= need:
            got.setdefault(r[col["Metric Name"]],
                           (r[col["Metric Value"]], r[col["Metric Unit"]]))
    return got


def headline(details_csv: str) -> list[str]:
    """The HEADLINE metrics of a details page, one line each: "name value unit"."""
    got = details(details_csv)
    return [f"{k}: {got[k][0]} {got[k][1]}".strip() for k in HEADLINE if k in got]


def number(page: dict, name: str) -> float:
    """A metric of a `details` page as a number ("32,254,240" -> 32254240.0)."""
    return float(page[name][0].replace(",", ""))


def per_iteration(sass_csv: str, details_csv: str, start: int, warps: int) -> list[str]:
    """Cycles an iteration of the region starting at instruction `start` (a run of equal
    execution count, as `regions` prints it), a loop that `warps` warps of each CTA run and
    in which they spend the kernel's elapsed cycles (a step loop): iterations a warp slot =
    executions / (resident CTAs x warps), the resident CTAs the SMs x the occupancy's
    CTAs an SM (at most the grid), and the region's stall mix, its share of the samples,
    scaled to those cycles. Sampling intervals differ between reports, cycles do not: this
    compares step loops of different rows across kernels."""
    data, col, stalls, n = page(sass_csv)
    execs = col["Instructions Executed"]
    end = start + 1
    while end < len(data) and data[end][execs] == data[start][execs]:
        end += 1
    got = details(details_csv)
    per_sm = min(number(got, f"Block Limit {k}")
                 for k in ("Registers", "Shared Mem", "Warps", "SM"))
    ctas = min(number(got, "Grid Size"), number(got, "# SMs") * per_sm)
    iters = int(data[start][execs].replace(",", "")) / (ctas * warps)
    cycles = number(got, "Elapsed Cycles") / iters
    why = Counter({s[6:]: sum(n(r, s) for r in data[start:end]) for s in stalls})
    total = sum(n(r, SAMPLES) for r in data[start:end]) or 1
    mix = ", ".join(f"{k} {cycles * v / total:.0f}" for k, v in why.most_common(8) if v)
    return [f"[{start},{end}) {end - start} instr, {iters:.0f} iterations a warp slot, "
            f"{cycles:.0f} cycles an iteration: {mix}"]


def run(backends, passes, suite: str, match: str, out: str, min_pct: float) -> None:
    os.makedirs(out, exist_ok=True)
    for b in backends:
        for ps in passes:
            rep = os.path.join(out, f"{b}_{ps}")
            print(f"== {b} {ps}: {suite} {match!r}", flush=True)
            res = subprocess.run(ncu_command(b, ps, suite, match, rep), capture_output=True,
                                 text=True)
            if res.returncode != 0 or not os.path.exists(rep + ".ncu-rep"):
                print(f"ncu failed ({res.returncode}):\n{(res.stdout + res.stderr)[-3000:]}")
                continue
            pages = {"details": rep + "_details.csv", "source": rep + "_sass.csv"}
            for page, path in pages.items():
                extra = ["--print-source", "sass"] if page == "source" else []
                with open(path, "w") as f:
                    subprocess.run(["ncu", "-i", rep + ".ncu-rep", "--page", page, "--csv",
                                    *extra], stdout=f, check=True)
            print("\n".join(headline(pages["details"])))
            print("\n".join(regions(pages["source"], min_pct)))
            print("\n".join(hottest(pages["source"])) + "\n", flush=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:
        ap = argparse.ArgumentParser(prog="python -m harness.gpu.ncu_sass run")
        ap.add_argument("--backends", default="tlx,cute,fa4")
        ap.add_argument("--passes", default="fwd")
        ap.add_argument("--suite", required=True)
        ap.add_argument("--match", required=True, help="one problem's label (or part of it)")
        ap.add_argument("--out", default="ncu")
        ap.add_argument("--min", type=float, default=0.4)
        a = ap.parse_args(argv[1:])
        run(a.backends.split(","), a.passes.split(","), a.suite, a.match, a.out, a.min)
        return
    if argv[:1] == ["steps"]:
        ap = argparse.ArgumentParser(prog="python -m harness.gpu.ncu_sass steps")
        ap.add_argument("sass", help="a report's SASS page (<rep>_sass.csv)")
        ap.add_argument("details", help="its details page (<rep>_details.csv)")
        ap.add_argument("--start", type=int, required=True,
                        help="the loop's first instruction (a region's start, as printed)")
        ap.add_argument("--warps", type=int, required=True,
                        help="warps of a CTA that run that code (a TLX consumer copy: 4)")
        a = ap.parse_args(argv[1:])
        print("\n".join(per_iteration(a.sass, a.details, a.start, a.warps)))
        return
    ap = argparse.ArgumentParser(prog="python -m harness.gpu.ncu_sass")
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--min", type=float, default=0.4, help="smallest region shown (%% of samples)")
    a = ap.parse_args(argv)
    for p in a.csv:
        print("\n".join(regions(p, a.min)))
        print("\n".join(hottest(p)) + "\n")


if __name__ == "__main__":
    main()
