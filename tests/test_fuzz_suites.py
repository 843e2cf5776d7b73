import argparse

import pytest
import torch

import harness.__main__ as cli
from harness.problems import (FUZZ_TOKENS, MODES, VARLEN_LLM_MIN, fuzz_problems, fuzz_tokens,
                              suites)
from harness.suites import suite


def test_varlen_llm_packed_causal_gqa_batches():
    ps = suite("varlen-llm")
    assert 8 <= len(ps) <= 12
    assert {p.head_dim for p in ps} == {64, 128}
    assert {p.heads // p.hkv for p in ps} == {4, 8}
    for p in ps:
        assert p.causal and p.mode == "self" and p.dtype == "bf16" and p.suite == "varlen-llm"
        lq, lk = p.lengths()
        assert torch.equal(lq, lk)
        assert lq.min() >= VARLEN_LLM_MIN and lq.max() <= p.max_seqlen_q <= 16384
        assert 32768 <= int(lq.sum()) <= 65536
    # a few to a few dozen sequences per batch
    assert min(p.batch for p in ps) <= 5 and max(p.batch for p in ps) >= 20


def test_fuzz_suite_is_forty_at_seed_zero():
    assert suites()["fuzz"] == fuzz_problems(40, 0) == suite("fuzz")
    assert len(suite("fuzz")) == 40


def test_fuzz_deterministic_per_seed_and_seeds_differ():
    assert fuzz_problems(20, 7) == fuzz_problems(20, 7)
    assert fuzz_problems(20, 7) != fuzz_problems(20, 8)
    assert fuzz_problems(5, 7) == fuzz_problems(20, 7)[:5]


def test_fuzz_draws_span_the_axes_within_the_token_cap():
    ps = fuzz_problems(200, 1)
    assert {p.mode for p in ps} == set(MODES)
    assert {p.dtype for p in ps} == {"bf16", "fp16"}
    assert {p.head_dim for p in ps} == {64, 128}
    assert {p.causal for p in ps} == {False, True}
    assert len({p.sparsity for p in ps}) > 3 and len({p.heads // p.hkv for p in ps}) > 2
    for p in ps:
        assert p.suite == "fuzz" and p.heads % p.hkv == 0 and p.heads <= 32
        assert p.batch == 1 or fuzz_tokens(p) <= FUZZ_TOKENS
        lq, lk = p.lengths()
        assert lq.max() <= p.max_seqlen_q and lk.max() <= p.max_k


@pytest.mark.parametrize("seed", [0, 3])
def test_fuzz_problems_build_on_cpu_at_a_tiny_cut(seed):
    for p in fuzz_problems(40, seed):
        small = p.replace(batch=min(p.batch, 3), max_seqlen_q=min(p.max_seqlen_q, 16))
        lq, lk = small.lengths()
        inp = small.build(lengths=(lq.clamp(max=16), lk.clamp(max=16)))
        assert inp.q.dtype == p.torch_dtype and inp.k.shape[1:] == (p.hkv, p.head_dim)
        assert inp.q.shape[1] == p.heads


def test_bench_fuzz_seed_and_count_options(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "cmd_sweep", lambda a, timing: seen.append(a))
    cli.main(["bench", "--suite", "fuzz", "--fuzz-seed", "5", "--fuzz-n", "7"])
    a = seen[0]
    assert (a.fuzz_seed, a.fuzz_n) == ("5", 7)
    assert cli._suite("fuzz", a) == fuzz_problems(7, 5)
    a.fuzz_seed = "5,2"  # several seeds: their problems in turn
    assert cli._suite("fuzz", a) == fuzz_problems(7, 5) + fuzz_problems(7, 2)
    assert cli._suite("smoke", a) == suite("smoke")
    with pytest.raises(SystemExit):  # argparse's usage error, not a traceback
        cli.main(["bench", "--suite", "fuzz", "--fuzz-seed", "5,x"])
    d = argparse.Namespace(fuzz_seed=0, fuzz_n=40)
    assert cli._suite("fuzz", d) == suite("fuzz")


def test_report_fuzz_summary_geomean_and_worst(tmp_path):
    from harness import bench
    from harness.report import write_report
    ps = fuzz_problems(6, 2)
    rows = []
    for i, p in enumerate(ps):
        for ps_ in ("fwd", "bwd"):
            rows.append(bench.row("fa4", p, ps_, "ok", ms="1.0", tflops="100.0", host_ms="0.01",
                                  gpu="NVIDIA H200"))
            ratio = 0.5 if (i, ps_) == (3, "bwd") else 2.0  # one slow problem in the bwd
            rows.append(bench.row("tlx", p, ps_, "ok", ms="1.0", tflops=f"{100 * ratio:.1f}",
                                  host_ms="0.01", gpu="NVIDIA H200"))
    bench.merge_rows(tmp_path / "results.csv", rows)
    md = write_report(tmp_path, charts=False).read_text()
    lines = {ln.split(" | ")[1]: ln for ln in md.splitlines() if ln.startswith("| tlx | ")
             and ln.endswith(("met |", "missed |"))}
    geo_bwd = 2.0 ** (5 / 6) * 0.5 ** (1 / 6)
    assert "| 6/6 | 2.00 | 2.00 |" in lines["fwd"] and lines["fwd"].endswith("| met |")
    assert f"| 6/6 | {geo_bwd:.2f} | 0.50 |" in lines["bwd"]
    assert ps[3].mode in lines["bwd"] and lines["bwd"].endswith("| missed |")
    assert "worst >= 0.95x, geometric mean >= 1.15x" in md
