"""The calls the protocol models run over and their tile walks: `Problem` (a jagged call
as a tile list sees it), the forward tile list and KV steps, `Walk` / `BwdWalk` (which
programs took which tiles, checked complete when a run ends) and `random_problem`."""
from __future__ import annotations

import random
from dataclasses import dataclass

from .sim import ProtocolError


@dataclass(frozen=True)
class Problem:
    """A jagged forward call as the tile list sees it: per-sequence query and key
    lengths (broadcast-Q: every query length is L_q), heads, causal."""
    lens_q: tuple
    lens_k: tuple
    heads: int = 1
    causal: bool = False
    broadcast_q: bool = False
    kv_heads: int = 0   # GQA: heads // kv_heads query heads a KV head (0: heads)

    @property
    def hkv(self) -> int:
        return self.kv_heads or self.heads


@dataclass(frozen=True)
class FwdTile:
    b: int
    h: int
    m0: int
    n_bulk: int      # KV blocks [0, n_bulk) need no mask
    n_end: int       # KV blocks [n_bulk, n_end) are masked
    len_q: int       # the sequence's query rows

    @property
    def key(self):
        return (self.b, self.h, self.m0)


def _causal_kv_end(row_end, len_q, len_k):
    return min(max(row_end + len_k - len_q, 0), len_k)


def fwd_tile_list(problem: Problem, block_m: int, block_n: int):
    """(pairs, count, nblk) from the CPU reference of the shared forward tile list
    (jagged.tiles.longest_first_tiles; the GPU build is tested equal to it)."""
    import torch

    from jagged.tiles import longest_first_tiles
    lq = torch.tensor(problem.lens_q, dtype=torch.int32)
    lk = torch.tensor(problem.lens_k, dtype=torch.int32)
    cu = lambda x: torch.cat([torch.zeros(1, dtype=torch.int32), x.cumsum(0).to(torch.int32)])
    B = len(problem.lens_k)
    L_q = problem.lens_q[0] if problem.broadcast_q else None
    max_q = max(problem.lens_q) if B else 0
    pairs, count, nblk = longest_first_tiles(None if problem.broadcast_q else cu(lq), cu(lk),
                                             B, max_q, L_q, block_m, block_n, problem.causal)
    return [int(x) for x in pairs], int(count), nblk


def fwd_tile_coords(t: int, P: int, pairs, n_pairs: int, nblk: int, problem: Problem,
                    block_m: int, block_n: int, flip: bool = True,
                    direct: bool = False) -> FwdTile:
    """Tile id t -> FwdTile: the arithmetic of both styles' schedule.tile_coords (the
    boustrophedon round-robin of P programs unless not `flip`, chunks of nblk pairs with
    pairs fastest, then heads). direct (jagged.tiles.fwd_direct): `pairs` is every pair
    in order, and a pair past its sequence's queries visits no KV block."""
    H = problem.heads
    if flip:
        k = t // P
        f = (k % 2) * min(max(n_pairs * H // P - k, 0), 1)
        t = t + f * (P - 1 - 2 * (t - k * P))
    span = nblk * H
    first = t // span * nblk
    chunk_len = min(nblk, n_pairs - first)
    r = t - t // span * span
    pair = pairs[first + r % chunk_len]
    b, m0 = pair // nblk, pair % nblk * block_m
    len_q, len_k = problem.lens_q[b], problem.lens_k[b]
    if problem.causal:
        kv_end = _causal_kv_end(m0 + block_m, len_q, len_k)
        kv_full = _causal_kv_end(m0 + 1, len_q, len_k)
    else:
        kv_end = kv_full = len_k
    n_end = -(-kv_end // block_n) if not direct or m0 < len_q else 0
    return FwdTile(b, r // chunk_len, m0, min(kv_full // block_n, n_end), n_end, len_q)


def kv_block(j, n_end, mask_first):
    """schedule.kv_block: the KV block of a tile's j-th step."""
    return (j + n_end - 1) % n_end if mask_first else j


def kv_steps(n_bulk, n_end, mask_first):
    """schedule.kv_steps: (first, bulk_lo, bulk_end, tail_end)."""
    if mask_first:
        return n_end - 1, 0, min(n_bulk, n_end - 1), n_end - 1
    return 0, 1, n_bulk, n_end


def consumer_steps(t: FwdTile, causal: bool, mask_first: bool) -> list[int]:
    """The KV blocks a consumer reads, in its order: the peeled first step, the bulk,
    the tail (none without causal masking under mask_first: the code has no tail)."""
    first, bulk_lo, bulk_end, tail_end = kv_steps(t.n_bulk, t.n_end, mask_first)
    steps = [first] + list(range(bulk_lo, bulk_end))
    if causal or not mask_first:
        steps += list(range(max(bulk_end, bulk_lo), tail_end))
    return steps


class Walk:
    """A launch over the tile list: `programs` persistent programs (at most one per
    (pair, head) of the list's upper bound, as the hosts size their grids), `total` tile
    ids, `coords(t)`, the tiles each program walks in the static round-robin, and the
    check that the tiles finished are those of the list, each once. direct
    (jagged.tiles.fwd_direct): no list, every (pair, head) in order, a program each."""

    def __init__(self, problem: Problem, block_m: int, block_n: int, programs: int,
                 flip: bool = True, direct: bool = False):
        self.problem = problem
        pairs, count, nblk = fwd_tile_list(problem, block_m, block_n)
        if direct:
            count = len(problem.lens_k) * nblk
            pairs = list(range(count))
        self.total = n = count * problem.heads
        self.bound = len(problem.lens_k) * nblk * problem.heads
        self.programs = P = max(1, self.bound if direct else min(programs, self.bound))
        self.coords = lambda t: fwd_tile_coords(t, P, pairs, count, nblk, problem, block_m,
                                                block_n, flip, direct)
        self.tiles = [[self.coords(t) for t in range(p, n, P)] for p in range(P)]
        self.want = sorted((pair // nblk, h, pair % nblk * block_m)
                           for pair in pairs[:count] for h in range(problem.heads))
        self.done: list = []

    def finish(self):
        got = sorted(self.done)
        if got != self.want:
            raise ProtocolError("coverage", f"tiles finished {got}, the list holds {self.want}")


class BwdWalk:
    """A backward launch over the KV-tile list (jagged.tiles.kv_tiles_reference, the CPU
    reference the GPU build is tested equal to): the tiles of `programs` programs as
    schedule.tile_range and kv_tile_coords walk them (packed: the list x KV heads x
    `parts` parts round-robin, or from the counter; broadcast-Q: programs pinned to a KV
    head), and the check that the consumers finished each (tile, KV head, part) once."""

    def __init__(self, problem: Problem, block_m: int, block_n: int, programs: int,
                 parts: int = 1, head_run: int = 1):
        import torch

        from jagged.tiles import kv_tiles_reference
        self.problem, self.block_m, self.block_n = problem, block_m, block_n
        self.parts = 1 if problem.broadcast_q else parts
        self.head_run = 1 if problem.broadcast_q else head_run
        HKV = problem.hkv
        lq = torch.tensor(problem.lens_q, dtype=torch.int32)
        lk = torch.tensor(problem.lens_k, dtype=torch.int32)
        cu = lambda x: torch.cat([torch.zeros(1, dtype=torch.int32), x.cumsum(0).to(torch.int32)])
        L_q = problem.lens_q[0] if problem.broadcast_q else 0
        tb, tn, n = kv_tiles_reference(None if problem.broadcast_q else cu(lq), cu(lk), L_q,
                                       max(problem.lens_k), problem.causal, block_m, block_n)
        self.tile_b, self.tile_n, self.n_real = tb.tolist(), tn.tolist(), int(n)
        if problem.broadcast_q:  # dq_accumulator: slots x KV heads
            self.programs = HKV * max(1, programs // HKV)
        else:
            self.programs = max(1, programs)
        self.want = sorted((base, hk, part) for base in range(self.n_real)
                           for hk in range(HKV) for part in range(self.parts))
        self.done: list = []

    def range(self, pid):
        """schedule.tile_range: (first, step, end)."""
        HKV, P = self.problem.hkv, self.programs
        if self.problem.broadcast_q:
            return pid // HKV, P // HKV, self.n_real
        return pid, P, self.n_real * HKV * self.parts

    def coords(self, t, pid):
        """schedule.kv_tile_coords -> (key, hk, b, m_lo, n_m): the whole tile's Q blocks."""
        pr, HKV, BM, PT = self.problem, self.problem.hkv, self.block_m, self.parts
        base, hk = (t, pid % HKV) if pr.broadcast_q else \
            head_run_coords(t // PT, self.n_real, HKV, self.head_run)
        part = 0 if pr.broadcast_q else t % PT
        b, n0 = self.tile_b[base], self.tile_n[base] * self.block_n
        len_q, len_k = pr.lens_q[b], pr.lens_k[b]
        m_lo = max(n0 - len_k + len_q, 0) // BM * BM if pr.causal else 0
        n_m = max(-(-(len_q - m_lo) // BM), 0)
        return (base, hk, part), hk, b, m_lo, n_m

    def steps(self, t, pid):
        """-> (key, the Q steps of tile t's part as (b, query head, first row)): its GQA
        group's heads one after another, each over the rows that see its keys; a part
        takes its even share of them (schedule.part_steps)."""
        key, hk, b, m_lo, n_m = self.coords(t, pid)
        G, BM, PT = self.problem.heads // self.problem.hkv, self.block_m, self.parts
        part = key[2]
        j0, j1 = part * G * n_m // PT, (part + 1) * G * n_m // PT
        return key, [(b, hk * G + j // n_m, m_lo + (j % n_m) * BM) for j in range(j0, j1)]

    def finish(self):
        if sorted(self.done) != self.want:
            raise ProtocolError("coverage", f"tiles finished {sorted(self.done)}, the list "
                                f"holds {self.want}")


def head_run_coords(u: int, n: int, HKV: int, run: int) -> tuple[int, int]:
    """schedule.head_run_coords: whole tile u of a list of n entries x HKV heads -> (list
    entry, KV head), the entries in runs of `run`, each run's for head 0, then 1, ..."""
    if run == 1:
        return u // HKV, u % HKV
    chunk = u // (run * HKV)
    first = chunk * run
    g = min(run, n - first)
    r = u - chunk * (run * HKV)
    return first + r % g, r // g


def random_problem(rng: random.Random, block_m: int, block_n: int,
                   max_len: int | None = None) -> Problem:
    """A small jagged call: 1-5 sequences whose lengths favour the edges (0, 1, a KV block
    or a query tile and one either side, two blocks and one), else up to max_len (default
    three query tiles); self or cross lengths, broadcast-Q now and then, causal or not,
    one or two heads."""
    edges = [0, 1, 2, block_n - 1, block_n, block_n + 1, 2 * block_n + 1, block_m - 1,
             block_m, block_m + 1]
    max_len = 3 * block_m + 5 if max_len is None else max_len

    def length():
        return rng.choice(edges) if rng.random() < 0.6 else rng.randint(0, max_len)

    B = rng.randint(1, 5)
    lens_k = tuple(length() for _ in range(B))
    bq = rng.random() < 0.2
    if bq:
        lens_q = (max(1, length()),) * B
    elif rng.random() < 0.4:
        lens_q = lens_k
    else:
        lens_q = tuple(length() for _ in range(B))
    heads = rng.randint(1, 2)
    return Problem(lens_q, lens_k, heads=heads, causal=rng.random() < 0.5, broadcast_q=bq,
                   kv_heads=1 if heads == 2 and rng.random() < 0.5 else 0)
