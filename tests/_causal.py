"""A check of a backward's diagonal-only causal mask (the CuteDSL backward's `diagmask`)."""


def assert_cut_keeps_the_mask(cut, bm: int, BN: int, n_wg: int):
    """`cut(nc0, m0, off)` says whether the causal bound (key n kept iff n <= row + off,
    off = len_k - len_q) drops a pair of keys [nc0, nc0 + BN / n_wg) x rows [m0, m0 + bm).
    Over the schedule's steps (KV tiles, Q blocks from m_lo, every warpgroup), self and
    cross (bottom-right) lengths: the key-length mask everywhere plus the bound where
    `cut` says so equals the full causal mask on every row the sequence has (rows past it
    get P = 0 from lse = +inf), and at most BN / bm + 1 steps a warpgroup and tile are cut
    (the band of its keys, and for the second the rows from m_lo that see none of them)."""
    import numpy as np
    BNC = BN // n_wg
    for len_q in (1, 64, 100, 257):
        for off in range(-len_q + 1, 140):  # len_k - len_q: every residue of the blocks
            len_k = len_q + off
            for n0 in range(0, len_k, BN):  # schedule(): m_lo, n_m of a causal tile
                m_lo = max(n0 - len_k + len_q, 0) // bm * bm
                n_m = max(-(-(len_q - m_lo) // bm), 0)
                for w in range(n_wg):
                    nc0 = n0 + w * BNC
                    n = np.arange(nc0, nc0 + BNC)[:, None]
                    cuts = 0
                    for jm in range(n_m):
                        m0 = m_lo + jm * bm
                        m = np.arange(m0, m0 + bm)[None, :]
                        full = (n < len_k) & (n <= m + off)
                        is_cut = bool(cut(nc0, m0, off))
                        diag = (n < len_k) & ((n <= m + off) if is_cut else True)
                        rows = (m < len_q) & np.ones_like(n, dtype=bool)
                        assert (full == diag)[rows].all(), (len_q, len_k, n0, w, m0)
                        cuts += is_cut
                    assert cuts <= BN // bm + 1, (len_q, len_k, n0, w, cuts)
