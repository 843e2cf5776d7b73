"""The jagged tile order both kernel styles must produce, in plain torch ops: the
reference their `schedule.build_tiles` is tested against.

A tile is a (sequence, query block) pair `b * nblk + m`; tiles are ordered by
descending work (KV blocks to visit, plus one for the Q load and the epilogue, so
tiles with no key still count), ties by pair index; invalid pairs (past a sequence's
queries) come last.
"""
from __future__ import annotations

import torch


def longest_first_tiles(cu_q, cu_k, batch: int, max_seqlen_q: int, len_q_dense: int | None,
                        block_m: int, block_n: int, causal: bool):
    """-> (pairs int32 [batch * nblk], count int32 [1] of valid pairs, nblk)."""
    nblk = max(1, -(-max_seqlen_q // block_m))
    dev = cu_k.device
    len_k = (cu_k[1:] - cu_k[:-1]).to(torch.int32)
    if len_q_dense is not None:
        len_q = torch.full_like(len_k, len_q_dense)
    else:
        len_q = (cu_q[1:] - cu_q[:-1]).to(torch.int32)
    m0 = torch.arange(0, nblk * block_m, block_m, device=dev, dtype=torch.int32)[None, :]
    lq, lk = len_q[:, None], len_k[:, None]
    valid = m0 < lq
    if causal:  # bottom-right: row i sees keys j <= i + lk - lq
        kv_end = torch.clamp(torch.minimum(m0 + block_m + lk - lq, lk), min=0)
    else:
        kv_end = lk.expand(-1, nblk)
    work = torch.where(valid, (kv_end + block_n - 1) // block_n + 1, -1)
    pairs = torch.argsort(work.reshape(-1), descending=True, stable=True).to(torch.int32)
    count = valid.sum(dtype=torch.int32).reshape(1)
    return pairs, count, nblk
