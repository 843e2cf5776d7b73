"""`schedule`: the jagged tile list, built on the GPU from the offsets (no host sync).

The CuteDSL twin of `kernels_tlx/schedule.py` (same pair encoding, same order):

A *pair* is (batch element b, query block m) for m < cdiv(max_seqlen_q, BLOCK_M); it
is valid when the block holds at least one query row. Valid pairs are ordered by
descending KV work (KV blocks the block visits, causal-aware), invalid ones go last,
and the count of valid pairs stays on the device. Heads are folded in by the kernel:
tile t is (pair t // H, head t % H), so the H tiles of one pair (and the query heads
sharing a KV head under GQA) run side by side on neighbouring SMs.

A persistent program p takes tiles p, p + P, p + 2P, ... of this longest-first list.

`build_tiles` runs on the host (one key kernel + a device sort); `tile_coords` is the
device-side decode every role of the kernel calls with the same tile id, so the
`load` warp and the `compute` warpgroups agree on every tile without talking.
"""

import torch



WORK_TOP = 1 << 30  # sort key = (WORK_TOP - work) << 32 | pair: ascending = longest first
KEYS_THREADS = 256
_KEYS_COMPILED = {}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _keys_kernel_class():
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32, Int64, const_expr

    class TileKeys:
        """One sort key per (sequence, query block) pair, and the count of valid pairs."""

        def __init__(self, block_m: int, block_n: int, causal: bool, broadcast_q: bool):
            self.block_m, self.block_n = block_m, block_n
            self.causal, self.broadcast_q = causal, broadcast_q

        @cute.jit
        def __call__(self, mCuQ, mCuK: cute.Tensor, mKeys: cute.Tensor, mCount: cute.Tensor,
                     n_pairs: Int32, nblk: Int32, L_q: Int32, stream):
            self.kernel(mCuQ, mCuK, mKeys, mCount, n_pairs, nblk, L_q).launch(
                grid=[(n_pairs + KEYS_THREADS - 1) // KEYS_THREADS, 1, 1],
                block=[KEYS_THREADS, 1, 1], stream=stream)

        @cute.kernel
        def kernel(self, mCuQ, mCuK: cute.Tensor, mKeys: cute.Tensor, mCount: cute.Tensor,
                   n_pairs: Int32, nblk: Int32, L_q: Int32):
            pair = cute.arch.block_idx()[0] * KEYS_THREADS + cute.arch.thread_idx()[0]
            valid = pair < n_pairs
            if pair < n_pairs:
                b = pair // nblk
                m0 = (pair % nblk) * self.block_m
                len_k = mCuK[b + 1] - mCuK[b]
                len_q = L_q
                if const_expr(not self.broadcast_q):
                    len_q = mCuQ[b + 1] - mCuQ[b]
                valid = m0 < len_q
                kv_end = len_k
                if const_expr(self.causal):  # bottom-right: row i sees keys j <= i + lk - lq
                    kv_end = cutlass.min(cutlass.max(m0 + self.block_m + len_k - len_q, 0), len_k)
                # work = KV blocks + one for the Q load / epilogue
                work = (kv_end + self.block_n - 1) // self.block_n + 1
                key = (Int64(WORK_TOP - work) << 32) | Int64(pair)
                if not valid:
                    key = Int64(0x7FFFFFFFFFFFFFFF)
                mKeys[pair] = key
            ballot = cute.arch.vote_ballot_sync(valid)
            if cute.arch.lane_idx() == 0:
                cute.arch.atomic_add(mCount.iterator, Int32(cute.arch.popc(ballot)))

    return TileKeys


def _keys_kernel(block_m, block_n, causal, broadcast_q):
    key = (block_m, block_n, bool(causal), bool(broadcast_q))
    if key not in _KEYS_COMPILED:
        import cutlass
        import cutlass.cute as cute
        from cutlass.cute.runtime import make_fake_tensor

        def fake(dtype, align=4):
            return make_fake_tensor(dtype, (cute.sym_int32(),), stride=(1,), assumed_align=align)

        nb = cute.sym_int32()
        cu_k = make_fake_tensor(cutlass.Int32, (nb,), stride=(1,), assumed_align=4)
        cu_q = None if broadcast_q else make_fake_tensor(cutlass.Int32, (nb,), stride=(1,),
                                                         assumed_align=4)
        _KEYS_COMPILED[key] = cute.compile(
            _keys_kernel_class()(block_m, block_n, causal, broadcast_q),
            cu_q, cu_k, fake(cutlass.Int64, 8), fake(cutlass.Int32),
            cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(0),
            cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True),
            options="--enable-tvm-ffi")
    return _KEYS_COMPILED[key]


def build_tiles(cu_q, cu_k, batch: int, max_seqlen_q: int, len_q_dense: int | None,
                block_m: int, block_n: int, causal: bool):
    """-> (pairs int64 [>= batch * nblk], longest first, the pair b * nblk + m in the low 32
    bits; count int32 [1] of valid pairs; nblk). One small CuteDSL kernel makes the keys,
    one device sort orders them: no host sync, few launches.

    `len_q_dense` is L_q in broadcast-Q mode (cu_q is None), else None."""
    nblk = max(1, cdiv(max_seqlen_q, block_m))
    n_pairs = batch * nblk
    keys = torch.empty(n_pairs, dtype=torch.int64, device=cu_k.device)
    count = torch.zeros(1, dtype=torch.int32, device=cu_k.device)
    _keys_kernel(block_m, block_n, causal, len_q_dense is not None)(
        None if len_q_dense is not None else cu_q, cu_k, keys, count, n_pairs, nblk,
        len_q_dense or 0)
    return torch.sort(keys).values, count, nblk


def tile_coords(tile, mPairs, mCuQ, mCuK, L_q, H, group, nblk,
                BLOCK_M: int, BLOCK_N: int, CAUSAL: bool, BROADCAST_Q: bool):
    """Tile id -> where it lives (device side, traced inside a @cute.jit role):
    head h, kv head, first query row m0 (in-sequence), packed row bases of q / k / out,
    the lengths, and the KV block split: blocks [0, n_bulk) need no mask, blocks
    [n_bulk, n_end) are masked."""
    import cutlass

    pair = cutlass.Int32(mPairs[tile // H] & 0xFFFFFFFF)
    h = tile % H
    b = pair // nblk
    m0 = (pair % nblk) * BLOCK_M
    k_start = mCuK[b]
    len_k = mCuK[b + 1] - k_start
    if cutlass.const_expr(BROADCAST_Q):
        q_start = b * 0
        len_q = L_q + b * 0
        out_start = b * L_q
    else:
        q_start = mCuQ[b]
        len_q = mCuQ[b + 1] - q_start
        out_start = q_start
    if cutlass.const_expr(CAUSAL):
        diag = len_k - len_q
        kv_end = cutlass.min(cutlass.max(m0 + BLOCK_M + diag, 0), len_k)
        kv_full = cutlass.min(cutlass.max(m0 + 1 + diag, 0), len_k)  # seen by every row
    else:
        kv_end = len_k
        kv_full = len_k
    n_end = (kv_end + BLOCK_N - 1) // BLOCK_N
    n_bulk = kv_full // BLOCK_N
    return h, h // group, m0, q_start, k_start, out_start, len_q, len_k, n_bulk, n_end
