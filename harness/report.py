"""reports/<gpu>/report.md from results.csv: environment, per-suite tables
(TFLOP/s per backend, speedup over FA4), charts, and what did not run and why."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import backends
from .plots import (COPY_TBPS, FP8_COPY_SHARE, FP8_PREFILL_SPEEDUP, FP8_SPEEDUP, backends_in,
                    copy_ceiling, decode_rows, decode_shape, fp8_decode_pairs,
                    fp8_prefill_pairs, gemm_ceiling, latest_clocks, load, ok, plot_all,
                    speedup)

SUITE_ORDER = ["gem-jagged", "gem-jagged-d64", "gem-cross", "gem-broadcast-q", "llm-dense",
               "varlen-llm", "fuzz", "smoke"]
FUZZ_WORST, FUZZ_GEOMEAN = 0.95, 1.15  # issue 34's targets against FA4
SHORT_GRAPH_FRACTION = 0.5  # issue 34: short cells under graph replay, of the copy ceiling
HOST_BOUND = 0.8  # host_ms / ms from which a row is listed as host-bound


def _shape(r) -> str:
    if r["mode"] == "decode":
        return decode_shape(r)
    s = f"{r['mode']} B{r['batch']} H{r['heads']}/{r['kv_heads']} D{r['head_dim']} "
    s += f"L{r['max_seqlen_q']}" if r["mode"] == "self" else f"Lq{r['max_seqlen_q']} Lk{r['max_seqlen_k']}"
    s += f" s{r['sparsity']:g}" + (" causal" if r["causal"] else "")
    return s + (f" {r['dtype']}" if r["dtype"] != "bf16" else "")


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
_DECODE_PROBLEM = _PROBLEM + ["page_size", "num_splits", "packed_q"]


def _missing(df: pd.DataFrame) -> pd.DataFrame:
    """(backend, problem, pass) combinations absent from the CSV, over the backends,
    problems and passes that appear in it (jagged and decode rows apart: their
    backends and passes differ)."""
    if df.empty:
        return df
    jag, dec = df[df["mode"] != "decode"], df[df["mode"] == "decode"]
    if len(jag) and len(dec):
        return pd.concat([_missing(jag), _missing(dec)], ignore_index=True)
    prob = _DECODE_PROBLEM if len(dec) else _PROBLEM
    grid = (df[prob].drop_duplicates()
            .merge(df[["backend"]].drop_duplicates(), how="cross")
            .merge(df[["pass"]].drop_duplicates(), how="cross"))
    have = df[prob + ["backend", "pass"]].drop_duplicates()
    m = grid.merge(have, how="left", indicator=True)
    return m[m["_merge"] == "left_only"].drop(columns="_merge")


def _fuzz_summary(sp: pd.DataFrame, df: pd.DataFrame, how: str = "") -> list[str]:
    """Per backend of ours and pass: geometric mean and worst of the ratios to FA4 over
    the fuzz problems, against issue 34's targets; a problem FA4 timed but the backend
    did not (failed gate, error) is counted as a miss. `how`: what the ratios time
    (eager calls unless it says otherwise)."""
    import numpy as np
    ours = [b for b in backends_in(sp) if getattr(backends.REGISTRY.get(b), "own", False)]
    fa = ok(df)
    fa = fa[(fa["suite"] == "fuzz") & (fa["backend"] == "fa4")]
    if not ours or fa.empty:
        return []
    md = [f"Against FA4{how} (issue 34's targets: worst >= {FUZZ_WORST:.2f}x, geometric mean "
          f">= {FUZZ_GEOMEAN:.2f}x, forward and backward):", "",
          "| backend | pass | problems | geomean | worst | worst problem | verdict |",
          "|---|---|---:|---:|---:|---|---|"]
    for b in ours:
        for ps in ("fwd", "bwd"):
            g = sp[(sp["backend"] == b) & (sp["pass"] == ps)]
            n = int((fa["pass"] == ps).sum())
            if g.empty or not n:
                continue
            geo = float(np.exp(np.log(g["speedup"]).mean()))
            w = g.loc[g["speedup"].idxmin()]
            met = geo >= FUZZ_GEOMEAN and w["speedup"] >= FUZZ_WORST and len(g) == n
            miss = f" ({n - len(g)} not timed)" if len(g) < n else ""
            md.append(f"| {b} | {ps} | {len(g)}/{n}{miss} | {geo:.2f} | {w['speedup']:.2f} | "
                      f"{_shape(w)} | {'met' if met else 'missed'} |")
    return md + [""]


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
          "plain bf16 matmul, drawn as the dashed line of the TFLOP/s charts; `gemm-fp8` "
          "the e4m3 one (`torch._scaled_mm`, bf16 out), the fp8 prefill's S = Q K^T rate.", "",
          "| pass | problem | backend | TFLOP/s | MHz | W | at 1980 | revision |",
          "|---|---|---|---:|---:|---:|---:|---|"]
    md += [f"| {r['pass']} | {r['problem']} | {r['backend']} | "
           f"{r['tflops']:.1f} | {r['mhz']:.0f} | {r['watts']:.0f} | {r['at_boost']:.1f} | "
           f"{r['git_rev']} |"
           for _, r in d.sort_values(["pass", "problem", "backend"], kind="stable").iterrows()]
    md += [""] + [f"![{p.stem}]({p.name})" for p in pngs if p.stem == "clocks"] + [""]
    return md


# ----------------------------------------------------------------------- decode

def _decode_table(d: pd.DataFrame, copy: float | None) -> str:
    """Cells x backends: KV TB/s of the default call, its share of the copy
    bandwidth, TFLOP/s, and KV TB/s under CUDA-graph replay where captured (or the
    row's status where it has no time)."""
    d = d.sort_values(["batch", "max_seqlen_k", "heads", "kv_heads", "head_dim", "max_seqlen_q",
                       "page_size", "num_splits", "sparsity", "dtype"], kind="stable")
    d = d.assign(cell=d.apply(decode_shape, axis=1)).drop_duplicates(
        ["cell", "backend"], keep="last")
    cols = backends_in(d)
    out = ["| cell | KV MB | " + " | ".join(cols) + " |", "|---|---:|" + "---:|" * len(cols)]
    for cell, g in d.groupby("cell", sort=False):
        by = g.set_index("backend")
        cells = []
        for c in cols:
            if c not in by.index:
                cells.append("–")
                continue
            r = by.loc[c]
            if r["status"] != "ok" or pd.isna(r["kv_tbps"]):
                cells.append(r["status"])
                continue
            pct = f" ({r['kv_tbps'] / copy:.0%})" if copy else ""
            host = " †" if r["host_ms"] >= HOST_BOUND * r["ms"] else ""
            graph = ("" if pd.isna(r.get("graph_kv_tbps", float("nan")))
                     else f" · graph {r['graph_kv_tbps']:.2f}")
            cells.append(f"{r['kv_tbps']:.2f}{pct} · {r['tflops']:.1f}{host}{graph}")
        out.append(f"| {cell} | {g['kv_bytes'].iloc[0] / 1e6:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _cells(rows: pd.DataFrame, what) -> str:
    """' (label: cell what; ...)' for the rows, '' for none."""
    if rows.empty:
        return ""
    return " (" + "; ".join(f"{decode_shape(r)} {what(r)}" for _, r in rows.iterrows()) + ")"


def _decode_targets(good: pd.DataFrame, copy: float | None) -> list[str]:
    """Issue 32's targets, per backend of ours, from this run's rows."""
    from .decode import BASE
    d = decode_rows(good)
    ours = [b for b in ("tlx", "cute") if b in set(d["backend"])]
    if d.empty or not ours:
        return []
    key = ["suite", "causal", "dtype", "batch", "heads", "kv_heads", "head_dim", "max_seqlen_q",
           "max_seqlen_k", "sparsity", "page_size", "num_splits", "packed_q"]
    model = lambda d: d[(d["heads"] == BASE["heads"]) & (d["kv_heads"] == BASE["kv_heads"]) &
                        (d["head_dim"] == BASE["head_dim"]) & (d["dtype"] == BASE["dtype"])]
    base = lambda d: model(d)[(d["sparsity"] == 1) & (d["max_seqlen_q"] == 1) &
                              (d["packed_q"].astype(str) != "True") & (d["num_splits"] == 0)]
    others = d[~d["backend"].isin(["tlx", "cute"])]
    best = others.groupby(key)["kv_tbps"].max().rename("best").reset_index()
    md = ["Targets (issue 32; bf16, D 128, GQA 32/8 unless the cell says otherwise):", ""]
    for b in ours:
        mine = d[d["backend"] == b]
        one = base(mine)
        one = one[(one["batch"] == 1) & (one["max_seqlen_k"] == 32768) & (one["page_size"] == 0)]
        v = one["kv_tbps"].iloc[0] if len(one) else None
        line = [f"B=1, 32k: {v:.2f} TB/s ({'met' if v >= 3.6 else 'missed'}, target 3.6)"
                if v is not None else "B=1, 32k: not run"]
        g = one["graph_kv_tbps"].iloc[0] if len(one) and "graph_kv_tbps" in one else None
        if g is not None and not pd.isna(g):
            line.append(f"B=1, 32k under CUDA-graph replay: {g:.2f} TB/s "
                        f"({'met' if g >= 3.6 else 'missed'}, target 3.6)")
        if copy:
            big = model(mine)
            big = big[big["kv_bytes"] >= 256e6]
            miss = big[big["kv_tbps"] < 0.8 * copy]
            line.append(f"reads >= 256 MB at >= 80 % of copy: {len(big) - len(miss)}/{len(big)}"
                        + _cells(miss, lambda r: f"{r.kv_tbps / copy:.0%}"))
        for ps, tol in ((1, 0.10), (16, 0.05)):
            for (bb, lk), g in base(mine).groupby(["batch", "max_seqlen_k"]):
                c, p = g[g["page_size"] == 0], g[g["page_size"] == ps]
                if len(c) and len(p):
                    r = p["kv_tbps"].iloc[0] / c["kv_tbps"].iloc[0] - 1
                    verdict = "met" if r >= -tol else "missed"
                    line.append(f"page {ps} vs contiguous at B={bb}, {int(lk) // 1024}k: "
                                f"{r:+.0%} ({verdict}, -{tol:.0%} allowed)")
        m = mine.merge(best, on=key)
        behind = m[m["kv_tbps"] < m["best"]]
        line.append(f"at least the best baseline: {len(m) - len(behind)}/{len(m)} cells"
                    + _cells(behind, lambda r: f"{r.kv_tbps:.2f} < {r.best:.2f}"))
        md += [f"- `{b}`:"] + [f"  - {x}" for x in line]
    return md + [""]


def _fp8_targets(g: pd.DataFrame, copy: float | None) -> list[str]:
    """Issue 33's decode targets per backend of ours and fp8 cell: tokens per second
    against the bf16 cell of the same shape (the time ratio; graph replay where both
    were captured) and the fp8 cell's KV bandwidth against the copy's."""
    md = [f"Targets (issue 33): fp8 at least {FP8_SPEEDUP:.1f}x the bf16 cell's tokens per "
          f"second, at {FP8_COPY_SHARE:.0%} of copy or better:", ""]
    for _, r in fp8_decode_pairs(g).iterrows():
        share = f"{r['tbps'] / copy:.0%} of copy" if copy else f"{r['tbps']:.2f} TB/s"
        met = r["x"] >= FP8_SPEEDUP and (not copy or r["tbps"] >= FP8_COPY_SHARE * copy)
        md.append(f"- `{r['backend']}` {decode_shape(r)}: {r['x']:.2f}x bf16"
                  f"{' (graph)' if r['graph'] else ''}, {share}: {'met' if met else 'missed'}")
    return md + [""] if len(md) > 2 else []


def _fp8_prefill(good: pd.DataFrame, out_dir, pngs=()) -> list[str]:
    """Issue 33's prefill target per backend of ours and fp8 forward row: its TFLOP/s
    against the same backend's bf16 twin, and the gate's out error beside the twin's;
    the sustained GEMM ceilings (clocks.csv) when measured."""
    m = fp8_prefill_pairs(good)
    if m.empty:
        return []
    err = lambda e, t: "–" if pd.isna(e) else f"{e:.2e} ({t:.1e})"  # noqa: E731
    md = ["## fp8 prefill (forward)", "",
          "q, k, v in e4m3 with descales per (sequence, KV head) (amax / 448), out bf16, "
          "against the same backend's bf16 run of the same shape and values (the fp8 "
          "problem is its twin quantized). Baselines without an fp8 varlen kernel (SDPA, "
          "flex) dequantize per call (timed); FA4 has no fp8 on sm_90. The gate's rule: "
          "error against fp32 on the dequantized values at most 2x PyTorch's in bf16 on "
          f"them. Target (issue 33): fp8 at least {FP8_PREFILL_SPEEDUP:.1f}x bf16's TFLOP/s.",
          ""]
    clk = latest_clocks(out_dir)
    gemm = {b: clk.loc[clk["backend"] == b, "tflops"] for b in ("gemm", "gemm-fp8")} \
        if not clk.empty else {}
    if gemm and all(len(v) for v in gemm.values()):
        md += [f"Sustained GEMM ceilings (`harness clocks --gemm`): bf16 "
               f"{gemm['gemm'].iloc[-1]:.0f}, e4m3 {gemm['gemm-fp8'].iloc[-1]:.0f} TFLOP/s.", ""]
    md += ["| backend | suite | shape | fp8 TFLOP/s | bf16 TFLOP/s | x | target | "
          "fp8 out err (tol) | bf16 out err (tol) |", "|---|---|---|---:|---:|---:|---|---:|---:|"]
    for _, r in m.iterrows():
        x = r["x"]
        md.append(f"| {r['backend']} | {r['suite']} | {_shape(r)} | {r['tflops']:.1f} | "
                  f"{r['tflops_bf16']:.1f} | {x:.2f} | "
                  f"{'met' if x >= FP8_PREFILL_SPEEDUP else 'missed'} | "
                  f"{err(r['out_err'], r['out_tol'])} | {err(r['out_err_bf16'], r['out_tol_bf16'])} |")
    return md + [""] + [f"![{p.stem}]({p.name})" for p in pngs if p.stem == "fp8"] + [""]


def _decode_section(df: pd.DataFrame, pngs) -> list[str]:
    from .decode import SWEEPS
    good = ok(df)
    if decode_rows(df).empty:
        return []
    copy = copy_ceiling(df)
    md = ["## decode (KV-cache attention)", "",
          "`kvcache_attention` and the baselines on one new row (or a few) per sequence "
          "against a cache of K and V. Each cell is first checked by the oracle "
          "(`harness.decode.check`: fp32 on the gathered cache, the 2x rule) on the same "
          "layout cut to at most 16 sequences of 8k keys, then timed at full size "
          "(do_bench median, L2 flushed). KV TB/s = the K + V bytes a call must read "
          "(sum over sequences of cached keys · H_kv · D · 2 · dtype bytes) over its time; "
          "in parentheses its share of the copy bandwidth, then TFLOP/s "
          "(4 · H · D · visible pairs).",
          "",
          (f"Copy bandwidth in this run: {copy:.2f} TB/s (a 1 GiB device-to-device copy, "
           "bytes read + written over its do_bench median, in each worker; the median)."
           if copy else "Copy bandwidth: not measured."), "", "Backends:", ""]
    for name in backends_in(decode_rows(df)):
        b = backends.DECODE.get(name)
        md.append(f"- `{name}`: {b.note if b and b.note else '(not in the registry)'}")
    md.append("")
    md += _decode_targets(good, copy)
    dec = decode_rows(df)
    timed = set(decode_rows(good)["backend"])
    idle = dec[~dec["backend"].isin(timed)]
    if len(idle):  # a backend that ran nowhere is a line here, not a column of its status
        md += ["Not in the tables (no cell ran): " + "; ".join(
            f"`{b}` ({', '.join(sorted(set(g['status'])))}: {g['error'].iloc[0][:200]})"
            for b, g in idle.groupby("backend", sort=False)) + ".", ""]
    dec = dec[dec["backend"].isin(timed)]
    for s in SWEEPS:
        g = decode_rows(dec, s.name)
        if g.empty:
            continue
        md += [f"### {s.title}", "", "KV TB/s (share of copy) · TFLOP/s (†: host-bound, the "
               f"host's time to issue a call at least {HOST_BOUND:.0%} of the row's):", "",
               _decode_table(g, copy), ""]
        if s.name == "fp8":
            md += _fp8_targets(g, copy)
        md += [f"![{p.stem}]({p.name})" for p in pngs
               if p.stem == {"grid": "decode_bandwidth", "pages": "decode_pages",
                             "splits": "decode_splits"}.get(s.name)]
        md.append("")
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
    for name in backends_in(df[df["mode"] != "decode"]):
        b = backends.REGISTRY.get(name)
        md.append(f"- `{name}`: {b.note if b and b.note else '(not in the registry)'}")
    md.append("")
    sp = speedup(df)
    gemm = gemm_ceiling(out_dir)
    for suite in sorted(set(df.loc[df["mode"] != "decode", "suite"]),
                        key=lambda s: (SUITE_ORDER + [s]).index(s)):
        g = good[good["suite"] == suite]
        md += [f"## {suite}", ""]
        if g.empty:
            md += ["Nothing timed in this suite (see below).", ""]
            continue
        md += ["TFLOP/s:", "", _table(g, "tflops", "{:.1f}"), ""]
        if gemm:
            md += [f"Share of the sustained bf16 GEMM ({gemm:.0f} TFLOP/s at the power cap, "
                   "`harness clocks --gemm`; fp8 rows against it too), %. A row's do_bench "
                   "bursts can run at a higher clock than the sustained GEMM, and pass 100 %:",
                   "",
                   _table(g.assign(gemm_pct=100 * g["tflops"] / gemm), "gemm_pct", "{:.0f}"),
                   ""]
        s = sp[(sp["suite"] == suite) & (sp["backend"] != "fa4")]
        if not s.empty:
            md += ["Speedup over FA4 (x):", "", _table(s, "speedup", "{:.2f}"), ""]
        if suite == "fuzz":
            md += _fuzz_summary(s, df)
            sg = speedup(df, col="graph_tflops")
            md += _fuzz_summary(sg[(sg["suite"] == suite) & (sg["backend"] != "fa4")], df,
                                ", both under CUDA-graph replay")
            md += [f"![{p.stem}]({p.name})" for p in pngs if p.stem == "fuzz"] + [""]
        gr = g[g["graph_tflops"].notna()]
        if not gr.empty:
            md += ["TFLOP/s under CUDA-graph replay (the call captured once and replayed: "
                   "the kernels' cost without the host's; a backend whose call cannot be captured "
                   "has no column):", "",
                   _table(gr, "graph_tflops", "{:.1f}"), ""]
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
            sg = short[short["graph_tbps"].notna()]
            if not sg.empty:
                md += ["The same under CUDA-graph replay (TB/s; issue 34's target: at least "
                       f"{SHORT_GRAPH_FRACTION:.0%} of the copy ceiling at 256 / 0.1 and "
                       "512 / 0.1):", "", _table(sg, "graph_tbps", "{:.2f}"), ""]
        md += [f"![{p.stem}]({p.name})" for p in pngs if p.stem.startswith(suite + "_")
               or (suite == "gem-jagged" and p.stem.startswith(("speedup", "bandwidth")))
               or (suite == "llm-dense" and p.stem == "llm_dense")
               or (suite == "gem-broadcast-q" and p.stem == "broadcast_q")]
        md.append("")
    md += _fp8_prefill(good, out_dir, pngs)
    md += _decode_section(df, pngs)
    md += _clocks_section(out_dir, pngs)
    bad = df[df["status"] != "ok"]
    missing = _missing(df)
    md += ["## What did not run, and why", ""]
    notes = out_dir / "notes.md"
    if notes.exists():
        md += [notes.read_text().strip(), ""]
    if not missing.empty:
        # one line per (backend, pass, suite, dtype) past three cells: a baseline never
        # run on a suite's fp8 twins is one line, not one per cell
        md += ["Cells with no row (the sweep never reached them):", "",
               "| backend | pass | suite | shape |", "|---|---|---|---|"]
        for (b, ps, suite, dt), g in missing.groupby(["backend", "pass", "suite", "dtype"],
                                                     sort=False):
            shapes = ([_shape(r) for _, r in g.iterrows()] if len(g) <= 3
                      else [f"{len(g)} {dt} shapes"])
            md += [f"| {b} | {ps} | {suite} | {sh} |" for sh in shapes]
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
                     f"{len(g)} rows: {'+'.join(g['pass'].unique())} on "
                     f"{len(g.drop_duplicates(_DECODE_PROBLEM))} shapes of "
                     f"{', '.join(g['suite'].unique())}")
            md.append(f"| {b} | {st} | {where} | {why} |")
    code = [f"[{f}](../{f})" for f in ("lines.md", "side_by_side.html")
            if (out_dir.parent / f).exists()]
    if code:
        md += ["", "Code size by role, and the two styles side by side: " + ", ".join(code) + "."]
    path = out_dir / "report.md"
    path.write_text("\n".join(md) + "\n")
    return path
