"""Sequence ranges and the bottom-right causal range, written once for every kernel.

Sequence b of a packed operand holds tokens [cu[b], cu[b + 1]) (the FA varlen offsets);
a DENSE operand (broadcast-Q's query) is shared by every sequence: tokens [0, dense_len).

Causal masking is bottom-right aligned, as FA's: within a sequence of len_q queries and
len_k keys, query row i sees key j iff j <= i + len_k - len_q (the last query row sees
every key; with len_q > len_k the first len_q - len_k rows see none). Hence:

- the rows [0, row_end) (row_end >= 1) see the keys [0, causal_kv_end(row_end, len_q,
  len_k)), so a block of rows [m0, m0 + BLOCK_M) needs the keys below
  causal_kv_end(m0 + BLOCK_M, ...), and every row of it sees the keys below
  causal_kv_end(m0 + 1, ...) (no mask needed there);
- key n0 is seen by the rows [causal_q_start(n0, len_q, len_k), len_q) (the backward's
  view: a KV block starting at n0 meets no query row before it).

A block of packed rows may also span sequences (a window of short sequences): each row
then sees the packed key columns [lo, hi) of its own sequence (`row_seq`,
`row_kv_range`), the causal cut included; a block of key columns, the rows
`col_q_range` gives. Over a whole batch a row's sequence is a binary search of the
offsets (`sequence_of`).

Both ranges are clamped to the sequence ([0, len_k] and [0, len_q]). The `@triton.jit`
helpers work on scalars or blocks, in plain Triton and TLX kernels alike; the `*_ref`
functions are their torch references (the tile lists' and the tests').
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def seq_range(cu, b, dense_len, DENSE: tl.constexpr):
    """(first token, length) of sequence b; a DENSE operand (length dense_len, first
    token 0) is shared by every b and cu is not read."""
    if DENSE:
        return 0, dense_len
    start = tl.load(cu + b)
    return start, tl.load(cu + b + 1) - start


@triton.jit
def causal_last_key(i, len_q, len_k):
    """The last key query row i sees (bottom-right; may be negative: none, or past
    len_k for a row past the sequence)."""
    return i + (len_k - len_q)


@triton.jit
def causal_visible(i, j, len_q, len_k):
    """Whether query row i sees key j (bottom-right; i and j broadcast). The sequence's
    bounds (i < len_q, j < len_k) are the caller's."""
    return j <= causal_last_key(i, len_q, len_k)


@triton.jit
def causal_kv_end(row_end, len_q, len_k):
    """Keys [0, result) are those the query rows below row_end (>= 1) see, clamped to
    [0, len_k]: row_end + len_k - len_q."""
    return tl.minimum(tl.maximum(row_end + (len_k - len_q), 0), len_k)


@triton.jit
def causal_q_start(n0, len_q, len_k):
    """The first query row that sees key n0, clamped to [0, len_q]."""
    return tl.minimum(tl.maximum(n0 - (len_k - len_q), 0), len_q)


@triton.jit
def row_seq(cu, s_first, s_last, rows, CHUNK: tl.constexpr):
    """The sequence holding each packed row of `rows` (a block), given the sequences
    s_first..s_last that hold the block's first and last row: s_first plus the count of
    the offsets cu[s_first + 1 .. s_last] at or below the row (empty sequences included),
    CHUNK offsets a pass."""
    seq = rows * 0 + s_first
    for j0 in range(s_first + 1, s_last + 1, CHUNK):
        j = j0 + tl.arange(0, CHUNK)
        starts = tl.load(cu + j, mask=j <= s_last, other=2147483647)
        seq += tl.sum((starts[None, :] <= rows[:, None]).to(tl.int32), 1)
    return seq


@triton.jit
def sequence_of(token, cu, B, steps):  # role: schedule
    """The largest b in [0, B] with cu[b] <= token (an empty sequence shares its start
    with the next one, and the largest b is the one holding the token); b == B means
    past the last sequence. `steps` >= ceil(log2(B + 1)) halvings. Over a whole batch;
    row_seq's scan suits a window's few sequences."""
    lo = tl.zeros_like(token)
    hi = lo + B
    for _ in range(steps):
        mid = (lo + hi + 1) // 2
        below = tl.load(cu + mid) <= token
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid - 1)
    return lo


@triton.jit
def dq_accumulated(cu_q, cu_k, B, seq, tok, LONG_K: tl.constexpr, CAUSAL: tl.constexpr):
    """Key windows: whether packed query rows `tok` of sequences `seq` (`sequence_of`'s; B:
    past the last) take their dQ from the fp32 accumulator: rows past the last sequence
    (zeros), rows of a sequence of more than LONG_K keys (its key blocks windows of their
    own) or, CAUSAL, rows that see no key of their sequence (zeros: a window's walk
    starts past its first sequence's). CuteDSL's `seqinfo.dq_accumulated`."""
    real = seq < B
    keys = (tl.load(cu_k + seq + 1, mask=real, other=0)
            - tl.load(cu_k + seq, mask=real, other=0))
    acc = ~real | (keys > LONG_K)
    if CAUSAL:  # bottom-right: a key from the sequence's last `keys` rows on
        acc = acc | (tok < tl.load(cu_q + seq + 1, mask=real, other=0) - keys)
    return acc


@triton.jit
def row_kv_range(cu_q, cu_k, seq, rows, CAUSAL: tl.constexpr):
    """[lo, hi): the packed key columns packed query row `rows` (of sequence `seq`, both
    blocks) sees: its sequence's keys, CAUSAL up to row - q_end + k_end (bottom-right:
    query i sees key j iff j <= i + len_k - len_q, in packed coordinates)."""
    lo = tl.load(cu_k + seq)
    hi = tl.load(cu_k + seq + 1)
    if CAUSAL:
        hi = tl.minimum(hi, rows + 1 + hi - tl.load(cu_q + seq + 1))
    return lo, hi


@triton.jit
def col_q_range(cu_q, cu_k, seq, cols, CAUSAL: tl.constexpr):
    """[lo, hi): the packed query rows that see packed key column `cols` (of sequence
    `seq`): its sequence's rows, CAUSAL from col - k_end + q_end on (the transpose of
    row_kv_range)."""
    lo = tl.load(cu_q + seq)
    hi = tl.load(cu_q + seq + 1)
    if CAUSAL:
        lo = tl.maximum(lo, cols + hi - tl.load(cu_k + seq + 1))
    return lo, hi


# ----------------------------------------------------------------------------- torch references

def seq_range_ref(cu, dense_len: int | None = None, batch: int | None = None):
    """(first tokens, lengths) int64 [B] of every sequence; dense_len: a dense operand
    shared by `batch` sequences (cu unused)."""
    if dense_len is not None:
        return (torch.zeros(batch, dtype=torch.int64),
                torch.full((batch,), dense_len, dtype=torch.int64))
    cu = cu.to(torch.int64)
    return cu[:-1], cu[1:] - cu[:-1]


def causal_visible_ref(i, j, len_q, len_k):
    return torch.as_tensor(j) <= torch.as_tensor(i) + (torch.as_tensor(len_k) - len_q)


def causal_kv_end_ref(row_end, len_q, len_k):
    len_k = torch.as_tensor(len_k)
    return torch.minimum(torch.clamp(torch.as_tensor(row_end) + (len_k - len_q), min=0), len_k)


def causal_q_start_ref(n0, len_q, len_k):
    len_q = torch.as_tensor(len_q)
    return torch.minimum(torch.clamp(torch.as_tensor(n0) - (len_k - len_q), min=0), len_q)


def row_kv_range_ref(cu_q, cu_k, rows, causal: bool):
    """`row_seq` and `row_kv_range` for packed rows (int64 tensors): (seq, lo, hi)."""
    cu_q, cu_k, rows = cu_q.to(torch.int64), cu_k.to(torch.int64), torch.as_tensor(rows)
    seq = torch.searchsorted(cu_q, rows, right=True) - 1
    lo, hi = cu_k[seq], cu_k[seq + 1]
    if causal:
        hi = torch.minimum(hi, rows + 1 + hi - cu_q[seq + 1])
    return seq, lo, hi


def col_q_range_ref(cu_q, cu_k, cols, causal: bool):
    """`row_seq` over key offsets and `col_q_range` for packed key columns: (seq, lo, hi)."""
    cu_q, cu_k, cols = cu_q.to(torch.int64), cu_k.to(torch.int64), torch.as_tensor(cols)
    seq = torch.searchsorted(cu_k, cols, right=True) - 1
    lo, hi = cu_q[seq], cu_q[seq + 1]
    if causal:
        lo = torch.maximum(lo, cols + hi - cu_k[seq + 1])
    return seq, lo, hi
