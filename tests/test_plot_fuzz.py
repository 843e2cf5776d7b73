"""The fuzz chart (`harness.plots.plot_fuzz`) and the report's fuzz verdicts, on a small
synthetic results table: one point per (style, problem, pass, eager / replayed)."""
import matplotlib.pyplot as plt
import pandas as pd

from harness import plots
from harness.report import _fuzz_summary


def _rows():
    rows = []
    for i, (fa_ms, ours_ms) in enumerate(((0.1, 0.05), (1.0, 2.0))):
        for backend, ms in (("fa4", fa_ms), ("tlx", ours_ms)):
            for ps in ("fwd", "bwd"):
                rows.append(dict(backend=backend, suite="fuzz", mode="self", causal=False,
                                 dtype="bf16", batch=4 + i, heads=2, kv_heads=2, head_dim=64,
                                 max_seqlen_q=128, max_seqlen_k=128, sparsity=0.5,
                                 status="ok", tflops=1.0 / ms, ms=ms, graph_ms=ms / 2,
                                 graph_tflops=2.0 / ms, gpu="H200", **{"pass": ps}))
    return pd.DataFrame(rows)


def test_fuzz_chart_and_verdicts(tmp_path):
    df = _rows()
    path = plots.plot_fuzz(df, tmp_path / "fuzz.png")
    assert path == tmp_path / "fuzz.png" and path.stat().st_size > 10_000
    assert plots.plot_fuzz(df.assign(suite="gem-jagged"), tmp_path / "none.png") is None
    # one pass run: one panel, so about half the width
    bwd = plots.plot_fuzz(df[df["pass"] == "bwd"], tmp_path / "bwd.png")
    both, one = (plt.imread(x) for x in (path, bwd))
    assert one.shape[1] < 0.6 * both.shape[1], (one.shape, both.shape)
    for col in ("tflops", "graph_tflops"):
        sp = plots.speedup(df, col=col)
        md = _fuzz_summary(sp[sp["backend"] != "fa4"], df)
        tlx = [ln for ln in md if ln.startswith("| tlx | fwd")]
        # ratios 2.0 and 0.5: geometric mean 1.00, worst 0.50 on the 1 ms problem
        assert tlx and "| 1.00 | 0.50 |" in tlx[0] and "missed" in tlx[0], md
