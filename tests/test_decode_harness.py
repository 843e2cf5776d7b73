"""The decode (KV-cache) harness on the CPU: problem building, the reference against a
direct float64 computation, the oracle's verdicts, the suite's cells, the worker path
through `bench.sweep`, and the CSV columns, charts and report section on fake rows;
fp8: the quantized problems, the oracle on the dequantized values, the baselines' fp8
handling and ours in the interpreter."""
import dataclasses
import math
import os

import pytest
import torch

from harness import bench, decode
from harness.decode import DecodeProblem

TINY = dict(batch=4, heads=4, kv_heads=2, head_dim=16, cache_len=40, dtype="fp16")


def test_build_lengths_and_shuffled_pages():
    p = DecodeProblem(**TINY, len_q=3, page_size=8, packed_q=True, sparsity=0.5, seed=5)
    inp = p.build()
    lq, lk = p.lengths()
    assert torch.equal(inp.lengths_q, lq) and torch.equal(inp.lengths_k, lk)
    assert inp.cache_seqlens.dtype == torch.int32 and inp.cache_seqlens.tolist() == lk.tolist()
    assert (lk >= lq).all() and (lq >= 1).all() and (lq <= 3).all() and (lk <= 40).all()
    assert inp.cu_seqlens_q.tolist() == [0] + lq.cumsum(0).tolist()
    assert inp.q.shape == (int(lq.sum()), 4, 16) and inp.max_seqlen_q == int(lq.max())
    table, pages = inp.page_table, inp.k_cache.shape[0]
    assert table.dtype == torch.int32 and table.shape == (4, 5)  # 40 keys / 8 per page
    assert inp.k_cache.shape[1:] == (8, 2, 16) and inp.v_cache.shape == inp.k_cache.shape
    assert ((table >= 0) & (table < pages)).all()
    used = torch.cat([table[b, :-(-int(n) // 8)] for b, n in enumerate(lk)])
    assert len(set(used.tolist())) == len(used)          # no page shared by two sequences
    assert pages == len(used) + max(2, len(used) // 16)  # a pool a bit larger than needed
    assert used.tolist() != sorted(used.tolist())        # pages shuffled in the pool
    assert not (inp.k_cache == 0).any() and torch.isfinite(inp.v_cache).all()
    again = p.build()
    assert torch.equal(again.k_cache, inp.k_cache) and torch.equal(again.page_table, table)
    nan = p.build(unused=float("nan"))  # NaN exactly in the slots no sequence uses
    assert int(nan.k_cache[..., 0, 0].isnan().sum()) == pages * 8 - int(lk.sum())
    assert torch.equal(torch.cat([decode.gather_kv(nan, b)[1] for b in range(4)]),
                       torch.cat([decode.gather_kv(inp, b)[1] for b in range(4)]))


def test_gather_follows_the_page_table():
    p = DecodeProblem(**TINY, page_size=3, sparsity=0.5)
    inp = p.build()
    for b, n in enumerate(inp.lengths_k.tolist()):
        k, v = decode.gather_kv(inp, b)
        assert k.shape == (n, 2, 16)
        for j in range(n):
            page = int(inp.page_table[b, j // 3])
            assert torch.equal(k[j], inp.k_cache[page, j % 3])
            assert torch.equal(v[j], inp.v_cache[page, j % 3])
    c = DecodeProblem(**TINY, sparsity=0.5).build()
    assert c.page_table is None and c.k_cache.shape == (4, 40, 2, 16)
    assert torch.equal(decode.gather_kv(c, 1)[0], c.k_cache[1, :int(c.lengths_k[1])])


def test_bytes_and_flops():
    p = DecodeProblem(batch=8, heads=32, kv_heads=8, head_dim=128, cache_len=32768)
    assert p.kv_bytes() == 8 * 32768 * 8 * 128 * 2 * 2  # 2 tensors, bf16
    assert p.flops() == 4 * 32 * 128 * 8 * 32768        # one row sees every key
    q = p.replace(len_q=4, causal=True)                 # bottom-right: 4 rows see n-3 .. n
    assert q.pairs() == 8 * (4 * 32768 - 6)
    assert q.replace(causal=False).pairs() == 8 * 4 * 32768
    paged = p.replace(page_size=16)
    pages = 8 * 2048
    assert paged.cache_bytes() == (pages + pages // 16) * 16 * 8 * 128 * 4
    assert decode.problem_of(decode.cols(paged)) == paged.replace(suite="")


def _direct(inp, causal, scale):
    """Attention by its definition in float64, one (sequence, head, row) at a time."""
    H = inp.q.shape[-2]
    q = inp.q.reshape(-1, H, inp.q.shape[-1]).double()
    out, lse = torch.zeros_like(q), torch.full((H, q.shape[0]), -math.inf, dtype=torch.float64)
    r = 0
    for b in range(len(inp.lengths_k)):
        nq, nk = int(inp.lengths_q[b]), int(inp.lengths_k[b])
        for j in range(nq):
            for h in range(H):
                hk = h // (H // inp.k_cache.shape[-2])
                keys = [t for t in range(nk) if not causal or t <= j + nk - nq]
                if not keys:
                    continue
                ks, vs = [], []
                for t in keys:
                    if inp.page_table is None:
                        ks.append(inp.k_cache[b, t, hk]), vs.append(inp.v_cache[b, t, hk])
                    else:
                        pg = int(inp.page_table[b, t // inp.page_size])
                        ks.append(inp.k_cache[pg, t % inp.page_size, hk])
                        vs.append(inp.v_cache[pg, t % inp.page_size, hk])
                s = torch.stack(ks).double() @ q[r + j, h] * scale
                lse[h, r + j] = torch.logsumexp(s, 0)
                out[r + j, h] = torch.softmax(s, 0) @ torch.stack(vs).double()
        r += nq
    return out, lse


@pytest.mark.parametrize("kw", [
    dict(page_size=3, len_q=3, packed_q=True, sparsity=0.5),
    dict(page_size=0, len_q=4, causal=True),
    dict(page_size=5, len_q=2, causal=False),
])
def test_reference_against_float64_definition(kw):
    p = DecodeProblem(**{**TINY, "cache_len": 9, **kw})
    lens = None
    if kw.get("len_q") == 4:  # a zero-length cache and one shorter than the rows
        lens = ([4, 4, 4, 4], [0, 2, 9, 5])
    inp = p.build(lengths=lens)
    ref = decode.reference(inp, causal=p.causal)
    out, lse = _direct(inp, p.causal, 16 ** -0.5)
    if inp.cu_seqlens_q is None:
        B, L = inp.q.shape[:2]
        out, lse = out.reshape(B, L, 4, 16), lse.reshape(4, B, L).permute(1, 0, 2)
    assert ref["out"].dtype == torch.float64 and ref["out"].shape == out.shape
    torch.testing.assert_close(ref["out"], out, rtol=0, atol=1e-12)
    torch.testing.assert_close(ref["lse"], lse.float(), rtol=1e-6, atol=1e-6)
    if lens:  # rows with no key: out 0, lse -inf
        assert (ref["out"][0] == 0).all() and (ref["lse"][0] == -math.inf).all()
        assert (ref["lse"][1, :, :2] == -math.inf).all()
        assert (ref["lse"][1, :, 2:] > -math.inf).all()


def _lowp(inp, p):
    """A backend computing in the input dtype (what the oracle allows)."""
    def fn(q, k_cache, v_cache, cache_seqlens, *, return_lse, **kw):
        r = decode.reference(inp, causal=p.causal, compute_dtype=decode.lowp_dtype(inp))
        return (r["out"], r["lse"]) if return_lse else r["out"]
    return fn


def test_check_passes_fails_and_sees_nondeterminism():
    p = DecodeProblem(**TINY, page_size=4, len_q=2)
    inp = p.build()
    assert decode.check(inp, p, _lowp(inp, p), repeat=True).ok
    wrong = lambda *a, return_lse, **k: _lowp(inp, p)(*a, return_lse=False, **k) + 0.1
    rep = decode.check(inp, p, wrong, check_lse=False)
    assert not rep.ok and rep.checks[0].name == "out"
    calls = []

    def drift(*a, return_lse, **k):
        calls.append(1)
        out, lse = _lowp(inp, p)(*a, return_lse=True, **k)
        return out, lse + 1e-6 * len(calls)
    rep = decode.check(inp, p, drift, check_lse=False, repeat=True)
    assert [c.name for c in rep.checks] == ["out", "same"] and not rep.checks[1].ok


def test_suite_cells():
    full, quick = decode.cells(), decode.cells(quick=True)
    assert len(set(full)) == len(full) and 40 <= len(full) <= 60
    assert 10 <= len(quick) <= 14 and set(quick) <= set(full)
    assert all(p.cache_bytes() <= decode.MAX_CACHE_GB * 1e9 for p in full)
    grid = decode.sweep_cells("grid")
    assert len(grid) == 15  # 4 batches x 4 lengths less B=256 x 128k (137 GB)
    assert {p.num_splits for p in decode.sweep_cells("splits")} == {0, 1, 2, 4, 8, 16, 32}
    assert {p.page_size for p in decode.sweep_cells("pages")} == {0, 1, 16, 64, 128}
    for s in decode.SWEEPS:
        assert set(s.cells()) <= set(full), s.name
    assert all(p.suite == "decode" for p in full) and decode.suites()["decode"] == full
    order = [decode.build_order(p) for p in full]
    assert order == sorted(order)
    from harness.suites import suite
    assert suite("decode") == full


FAKES = '''
import os
import torch
from harness.backends import Backend, register
from harness import decode


def _ok():
    return True, ""


def _make(kind):
    def make():
        def fn(q, k_cache, v_cache, cache_seqlens, *, page_table, cu_seqlens_q, max_seqlen_q,
               causal, softmax_scale, num_splits, return_lse, seqlens_host, q_descale,
               k_descale, v_descale):
            if kind == "refuse":
                raise decode.Unsupported("no page size 3 here")
            if kind == "sticky":
                raise RuntimeError(f"CUDA error: an illegal memory access (pid {os.getpid()})")
            lq = (torch.full_like(seqlens_host, q.shape[1]) if cu_seqlens_q is None
                  else (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long())
            inp = decode.DecodeInputs(q, k_cache, v_cache, cache_seqlens, page_table,
                                      cu_seqlens_q, max_seqlen_q, lq, seqlens_host,
                                      q_descale, k_descale, v_descale)
            r = decode.reference(inp, causal=causal, compute_dtype=decode.lowp_dtype(inp))
            return (r["out"], r["lse"]) if return_lse else r["out"]
        return fn
    return make


for kind in ("good", "refuse", "sticky"):
    register(Backend("fake-" + kind, _make(kind), _ok, module=__name__, kind="decode",
                     own=kind == "good"))
'''


def test_sweep_through_workers(tmp_path, monkeypatch):
    (tmp_path / "decode_fakes.py").write_text(FAKES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    from harness import backends
    import decode_fakes  # noqa: F401
    probs = [DecodeProblem(**TINY, page_size=3, suite="decode"),
             DecodeProblem(**TINY, len_q=2, packed_q=True, suite="decode")]
    bs = [backends.get(n, kind="decode") for n in ("fake-good", "fake-refuse", "fake-sticky")]
    path = bench.sweep(bs, probs, ("fwd",), out_dir=tmp_path / "out", gpus=[None],
                       progress=False, timeout=120)
    rows = bench.read_rows(path)
    got = {(r["backend"], r["page_size"]): r for r in rows}
    assert len(rows) == 6 and all(r["pass"] == "fwd" and r["mode"] == "decode" for r in rows)
    good = got["fake-good", "3"]
    assert good["status"] == "ok", good["error"]
    assert float(good["kv_tbps"]) > 0 and good["copy_tbps"] == ""  # copy: GPU only
    assert int(good["kv_bytes"]) == probs[0].kv_bytes() and good["num_splits"] == "0"
    assert got["fake-good", "0"]["packed_q"] == "True"
    assert got["fake-refuse", "3"]["status"] == "unsupported"
    assert "no page size 3" in got["fake-refuse", "3"]["error"]
    # a CUDA error that poisons the context ends the worker: the next cell gets a fresh one
    sticky = [got["fake-sticky", ps]["error"] for ps in ("3", "0")]
    assert all("illegal memory access" in e for e in sticky) and sticky[0] != sticky[1]


def _fake_rows():
    """Timed rows for every cell of the grid, pages and splits sweeps, and a jagged row."""
    from harness.suites import suite
    rows = []
    cells = {c: None for s in ("grid", "pages", "splits") for c in decode.sweep_cells(s)}
    for i, c in enumerate(cells):
        for b, f in (("tlx", 0.9), ("fa4", 0.5), ("sdpa", 0.1)):
            tb = 4.4 * f * (1 - 0.02 * (i % 3))
            ms = c.kv_bytes() / (tb * 1e12) * 1e3
            rows.append(bench.row(b, c, "fwd", "ok", ms=f"{ms:.5f}",
                                  tflops=f"{c.flops() / ms * 1e-9:.4g}", kv_tbps=f"{tb:.4g}",
                                  copy_tbps="4.4", gpu="NVIDIA H200"))
    rows.append(bench.row("flashinfer", c, "fwd", "unsupported", "not installed",
                          gpu="NVIDIA H200"))
    rows.append(bench.row("fa4", suite("smoke")[0], "fwd", "ok", ms="1.0", tflops="2.0",
                          gpu="NVIDIA H200"))
    return rows


def test_csv_charts_and_report_on_fake_rows(tmp_path):
    from harness.plots import plot_all
    from harness.report import write_report
    rows = _fake_rows()
    bench.merge_rows(tmp_path / "results.csv", rows)
    back = bench.read_rows(tmp_path / "results.csv")
    assert len(back) == len(rows)  # page size and splits keep the sweep's cells apart
    assert list(back[0])[:len(bench.COLUMNS)] == bench.COLUMNS
    assert bench.COLUMNS[-len(bench.DECODE_COLS):] == bench.DECODE_COLS
    jag = [r for r in back if r["mode"] != "decode"]
    assert len(jag) == 1 and jag[0]["page_size"] == "" and jag[0]["kv_tbps"] == ""
    pngs = {p.name for p in plot_all(tmp_path)}
    assert {"decode_bandwidth.png", "decode_pages.png", "decode_splits.png"} <= pngs
    md = write_report(tmp_path).read_text()
    assert "## decode (KV-cache attention)" in md and "Copy bandwidth in this run: 4.40" in md
    assert "- `sdpa`: torch SDPA on the gathered cache" in md and "(not in the registry)" not in md
    assert "### Page size" in md and "![decode_pages](decode_pages.png)" in md
    assert "- `tlx`:\n  - B=1, 32k: 3.80 TB/s (met, target 3.6)" in md
    assert "  - at least the best baseline: 29/29 cells" in md
    assert "| B8 Lk32768 H32/8 D128 Lq1 p16 |" in md
    assert "Not in the tables (no cell ran): `flashinfer` (unsupported: not installed)." in md
    assert "| cell | KV MB | tlx | fa4 | sdpa |" in md
    assert "## smoke" in md and "## decode" not in md.split("## smoke")[1].split("##")[0]


def test_cli_groups_and_validation():
    from harness.__main__ import _groups, main, quick_subset
    from harness.suites import suite
    assert quick_subset(suite("decode")) == decode.cells(quick=True)
    jag = bench.Problem(batch=1, heads=1, head_dim=64, max_seqlen_q=4)
    dec = DecodeProblem(**TINY)
    groups = _groups([jag, dec], ["tlx", "sdpa", "flex"], ["fwd", "bwd"])
    assert [([b.name for b in bs], ps) for bs, _, ps in groups] == [
        (["tlx", "flex"], ["fwd", "bwd"]), (["tlx", "sdpa"], ["fwd"])]
    assert all(b.kind == "decode" for b in groups[1][0])
    with pytest.raises(SystemExit, match="unknown backend"):
        main(["bench", "--suite", "decode", "--backends", "nope"])
    with pytest.raises(SystemExit, match="unknown suite"):
        main(["bench", "--suite", "decod"])
    with pytest.raises(SystemExit, match="takes the jagged suites"):
        main(["profile", "--suite", "decode"])


def test_gpu_check_cases_build_and_pass_on_the_reference():
    """harness.gpu.decode_check's cases are valid problems (names unique, overrides of
    the right length), and the edge cases pass the oracle with a low-precision fake."""
    from harness.gpu.decode_check import cases
    cs = cases()
    assert len({n for n, _, _ in cs}) == len(cs) >= 30
    modes = {(p.page_size, p.num_splits > 1, p.len_q > 1, p.packed_q, p.dtype, p.head_dim)
             for _, p, _ in cs}
    assert {m[0] for m in modes} >= {0, 1, 16, 64, 128}
    assert {m[4] for m in modes} == {"bf16", "fp16", "fp8"}
    for name, p, lens in cs:
        if lens is None:
            continue
        inp = p.build(lengths=lens)
        assert inp.lengths_k.tolist() == list(lens[1]), name
        assert decode.check(inp, p, _lowp(inp, p), repeat=True).ok, name


def test_sdpa_baseline_passes_the_oracle_on_the_cpu():
    """The SDPA baseline (gathered pages, padded packed rows, jagged-length and causal
    masks, rows with no key) is right: it runs on the CPU too."""
    from harness import backends
    from harness.gpu.decode_check import cases
    fn = backends.get("sdpa", kind="decode").fn()
    picked = [c for c in cases() if c[0].startswith(("packed q (1..16", "zero-length caches, page",
                                                      "L_q 4 causal, rows", "page 7"))]
    assert len(picked) == 4
    for name, p, lens in picked:
        inp = p.build(lengths=lens)
        assert decode.check(inp, p, fn, check_lse=False).ok, name


def test_gpu_check_bad_inputs_name_the_argument(monkeypatch):
    """decode_check's bad-input cases against the core's validation on the CPU (the
    style's resolution stubbed: its value checks run on the host before any kernel)."""
    import jagged.kvcache
    from harness.gpu.decode_check import bad_inputs, names_argument
    monkeypatch.setattr(jagged.kvcache, "resolve", lambda backend, index: "tlx")
    cases = bad_inputs("tlx", device="cpu")
    assert len(cases) == 21
    for name, args, fn in cases:
        with pytest.raises(Exception) as e:
            fn()
        assert names_argument(e.value, args), (name, e.value)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="CPU interpreter test (TRITON_INTERPRET=1)")
def test_ours_through_the_api_in_the_interpreter(monkeypatch):
    """The `tlx` decode backend through `jagged.kvcache_attention` (the style resolved
    without a device) passes the oracle with NaN past every sequence's end."""
    import jagged.kvcache
    from harness import backends
    monkeypatch.setattr(jagged.kvcache, "resolve", lambda backend, index: backend)
    fn = backends.get("tlx", kind="decode").fn()
    p = DecodeProblem(batch=3, heads=8, kv_heads=2, head_dim=64, cache_len=40, page_size=16,
                      num_splits=2, sparsity=0.6)
    inp = p.build(unused=float("nan"))
    assert inp.k_cache.isnan().any()
    rep = decode.check(inp, p, fn, repeat=True)
    assert rep.ok and [c.name for c in rep.checks] == ["out", "lse", "same"], str(rep)


# ------------------------------------------------------------------ fp8
F8 = torch.float8_e4m3fn


@pytest.mark.parametrize("kw", [dict(page_size=0, len_q=2), dict(page_size=3, len_q=3,
                                                                 packed_q=True, sparsity=0.5)])
def test_fp8_build_quantizes_per_sequence_and_kv_head(kw):
    """q, K and V in e4m3 with fp32 [B, H_kv] descales = amax / 448 of the same seed's
    bf16 draw over each (sequence, KV head): the largest |value| of each is 448, and
    dequantized they are the bf16 draw to e4m3's rounding."""
    p = DecodeProblem(**{**TINY, "dtype": "fp8", **kw})
    inp, ref = p.build(), p.replace(dtype="bf16").build()
    assert inp.fp8 and inp.out_dtype == torch.bfloat16
    assert inp.q.dtype == inp.k_cache.dtype == inp.v_cache.dtype == F8
    B, Hkv, D = 4, 2, 16
    for ds in (inp.q_descale, inp.k_descale, inp.v_descale):
        assert ds.dtype == torch.float32 and ds.shape == (B, Hkv) and ds.is_contiguous()
    seq = torch.repeat_interleave(torch.arange(B), inp.lengths_q)
    q8, qr = inp.q.reshape(-1, Hkv, 2 * D).float(), ref.q.reshape(-1, Hkv, 2 * D).float()
    for b in range(B):
        rows = seq == b
        assert torch.equal(q8[rows].abs().amax(dim=(0, 2)), torch.full((Hkv,), 448.0))
        torch.testing.assert_close(inp.q_descale[b], qr[rows].abs().amax(dim=(0, 2)) / 448)
        for c8, cr, ds in ((inp.k_cache, ref.k_cache, inp.k_descale),
                           (inp.v_cache, ref.v_cache, inp.v_descale)):
            if inp.page_table is None:
                units = torch.tensor([b])
            else:
                units = inp.page_table[b, :-(-int(inp.lengths_k[b]) // 3)].long()
            x8, xr = c8[units].float(), cr[units].float()
            assert torch.equal(x8.abs().amax(dim=(0, 1, 3)), torch.full((Hkv,), 448.0))
            torch.testing.assert_close(ds[b], xr.abs().amax(dim=(0, 1, 3)) / 448)
            deq = x8 * ds[b][None, None, :, None]
            # e4m3: 3 mantissa bits (half an ulp: 1/16 relative), subnormal step 2^-9
            assert ((deq - xr).abs() <= xr.abs() / 16 + ds[b][None, None, :, None] * 2 ** -10
                    ).all()
    assert p.kv_bytes() * 2 == p.replace(dtype="bf16").kv_bytes()
    assert p.cache_bytes() * 2 == p.replace(dtype="bf16").cache_bytes()
    nan = p.build(unused=float("nan"))  # e4m3 NaN exactly in the unused slots
    assert int(nan.k_cache.float()[..., 0, 0].isnan().sum()) == \
        nan.k_cache.shape[0] * nan.k_cache.shape[1] - int(inp.lengths_k.sum())


def test_fp8_reference_is_on_the_dequantized_values():
    """The fp8 oracle equals the plain one on dequantized float64 inputs; the allowance
    is PyTorch's bf16 error on them."""
    p = DecodeProblem(**{**TINY, "dtype": "fp8", "page_size": 4, "len_q": 3,
                         "packed_q": True, "sparsity": 0.6})
    inp = p.build()
    G = 2  # query heads a KV head
    seq = torch.repeat_interleave(torch.arange(4), inp.lengths_q)
    q = inp.q.double() * inp.q_descale.double()[seq].repeat_interleave(G, 1)[..., None]
    owner = torch.full((inp.k_cache.shape[0],), 0)
    for b, n in enumerate(inp.lengths_k.tolist()):
        owner[inp.page_table[b, :-(-n // 4)].long()] = b
    k = inp.k_cache.double() * inp.k_descale.double()[owner][:, None, :, None]
    v = inp.v_cache.double() * inp.v_descale.double()[owner][:, None, :, None]
    plain = dataclasses.replace(inp, q=q, k_cache=k, v_cache=v, q_descale=None, k_descale=None,
                                v_descale=None)
    got, want = decode.reference(inp, causal=True), decode.reference(plain, causal=True)
    torch.testing.assert_close(got["out"], want["out"], rtol=0, atol=1e-12)
    torch.testing.assert_close(got["lse"], want["lse"], rtol=0, atol=1e-6)
    assert decode.lowp_dtype(inp) == torch.bfloat16
    low = decode.reference(inp, causal=True, compute_dtype=torch.bfloat16)["out"]
    assert low.dtype == torch.bfloat16 and 0 < float((low.double() - want["out"]).abs().max())


def test_fp8_check_passes_bf16_fails_without_descales():
    """A backend computing in bf16 on the dequantized values passes; one that drops a
    descale fails, and so does an out that is not bf16."""
    p = DecodeProblem(**TINY, page_size=4, len_q=2).replace(dtype="fp8")
    inp = p.build()
    assert decode.check(inp, p, _lowp(inp, p), repeat=True).ok
    no_v = dataclasses.replace(inp, v_descale=None)

    def dropped(*a, return_lse, **k):
        r = decode.reference(no_v, causal=p.causal, compute_dtype=torch.bfloat16)
        return (r["out"], r["lse"]) if return_lse else r["out"]
    assert not decode.check(inp, p, dropped).ok
    as_f32 = lambda *a, return_lse, **k: _lowp(inp, p)(*a, return_lse=False, **k).float()
    rep = decode.check(inp, p, as_f32, check_lse=False)
    assert [c.name for c in rep.checks] == ["out", "dtype"] and not rep.checks[1].ok


def test_fp8_bf16_q_and_backend_keywords():
    p = DecodeProblem(**TINY, len_q=2).replace(dtype="fp8")
    inp = p.build()
    kw = inp.kwargs()
    assert kw["k_descale"] is inp.k_descale and kw["q_descale"] is inp.q_descale
    bq = decode.with_bf16_q(inp)
    assert bq.q.dtype == torch.bfloat16 and bq.q_descale is None and bq.fp8
    seq = torch.repeat_interleave(torch.arange(4), inp.lengths_q)
    want = inp.q.reshape(-1, 4, 16).float() * inp.q_descale[seq].repeat_interleave(2, 1)[..., None]
    assert torch.equal(bq.q.reshape(-1, 4, 16), want.bfloat16())
    assert decode.check(bq, p, _lowp(bq, p)).ok
    plain = DecodeProblem(**TINY).build()
    assert plain.q_descale is None and not plain.fp8 and plain.out_dtype == torch.float16


def test_fp8_suite_cells():
    fp8 = decode.sweep_cells("fp8")
    assert {p.dtype for p in fp8} == {"bf16", "fp8"} and len(fp8) == 8
    for p in fp8:  # each fp8 cell beside its bf16 twin
        assert p.replace(dtype="bf16" if p.dtype == "fp8" else "fp8") in fp8
    quick = [p for p in decode.cells(quick=True) if p.dtype == "fp8"]
    assert len(quick) == 2
    for p in quick:
        assert p.replace(dtype="bf16") in decode.cells(quick=True)
    assert decode.problem_of(decode.cols(fp8[1])) == fp8[1]


def test_sdpa_baseline_on_fp8_passes_the_oracle_on_the_cpu():
    """SDPA on an fp8 cell: q and the gathered cache dequantized to bf16 (paged, packed,
    masked and unmasked), and on a bf16 q over the e4m3 cache."""
    from harness import backends
    fn = backends.get("sdpa", kind="decode").fn()
    for p in (DecodeProblem(**TINY, page_size=4, len_q=3, packed_q=True, sparsity=0.6),
              DecodeProblem(**TINY, len_q=1, causal=False),
              DecodeProblem(**TINY, len_q=2, page_size=5)):
        p = p.replace(dtype="fp8")
        for inp in (p.build(), decode.with_bf16_q(p.build())):
            assert decode.check(inp, p, fn, check_lse=False).ok, p.label()
    ok, why = backends.DECODE["sdpa"].supports(DecodeProblem(**TINY).replace(dtype="fp8"))
    assert ok, why


def test_fa4_refuses_fp8():
    """FA4 (no fp8 on sm_90, no descales at its varlen entry) refuses fp8 cells:
    `unsupported` rows."""
    pytest.importorskip("flash_attn.cute")
    from harness import backends
    inp = DecodeProblem(**TINY).replace(dtype="fp8").build()
    fn = backends.get("fa4", kind="decode").fn()
    with pytest.raises(decode.Unsupported, match="fp8 runs on sm_100 only"):
        decode.call(fn, inp, DecodeProblem(**TINY).replace(dtype="fp8"), return_lse=False)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="CPU interpreter test (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("bf16_q", [False, True], ids=["fp8-q", "bf16-q"])
def test_ours_fp8_through_the_api_in_the_interpreter(monkeypatch, bf16_q):
    """The `tlx` decode backend on an fp8 cell (the harness's quantized inputs, NaN past
    every sequence's end) passes the fp8 oracle."""
    import jagged.kvcache
    from harness import backends
    monkeypatch.setattr(jagged.kvcache, "resolve", lambda backend, index: backend)
    fn = backends.get("tlx", kind="decode").fn()
    p = DecodeProblem(batch=3, heads=8, kv_heads=2, head_dim=64, cache_len=40, page_size=16,
                      num_splits=2, sparsity=0.6, dtype="fp8", len_q=2)
    inp = p.build(unused=float("nan"))
    if bf16_q:
        inp = decode.with_bf16_q(inp)
    rep = decode.check(inp, p, fn, repeat=True)
    assert rep.ok and [c.name for c in rep.checks] == ["out", "lse", "same"], str(rep)


def test_report_has_the_fp8_table(tmp_path):
    """fp8 rows (FA4 unsupported) get their own table beside their bf16 twins; the grid
    chart's rows stay bf16."""
    from harness.plots import decode_rows
    from harness.report import write_report
    rows = []
    for c in decode.sweep_cells("fp8"):
        for b, tb in (("tlx", 3.9), ("fa4", 2.2), ("sdpa", 0.4)):
            if b == "fa4" and c.dtype == "fp8":
                rows.append(bench.row(b, c, "fwd", "unsupported", "fp8 runs on sm_100 only",
                                      gpu="NVIDIA H200"))
                continue
            ms = c.kv_bytes() / (tb * 1e12) * 1e3
            rows.append(bench.row(b, c, "fwd", "ok", ms=f"{ms:.5f}", kv_tbps=f"{tb:.4g}",
                                  tflops=f"{c.flops() / ms * 1e-9:.4g}", copy_tbps="4.4",
                                  gpu="NVIDIA H200"))
    bench.merge_rows(tmp_path / "results.csv", rows)
    md = write_report(tmp_path).read_text()
    assert "### fp8 (e4m3) cache and q beside bf16" in md
    assert "| B1 Lk32768 H32/8 D128 Lq1 contig fp8 | 67 | 3.90 (89%) · 31.2 | unsupported |" in md
    assert "| B1 Lk32768 H32/8 D128 Lq1 contig | 134 | 3.90 (89%) · 15.6 |" in md
    import pandas as pd
    grid = decode_rows(pd.read_csv(tmp_path / "results.csv"), "grid")
    assert set(grid["dtype"]) == {"bf16"}


def test_fp8_targets_ratio_and_share():
    """Issue 33's lines: the bf16 twin's time over the fp8 time (graph replay when both
    were captured), and the fp8 cell's KV TB/s against the copy's."""
    import pandas as pd
    from harness.report import _fp8_targets
    base = dict(backend="tlx", batch=8, heads=32, kv_heads=8, head_dim=128, max_seqlen_q=1,
                max_seqlen_k=32768, page_size=16, num_splits=0, packed_q=False, sparsity=1.0,
                mode="decode", causal=True)
    g = pd.DataFrame([dict(base, dtype="bf16", ms=0.30, graph_ms=0.26, kv_bytes=1.0e9),
                      dict(base, dtype="fp8", ms=0.20, graph_ms=0.13, kv_bytes=0.5e9)])
    md = _fp8_targets(g, copy=4.0)
    line = next(x for x in md if x.startswith("- `tlx`"))
    assert "2.00x bf16 (graph)" in line and "96% of copy" in line and line.endswith("met")
    g.loc[1, "graph_ms"] = float("nan")  # not captured: the eager times, 1.50x: missed
    line = next(x for x in _fp8_targets(g, copy=4.0) if x.startswith("- `tlx`"))
    assert "1.50x bf16," in line and line.endswith("missed")
