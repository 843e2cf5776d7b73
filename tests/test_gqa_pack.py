"""Broadcast-Q's GQA head packing (jagged.tiles.gqa_pack, pack_heads) on the CPU: when a
forward packs, the packed q's layout, the row -> (query row, head) map both styles'
stores use, and the CuteDSL host's launch of a packing build. The kernels themselves
run against the oracle in tests/test_gpu_matrix.py::test_broadcast_q_packed."""
import math

import pytest
import torch

from _interp import interp
from jagged.tiles import gqa_pack, pack_heads


@pytest.mark.parametrize("bq,L_q,group,block_m,want", [
    (True, 16, 8, 128, 8),     # fuzz B531 H32/4: 8 tiles of 16 rows -> 1 full
    (True, 64, 4, 128, 4),     # 4 half tiles -> 2 full
    (True, 5, 16, 128, 16),
    (True, 100, 2, 192, 1),    # 2 tiles either way
    (True, 80, 2, 192, 2),
    (True, 128, 4, 128, 1),    # full tiles already
    (True, 16, 3, 128, 1),     # a group not dividing a 64-row consumer block
    (False, 16, 8, 128, 1),    # packed (jagged) queries: not packed
    (True, 16, 1, 128, 1),     # no GQA
])
def test_pack_rule(bq, L_q, group, block_m, want):
    assert gqa_pack(bq, L_q, group, block_m) == want


@pytest.mark.parametrize("causal", [False, True])
def test_packed_rows_map_back_to_query_rows_and_heads(causal):
    """Attention over the packed q (KV head hk's rows l * G + j, no GQA), its rows put
    back by the stores' map (row r of tile head hk -> query row r // G of head
    hk * G + r % G), equals broadcast-Q GQA attention over the original q. Causal: the
    packed row r keeps the keys of the TLX consumers' shifted row, r // G + (L_q * G -
    L_q) against L_q * G rows, bottom right, which are its query row's."""
    g = torch.Generator().manual_seed(0)
    L_q, H, Hkv, D, L_k = 6, 8, 2, 16, 11
    G = H // Hkv
    q = torch.randn(L_q, H, D, generator=g)
    k, v = torch.randn(L_k, Hkv, D, generator=g), torch.randn(L_k, Hkv, D, generator=g)
    qp = pack_heads(q, G)
    assert qp.shape == (L_q * G, Hkv, D) and qp.is_contiguous()

    def attn(qh, kh, vh, rows):  # [L, D] x [L_k, D] -> out, lse; rows: the mask's rows
        s = qh @ kh.T / math.sqrt(D)
        if causal:  # bottom right: row i of n sees keys < i + 1 + L_k - n
            n = len(qh)
            s = s.masked_fill(torch.arange(L_k)[None, :] >= rows[:, None] + 1 + L_k - n,
                              float("-inf"))
        return torch.softmax(s, -1) @ vh, torch.logsumexp(s, -1)

    want = [attn(q[:, h], k[:, h // G], v[:, h // G], torch.arange(L_q)) for h in range(H)]
    out, lse = torch.empty(L_q, H, D), torch.empty(H, L_q)
    for hk in range(Hkv):
        r = torch.arange(L_q * G)
        o, l = attn(qp[:, hk], k[:, hk], v[:, hk], r // G + (L_q * G - L_q))
        r = torch.arange(L_q * G)
        out[r // G, hk * G + r % G] = o
        lse[hk * G + r % G, r // G] = l
    for h in range(H):
        torch.testing.assert_close(out[:, h], want[h][0])
        torch.testing.assert_close(lse[h], want[h][1])


@interp
def test_cute_host_launches_a_packing_build():
    """host.forward (the tile list in the interpreter, the kernel a recorder): a
    broadcast-Q GQA call with short L_q, causal or not, launches the build with
    Config.pack = G on the packed q, L_q * G rows, group 1 and B * nblk * H_kv tiles."""
    from dataclasses import replace

    from jagged.tiles import fwd_tiles
    from kernels_cute import fwd_hopper as F
    from kernels_cute import host

    calls = []

    def compiled(*key):
        return lambda *args: calls.append((key, args))

    B, L_q, H, Hkv, D = 5, 16, 32, 4, 64
    q = torch.randn(L_q, H, D).to(torch.bfloat16)
    cu = torch.arange(0, 100 * (B + 1), 100, dtype=torch.int32)
    k = torch.zeros(int(cu[-1]), Hkv, D, dtype=torch.bfloat16)
    kern = host.FwdKernels(F.pick_config, compiled, lambda cfg, n, dev: n, fp8=True,
                           takes_windows=F.takes_windows, window_config=F.window_config,
                           pack_gqa=True)
    for causal in (False, True):
        calls.clear()
        host.forward(kern, q, k, k, None, cu, L_q, 100, causal, 0.125, True)
        (key, args), = calls
        cfg = F.pick_config(D, 100, causal, 100.0)
        G = H // Hkv
        assert key == (q.dtype, D, causal, True, replace(cfg, pack=G))
        assert torch.equal(args[0], pack_heads(q, G) if G > 1 else q)
        pairs, count, nblk = fwd_tiles(None, cu, B, L_q * G, L_q * G, cfg.block_m,
                                       cfg.block_n, causal)
        assert torch.equal(args[7], pairs) and torch.equal(args[8], count)
        assert args[-4:] == (L_q * G, 1, nblk, B * nblk * Hkv)
        assert args[3].shape == (B * L_q, H, D) and args[4].shape == (H, B * L_q)
