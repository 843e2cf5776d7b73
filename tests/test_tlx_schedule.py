"""The TLX forward's jagged tile scheduler (runs in the Triton interpreter on CPU):
the one-kernel key build + sort gives the same longest-first order and count as the
plain torch reference, in every mode."""
import pytest
import torch

from harness.problems import offsets
from harness.tiles import longest_first_tiles
from kernels_tlx.schedule import build_tiles


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bq", [False, True])
@pytest.mark.parametrize("block_n", [64, 128])
def test_tile_order_matches_reference(causal, bq, block_n):
    g = torch.Generator().manual_seed(int(causal) * 4 + int(bq) * 2 + block_n)
    B = 29
    lq = torch.randint(0, 300, (B,), generator=g)
    lk = torch.randint(0, 300, (B,), generator=g)
    lq[:3], lk[3:6] = torch.tensor([0, 1, 129]), torch.tensor([0, 1, 0])
    if bq:
        lq = torch.full((B,), 77)
    cq, ck = None if bq else offsets(lq), offsets(lk)
    max_q = 77 if bq else int(lq.max())
    args = (cq, ck, B, max_q, 77 if bq else None, 128, block_n, causal)
    pairs, count, nblk = build_tiles(*args)
    ref, ref_count, ref_nblk = longest_first_tiles(*args)
    n = int(ref_count)
    assert nblk == ref_nblk and int(count) == n == int(((lq + 127) // 128).sum())
    assert torch.equal((pairs & 0xFFFFFFFF)[:n], ref[:n].long())
