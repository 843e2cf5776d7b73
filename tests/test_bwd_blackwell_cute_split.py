"""The CuteDSL Blackwell backward's Q-loop split (kernels_cute/bwd_blackwell.py:
`bulk_start`, `mask_bound`) on plain ints, against a brute force over every (key, query
row) pair of random jagged tile lists: zero- and one-length sequences, causal or not,
self, cross with L_q != L_k, broadcast-Q, GQA. The tiles come from the CPU reference of
the shared KV-tile list (jagged.tiles.kv_tiles_reference) and are decoded by the
kernel's own schedule.kv_tile_coords.

What must hold for every step of every tile: a bulk step (its code has no mask) has no
pair of a real row (below len_q) that the mask would drop; a masked step has at least one
(the split is exact); the masked step's bound keeps exactly the pairs that are visible;
the blocks of a head's walk are the masked ones first, then the bulk, so compute meets
the steps in the order the load, mma and reduce_dq roles issue them. The PTX side (two
step bodies, the mask selects in one) is in test_bwd_blackwell_cute.py.
"""
import random

import numpy as np
import pytest
import torch

pytest.importorskip("cutlass")

from harness.problems import offsets  # noqa: E402
from jagged.tiles import kv_tiles_reference  # noqa: E402
from kernels_cute import bwd_blackwell as B  # noqa: E402
from kernels_cute.schedule import kv_tile_coords  # noqa: E402


class _Ints:
    """A tensor read as the kernel reads it (t[i]), in plain ints."""

    def __init__(self, t):
        self.t = t

    def __getitem__(self, i):
        return int(self.t[i])


def _cu(lens):
    return offsets(torch.tensor(lens))


def _problem(rng: random.Random, BM: int, BN: int):
    """(lens_q, lens_k, broadcast_q, causal, heads, kv heads): 1-6 sequences whose
    lengths favour the edges (0, 1, a block and one either side, two blocks and one)."""
    edges = [0, 1, 2, BN - 1, BN, BN + 1, 2 * BN + 1, BM - 1, BM, BM + 1, 3 * BM + 5]

    def length():
        return rng.choice(edges) if rng.random() < 0.6 else rng.randint(0, 4 * max(BM, BN))

    n = rng.randint(1, 6)
    lens_k = [length() for _ in range(n)]
    mode = rng.choice(["self", "cross", "broadcast_q"])
    if mode == "self":
        lens_q = list(lens_k)
    elif mode == "cross":
        lens_q = [length() for _ in range(n)]
    else:
        lens_q = [max(1, length())] * n
    hkv = rng.choice([1, 2])
    return lens_q, lens_k, mode == "broadcast_q", rng.random() < 0.5, hkv * rng.choice(
        [1, 2, 4]), hkv


def _dropped(len_q, len_k, n0, m0, causal, BM, BN):
    """[BN keys, BM rows] of the step: True where a pair of a real row is one the kernel
    must not count (a key past the sequence, causal: right of the diagonal); rows past
    len_q are False (lse = +inf zeroes them on every step)."""
    key = n0 + np.arange(BN)[:, None]
    row = m0 + np.arange(BM)[None, :]
    drop = (key >= len_k) | np.zeros_like(row, dtype=bool)
    if causal:
        drop |= key > row + (len_k - len_q)
    return drop & (row < len_q)


def _tiles(lens_q, lens_k, bq, causal, BM, BN):
    """The list's real tiles decoded as the kernel does -> [(b, n0, seq, m_lo, n_m)]."""
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    L_q = lens_q[0] if bq else 0
    tb, tn, n = kv_tiles_reference(None if bq else cu_q, cu_k, L_q, max(max(lens_k), 1),
                                   causal, BM, BN)
    sched = B.Sched(_Ints(tb), _Ints(tn), [int(n)], _Ints(cu_q), _Ints(cu_k), L_q, 1, 1, 1, 1)
    out = []
    for t in range(int(n)):
        b, hk, n0, seq, m_lo, n_m = kv_tile_coords(t, 0, sched, BM, BN, causal, bq)
        out.append((b, n0, seq, m_lo, n_m))
    return out


@pytest.mark.parametrize("BM,BN", [(B.BLOCK_M, B.BLOCK_N), (16, 32), (32, 16)])
def test_split_against_brute_force(BM, BN):
    rng = random.Random(31 + BM + 7 * BN)
    seen = {"bulk": 0, "masked": 0, "diagonal": 0, "tail": 0, "empty": 0}
    for _ in range(100):
        lens_q, lens_k, bq, causal, H, HKV = _problem(rng, BM, BN)
        G = H // HKV
        for b, n0, seq, m_lo, n_m in _tiles(lens_q, lens_k, bq, causal, BM, BN):
            len_q, len_k = lens_q[b], lens_k[b]
            assert (seq.len_q, seq.len_k) == (len_q, len_k)
            # every row that sees one of the tile's keys is in its walk
            rows = np.nonzero((~_dropped(len_q, len_k, n0, 0, causal, len_q, BN)
                               & (n0 + np.arange(BN) < len_k)[:, None]).any(0))[0]
            assert rows.size == 0 or (rows.min() >= m_lo and rows.max() < m_lo + n_m * BM)
            m_bulk = B.bulk_start(seq, n0, m_lo, n_m, causal, BM, BN)
            assert 0 <= m_bulk <= n_m, (m_bulk, n_m)
            if n_m == 0:
                seen["empty"] += 1
            tail = n0 + BN > len_k
            if not causal and not tail:
                assert m_bulk == 0
            if causal and not tail and (BM, BN) == (B.BLOCK_M, B.BLOCK_N):
                assert m_bulk <= 2                 # the diagonal spans two blocks at most
            # compute's walk (a head's masked blocks, then its bulk) is the issue order
            walk = [(g, jm) for g in range(G) for jm in
                    list(range(m_bulk)) + list(range(m_bulk, n_m))]
            assert walk == [(j // n_m, j % n_m) for j in range(G * n_m)]
            for jm in range(n_m):
                m0 = m_lo + jm * BM
                drop = _dropped(len_q, len_k, n0, m0, causal, BM, BN)
                if jm >= m_bulk:                   # bulk: nothing to drop
                    assert not drop.any(), (lens_q, lens_k, b, n0, m0, causal)
                    seen["bulk"] += 1
                    continue
                assert drop.any(), (lens_q, lens_k, b, n0, m0, causal)   # exact
                seen["masked"] += 1
                seen["tail" if tail else "diagonal"] += 1
                # the masked step keeps column c of key row r iff c >= its bound
                col = np.arange(BM)[None, :]
                bound = np.array([B.mask_bound(seq, n0 + r, m0, causal, BM)
                                  for r in range(BN)])[:, None]
                real = (m0 + col < len_q)
                keep = col >= bound
                assert np.array_equal(keep & real, ~drop & real), (lens_q, lens_k, n0, m0)
    assert all(seen.values()), seen


def test_split_on_a_causal_cross_sequence():
    """One sequence by hand: L_q 300, L_k 200 (offset -100), causal. Tile n0 = 0: its
    first row is 100, its last key is seen from row 227: blocks 0 (rows 0..127) and 1
    (128..255) are masked, block 2 (256..299) is the bulk. Tile n0 = 128 (keys 128..199,
    past the sequence from 200): every block masked."""
    from kernels_cute.seqinfo import SeqlenInfo
    seq = SeqlenInfo(0, 0, 0, 300, 200)
    assert B.bulk_start(seq, 0, 0, 3, True) == 2
    assert B.bulk_start(seq, 0, 0, 3, False) == 0
    assert B.bulk_start(seq, 128, 128, 2, True) == 2
    assert B.bulk_start(seq, 128, 0, 3, False) == 3
    # key 5 at rows 0.. (causal): seen from row 105; key 250 (past): never
    assert B.mask_bound(seq, 5, 0, True) == 105
    assert B.mask_bound(seq, 5, 0, False) == 0
    assert B.mask_bound(seq, 250, 256, True) >= B.BLOCK_M
    assert B.mask_bound(seq, 250, 0, False) == B.BLOCK_M
