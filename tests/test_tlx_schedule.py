"""The jagged tile lists of jagged.tiles and both styles' schedules (in the Triton
interpreter on CPU): the one-kernel key build + sort gives the same order and count as
the plain torch references, in every mode."""
import pytest
import torch
import triton
import triton.language as tl

from harness.problems import offsets
from jagged.tiles import longest_first_tiles
from kernels_cute.schedule import kv_block as cute_kv_block
from kernels_cute.schedule import kv_steps as cute_kv_steps
from kernels_tlx.schedule import build_tiles, tile_coords
from _interp import interp


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
    assert torch.equal(pairs & 0xFFFFFFFF, ref.long())  # the padding pairs too, in order


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bq", [False, True])
def test_kv_tiles_brute_force(causal, bq):
    """The backward's KV-tile list: every real (sequence, KV block) tile once, first,
    ordered by the number of query blocks that see it (counted pair by pair here); under
    causal masking by the sequence's largest such count (its block 0), a sequence's tiles
    together."""
    from jagged.tiles import kv_tiles
    BM, BN = 64, 128
    g = torch.Generator().manual_seed(int(causal) * 2 + int(bq))
    lk = torch.randint(0, 400, (23,), generator=g)
    lk[3] = 0
    lq = torch.full_like(lk, 150) if bq else torch.randint(0, 300, (23,), generator=g)
    cu_q = None if bq else offsets(lq)
    tile_b, tile_n, n_tiles = kv_tiles(cu_q, offsets(lk), 150 if bq else 0, int(lk.max()),
                                       causal, BM, BN)

    def work(b, n):
        q_blocks = set()
        for j in range(n * BN, min((n + 1) * BN, int(lk[b]))):
            for i in range(int(lq[b])):
                if not causal or j <= i + int(lk[b]) - int(lq[b]):
                    q_blocks.add(i // BM)
        return len(q_blocks)

    real = [(b, n) for b in range(len(lk)) for n in range(-(-int(lk[b]) // BN))]
    got = list(zip(tile_b.tolist(), tile_n.tolist()))[:int(n_tiles)]
    assert int(n_tiles) == len(real) and sorted(got) == sorted(real)
    works = [work(b, 0 if causal else n) for b, n in got]
    assert works == sorted(works, reverse=True)
    seqs = [b for b, _ in got]
    assert all(b not in seqs[:i] or seqs[i - 1] == b for i, b in enumerate(seqs))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bq", [False, True])
def test_kv_tiles_match_reference(causal, bq):
    """The kernel-built backward tile list equals the torch reference, order included;
    each sequence's tiles in one run, KV blocks ascending."""
    from jagged.tiles import kv_tiles, kv_tiles_reference
    g = torch.Generator().manual_seed(11 + 2 * causal + bq)
    B = 40
    lk = torch.randint(0, 400, (B,), generator=g)
    lq = torch.full((B,), 90) if bq else torch.randint(0, 400, (B,), generator=g)
    lk[:3] = torch.tensor([0, 1, 128])
    args = (None if bq else offsets(lq), offsets(lk), 90 if bq else 0, int(lk.max()), causal, 64, 128)
    got, ref = kv_tiles(*args), kv_tiles_reference(*args)
    n = int(ref[2])
    assert int(got[2]) == n
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])  # padding included
    b, t = got[0][:n].tolist(), got[1][:n].tolist()
    runs = [x for i, x in enumerate(b) if i == 0 or b[i - 1] != x]
    assert len(runs) == len(set(runs))
    assert all(t[i] == t[i - 1] + 1 for i in range(1, n) if b[i] == b[i - 1])


@pytest.mark.parametrize("causal", [False, True])
def test_tile_lists_in_runs_of_blocks(monkeypatch, causal):
    """The in-kernel sort writes each sequence's run of blocks RUN blocks a step
    (jagged.tiles.SORT_LANES / BLOCK): with two a step, sequences of up to 11 blocks take
    several steps, the last one partly past the run; both lists still equal their
    references, padding included."""
    import jagged.tiles as T
    monkeypatch.setattr(T, "SORT_LANES", 256)
    assert T.sort_launch(19, 11)["RUN"] == 2
    g = torch.Generator().manual_seed(5 + causal)
    lq = torch.randint(0, 700, (19,), generator=g)
    lk = torch.randint(0, 1400, (19,), generator=g)
    lq[:2], lk[2:4] = torch.tensor([0, 700]), torch.tensor([0, 1400])
    cq, ck = offsets(lq), offsets(lk)
    args = (cq, ck, 19, 700, None, 64, 128, causal)  # 11 query blocks of 64
    pairs, count, _ = build_tiles(*args)
    ref, ref_count, _ = longest_first_tiles(*args)
    assert int(count) == int(ref_count) and torch.equal(pairs & 0xFFFFFFFF, ref.long())
    kv = (cq, ck, 0, 1400, causal, 64, 128)  # 11 KV blocks of 128
    got, want = T.kv_tiles(*kv), T.kv_tiles_reference(*kv)
    assert int(got[2]) == int(want[2])
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_fwd_tiles_causal_order_by_sequence():
    """Causal forward lists keep a sequence's query blocks together, last (longest)
    first, sequences by their KV length; without causal masking, longest first."""
    cu = offsets(torch.tensor([130, 0, 300, 64, 300, 1]))
    nblk = 5
    for causal in (False, True):
        pairs, count, _ = build_tiles(cu, cu, 6, 300, None, 64, 64, causal)
        p = (pairs & 0xFFFFFFFF)[:int(count)].tolist()
        b, m = [x // nblk for x in p], [x % nblk for x in p]
        if causal:
            assert b == [2] * 5 + [4] * 5 + [0] * 3 + [3, 5] and m[:5] == [4, 3, 2, 1, 0]
        else:
            assert b[:10] == [2] * 5 + [4] * 5 and m[:5] == [0, 1, 2, 3, 4]


def test_fwd_bucket():
    """The forward's length bucket: 64-key blocks when every sequence fits one, by the
    mean KV length without causal masking, by the longest sequence with it."""
    from jagged.tiles import FWD_CAUSAL_SHORT_MAX_K, FWD_SHORT_MEAN_K, fwd_bucket
    assert fwd_bucket(64) == "short" and fwd_bucket(65) == "long"
    assert fwd_bucket(256, mean_k=26.5) == "short" and fwd_bucket(2048, mean_k=209) == "long"
    assert fwd_bucket(8192, mean_k=FWD_SHORT_MEAN_K) == "short"
    assert fwd_bucket(1024, mean_k=26.5, causal=True) == "long"
    assert fwd_bucket(FWD_CAUSAL_SHORT_MAX_K, mean_k=500.0, causal=True) == "short"
    assert fwd_bucket(FWD_CAUSAL_SHORT_MAX_K + 1, causal=True) == "long"
    assert fwd_bucket(FWD_CAUSAL_SHORT_MAX_K, mean_k=500.0) == "long"


def test_bwd_dynamic():
    """The backward takes packed tiles from a counter, causal or not; broadcast-Q
    (programs pinned to a head) never does."""
    from jagged.tiles import bwd_dynamic
    assert bwd_dynamic(False) and not bwd_dynamic(True)


def test_bwd_parts():
    """Tiles split over programs where a call has few long ones (jagged.tiles.bwd_parts,
    host sizes only): fuzz B2 H8/2 D64 16384 / 0.9's 442 tiles of ~450 steps in two, a
    handful of long tiles in four, a few GQA groups of eight heads in eight; many tiles, a
    list that already fills one round, short tiles and broadcast-Q stay whole; a loose
    bound on the lengths splits nothing by itself."""
    from jagged.tiles import bwd_parts, dkv_accumulator
    S = 132
    # (n_q, n_k, batch, h_kv, group, causal, broadcast_q, block_m) -> parts
    assert bwd_parts(28166, 28166, 2, 2, 4, False, False, 128, 128, S) == 2
    assert bwd_parts(4096, 4096, 1, 1, 1, False, False, 64, 128, S) == 4    # 33 tiles
    assert bwd_parts(4096, 4096, 1, 2, 1, False, False, 64, 128, S) == 2    # 65
    assert bwd_parts(8192, 8192, 2, 2, 1, False, False, 64, 128, S) == 1    # 130: one round
    assert bwd_parts(31574, 31574, 5, 8, 2, False, False, 64, 128, S) == 1   # 2000 tiles
    assert bwd_parts(1152 * 256, 1152 * 256, 1152, 4, 1, False, False, 64, 128, S) == 1
    assert bwd_parts(24 * 128, 24 * 128, 24, 2, 1, False, False, 64, 128, S) == 1  # 2 steps
    assert bwd_parts(28166, 28166, 2, 2, 4, False, True, 128, 128, S) == 1
    assert bwd_parts(0, 100, 2, 2, 4, False, False, 128, 128, S) == 1
    # causal: a key is seen by fewer rows (bottom-right), so fewer steps a tile
    assert bwd_parts(8192, 8192, 1, 1, 1, True, False, 64, 128, S) == 2
    assert bwd_parts(3 * 4096, 3 * 4096, 3, 1, 1, True, False, 64, 128, S) == 1
    # causal tiles differ: the first key block of the longest sequence (fuzz seed 2 B5
    # H4/1 D64 8192 / 0.5, max 7280 rows) bounds the span, halved by a split
    assert bwd_parts(26466, 26466, 5, 1, 4, True, False, 128, 128, S) == 1
    assert bwd_parts(26466, 26466, 5, 1, 4, True, False, 128, 128, S, 7280, 7280) == 2
    # a GQA group of eight heads over a few short causal sequences (fuzz seed 2 B5 H8/1
    # D128 2048 / 0.25: 17 tiles, the longest 104 steps) or one long one: eight parts
    assert bwd_parts(1825, 1825, 5, 1, 8, True, False, 64, 128, S, 823, 823) == 8
    assert bwd_parts(4137, 4137, 1, 1, 8, True, False, 64, 128, S, 4137, 4137) == 8
    # one sequence holds most of the keys (seed 2 B8 H2/1 D64 8192 / 0.25 causal, the
    # longest 4091 of 9164): the call's steps are more than its mean length says (its
    # squared lengths), the programs busy at four parts already
    assert bwd_parts(9164, 9164, 8, 1, 2, True, False, 128, 128, S, 4091, 4091) == 4
    # a padded bound far above the mean (fuzz cross B43 H8/8 D64 8192 / 2048 s0.1: 1604
    # rows at most, 738 on average): a sequence as long as the bound would want two parts,
    # but they gain less there than they lose where the bound is loose, so tiles stay whole
    from jagged.tiles import _fewest_index, parts_spans
    b43 = (31758, 8609, 43, 8, 1, False, 128, 128, S)
    assert 1 << _fewest_index(parts_spans(*b43, 8192, 2048)) == 2
    assert 1 << _fewest_index(parts_spans(*b43, 31758 / 43, 8609 / 43)) == 1
    assert bwd_parts(*b43[:6], False, *b43[6:], 8192, 2048) == 1
    # one sequence: its length is the call's, whatever the bound says
    assert (bwd_parts(818, 818, 1, 8, 1, True, False, 64, 128, S, 4096, 4096)
            == bwd_parts(818, 818, 1, 8, 1, True, False, 64, 128, S, 818, 818))
    assert dkv_accumulator(torch.empty(5, 2, 64), 1) is None
    acc = dkv_accumulator(torch.empty(5, 2, 64, dtype=torch.bfloat16), 2)
    assert acc.shape == (2, 5, 2, 64) and acc.dtype == torch.float32  # the preprocess zeroes it


@pytest.mark.parametrize("bq", [False, True])
def test_dq_accumulator_sched_buffer(bq):
    """The scheduling buffer follows the dQ accumulator in one allocation (fresh per
    call): the counter, then two handoff slots a program, 16-byte aligned."""
    from jagged.tiles import dq_accumulator
    acc, grid, sched = dq_accumulator(10, 7, 4, 2, 64, bq, 132, "cpu", 5000)
    assert acc.dtype == torch.float32 and sched.dtype == torch.int32
    # broadcast-Q: a slot per SLOT_KEYS keys (3 for 5000), 66 programs a KV head
    assert acc.shape == ((10, 4, 64) if not bq else (3, 7, 4, 64)) and acc.is_contiguous()
    assert grid == 132 and sched.numel() == 4 + 2 * grid
    assert sched.data_ptr() == acc.data_ptr() + acc.numel() * 4 and sched.data_ptr() % 16 == 0


@pytest.mark.parametrize("block_m", [64, 80, 128])
def test_flat_blocks_are_distinct(block_m):
    """A block-padded dQ accumulator (CuteDSL's Config.dq_flat): every Q block of every
    sequence (empty ones, one-row ones, lengths at and around multiples of the block) has a
    block of its own, all below flat_rows / block_m, however the offsets fall; the host's
    accumulator has those rows (dq_accumulator's `rows`)."""
    from jagged.tiles import dq_accumulator, flat_block, flat_rows
    gen = torch.Generator().manual_seed(block_m)
    edge = [0, 1, block_m - 1, block_m, block_m + 1, 2 * block_m, 3 * block_m - 1]
    for trial in range(200):
        n = int(torch.randint(1, 40, (1,), generator=gen))
        if trial % 2:
            lengths = torch.tensor(edge)[torch.randint(0, len(edge), (n,), generator=gen)]
        else:
            lengths = torch.randint(0, 5 * block_m, (n,), generator=gen)
        cu = [0] + torch.cumsum(lengths, 0).tolist()
        blocks = [flat_block(cu[b], b, j * block_m, block_m)
                  for b in range(n) for j in range(-(-int(lengths[b]) // block_m))]
        assert len(set(blocks)) == len(blocks)
        assert not blocks or (min(blocks) >= 0 and
                              max(blocks) < flat_rows(cu[-1], n, block_m) // block_m)
    acc, _, _ = dq_accumulator(10, 0, 4, 2, 64, False, 132, "cpu", 50,
                               rows=flat_rows(10, 3, block_m))
    assert acc.shape == (flat_rows(10, 3, block_m), 4, 64)


@pytest.mark.parametrize("B", [1, 2, 3, 5])
def test_tile_buffers_are_16_byte_aligned(B):
    """Every array the kernels receive starts 16-byte aligned whatever the size, so
    Triton's alignment specialization never compiles a second kernel variant."""
    from jagged.tiles import kv_tiles
    cu = offsets(torch.full((B,), 70))
    tb, tn, nt = kv_tiles(cu, cu, 0, 70, False, 64, 64)
    pairs, count, _ = build_tiles(cu, cu, B, 70, None, 64, 64, False)
    assert all(t.data_ptr() % 16 == 0 for t in (tb, tn, nt, pairs, count))
    assert int(nt) == 2 * B and int(count) == 2 * B


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("many", ["sequences", "blocks"])
def test_long_lists_take_the_torch_sort_path(causal, many):
    """Past SORT_MAX sequences, or NB_MAX blocks a sequence, the key kernels loop and
    torch.sort orders the keys: the same lists as the references."""
    from jagged.tiles import NB_MAX, SORT_MAX, kv_tiles, kv_tiles_reference, sort_launch
    g = torch.Generator().manual_seed(5 + causal)
    B, max_len = (SORT_MAX + 3, 100) if many == "sequences" else (3, 64 * NB_MAX + 1)
    lq = torch.randint(0, max_len, (B,), generator=g)
    lq[0] = max_len
    cq = offsets(lq)
    assert not sort_launch(B, -(-max_len // 64))["SORT"]
    args = (cq, cq, B, max_len, None, 64, 64, causal)
    pairs, count, _ = build_tiles(*args)
    ref, ref_count, _ = longest_first_tiles(*args)
    n = int(ref_count)
    assert int(count) == n and torch.equal((pairs & 0xFFFFFFFF)[:n], ref[:n].long())
    kargs = (cq, cq, 0, max_len, causal, 64, 64)
    got, want = kv_tiles(*kargs), kv_tiles_reference(*kargs)
    m = int(want[2])
    assert int(got[2]) == m and torch.equal(got[0][:m], want[0][:m])
    assert torch.equal(got[1][:m], want[1][:m])


def test_tile_lists_are_cached_per_offsets():
    """Same offsets objects, unchanged: the same lists, no rebuild. An in-place change
    through torch (version counter) or other offsets: built again, right."""
    from jagged.tiles import kv_tiles, kv_tiles_reference
    cu = offsets(torch.tensor([70, 3, 129]))
    args = (cu, cu, 3, 129, None, 64, 64, False)
    kargs = (cu, cu, 0, 129, False, 64, 64)
    first = build_tiles(*args)
    assert build_tiles(*args)[0] is first[0]
    assert kv_tiles(*kargs)[0] is kv_tiles(*kargs)[0]
    assert build_tiles(*args[:-1], True)[0] is not first[0]  # other parameters
    cu[1:] = offsets(torch.tensor([1, 129, 70]))[1:]          # in place: same object
    again = build_tiles(*args)
    ref, ref_count, _ = longest_first_tiles(*args)
    n = int(ref_count)
    assert again[0] is not first[0] and int(again[1]) == n
    assert torch.equal((again[0] & 0xFFFFFFFF)[:n], ref[:n].long())
    got, want = kv_tiles(*kargs), kv_tiles_reference(*kargs)
    m = int(want[2])
    assert int(got[2]) == m and torch.equal(got[0][:m], want[0][:m])
    other = cu.clone()                                        # equal values, new tensor
    assert build_tiles(other, other, *args[2:])[0] is not again[0]


def test_tile_cache_is_bounded():
    """At most TILE_CACHE_SIZE entries, least recently used out first. The cache is filled
    through per_offsets with a trivial build (a tile list is an interpreter run)."""
    from jagged.tiles import TILE_CACHE_SIZE, cached_builds, kv_tiles, per_offsets
    builds = []

    def build(cu_q, cu_k):
        builds.append(cu_k)
        return object()

    cus = [offsets(torch.tensor([i + 1])) for i in range(2 * TILE_CACHE_SIZE)]
    first = kv_tiles(cus[0], cus[0], 0, 1, False, 64, 64)[0]
    for cu in cus[1:TILE_CACHE_SIZE]:                  # full: the tile list and these
        per_offsets(build, cu, cu)
    assert kv_tiles(cus[0], cus[0], 0, 1, False, 64, 64)[0] is first   # used: now the newest
    per_offsets(build, cus[TILE_CACHE_SIZE], cus[TILE_CACHE_SIZE])    # drops cus[1]'s entry
    assert len(cached_builds()) <= TILE_CACHE_SIZE
    n = len(builds)
    per_offsets(build, cus[2], cus[2])                 # still there
    per_offsets(build, cus[1], cus[1])                 # built again
    assert len(builds) == n + 1 and builds[-1] is cus[1]
    for cu in cus[TILE_CACHE_SIZE + 1:]:
        per_offsets(build, cu, cu)
    assert len(cached_builds()) <= TILE_CACHE_SIZE
    assert kv_tiles(cus[0], cus[0], 0, 1, False, 64, 64)[0] is not first


@triton.jit
def _decode_tiles(pairs, n_pairs, cu, out, H, NBLK):
    for t in range(0, n_pairs * H):
        h, hk, m0, q_start, k_start, out_start, len_q, len_k, n_bulk, n_end, b, _ = tile_coords(
            t, pairs, n_pairs, cu, cu, 0, H, 1, NBLK, 64, 64, False, False)
        tl.store(out + 2 * t, q_start + m0)
        tl.store(out + 2 * t + 1, h)


def test_tile_coords_chunks():
    """Every (valid pair, head) tile exactly once; chunks of NBLK pairs, pairs fastest,
    then heads, keep the list's longest-first order of pairs."""
    H = 3
    cu = offsets(torch.tensor([130, 0, 64, 1, 200]))
    pairs, count, nblk = build_tiles(cu, cu, 5, 200, None, 64, 64, False)
    n = int(count)
    out = torch.full((2 * n * H,), -1, dtype=torch.int32)
    _decode_tiles[(1,)](pairs, n, cu, out, H, nblk)
    got = [tuple(x) for x in out.view(-1, 2).tolist()]
    starts = cu[:-1].tolist()
    pair_id = [starts[int(p) // nblk] + int(p) % nblk * 64 for p in (pairs[:n] & 0xFFFFFFFF)]
    assert sorted(got) == sorted((p, h) for p in pair_id for h in range(H))
    rank = {p: i for i, p in enumerate(pair_id)}
    chunks = [rank[p] // nblk for p, _ in got]
    assert chunks == sorted(chunks)


@triton.jit
def _kv_split(pairs, n_pairs, cu_q, cu_k, out, NBLK):
    for t in range(0, n_pairs):
        h, hk, m0, q_start, k_start, out_start, len_q, len_k, n_bulk, n_end, b, _ = tile_coords(
            t, pairs, n_pairs, cu_q, cu_k, 0, 1, 1, NBLK, 64, 64, True, False)
        tl.store(out + 3 * t, q_start + m0)
        tl.store(out + 3 * t + 1, n_bulk)
        tl.store(out + 3 * t + 2, n_end)


def test_tile_coords_causal_kv_split():
    """A causal tile's KV walk: blocks below n_end hold every key a row sees, blocks
    below n_bulk only keys every row sees (jagged.seqinfo's ranges), len_q > len_k and
    len_q < len_k."""
    from jagged.seqinfo import causal_kv_end_ref
    lq, lk = torch.tensor([130, 1, 64, 200, 70, 5]), torch.tensor([40, 90, 64, 1, 300, 0])
    cq, ck = offsets(lq), offsets(lk)
    pairs, count, nblk = build_tiles(cq, ck, 6, 200, None, 64, 64, True)
    n = int(count)
    out = torch.full((3 * n,), -1, dtype=torch.int32)
    _kv_split[(1,)](pairs, n, cq, ck, out, nblk)
    got = {r[0]: (r[1], r[2]) for r in out.view(-1, 3).tolist()}
    want = {}
    for b in range(6):
        for m0 in range(0, int(lq[b]), 64):
            end = int(causal_kv_end_ref(m0 + 64, lq[b], lk[b]))
            full = int(causal_kv_end_ref(m0 + 1, lq[b], lk[b]))
            want[int(cq[b]) + m0] = (full // 64, -(-end // 64))
    assert got == want


@triton.jit
def _decode_rounds(pairs, n_pairs, cu, out, H, NBLK):
    """As a persistent program walks: tiles pid, pid + P, ...; out[t] per loop index."""
    for t in range(tl.program_id(0), n_pairs * H, tl.num_programs(0)):
        h, hk, m0, q_start, k_start, out_start, len_q, len_k, n_bulk, n_end, b, _ = tile_coords(
            t, pairs, n_pairs, cu, cu, 0, H, 1, NBLK, 64, 64, False, False)
        tl.store(out + 2 * t, q_start + m0)
        tl.store(out + 2 * t + 1, h)


def test_tile_coords_boustrophedon():
    """With P programs, loop index t of round k = t // P takes list tile t, or in odd full
    rounds k * P + P - 1 - t % P; every tile exactly once (the last round may be short)."""
    H, P = 3, 4
    cu = offsets(torch.tensor([130, 0, 64, 1, 200]))
    pairs, count, nblk = build_tiles(cu, cu, 5, 200, None, 64, 64, False)
    n = int(count)
    plain = torch.full((2 * n * H,), -1, dtype=torch.int32)
    _decode_tiles[(1,)](pairs, n, cu, plain, H, nblk)
    walked = torch.full((2 * n * H,), -1, dtype=torch.int32)
    _decode_rounds[(P,)](pairs, n, cu, walked, H, nblk)
    plain, walked = plain.view(-1, 2).tolist(), walked.view(-1, 2).tolist()
    want = [t // P * P + P - 1 - t % P if t // P % 2 and (t // P + 1) * P <= n * H else t
            for t in range(n * H)]
    assert n * H % P and walked == [plain[i] for i in want]


@triton.jit
def _kv_walk(out_ptr, n_bulk, n_end, MASK_FIRST: tl.constexpr):
    """The forward's KV walk as `compute` and `load` run it: per step the block the
    consumer masks or not (out[2 * s], out[2 * s + 1]) and the block the producer loads
    (out[64 + s])."""
    from kernels_tlx.schedule import kv_block, kv_steps
    first, bulk_lo, bulk_end, tail_end = kv_steps(n_bulk, n_end, MASK_FIRST)
    tl.store(out_ptr, first)
    tl.store(out_ptr + 1, 1)
    s = 1
    for j in range(bulk_lo, bulk_end):
        tl.store(out_ptr + 2 * s, j)
        tl.store(out_ptr + 2 * s + 1, 0)
        s += 1
    for j in range(tl.maximum(bulk_end, bulk_lo), tail_end):
        tl.store(out_ptr + 2 * s, j)
        tl.store(out_ptr + 2 * s + 1, 1)
        s += 1
    for j in range(0, n_end):
        tl.store(out_ptr + 64 + j, kv_block(j, n_end, MASK_FIRST))


@pytest.mark.parametrize("mask_first", [False, True])
def test_kv_walk_covers_every_block_once(mask_first):
    """Every KV block of a tile is read once, every block >= n_bulk through the masked
    path, and the producer loads them in the consumer's step order (n_bulk <= n_end; a
    causal tile has n_bulk < n_end - 1, an aligned one n_bulk == n_end)."""
    for n_end in range(1, 9):
        for n_bulk in range(0, n_end + 1):
            out = torch.full((64 + n_end,), -1, dtype=torch.int32)
            _kv_walk[(1,)](out, n_bulk, n_end, mask_first)
            steps = out[:2 * n_end].view(-1, 2).tolist()
            blocks = [b for b, _ in steps]
            assert sorted(blocks) == list(range(n_end)), (n_bulk, n_end, steps)
            assert all(m for b, m in steps if b >= n_bulk), (n_bulk, n_end, steps)
            assert out[64:].tolist() == blocks, (n_bulk, n_end, out[64:].tolist(), blocks)
            # the CuteDSL roles walk the same steps (plain ints through their formulas)
            assert [cute_kv_block(j, n_end, mask_first) for j in range(n_end)] == blocks
            first, lo, end, tail = cute_kv_steps(n_bulk, n_end, mask_first)
            cute = [(first, 1)] + [(j, 0) for j in range(lo, end)] + \
                [(j, 1) for j in range(max(end, lo), tail)]
            assert cute == [tuple(x) for x in steps], (n_bulk, n_end, cute, steps)
            if mask_first and n_bulk >= n_end - 1:  # non-causal: one masked step, first
                assert [m for _, m in steps] == [1] + [0] * (n_end - 1)


# ----------------------------------------------------------------------------- tile -> sequence
@triton.jit
def _tile_sequence_kernel(pairs, count, cu_q, cu_k, out, L_q, H, GROUP, NBLK,
                          CAUSAL: tl.constexpr, BROADCAST_Q: tl.constexpr):
    n_pairs = tl.load(count)
    for t in range(tl.program_id(0), n_pairs * H, tl.num_programs(0)):
        tile = tile_coords(t, pairs, n_pairs, cu_q, cu_k, L_q, H, GROUP, NBLK, 64, 64,
                           CAUSAL, BROADCAST_Q)
        tl.store(out + 5 * t, tile.b)
        tl.store(out + 5 * t + 1, tile.k_start)
        tl.store(out + 5 * t + 2, tile.len_k)
        tl.store(out + 5 * t + 3, tile.q_start)
        tl.store(out + 5 * t + 4, tile.out_start)


@interp
@pytest.mark.parametrize("causal,bq", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("programs", [1, 3, 4])
def test_tile_sequence(programs, causal, bq):
    """Tile.b (the fp8 descales' row) names the sequence whose K rows, Q rows and output
    rows the same tile has, for every tile of a persistent walk (odd rounds flipped)
    with chunks and several heads."""
    len_q = [130, 0, 64, 1, 200, 65]
    len_k = [70, 5, 0, 1, 300, 64]
    cu_q, cu_k = offsets(torch.tensor(len_q)), offsets(torch.tensor(len_k))
    H, group, L_q = 4, 2, 70
    pairs, count, nblk = build_tiles(None if bq else cu_q, cu_k, len(len_k),
                                     L_q if bq else max(len_q), L_q if bq else None, 64, 64,
                                     causal)
    n = int(count)
    out = torch.full((5 * n * H,), -1, dtype=torch.int32)
    _tile_sequence_kernel[(programs,)](pairs, count, cu_k if bq else cu_q, cu_k, out,
                                         L_q if bq else 0, H, group, nblk, causal, bq)
    rows = out.view(-1, 5).tolist()
    assert len(rows) == n * H and min(r[0] for r in rows) >= 0
    for b, k_start, lk, q_start, out_start in rows:
        assert (k_start, lk) == (int(cu_k[b]), len_k[b])
        if bq:
            assert out_start == b * L_q
        else:
            assert q_start == int(cu_q[b]) and len_q[b] > 0


@interp
@pytest.mark.parametrize("n_seq,extra", [(40, 0), (40, 9), (5000, 0)])  # one pass; several
def test_window_tiles_match_reference(n_seq, extra):
    """The row-window tile list against its torch reference: empty sequences (first,
    last, runs), rows past the last sequence (dead windows last), longest first by work
    bucket (exact, then octaves up to the last bucket), ties in row order, every row in
    one window; 5000 sequences take several counting passes."""
    from jagged.tiles import ORDER_LANES, window_tiles, window_tiles_reference
    g = torch.Generator().manual_seed(n_seq + extra)
    lq = torch.randint(0, 7, (n_seq,), generator=g)
    lq[:2] = 0
    lq[-3:] = 0
    lq[10:15] = 0
    lk = torch.randint(0, 60, (n_seq,), generator=g)
    lk[5:9] = torch.tensor([300, 2000, 9000, 40000])   # octave buckets, the last one
    cu_q, cu_k = offsets(lq), offsets(lk)
    BM = 2 if n_seq > 1000 else 8
    n_rows = int(cu_q[-1]) + extra * BM
    order, count, win = window_tiles(cu_q, cu_k, n_rows, int(lq.max()), BM, 16)
    ref = window_tiles_reference(cu_q, cu_k, n_rows, BM, 16)
    assert (int(count) > ORDER_LANES) == (n_seq == 5000)
    assert torch.equal(win, ref[2]) and torch.equal(count, ref[1])
    assert torch.equal(order, ref[0])
    live = int(count)
    assert sorted(order[:live].tolist()) == list(range(live))
    covered = torch.zeros(int(cu_q[-1]), dtype=torch.int32)  # each row in one window
    for w in range(live):
        start, end = int(win[2, w]), int(cu_q[int(win[1, w]) + 1])
        covered[start:min(end, start + BM)] += 1
    assert (covered == 1).all()


def test_dq_slots():
    """Broadcast-Q slots: one per SLOT_KEYS keys of the call, at most one per program of
    a KV head, within MAX_SLOT_BYTES, at least one."""
    from jagged.tiles import MAX_SLOT_BYTES, SLOT_KEYS, dq_slots
    assert dq_slots(33, 8 << 20, 5200) == 3
    assert dq_slots(33, 8 << 20, 33 * SLOT_KEYS + 1) == 33
    assert dq_slots(66, 1 << 20, 1) == 1 and dq_slots(66, 1 << 20, 0) == 1
    assert dq_slots(132, MAX_SLOT_BYTES // 4, 10 ** 6) == 4


@triton.jit
def _direct_split(n_pairs, cu_q, cu_k, out, H, NBLK, CAUSAL: tl.constexpr):
    for t in range(0, n_pairs * H):
        h, hk, m0, q_start, k_start, out_start, len_q, len_k, n_bulk, n_end, b, _ = tile_coords(
            t, None, n_pairs, cu_q, cu_k, 0, H, 1, NBLK, 64, 64, CAUSAL, False, 1, True)
        tl.store(out + 5 * t, b)
        tl.store(out + 5 * t + 1, m0)
        tl.store(out + 5 * t + 2, h)
        tl.store(out + 5 * t + 3, n_bulk)
        tl.store(out + 5 * t + 4, n_end)


@pytest.mark.parametrize("causal", [False, True])
def test_tile_coords_direct(causal):
    """DIRECT (jagged.tiles.fwd_direct, no list): every (pair, head) of the batch once, in
    pair order; a real pair's KV walk as the list's (test_tile_coords_causal_kv_split),
    and a pair past its sequence's queries visits no block (zero-length sequences too)."""
    from jagged.seqinfo import causal_kv_end_ref
    lq, lk = torch.tensor([130, 0, 64, 200, 1]), torch.tensor([40, 90, 0, 300, 64])
    cq, ck = offsets(lq), offsets(lk)
    H, nblk = 2, 4  # max 200 rows: 4 blocks of 64 a sequence
    n = len(lq) * nblk
    out = torch.full((5 * n * H,), -7, dtype=torch.int32)
    _direct_split[(1,)](n, cq, ck, out, H, nblk, causal)
    got = [tuple(r) for r in out.view(-1, 5).tolist()]
    assert sorted((b, m0, h) for b, m0, h, _, _ in got) == sorted(
        (b, m * 64, h) for b in range(len(lq)) for m in range(nblk) for h in range(H))
    for b, m0, h, n_bulk, n_end in got:
        if m0 >= int(lq[b]):
            assert (n_bulk, n_end) == (0, 0), (b, m0)
        elif causal:
            end = int(causal_kv_end_ref(m0 + 64, lq[b], lk[b]))
            full = int(causal_kv_end_ref(m0 + 1, lq[b], lk[b]))
            assert (n_bulk, n_end) == (full // 64, -(-end // 64)), (b, m0)
        else:
            assert (n_bulk, n_end) == (int(lk[b]) // 64, -(-int(lk[b]) // 64)), (b, m0)


def test_bwd_head_run():
    """List entries a KV head in runs (jagged.tiles.bwd_head_run) for non-causal calls
    whose longest sequence's Q / dO / dQ rows over all heads exceed the L2 budget while
    two KV heads' fit it, where the list holds a whole run: llm B8 H16 8192 (134 MB, 8.4
    MB a head, 512 entries), B4 H32/8 4096 and fuzz B27 H16/8 D64 16384. Causal masking,
    rows under the budget (gem 2048 / 0.9 at H4: 8.4 MB), two heads' rows over it (fuzz
    B5 H8/4 D128 16384: 33.5 MB a KV head), a single KV head, a short list, broadcast-Q
    and key windows keep the heads innermost (1)."""
    from jagged.tiles import BWD_HEAD_RUN, BWD_HEAD_RUN_BYTES, bwd_head_run
    assert bwd_head_run(8 * 8192, 8, 16, 16, 8192, 128, 128, False, False) == BWD_HEAD_RUN
    assert bwd_head_run(4 * 4096, 4, 32, 8, 4096, 128, 128, False, False) == BWD_HEAD_RUN
    assert bwd_head_run(4 * 4096, 4, 32, 8, 4096, 128, 128, True, False) == 1
    assert bwd_head_run(53680, 27, 16, 8, 16384, 64, 128, False, False) == BWD_HEAD_RUN
    assert bwd_head_run(1152 * 1843, 1152, 4, 4, 2048, 128, 128, False, False) == 1
    assert bwd_head_run(31574, 5, 8, 4, 16384, 128, 128, False, False) == 1
    assert bwd_head_run(28166, 2, 8, 2, 16384, 64, 128, False, False) == 1
    assert 4 * 2048 * 128 * 8 <= BWD_HEAD_RUN_BYTES < 16 * 8192 * 128 * 8
    assert bwd_head_run(8 * 8192, 8, 16, 1, 8192, 128, 128, False, False) == 1
    assert bwd_head_run(4096, 1, 64, 64, 4096, 128, 128, False, False) == 1
    assert bwd_head_run(8 * 8192, 8, 16, 16, 8192, 128, 128, False, True) == 1
    assert bwd_head_run(8 * 8192, 8, 16, 16, 8192, 128, 128, False, False, windows=True) == 1


@triton.jit
def _head_run_kernel(n_tiles, out, HKV: tl.constexpr, RUN: tl.constexpr):
    from kernels_tlx.schedule import KVTiles, head_run_coords
    tiles = KVTiles(n_tiles, n_tiles, n_tiles, n_tiles, n_tiles, 0, n_tiles, 1, RUN)
    n = tl.load(n_tiles) * HKV
    for u in range(0, n):
        base, hk = head_run_coords(u, tiles, HKV)
        tl.store(out + 2 * u, base)
        tl.store(out + 2 * u + 1, hk)


@interp
@pytest.mark.parametrize("n,hkv,run", [(11, 2, 1), (11, 2, 3), (11, 4, 2), (5, 3, 8),
                                       (130, 8, 64)])
def test_head_run_coords(n, hkv, run):
    """TLX's head_run_coords against the protocol model's (harness.protocol.tiles, which
    the CuteDSL twin follows): every (list entry, KV head) once, a run's entries for head
    0 first, the last run shorter."""
    from harness.protocol.tiles import head_run_coords
    out = torch.full((2 * n * hkv,), -1, dtype=torch.int32)
    _head_run_kernel[(1,)](torch.tensor([n], dtype=torch.int32), out, hkv, run)
    got = [tuple(x) for x in out.view(-1, 2).tolist()]
    assert got == [head_run_coords(u, n, hkv, run) for u in range(n * hkv)]
    assert sorted(got) == [(e, h) for e in range(n) for h in range(hkv)]
