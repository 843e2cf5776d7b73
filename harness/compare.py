"""`python -m harness compare DIR [DIR ...]`: results folders side by side.

Per (pass, problem): each backend's ms, graph-replay ms and host ms in every folder, its
speed against FA4 in the same folder (eager / replayed: FA4's time over its own), and,
past the first folder, its change against the first folder's (negative: faster). An A/B
of two code trees is then a `bench --out DIR` per tree, FA4 in each run, and one
`compare`: the FA4 rows show how far the two runs' machines and clocks differ. Last, per
later folder and backend, the geometric mean of those changes over the problems both
folders timed (`summary`).
"""
from __future__ import annotations

import math
from pathlib import Path

from .bench import PROBLEM_KEY, read_rows


def _num(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def label(r: dict) -> str:
    """A row's pass and problem in a line."""
    lk = r.get("max_seqlen_k") or r["max_seqlen_q"]
    bits = [r["pass"], r["suite"], r["mode"], f"B{r['batch']}", f"H{r['heads']}/{r['kv_heads']}",
            f"D{r['head_dim']}", f"Lq{r['max_seqlen_q']}", f"Lk{lk}", f"s{r['sparsity']}",
            r["dtype"]]
    return " ".join(bits + (["causal"] if str(r["causal"]) == "True" else []))


def _ratio(a: float, b: float) -> str:
    return f"{a / b:5.2f}" if a == a and b == b and b > 0 else "    -"


def _change(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+6.1f} %" if new == new and old == old and old > 0 else \
        "      -"


def compare(dirs) -> list[str]:
    """The lines of the comparison of results folders `dirs` (the first is the base)."""
    names = [Path(d).name or str(d) for d in dirs]
    problems: dict = {}  # (pass, problem key) -> (label, {(folder, backend): row})
    for name, d in zip(names, dirs):
        for r in read_rows(Path(d) / "results.csv"):
            key = (r["pass"],) + tuple(str(r.get(c) or "") for c in PROBLEM_KEY)
            problems.setdefault(key, (label(r), {}))[1][(name, r["backend"])] = r
    w = max(map(len, names))
    out = []
    changes: dict = {}  # (folder, backend) -> [(eager, replayed) time ratios to the first]
    for text, cells in problems.values():
        out.append(text)
        for be in sorted({b for _, b in cells}, key=lambda b: (b == "fa4", b)):
            for name in names:
                r = cells.get((name, be))
                if r is None:
                    continue
                ms, g, host = _num(r["ms"]), _num(r.get("graph_ms")), _num(r["host_ms"])
                fa4 = cells.get((name, "fa4"))
                line = (f"  {be:6s} {name:{w}s} {r['status']:5s} ms {ms:8.4f}  graph {g:8.4f}"
                        f"  host {host:6.3f}")
                if fa4 is not None and be != "fa4" and r["status"] == "ok":
                    line += (f"  x FA4 {_ratio(_num(fa4['ms']), ms)} /"
                             f" {_ratio(_num(fa4.get('graph_ms')), g)}")
                base = cells.get((names[0], be))
                if name != names[0] and base is not None:
                    line += (f"  vs {names[0]}: {_change(ms, _num(base['ms']))} /"
                             f" {_change(g, _num(base.get('graph_ms')))}")
                    if r["status"] == base["status"] == "ok":
                        changes.setdefault((name, be), []).append(
                            (ms / _num(base["ms"]), g / _num(base.get("graph_ms"))))
                out.append(line)
    return out + summary(changes, names[0])


def _geomean(xs) -> float:
    xs = [x for x in xs if x == x and 0 < x < math.inf]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def summary(changes: dict, first: str) -> list[str]:
    """Per (later folder, backend): the geometric mean of its eager and replayed time
    against the first folder's, over the problems both timed."""
    if not changes:
        return []
    out = [f"summary: time against {first}, geometric mean over the problems (eager / "
           "replayed)"]
    for (name, be), rs in sorted(changes.items(), key=lambda kv: (kv[0][0], kv[0][1] == "fa4",
                                                                  kv[0][1])):
        e, g = _geomean([a for a, _ in rs]), _geomean([b for _, b in rs])
        out.append(f"  {be:6s} {name}: {_change(e, 1.0)} / {_change(g, 1.0)}  "
                   f"({len(rs)} problems)")
    return out
