"""Sequence ranges and the bottom-right causal range of the CuteDSL kernels, written once:
the CuteDSL twin of `jagged/seqinfo.py`, with the same names and semantics.

Sequence b of a packed operand holds tokens [cu[b], cu[b + 1]); broadcast-Q's query is
one dense [L_q, H, D] shared by every sequence (first token 0, length L_q) whose out /
lse / dO rows are b * L_q on.

Causal masking is bottom-right aligned, as FA's: query row i sees key j iff
j <= i + len_k - len_q (`causal_visible`). The rows [0, row_end) see the keys
[0, causal_kv_end(row_end)), and key n0 is seen by the rows [causal_q_start(n0), len_q);
both clamped to the sequence.

A window of packed query rows may span sequences (row windows, the forward of short
sequences): each row sees the packed key columns [lo, hi) of its own sequence
(`row_seq_chunk` finds it, `row_kv_range` gives the range, the causal cut included).
A window of packed key columns (key windows, the backward of short sequences) is the
transpose: each column meets the packed query rows [lo, hi) of its own sequence
(`row_seq_chunk` over the key offsets, `col_q_range`). Over a whole batch a row's
sequence is a binary search of the offsets (`sequence_of_step`).

Plain arithmetic, traced inside a @cute.jit role on the DSL's integers; importing this
module does not load the DSL.
"""
from typing import Any, NamedTuple


def _min(a, b):
    import cutlass
    return cutlass.min(a, b)


def _max(a, b):
    import cutlass
    return cutlass.max(a, b)


def causal_last_key(i, len_q, len_k):
    """The last key query row i sees (may be negative: none, or past len_k for a row past
    the sequence)."""
    return i + (len_k - len_q)


def causal_visible(i, j, len_q, len_k):
    """Whether query row i sees key j (the sequence's bounds are the caller's)."""
    return j <= causal_last_key(i, len_q, len_k)


# Both clamp with the max last (the same for len_q, len_k >= 0): the compiler then knows
# the result is not negative, so a division by a block is a shift, and sm_90 fuses the
# pair (min.relu).
def causal_kv_end(row_end, len_q, len_k):
    """Keys [0, result) are those the query rows below row_end see, clamped to
    [0, len_k]."""
    return _max(_min(row_end + (len_k - len_q), len_k), 0)


def causal_q_start(n0, len_q, len_k):
    """The first query row that sees key n0, clamped to [0, len_q]."""
    return _max(_min(n0 - (len_k - len_q), len_q), 0)


# role: schedule
class SeqlenInfo(NamedTuple):
    """Where sequence b lives in the packed tensors, and its lengths."""
    q_start: Any      # first row of its queries in q (broadcast-Q: 0)
    out_start: Any    # first row of its out / lse / dO rows (broadcast-Q: b * L_q)
    k_start: Any      # first row of its keys in k, v
    len_q: Any
    len_k: Any

    @staticmethod
    def of(b, mCuQ, mCuK, L_q, broadcast_q: bool) -> "SeqlenInfo":
        """Sequence b's ranges from the offsets (broadcast-Q: mCuQ unused, L_q)."""
        k_start = mCuK[b]
        len_k = mCuK[b + 1] - k_start
        if broadcast_q:
            q_start = b * 0
            len_q = L_q + b * 0
            out_start = b * L_q
        else:
            q_start = mCuQ[b]
            len_q = mCuQ[b + 1] - q_start
            out_start = q_start
        return SeqlenInfo(q_start, out_start, k_start, len_q, len_k)

    def causal_visible(self, i, j):
        return causal_visible(i, j, self.len_q, self.len_k)

    def causal_kv_end(self, row_end):
        return causal_kv_end(row_end, self.len_q, self.len_k)

    def row_kv_end(self, row, pack: int = 1):
        """Keys [0, result) that tile row `row` sees under the causal mask; a tile that
        packs `pack` GQA heads (jagged.tiles.gqa_pack) gives row r its query row's cut,
        r // pack of len_q // pack, aligned bottom right."""
        if pack > 1:
            return self.causal_kv_end(row // pack + 1 + (self.len_q - self.len_q // pack))
        return self.causal_kv_end(row + 1)

    def causal_q_start(self, n0):
        return causal_q_start(n0, self.len_q, self.len_k)


# role: compute (row windows)
ROW_SEQ_CHUNK = 8  # offsets a pass of row_seq_chunk compares (loads in flight at once)


def row_seq_chunk(cu, j0, s_last, row, seq):
    """One pass of `row_seq` (jagged.seqinfo): seq plus the count of the offsets
    cu[j0 .. min(j0 + ROW_SEQ_CHUNK, s_last + 1)) at or below packed row `row`. Starting
    from s_first, the passes over j0 = s_first + 1, + ROW_SEQ_CHUNK, ... up to s_last give
    the sequence holding the row (empty sequences passed over). Loads stay inside
    cu[.. s_last] (the index is clamped, the count guarded), so they need no branch."""
    for i in range(ROW_SEQ_CHUNK):
        j = j0 + i
        seq = seq + ((j <= s_last) & (cu[_min(j, s_last)] <= row))
    return seq


def sequence_of_step(cu, row, lo, hi):
    """One halving of `sequence_of` (jagged.seqinfo) -> (lo, hi): from lo = 0, hi = B,
    after ceil(log2(B + 1)) steps lo is the largest b in [0, B] with cu[b] <= row (B:
    past the last sequence). Branch-free."""
    import cutlass
    mid = (lo + hi + 1) // 2
    below = cu[mid] <= row
    return cutlass.select_(below, mid, lo), cutlass.select_(below, hi, mid - 1)


def dq_accumulated(cu_q, cu_k, B, seq, tok, long_k: int, causal: bool):
    """Key windows: whether packed query row `tok` of sequence `seq` (`sequence_of_step`'s;
    B: past the last) takes its dQ from the fp32 accumulator: a row past the last sequence
    (zeros), a row of a sequence of more than long_k keys (its key blocks windows of their
    own) or, causal, a row that sees no key of its sequence (zeros: a window's walk starts
    past its first sequence's). jagged.seqinfo.dq_accumulated's twin."""
    last = _min(seq, B - 1)                 # an in-bounds read past the last one
    keys = cu_k[last + 1] - cu_k[last]
    acc = (seq == B) | (keys > long_k)
    if causal:  # bottom-right: a key from the sequence's last `keys` rows on
        acc = acc | (tok < cu_q[last + 1] - keys)
    return acc


def row_kv_range(cu_q, cu_k, seq, row, causal: bool):
    """[lo, hi): the packed key columns packed query row `row` (of sequence `seq`) sees:
    its sequence's keys, causal up to row - q_end + k_end (bottom-right, in packed
    coordinates; hi < lo when the row sees none)."""
    lo = cu_k[seq]
    hi = cu_k[seq + 1]
    if causal:
        hi = _min(hi, row + 1 + hi - cu_q[seq + 1])
    return lo, hi


def col_q_range(cu_q, cu_k, seq, col, causal: bool):
    """[lo, hi): the packed query rows that see packed key column `col` (of sequence
    `seq`): its sequence's rows, causal from col + q_end - k_end on (bottom-right, the
    transpose of row_kv_range; hi <= lo when no row sees it)."""
    lo = cu_q[seq]
    hi = cu_q[seq + 1]
    if causal:
        lo = _max(lo, col + hi - cu_k[seq + 1])
    return lo, hi
