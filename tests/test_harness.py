"""The benchmark harness on the CPU: CSV schema, worker isolation (crash, raise,
wrong numbers), plots, report, line counts, the side-by-side page, flex's block mask,
and an end-to-end `python -m harness bench` through the portable kernel."""
import contextlib
import csv
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from harness import bench, lines
from harness.problems import Problem
from harness.suites import suite

REPO = Path(__file__).resolve().parents[1]

FAKES = '''
import os
import torch
from harness.backends import Backend, register
from harness.oracle import reference


def _ok():
    return True, ""


def _make(kind):
    def make():
        def fn(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, softmax_scale=None,
               broadcast_q=False):
            if kind == "crash":
                os._exit(3)  # like an illegal memory access: the process is gone
            if kind == "raise":
                raise RuntimeError("deliberate failure")
            n = q.shape[0] * (cu_k.shape[0] - 1) if broadcast_q else q.shape[0]
            if kind == "wrong":
                return torch.ones(n, *q.shape[1:], dtype=q.dtype) + 0 * (q.sum() + k.sum() + v.sum())
            # "good": PyTorch in the input dtype, per sequence (the oracle's low-precision run)
            from harness.problems import Inputs
            lq = (cu_q[1:] - cu_q[:-1]).long() if cu_q is not None else torch.full((cu_k.shape[0] - 1,), q.shape[0])
            inp = Inputs(q, k, v, cu_q, cu_k, max_q, max_k, None, lq, (cu_k[1:] - cu_k[:-1]).long())
            return _attend_all(inp, causal, broadcast_q)
        return fn
    return make


def _attend_all(inp, causal, broadcast_q):
    from harness.oracle import _attend
    outs, ck, cq = [], inp.cu_seqlens_k.tolist(), None if broadcast_q else inp.cu_seqlens_q.tolist()
    for b in range(len(ck) - 1):
        qb = inp.q if broadcast_q else inp.q[cq[b]:cq[b + 1]]
        outs.append(_attend(qb, inp.k[ck[b]:ck[b + 1]], inp.v[ck[b]:ck[b + 1]], causal, qb.shape[-1] ** -0.5)[0])
    return torch.cat(outs)


for kind in ("crash", "raise", "wrong", "good"):
    register(Backend("fake-" + kind, _make(kind), _ok, module=__name__))
register(Backend("fake-absent", _make("good"), lambda: (False, "not installed here"), module=__name__))
register(Backend("fake-picky", _make("good"), _ok, lambda p: (False, "no cross attention"), module=__name__))
'''


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    (tmp_path / "harness_fakes.py").write_text(FAKES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    from harness import backends
    import harness_fakes  # noqa: F401  (registers the fakes here; workers import it again)
    return backends


def _sweep(backends, names, problems, out, lanes=1, **kw):
    return bench.sweep([backends.get(n) for n in names], problems, ("fwd", "bwd"),
                       out_dir=out, gpus=[None] * lanes, progress=False, timeout=120, **kw)


def test_sweep_rows_and_schema(fakes, tmp_path):
    p = suite("smoke")[0]
    names = ["fake-crash", "fake-raise", "fake-wrong", "fake-good", "fake-absent", "fake-picky"]
    path = _sweep(fakes, names, [p], tmp_path / "out", lanes=2)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames[:len(bench.COLUMNS)] == bench.COLUMNS
        rows = list(reader)
    status = {(r["backend"], r["pass"]): r for r in rows}
    assert len(rows) == 2 * len(names)
    for ps in ("fwd", "bwd"):
        assert status["fake-crash", ps]["status"] == "error"
        assert "exit code 3" in status["fake-crash", ps]["error"]
        assert status["fake-raise", ps]["status"] == "error"
        assert "deliberate failure" in status["fake-raise", ps]["error"]
        assert status["fake-wrong", ps]["status"] == "fail"
        assert status["fake-wrong", ps]["ms"] == ""  # a wrong backend is never timed
        assert status["fake-absent", ps]["status"] == "unsupported"
        assert "not installed here" in status["fake-absent", ps]["error"]
        assert status["fake-picky", ps]["error"] == "no cross attention"
        good = status["fake-good", ps]
        assert good["status"] == "ok", good["error"]
        assert float(good["ms"]) > 0 and float(good["tflops"]) > 0
        assert good["host_ms"] == ""  # measured on a GPU only
        assert good["gpu"] == "cpu" and good["torch"] == torch.__version__
        assert int(good["total_q"]) == int(p.lengths()[0].sum())


def test_merge_keeps_other_rows(tmp_path):
    p, q = suite("smoke")[:2]
    path = tmp_path / "r.csv"
    bench.merge_rows(path, [bench.row("a", p, "fwd", "ok", ms="1"), bench.row("a", q, "fwd", "ok", ms="2")])
    bench.merge_rows(path, [bench.row("a", p, "fwd", "fail", "bad")])
    rows = bench.read_rows(path)
    assert sorted((r["max_seqlen_q"], r["status"]) for r in rows) == [("33", "ok"), ("40", "fail")]


def test_gpu_slug():
    assert bench.gpu_slug("NVIDIA H200") == "h200"
    assert bench.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert bench.gpu_slug("cpu") == "cpu"


def _fixture_csv(path):
    rows = []
    for p in suite("gem-jagged") + suite("llm-dense") + suite("gem-broadcast-q"):
        p = p.replace(batch=min(p.batch, 4))
        if p.dtype == "fp8":  # forward only, tlx 1.5x its bf16 twin (600 vs 400 dense) at
            # gem-jagged, 1.2x at llm-dense; FA4 refuses
            t = (600.0 if p.suite == "gem-jagged" else 480.0) * (0.5 + p.sparsity / 2)
            rows += [bench.row("tlx", p, "fwd", "ok", ms="1.0", tflops=f"{t:.1f}",
                               host_ms="0.05", out_err="2.0e-02", out_tol="3.0e-02",
                               gpu="NVIDIA H200"),
                     bench.row("tlx", p, "bwd", "unsupported", "fp8 inputs are forward only",
                               gpu="NVIDIA H200"),
                     bench.row("fa4", p, "fwd", "unsupported", "no fp8", gpu="NVIDIA H200")]
            continue
        for b, base in (("tlx", 400.0), ("fa4", 350.0), ("flex", 200.0)):
            for ps in ("fwd", "bwd"):
                t = base * (0.5 + p.sparsity / 2) * (1 if ps == "fwd" else 0.8)
                host = "0.9" if (b, ps, p.max_seqlen_q, p.sparsity) == ("tlx", "bwd", 256, 0.1) else "0.05"
                graph = "0.5" if b == "tlx" else ""  # tlx captured, the others not
                err = dict(out_err="1.0e-02", out_tol="2.0e-02") if ps == "fwd" else {}
                rows.append(bench.row(b, p, ps, "ok", ms="1.0", tflops=f"{t:.1f}", host_ms=host,
                                      graph_ms=graph, gpu="NVIDIA H200", **err))
    rows.append(bench.row("sdpa-flash", suite("gem-jagged")[0].replace(batch=4), "fwd", "unsupported",
                          "takes no mask", gpu="NVIDIA H200"))
    bench.merge_rows(path, rows)


def test_plots_and_report(tmp_path):
    from harness.plots import plot_all
    from harness.report import write_report
    _fixture_csv(tmp_path / "results.csv")
    pngs = plot_all(tmp_path)
    names = {p.name for p in pngs}
    assert {"gem-jagged_fwd.png", "gem-jagged_bwd.png", "speedup_fa4_fwd.png", "llm_dense.png",
            "broadcast_q.png", "bandwidth_fwd.png", "bandwidth_bwd.png", "fp8.png"} <= names
    assert all(p.stat().st_size > 10_000 for p in pngs)
    md = write_report(tmp_path, charts=False).read_text()
    assert "## gem-jagged" in md and "Speedup over FA4" in md
    assert "Memory throughput at sparsity 0.1" in md
    host = md[md.index("Host-bound rows:"):].split("\n\n")[1].splitlines()
    assert len(host) == 3 and host[2].startswith("| tlx | bwd | self B4 H4/4 D128 L256 s0.1 "), host
    assert "| sdpa-flash | unsupported | fwd gem-jagged " in md and "takes no mask" in md
    # graph replay at half the eager time: twice the TFLOP/s and the TB/s, tlx only
    graph = md[md.index("TFLOP/s under CUDA-graph replay"):].split("\n\n")[1].splitlines()
    tflops = md[md.index("TFLOP/s:"):].split("\n\n")[1].splitlines()
    assert graph[0] == "| pass | shape | tlx |"
    eager, replay = tflops[2].split("|"), graph[2].split("|")
    assert replay[1:3] == eager[1:3] and float(replay[3]) == 2 * float(eager[3])
    assert "The same under CUDA-graph replay (TB/s" in md
    # fp8: its own section, each tlx fwd row against its bf16 twin, errors side by side
    fp8 = md[md.index("## fp8 prefill (forward)"):].split("\n\n")[2].splitlines()
    assert len(fp8) == 2 + 12 + 6
    assert fp8[2].startswith("| tlx | gem-jagged | self B4 H4/4 D128 L256 s0.1 fp8 | ")
    assert fp8[2].endswith(" | 1.50 | met | 2.00e-02 (3.0e-02) | 1.00e-02 (2.0e-02) |"), fp8[2]
    assert all(" | 1.20 | missed | " in line for line in fp8 if "llm-dense" in line)
    assert "fp8" not in md[:md.index("## fp8 prefill")].split("## gem-jagged")[1].split("TFLOP/s:")[0]
    # the chart's bars are these ratios
    from harness.plots import fp8_prefill_pairs, load, ok
    pairs = fp8_prefill_pairs(ok(load(tmp_path / "results.csv")))
    assert len(pairs) == 18 and set(pairs["backend"]) == {"tlx"}
    assert sorted(set(pairs["x"].round(2))) == [1.2, 1.5]
    md = write_report(tmp_path, charts=True).read_text()
    fp8 = md[md.index("## fp8 prefill (forward)"):]
    assert "![fp8](fp8.png)" in fp8.split("\n## ")[0]


def test_own_backends_are_the_registrys():
    """The fp8 pairings take the project's own backends: the registry's `own` ones."""
    from harness import backends
    from harness.plots import OWN
    assert set(OWN) == {n for n, b in backends.REGISTRY.items()
                        if getattr(b, "own", False) and not b.experimental}


def test_io_bytes_counts_each_tensor_once():
    """The least bytes of a call, by hand: B2 H4/2 D64 bf16, 30 query rows, 50 key rows."""
    from harness.plots import io_bytes
    r = dict(dtype="bf16", total_q=30, total_k=50, heads=4, kv_heads=2, head_dim=64,
             batch=2, mode="cross")
    q, kv, lse = 30 * 4 * 64 * 2, 2 * 50 * 2 * 64 * 2, 30 * 4 * 4
    assert io_bytes(dict(r, **{"pass": "fwd"})) == 2 * q + kv + lse       # q, k, v in; out
    assert io_bytes(dict(r, **{"pass": "bwd"})) == 4 * q + 2 * kv + lse   # + dout, dq, dk, dv
    # broadcast-Q: one dense Q, an output (and lse) per batch element
    b = dict(r, mode="broadcast_q", **{"pass": "fwd"})
    assert io_bytes(b) == q + kv + 2 * q + 2 * lse


def test_line_counts(tmp_path):
    f = tmp_path / "k.py"
    f.write_text(textwrap.dedent('''\
        """Module docstring,
        two lines."""
        import os  # a comment

        X = 1


        def load_kv(a):
            """Docstring."""
            # comment only
            return (a +
                    1)


        class Kernel:
            def compute(self):
                s = """not a docstring"""
                return s

            def store(self):
                pass

            # the marker wins over the name, and holds for what the method defines
            # role: correction
            @staticmethod
            def rescale(o):
                def helper(x):
                    return x
                return helper(o)
        '''))
    c = lines.count_file(f)
    # code: import, X, def+return(2), class, def compute+2, def store+pass, the marked 5
    assert c["total"] == 16
    assert (c["load"], c["compute"], c["store"], c["correction"], c["other"]) == (3, 3, 2, 5, 3)
    fr = lines.attribute(f)
    assert fr.owner[25] == fr.owner[26] == "correction"  # its comment block belongs to it
    assert fr.counts() == c
    bad = tmp_path / "bad.py"
    bad.write_text("# role: loading\ndef f():\n    pass\n")
    with pytest.raises(ValueError, match="bad.py:1: unknown role 'loading'"):
        lines.count_file(bad)
    rows, missing = lines.count_all()
    assert {r["style"] for r in rows} >= {"tlx", "cute", "core", "portable"}
    assert {r["file"] for r in rows if r["style"] == "core"} >= {"api.py", "tiles.py"}
    assert "| style |" in lines.markdown(rows, missing + ["x: gone.py"])


def _sbs_cells(page):
    """{(style, file, role): count} of the side-by-side page's count tables."""
    cells = re.findall(r'data-style="(\w+)" data-file="([\w.]+)" data-role="(\w+)">([^<]*)<', page)
    return {(st, f, r): n for st, f, r, n in cells}


def test_side_by_side_page(tmp_path):
    """The page of the real kernel files: every common file in two columns, a section per
    role, counts equal to `lines`'s; a file of one style in one column."""
    from harness.sidebyside import pairs, write_side_by_side
    page = write_side_by_side(tmp_path / "side_by_side.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and '<nav class="toc">' in page
    common = [n for n, t, c in pairs() if t and c]
    assert {"fwd_hopper", "bwd_hopper", "schedule", "tile_counter"} <= set(common)
    assert common[:2] == ["fwd_hopper", "bwd_hopper"]
    cells = _sbs_cells(page)
    for name in common:
        assert f'id="{name}"' in page and f'href="#{name}"' in page
        for style, folder, label in (("tlx", "kernels_tlx", "Triton + TLX"),
                                     ("cute", "kernels_cute", "CuteDSL")):
            assert f"{label}: {folder}/{name}.py" in page  # its column
            counts = lines.count_file(REPO / folder / f"{name}.py")
            assert cells[style, f"{name}.py", "total"] == str(counts["total"])
            for role in lines.ROLE_NAMES:
                if counts[role]:
                    assert cells[style, f"{name}.py", role] == str(counts[role])
                    assert f'id="{name}-{role}"' in page


def test_side_by_side_markers_and_one_sided_files(tmp_path):
    """A small tree: roles from markers and names, each run with its line numbers, a
    role one side lacks, and a file only one style has."""
    from harness.sidebyside import page
    (tmp_path / "kernels_tlx").mkdir()
    (tmp_path / "kernels_cute").mkdir()
    (tmp_path / "kernels_tlx" / "fwd_hopper.py").write_text(
        "import x\n\n\ndef load(a):\n    return a\n\n\n# role: compute\ndef f(a):\n"
        "    return a < 1\n")
    (tmp_path / "kernels_cute" / "fwd_hopper.py").write_text(
        "class K:\n    def load(self):\n        pass\n")
    (tmp_path / "kernels_cute" / "fragments.py").write_text("def store(t):\n    pass\n")
    html = page(tmp_path)
    cells = _sbs_cells(html)
    assert cells["tlx", "fwd_hopper.py", "load"] == "2" and cells["cute", "fwd_hopper.py", "load"] == "2"
    assert cells["tlx", "fwd_hopper.py", "compute"] == "2" and cells["cute", "fwd_hopper.py", "compute"] == "0"
    assert cells["tlx", "fwd_hopper.py", "total"] == "5" and cells["cute", "fwd_hopper.py", "total"] == "3"
    assert cells["tlx", "fragments.py", "total"] == "–" and cells["cute", "fragments.py", "store"] == "2"
    assert "lines 8–10" in html and "no lines of this role" in html
    assert "(only CuteDSL)" in html and "no such file" not in html


def test_flex_block_mask_covers_documents():
    pytest.importorskip("torch.nn.attention.flex_attention")
    from harness.backends import document_block_mask
    for p in (Problem(batch=6, heads=1, head_dim=64, max_seqlen_q=300, sparsity=0.5, seed=2),
              Problem(batch=6, heads=1, head_dim=64, max_seqlen_q=300, sparsity=0.9, causal=True),
              Problem(batch=9, heads=1, head_dim=64, max_seqlen_q=40, max_seqlen_k=200,
                      mode="cross", sparsity=0.5, causal=True)):
        lq, lk = p.lengths()
        cq, ck = bench_offsets(lq), bench_offsets(lk)
        nq, nk = int(lq.sum()), int(lk.sum())
        dense = torch.zeros(nq, nk, dtype=torch.bool)
        for b in range(p.batch):
            i = torch.arange(int(lq[b]))[:, None]
            j = torch.arange(int(lk[b]))[None, :]
            vis = (j <= i + int(lk[b]) - int(lq[b])) if p.causal else torch.ones_like(i * j, dtype=torch.bool)
            dense[cq[b]:cq[b + 1], ck[b]:ck[b + 1]] = vis
        bm = document_block_mask(torch.tensor(cq, dtype=torch.int32), torch.tensor(ck, dtype=torch.int32),
                                 nq, nk, p.causal, mask_mod=None)
        blk = 128
        for qb in range(-(-nq // blk)):
            part = set(bm.kv_indices[0, 0, qb, :int(bm.kv_num_blocks[0, 0, qb])].tolist())
            full = set(bm.full_kv_indices[0, 0, qb, :int(bm.full_kv_num_blocks[0, 0, qb])].tolist())
            assert not part & full
            for kb in range(-(-nk // blk)):
                tile = dense[qb * blk:(qb + 1) * blk, kb * blk:(kb + 1) * blk]
                if tile.any():
                    assert kb in part | full, (p.label(), qb, kb)
                if kb in full:
                    assert tile.all(), (p.label(), qb, kb)


def bench_offsets(lengths):
    return [0] + torch.cumsum(lengths, 0).tolist()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU fallback path is what is tested")
def test_cli_bench_smoke_on_cpu(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-m", "harness", "bench", "--suite", "smoke", "--backends",
                        "triton", "--passes", "fwd", "--match", "cross", "--out", str(tmp_path)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "No CUDA GPU" in r.stderr
    rows = bench.read_rows(tmp_path / "results.csv")
    assert [(x["backend"], x["pass"], x["status"], x["mode"]) for x in rows] == [
        ("triton", "fwd", "ok", "cross")], rows   # --match: the smoke suite's one cross problem


@contextlib.contextmanager
def _cpu_inductor():
    """Skip when inductor has no C++ toolchain for CPU code on this machine."""
    try:
        yield
    except Exception as e:
        if "CppCompileError" in type(e).__name__ + str(e)[:200]:
            pytest.skip(f"inductor cannot compile for the CPU here: {str(e)[:120]}")
        raise


# one inductor compile each (most of the time): a causal document mask, and (`-m matrix`)
# Q shared by jagged keys; the block mask's non-causal path is checked against a dense
# mask above
@pytest.mark.parametrize("p", [
    Problem(batch=6, heads=2, head_dim=64, max_seqlen_q=200, sparsity=0.9, dtype="fp16",
            seed=4, causal=True),
    pytest.param(Problem(batch=4, heads=2, head_dim=64, max_seqlen_q=16, max_seqlen_k=150,
                         mode="broadcast_q", sparsity=0.5, dtype="fp16", seed=6),
                 marks=pytest.mark.matrix)], ids=["causal", "broadcast_q"])
def test_flex_forward_on_cpu(p):
    """The flex baseline's forward through torch's CPU FlexAttention (its backward
    needs a GPU): the BlockMask's index tensors must span every KV block, or torch
    misreads the KV extent (a device-side assert on the H200, a lowering error here)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from harness.backends import _flex_make
    from harness.oracle import check
    fn = _flex_make()
    with _cpu_inductor():
        rep = check(p.build(), fn, causal=p.causal, broadcast_q=p.mode == "broadcast_q",
                    backward=False)
    assert rep.ok, f"{p.label()}\n{rep}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_profile_needs_gpu():
    r = subprocess.run([sys.executable, "-m", "harness", "profile", "--match", "Lq256"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "needs a CUDA GPU" in r.stderr


def test_flex_block_mask_is_reused_while_offsets_stay(monkeypatch):
    pytest.importorskip("torch.nn.attention.flex_attention")
    from harness import backends
    built = []
    real = backends._document_mask
    monkeypatch.setattr(backends, "_document_mask", lambda *a: built.append(1) or real(*a))
    fn = backends._flex_make()
    inp = Problem(batch=3, heads=1, head_dim=64, max_seqlen_q=40, sparsity=0.5, dtype="fp16").build()
    calls = [(inp.cu_seqlens_q, inp.cu_seqlens_k), (inp.cu_seqlens_q, inp.cu_seqlens_k),
             (inp.cu_seqlens_q.clone(), inp.cu_seqlens_k)]
    for cq, ck in calls:
        with _cpu_inductor():
            fn(inp.q, inp.k, inp.v, cq, ck, 40, 40)
    assert len(built) == 2  # the same offsets tensors reuse the mask; new ones rebuild it


def test_sanitize_problems_pass_the_portable_kernel_on_cpu():
    """The sanitizer script's causal cross and broadcast-Q problems (zero-length and
    length-1 sequences on either side) run and pass the oracle through the portable
    kernel in the interpreter (the other modes' lengths are among theirs)."""
    from harness.gpu.sanitize import main
    assert main(["--impl", "triton", "--device", "cpu", "--only", "cross causal|Q causal"]) == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of the same code")
def test_profile_runs_gate_then_reports(capsys):
    """harness.gpu.profile on the portable kernel in the interpreter: gate, then one line per
    pass and round (the GPU columns are empty here), and the A/B table last."""
    from harness.gpu.profile import run
    p = Problem(batch=2, heads=2, head_dim=64, max_seqlen_q=20, sparsity=0.5, dtype="fp16")
    lines = run(["triton"], [p], ["fwd", "bwd"], n=1, rounds=2, host=True)
    assert len(lines) == 4 and all("host" in l and "do_bench" in l for l in lines), lines
    # the backward's host time also with autograd's engine on the calling thread
    assert [("on the calling thread" in l) for l in lines] == [" bwd " in l for l in lines]
    out = capsys.readouterr().out
    assert out.count("tottime") == 4  # one cProfile table per line
    assert out.rstrip().splitlines()[-1].split()[:2] == ["triton", "2"]  # A/B table last


def test_ab_summary_means_rounds_against_the_first_backend():
    from harness.gpu.profile import ab_summary
    rec = lambda b, g, t: dict(backend=b, problem="P", pass_="fwd", gpu_ms=g, bench_ms=t)
    lines = ab_summary([rec("tlx", 2.0, 4.0), rec("cute", 1.0, 3.0), rec("triton", 2.0, 4.0),
                        rec("cute", 2.0, 5.0)])
    rows = {l.split()[0]: l.split() for l in lines[3:]}
    assert rows["tlx"][1:] == ["1", "2.000", "4.000"]
    assert rows["cute"][1:] == ["2", "1.500", "-25.0", "%", "4.000", "+0.0", "%"]
    assert rows["triton"][1:] == ["1", "2.000", "+0.0", "%", "4.000", "+0.0", "%"]
    # the replayed column, where every round of a backend had a graph
    rec2 = lambda b, g: dict(backend=b, problem="P", pass_="bwd", gpu_ms=1.0, bench_ms=1.0,
                             graph_ms=g)
    lines = ab_summary([rec2("tlx", 0.2), rec2("fa4", 0.15), rec2("fa4", 0.25),
                        rec2("cute", None)])
    rows = {l.split()[0]: l.split() for l in lines[3:]}
    assert rows["tlx"][-1] == "0.2000" and rows["fa4"][-3:] == ["0.2000", "+0.0", "%"]
    assert rows["cute"][-1] == "%"  # no replayed figure: the row ends at do_bench's change


def test_ncu_sass_regions(tmp_path):
    """harness.gpu.ncu_sass splits an ncu SASS page into runs of equal execution count and
    reports each run's share of the samples and its stall mix per issued instruction."""
    from harness.gpu.ncu_sass import hottest, regions
    hdr = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
           "stall_wait", "stall_selected", "stall_barrier", "stall_wait (Not Issued)"]
    rows = [["0x0", "  LDC R1, c[0x0][0x28]", "10", "8", "5", "5", "0", "9"],
            ["0x10", "  HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ", "30", "64", "10", "10", "10", "9"],
            ["0x20", "  @!P0  BRA 0x0", "60", "64", "0", "20", "40", "9"]]
    path = tmp_path / "page.csv"
    path.write_text('"Kernel Name","k",\n' + "\n".join(
        ",".join(f'"{c}"' for c in r) for r in [hdr] + rows) + "\n")
    out = regions(str(path), min_pct=0)
    assert out[0].endswith("3 instructions, 100 samples")
    loop = out[2]
    assert "2 instr" in loop and "exec       64" in loop and " 90.0 %" in loop, loop
    assert "barrier 1.67" in loop and "selected 1.00" in loop and "HGMMA" in loop, loop
    # the hottest two, in address order, each with its own stall mix
    hot = hottest(str(path), 2)
    assert [h.split()[:2] for h in hot] == [["1", "30"], ["2", "60"]], hot
    assert "barrier 40, selected 20" in hot[1] and hot[1].endswith("| @!P0 BRA 0x0"), hot


def test_ncu_sass_per_iteration(tmp_path):
    """`ncu_sass steps`: a loop's cycles an iteration from the elapsed cycles and its
    executions over the resident CTAs' warps (SMs x CTAs an SM, at most the grid), and its
    stall mix as shares of the loop's samples in those cycles."""
    from harness.gpu.ncu_sass import per_iteration
    hdr = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
           "stall_wait", "stall_selected", "stall_barrier"]
    rows = [["0x0", "  LDC R1, c[0x0][0x28]", "10", "8", "5", "5", "0"],
            ["0x10", "  HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ", "30", "1,280", "10",
             "10", "10"],
            ["0x20", "  @!P0  BRA 0x10", "70", "1,280", "0", "20", "40"]]
    sass = tmp_path / "rep_sass.csv"
    sass.write_text('"Kernel Name","k",\n' + "\n".join(
        ",".join(f'"{c}"' for c in r) for r in [hdr] + rows) + "\n")
    details = tmp_path / "rep_details.csv"
    metrics = [("Elapsed Cycles", "4,000"), ("Grid Size", "100"), ("# SMs", "2"),
               ("Block Limit Registers", "1"), ("Block Limit Shared Mem", "2"),
               ("Block Limit Warps", "5"), ("Block Limit SM", "32")]
    details.write_text("\n".join(",".join(f'"{c}"' for c in r) for r in
                                  [["ID", "Section Name", "Metric Name", "Metric Unit",
                                    "Metric Value"]] +
                                  [["0", "s", m, "", v] for m, v in metrics]) + "\n")
    # 2 SMs x 1 CTA (registers) resident, 4 warps each: 1280 / 8 = 160 iterations a warp,
    # 4000 / 160 = 25 cycles each; 100 samples in the loop: barrier 50, selected 30, wait 10
    out = per_iteration(str(sass), str(details), 1, 4)
    assert out == ["[1,3) 2 instr, 160 iterations a warp slot, 25 cycles an iteration: "
                   "barrier 12, selected 8, wait 2"], out


def test_ncu_run_command_and_headline(tmp_path):
    """`ncu_sass run` profiles each backend's main kernel of the pass (by name, after the
    gate's and warm-up's launches) under `harness profile`, and reads the headline
    metrics of the details page by name."""
    from harness.gpu.ncu_sass import KERNELS, SKIP, headline, ncu_command
    cmd = ncu_command("cute", "bwd", "fuzz", "B2 H8/2 D64 Lq16384", "out/cute_bwd")
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:BwdMain"
    assert cmd[cmd.index("--launch-skip") + 1] == str(SKIP)
    assert cmd[cmd.index("-o") + 1] == "out/cute_bwd"
    assert "MemoryWorkloadAnalysis" in cmd  # the L2 hit rate
    tail = cmd[cmd.index("harness"):]
    assert tail[:2] == ["harness", "profile"] and tail[tail.index("--match") + 1] == \
        "B2 H8/2 D64 Lq16384" and tail[tail.index("--passes") + 1] == "bwd", cmd
    assert {b for b, _ in KERNELS} == {"tlx", "cute", "fa4"}
    assert {ps for _, ps in KERNELS} == {"fwd", "bwd"}
    # an experiment profiles its style's kernel
    cmd = ncu_command("tlx-x", "bwd", "fuzz", "B2", "out/x")
    assert cmd[cmd.index("--kernel-name") + 1] == "regex:" + KERNELS["tlx", "bwd"]
    page = tmp_path / "details.csv"
    rows = [["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"],
            ["0", "k", "GPU Speed Of Light Throughput", "Duration", "ms", "5.06"],
            ["0", "k", "GPU Speed Of Light Throughput", "SM Frequency", "Ghz", "1.61"],
            ["0", "k", "Memory Workload Analysis", "L2 Hit Rate", "%", "71.2"],
            ["0", "k", "Warp State Statistics", "Warp Cycles Per Issued Instruction", "cycle",
             "7.9"],
            ["0", "k", "Launch Statistics", "Grid Size", "", "132"]]
    # ncu 2025's header ends in rule columns that only rule rows fill
    rows[0] += ["Rule Name", "Rule Type"]
    rows.append(["0", "k", "Occupancy", "", "", "", "Rule", "OPT"])
    page.write_text('==PROF== note\n' + "\n".join(",".join(f'"{c}"' for c in r)
                                                  for r in rows) + "\n")
    assert headline(str(page)) == ["Duration: 5.06 ms", "SM Frequency: 1.61 Ghz",
                                   "L2 Hit Rate: 71.2 %",
                                   "Warp Cycles Per Issued Instruction: 7.9 cycle"]


def test_match_alternatives():
    """`--match a|b` keeps problems whose label contains either part; "" keeps all."""
    from harness.__main__ import matches
    from harness.suites import suite
    jag = suite("gem-jagged")
    picked = [p for p in jag if matches(p, "Lq256 Lk256 s0.5|Lq2048 Lk2048 s0.9")]
    assert [(p.max_seqlen_q, p.sparsity, p.dtype) for p in picked] == \
        [(256, 0.5, "bf16"), (2048, 0.9, "bf16"), (256, 0.5, "fp8"), (2048, 0.9, "fp8")]
    assert len([p for p in jag if matches(p, "Lq256 Lk256 s0.5 bf16")]) == 1
    assert all(matches(p, "") for p in jag) and not any(matches(p, "nope") for p in jag)


def test_clocks_parses_samples_and_needs_a_gpu():
    """`harness clocks` reads nvidia-smi's csv lines (skipping anything else) and, on a
    machine without a GPU, stops with a message rather than a traceback."""
    from harness.gpu.clocks import parse
    assert parse("1582, 691.23, 60, 0x0000000000000004\n") == (1582.0, 691.23, 60.0,
                                                                  "0x0000000000000004")
    assert parse("[N/A], [N/A], 60, 0x0") is None and parse("") is None
    if torch.cuda.is_available():
        return
    from harness.__main__ import main
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        main(["clocks", "--match", "B8 H16/16 D128"])


def test_clocks_rows_round_trip_and_chart(tmp_path):
    """A printed `clocks` line reads back as its row (a run made without --out), rows
    append to clocks.csv, and the chart keeps the last row per (backend, pass, problem)
    of the default build."""
    from harness.gpu.clocks import append_rows, line, read_log
    from harness.plots import latest_clocks, plot_clocks
    m = dict(tflops=569.2, mhz=1538.0, watts=692.0, temp_c=64.0, at_boost=733.0, calls=515,
             samples=20, reasons="0x0000000000000004")
    label = "self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16 causal"
    log = tmp_path / "clocks.log"
    log.write_text("\n".join([line("tlx", label, m), "a warning line",
                              line("cute", label, m), line("tlx", label, m) + " [an A/B variant]",
                              line("fa4", label, "not run: fail wrong")]))
    rows = read_log(log, "abc1234")
    assert [(r["backend"], r["variant"]) for r in rows] == [("tlx", ""), ("cute", ""),
                                                            ("tlx", "an A/B variant")]
    assert all(r[k] == v for r in rows for k, v in m.items())
    assert [r["pass"] for r in rows] == ["fwd"] * 3
    csv_path = tmp_path / "clocks.csv"
    append_rows(csv_path, rows[:2])
    append_rows(csv_path, [dict(rows[0], tflops=600.0), rows[2]])
    d = latest_clocks(tmp_path)
    assert len(d) == 2 and sorted(d["tflops"]) == [569.2, 600.0]
    log.write_text(line("tlx", label, m, ps="bwd"))
    bwd = read_log(log, "abc1234")
    assert [r["pass"] for r in bwd] == ["bwd"] and bwd[0]["problem"] == label
    append_rows(csv_path, bwd)
    d = latest_clocks(tmp_path)
    assert len(d) == 3 and sorted(d["pass"]) == ["bwd", "fwd", "fwd"]
    assert plot_clocks(tmp_path, tmp_path / "clocks.png").stat().st_size > 0


def test_gemm_ceiling_row_reads_back_for_the_charts(tmp_path):
    """`harness clocks --gemm` prints its row like any other; read back from the log into
    clocks.csv, its TFLOP/s is the ceiling the TFLOP/s charts draw (the latest gemm row;
    None before one was measured)."""
    from harness.gpu.clocks import GEMM_PROBLEM, append_rows, line, read_log
    from harness.plots import ceiling_label, gemm_ceiling
    assert gemm_ceiling(tmp_path) is None
    m = dict(tflops=681.3, mhz=1485.0, watts=685.0, temp_c=60.0, at_boost=908.4, calls=1400,
             samples=20, reasons="0x0000000000000004")
    log = tmp_path / "clocks.log"
    log.write_text("\n".join([line("gemm", GEMM_PROBLEM, m),
                              line("tlx", "self B8 H16/16 D128 Lq8192 Lk8192 s1 bf16",
                                   dict(m, tflops=645.7))]))
    rows = read_log(log, "abc1234")
    assert [(r["backend"], r["problem"]) for r in rows][0] == ("gemm", GEMM_PROBLEM)
    append_rows(tmp_path / "clocks.csv", rows)
    assert gemm_ceiling(tmp_path) == 681.3
    append_rows(tmp_path / "clocks.csv", [dict(rows[0], tflops=690.0)])
    assert gemm_ceiling(tmp_path) == 690.0 and ceiling_label(690.0).endswith("(690)")


def test_report_states_the_gemm_share(tmp_path):
    """With a sustained GEMM measured, each suite's TFLOP/s table has its share of it."""
    from harness.gpu.clocks import GEMM_PROBLEM, append_rows, line, read_log
    from harness.report import write_report
    _fixture_csv(tmp_path / "results.csv")
    assert "Share of the sustained bf16 GEMM" not in write_report(tmp_path, charts=False) \
        .read_text()
    m = dict(tflops=600.0, mhz=1485.0, watts=685.0, temp_c=60.0, at_boost=800.0, calls=1400,
             samples=20, reasons="0x0000000000000004")
    log = tmp_path / "clocks.log"
    log.write_text(line("gemm", GEMM_PROBLEM, m))
    append_rows(tmp_path / "clocks.csv", read_log(log, "abc1234"))
    md = write_report(tmp_path, charts=False).read_text()
    sec = md[md.index("## gem-jagged"):]
    tflops = sec[sec.index("TFLOP/s:"):].split("\n\n")[1].splitlines()
    share = sec[sec.index("Share of the sustained bf16 GEMM (600 TFLOP/s"):].split("\n\n")[1] \
        .splitlines()
    assert tflops[:2] == share[:2] and len(tflops) == len(share)
    for t, p in zip(tflops[2:], share[2:]):
        for a, b in zip(t.split("|")[3:-1], p.split("|")[3:-1]):
            assert (a.strip() == b.strip() == "–") or round(float(a) / 6) == int(b), (t, p)


def test_fp8_problem_runs_forward_only_and_baselines_dequantize():
    """An fp8 problem: the bwd row is `unsupported` saying why (not an error); ours gets
    the descales, a baseline (here the portable kernel posing as one) q, k, v
    dequantized to bf16; FA4 refuses fp8."""
    from harness import backends, bench
    p = Problem(batch=3, heads=4, kv_heads=2, head_dim=64, max_seqlen_q=24, sparsity=0.5,
                causal=True, dtype="fp8", suite="smoke")
    ours = backends.get("triton")
    seen = []

    def spy(q, k, v, *a, **kw):
        seen.append((q.dtype, sorted(kw)))
        return ours.fn()(q, k, v, *a, **kw)[0]
    base = backends.Backend("fp8-baseline", lambda: spy, ours.available)
    rows = bench.run_problem(base, base.fn(), p, ["fwd", "bwd"], gate_batch=0, timing=False)
    by = {r["pass"]: r for r in rows}
    assert by["fwd"]["status"] == "ok", by["fwd"]["error"]
    assert by["bwd"]["status"] == "unsupported" and "forward only" in by["bwd"]["error"]
    assert by["fwd"]["dtype"] == "fp8"
    assert seen and all(dt == torch.bfloat16 and "q_descale" not in kw for dt, kw in seen)
    assert backends.get("fa4").supports(p)[0] is False
    assert backends.get("fa4").supports(p.replace(dtype="bf16"))[0] is True
    # ours: the styles with an fp8 forward for the device's kernels take it (cute and
    # tlx: Hopper's); the others' rows say why not
    from jagged import dispatch
    for arch, hopper in (("hopper", True), ("blackwell", False), (None, False)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(dispatch, "kernel_arch", lambda device=None: arch)
            for style in ("cute", "tlx"):
                ok, why = backends.get(style).supports(p)
                assert ok is hopper and (ok or "for hopper only" in why), (style, why)
                assert backends.get(style).supports(p.replace(dtype="bf16"))[0]
            assert backends.get("triton").supports(p) == (True, "")
            mp.delitem(dispatch.FP8_ARCHS, "cute")  # a style without one: "no fp8 forward"
            ok, why = backends.get("cute").supports(p)
            assert not ok and "no fp8 forward" in why


def test_fp8_gemm_ceiling_operands_and_row(tmp_path):
    """The fp8 GEMM row: e4m3 A row-major, B column-major, unit fp32 scales, bf16 out
    equal to the float product of the e4m3 values (CPU `_scaled_mm`); its clocks line
    reads back as backend gemm-fp8 and leaves the charts' (bf16) ceiling alone."""
    from harness.gpu.clocks import GEMM_PROBLEM, append_rows, line, read_log
    from harness.gpu.fp8_gemm import GEMM8_PROBLEM, matmul, operands
    from harness.plots import gemm_ceiling
    a, b, sa, sb = operands(64, "cpu")
    assert a.dtype == b.dtype == torch.float8_e4m3fn and a.stride() == (64, 1) and b.stride() == (1, 64)
    assert sa.shape == () and sa.dtype == torch.float32
    y = matmul(a, b, sa, sb)
    ref = a.double() @ b.double()
    assert y.dtype == torch.bfloat16
    assert float((y.double() - ref).abs().max()) <= float(ref.abs().max()) * 2 ** -7
    m = dict(tflops=681.3, mhz=1485.0, watts=685.0, temp_c=60.0, at_boost=908.4, calls=1400,
             samples=20, reasons="0x0000000000000004")
    log = tmp_path / "clocks.log"
    log.write_text("\n".join([line("gemm", GEMM_PROBLEM, m),
                              line("gemm-fp8", GEMM8_PROBLEM, dict(m, tflops=1250.0))]))
    rows = read_log(log, "abc1234")
    assert [(r["backend"], r["problem"], r["tflops"]) for r in rows][1] == \
        ("gemm-fp8", GEMM8_PROBLEM, 1250.0)
    append_rows(tmp_path / "clocks.csv", rows)
    assert gemm_ceiling(tmp_path) == 681.3


def test_compare_folders(tmp_path):
    """`harness compare A B`: per problem, each backend against FA4 in its own folder
    (eager / replayed) and, in B, against A's row; a backend missing from a folder is
    left out, a failed row has no ratio."""
    from harness.bench import merge_rows
    from harness.compare import compare
    problem = dict(suite="fuzz", mode="self", causal=True, dtype="bf16", batch=4, heads=8,
                   kv_heads=2, head_dim=128, max_seqlen_q=512, max_seqlen_k="",
                   sparsity=0.5, seed=1, gpu="H200")

    def row(be, ms, graph, status="ok"):
        return dict(problem, backend=be, status=status, ms=ms, graph_ms=graph, host_ms=0.1,
                    **{"pass": "fwd"})

    merge_rows(tmp_path / "a" / "results.csv", [row("fa4", 2.0, 1.0), row("tlx", 1.0, 1.0),
                                                row("cute", 1.0, 1.0, "fail")])
    merge_rows(tmp_path / "b" / "results.csv", [row("fa4", 2.2, 1.0), row("tlx", 0.8, 0.5)])
    lines = compare([tmp_path / "a", tmp_path / "b"])
    assert lines[0] == "fwd fuzz self B4 H8/2 D128 Lq512 Lk512 s0.5 bf16 causal"
    i = lines.index("summary: time against a, geometric mean over the problems (eager / "
                    "replayed)")
    # the summary: the timed pairs only (cute failed in a, is missing in b)
    assert lines[i + 1:] == ["  tlx    b:  -20.0 % /  -50.0 %  (1 problems)",
                             "  fa4    b:  +10.0 % /   +0.0 %  (1 problems)"]
    lines = lines[:i]
    body = {tuple(l.split()[:2]): l for l in lines[1:]}
    assert set(body) == {("tlx", "a"), ("tlx", "b"), ("cute", "a"), ("fa4", "a"), ("fa4", "b")}
    assert "x FA4  2.00 /  1.00" in body["tlx", "a"] and "vs" not in body["tlx", "a"]
    assert "x FA4  2.75 /  2.00" in body["tlx", "b"]
    assert "vs a:  -20.0 % /  -50.0 %" in body["tlx", "b"]
    assert "x FA4" not in body["cute", "a"]
    assert "vs a:  +10.0 % /   +0.0 %" in body["fa4", "b"]


def test_experimental_backends_run_only_when_named(monkeypatch):
    """An experiment (`backends._experiment`, registered `experimental`) is never in "all",
    and a tool that keeps every backend in one process refuses it beside another one."""
    from harness import backends
    from harness.__main__ import _one_process
    make, avail = backends._experiment("tlx", lambda: None)
    monkeypatch.setitem(backends.REGISTRY, "tlx-x", backends.Backend(
        "tlx-x", make, avail, own=True, experimental=True))
    assert "tlx-x" not in backends.names() and "tlx-x" in backends.names(experimental=True)
    _one_process("profile", ["tlx-x"])
    _one_process("profile", ["cute", "tlx"])
    with pytest.raises(SystemExit, match="experimental"):
        _one_process("profile", ["tlx", "tlx-x"])


@pytest.mark.gpu
def test_graph_time_ms_after_a_reset_pool():
    """graph_time_ms captures again after a graph whose pool a tensor outlives (as a
    cached tile list made during capture does): three captures in a row, each timed."""
    import torch
    from harness.bench import _free, graph_time_ms
    x = torch.randn(1 << 20, device="cuda")
    keep = []
    for _ in range(3):
        why = []
        assert graph_time_ms(lambda: keep.append(x * 2), True, why=why) is not None, why
        _free()
