"""reports/<gpu>/report.md from results.csv: environment, per-suite tables
(TFLOP/s per backend, speedup over FA4), charts, and what did not run and why."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import backends
from .plots import COPY_TBPS, backends_in, latest_clocks, load, ok, plot_all, speedup

SUITE_ORDER = ["gem-jagged", "gem-jagged-d64", "gem-cross", "gem-broadcast-q", "llm-dense",
               "smoke"]
HOST_BOUND = 0.8  # host_ms / ms from which a row is listed as host-bound


def _shape(r) -> str:
    s = f"{r['mode']} B{r['batch']} H{r['heads']}/{r['kv_heads']} D{r['head_dim']} "
    s += f"L{r['max_seqlen_q']}" if r["mode"] == "self" else f"Lq{r['max_seqlen_q']} Lk{r['max_seqlen_k']}"
    s += f" s{r['sparsity']:g}" + (" causal" if r["causal"] else "")
    return s


def _table(df: pd.DataFrame, value: str, fmt: str) -> str:
    d = df.copy()
    d["shape"] = d.apply(_shape, axis=1)
    d["pass_order"] = d["pass"].map({"fwd": 0, "bwd": 1})
    d = d.sort_values(["pass_order", "causal", "head_dim", "max_seqlen_k", "sparsity", "max_seqlen_q"])
    t = d.pivot_table(index=["pass", "shape"], columns="backend", values=value, aggfunc="first",
                      sort=False)
    cols = [c for c in backends_in(d) if c in t.columns]
    out = ["| pass | shape | " + " | ".join(cols) + " |", "|---|---|" + "---:|" * len(cols)]
    for (ps, shape), r in t.iterrows():
        cells = [fmt.format(r[c]) if pd.notna(r[c]) else "–" for c in cols]
        out.append(f"| {ps} | {shape} | " + " | ".join(cells) + " |")
    return "\n".join(out)


_PROBLEM = ["suite", "mode", "causal", "dtype", "batch", "heads", "kv_heads", "head_dim",
            "max_seqlen_q", "max_seqlen_k", "sparsity"]


def _missing(df: pd.DataFrame) -> pd.DataFrame:
    """(backend, problem, pass) combinations absent from the CSV, over the backends,
    problems and passes that appear in it."""
    prob = _PROBLEM
    if df.empty:
        return df
    grid = (df[prob].drop_duplicates()
            .merge(df[["backend"]].drop_duplicates(), how="cross")
            .merge(df[["pass"]].drop_duplicates(), how="cross"))
    have = df[prob + ["backend", "pass"]].drop_duplicates()
    m = grid.merge(have, how="left", indicator=True)
    return m[m["_merge"] == "left_only"].drop(columns="_merge")


def _clocks_section(out_dir, pngs) -> list[str]:
    """`harness clocks` rows (clocks.csv), if any: sustained speed, clock and power."""
    d = latest_clocks(out_dir)
    if d.empty:
        return []
    md = ["## Sustained speed at the power cap", "",
          "`python -m harness clocks`: per backend, pass and problem the oracle gate, then 4 s "
          "of calls back to back while `nvidia-smi` samples the SM clock and power; the "
          "second half is reported. \"at 1980\" scales TFLOP/s to the boost clock (equal "
          "there: equal cycles); the latest row of each backend, pass and problem, with "
          "its revision. Backend `gemm` (`--gemm`) is the ceiling measured the same way: a "
          "plain bf16 matmul, drawn as the dashed line of the TFLOP/s charts.", "",
          "| pass | problem | backend | TFLOP/s | MHz | W | at 1980 | revision |",
          "|---|---|---|---:|---:|---:|---:|---|"]
    md += [f"| {r['pass']} | {r['problem']} | {r['backend']} | "
           f"{r['tflops']:.1f} | {r['mhz']:.0f} | {r['watts']:.0f} | {r['at_boost']:.1f} | "
           f"{r['git_rev']} |"
           for _, r in d.sort_values(["pass", "problem", "backend"], kind="stable").iterrows()]
    md += [""] + [f"![{p.stem}]({p.name})" for p in pngs if p.stem == "clocks"] + [""]
    return md


def write_report(out_dir, charts=True) -> Path:
    out_dir = Path(out_dir)
    df = load(out_dir / "results.csv")
    pngs = plot_all(out_dir) if charts else []
    good = ok(df)
    env = df.iloc[-1] if len(df) else None
    md = [f"# Jagged attention benchmark: {env['gpu'] if env is not None else '?'}", ""]
    if env is not None:
        clk = (f"SM clock {env.get('sm_clock_mhz', '')} MHz after timing (max "
               f"{env.get('sm_clock_max_mhz', '')}), memory {env.get('mem_clock_mhz', '')} MHz"
               if env.get("sm_clock_mhz") else "clocks not read")
        revs = ", ".join(sorted(set(df["git_rev"].astype(str))))
        ver = lambda c: ", ".join(sorted(set(df[c].astype(str)) - {""})) or "not installed"
        md += ["## Environment", "",
               f"- GPU: {env['gpu']} ({clk})",
               f"- torch {ver('torch')}; triton {ver('triton')}; flash-attn-4 "
               f"{ver('flash_attn_4')}; nvidia-cutlass-dsl {ver('cutlass_dsl')}",
               f"- project revision(s): {revs}",
               f"- rows: {len(df)} ({len(good)} timed), last at {df['timestamp'].max()}", ""]
    md += ["## Method", "",
           "- Every (backend, problem) is first checked by `harness.oracle.check` (fp32 "
           "reference, FlashAttention's 2x rule) on the same problem cut to its first "
           "sequences (`--gate-batch`, default 64); a wrong result is `fail` and is not "
           "timed. The full-size outputs are then checked to be finite.",
           "- Time: median of `triton.testing.do_bench` (warm-up, L2 flushed before each "
           "run). `fwd`: the call on inputs that need no grad. `bwd`: the backward alone, "
           "`torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)` after one forward.",
           "- TFLOP/s = 4·H·D·(unmasked score pairs) for fwd, 2.5x that for bwd, over the time.",
           f"- Host-bound: the host's time to issue one call (`host_ms`, mean of 10 issues "
           f"without a sync) is at least {HOST_BOUND:.0%} of the row's time, so the row "
           "times the host's work (Python, launches, autograd), not the kernels.",
           "- Each backend runs in its own worker process; a crash or a timeout is an "
           "`error` row and the sweep goes on.", "", "Backends:", ""]
    for name in backends_in(df):
        b = backends.REGISTRY.get(name)
        md.append(f"- `{name}`: {b.note if b and b.note else '(not in the registry)'}")
    md.append("")
    sp = speedup(df)
    for suite in sorted(set(df["suite"]), key=lambda s: (SUITE_ORDER + [s]).index(s)):
        g = good[good["suite"] == suite]
        md += [f"## {suite}", ""]
        if g.empty:
            md += ["Nothing timed in this suite (see below).", ""]
            continue
        md += ["TFLOP/s:", "", _table(g, "tflops", "{:.1f}"), ""]
        s = sp[(sp["suite"] == suite) & (sp["backend"] != "fa4")]
        if not s.empty:
            md += ["Speedup over FA4 (x):", "", _table(s, "speedup", "{:.2f}"), ""]
        host = g[g["host_ms"] >= HOST_BOUND * g["ms"]]
        if not host.empty:
            md += ["Host-bound rows:", "", "| backend | pass | shape | ms | host ms a call |",
                   "|---|---|---|---:|---:|"]
            md += [f"| {r['backend']} | {r['pass']} | {_shape(r)} | {r['ms']:.3f} | "
                   f"{r['host_ms']:.3f} |" for _, r in host.iterrows()]
            md.append("")
        short = g[(g["sparsity"] <= 0.1) & (g["mode"] != "broadcast_q")]
        if suite == "gem-jagged" and not short.empty:
            md += [f"Memory throughput at sparsity 0.1 (TB/s: the least bytes a call moves, "
                   f"`plots.io_bytes`, over its time, against the ~{COPY_TBPS} TB/s copy "
                   f"ceiling). The best cell reaches {short['tbps'].max() / COPY_TBPS:.0%} of "
                   "it: bandwidth is not what bounds these short sequences (PERF.md: host "
                   "time per call, per-tile fixed costs).", "",
                   _table(short, "tbps", "{:.2f}"), ""]
        md += [f"![{p.stem}]({p.name})" for p in pngs if p.stem.startswith(suite + "_")
               or (suite == "gem-jagged" and p.stem.startswith(("speedup", "bandwidth")))
               or (suite == "llm-dense" and p.stem == "llm_dense")
               or (suite == "gem-broadcast-q" and p.stem == "broadcast_q")]
        md.append("")
    md += _clocks_section(out_dir, pngs)
    bad = df[df["status"] != "ok"]
    missing = _missing(df)
    md += ["## What did not run, and why", ""]
    notes = out_dir / "notes.md"
    if notes.exists():
        md += [notes.read_text().strip(), ""]
    if not missing.empty:
        md += ["Cells with no row (the sweep never reached them):", "",
               "| backend | pass | suite | shape |", "|---|---|---|---|"]
        md += [f"| {r['backend']} | {r['pass']} | {r['suite']} | {_shape(r)} |"
               for _, r in missing.iterrows()]
        md.append("")
    if bad.empty and missing.empty:
        md.append("Everything ran and passed the gate.")
    elif not bad.empty:
        # one line per (backend, status, reason): a backend that failed everywhere for
        # one reason is one line, not one per cell
        bad = bad.assign(why=bad["error"].astype(str).str.replace("|", "/")
                         .str.replace("\n", " ").str.slice(0, 220))
        md += ["| backend | status | where | reason |", "|---|---|---|---|"]
        for (b, st, why), g in bad.groupby(["backend", "status", "why"], sort=False):
            where = ("; ".join(f"{r['pass']} {r['suite']} {_shape(r)}" for _, r in g.iterrows())
                     if len(g) <= 3 else
                     f"{len(g)} rows: {'+'.join(g['pass'].unique())} on {len(g.drop_duplicates(_PROBLEM))} "
                     f"shapes of {', '.join(g['suite'].unique())}")
            md.append(f"| {b} | {st} | {where} | {why} |")
    code = [f"[{f}](../{f})" for f in ("lines.md", "side_by_side.html")
            if (out_dir.parent / f).exists()]
    if code:
        md += ["", "Code size by role, and the two styles side by side: " + ", ".join(code) + "."]
    path = out_dir / "report.md"
    path.write_text("\n".join(md) + "\n")
    return path
