"""Charts from reports/<gpu>/results.csv (matplotlib, Agg), in the style of the
published jagged-attention charts: TFLOP/s against max length (log2 axis), one
panel per sparsity, one line per backend. Decode (KV-cache) charts: KV bytes read per
second against cache length per batch, and the page-size and splits sweeps, each with
the copy bandwidth measured in the same run as the ceiling line."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.ticker  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

MARKERS = "osD^v<>pP*Xh"
ORDER = ["tlx", "cute", "triton", "fa4", "sdpa-cudnn", "sdpa-flash", "sdpa-nested",
         "sdpa-nested-cudnn", "flex", "sdpa", "flashinfer"]
DECODE_NUM = ("page_size", "num_splits", "kv_bytes", "kv_tbps", "copy_tbps", "graph_ms",
              "graph_kv_tbps")
# a problem's shape columns: a row of one backend meets the same problem of another
SHAPE_KEY = ["mode", "causal", "dtype", "batch", "heads", "kv_heads", "head_dim",
             "max_seqlen_q", "max_seqlen_k", "sparsity"]
COPY_TBPS = 4.3   # H200 device-to-device copy, read + write (measured here, PERF.md)
FP8_PREFILL_SPEEDUP = 1.4  # issue 33: the fp8 prefill forward's TFLOP/s against bf16's
FP8_SPEEDUP, FP8_COPY_SHARE = 1.8, 0.8  # issue 33: fp8 decode against bf16, and of copy
OWN = ("triton", "tlx", "cute")  # the project's backends (backends.REGISTRY .own)


def load(csv_path) -> pd.DataFrame:
    df = pd.read_csv(csv_path, keep_default_na=False)
    for c in ("tflops", "ms", "host_ms", "sparsity", "max_seqlen_q", "max_seqlen_k", "batch", "heads",
              "kv_heads", "head_dim", "total_q", "total_k"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    df["causal"] = df["causal"].astype(str) == "True"
    for c in ("out_err", "out_tol"):  # absent from a CSV written before they existed
        df[c] = pd.to_numeric(df[c], errors="coerce") if c in df else float("nan")
    for c in DECODE_NUM:  # absent from a CSV written before decode rows existed
        df[c] = pd.to_numeric(df[c], errors="coerce") if c in df else float("nan")
    if "packed_q" not in df:
        df["packed_q"] = ""
    df["tbps"] = df.apply(io_bytes, axis=1) / (df["ms"] * 1e-3) / 1e12
    jag = df["mode"] != "decode"  # decode rows have their own graph columns (KV bytes)
    df["graph_tflops"] = (df["tflops"] * df["ms"] / df["graph_ms"]).where(jag)
    df["graph_tbps"] = (df["tbps"] * df["ms"] / df["graph_ms"]).where(jag)
    return df


def io_bytes(r) -> float:
    """Bytes a call must move through HBM at the least (a lower bound: each tensor once).
    fwd: read q, k, v; write out and the fp32 lse. bwd: read q, k, v, out, dout and lse;
    write dq, dk, dv. Intermediates (delta, an fp32 dq accumulator) are not counted.
    Broadcast-Q: one dense Q (total_q rows), outputs per batch element."""
    el = 4 if r["dtype"] == "fp32" else 2
    el_in = 1 if r["dtype"] == "fp8" else el  # fp8: e4m3 inputs, bf16 out
    rows_q = r["total_q"]
    rows_o = rows_q * r["batch"] if r["mode"] == "broadcast_q" else rows_q
    q, o = rows_q * r["heads"] * r["head_dim"], rows_o * r["heads"] * r["head_dim"]
    kv = 2 * r["total_k"] * r["kv_heads"] * r["head_dim"]
    lse = 4 * rows_o * r["heads"]
    if r["pass"] == "fwd":
        return el_in * (q + kv) + el * o + lse
    return el * (2 * q + 2 * kv + 2 * o) + lse       # + dq, dk, dv; + out, dout


def ok(df) -> pd.DataFrame:
    return df[(df["status"] == "ok") & df["tflops"].notna()]


def backends_in(df):
    names = list(dict.fromkeys(df["backend"]))
    return sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def _style(name, label, j=0):
    """One color and marker per backend across all charts; linestyle per series."""
    i = ORDER.index(name) if name in ORDER else len(ORDER) + sum(map(ord, name)) % 7
    return dict(color=f"C{i % 10}", marker=MARKERS[i % len(MARKERS)], linewidth=1.8,
                markersize=6, label=label, linestyle=("-", ":", "--")[j % 3])


def _series(d, name):
    """(label suffix, sub-frame) per distinct max_seqlen_k when a suite varies it."""
    ks = sorted(d["max_seqlen_k"].unique()) if d["mode"].iloc[0] == "cross" else [None]
    for k in ks:
        yield (name if k is None else f"{name} Lk{int(k)}"), (d if k is None else d[d["max_seqlen_k"] == k])


def _panels(df, suite, pass_, y, ylabel, title, path, hline=None, hline_label=None):
    d = df[(df["suite"] == suite) & (df["pass"] == pass_)]
    if d.empty:
        return None
    sps = sorted(d["sparsity"].unique())
    xs = sorted(d["max_seqlen_q"].unique())
    fig, axes = plt.subplots(1, len(sps), figsize=(5.2 * len(sps), 4.2), squeeze=False,
                             sharey=True)
    for ax, s in zip(axes[0], sps):
        for name in backends_in(d):
            sel = d[(d["backend"] == name) & (d["sparsity"] == s)]
            for j, (label, sub) in enumerate(_series(sel, name) if len(sel) else []):
                if len(sub):  # on the whole x grid: a missing cell breaks the line
                    ys = sub.groupby("max_seqlen_q")[y].mean().reindex(xs)
                    ax.plot(xs, ys.values, **_style(name, label, j))
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_title(f"sparsity {s:g}")
        ax.set_xlabel("max sequence length")
        ax.grid(True, which="both", alpha=0.35)
        if hline is not None:
            ax.axhline(hline, color="k", linewidth=0.8, label=hline_label,
                       linestyle="--" if hline_label else "-")
            ax.set_ylim(top=max(ax.get_ylim()[1], hline * 1.08))  # the line clear of the frame
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=8, loc="best")
    first = d.iloc[0]
    fig.suptitle(f"{title} ({suite}, {pass_}; B={first['batch']}, H={first['heads']}, "
                 f"D={first['head_dim']}, {first['dtype']}) on {first['gpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def speedup(df, base="fa4", col="tflops") -> pd.DataFrame:
    """Each ok row with `speedup` = its `col` (TFLOP/s, or `graph_tflops`: under graph
    replay) over `base`'s on the same problem; rows without the column are left out."""
    key = ["suite", "pass"] + SHAPE_KEY
    d = ok(df)
    d = d[(d["mode"] != "decode") & d[col].notna()]
    b = d[d["backend"] == base][key + [col]].rename(columns={col: "base"})
    m = d.merge(b, on=key)
    m["speedup"] = m[col] / m["base"]
    return m


def _grouped_bars(ax, d, value, rotation=20):
    """One bar per backend on each `shape` of d (in order of appearance), `value` high."""
    shapes = list(dict.fromkeys(d["shape"]))
    names = backends_in(d)
    w = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        v = d[d["backend"] == name].set_index("shape")[value]
        ax.bar([j + i * w for j in range(len(shapes))], [v.get(sh, 0) for sh in shapes],
               width=w, label=name, color=_style(name, name)["color"])
    ax.set_xticks([j + w * (len(names) - 1) / 2 for j in range(len(shapes))])
    ax.set_xticklabels(shapes, fontsize=7, rotation=rotation, ha="right")


def _bars(df, suite, path, title, label, ceiling=None):
    d = df[df["suite"] == suite]
    if d.empty:
        return None
    passes = [p for p in ("fwd", "bwd") if p in set(d["pass"])]
    fig, axes = plt.subplots(1, len(passes), figsize=(7.5 * len(passes), 4.4), squeeze=False)
    for ax, ps in zip(axes[0], passes):
        dp = d[d["pass"] == ps].sort_values(["head_dim", "max_seqlen_q", "causal"])
        _grouped_bars(ax, dp.assign(shape=dp.apply(label, axis=1)), "tflops")
        if ceiling is not None:
            ax.axhline(ceiling, color="k", linewidth=0.9, linestyle="--",
                       label=ceiling_label(ceiling))
        ax.set_ylabel("TFLOP/s")
        ax.set_title(ps)
        ax.grid(True, axis="y", alpha=0.35)
        ax.set_ylim(top=ax.get_ylim()[1] * 1.25)  # room for the legend above the bars
        ax.legend(fontsize=7, ncol=4, loc="upper left")
    fig.suptitle(f"{title} on {d.iloc[0]['gpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latest_clocks(out_dir) -> pd.DataFrame:
    """clocks.csv (`harness clocks --out`): the last row of each (backend, pass, problem)
    of the default build (rows of an A/B variant left out); empty when there is none."""
    path = Path(out_dir) / "clocks.csv"
    if not path.exists():
        return pd.DataFrame()
    d = pd.read_csv(path, keep_default_na=False)
    d = d[d["variant"] == ""]
    return d.drop_duplicates(["backend", "pass", "problem"], keep="last")


def gemm_ceiling(out_dir) -> float | None:
    """The latest sustained bf16 GEMM TFLOP/s of clocks.csv (`harness clocks --gemm`), the
    ceiling the TFLOP/s charts draw; None when it was not measured."""
    d = latest_clocks(out_dir)
    if d.empty:
        return None
    g = d[d["backend"] == "gemm"]
    return float(g["tflops"].iloc[-1]) if len(g) else None


def ceiling_label(tflops: float) -> str:
    return f"sustained bf16 GEMM ({tflops:.0f})"


def plot_clocks(out_dir, path) -> Path | None:
    """Sustained TFLOP/s against the SM clock, one panel per problem: under the power cap
    a kernel's speed is its cycles (the dotted ray through the origin, read at the
    boost clock) times the clock its power allows."""
    d = latest_clocks(out_dir)
    if d.empty:
        return None
    panels = list(dict.fromkeys(zip(d["pass"], d["problem"])))
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (ps, prob) in zip(axes.flat, panels):
        dp = d[(d["pass"] == ps) & (d["problem"] == prob)]
        for _, r in dp.iterrows():
            st = _style(r["backend"], f"{r['backend']} ({r['git_rev']})")
            ax.plot([0, 1980], [0, r["at_boost"]], color=st["color"], linestyle=":",
                    linewidth=0.8, alpha=0.6)
            st.update(linestyle="none", markersize=8)
            ax.plot([r["mhz"]], [r["tflops"]], **st)
        ax.set_xlim(1300, 2000)
        lo = min(dp["tflops"]) * 0.85
        ax.set_ylim(lo, max(dp["at_boost"]) * 1.03)
        ax.set_xlabel("SM clock, MHz (median over the run)")
        ax.set_ylabel("sustained TFLOP/s")
        ax.set_title(f"{ps} {prob.replace('self ', '')}", fontsize=9)
        ax.grid(True, alpha=0.35)
        ax.legend(fontsize=6.5, loc="upper left")
    fig.suptitle("At the 700 W cap: speed = cycles (a dotted ray through the origin, "
                 "read at 1980 MHz) x the clock the cap allows")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------- decode

def decode_rows(df, sweep: str | None = None) -> pd.DataFrame:
    """The decode rows, or those of one sweep of harness.decode.SWEEPS."""
    from .decode import problem_of, sweep_cells
    d = df[df["mode"] == "decode"]
    if sweep is None or d.empty:
        return d
    cells = set(sweep_cells(sweep))
    return d[d.apply(lambda r: problem_of(r) in cells, axis=1)]


def decode_shape(r) -> str:
    """A decode cell by what it changes from the suite's base (GQA 32/8, D 128, one new
    row, contiguous, splits chosen, bf16, every sequence full)."""
    bits = [f"B{r['batch']}", f"Lk{int(r['max_seqlen_k'])}", f"H{r['heads']}/{r['kv_heads']}",
            f"D{r['head_dim']}", f"Lq{r['max_seqlen_q']}",
            f"p{int(r['page_size'])}" if r["page_size"] else "contig"]
    bits += [f"splits {int(r['num_splits'])}"] if r["num_splits"] else []
    bits += [f"s{r['sparsity']:g}"] if r["sparsity"] != 1 else []
    bits += ["packed"] if str(r["packed_q"]) == "True" else []
    bits += [r["dtype"]] if r["dtype"] != "bf16" else []
    bits += [] if r["causal"] else ["non-causal"]
    return " ".join(bits)


def fp8_prefill_pairs(good: pd.DataFrame) -> pd.DataFrame:
    """Each ok fp8 forward row of our styles beside its bf16 twin (same backend, suite,
    shape and seed; the twin's columns suffixed _bf16), `x` its TFLOP/s over the twin's."""
    jag = good[(good["mode"] != "decode") & (good["pass"] == "fwd")
               & good["backend"].isin(OWN)]
    key = ["backend", "suite", "mode", "causal", "batch", "heads", "kv_heads", "head_dim",
           "max_seqlen_q", "max_seqlen_k", "sparsity", "seed"]
    m = jag[jag["dtype"] == "fp8"].merge(jag[jag["dtype"] == "bf16"], on=key,
                                         suffixes=("", "_bf16"))
    return m.assign(x=m["tflops"] / m["tflops_bf16"]).sort_values(key)


def fp8_decode_pairs(dec: pd.DataFrame) -> pd.DataFrame:
    """Each fp8-cache decode cell of our styles beside the bf16 cell of the same shape:
    `x` the bf16 time over the fp8 one (tokens per second; under graph replay where both
    were captured, `graph`), `tbps` the fp8 cell's KV TB/s at that time."""
    key = ["backend", "batch", "heads", "kv_heads", "head_dim", "max_seqlen_q",
           "max_seqlen_k", "page_size", "num_splits", "packed_q", "sparsity"]
    mine = dec[dec["backend"].isin(OWN)]
    m = mine[mine["dtype"] == "fp8"].merge(mine[mine["dtype"] == "bf16"], on=key,
                                           suffixes=("", "_bf16"))
    graph = m["graph_ms"].notna() & m["graph_ms_bf16"].notna()
    t8 = m["graph_ms"].where(graph, m["ms"])
    t16 = m["graph_ms_bf16"].where(graph, m["ms_bf16"])
    return m.assign(graph=graph, x=t16 / t8, tbps=m["kv_bytes"] / (t8 * 1e-3) / 1e12)


def copy_ceiling(df) -> float | None:
    """The copy bandwidth measured in the run (median over the decode rows), TB/s."""
    c = df.loc[df["mode"] == "decode", "copy_tbps"].dropna() if len(df) else pd.Series([])
    return float(c.median()) if len(c) else None


def _kib(n) -> str:
    n = int(n)
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _decode_panels(d, x, panel, xlabel, title, path, ceiling, xfmt=str, log2=False):
    """KV TB/s against `x`, one panel per value of `panel` (a function of the row), one
    line per backend, the copy bandwidth as a dashed line."""
    if d.empty:
        return None
    d = d.assign(_panel=d.apply(panel, axis=1))
    panels = list(dict.fromkeys(d.sort_values(["batch", "max_seqlen_k"])["_panel"]))
    xs = sorted(d[x].unique())
    pos = (lambda v: v) if log2 else (lambda v: xs.index(v))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.0), squeeze=False,
                             sharey=True)
    for ax, pn in zip(axes[0], panels):
        dp = d[d["_panel"] == pn]
        for name in backends_in(dp):
            ys = dp[dp["backend"] == name].groupby(x)["kv_tbps"].mean().reindex(xs)
            ax.plot([pos(v) for v in xs], ys.values, **_style(name, name))
        if log2:
            ax.set_xscale("log", base=2)
        ax.set_xticks([pos(v) for v in xs])
        ax.set_xticklabels([xfmt(v) for v in xs])
        ax.set_title(pn, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.35)
        if ceiling:
            ax.axhline(ceiling, color="k", linewidth=0.9, linestyle="--",
                       label=f"copy ({ceiling:.2f})")
            ax.set_ylim(0, ceiling * 1.1)
    axes[0][0].set_ylabel("KV TB/s (K + V bytes read / time)")
    axes[0][-1].legend(fontsize=8, loc="best")
    first = d.iloc[0]
    fig.suptitle(f"{title} (H={first['heads']}/{first['kv_heads']}, D={first['head_dim']}, "
                 f"{first['dtype']}) on {first['gpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_decode(df, out_dir) -> list[Path]:
    """decode_bandwidth.png (the grid: TB/s against cache length, a panel per batch),
    decode_pages.png and decode_splits.png."""
    out_dir = Path(out_dir)
    good = ok(df)
    top = copy_ceiling(df)
    at = lambda r: f"B={r['batch']}, {_kib(r['max_seqlen_k'])} cached"
    return [p for p in (
        _decode_panels(decode_rows(good, "grid"), "max_seqlen_k", lambda r: f"B={r['batch']}",
                       "cached keys per sequence", "Decode: KV bandwidth",
                       out_dir / "decode_bandwidth.png", top, _kib, log2=True),
        _decode_panels(decode_rows(good, "pages"), "page_size", at, "page size",
                       "Decode: page size", out_dir / "decode_pages.png", top,
                       lambda v: "contig" if v == 0 else str(int(v))),
        _decode_panels(decode_rows(good, "splits"), "num_splits", at, "num_splits",
                       "Decode: KV splits", out_dir / "decode_splits.png", top,
                       lambda v: "auto" if v == 0 else str(int(v))),
    ) if p is not None]


def plot_fuzz(df, path, worst=0.95) -> Path | None:
    """The fuzz suite against FA4: per pass a panel of every problem, x its FA4 time
    under graph replay (log), y each style's speedup over FA4, filled under graph replay
    and hollow for the eager call; lines at 1 and at the `worst` target."""
    eager, graph = speedup(df), speedup(df, col="graph_tflops")
    if eager[eager["suite"] == "fuzz"].empty:
        return None
    fa = df[(df["suite"] == "fuzz") & (df["backend"] == "fa4")]
    key = ["pass"] + SHAPE_KEY
    fa_ms = fa[key + ["graph_ms", "ms"]].rename(columns={"graph_ms": "fa_graph", "ms": "fa_ms"})
    passes = [ps for ps in ("fwd", "bwd") if (fa["pass"] == ps).any()]
    fig, axes = plt.subplots(1, len(passes), figsize=(6.5 * len(passes), 4.6), squeeze=False)
    for ax, ps in zip(axes[0], passes):
        for how, d, filled in (("graph", graph, True), ("eager", eager, False)):
            d = d[(d["suite"] == "fuzz") & (d["pass"] == ps) & (d["backend"] != "fa4")]
            d = d.merge(fa_ms, on=key)
            for name in backends_in(d):
                b = d[d["backend"] == name]
                x = b["fa_graph"].fillna(b["fa_ms"])
                st = _style(name, f"{name} ({how})")
                ax.scatter(x, b["speedup"], marker=st["marker"], s=34, label=st["label"],
                           facecolors=st["color"] if filled else "none",
                           edgecolors=st["color"], alpha=0.85)
        ax.axhline(1.0, color="k", linewidth=0.8)
        ax.axhline(worst, color="k", linewidth=0.8, linestyle=":",
                   label=f"target worst {worst:g}x")
        ax.set_xscale("log")
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("FA4 time, graph replay (ms)")
        ax.set_title(ps)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("speedup over FA4 (x)")
    axes[0][-1].legend(fontsize=7, loc="best")
    gpu = df["gpu"].dropna()
    shapes = len(fa[SHAPE_KEY].drop_duplicates())
    fig.suptitle(f"Fuzz problems against flash-attn-4 ({shapes} shapes"
                 + (f", {gpu.iloc[0]}" if len(gpu) else "") + ")")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ratio_bars(ax, d, label, target, what):
    """Bars of `x` per shape (label(row)), one per style; lines at 1 and the target."""
    _grouped_bars(ax, d.assign(shape=d.apply(label, axis=1)), "x", rotation=30)
    ax.axhline(1.0, color="k", linewidth=0.8)
    ax.axhline(target, color="k", linewidth=0.9, linestyle="--", label=f"target {target:g}x")
    ax.set_ylim(0, max(target, d["x"].max()) * 1.15)
    ax.set_ylabel(what)
    ax.grid(True, axis="y", alpha=0.35)
    ax.legend(fontsize=7, loc="upper left")


def plot_fp8(df, path) -> Path | None:
    """fp8 against bf16, per style: the prefill forward's TFLOP/s ratio to its bf16 twin
    (llm-dense, gem-jagged) and the decode's tokens per second with an fp8 cache against
    a bf16 one of the same shape, each with issue 33's target line."""
    good = ok(df)
    pre, dec = fp8_prefill_pairs(good), fp8_decode_pairs(decode_rows(good))
    panels = [p for p in (("prefill", pre), ("decode", dec)) if len(p[1])]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), squeeze=False,
                             figsize=(sum(max(5.0, 0.45 * len(d) + 2) for _, d in panels), 4.6))
    for ax, (kind, d) in zip(axes[0], panels):
        if kind == "prefill":
            _ratio_bars(ax, d, lambda r: (
                f"{r['suite'].split('-')[0]} B{r['batch']} H{r['heads']}/{r['kv_heads']} "
                f"D{r['head_dim']} L{r['max_seqlen_q']} s{r['sparsity']:g}"
                + (" causal" if r["causal"] else "")), FP8_PREFILL_SPEEDUP,
                "fp8 TFLOP/s / bf16 TFLOP/s")
            ax.set_title("prefill forward (e4m3 q, k, v)")
        else:
            _ratio_bars(ax, d, lambda r: decode_shape(r).replace(" fp8", ""), FP8_SPEEDUP,
                        "tokens/s, fp8 cache / bf16 cache")
            ax.set_title("decode (e4m3 cache)")
    gpu = df["gpu"].dropna()
    fig.suptitle("fp8 against bf16, same backend and shape"
                 + (f", {gpu.iloc[0]}" if len(gpu) else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(out_dir) -> list[Path]:
    """Write every chart the CSV has data for; return their paths."""
    out_dir = Path(out_dir)
    every = load(out_dir / "results.csv")
    # the jagged charts are 16-bit: fp8 prefill has a chart of its own (plot_fp8)
    df = every[(every["dtype"] != "fp8") | (every["mode"] == "decode")]
    good = ok(df)
    done = []
    top = gemm_ceiling(out_dir)
    for ps in ("fwd", "bwd"):
        for suite in ("gem-jagged", "gem-jagged-d64", "gem-cross"):
            done.append(_panels(good, suite, ps, "tflops", "TFLOP/s", "Jagged attention",
                                out_dir / f"{suite}_{ps}.png", hline=top,
                                hline_label=top and ceiling_label(top)))
        sp = speedup(df)
        sp = sp[sp["backend"] != "fa4"]
        done.append(_panels(sp, "gem-jagged", ps, "speedup", "speedup over FA4 (x)",
                            "Speedup over flash-attn-4", out_dir / f"speedup_fa4_{ps}.png",
                            hline=1.0))
        done.append(_panels(good, "gem-jagged", ps, "tbps",
                            f"TB/s (least bytes / time; line: {COPY_TBPS} copy)",
                            "Memory throughput", out_dir / f"bandwidth_{ps}.png",
                            hline=COPY_TBPS))
    done.append(_bars(good, "llm-dense", out_dir / "llm_dense.png", "Dense LLM prefill",
                      lambda r: f"B{r.batch} H{r.heads}/{r.kv_heads} D{r.head_dim} "
                                f"L{r.max_seqlen_q}" + (" causal" if r.causal else ""),
                      ceiling=top))
    done.append(_bars(good, "gem-broadcast-q", out_dir / "broadcast_q.png",
                      "Broadcast Q (dense Q shared by the batch) beside a Q per sequence",
                      lambda r: f"Lq{r.max_seqlen_q} Lk{r.max_seqlen_k} s{r.sparsity:g}"
                                + (" shared Q" if r["mode"] == "broadcast_q" else " own Q")))
    done.append(plot_fuzz(df, out_dir / "fuzz.png"))
    done.append(plot_clocks(out_dir, out_dir / "clocks.png"))
    done += plot_decode(df, out_dir)
    done.append(plot_fp8(every, out_dir / "fp8.png"))
    return [p for p in done if p is not None]
