"""harness.gpu.decode_tune on the CPU: the plan (cells, splits, configs), the dry run,
and (TRITON_INTERPRET=1) the core-call path with a non-default TLX config against the
oracle on a small cell."""
import dataclasses
import os

import pytest
import torch

from harness.decode import DecodeProblem
from harness.gpu import decode_tune as dt


def test_cells_and_quick():
    names = [n for n, _ in dt.cells()]
    assert len(names) == 6 and len(set(names)) == 6
    assert [n for n, _ in dt.cells(quick=True)] == list(dt.QUICK)
    lq16 = dict(dt.CELLS)["B8 32k Lq16 contig"]
    assert dt.tile_rows(lq16) == 64 and lq16.heads // lq16.kv_heads == 4


def test_splits_list():
    assert dt.splits_list(33) == [33, 16, 66, 132]
    assert dt.splits_list(1) == [1, 2, 4]
    assert dt.splits_list(2) == [2, 1, 4, 8]
    assert dt.default_splits(dict(dt.CELLS)["B1 32k contig"], 132) == 16


def test_configs():
    p = dict(dt.CELLS)["B8 32k page1"]
    tlx = dt.configs("tlx", p)
    assert tlx[0] == dt._tlx_default(p) and len(set(tlx)) == len(tlx) == 19
    cute = dt.configs("cute", p)
    assert cute[0] == dt._cute_default(p) and len(set(cute)) == len(cute) >= 2
    with pytest.raises(ValueError):
        dt.configs("nope", p)


def test_dry_run(capsys):
    rows = dt.main(["--styles", "tlx,cute", "--quick", "--dry-run"])
    out = capsys.readouterr().out
    assert f"{len(rows)} rows" in out
    for style in ("tlx", "cute"):
        for name, _ in dt.cells(quick=True):
            mine = [r for r in rows if r["style"] == style and r["cell"] == name]
            assert sum(r["is_default"] for r in mine) == 1
            assert mine[0]["is_default"] and mine[0]["cfg_index"] == 0


def test_bad_style():
    with pytest.raises(SystemExit):
        dt.main(["--styles", "fa4", "--dry-run"])


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="CPU interpreter test (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("page_size,splits", [(0, 3), (16, 1), (1, 2)])
def test_core_call_with_config(page_size, splits):
    from harness import decode
    from kernels_tlx.decode_hopper import Config
    p = DecodeProblem(batch=2, heads=8, kv_heads=2, head_dim=64, cache_len=200,
                      page_size=page_size, num_splits=splits)
    inp = p.build("cpu")
    fwd = dt.style_forward("tlx", Config(32, 3, 4), False)
    rep = decode.check(inp, p, dt.core_call(fwd), check_lse=True)
    assert rep.ok, rep.checks


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="CPU interpreter test (TRITON_INTERPRET=1)")
def test_fp8_cell_through_the_oracle():
    """An fp8 cell (--dtype fp8): its references (bf16 the low precision) and the
    default TLX call passing the oracle with them."""
    from harness import decode
    _, p = dt.cells(dtype="fp8")[0]
    p = dataclasses.replace(p, batch=1, heads=8, kv_heads=2, head_dim=64, cache_len=150,
                            num_splits=2)
    inp, ref, lowp = dt._cells_data(p, "cpu")
    assert inp.k_cache.dtype == torch.float8_e4m3fn and lowp["out"].dtype == torch.bfloat16
    fwd = dt.style_forward("tlx", None, True)
    rep = decode.check(inp, p, dt.core_call(fwd), ref=ref, lowp=lowp, check_lse=True)
    assert rep.ok, rep.checks
