"""A CPU model checker for the barrier protocols of the warp-specialized kernels.

A kernel's roles (load, compute, softmax, ...) are written as Python generators that
yield the synchronizing operations the kernel performs, in the kernel's order, with the
ring index and parity arithmetic of the kernel. `Sim` runs them under a seeded random
interleaving, with the asynchronous engines (TMA copies, MMAs and their commits) as
extra actors whose completions interleave too, and stops at the first violation:

- deadlock: no role and no engine can move and not every role is done (the report
  lists every role's pending operation and the state of what it waits on);
- race: a buffer written while a role that read it has not released it, written while
  another write is in flight, read while a write is in flight (before its writer
  signalled), or released while the role's own asynchronous MMA still reads it;
- stale: a read finds a different version than the one the role expects (every write
  carries a tag naming the data, every read the tag it needs);
- aliasing: an mbarrier wait that would pass on the wrong phase: the role's n-th wait on
  a barrier means phase n (minus one if its first wait passed on the initial state);
  it fails if the barrier has run two phases ahead of it or is behind it while the
  parity lets it through;
- arrival: an arrive on an mbarrier phase that has no arrivals left, a named barrier
  generation over its thread count or completed by arrives alone (a lost turn).

What is modelled: mbarriers (expected arrival count, transaction bytes, phase bit,
wait(parity)); named barriers (bar.sync / bar.arrive with thread counts); buffers in
shared or tensor memory, by name; TMA copies (async writes completing transaction
bytes); MMAs (async reads and writes, retired by wgmma.wait_group or completed by a
commit that arrives on an mbarrier); a global tile counter (atomic add). What is not:
registers, memory fences and proxies (a fence is assumed where the kernel has one),
thread divergence inside a role (a role is one warp group acting as one), timing.

Models of the kernels' protocols are at the end (`MODELS`); `python -m harness.protocol`
runs them all.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple


# ----------------------------------------------------------------------------- operations
class Wait(NamedTuple):
    """mbarrier.try_wait.parity: passes once the barrier's current phase parity differs
    from `parity` (the phase of that parity has completed). `phase`: the phase the role
    means, when it does not wait every phase in order (default: inferred)."""
    bar: str
    parity: int
    phase: int | None = None


class Arrive(NamedTuple):
    """mbarrier.arrive (count arrivals; with tx: arrive.expect_tx). `release`: buffers
    this arrive hands back (the role stops holding them)."""
    bar: str
    count: int = 1
    tx: int = 0
    release: tuple = ()


class Tma(NamedTuple):
    """An async copy into `writes` ({buffer: tag}) completing `tx` bytes on `bar`."""
    bar: str
    writes: dict
    tx: int


class Read(NamedTuple):
    """A synchronous read of `buf` expecting version `tag` (None: any)."""
    buf: str
    tag: Any = None


class Write(NamedTuple):
    """A synchronous write of `buf` (version `tag`)."""
    buf: str
    tag: Any = None


class Mma(NamedTuple):
    """An async MMA reading `reads` ({buffer: tag}) and writing `writes`; in flight until
    retired by `MmaWait` (wgmma) or completed by a `Commit` (tcgen05). MMAs of one role run
    in order: one may read what an earlier one of the role still writes."""
    reads: dict
    writes: dict = {}


class MmaWait(NamedTuple):
    """wgmma.wait_group: retire this role's MMAs until at most `pending` are in flight."""
    pending: int = 0


class Commit(NamedTuple):
    """tcgen05.commit: once every MMA this role issued so far has completed, arrive on
    `bar` (and release `release`)."""
    bar: str
    release: tuple = ()


class Release(NamedTuple):
    bufs: tuple


class BarSync(NamedTuple):
    """bar.sync on a named barrier: block until `threads` threads have reached it."""
    id: str
    threads: int


class BarArrive(NamedTuple):
    id: str
    threads: int


class Take(NamedTuple):
    """Atomic add of 1 on a global counter; the old value is sent back to the role."""
    counter: str


def ring(count: int, stages: int) -> tuple[int, int]:
    """Slot and mbarrier parity of the count-th use of a `stages`-deep ring (as the
    kernels compute them)."""
    return count % stages, (count // stages) & 1


class ProtocolError(Exception):
    def __init__(self, kind: str, message: str, trace=()):
        self.kind = kind
        self.trace = list(trace)
        super().__init__(f"{kind}: {message}" + ("\n  last events:\n    " +
                                                   "\n    ".join(self.trace) if trace else ""))


# ----------------------------------------------------------------------------- state
class _MBarrier:
    __slots__ = ("count", "phase", "pending", "tx", "waiters")

    def __init__(self, count):
        self.count = count
        self.phase = 0          # completed phases
        self.pending = count    # arrivals left in the current phase
        self.tx = 0             # transaction bytes outstanding in the current phase
        self.waiters = []       # roles whose next operation waits on it


class _Named:
    __slots__ = ("threads", "arrived", "gen", "syncers", "by", "blocked")

    def __init__(self):
        self.threads = self.arrived = self.gen = self.syncers = 0
        self.by = []
        self.blocked = []


class _Buffer:
    __slots__ = ("tag", "writer", "pending", "holders")

    def __init__(self):
        self.tag = None
        self.writer = None      # who writes it now (a role, or an engine item), or None
        self.pending = None     # the version being written
        self.holders = {}       # role -> the tag it read


class _Role:
    __slots__ = ("name", "gen", "threads", "weight", "op", "done", "ready", "waits", "mmas",
                 "blocked_gen")

    def __init__(self, name, gen, threads):
        self.name, self.gen, self.threads = name, gen, threads
        self.op = None
        self.done = False
        self.ready = False
        self.waits = {}         # barrier -> [waits passed, offset]
        self.mmas = []          # in-flight MMAs, oldest first
        self.blocked_gen = None  # BarSync: the generation it waits on


class Sim:
    """One interleaving of a set of roles. `mutate(role, op) -> op | None` rewrites (or
    drops) each operation before it runs; `counts` overrides mbarrier arrival counts (by
    barrier or array name)."""

    def __init__(self, seed: int = 0, mutate: Callable | None = None,
                 counts: dict | None = None, max_steps: int = 2_000_000):
        self.rng = random.Random(seed)
        self.mutate = mutate
        self.counts = counts or {}
        self.max_steps = max_steps
        self.bars: dict[str, _MBarrier] = {}
        self.named: dict[str, _Named] = {}
        self.bufs: dict[str, _Buffer] = {}
        self.counters: dict[str, int] = {}
        self.roles: list[_Role] = []
        self.engine: list = []      # in-flight TMA copies and commits
        self.trace = deque(maxlen=24)
        self.steps = 0

    # --- construction
    def mbarriers(self, name: str, n: int, count: int) -> list[str]:
        names = [f"{name}[{i}]" for i in range(n)]
        for b in names:
            self.bars[b] = _MBarrier(self.counts.get(b, self.counts.get(name, count)))
        return names

    def buffers(self, name: str, n: int) -> list[str]:
        names = [f"{name}[{i}]" for i in range(n)]
        for b in names:
            self.bufs[b] = _Buffer()
        return names

    def named_barrier(self, name: str) -> str:
        self.named[name] = _Named()
        return name

    def counter(self, name: str, start: int = 0) -> str:
        self.counters[name] = start
        return name

    def role(self, name: str, gen: Iterator, threads: int = 128):
        self.roles.append(_Role(name, gen, threads))

    # --- errors
    def fail(self, kind, msg):
        raise ProtocolError(kind, msg, [f"{who}: {what}" for who, what in self.trace])

    # --- running
    def run(self) -> int:
        """Run to the end; raises ProtocolError. Returns the number of steps."""
        rng = self.rng
        for r in self.roles:
            r.weight = rng.uniform(0.05, 1.0)  # a skew per run: some roles run far ahead
            self._advance(r, None)
        while True:
            moves = [r for r in self.roles if r.ready]
            total = sum(r.weight for r in moves) + 0.5 * len(self.engine)
            if total == 0:
                break
            self.steps += 1
            if self.steps > self.max_steps:
                self.fail("livelock", f"no end after {self.max_steps} steps")
            x = rng.random() * total
            for r in moves:
                x -= r.weight
                if x < 0:
                    self._step(r)
                    break
            else:
                self._complete(self.engine[min(int(-x / 0.5), len(self.engine) - 1)])
        left = [r for r in self.roles if not r.done]
        if left:
            self.fail("deadlock", "no role can move:\n" + "\n".join(
                f"    {r.name}: {self._describe(r.op)}" for r in left))
        for r in self.roles:
            if r.mmas:
                self.fail("race", f"{r.name} ended with {len(r.mmas)} MMAs in flight")
        return self.steps

    def _advance(self, r: _Role, value):
        """Fetch r's next operation and file it: ready, or waiting on a barrier."""
        try:
            op = r.gen.send(value)
            while self.mutate is not None:
                new = self.mutate(r.name, op)
                if new is not None:
                    op = new
                    break
                op = r.gen.send(None)  # dropped: the next one
        except StopIteration:
            r.done, r.op, r.ready = True, None, False
            return
        if op is None:
            self.fail("model", f"{r.name} yielded None")
        r.op = op
        if type(op) is Wait:
            self.bars[op.bar].waiters.append(r)
            r.ready = self._passes(r, op)
        else:
            r.ready = True

    def _describe(self, op) -> str:
        if type(op) is Wait:
            b = self.bars[op.bar]
            return (f"wait {op.bar} parity {op.parity} (completed phases {b.phase}, "
                    f"arrivals left {b.pending}/{b.count}, tx {b.tx})")
        if type(op) is BarSync:
            n = self.named[op.id]
            return f"bar.sync {op.id} ({n.arrived}/{op.threads} threads, by {n.by})"
        return repr(op)

    # --- mbarrier waits, with the aliasing check
    def _passes(self, r: _Role, op: Wait) -> bool:
        b = self.bars[op.bar]
        if op.phase is not None:
            k = op.phase
        else:
            n, off = r.waits.get(op.bar, (0, op.parity))  # a first wait on parity 1
            k = n - off                                   # passes on the initial state
        passes = (b.phase & 1) != op.parity
        if b.phase >= k + 2 or (passes and b.phase != k + 1):
            self.fail("aliasing", f"{r.name} waits {op.bar} parity {op.parity} meaning "
                      f"phase {k}, the barrier has completed {b.phase} phases")
        return passes

    def _step(self, r: _Role):
        op = r.op
        self.trace.append((r.name, op))
        value = None
        kind = type(op)
        if kind is Wait:
            self.bars[op.bar].waiters.remove(r)
            w = r.waits.get(op.bar)
            if w is None:
                r.waits[op.bar] = [1, op.parity]
            else:
                w[0] += 1
        elif kind is Arrive:
            self._release(r, op.release)
            self._arrive(op.bar, op.count, op.tx, r.name)
        elif kind is Tma:
            item = ("tma", r.name, op)
            for buf, tag in op.writes.items():
                self._open_write(buf, item, r.name, tag)
            self.engine.append(item)
        elif kind is Read:
            self._read(r, op.buf, op.tag, mma=False)
        elif kind is Write:
            self._open_write(op.buf, r.name, r.name, op.tag)
            self._close_write(op.buf, op.tag)
        elif kind is Mma:
            for buf, tag in op.reads.items():
                self._read(r, buf, tag, mma=True)
            for buf, tag in op.writes.items():
                self._open_write(buf, r.name, r.name, tag, own_mma=True)
            r.mmas.append(op)
        elif kind is MmaWait:
            while len(r.mmas) > op.pending:
                self._retire(r.mmas.pop(0))
        elif kind is Commit:
            self.engine.append(("commit", r.name, op, r.mmas))
            r.mmas = []
        elif kind is Release:
            self._release(r, op.bufs)
        elif kind is BarSync:
            if r.blocked_gen is None and not self._named(r, op, sync=True):
                r.blocked_gen = self.named[op.id].gen
                r.ready = False
                return  # blocked until this generation completes
            r.blocked_gen = None
        elif kind is BarArrive:
            self._named(r, op, sync=False)
        elif kind is Take:
            value = self.counters[op.counter]
            self.counters[op.counter] += 1
        else:
            self.fail("model", f"{r.name} yielded {op!r}")
        self._advance(r, value)

    def _named(self, r: _Role, op, sync: bool) -> bool:
        """Add r's threads to the named barrier's generation; True if it completed."""
        n = self.named[op.id]
        if n.threads and n.threads != op.threads:
            self.fail("arrival", f"{r.name} on {op.id} with {op.threads} threads, the "
                      f"generation counts {n.threads}")
        n.threads = op.threads
        n.arrived += r.threads
        n.by.append(r.name)
        if n.arrived > n.threads:
            self.fail("arrival", f"{op.id}: {n.arrived} threads arrived, {n.threads} expected "
                      f"(by {n.by})")
        if n.arrived < n.threads:
            if sync:
                n.syncers += 1
                n.blocked.append(r)
            return False
        if not (n.syncers or sync):
            self.fail("arrival", f"{op.id} completed by arrives alone (by {n.by}): a "
                      f"turn nobody waited for")
        for w in n.blocked:
            w.ready = True
        n.arrived = n.syncers = n.threads = 0
        n.by, n.blocked = [], []
        n.gen += 1
        return True

    def _arrive(self, bar: str, count: int, tx: int, who: str):
        b = self.bars[bar]
        if b.pending < count:
            self.fail("arrival", f"{who} arrives {count} on {bar}, whose phase {b.phase} has "
                      f"{b.pending} arrivals left")
        b.pending -= count
        b.tx += tx
        self._maybe_complete(b)

    def _maybe_complete(self, b: _MBarrier):
        if b.pending == 0 and b.tx == 0:
            b.phase += 1
            b.pending = b.count
            for r in b.waiters:
                r.ready = self._passes(r, r.op)

    # --- buffers
    def _read(self, r: _Role, buf: str, tag, mma: bool):
        s = self.bufs[buf]
        have = s.tag
        if s.writer is not None:
            if not (mma and s.writer == r.name):
                self.fail("race", f"{r.name} reads {buf} while {self._who(s.writer)} still "
                          f"writes it (before its writer signalled)")
            have = s.pending  # the role's own earlier MMA: in order
        if tag is not None and have != tag:
            self.fail("stale", f"{r.name} reads {buf} expecting {tag}, it holds {have}")
        s.holders[r.name] = have

    def _open_write(self, buf: str, writer, role: str, tag, own_mma: bool = False):
        s = self.bufs[buf]
        if s.writer is not None and not (own_mma and s.writer == role):
            self.fail("race", f"{role} writes {buf} while {self._who(s.writer)} still writes it")
        others = [f"{h} (read {t})" for h, t in s.holders.items() if h != role]
        if others:
            self.fail("race", f"{role} writes {buf} before its readers released it: "
                      + ", ".join(others))
        for other in self.roles:
            if other.mmas and other.name != role and any(buf in m.reads for m in other.mmas):
                self.fail("race", f"{role} writes {buf} while an MMA of {other.name} reads it")
        s.writer, s.pending = writer, tag
        s.holders = {}

    def _close_write(self, buf: str, tag):
        s = self.bufs[buf]
        s.writer, s.tag, s.pending = None, tag, None

    @staticmethod
    def _who(w):
        return w if isinstance(w, str) else f"a {w[0]} of {w[1]}"

    def _release(self, r: _Role, bufs):
        for buf in bufs:
            if any(buf in m.reads or buf in m.writes for m in r.mmas):
                self.fail("race", f"{r.name} releases {buf} while its own MMA still uses it")
            self.bufs[buf].holders.pop(r.name, None)

    def _retire(self, m: Mma):
        for buf, tag in m.writes.items():
            self._close_write(buf, tag)

    def _complete(self, item):
        self.engine.remove(item)
        self.trace.append(("engine", f"{item[0]} of {item[1]} completes"))
        if item[0] == "tma":
            op = item[2]
            for buf, tag in op.writes.items():
                self._close_write(buf, tag)
            b = self.bars[op.bar]
            b.tx -= op.tx
            self._maybe_complete(b)
        else:  # a commit: its MMAs complete, then the arrive
            _, who, op, mmas = item
            for m in mmas:
                self._retire(m)
            for buf in op.release:
                self.bufs[buf].holders.pop(who, None)
            self._arrive(op.bar, 1, 0, who)


def check(build: Callable[[Sim], Any], seeds, **sim_kw) -> int:
    """Build and run one Sim per seed (build(sim) adds the roles); raises the first
    ProtocolError, with the seed in its message; calls `finish()` on what build returns
    after each clean run. Returns the total steps."""
    steps = 0
    for seed in seeds:
        sim = Sim(seed, **sim_kw)
        ctx = build(sim)
        try:
            steps += sim.run()
            if callable(getattr(ctx, "finish", None)):
                ctx.finish()
        except ProtocolError as e:
            e.args = (f"seed {seed}: {e.args[0]}",)
            raise
    return steps


# ============================================================================= models
# The protocols of the kernels, read from their code: the same roles, rings, barriers
# (names and arrival counts), the same order of waits, arrives, copies and MMAs, and the
# same tile walk. Each `*_model(sim, problem, cfg, programs)` adds one CTA's roles per
# persistent program and returns a `Walk` that checks, when the run is over, that the
# programs took every tile of the list exactly once.

@dataclass(frozen=True)
class Problem:
    """A jagged forward call as the tile list sees it: per-sequence query and key
    lengths (broadcast-Q: every query length is L_q), heads, causal."""
    lens_q: tuple
    lens_k: tuple
    heads: int = 1
    causal: bool = False
    broadcast_q: bool = False


@dataclass(frozen=True)
class FwdTile:
    b: int
    h: int
    m0: int
    n_bulk: int      # KV blocks [0, n_bulk) need no mask
    n_end: int       # KV blocks [n_bulk, n_end) are masked

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
                    block_m: int, block_n: int) -> FwdTile:
    """Tile id t -> FwdTile: the arithmetic of both styles' schedule.tile_coords (the
    boustrophedon round-robin, chunks of nblk pairs with pairs fastest, then heads)."""
    H = problem.heads
    k = t // P
    flip = (k % 2) * min(max(n_pairs * H // P - k, 0), 1)
    t = t + flip * (P - 1 - 2 * (t - k * P))
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
    return FwdTile(b, r // chunk_len, m0, kv_full // block_n, -(-kv_end // block_n))


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
    """The tiles each program walks (static round-robin), and the check that the
    consumers finished each tile of the list exactly once."""

    def __init__(self, problem: Problem, block_m: int, block_n: int, programs: int):
        self.problem = problem
        pairs, count, nblk = fwd_tile_list(problem, block_m, block_n)
        n = count * problem.heads
        self.programs = max(1, min(programs, len(problem.lens_k) * nblk * problem.heads))
        P = self.programs
        self.tiles = [[fwd_tile_coords(t, P, pairs, count, nblk, problem, block_m, block_n)
                       for t in range(p, n, P)] for p in range(P)]
        self.want = sorted((pair // nblk, h, pair % nblk * block_m)
                           for pair in pairs[:count] for h in range(problem.heads))
        self.done: list = []

    def finish(self):
        got = sorted(self.done)
        if got != self.want:
            raise ProtocolError("coverage", f"tiles finished {got}, the list holds {self.want}")


# ----------------------------------------------------------------------------- TLX, Hopper
def tlx_fwd_hopper(sim: Sim, problem: Problem, cfg, programs: int, head_dim: int = 128,
                   elem_bytes: int = 2) -> Walk:
    """kernels_tlx/fwd_hopper.py: `load` (the producer warpgroup) and block_m // 64
    `compute` + `store` consumers per program. Q: a (buffer, consumer) slot each, full /
    empty barriers of one arrival; K and V: num_buffers_kv-deep rings, full barriers of
    one arrival (the producer's expect) plus the TMA bytes, empty barriers of one
    arrival per consumer; the consumers' wgmma issue turns: named barriers 9.. of 256
    threads (`_hand_over`), the last consumer handing the first turn to consumer 0."""
    walk = Walk(problem, cfg.block_m, cfg.block_n, programs)
    NC, S, NBQ = cfg.block_m // 64, cfg.num_buffers_kv, cfg.num_buffers_q
    Q_BYTES = 64 * head_dim * elem_bytes
    KV_BYTES = cfg.block_n * head_dim * elem_bytes
    for p, tiles in enumerate(walk.tiles):
        pre = f"cta{p}."
        q = sim.buffers(pre + "q", NBQ * NC)
        k = sim.buffers(pre + "k", S)
        v = sim.buffers(pre + "v", S)
        q_full = sim.mbarriers(pre + "q_full", NBQ * NC, 1)
        q_empty = sim.mbarriers(pre + "q_empty", NBQ * NC, 1)
        k_full = sim.mbarriers(pre + "k_full", S, 1)
        k_empty = sim.mbarriers(pre + "k_empty", S, NC)
        v_full = sim.mbarriers(pre + "v_full", S, 1)
        v_empty = sim.mbarriers(pre + "v_empty", S, NC)
        turn = [sim.named_barrier(f"{pre}bar{9 + c}") for c in range(NC)]

        def load(tiles=tiles, q=q, k=k, v=v, q_full=q_full, q_empty=q_empty, k_full=k_full,
                 k_empty=k_empty, v_full=v_full, v_empty=v_empty):
            kv_cnt = 0
            for i, t in enumerate(tiles):
                qb, qph = ring(i, NBQ)
                for c in range(NC):
                    slot = qb * NC + c
                    yield Wait(q_empty[slot], qph ^ 1)
                    yield Arrive(q_full[slot], tx=Q_BYTES)           # barrier_expect_bytes
                    yield Tma(q_full[slot], {q[slot]: ("Q", t.key, c)}, Q_BYTES)
                for j in range(t.n_end):
                    kb, kph = ring(kv_cnt, S)
                    blk = kv_block(j, t.n_end, cfg.mask_first)
                    yield Wait(k_empty[kb], kph ^ 1)
                    yield Arrive(k_full[kb], tx=KV_BYTES)
                    yield Tma(k_full[kb], {k[kb]: ("K", t.key, blk)}, KV_BYTES)
                    yield Wait(v_empty[kb], kph ^ 1)
                    yield Arrive(v_full[kb], tx=KV_BYTES)
                    yield Tma(v_full[kb], {v[kb]: ("V", t.key, blk)}, KV_BYTES)
                    kv_cnt += 1

        def consumer(cid, tiles=tiles, q=q, k=k, v=v, q_full=q_full, q_empty=q_empty,
                     k_full=k_full, k_empty=k_empty, v_full=v_full, v_empty=v_empty, turn=turn):
            hand_over = BarArrive(turn[(cid + 1) % NC], 256)

            def issue_qk(slot, kv_cnt, tag, pass_turn):               # _issue_qk
                kb, kph = ring(kv_cnt, S)
                yield Wait(k_full[kb], kph)
                yield BarSync(turn[cid], 256)
                yield Mma({q[slot]: ("Q", t.key, cid), k[kb]: tag})
                if pass_turn:
                    yield hand_over

            if cid == NC - 1:  # let consumer 0 issue first
                yield hand_over
            kv_cnt = 0
            for i, t in enumerate(tiles):
                qb, qph = ring(i, NBQ)
                slot = qb * NC + cid
                yield Wait(q_full[slot], qph)
                if t.n_end > 0:                                        # compute
                    steps = consumer_steps(t, problem.causal, cfg.mask_first)
                    yield from issue_qk(slot, kv_cnt, ("K", t.key, steps[0]), True)
                    yield MmaWait(0)
                    kb = kv_cnt % S
                    yield Arrive(k_empty[kb], release=(k[kb],))
                    kv_cnt += 1
                    for prev, j in zip(steps, steps[1:]):                # _kv_step
                        yield from issue_qk(slot, kv_cnt, ("K", t.key, j), not cfg.overlap)
                        vb, vph = ring(kv_cnt - 1, S)
                        yield Wait(v_full[vb], vph)
                        yield Mma({v[vb]: ("V", t.key, prev)})
                        if cfg.overlap:
                            yield hand_over
                        yield MmaWait(1)
                        kb = kv_cnt % S
                        yield Arrive(k_empty[kb], release=(k[kb],))
                        yield MmaWait(0)
                        yield Arrive(v_empty[vb], release=(v[vb],))
                        kv_cnt += 1
                    vb, vph = ring(kv_cnt - 1, S)                        # the last P V
                    yield Wait(v_full[vb], vph)
                    yield Mma({v[vb]: ("V", t.key, steps[-1])})
                    yield MmaWait(0)
                    yield Arrive(v_empty[vb], release=(v[vb],))
                # store: O through the consumer's spent Q slot, then the slot goes back
                yield Write(q[slot], ("O", t.key, cid))
                yield Read(q[slot], ("O", t.key, cid))
                yield Arrive(q_empty[slot], release=(q[slot],))
                if cid == 0:
                    walk.done.append(t.key)

        sim.role(pre + "load", load())
        for c in range(NC):
            sim.role(f"{pre}consumer{c}", consumer(c))
    return walk


# ----------------------------------------------------------------------------- CuteDSL, Hopper
def cute_fwd_hopper(sim: Sim, problem: Problem, cfg, programs: int, head_dim: int = 128,
                    elem_bytes: int = 2) -> Walk:
    """kernels_cute/fwd_hopper.py: the `load` warp and block_m // 64 `compute` + `store`
    warpgroups per CTA. Three PipelineTmaAsync rings (Q: num_buffers_q slots of block_m
    rows, each consumer reading and storing its own 64; K, V: num_buffers_kv), full
    barriers of one arrival (the producer's arrive.expect_tx) plus the TMA bytes, empty
    barriers of one arrival per consumer warp (4 a warpgroup); issue turns on named
    barriers 2.. of 256 threads, consumer 0 pre-arriving on its own; each warpgroup's
    epilogue barrier of 128 threads."""
    walk = Walk(problem, cfg.block_m, cfg.block_n, programs)
    NC, S, NBQ = cfg.block_m // 64, cfg.num_buffers_kv, cfg.num_buffers_q
    Q_BYTES = cfg.block_m * head_dim * elem_bytes
    KV_BYTES = cfg.block_n * head_dim * elem_bytes
    SCHED = 2
    for p, tiles in enumerate(walk.tiles):
        pre = f"cta{p}."
        q = sim.buffers(pre + "q", NBQ * NC)   # slot s, warpgroup c's rows: s * NC + c
        k = sim.buffers(pre + "k", S)
        v = sim.buffers(pre + "v", S)
        q_full = sim.mbarriers(pre + "q_full", NBQ, 1)
        q_empty = sim.mbarriers(pre + "q_empty", NBQ, NC * 4)
        k_full = sim.mbarriers(pre + "k_full", S, 1)
        k_empty = sim.mbarriers(pre + "k_empty", S, NC * 4)
        v_full = sim.mbarriers(pre + "v_full", S, 1)
        v_empty = sim.mbarriers(pre + "v_empty", S, NC * 4)
        turn = [sim.named_barrier(f"{pre}bar{SCHED + c}") for c in range(NC)]
        epi = [sim.named_barrier(f"{pre}bar{SCHED + NC + c}") for c in range(NC)]

        def load(tiles=tiles, q=q, k=k, v=v, q_full=q_full, q_empty=q_empty, k_full=k_full,
                 k_empty=k_empty, v_full=v_full, v_empty=v_empty):
            q_cnt = kv_cnt = 0
            for t in tiles:
                s, ph = ring(q_cnt, NBQ)                               # producer_acquire
                yield Wait(q_empty[s], ph ^ 1)
                yield Arrive(q_full[s], tx=Q_BYTES)
                yield Tma(q_full[s], {q[s * NC + c]: ("Q", t.key, c) for c in range(NC)},
                          Q_BYTES)
                q_cnt += 1
                for n in range(t.n_end):
                    kb, ph = ring(kv_cnt, S)
                    blk = kv_block(n, t.n_end, cfg.mask_first)
                    yield Wait(k_empty[kb], ph ^ 1)
                    yield Arrive(k_full[kb], tx=KV_BYTES)
                    yield Tma(k_full[kb], {k[kb]: ("K", t.key, blk)}, KV_BYTES)
                    yield Wait(v_empty[kb], ph ^ 1)
                    yield Arrive(v_full[kb], tx=KV_BYTES)
                    yield Tma(v_full[kb], {v[kb]: ("V", t.key, blk)}, KV_BYTES)
                    kv_cnt += 1

        def compute(wg, tiles=tiles, q=q, k=k, v=v, q_full=q_full, q_empty=q_empty,
                    k_full=k_full, k_empty=k_empty, v_full=v_full, v_empty=v_empty,
                    turn=turn, epi=epi):
            if wg == 0:  # consumer 0 issues first
                yield BarArrive(turn[0], 256)
            q_cnt = kv_cnt = 0
            for t in tiles:
                s, qph = ring(q_cnt, NBQ)
                qbuf = q[s * NC + wg]
                qtag = ("Q", t.key, wg)
                yield Wait(q_full[s], qph)                             # consumer_wait
                if t.n_end > 0:
                    steps = consumer_steps(t, problem.causal, cfg.mask_first)
                    kb, ph = ring(kv_cnt, S)                           # first_qk
                    yield Wait(k_full[kb], ph)
                    yield Mma({qbuf: qtag, k[kb]: ("K", t.key, steps[0])})
                    yield MmaWait(0)
                    yield Arrive(k_empty[kb], 4, release=(k[kb],))
                    for prev, n in zip(steps, steps[1:]):                # kv_step
                        vb, vph = ring(kv_cnt, S)
                        kv_cnt += 1
                        kb, ph = ring(kv_cnt, S)
                        yield Wait(k_full[kb], ph)
                        yield BarSync(turn[wg], 256)
                        yield Mma({qbuf: qtag, k[kb]: ("K", t.key, n)})
                        yield Wait(v_full[vb], vph)
                        yield Mma({v[vb]: ("V", t.key, prev)})
                        yield BarArrive(turn[(wg + 1) % NC], 256)
                        yield MmaWait(1)
                        yield Arrive(k_empty[kb], 4, release=(k[kb],))
                        yield MmaWait(0)
                        yield Arrive(v_empty[vb], 4, release=(v[vb],))
                    vb, vph = ring(kv_cnt, S)                          # last_pv
                    yield Wait(v_full[vb], vph)
                    yield Mma({v[vb]: ("V", t.key, steps[-1])})
                    yield MmaWait(0)
                    yield Arrive(v_empty[vb], 4, release=(v[vb],))
                    kv_cnt += 1
                yield Write(qbuf, ("O", t.key, wg))                    # store
                yield BarSync(epi[wg], 128)
                yield Read(qbuf, ("O", t.key, wg))
                yield Arrive(q_empty[s], 4, release=(qbuf,))          # consumer_release
                q_cnt += 1
                if wg == 0:
                    walk.done.append(t.key)

        sim.role(pre + "load", load())
        for c in range(NC):
            sim.role(f"{pre}compute{c}", compute(c))
    return walk


# ----------------------------------------------------------------------------- sweeps
def random_problem(rng: random.Random, block_m: int, block_n: int) -> Problem:
    """A small jagged call: 1-5 sequences whose lengths favour the edges (0, 1, a block
    and one either side, a few blocks), self or cross lengths, broadcast-Q now and then,
    causal or not, one or two heads."""
    edges = [0, 1, 2, block_n - 1, block_n, block_n + 1, 2 * block_n + 1, block_m + 1]

    def length():
        return rng.choice(edges) if rng.random() < 0.6 else rng.randint(0, 3 * block_m + 5)

    B = rng.randint(1, 5)
    lens_k = tuple(length() for _ in range(B))
    bq = rng.random() < 0.2
    if bq:
        lens_q = (max(1, length()),) * B
    elif rng.random() < 0.4:
        lens_q = lens_k
    else:
        lens_q = tuple(length() for _ in range(B))
    return Problem(lens_q, lens_k, heads=rng.randint(1, 2), causal=rng.random() < 0.5,
                   broadcast_q=bq)


def sweep(model, cfg, problems: int, seeds: int, seed: int = 0, **sim_kw) -> tuple[int, int]:
    """`problems` random problems, each under `seeds` interleavings with 1-4 programs.
    Raises the first ProtocolError (naming the problem). Returns (runs, steps)."""
    rng = random.Random(seed)
    runs = steps = 0
    for _ in range(problems):
        problem = random_problem(rng, cfg.block_m, cfg.block_n)
        programs = rng.randint(1, 4)
        base = rng.randrange(1 << 30)
        try:
            steps += check(lambda sim: model(sim, problem, cfg, programs),
                           range(base, base + seeds), **sim_kw)
        except ProtocolError as e:
            e.args = (f"{problem}, {programs} programs, {cfg}: {e.args[0]}",)
            raise
        runs += seeds
    return runs, steps


def _configs(module: str) -> dict:
    import importlib
    return importlib.import_module(module).CONFIGS


# model name -> (model, the module whose CONFIGS it runs)
MODELS = {
    "tlx_fwd_hopper": (tlx_fwd_hopper, "kernels_tlx.fwd_hopper"),
    "cute_fwd_hopper": (cute_fwd_hopper, "kernels_cute.fwd_hopper"),
}


def main(argv=None):
    import argparse
    import time
    ap = argparse.ArgumentParser(description="Model-check the kernels' barrier protocols.")
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--problems", type=int, default=50, help="random problems per config")
    ap.add_argument("--seeds", type=int, default=10, help="interleavings per problem")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name in args.models:
        model, module = MODELS[name]
        t0, runs, steps = time.time(), 0, 0
        for key, cfg in _configs(module).items():
            r, s = sweep(model, cfg, args.problems, args.seeds, args.seed)
            runs, steps = runs + r, steps + s
        print(f"{name}: {runs} interleavings, {steps} steps, no violation "
              f"({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
