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
- arrival: an arrive on an mbarrier phase that has no arrivals left, a phase left part
  done when the run ends (an arrival lost where nobody waits any more), a named barrier
  generation over its thread count or completed by arrives alone (a lost turn).

What is modelled: mbarriers (expected arrival count, transaction bytes, phase bit,
wait(parity)); named barriers (bar.sync / bar.arrive with thread counts); buffers in
shared or tensor memory, by name, each write a new version (a Read sends the version
back: data handed through memory, as a tile id, flows through the model); TMA copies
(async writes completing transaction bytes); MMAs (async reads and writes of one role,
in order, retired by wgmma.wait_group or completed by a tcgen05.commit, commits in
order, that arrives on an mbarrier); a global counter (atomic add). What is not:
registers, memory fences and proxies (a fence is assumed where the kernel has one),
thread divergence inside a role (a role is its warps acting as one, arriving with its
thread or warp count), data-dependent skips (a rescale skipped when no row max moved),
timing. Each run also counts, per role and barrier array, the waits that blocked: a
wait that never blocks over many interleavings is implied by the others.

Models of the kernels' protocols follow the checker (`MODELS`: forward and backward,
Hopper and Blackwell, both styles); `python -m harness.protocol` runs them all over
random jagged tile lists and lists the waits that never blocked.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from functools import partial
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
    """A synchronous read of `buf` expecting version `tag` (None: any); the version read
    is sent back to the role (data handed through memory, e.g. a tile id)."""
    buf: str
    tag: Any = None


class Write(NamedTuple):
    """A synchronous write of `buf` (version `tag`)."""
    buf: str
    tag: Any = None


class Mma(NamedTuple):
    """An async MMA reading `reads` ({buffer: tag}) and writing `writes`; in flight until
    retired by `MmaWait` (wgmma) or completed by a `Commit` (tcgen05). MMAs of one role run
    in order: one may read what an earlier one of the role still writes. (A bulk TMA
    store, an async read of shared memory retired by its wait, is one too.)"""
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
    """bar.sync on a named barrier: block until `threads` threads have reached it.
    `release`: buffers the role hands back by arriving (as Arrive's)."""
    id: str
    threads: int
    release: tuple = ()


class BarArrive(NamedTuple):
    id: str
    threads: int
    release: tuple = ()


class Take(NamedTuple):
    """Atomic add of 1 on a global counter; the old value is sent back to the role."""
    counter: str


def ring(count: int, stages: int) -> tuple[int, int]:
    """Slot and mbarrier parity of the count-th use of a `stages`-deep ring (as the
    kernels compute them)."""
    return count % stages, (count // stages) & 1


def publish_tile(slots, full, empty, t: int, i: int, threads: int = 1):
    """The tile handoff's writer (tile_counter.publish_tile): tile t into the i-th use of
    the two slots, once its readers have freed it."""
    s, ph = ring(i, 2)
    yield Wait(empty[s], ph ^ 1)
    yield Write(slots[s], t)
    yield Arrive(full[s], threads)


def fetch_tile(slots, full, empty, i: int, threads: int = 1):
    """A reader of the tile handoff (tile_counter.fetch_tile): its i-th tile id, the
    slot freed after the read."""
    s, ph = ring(i, 2)
    yield Wait(full[s], ph)
    t = yield Read(slots[s])
    yield Arrive(empty[s], threads, release=(slots[s],))
    return t


def kv_rings(sim, pre: str, stages: int, readers: int):
    """Separate K and V rings of `stages` buffers: full mbarriers of one arrival (the
    producer's expect) plus the TMA bytes, empty ones of `readers` arrivals -> (k, v,
    k_full, k_empty, v_full, v_empty)."""
    return (sim.buffers(pre + "k", stages), sim.buffers(pre + "v", stages),
            sim.mbarriers(pre + "k_full", stages, 1),
            sim.mbarriers(pre + "k_empty", stages, readers),
            sim.mbarriers(pre + "v_full", stages, 1),
            sim.mbarriers(pre + "v_empty", stages, readers))


def load_kv(k, v, k_full, k_empty, v_full, v_empty, kv_cnt: int, stages: int, key, blk,
            nbytes: int):
    """The producer's K then V copies of block `blk` into the kv_cnt-th ring slot."""
    kb, ph = ring(kv_cnt, stages)
    yield Wait(k_empty[kb], ph ^ 1)
    yield Arrive(k_full[kb], tx=nbytes)                       # barrier_expect_bytes
    yield Tma(k_full[kb], {k[kb]: ("K", key, blk)}, nbytes)
    yield Wait(v_empty[kb], ph ^ 1)
    yield Arrive(v_full[kb], tx=nbytes)
    yield Tma(v_full[kb], {v[kb]: ("V", key, blk)}, nbytes)


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
                 "issued", "commits", "blocked_gen")

    def __init__(self, name, gen, threads):
        self.name, self.gen, self.threads = name, gen, threads
        self.op = None
        self.done = False
        self.ready = False
        self.waits = {}         # barrier -> [waits passed, offset]
        self.mmas = []          # in-flight MMAs, oldest first
        self.issued = 0         # MMAs issued so far
        self.commits = []       # pending commits, oldest first (they complete in order)
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
        # (role, barrier array) -> [waits, waits that blocked], CTA prefixes and slot
        # indices dropped: a wait that never blocks is a hint that it is implied by others
        self.wait_stats: dict = {}
        self._wait_key: dict = {}

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

    def buffer(self, name: str) -> str:
        self.bufs[name] = _Buffer()
        return name

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
            engine = self.engine + [r.commits[0] for r in self.roles if r.commits]
            total = sum(r.weight for r in moves) + 0.5 * len(engine)
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
                self._complete(engine[min(int(x / 0.5), len(engine) - 1)])
        left = [r for r in self.roles if not r.done]
        if left:
            self.fail("deadlock", "no role can move:\n" + "\n".join(
                f"    {r.name}: {self._describe(r.op)}" for r in left))
        for r in self.roles:
            if r.mmas:
                self.fail("race", f"{r.name} ended with {len(r.mmas)} MMAs in flight")
        for name, b in self.bars.items():
            if b.pending != b.count or b.tx:
                self.fail("arrival", f"{name} ends with phase {b.phase} part done: "
                          f"{b.count - b.pending} of {b.count} arrivals, tx {b.tx}")
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
            key = self._wait_key.get((r.name, op.bar))
            if key is None:
                key = self._wait_key[(r.name, op.bar)] = (_base(r.name), _base(op.bar))
            st = self.wait_stats.get(key)
            if st is None:
                st = self.wait_stats[key] = [0, 0]
            st[0] += 1
            st[1] += not r.ready
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
            value = self._read(r, op.buf, op.tag, mma=False)
        elif kind is Write:
            self._open_write(op.buf, r.name, r.name, op.tag)
            self._close_write(op.buf, op.tag)
        elif kind is Mma:
            for buf, tag in op.reads.items():
                self._read(r, buf, tag, mma=True)
            for buf, tag in op.writes.items():
                self._open_write(buf, r.name, r.name, tag, own_mma=True)
            r.mmas.append(op)
            r.issued += 1
        elif kind is MmaWait:
            while len(r.mmas) > op.pending:
                self._retire(r.mmas.pop(0))
        elif kind is Commit:
            r.commits.append(("commit", r.name, op, r.issued))
        elif kind is Release:
            self._release(r, op.bufs)
        elif kind is BarSync:
            if r.blocked_gen is None:
                self._release(r, op.release)
            if r.blocked_gen is None and not self._named(r, op, sync=True):
                r.blocked_gen = self.named[op.id].gen
                r.ready = False
                return  # blocked until this generation completes
            r.blocked_gen = None
        elif kind is BarArrive:
            self._release(r, op.release)
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
        return have

    def _open_write(self, buf: str, writer, role: str, tag, own_mma: bool = False):
        s = self.bufs[buf]
        if s.writer is not None and not (own_mma and s.writer == role):
            self.fail("race", f"{role} writes {buf} while {self._who(s.writer)} still writes it")
        others = [f"{h} (read {t})" for h, t in s.holders.items() if h != role]
        if others:
            self.fail("race", f"{role} writes {buf} before its readers released it: "
                      + ", ".join(others))
        for other in self.roles:
            if other.mmas and (other.name != role or not own_mma) and any(
                    buf in m.reads for m in other.mmas):
                self.fail("race", f"{role} writes {buf} while an async op of {other.name} "
                          f"still reads it")
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
        self.trace.append(("engine", f"{item[0]} of {item[1]} completes"))
        if item[0] == "tma":
            self.engine.remove(item)
            op = item[2]
            for buf, tag in op.writes.items():
                self._close_write(buf, tag)
            b = self.bars[op.bar]
            b.tx -= op.tx
            self._maybe_complete(b)
        else:  # a commit: the MMAs issued before it complete, then the arrive
            _, who, op, mark = item
            r = next(x for x in self.roles if x.name == who)
            r.commits.pop(0)
            n = max(0, mark - (r.issued - len(r.mmas)))  # its MMAs still in flight
            for m in r.mmas[:n]:
                self._retire(m)
            del r.mmas[:n]
            for buf in op.release:
                self.bufs[buf].holders.pop(who, None)
            self._arrive(op.bar, 1, 0, who)


def _base(name: str) -> str:
    """A role or barrier name without its CTA prefix and slot index."""
    return name.split(".", 1)[-1].split("[")[0]


def check(build: Callable[[Sim], Any], seeds, wait_stats: dict | None = None,
          **sim_kw) -> int:
    """Build and run one Sim per seed (build(sim) adds the roles); raises the first
    ProtocolError, with the seed in its message; calls `finish()` on what build returns
    after each clean run; adds the runs' wait statistics to `wait_stats`. Returns the
    total steps."""
    steps = 0
    for seed in seeds:
        sim = Sim(seed, **sim_kw)
        ctx = build(sim)
        try:
            steps += sim.run()
            if wait_stats is not None:
                for k, (n, b) in sim.wait_stats.items():
                    st = wait_stats.setdefault(k, [0, 0])
                    st[0] += n
                    st[1] += b
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
        k, v, k_full, k_empty, v_full, v_empty = kv_rings(sim, pre, S, NC)
        q_full = sim.mbarriers(pre + "q_full", NBQ * NC, 1)
        q_empty = sim.mbarriers(pre + "q_empty", NBQ * NC, 1)
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
                    yield from load_kv(k, v, k_full, k_empty, v_full, v_empty, kv_cnt, S,
                                       t.key, kv_block(j, t.n_end, cfg.mask_first), KV_BYTES)
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
                    elem_bytes: int = 2, v_tiles: bool = False) -> Walk:
    """kernels_cute/fwd_hopper.py: the `load` warp and block_m // 64 `compute` + `store`
    warpgroups per CTA. Three PipelineTmaAsync rings (Q: num_buffers_q slots of block_m
    rows, each consumer reading and storing its own 64; K, V: num_buffers_kv), full
    barriers of one arrival (the producer's arrive.expect_tx) plus the TMA bytes, empty
    barriers of one arrival per consumer warp (4 a warpgroup); issue turns on named
    barriers 2.. of 256 threads, consumer 0 pre-arriving on its own; each warpgroup's
    epilogue barrier of 128 threads.
    v_tiles (Config.fp8_v): V lands in e4m3 in a ring of its own (`v8`: full barriers as
    K's, empty ones of one arrival per converting warp) and the load warpgroup's four
    warps (`convert<w>`, warp 0 the `load` role) each convert their rows of it (`v8[slot,
    w]` -> `v[slot, w]`) one block behind the copies (`v_to_f16`: the e4m3 tile landed,
    the f16 slot freed, the e4m3 slot released, one arrive a warp on v_full, of four);
    the consumers read all four parts."""
    walk = Walk(problem, cfg.block_m, cfg.block_n, programs)
    NC, S, NBQ = cfg.block_m // 64, cfg.num_buffers_kv, cfg.num_buffers_q
    W = 4 if v_tiles else 1   # parts of a V slot: the converting warps' rows
    Q_BYTES = cfg.block_m * head_dim * elem_bytes
    KV_BYTES = cfg.block_n * head_dim * elem_bytes
    SCHED = 2
    for p, tiles in enumerate(walk.tiles):
        pre = f"cta{p}."
        q = sim.buffers(pre + "q", NBQ * NC)   # slot s, warpgroup c's rows: s * NC + c
        k, v, k_full, k_empty, v_full, v_empty = kv_rings(sim, pre, S, NC * 4)
        q_full = sim.mbarriers(pre + "q_full", NBQ, 1)
        q_empty = sim.mbarriers(pre + "q_empty", NBQ, NC * 4)
        turn = [sim.named_barrier(f"{pre}bar{SCHED + c}") for c in range(NC)]
        epi = [sim.named_barrier(f"{pre}bar{SCHED + NC + c}") for c in range(NC)]
        if v_tiles:  # V's slots in the converting warps' parts; full: an arrive a warp
            v = sim.buffers(pre + "v", S * W)
            v_full = sim.mbarriers(pre + "v_full", S, W)
            v8 = sim.buffers(pre + "v8", S * W)
            v8_full = sim.mbarriers(pre + "v8_full", S, 1)
            v8_empty = sim.mbarriers(pre + "v8_empty", S, W)
        else:
            v8 = v8_full = v8_empty = None

        def v_parts(vb, tag, v=v):
            return {v[vb * W + w]: tag for w in range(W)}

        def to_f16(w, cnt, key, blk, v=v, v_full=v_full, v_empty=v_empty, v8=v8,  # v_to_f16
                   v8_full=v8_full, v8_empty=v8_empty):
            vb, ph = ring(cnt, S)
            yield Wait(v8_full[vb], ph)
            yield Wait(v_empty[vb], ph ^ 1)
            yield Read(v8[vb * W + w], ("V8", key, blk))
            yield Write(v[vb * W + w], ("V", key, blk))
            yield Arrive(v8_empty[vb], release=(v8[vb * W + w],))
            yield Arrive(v_full[vb])

        def convert(w, tiles=tiles, to_f16=to_f16):
            """Warp w's conversions, in the order of `load_v_tiles`."""
            cnt = 0
            for t in tiles:
                for n in range(1, t.n_end + 1):
                    yield from to_f16(w, cnt, t.key, kv_block(n - 1, t.n_end, cfg.mask_first))
                    cnt += 1

        def load(tiles=tiles, q=q, k=k, v=v, q_full=q_full, q_empty=q_empty, k_full=k_full,
                 k_empty=k_empty, v_full=v_full, v_empty=v_empty, to_f16=to_f16, v8=v8,
                 v8_full=v8_full, v8_empty=v8_empty):
            q_cnt = kv_cnt = 0
            for t in tiles:
                s, ph = ring(q_cnt, NBQ)                               # producer_acquire
                yield Wait(q_empty[s], ph ^ 1)
                yield Arrive(q_full[s], tx=Q_BYTES)
                yield Tma(q_full[s], {q[s * NC + c]: ("Q", t.key, c) for c in range(NC)},
                          Q_BYTES)
                q_cnt += 1
                for n in range(t.n_end):
                    blk = kv_block(n, t.n_end, cfg.mask_first)
                    if not v_tiles:
                        yield from load_kv(k, v, k_full, k_empty, v_full, v_empty, kv_cnt, S,
                                           t.key, blk, KV_BYTES)
                        kv_cnt += 1
                        continue
                    # load_kv's K, then V in e4m3 into the v8 ring (half the bytes)
                    kb, ph = ring(kv_cnt, S)
                    yield Wait(k_empty[kb], ph ^ 1)
                    yield Arrive(k_full[kb], tx=KV_BYTES)
                    yield Tma(k_full[kb], {k[kb]: ("K", t.key, blk)}, KV_BYTES)
                    yield Wait(v8_empty[kb], ph ^ 1)
                    yield Arrive(v8_full[kb], tx=KV_BYTES // 2)
                    yield Tma(v8_full[kb], {v8[kb * W + w]: ("V8", t.key, blk)
                                            for w in range(W)}, KV_BYTES // 2)
                    if n > 0:
                        yield from to_f16(0, kv_cnt - 1, t.key,
                                          kv_block(n - 1, t.n_end, cfg.mask_first))
                    kv_cnt += 1
                if v_tiles and t.n_end > 0:
                    yield from to_f16(0, kv_cnt - 1, t.key,
                                      kv_block(t.n_end - 1, t.n_end, cfg.mask_first))

        def compute(wg, tiles=tiles, q=q, k=k, v=v, q_full=q_full, q_empty=q_empty,
                    k_full=k_full, k_empty=k_empty, v_full=v_full, v_empty=v_empty,
                    turn=turn, epi=epi, v_parts=v_parts):
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
                        yield Mma(v_parts(vb, ("V", t.key, prev)))
                        yield BarArrive(turn[(wg + 1) % NC], 256)
                        yield MmaWait(1)
                        yield Arrive(k_empty[kb], 4, release=(k[kb],))
                        yield MmaWait(0)
                        yield Arrive(v_empty[vb], 4, release=tuple(v_parts(vb, None)))
                    vb, vph = ring(kv_cnt, S)                          # last_pv
                    yield Wait(v_full[vb], vph)
                    yield Mma(v_parts(vb, ("V", t.key, steps[-1])))
                    yield MmaWait(0)
                    yield Arrive(v_empty[vb], 4, release=tuple(v_parts(vb, None)))
                    kv_cnt += 1
                yield Write(qbuf, ("O", t.key, wg))                    # store
                yield BarSync(epi[wg], 128)
                yield Read(qbuf, ("O", t.key, wg))
                yield Arrive(q_empty[s], 4, release=(qbuf,))          # consumer_release
                q_cnt += 1
                if wg == 0:
                    walk.done.append(t.key)

        sim.role(pre + "load", load())
        for w in range(1, W):
            sim.role(f"{pre}convert{w}", convert(w))
        for c in range(NC):
            sim.role(f"{pre}compute{c}", compute(c))
    return walk


# ----------------------------------------------------------------------------- TLX, Blackwell
def tlx_fwd_blackwell(sim: Sim, problem: Problem, cfg, programs: int, head_dim: int = 128,
                      elem_bytes: int = 2, direct: bool = False) -> Walk:
    """kernels_tlx/fwd_blackwell.py: per program a `load` warp, an `mma` warp, two
    `softmax` warpgroups (one per 128-row group g of the 256-row tile) and a `correction`
    warpgroup, all single-arrival mbarriers. Q: a (buffer, group) slot each; K and V
    alternate in one ring, released by the commit of the last group's MMA reading them.
    TMEM per group: S_g (its columns: the P parts the MMA reads, the rest), O_g; the row
    statistics alpha (per step), l and m (per tile) in shared memory, one buffer a group.
    Tiles (cfg.dynamic): the load warp takes each next tile from a
    global counter and hands it to the four other tasks through a two-slot ring
    (tile_counter.py), else everyone steps the static round-robin. direct (DIRECT): a
    program a tile, every pair in order, no counter."""
    GM, G = 128, 2
    BN, NBQ, NB, PS = cfg.block_n, cfg.num_buffers_q, cfg.num_buffers_kv, cfg.p_slices
    walk = Walk(problem, G * GM, BN, programs, direct=direct)
    P, total, dyn = walk.programs, walk.total, cfg.dynamic and not direct
    Q_BYTES, KV_BYTES = GM * head_dim * elem_bytes, BN * head_dim * elem_bytes
    counter = sim.counter("tile_counter")
    for p in range(P):
        pre = f"cta{p}."
        q = sim.buffers(pre + "q", NBQ * G)
        kv = sim.buffers(pre + "kv", NB)
        tile_slot = sim.buffers(pre + "tile", 2)
        Pb = [[sim.buffer(f"{pre}S{g}.p{i}") for i in range(PS)] for g in range(G)]
        S = [Pb[g] + [sim.buffer(f"{pre}S{g}.rest")] for g in range(G)]
        alpha = sim.buffers(pre + "alpha", G)
        l_col = sim.buffers(pre + "l", G)
        m_col = sim.buffers(pre + "m", G)
        O = [sim.buffer(f"{pre}O{g}") for g in range(G)]
        bar = lambda name, n, count=1: sim.mbarriers(pre + name, n, count)
        q_full, q_empty = bar("q_full", NBQ * G), bar("q_empty", NBQ * G)
        kv_full, kv_empty = bar("kv_full", NB), bar("kv_empty", NB)
        s_full, p_full = bar("s_full", G), bar("p_full", G * PS)
        alpha_full, o_ready, o_full = bar("alpha_full", G), bar("o_ready", G), bar("o_full", G)
        stats_full, s_free = bar("stats_full", G), bar("s_free", G)
        tile_full, tile_empty = bar("tile_full", 2), bar("tile_empty", 2, 4)
        sink = bar("sink", 1)

        publish = partial(publish_tile, tile_slot, tile_full, tile_empty)

        def fetch(t, i, tile_slot=tile_slot, tile_full=tile_full, tile_empty=tile_empty):
            """_fetch: a reading task's i-th tile after t."""
            if not dyn:
                return t + P
            return (yield from fetch_tile(tile_slot, tile_full, tile_empty, i))

        def load(p=p, q=q, kv=kv, q_full=q_full, q_empty=q_empty, kv_full=kv_full,
                 kv_empty=kv_empty, publish=publish):
            t = p
            if dyn:
                yield from publish(t, 0)
            i = tw = kv_cnt = 0
            while t < total:
                tile = walk.coords(t)
                if tile.n_end > 0:
                    qb, qph = ring(tw, NBQ)
                    for g in range(G):
                        slot = qb * G + g
                        yield Wait(q_empty[slot], qph ^ 1)
                        yield Arrive(q_full[slot], tx=Q_BYTES)
                        yield Tma(q_full[slot], {q[slot]: ("Q", tile.key, g)}, Q_BYTES)
                    for j in range(tile.n_end):
                        blk = kv_block(j, tile.n_end, cfg.mask_first)
                        for c, what in ((0, "K"), (1, "V")):
                            b, ph = ring(kv_cnt + c, NB)
                            yield Wait(kv_empty[b], ph ^ 1)
                            yield Arrive(kv_full[b], tx=KV_BYTES)
                            yield Tma(kv_full[b], {kv[b]: (what, tile.key, blk)}, KV_BYTES)
                        kv_cnt += 2
                    tw += 1
                i += 1
                t = P + (yield Take(counter)) if dyn else t + P
                if dyn:
                    yield from publish(t, i)

        def mma(p=p, q=q, kv=kv, S=S, Pb=Pb, O=O, q_full=q_full, q_empty=q_empty,
                kv_full=kv_full, kv_empty=kv_empty, s_full=s_full, p_full=p_full,
                o_ready=o_ready, o_full=o_full, s_free=s_free, sink=sink, fetch=fetch):
            def qk(slot, kb, g, release_k, blk):
                yield Mma({q[slot]: ("Q", key, g), kv[kb]: ("K", key, blk)},
                          {b: ("S", key, g, blk) for b in S[g]})
                yield Commit(s_full[g])
                if release_k:
                    yield Commit(kv_empty[kb], release=(kv[kb],))

            def pv(vb, step, use_acc, g, release_v, blk, j):
                ph = step & 1
                yield Wait(o_ready[g], ph)
                for i in range(PS):
                    yield Wait(p_full[g * PS + i], ph)
                    reads = {Pb[g][i]: ("P", key, g, j, i), kv[vb]: ("V", key, blk)}
                    if i > 0:
                        reads[O[g]] = ("O", key, g, j, i - 1)
                    elif use_acc:
                        reads[O[g]] = ("Oc", key, g, j)
                    yield Mma(reads, {O[g]: ("O", key, g, j, i)})
                    if release_v and i == PS - 1:
                        yield Commit(kv_empty[vb], release=(kv[vb],))
                    else:
                        yield Commit(sink[0])

            t = yield from fetch(p - P, 0)
            i = tw = kv_cnt = step = 0
            while t < total:
                tile = walk.coords(t)
                n, key = tile.n_end, tile.key
                if n > 0:
                    blocks = [kv_block(j, n, cfg.mask_first) for j in range(n)]
                    qb, qph = ring(tw, NBQ)
                    kb, kph = ring(kv_cnt, NB)
                    yield Wait(kv_full[kb], kph)
                    for g in range(G):
                        yield Wait(q_full[qb * G + g], qph)
                        yield Wait(s_free[g], (tw & 1) ^ 1)
                        yield from qk(qb * G + g, kb, g, g == G - 1, blocks[0])
                    vb, vph = ring(kv_cnt + 1, NB)
                    yield Wait(kv_full[vb], vph)
                    yield from pv(vb, step, False, 0, False, blocks[0], 0)
                    acc1 = False
                    for j in range(1, n):
                        vb_prev = vb
                        kb, kph = ring(kv_cnt + 2 * j, NB)
                        vb, vph = ring(kv_cnt + 2 * j + 1, NB)
                        yield Wait(kv_full[kb], kph)
                        yield from qk(qb * G, kb, 0, False, blocks[j])
                        yield from pv(vb_prev, step + j - 1, acc1, 1, True, blocks[j - 1], j - 1)
                        acc1 = True
                        yield from qk(qb * G + 1, kb, 1, True, blocks[j])
                        yield Wait(kv_full[vb], vph)
                        yield from pv(vb, step + j, True, 0, False, blocks[j], j)
                    for g in range(G):  # every QK of the tile issued: Q free once done
                        yield Commit(q_empty[qb * G + g], release=(q[qb * G + g],))
                    yield Commit(o_full[0])
                    yield from pv(vb, step + n - 1, acc1, 1, True, blocks[n - 1], n - 1)
                    yield Commit(o_full[1])
                    kv_cnt += 2 * n
                    step += n
                    tw += 1
                i += 1
                t = yield from fetch(t, i)

        def softmax(g, p=p, S=S, Pb=Pb, alpha=alpha, l_col=l_col, m_col=m_col,
                    s_full=s_full, p_full=p_full, alpha_full=alpha_full,
                    stats_full=stats_full, fetch=fetch):
            t = yield from fetch(p - P, 0)
            i = step = 0
            while t < total:
                tile = walk.coords(t)
                key = tile.key
                if tile.n_end > 0:
                    for jj, blk in enumerate(consumer_steps(tile, problem.causal,
                                                            cfg.mask_first)):
                        yield Wait(s_full[g], step & 1)
                        for b in S[g]:  # the max pass over S_g
                            yield Read(b, ("S", key, g, blk))
                        yield Write(alpha[g], ("alpha", key, g, jj))
                        yield Arrive(alpha_full[g])
                        for i_p in range(PS):  # exp2: P into the columns already read
                            yield Read(Pb[g][i_p], ("S", key, g, blk))
                            yield Write(Pb[g][i_p], ("P", key, g, jj, i_p))
                            yield Arrive(p_full[g * PS + i_p],
                                         release=tuple(S[g]) if i_p == PS - 1 else ())
                        step += 1
                    yield Write(l_col[g], ("l", key, g))
                    yield Write(m_col[g], ("m", key, g))
                    yield Arrive(stats_full[g])
                i += 1
                t = yield from fetch(t, i)

        def correction(p=p, O=O, alpha=alpha, l_col=l_col, m_col=m_col,
                       alpha_full=alpha_full, o_ready=o_ready, o_full=o_full,
                       stats_full=stats_full, s_free=s_free, fetch=fetch):
            t = yield from fetch(p - P, 0)
            i = tw = step = 0
            while t < total:
                tile = walk.coords(t)
                n, key = tile.n_end, tile.key
                if n > 0:
                    for g in range(G):  # the first step: P V overwrites O_g
                        yield Wait(alpha_full[g], step & 1)
                        yield Arrive(o_ready[g], release=(O[g],))
                    for j in range(1, n):
                        for g in range(G):
                            yield Wait(alpha_full[g], (step + j) & 1)
                            yield Read(alpha[g], ("alpha", key, g, j))
                            yield Read(O[g], ("O", key, g, j - 1, PS - 1))
                            yield Write(O[g], ("Oc", key, g, j))
                            yield Arrive(o_ready[g], release=(alpha[g],))
                    for g in range(G):  # the epilogue
                        yield Wait(stats_full[g], tw & 1)
                        yield Read(l_col[g], ("l", key, g))
                        yield Read(m_col[g], ("m", key, g))
                        yield Arrive(s_free[g], release=(l_col[g], m_col[g]))
                        yield Wait(o_full[g], tw & 1)
                        yield Read(O[g], ("O", key, g, n - 1, PS - 1))
                    step += n
                    tw += 1
                walk.done.append(key)
                i += 1
                t = yield from fetch(t, i)

        sim.role(pre + "load", load(), threads=32)
        sim.role(pre + "mma", mma(), threads=32)
        for g in range(G):
            sim.role(f"{pre}softmax{g}", softmax(g))
        sim.role(pre + "correction", correction())
    return walk


# ----------------------------------------------------------------------------- CuteDSL, Blackwell
def _live_halves(t: FwdTile):
    """Whether each 128-row half of a 256-row tile holds a query row of its sequence."""
    return [t.m0 + s * 128 < t.len_q for s in range(2)]


def cute_fwd_blackwell(sim: Sim, problem: Problem, cfg, programs: int, head_dim: int = 128,
                       elem_bytes: int = 2, direct: bool = False) -> Walk:
    """kernels_cute/fwd_blackwell.py: per CTA the `load` and `mma` warps, two `softmax`
    warpgroups (halves s of the 256-row tile), the `correction` warpgroup (and `store`)
    and (cfg.clc) the `schedule` warp. Pipelines: Q (2 slots) and K/V (alternate slots of
    one ring) TMA -> MMA, released by tcgen05.commit; S/P per half (commit -> 128 softmax
    threads); O per half (commit -> 128 correction threads); stats per half in shared
    memory (128 -> 128 threads); CLC responses (one slot, 16 bytes -> every thread of the
    15 role warps, 480 arrivals). TMEM per half: S_s's lower and upper column halves (P
    over the upper), O_s; allocated by the MMA warp behind named barrier 1 (416 threads),
    freed after the softmax and correction warps arrive on it at their end. Tiles: CTA c
    starts at tile c; CLC hands it the id of the next CTA it cancels (the grid is the
    list's upper bound), else the static round-robin without the flip. A half whose rows
    all lie past the sequence's end runs the hand-overs only: no MMAs, no softmax, no
    rescale (its factor is 1), and its store reads a stale O_s. direct (Config.direct,
    or cfg.direct): a CTA a tile, every pair in order, no CLC query."""
    HM = 128
    BN, NB = cfg.block_n, cfg.num_buffers_kv
    direct = direct or getattr(cfg, "direct", False)
    walk = Walk(problem, 2 * HM, BN, programs, flip=False, direct=direct)
    total = walk.total
    clc = cfg.clc and not direct
    grid = walk.bound if clc else walk.programs
    Q_BYTES, KV_BYTES = HM * head_dim * elem_bytes, BN * head_dim * elem_bytes
    launch = sim.counter("launch", walk.programs)  # CTAs launch (and are cancelled) in id order
    for p in range(min(walk.programs, total)):    # CTAs past the tiles do nothing
        pre = f"cta{p}."
        q = sim.buffers(pre + "q", 2)
        kv = sim.buffers(pre + "kv", NB)
        s_lo = [sim.buffer(f"{pre}S{s}.lo") for s in range(2)]
        s_hi = [sim.buffer(f"{pre}S{s}.hi") for s in range(2)]   # P_s lives here
        O = [sim.buffer(f"{pre}O{s}") for s in range(2)]
        st0 = sim.buffers(pre + "stats.scale_sum", 2)
        st1 = sim.buffers(pre + "stats.max", 2)
        resp = sim.buffers(pre + "clc_response", 1)
        bar = lambda name, n, count=1: sim.mbarriers(pre + name, n, count)
        q_full, q_empty = bar("q_full", 2), bar("q_empty", 2)
        kv_full, kv_empty = bar("kv_full", NB), bar("kv_empty", NB)
        sp_full, sp_empty = bar("s_full", 2), bar("p_full", 2, HM)
        o_full, o_empty = bar("o_full", 2), bar("o_empty", 2, HM)
        stats_full, stats_empty = bar("stats_full", 2, HM), bar("stats_empty", 2, HM)
        clc_full, clc_empty = bar("clc_full", 1), bar("clc_empty", 1, 15 * 32)
        tmem_bar = sim.named_barrier(pre + "bar1")
        TMEM_THREADS = 32 * 13

        def next_tile(tile, i, threads, resp=resp, clc_full=clc_full, clc_empty=clc_empty):
            if not clc:
                return tile + grid
            yield Wait(clc_full[0], i & 1)
            x = yield Read(resp[0])
            yield Arrive(clc_empty[0], threads, release=(resp[0],))
            return total if x is None else x

        def schedule(p=p, resp=resp, clc_full=clc_full, clc_empty=clc_empty,
                     next_tile=next_tile):
            tile, i = p, 0
            while tile < total:
                yield Wait(clc_empty[0], (i & 1) ^ 1)
                yield Arrive(clc_full[0], tx=16)
                x = yield Take(launch)
                yield Tma(clc_full[0], {resp[0]: x if x < grid else None}, 16)
                tile = yield from next_tile(tile, i, 32)
                i += 1

        def load(p=p, q=q, kv=kv, q_full=q_full, q_empty=q_empty, kv_full=kv_full,
                 kv_empty=kv_empty, next_tile=next_tile):
            cnt = {"q": 0, "kv": 0}

            def put(ring_name, full, empty, bufs, stages, nbytes, tag):
                b, ph = ring(cnt[ring_name], stages)
                yield Wait(empty[b], ph ^ 1)
                yield Arrive(full[b], tx=nbytes)
                yield Tma(full[b], {bufs[b]: tag}, nbytes)
                cnt[ring_name] += 1

            tile, i = p, 0
            while tile < total:
                t = walk.coords(tile)
                if t.n_end > 0:
                    qs = lambda h: put("q", q_full, q_empty, q, 2, Q_BYTES, ("Q", t.key, h))
                    kvs = lambda what, n: put("kv", kv_full, kv_empty, kv, NB, KV_BYTES,
                                              (what, t.key, n))
                    yield from qs(0)
                    yield from kvs("K", 0)
                    yield from qs(1)
                    yield from kvs("V", 0)
                    for n in range(1, t.n_end):
                        yield from kvs("K", n)
                        yield from kvs("V", n)
                tile = yield from next_tile(tile, i, 32)
                i += 1

        def mma(p=p, q=q, kv=kv, s_lo=s_lo, s_hi=s_hi, O=O, q_full=q_full, q_empty=q_empty,
                kv_full=kv_full, kv_empty=kv_empty, sp_full=sp_full, sp_empty=sp_empty,
                o_full=o_full, o_empty=o_empty, tmem_bar=tmem_bar, next_tile=next_tile):
            def qk(s, q_slot, kb, n):
                if live[s]:
                    yield Mma({q[q_slot]: ("Q", key, s), kv[kb]: ("K", key, n)},
                              {s_lo[s]: ("S", key, s, n), s_hi[s]: ("S", key, s, n)})
                yield Commit(sp_full[s])

            yield BarSync(tmem_bar, TMEM_THREADS)       # TMEM allocated, handed out
            q_cnt = kv_cnt = steps = pvs = 0
            tile, i = p, 0
            while tile < total:
                t = walk.coords(tile)
                key, n_end, live = t.key, t.n_end, _live_halves(t)
                if n_end > 0:
                    kb, kph = ring(kv_cnt, NB)                   # prologue: S_s(0)
                    yield Wait(kv_full[kb], kph)
                    for s in range(2):
                        qs, qph = ring(q_cnt, 2)
                        yield Wait(q_full[qs], qph)
                        yield from qk(s, qs, kb, 0)
                        if n_end == 1:
                            yield Commit(q_empty[qs], release=(q[qs],))
                        q_cnt += 1
                    steps += 1
                    yield Commit(kv_empty[kb], release=(kv[kb],))
                    kv_cnt += 1
                    for n in range(1, n_end + 1):  # PV_s(n - 1), then S_s(n)
                        vb, vph = ring(kv_cnt, NB)
                        yield Wait(kv_full[vb], vph)
                        kv_cnt += 1
                        has_k = n < n_end
                        if has_k:
                            kb, kph = ring(kv_cnt, NB)
                            yield Wait(kv_full[kb], kph)
                        for s in range(2):
                            yield Wait(sp_empty[s], (steps - 1) % 2)
                            yield Wait(o_empty[s], (pvs % 2) ^ 1)
                            reads = {s_hi[s]: ("P", key, s, n - 1), kv[vb]: ("V", key, n - 1)}
                            if n > 1:
                                reads[O[s]] = ("Oc", key, s, n - 1)
                            if live[s]:
                                yield Mma(reads, {O[s]: ("O", key, s, n - 1)})
                            yield Commit(o_full[s])
                            if has_k:
                                yield from qk(s, s, kb, n)
                        pvs += 1
                        yield Commit(kv_empty[vb], release=(kv[vb],))
                        if has_k:
                            steps += 1
                            if n == n_end - 1:  # Q's last use: both slots
                                for s in range(2):
                                    yield Commit(q_empty[s], release=(q[s],))
                            yield Commit(kv_empty[kb], release=(kv[kb],))
                            kv_cnt += 1
                tile = yield from next_tile(tile, i, 32)
                i += 1
            yield BarSync(tmem_bar, TMEM_THREADS)       # every user done: free TMEM
            for b in s_lo + s_hi + O:
                yield Write(b, "freed")

        def softmax(h, p=p, s_lo=s_lo, s_hi=s_hi, st0=st0, st1=st1, sp_full=sp_full,
                    sp_empty=sp_empty, stats_full=stats_full, stats_empty=stats_empty,
                    tmem_bar=tmem_bar, next_tile=next_tile):
            yield BarSync(tmem_bar, TMEM_THREADS)
            steps = events = 0
            tile, i = p, 0
            while tile < total:
                t = walk.coords(tile)
                key, live = t.key, _live_halves(t)[h]
                for n in range(t.n_end):  # the bulk, then the tail: blocks in order
                    yield Wait(sp_full[h], steps % 2)
                    if live:
                        yield Read(s_lo[h], ("S", key, h, n))
                        yield Read(s_hi[h], ("S", key, h, n))
                    if n > 0:  # the rescale factor to correction
                        yield Wait(stats_empty[h], (events % 2) ^ 1)
                        yield Write(st0[h], ("scale", key, h, n))
                        yield Arrive(stats_full[h], HM)
                        events += 1
                    if live:
                        yield Write(s_hi[h], ("P", key, h, n))
                    yield Arrive(sp_empty[h], HM, release=(s_lo[h],))
                    steps += 1
                yield Wait(stats_empty[h], (events % 2) ^ 1)  # row sum and max
                yield Write(st0[h], ("sum", key, h))
                yield Write(st1[h], ("max", key, h))
                yield Arrive(stats_full[h], HM)
                events += 1
                tile = yield from next_tile(tile, i, HM)
                i += 1
            yield BarArrive(tmem_bar, TMEM_THREADS)

        def correction(p=p, O=O, st0=st0, st1=st1, o_full=o_full, o_empty=o_empty,
                       stats_full=stats_full, stats_empty=stats_empty, tmem_bar=tmem_bar,
                       next_tile=next_tile):
            yield BarSync(tmem_bar, TMEM_THREADS)
            events = pvs = 0
            tile, i = p, 0
            while tile < total:
                t = walk.coords(tile)
                key, n_end, live = t.key, t.n_end, _live_halves(t)
                for n in range(1, n_end):
                    for s in range(2):
                        yield Wait(stats_full[s], events % 2)
                        yield Read(st0[s], ("scale", key, s, n))
                        yield Arrive(stats_empty[s], HM, release=(st0[s],))
                        yield Wait(o_full[s], pvs % 2)
                        if live[s]:  # (a factor of 1 skips it)
                            yield Read(O[s], ("O", key, s, n - 1))   # rescale
                            yield Write(O[s], ("Oc", key, s, n))
                        yield Arrive(o_empty[s], HM)
                    events += 1
                    pvs += 1
                for s in range(2):
                    yield Wait(stats_full[s], events % 2)
                    yield Read(st0[s], ("sum", key, s))
                    yield Read(st1[s], ("max", key, s))
                    yield Arrive(stats_empty[s], HM, release=(st0[s], st1[s]))
                    if n_end > 0:                                    # store
                        yield Wait(o_full[s], pvs % 2)
                        yield Read(O[s], ("O", key, s, n_end - 1) if live[s] else None)
                        if cfg.early_release:
                            yield Arrive(o_empty[s], HM, release=(O[s],))
                        else:  # after the global stores
                            yield Arrive(o_empty[s], HM, release=(O[s],))
                events += 1
                if n_end > 0:
                    pvs += 1
                walk.done.append(key)
                tile = yield from next_tile(tile, i, HM)
                i += 1
            yield BarArrive(tmem_bar, TMEM_THREADS)

        if clc:
            sim.role(pre + "schedule", schedule(), threads=32)
        sim.role(pre + "load", load(), threads=32)
        sim.role(pre + "mma", mma(), threads=32)
        for h in range(2):
            sim.role(f"{pre}softmax{h}", softmax(h))
        sim.role(pre + "correction", correction())
    return walk


# ----------------------------------------------------------------------------- TLX, Hopper backward
class BwdWalk:
    """A backward launch over the KV-tile list (jagged.tiles.kv_tiles_reference, the CPU
    reference the GPU build is tested equal to): the tiles of `programs` programs as
    schedule.tile_range and kv_tile_coords walk them (packed: the list x KV heads
    round-robin, or from the counter; broadcast-Q: programs pinned to a KV head), and the
    check that the consumers finished each (tile, KV head) once."""

    def __init__(self, problem: Problem, block_m: int, block_n: int, programs: int):
        import torch

        from jagged.tiles import kv_tiles_reference
        self.problem, self.block_m, self.block_n = problem, block_m, block_n
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
        self.want = sorted((base, hk) for base in range(self.n_real) for hk in range(HKV))
        self.done: list = []

    def range(self, pid):
        """schedule.tile_range: (first, step, end)."""
        HKV, P = self.problem.hkv, self.programs
        if self.problem.broadcast_q:
            return pid // HKV, P // HKV, self.n_real
        return pid, P, self.n_real * HKV

    def coords(self, t, pid):
        """schedule.kv_tile_coords -> (key, hk, b, m_lo, n_m)."""
        pr, HKV, BM = self.problem, self.problem.hkv, self.block_m
        base, hk = (t, pid % HKV) if pr.broadcast_q else (t // HKV, t % HKV)
        b, n0 = self.tile_b[base], self.tile_n[base] * self.block_n
        len_q, len_k = pr.lens_q[b], pr.lens_k[b]
        m_lo = max(n0 - len_k + len_q, 0) // BM * BM if pr.causal else 0
        n_m = max(-(-(len_q - m_lo) // BM), 0)
        return (base, hk), hk, b, m_lo, n_m

    def steps(self, t, pid):
        """-> (key, the tile's Q steps as (b, query head, first row)): its GQA group's
        heads one after another, each over the rows that see its keys."""
        key, hk, b, m_lo, n_m = self.coords(t, pid)
        G, BM = self.problem.heads // self.problem.hkv, self.block_m
        return key, [(b, hk * G + j // n_m, m_lo + (j % n_m) * BM) for j in range(G * n_m)]

    def finish(self):
        if sorted(self.done) != self.want:
            raise ProtocolError("coverage", f"tiles finished {sorted(self.done)}, the list "
                                f"holds {self.want}")


def tlx_bwd_hopper(sim: Sim, problem: Problem, cfg, programs: int, head_dim: int = 128,
                   elem_bytes: int = 2) -> BwdWalk:
    """kernels_tlx/bwd_hopper.py's bwd_kernel: per program `load` (the producer
    warpgroup), two `compute` consumers (64 keys of the 128-key tile each) and, at 32-row
    steps, a 1-warp `reduce_dq` (at 64- and 128-row steps the load task reduces dQ one
    step behind its loads). K/V: kv_stages stages, each consumer's K and V halves, full
    (one arrival + the bytes) / empty (one a consumer); Q/dO: a 2-deep ring, with lse2 /
    delta beside it at 64- and 128-row steps; dS^T: two steps deep, the consumers meeting
    on named barrier 8 (256 threads) where a consumer reads the other's; dQ: a staging
    buffer a consumer, full / empty to the reduce (a bulk reduce-add: an async read of the
    staging, retired by its wait), at D = 64 below 128-row steps summed into the last
    consumer's first. Causal packed lists: tiles from the counter, handed to the
    consumers (and reduce_dq) through the two-slot ring."""
    from jagged.tiles import bwd_dynamic

    from kernels_tlx.bwd_hopper import BLOCK_N, NUM_BUF_Q, NUM_CONSUMERS, dq_cols
    D, BM, NC, NB, NKV = head_dim, cfg.block_m, NUM_CONSUMERS.value, NUM_BUF_Q.value, cfg.kv_stages
    BNC = BLOCK_N // NC
    M64, M128 = BM >= 64, BM >= 128
    DQ_COLS = dq_cols(D)
    DQS = DQ_COLS == D and not M128
    MEET = DQ_COLS < D or M128           # a consumer's dQ reads the other's dS^T (and K)
    dyn = bwd_dynamic(problem.causal, problem.broadcast_q)
    walk = BwdWalk(problem, BM, BLOCK_N, programs)
    P, G = walk.programs, problem.heads // problem.hkv
    counter = sim.counter("tile_counter")
    for p in range(P):
        pre = f"cta{p}."
        k = sim.buffers(pre + "k", NKV * NC)
        v = sim.buffers(pre + "v", NKV * NC)
        q = sim.buffers(pre + "q", NB)
        do = sim.buffers(pre + "do", NB)
        stat = sim.buffers(pre + "lse_delta", NB) if M64 else None
        ds = sim.buffers(pre + "ds", 2 * NC)
        dq = sim.buffers(pre + "dq", NC)
        tile_slot = sim.buffers(pre + "tile", 2)
        bar = lambda name, n, count=1: sim.mbarriers(pre + name, n, count)
        kv_full, kv_empty = bar("kv_full", NKV), bar("kv_empty", NKV, NC)
        q_full, q_empty = bar("q_full", NB), bar("q_empty", NB, NC)
        dq_full, dq_empty = bar("dq_full", NC), bar("dq_empty", NC)
        tile_full = bar("tile_full", 2)
        tile_empty = bar("tile_empty", 2, NC if M64 else NC + 1)
        meet = sim.named_barrier(pre + "bar8")
        first, step, end = walk.range(p)

        steps = partial(walk.steps, pid=p)

        publish = partial(publish_tile, tile_slot, tile_full, tile_empty)

        def fetch(t, i, tile_slot=tile_slot, tile_full=tile_full, tile_empty=tile_empty,
                  step=step):
            if not dyn:
                return t + step if i else t
            return (yield from fetch_tile(tile_slot, tile_full, tile_empty, i))

        def reduce_step(qcnt, qkey, dq=dq, dq_full=dq_full, dq_empty=dq_empty):
            cs = range(NC - 1 if DQS else 0, NC)
            for c in cs:
                yield Wait(dq_full[c], qcnt & 1)
                yield Mma({dq[c]: ("dQsum", qkey) if DQS else ("dQ", qkey, c)})  # reduce-add
            yield MmaWait(0)                                      # store_wait(0)
            for c in cs:
                yield Arrive(dq_empty[c], release=(dq[c],))

        def load(p=p, k=k, v=v, q=q, do=do, stat=stat, kv_full=kv_full, kv_empty=kv_empty,
                 q_full=q_full, q_empty=q_empty, publish=publish, reduce_step=reduce_step,
                 first=first, step=step, end=end, steps=steps):
            t, i, qcnt, prev = first, 0, 0, None
            if dyn:
                yield from publish(t, 0)
            while t < end:
                key, qsteps = steps(t)
                kvb, kph = ring(i, NKV)
                yield Wait(kv_empty[kvb], kph ^ 1)
                yield Arrive(kv_full[kvb], tx=2 * elem_bytes * BLOCK_N * D)
                for c in range(NC):
                    for bufs, what in ((k, "K"), (v, "V")):
                        yield Tma(kv_full[kvb], {bufs[kvb * NC + c]: (what, key, c)},
                                  elem_bytes * BNC * D)
                for qkey in qsteps:
                    buf, ph = ring(qcnt, NB)
                    yield Wait(q_empty[buf], ph ^ 1)
                    if M64:
                        yield Write(stat[buf], ("lse", qkey))
                    yield Arrive(q_full[buf], tx=2 * elem_bytes * BM * D)
                    yield Tma(q_full[buf], {q[buf]: ("Q", qkey)}, elem_bytes * BM * D)
                    yield Tma(q_full[buf], {do[buf]: ("dO", qkey)}, elem_bytes * BM * D)
                    if M64:  # reduce_dq folded in, one step behind
                        if qcnt > 0:
                            yield from reduce_step(qcnt - 1, prev)
                        prev = qkey
                    qcnt += 1
                i += 1
                t = P + (yield Take(counter)) if dyn else t + step
                if dyn:
                    yield from publish(t, i)
            if M64 and qcnt > 0:
                yield from reduce_step(qcnt - 1, prev)

        def compute(cid, p=p, k=k, v=v, q=q, do=do, stat=stat, ds=ds, dq=dq, kv_full=kv_full,
                    kv_empty=kv_empty, q_full=q_full, q_empty=q_empty, dq_full=dq_full,
                    dq_empty=dq_empty, meet=meet, fetch=fetch, first=first, end=end,
                    steps=steps):
            t, i, qcnt = (yield from fetch(first, 0)), 0, 0
            while t < end:
                key, qsteps = steps(t)
                kvb, kph = ring(i, NKV)
                yield Wait(kv_full[kvb], kph)
                kc, vc = k[kvb * NC + cid], v[kvb * NC + cid]
                K, V = ("K", key, cid), ("V", key, cid)
                for qkey in qsteps:
                    buf, ph = ring(qcnt, NB)
                    yield Wait(q_full[buf], ph)
                    Q, dO = ("Q", qkey), ("dO", qkey)
                    sb = (qcnt % 2) * NC
                    if M128:  # _step_rows: one dot after the other
                        yield Mma({kc: K, q[buf]: Q})                   # S^T
                        yield MmaWait(0)
                        yield Read(stat[buf], ("lse", qkey))
                        yield Mma({do[buf]: dO})                        # dV += P^T dO
                        yield MmaWait(0)
                        yield Mma({vc: V, do[buf]: dO})                 # dP^T
                        yield MmaWait(0)
                        yield Mma({q[buf]: Q})                          # dK += dS^T Q
                    else:
                        yield Mma({kc: K, q[buf]: Q})                   # S^T
                        yield Mma({vc: V, do[buf]: dO})                 # dP^T
                        yield MmaWait(1)
                        if M64:
                            yield Read(stat[buf], ("lse", qkey))
                        yield Mma({do[buf]: dO})                        # dV += P^T dO
                        yield MmaWait(1)
                        yield Mma({q[buf]: Q})                          # dK += dS^T Q
                    yield Write(ds[sb + cid], ("dS", qkey, cid))
                    if MEET:  # both dS^T in smem; the other parity's reads are done
                        other = tuple(ds[(NC - sb) % (2 * NC) + c] for c in range(NC))
                        yield BarSync(meet, NC * 128, release=other)
                        yield Mma({**{ds[sb + c]: ("dS", qkey, c) for c in range(NC)},
                                   **{k[kvb * NC + c]: ("K", key, c) for c in range(NC)}})
                    else:
                        yield Mma({kc: K, ds[sb + cid]: ("dS", qkey, cid)})
                    yield MmaWait(0)
                    yield Arrive(q_empty[buf], release=(q[buf], do[buf]) +
                                 ((stat[buf],) if M64 else ()))
                    mine = ("dQ", qkey, cid)
                    if DQS and cid == NC - 1:  # the others' partials summed here
                        for c2 in range(NC - 1):
                            yield Wait(dq_full[c2], qcnt & 1)
                            yield Read(dq[c2], ("dQ", qkey, c2))
                            yield Arrive(dq_empty[c2], release=(dq[c2],))
                        mine = ("dQsum", qkey)
                    yield Wait(dq_empty[cid], (qcnt & 1) ^ 1)
                    yield Write(dq[cid], mine)
                    yield Arrive(dq_full[cid])
                    qcnt += 1
                yield Write(vc, ("dK dV", key, cid))         # store: staged through V_c
                yield Read(vc, ("dK dV", key, cid))
                yield Arrive(kv_empty[kvb], release=tuple(k[kvb * NC:(kvb + 1) * NC]) + (vc,))
                if cid == 0:
                    walk.done.append(key)
                i += 1
                t = yield from fetch(t, i)

        def reduce_dq(p=p, fetch=fetch, reduce_step=reduce_step, first=first, end=end,
                      steps=steps):
            t, i, qcnt = (yield from fetch(first, 0)), 0, 0
            while t < end:
                _, qsteps = steps(t)
                for qkey in qsteps:
                    yield from reduce_step(qcnt, qkey)
                    qcnt += 1
                i += 1
                t = yield from fetch(t, i)

        sim.role(pre + "load", load())
        for c in range(NC):
            sim.role(f"{pre}compute{c}", compute(c))
        if not M64:
            sim.role(pre + "reduce_dq", reduce_dq(), threads=32)
    return walk


# ------------------------------------------------------------------------ CuteDSL, Hopper backward
def cute_bwd_hopper(sim: Sim, problem: Problem, cfg, programs: int, head_dim: int = 128,
                    elem_bytes: int = 2) -> BwdWalk:
    """kernels_cute/bwd_hopper.py's BwdMain: per CTA the `load` warp, the `reduce_dq`
    warp and two `compute` warpgroups (64 of the 128 keys each: K and V by halves).
    PipelineTmaAsync rings for K/V (kv_stages) and Q/dO (2, with the step's lse / delta
    rows beside), empty barriers of one arrival per compute warp; the tile handoff
    (causal packed) a PipelineAsync of 32 producer and 288 consumer threads. Named
    barriers: 1 (256 threads) twice a step around the single dS^T buffer (both halves
    free, then both written: the dQ MMA reads both); 3 and 2 (288 threads: the compute
    warpgroups and reduce_dq) for the single dQ staging buffer (empty, pre-arrived by
    reduce_dq; full); 4 + w (128) inside a warpgroup's store through its V half."""
    from jagged.tiles import bwd_dynamic

    from kernels_cute.bwd_hopper import BLOCK_N, NUM_MMA_WG, Q_STAGES
    D, BM, NW, NKV = head_dim, cfg.block_m, NUM_MMA_WG, cfg.kv_stages
    dyn = bwd_dynamic(problem.causal, problem.broadcast_q) and not problem.broadcast_q
    walk = BwdWalk(problem, BM, BLOCK_N, programs)
    P, G = walk.programs, problem.heads // problem.hkv
    KV_BYTES, Q_BYTES = BLOCK_N * D * elem_bytes, BM * D * elem_bytes
    DQ_THREADS = 128 * NW + 32
    counter = sim.counter("tile_counter")
    for p in range(P):
        pre = f"cta{p}."
        k = sim.buffers(pre + "k", NKV * NW)      # [stage * 2 + half]
        v = sim.buffers(pre + "v", NKV * NW)
        q = sim.buffers(pre + "q", Q_STAGES)
        do = sim.buffers(pre + "do", Q_STAGES)
        ld = sim.buffers(pre + "lse_delta", Q_STAGES)
        ds = sim.buffers(pre + "ds", NW)          # one buffer, a half a warpgroup
        dq = sim.buffers(pre + "dq", NW)
        tile_slot = sim.buffers(pre + "tile", 2)
        bar = lambda name, n, count=1: sim.mbarriers(pre + name, n, count)
        kv_full, kv_empty = bar("kv_full", NKV), bar("kv_empty", NKV, 4 * NW)
        q_full, q_empty = bar("q_full", Q_STAGES), bar("q_empty", Q_STAGES, 4 * NW)
        tile_full, tile_empty = bar("tile_full", 2, 32), bar("tile_empty", 2, DQ_THREADS)
        pds, dq_full_b, dq_empty_b = (sim.named_barrier(f"{pre}bar{n}") for n in (1, 2, 3))
        store_b = [sim.named_barrier(f"{pre}bar{4 + w}") for w in range(NW)]
        first, step, end = walk.range(p)

        steps = partial(walk.steps, pid=p)

        def fetch(t, i, threads, tile_slot=tile_slot, tile_full=tile_full,
                  tile_empty=tile_empty, step=step):
            if not dyn:
                return t + step if i else t
            return (yield from fetch_tile(tile_slot, tile_full, tile_empty, i, threads))

        def load(p=p, k=k, v=v, q=q, do=do, ld=ld, kv_full=kv_full, kv_empty=kv_empty,
                 q_full=q_full, q_empty=q_empty, tile_slot=tile_slot, tile_full=tile_full,
                 tile_empty=tile_empty, first=first, step=step, end=end, steps=steps):
            publish = partial(publish_tile, tile_slot, tile_full, tile_empty, threads=32)

            t, i, qcnt = first, 0, 0
            if dyn:
                yield from publish(t, 0)
            while t < end:
                key, qsteps = steps(t)
                st, ph = ring(i, NKV)                                    # load_kv
                yield Wait(kv_empty[st], ph ^ 1)
                yield Arrive(kv_full[st], tx=2 * KV_BYTES)
                yield Tma(kv_full[st], {k[st * NW + w]: ("K", key, w) for w in range(NW)},
                          KV_BYTES)
                yield Tma(kv_full[st], {v[st * NW + w]: ("V", key, w) for w in range(NW)},
                          KV_BYTES)
                for qkey in qsteps:                                      # load_q
                    qs, ph = ring(qcnt, Q_STAGES)
                    yield Wait(q_empty[qs], ph ^ 1)
                    yield Write(ld[qs], ("lse", qkey))
                    yield Arrive(q_full[qs], tx=2 * Q_BYTES)
                    yield Tma(q_full[qs], {q[qs]: ("Q", qkey)}, Q_BYTES)
                    yield Tma(q_full[qs], {do[qs]: ("dO", qkey)}, Q_BYTES)
                    qcnt += 1
                i += 1
                t = P + (yield Take(counter)) if dyn else t + step
                if dyn:
                    yield from publish(t, i)

        def compute(w, p=p, k=k, v=v, q=q, do=do, ld=ld, ds=ds, dq=dq, kv_full=kv_full,
                    kv_empty=kv_empty, q_full=q_full, q_empty=q_empty, pds=pds,
                    dq_full_b=dq_full_b, dq_empty_b=dq_empty_b, store_b=store_b,
                    fetch=fetch, first=first, end=end, steps=steps):
            t, i, qcnt = (yield from fetch(first, 0, 128)), 0, 0
            while t < end:
                key, qsteps = steps(t)
                st, kph = ring(i, NKV)
                yield Wait(kv_full[st], kph)
                kw, vw = k[st * NW + w], v[st * NW + w]
                K, V = ("K", key, w), ("V", key, w)
                for qkey in qsteps:
                    qs, ph = ring(qcnt, Q_STAGES)
                    yield Wait(q_full[qs], ph)
                    Q, dO, LD = ("Q", qkey), ("dO", qkey), ("lse", qkey)
                    if BM > 64:                                      # compute_step_128
                        yield Mma({kw: K, q[qs]: Q})                     # S^T
                        yield MmaWait(0)
                        yield Read(ld[qs], LD)
                        yield Mma({do[qs]: dO})                          # dV += P^T dO
                        yield MmaWait(0)
                        yield Read(ld[qs], LD)
                        yield Mma({vw: V, do[qs]: dO})                   # dP^T - delta
                        yield MmaWait(0)
                    else:                                            # compute_step_64
                        yield Mma({kw: K, q[qs]: Q})                     # S^T
                        yield Read(ld[qs], LD)                           # -delta
                        yield Mma({vw: V, do[qs]: dO})                   # dP^T - delta
                        yield MmaWait(1)
                        yield Read(ld[qs], LD)                           # lse
                        yield Mma({do[qs]: dO})                          # dV += P^T dO
                        yield MmaWait(1)
                    # dk_dq: dS^T to smem once both halves' previous readers are done
                    yield BarSync(pds, 128 * NW, release=tuple(ds))
                    yield Write(ds[w], ("dS", qkey, w))
                    yield BarSync(pds, 128 * NW)
                    yield Mma({**{ds[c]: ("dS", qkey, c) for c in range(NW)},     # dQ = dS K
                               **{k[st * NW + c]: ("K", key, c) for c in range(NW)}})
                    yield Mma({q[qs]: Q})                            # dK += dS^T Q
                    yield MmaWait(1)
                    yield BarSync(dq_empty_b, DQ_THREADS)            # the dQ partial out
                    yield Write(dq[w], ("dQ", qkey, w))
                    yield BarArrive(dq_full_b, DQ_THREADS)
                    yield MmaWait(0)
                    yield Arrive(q_empty[qs], 4, release=(q[qs], do[qs], ld[qs]))
                    qcnt += 1
                for _ in range(2):                                   # store: dK, dV
                    yield Write(vw, ("dK dV", key, w))
                    yield BarSync(store_b[w], 128)
                    yield Read(vw, ("dK dV", key, w))
                yield Arrive(kv_empty[st], 4, release=tuple(k[st * NW:(st + 1) * NW]) + (vw,))
                if w == 0:
                    walk.done.append(key)
                i += 1
                t = yield from fetch(t, i, 128)

        def reduce_dq(p=p, dq=dq, dq_full_b=dq_full_b, dq_empty_b=dq_empty_b, fetch=fetch,
                      first=first, end=end, steps=steps):
            yield BarArrive(dq_empty_b, DQ_THREADS)                  # it starts empty
            t, i = (yield from fetch(first, 0, 32)), 0
            while t < end:
                _, qsteps = steps(t)
                for qkey in qsteps:
                    yield BarSync(dq_full_b, DQ_THREADS)
                    yield Mma({dq[c]: ("dQ", qkey, c) for c in range(NW)})   # bulk reduce
                    yield MmaWait(0)                                 # its reads of sdQ
                    yield BarArrive(dq_empty_b, DQ_THREADS, release=tuple(dq))
                i += 1
                t = yield from fetch(t, i, 32)

        sim.role(pre + "load", load(), threads=32)
        sim.role(pre + "reduce_dq", reduce_dq(), threads=32)
        for w in range(NW):
            sim.role(f"{pre}compute{w}", compute(w))
    return walk


# ---------------------------------------------------------------------- TLX, Blackwell backward
def tlx_bwd_blackwell(sim: Sim, problem: Problem, cfg, programs: int, head_dim: int = 128,
                      elem_bytes: int = 2) -> BwdWalk:
    """kernels_tlx/bwd_blackwell.py's bwd_kernel: per program `load` and `mma` warps and
    `compute`, `reduce_dq`, `store` warpgroups, single-arrival mbarriers (the tile
    handoff's empty: 4 readers). TMEM: S^T (P^T over its lower columns), dP^T (at D = 128
    dQ in its columns: the same buffer here), dQ (two buffers at D = 64), dK, dV
    accumulating over a tile's steps; smem: Q/dO (q_stages), K/V (kv_stages), one dS^T,
    two fp32 dQ stages for the reduce's bulk stores (an async read each, retired by
    store_wait(1))."""
    from jagged.tiles import bwd_dynamic

    from kernels_tlx.bwd_blackwell import BLOCK_M, BLOCK_N
    D, BM, BN = head_dim, BLOCK_M.value, BLOCK_N.value
    NQ, NKV = cfg.q_stages, cfg.kv_stages
    ALIAS = D == BM
    NDQ, NSL = (1 if ALIAS else 2), D // cfg.dq_slice
    dyn = bwd_dynamic(problem.causal, problem.broadcast_q)
    walk = BwdWalk(problem, BM, BN, programs)
    P, G = walk.programs, problem.heads // problem.hkv
    counter = sim.counter("tile_counter")
    for p in range(P):
        pre = f"cta{p}."
        q, do = sim.buffers(pre + "q", NQ), sim.buffers(pre + "do", NQ)
        k, v = sim.buffers(pre + "k", NKV), sim.buffers(pre + "v", NKV)
        ds = sim.buffer(pre + "ds")
        dqs = sim.buffers(pre + "dq_stage", 2)
        s_lo, s_hi = sim.buffer(pre + "S.lo"), sim.buffer(pre + "S.hi")   # P^T over S.lo
        dp = sim.buffer(pre + "dP")
        dqt = [dp] if ALIAS else sim.buffers(pre + "dQ", 2)
        dk, dv = sim.buffer(pre + "dK"), sim.buffer(pre + "dV")
        tile_slot = sim.buffers(pre + "tile", 2)
        bar = lambda name, n=1, count=1: sim.mbarriers(pre + name, n, count)
        q_full, q_empty, kv_full, kv_empty = bar("q_full", NQ), bar("q_empty", NQ), \
            bar("kv_full", NKV), bar("kv_empty", NKV)
        s_full, dp_full, p_full, ds_full, ds_empty = (bar(n)[0] for n in (
            "s_full", "dp_full", "p_full", "ds_full", "ds_empty"))
        dq_full, dq_empty = bar("dq_full", NDQ), bar("dq_empty", NDQ)
        dkv_full, dkv_empty, sink = bar("dkv_full")[0], bar("dkv_empty")[0], bar("sink")[0]
        tile_full, tile_empty = bar("tile_full", 2), bar("tile_empty", 2, 4)
        first, step, end = walk.range(p)

        steps = partial(walk.steps, pid=p)

        def fetch(t, i, tile_slot=tile_slot, tile_full=tile_full, tile_empty=tile_empty,
                  step=step):
            if not dyn:
                return t + step if i else t
            return (yield from fetch_tile(tile_slot, tile_full, tile_empty, i))

        def load(p=p, q=q, do=do, k=k, v=v, q_full=q_full, q_empty=q_empty, kv_full=kv_full,
                 kv_empty=kv_empty, tile_slot=tile_slot, tile_full=tile_full,
                 tile_empty=tile_empty, first=first, step=step, end=end, steps=steps):
            publish = partial(publish_tile, tile_slot, tile_full, tile_empty)

            t, i, kcnt, qcnt = first, 0, 0, 0
            if dyn:
                yield from publish(t, 0)
            while t < end:
                key, qsteps = steps(t)
                if qsteps:
                    kb, kph = ring(kcnt, NKV)
                    yield Wait(kv_empty[kb], kph ^ 1)
                    yield Arrive(kv_full[kb], tx=2 * elem_bytes * BN * D)
                    yield Tma(kv_full[kb], {k[kb]: ("K", key)}, elem_bytes * BN * D)
                    yield Tma(kv_full[kb], {v[kb]: ("V", key)}, elem_bytes * BN * D)
                    kcnt += 1
                    for qkey in qsteps:
                        qb, qph = ring(qcnt, NQ)
                        yield Wait(q_empty[qb], qph ^ 1)
                        yield Arrive(q_full[qb], tx=2 * elem_bytes * BM * D)
                        yield Tma(q_full[qb], {q[qb]: ("Q", qkey)}, elem_bytes * BM * D)
                        yield Tma(q_full[qb], {do[qb]: ("dO", qkey)}, elem_bytes * BM * D)
                        qcnt += 1
                i += 1
                t = P + (yield Take(counter)) if dyn else t + step
                if dyn:
                    yield from publish(t, i)

        def mma(q=q, do=do, k=k, v=v, ds=ds, s_lo=s_lo, s_hi=s_hi, dp=dp, dqt=dqt, dk=dk,
                dv=dv, q_full=q_full, q_empty=q_empty, kv_full=kv_full, kv_empty=kv_empty,
                s_full=s_full, dp_full=dp_full, p_full=p_full, ds_full=ds_full,
                ds_empty=ds_empty, dq_full=dq_full, dq_empty=dq_empty, dkv_full=dkv_full,
                dkv_empty=dkv_empty, sink=sink, fetch=fetch, first=first, end=end,
                steps=steps):
            t, i, kcnt, qcnt, tw = (yield from fetch(first, 0)), 0, 0, 0, 0
            while t < end:
                key, qsteps = steps(t)
                if qsteps:
                    kb, kph = ring(kcnt, NKV)
                    yield Wait(kv_full[kb], kph)
                    K, V = ("K", key), ("V", key)
                    for j, qkey in enumerate(qsteps):
                        qb, qph = ring(qcnt, NQ)
                        ph = qcnt & 1
                        db, dph = ring(qcnt, NDQ)
                        Q, dO, dS = ("Q", qkey), ("dO", qkey), ("dS", qkey)
                        yield Wait(q_full[qb], qph)
                        yield Mma({k[kb]: K, q[qb]: Q}, {s_lo: ("S", qkey), s_hi: ("S", qkey)})
                        yield Commit(s_full)
                        if ALIAS:  # dP^T over the columns reduce_dq reads dQ from
                            yield Wait(dq_empty[db], dph ^ 1)
                        yield Mma({v[kb]: V, do[qb]: dO}, {dp: ("dP", qkey)})
                        yield Commit(dp_full)
                        if j == 0:  # the store has read the previous tile's dK, dV
                            yield Wait(dkv_empty, (tw & 1) ^ 1)
                        yield Wait(p_full, ph)
                        acc = {dv: ("dV", key, j - 1)} if j else {}
                        yield Mma({s_lo: ("P", qkey), do[qb]: dO, **acc}, {dv: ("dV", key, j)})
                        yield Commit(sink)
                        yield Wait(ds_full, ph)
                        acc = {dk: ("dK", key, j - 1)} if j else {}
                        yield Mma({ds: dS, q[qb]: Q, **acc}, {dk: ("dK", key, j)})
                        yield Commit(q_empty[qb], release=(q[qb], do[qb]))
                        if not ALIAS:
                            yield Wait(dq_empty[db], dph ^ 1)
                        yield Mma({ds: dS, k[kb]: K}, {dqt[db]: ("dQ", qkey)})
                        yield Commit(dq_full[db])
                        yield Commit(ds_empty, release=(ds,))
                        qcnt += 1
                    yield Commit(kv_empty[kb], release=(k[kb], v[kb]))
                    yield Commit(dkv_full)
                    kcnt += 1
                    tw += 1
                i += 1
                t = yield from fetch(t, i)

        def compute(ds=ds, s_lo=s_lo, s_hi=s_hi, dp=dp, s_full=s_full, dp_full=dp_full,
                    p_full=p_full, ds_full=ds_full, ds_empty=ds_empty, fetch=fetch,
                    first=first, end=end, steps=steps):
            t, i, qcnt = (yield from fetch(first, 0)), 0, 0
            while t < end:
                _, qsteps = steps(t)
                for qkey in qsteps:
                    ph = qcnt & 1
                    yield Wait(s_full, ph)
                    yield Wait(dp_full, ph)
                    yield Wait(ds_empty, ph ^ 1)
                    yield Read(s_lo, ("S", qkey))      # chunk by chunk: S^T, then P^T over
                    yield Read(s_hi, ("S", qkey))      # the columns read
                    yield Write(s_lo, ("P", qkey))
                    yield Read(dp, ("dP", qkey))
                    yield Write(ds, ("dS", qkey))
                    yield Arrive(p_full, release=(s_hi,))
                    yield Arrive(ds_full, release=(dp,))
                    qcnt += 1
                i += 1
                t = yield from fetch(t, i)

        def reduce_dq(dqt=dqt, dqs=dqs, dq_full=dq_full, dq_empty=dq_empty, fetch=fetch,
                      first=first, end=end, steps=steps):
            t, i, qcnt, scnt = (yield from fetch(first, 0)), 0, 0, 0
            while t < end:
                _, qsteps = steps(t)
                for qkey in qsteps:
                    db, dph = ring(qcnt, NDQ)
                    yield Wait(dq_full[db], dph)
                    for c in range(NSL):
                        yield Read(dqt[db], ("dQ", qkey))          # slice c from TMEM
                        if c == NSL - 1:
                            yield Arrive(dq_empty[db], release=(dqt[db],))
                        sb = scnt % 2
                        yield MmaWait(1)                           # store_wait(1)
                        yield Write(dqs[sb], ("dQ", qkey, c))
                        yield Mma({dqs[sb]: ("dQ", qkey, c)})      # the bulk reduce-add
                        scnt += 1
                    qcnt += 1
                i += 1
                t = yield from fetch(t, i)
            yield MmaWait(0)

        def store(dk=dk, dv=dv, dkv_full=dkv_full, dkv_empty=dkv_empty, fetch=fetch,
                  first=first, end=end, steps=steps):
            t, i, tw = (yield from fetch(first, 0)), 0, 0
            while t < end:
                key, qsteps = steps(t)
                if qsteps:
                    yield Wait(dkv_full, tw & 1)
                    yield Read(dv, ("dV", key, len(qsteps) - 1))
                    yield Read(dk, ("dK", key, len(qsteps) - 1))
                    yield Arrive(dkv_empty, release=(dk, dv))
                    tw += 1
                walk.done.append(key)
                i += 1
                t = yield from fetch(t, i)

        sim.role(pre + "compute", compute())
        sim.role(pre + "mma", mma(), threads=32)
        sim.role(pre + "load", load(), threads=32)
        sim.role(pre + "reduce_dq", reduce_dq())
        sim.role(pre + "store", store())
    return walk


# ------------------------------------------------------------------ CuteDSL, Blackwell backward
def cute_bwd_blackwell(sim: Sim, problem: Problem, cfg, programs: int, head_dim: int = 128,
                       elem_bytes: int = 2) -> BwdWalk:
    """kernels_cute/bwd_blackwell.py's main kernel: per CTA the `compute` warpgroup (and
    `store`), the `reduce_dq` warpgroup, the `mma` and `load` warps; static walk. K/V (one
    stage) and Q/dO (q_stages) TMA -> MMA, released by commits; the lse / delta rows
    (32 -> 128 threads); S^T and dP^T one commit -> compute, 128 arrivals back (P^T in
    TMEM over S^T's upper columns, dS^T in smem: no barrier of its own, the next S^T / dP^T
    commit covers its readers); dQ over dP^T's columns -> reduce_dq (128 back, before the
    next dP^T); dK / dV once a tile -> store. Named barrier 1 (288): TMEM handed out,
    then back before the MMA warp frees it; 2 (128) inside reduce_dq around its two
    staging buffers (buffer = chunk % 2, one bulk store pending at most). `compute`
    walks each head's Q blocks as the kernel splits them (masked ones, then the bulk:
    bulk_start, on the model's ints); a split that changed the steps' order or count
    would read a stale S^T / dP^T or leave a hand-over unmatched."""
    from kernels_cute.bwd_blackwell import BLOCK_M, BLOCK_N, DQ_WIDE, bulk_start
    from kernels_cute.seqinfo import SeqlenInfo
    D, BM, BN, NQ = head_dim, BLOCK_M, BLOCK_N, cfg.q_stages
    CH = D // DQ_WIDE
    walk = BwdWalk(problem, BM, BN, programs)
    P, G = walk.programs, problem.heads // problem.hkv
    KV_BYTES, Q_BYTES = 2 * BN * D * elem_bytes, 2 * BM * D * elem_bytes
    for p in range(P):
        pre = f"cta{p}."
        q, do = sim.buffers(pre + "q", NQ), sim.buffers(pre + "do", NQ)
        k, v = sim.buffer(pre + "k"), sim.buffer(pre + "v")
        ld = sim.buffers(pre + "lse_delta", NQ)
        ds = sim.buffer(pre + "ds")
        dqs = sim.buffers(pre + "dq_stage", 2)
        s_lo, s_hi = sim.buffer(pre + "S.lo"), sim.buffer(pre + "S.hi")   # P^T over S.hi
        dp = sim.buffer(pre + "dP")                                        # dQ over it
        dk, dv = sim.buffer(pre + "dK"), sim.buffer(pre + "dV")
        tmem_bufs = (s_lo, s_hi, dp, dk, dv)
        bar = lambda name, n=1, count=1: sim.mbarriers(pre + name, n, count)
        kv_full, kv_empty = bar("kv_full")[0], bar("kv_empty")[0]
        q_full, q_empty = bar("q_full", NQ), bar("q_empty", NQ)
        ld_full, ld_empty = bar("ld_full", NQ, 32), bar("ld_empty", NQ, 128)
        sdp_full, sdp_empty = bar("sdp_full")[0], bar("sdp_empty", 1, 128)[0]
        dq_full, dq_empty = bar("dq_full")[0], bar("dq_empty", 1, 128)[0]
        dkv_full, dkv_empty = bar("dkv_full")[0], bar("dkv_empty", 1, 128)[0]
        tmem_b, dq_b = sim.named_barrier(pre + "bar1"), sim.named_barrier(pre + "bar2")
        first, step, end = walk.range(p)

        steps = partial(walk.steps, pid=p)

        def compute_steps(t, pid=p):
            """(key, the tile's Q steps in compute's order)."""
            key, hk, b, m_lo, n_m = walk.coords(t, pid)
            n0 = walk.tile_n[key[0]] * BN
            seq = SeqlenInfo(0, 0, 0, problem.lens_q[b], problem.lens_k[b])
            m_bulk = bulk_start(seq, n0, m_lo, n_m, problem.causal, BM, BN)
            blocks = list(range(m_bulk)) + list(range(m_bulk, n_m))    # masked, bulk
            return key, [(b, hk * G + g, m_lo + jm * BM) for g in range(G) for jm in blocks]

        def load(q=q, do=do, k=k, v=v, ld=ld, kv_full=kv_full, kv_empty=kv_empty,
                 q_full=q_full, q_empty=q_empty, ld_full=ld_full, ld_empty=ld_empty,
                 first=first, step=step, end=end, steps=steps):
            t, kcnt, qcnt = first, 0, 0
            while t < end:
                key, qsteps = steps(t)
                if qsteps:
                    yield Wait(kv_empty, (kcnt & 1) ^ 1)
                    yield Arrive(kv_full, tx=KV_BYTES)
                    yield Tma(kv_full, {k: ("K", key)}, KV_BYTES // 2)
                    yield Tma(kv_full, {v: ("V", key)}, KV_BYTES // 2)
                    kcnt += 1
                    for qkey in qsteps:
                        qb, ph = ring(qcnt, NQ)
                        yield Wait(q_empty[qb], ph ^ 1)
                        yield Arrive(q_full[qb], tx=Q_BYTES)
                        yield Tma(q_full[qb], {q[qb]: ("Q", qkey)}, Q_BYTES // 2)
                        yield Tma(q_full[qb], {do[qb]: ("dO", qkey)}, Q_BYTES // 2)
                        yield Wait(ld_empty[qb], ph ^ 1)
                        yield Write(ld[qb], ("lse", qkey))
                        yield Arrive(ld_full[qb], 32)
                        qcnt += 1
                t += step

        def mma(q=q, do=do, k=k, v=v, ds=ds, s_lo=s_lo, s_hi=s_hi, dp=dp, dk=dk, dv=dv,
                kv_full=kv_full, kv_empty=kv_empty, q_full=q_full, q_empty=q_empty,
                sdp_full=sdp_full, sdp_empty=sdp_empty, dq_full=dq_full, dq_empty=dq_empty,
                dkv_full=dkv_full, dkv_empty=dkv_empty, tmem_b=tmem_b, tmem_bufs=tmem_bufs,
                first=first, step=step, end=end, steps=steps):
            yield BarSync(tmem_b, 288)                          # TMEM allocated
            t, kcnt, qcnt, n_sdp, n_dkv = first, 0, 0, 0, 0
            while t < end:
                key, qsteps = steps(t)
                if qsteps:
                    yield Wait(kv_full, kcnt & 1)
                    yield Wait(dkv_empty, (n_dkv & 1) ^ 1)
                    for j, qkey in enumerate(qsteps):
                        qb, ph = ring(qcnt, NQ)
                        Q, dO, dS = ("Q", qkey), ("dO", qkey), ("dS", qkey)
                        yield Wait(q_full[qb], ph)
                        yield Mma({k: ("K", key), q[qb]: Q}, {s_lo: ("S", qkey), s_hi: ("S", qkey)})
                        yield Wait(dq_empty, (n_sdp & 1) ^ 1)   # dQ(j - 1) read out
                        yield Mma({v: ("V", key), do[qb]: dO}, {dp: ("dP", qkey)})
                        yield Commit(sdp_full)
                        yield Wait(sdp_empty, n_sdp & 1)
                        acc = {dv: ("dV", key, j - 1)} if j else {}
                        yield Mma({s_hi: ("P", qkey), do[qb]: dO, **acc}, {dv: ("dV", key, j)})
                        acc = {dk: ("dK", key, j - 1)} if j else {}
                        yield Mma({ds: dS, q[qb]: Q, **acc}, {dk: ("dK", key, j)})
                        yield Commit(q_empty[qb], release=(q[qb], do[qb]))
                        yield Mma({ds: dS, k: ("K", key)}, {dp: ("dQ", qkey)})
                        yield Commit(dq_full, release=(ds,))
                        qcnt += 1
                        n_sdp += 1
                    yield Commit(dkv_full)
                    yield Commit(kv_empty, release=(k, v))
                    kcnt += 1
                    n_dkv += 1
                t += step
            yield BarSync(tmem_b, 288)                          # every user done
            for b in tmem_bufs:
                yield Write(b, "freed")

        def compute(ld=ld, ds=ds, s_lo=s_lo, s_hi=s_hi, dp=dp, dk=dk, dv=dv, ld_full=ld_full,
                    ld_empty=ld_empty, sdp_full=sdp_full, sdp_empty=sdp_empty,
                    dkv_full=dkv_full, dkv_empty=dkv_empty, tmem_b=tmem_b, first=first,
                    step=step, end=end, steps=compute_steps):
            yield BarSync(tmem_b, 288)
            t, qcnt, n_sdp, n_dkv = first, 0, 0, 0
            while t < end:
                key, qsteps = steps(t)
                for qkey in qsteps:
                    qb, ph = ring(qcnt, NQ)
                    yield Wait(ld_full[qb], ph)
                    yield Wait(sdp_full, n_sdp & 1)
                    yield Read(ld[qb], ("lse", qkey))
                    yield Read(s_hi, ("S", qkey))      # descending chunks: P^T over the
                    yield Read(s_lo, ("S", qkey))      # upper columns once read
                    yield Write(s_hi, ("P", qkey))
                    yield Read(dp, ("dP", qkey))
                    yield Write(ds, ("dS", qkey))
                    yield Arrive(ld_empty[qb], 128, release=(ld[qb],))
                    yield Arrive(sdp_empty, 128, release=(s_lo, dp))
                    qcnt += 1
                    n_sdp += 1
                if qsteps:                                         # store
                    n = len(qsteps)
                    yield Wait(dkv_full, n_dkv & 1)
                    yield Read(dk, ("dK", key, n - 1))
                    yield Read(dv, ("dV", key, n - 1))
                    yield Arrive(dkv_empty, 128, release=(dk, dv))
                    n_dkv += 1
                walk.done.append(key)
                t += step
            yield BarArrive(tmem_b, 288)

        def reduce_dq(dp=dp, dqs=dqs, dq_full=dq_full, dq_empty=dq_empty, tmem_b=tmem_b,
                      dq_b=dq_b, first=first, step=step, end=end, steps=steps):
            yield BarSync(tmem_b, 288)
            t, n_dq = first, 0
            while t < end:
                _, qsteps = steps(t)
                for qkey in qsteps:
                    yield Wait(dq_full, n_dq & 1)
                    for c in range(CH):
                        yield Read(dp, ("dQ", qkey))               # chunk c from TMEM
                        if c == CH - 1:
                            yield Arrive(dq_empty, 128, release=(dp,))
                        yield MmaWait(1)                           # bulk wait_group(1)
                        yield BarSync(dq_b, 128)
                        yield Write(dqs[c % 2], ("dQ", qkey, c))
                        yield BarSync(dq_b, 128)
                        yield Mma({dqs[c % 2]: ("dQ", qkey, c)})   # the bulk reduce-add
                    n_dq += 1
                t += step
            yield MmaWait(0)
            yield BarArrive(tmem_b, 288)

        sim.role(pre + "compute", compute())
        sim.role(pre + "reduce_dq", reduce_dq())
        sim.role(pre + "mma", mma(), threads=32)
        sim.role(pre + "load", load(), threads=32)
    return walk


# ------------------------------------------------------------- CuteDSL, Blackwell backward, pair
def _as_broadcast_q(problem: Problem) -> Problem:
    """The pair build runs broadcast-Q only: any problem as one (L_q the longest query)."""
    if problem.broadcast_q:
        return problem
    from dataclasses import replace
    B = len(problem.lens_k)
    return replace(problem, lens_q=(max(1, max(problem.lens_q, default=1)),) * B,
                   broadcast_q=True)


def cute_bwd_blackwell_pair(sim: Sim, problem: Problem, cfg, programs: int,
                            head_dim: int = 128, elem_bytes: int = 2) -> BwdWalk:
    """kernels_cute/bwd_blackwell.py's pair build (broadcast-Q, D = 128): `programs` pairs
    of CTAs (c0 the leader, c1 its peer), pair p pinned to KV head p % H_kv, taking tiles
    2u, 2u + 1 (one a CTA; past the list a tile of no keys) for u = p // H_kv, + step, ...;
    both CTAs walk the pair's Q steps (from the lower first block of the two tiles).
    The leader's mma role issues every MMA, reading and writing both CTAs' buffers; its
    commits reach both CTAs' barriers (a multicast commit, modelled as one commit a
    barrier: the same MMAs, each arrival at its own time). TMA loads of both CTAs complete
    on the leader's full barriers, whose one expect counts both CTAs' bytes; consumers of
    both CTAs arrive on the leader's empty barriers (256). Each compute keeps its query
    half of dS in its stage `rank` and sends the other half (a bulk copy from its stage
    2, an expect-tx arrival plus the bytes on the peer's `ds_full`); c1's mma warp relays
    its `ds_full` to the leader's `ds_pair`; the leader waits both before dQ. A compute
    rewriting stage 2 first checks that its last copy has landed (a read of the copy's
    target, no synchronization: the commit handing it the step's S^T must imply it).
    TMEM is freed after the pair's dealloc handshake, and both CTAs meet at a cluster
    barrier before they exit."""
    from kernels_cute.bwd_blackwell import BLOCK_M, BLOCK_N, DQ_WIDE, bulk_start
    from kernels_cute.seqinfo import SeqlenInfo
    problem = _as_broadcast_q(problem)
    D, BM, BN = head_dim, BLOCK_M, BLOCK_N
    CH = (D // 2) // DQ_WIDE                      # 32-column chunks of a CTA's dQ
    walk = BwdWalk(problem, BM, BN, programs)
    HKV, G, L_q = problem.hkv, problem.heads // problem.hkv, problem.lens_q[0]
    pairs = HKV * max(1, programs // HKV)
    KV_BYTES = (2 * BN * D + 2 * BN * D // 2) * elem_bytes   # K, V, both tiles' K halves
    Q_BYTES = 4 * BM * D // 2 * elem_bytes                   # halves of Q, dO, Q^T, dO^T
    DS_BYTES = BN * BM // 2 * elem_bytes
    THREADS = 2 * (128 + 128 + 32 + 32)                      # the cluster barrier's roles

    def pair_steps(u, hk, rank):
        """-> (this CTA's key or None, its SeqlenInfo and n0, the pair's steps)."""
        t0, t1 = 2 * u, min(2 * u + 1, walk.n_real - 1)
        k0, _, b0, m0, _ = walk.coords(t0, hk)
        k1, _, b1, m1, _ = walk.coords(t1, hk)
        m_lo = min(m0, m1)
        n_m = -(-(L_q - m_lo) // BM)
        live = rank == 0 or 2 * u + 1 < walk.n_real
        key, b = (k0, b0) if rank == 0 else (k1, b1)
        n0 = walk.tile_n[key[0]] * BN if live else 0
        seq = SeqlenInfo(0, 0, 0, L_q, problem.lens_k[b] if live else 0)
        # (query head, first row): the same in both CTAs (broadcast-Q's one Q)
        steps = [(hk * G + g, m_lo + jm * BM) for g in range(G) for jm in range(n_m)]
        return (key if live else None), seq, n0, m_lo, n_m, steps

    def add_pair(p):
        """Pair p's roles (a function a pair: the roles' closures bind its names)."""
        hk, first, step = p % HKV, p // HKV, pairs // HKV
        c = [f"pair{p}.c{r}." for r in range(2)]
        buf = lambda r, name, n=None: (sim.buffers(c[r] + name, n) if n else   # noqa: E731
                                       sim.buffer(c[r] + name))
        k, v, kt = ([buf(r, x) for r in range(2)] for x in ("k", "v", "kt"))
        q, do, qt, dot = ([buf(r, x) for r in range(2)] for x in ("q", "do", "qt", "dot"))
        ld = [buf(r, "lse_delta") for r in range(2)]
        sds = [buf(r, "ds", 3) for r in range(2)]          # stages: tile 0, tile 1, sent
        dqs = [buf(r, "dq_stage") for r in range(2)]
        s_lo, s_hi = [buf(r, "S.lo") for r in range(2)], [buf(r, "S.hi") for r in range(2)]
        dp_lo, dp_hi = [buf(r, "dP.lo") for r in range(2)], [buf(r, "dP.hi") for r in range(2)]
        dk, dv = [buf(r, "dK") for r in range(2)], [buf(r, "dV") for r in range(2)]
        tmem = [(s_lo[r], s_hi[r], dp_lo[r], dp_hi[r], dk[r], dv[r]) for r in range(2)]
        bar = lambda r, name, count=1: sim.mbarriers(c[r] + name, 1, count)[0]  # noqa: E731
        kv_full, q_full = bar(0, "kv_full"), bar(0, "q_full")       # the leader's
        sdp_empty, dq_empty = bar(0, "sdp_empty", 256), bar(0, "dq_empty", 256)
        dkv_empty, ds_pair = bar(0, "dkv_empty", 256), bar(0, "ds_pair")
        kv_empty = [bar(r, "kv_empty") for r in range(2)]
        q_empty = [bar(r, "q_empty") for r in range(2)]
        ld_full = [bar(r, "ld_full", 32) for r in range(2)]
        ld_empty = [bar(r, "ld_empty", 128) for r in range(2)]
        sdp_full = [bar(r, "sdp_full") for r in range(2)]
        dq_full = [bar(r, "dq_full") for r in range(2)]
        dkv_full = [bar(r, "dkv_full") for r in range(2)]
        ds_full = [bar(r, "ds_full") for r in range(2)]
        dealloc = [bar(r, "dealloc", 32) for r in range(2)]
        tmem_b = [sim.named_barrier(c[r] + "bar1") for r in range(2)]
        dq_b = [sim.named_barrier(c[r] + "bar2") for r in range(2)]
        xchg_b = [sim.named_barrier(c[r] + "bar3") for r in range(2)]
        cluster = sim.named_barrier(f"pair{p}.cluster")

        def tiles():
            u = first
            while 2 * u < walk.n_real:
                yield u
                u += step

        def load(r):
            for u in tiles():
                steps = pair_steps(u, hk, r)[5]
                yield Wait(kv_empty[r], (u_count(u) & 1) ^ 1)
                if r == 0:
                    yield Arrive(kv_full, tx=2 * KV_BYTES)
                yield Tma(kv_full, {k[r]: ("K", u, r), v[r]: ("V", u, r), kt[r]: ("Kt", u, r)},
                          KV_BYTES)
                for s in steps:
                    i = q_count[r]
                    yield Wait(q_empty[r], (i & 1) ^ 1)
                    if r == 0:
                        yield Arrive(q_full, tx=2 * Q_BYTES)
                    tag = ("Q", u, s)
                    yield Tma(q_full, {q[r]: tag, do[r]: tag, qt[r]: tag, dot[r]: tag}, Q_BYTES)
                    yield Wait(ld_empty[r], (i & 1) ^ 1)
                    yield Write(ld[r], ("lse", u, s, r))
                    yield Arrive(ld_full[r], 32)
                    q_count[r] += 1
            yield BarSync(cluster, THREADS)

        def u_count(u):
            return (u - first) // step

        def mma():                                           # the leader's
            yield BarSync(tmem_b[0], 288)
            n_sdp, n_dkv = 0, 0
            for u in tiles():
                _, _, _, _, _, steps = pair_steps(u, hk, 0)
                yield Wait(kv_full, u_count(u) & 1)
                yield Wait(dkv_empty, (n_dkv & 1) ^ 1)
                for j, s in enumerate(steps):
                    tag, ph = ("Q", u, s), n_sdp & 1
                    yield Wait(q_full, ph)
                    yield Mma({**{k[r]: ("K", u, r) for r in range(2)},
                               **{q[r]: tag for r in range(2)}},
                              {b: ("S", u, s) for r in range(2) for b in (s_lo[r], s_hi[r])})
                    yield Wait(dq_empty, ph ^ 1)
                    yield Mma({**{v[r]: ("V", u, r) for r in range(2)},
                               **{do[r]: tag for r in range(2)}},
                              {b: ("dP", u, s) for r in range(2) for b in (dp_lo[r], dp_hi[r])})
                    for r in range(2):
                        yield Commit(sdp_full[r])
                    yield Wait(sdp_empty, ph)
                    acc = lambda b, name: {b: (name, u, j - 1)} if j else {}  # noqa: E731
                    for r in range(2):
                        yield Mma({s_lo[r]: ("P", u, s, r), dot[r]: tag, **acc(dv[r], "dV")},
                                  {dv[r]: ("dV", u, j)})
                        yield Mma({dp_lo[r]: ("dSt", u, s, r), qt[r]: tag, **acc(dk[r], "dK")},
                                  {dk[r]: ("dK", u, j)})
                    for r in range(2):
                        yield Commit(q_empty[r], release=(q[r], do[r], qt[r], dot[r]))
                    yield Wait(ds_full[0], ph)
                    yield Wait(ds_pair, ph)
                    yield Mma({**{sds[r][t]: ("dS", u, s, t, r) for r in range(2)
                                  for t in range(2)},
                               **{kt[r]: ("Kt", u, r) for r in range(2)}},
                              {dp_hi[r]: ("dQ", u, s) for r in range(2)})
                    for r in range(2):
                        yield Commit(dq_full[r], release=(sds[r][0], sds[r][1]))
                    n_sdp += 1
                for r in range(2):                           # the tile's MMAs done
                    yield Commit(dkv_full[r], release=tmem[r])
                for r in range(2):
                    yield Commit(kv_empty[r], release=(k[r], v[r], kt[r]))
                n_dkv += 1
            yield from teardown(0)

        def relay():                                         # c1's mma warp
            yield BarSync(tmem_b[1], 288)
            n = 0
            for u in tiles():
                for _ in pair_steps(u, hk, 1)[5]:
                    yield Wait(ds_full[1], n & 1)
                    yield Arrive(ds_pair)
                    n += 1
            yield from teardown(1)

        def teardown(r):
            yield BarSync(tmem_b[r], 288)                   # this CTA's readers done
            yield Arrive(dealloc[r ^ 1], 32)                # the pair's dealloc handshake
            yield Wait(dealloc[r], 0)
            for b in tmem[r]:
                yield Write(b, "freed")
            yield BarSync(cluster, THREADS)

        def compute(r):
            yield BarSync(tmem_b[r], 288)
            n_sdp, n_dkv, sent = 0, 0, None
            for u in tiles():
                key, seq, n0, m_lo, n_m, steps = pair_steps(u, hk, r)
                m_bulk = bulk_start(seq, n0, m_lo, n_m, problem.causal, BM, BN)
                order = list(range(m_bulk)) + list(range(m_bulk, n_m))  # masked, bulk
                walk_steps = [steps[g * n_m + jm] for g in range(G) for jm in order]
                for s in walk_steps:
                    ph = n_sdp & 1
                    yield Wait(ld_full[r], ph)
                    yield Wait(sdp_full[r], ph)
                    yield Read(ld[r], ("lse", u, s, r))
                    yield Read(s_lo[r], ("S", u, s))        # ascending chunks: P^T over
                    yield Read(s_hi[r], ("S", u, s))        # the lower columns, read
                    yield Write(s_lo[r], ("P", u, s, r))
                    yield Read(dp_lo[r], ("dP", u, s))
                    yield Read(dp_hi[r], ("dP", u, s))
                    yield Write(dp_lo[r], ("dSt", u, s, r))
                    yield Write(sds[r][r], ("dS", u, s, r, r))
                    if sent is not None:                    # the last copy has landed
                        yield Read(sds[r ^ 1][r], sent)
                        yield Release((sds[r ^ 1][r],))
                    yield Write(sds[r][2], ("dS", u, s, r, r ^ 1))
                    yield BarSync(xchg_b[r], 128)
                    sent = ("dS", u, s, r, r ^ 1)
                    yield Arrive(ds_full[r ^ 1], tx=DS_BYTES)   # one thread
                    yield Tma(ds_full[r ^ 1], {sds[r ^ 1][r]: sent}, DS_BYTES)
                    yield Release((sds[r][2],))
                    yield Arrive(ld_empty[r], 128, release=(ld[r],))
                    yield Arrive(sdp_empty, 128, release=(s_lo[r], s_hi[r], dp_lo[r], dp_hi[r]))
                    n_sdp += 1
                yield Wait(dkv_full[r], n_dkv & 1)              # store
                n = len(steps)
                yield Read(dk[r], ("dK", u, n - 1))
                yield Read(dv[r], ("dV", u, n - 1))
                yield Arrive(dkv_empty, 128, release=(dk[r], dv[r]))
                n_dkv += 1
                if key is not None:
                    walk.done.append(key)
            yield BarArrive(tmem_b[r], 288)
            yield BarSync(cluster, THREADS)

        def reduce_dq(r):
            yield BarSync(tmem_b[r], 288)
            n_dq = 0
            for u in tiles():
                for s in pair_steps(u, hk, r)[5]:
                    yield Wait(dq_full[r], n_dq & 1)
                    for ch in range(CH):
                        yield Read(dp_hi[r], ("dQ", u, s))
                        if ch == CH - 1:
                            yield Arrive(dq_empty, 128, release=(dp_hi[r],))
                        yield MmaWait(0)                    # bulk wait_group(0) read
                        yield BarSync(dq_b[r], 128)
                        yield Write(dqs[r], ("dQ", u, s, ch))
                        yield BarSync(dq_b[r], 128)
                        yield Mma({dqs[r]: ("dQ", u, s, ch)})   # two reduce boxes
                    n_dq += 1
            yield MmaWait(0)
            yield BarArrive(tmem_b[r], 288)
            yield BarSync(cluster, THREADS)

        q_count = [0, 0]
        for r in range(2):
            sim.role(c[r] + "compute", compute(r))
            sim.role(c[r] + "reduce_dq", reduce_dq(r))
            sim.role(c[r] + "load", load(r), threads=32)
        sim.role(c[0] + "mma", mma(), threads=32)
        sim.role(c[1] + "mma", relay(), threads=32)

    for p in range(pairs):
        add_pair(p)
    walk.programs = pairs
    return walk


# ----------------------------------------------------------------------------- sweeps
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


def sweep(model, cfg, problems: int, seeds: int, seed: int = 0, max_len: int | None = None,
          head_dim: int = 128, **sim_kw) -> tuple[int, int]:
    """`problems` random problems, each under `seeds` interleavings with 1-4 programs.
    Raises the first ProtocolError (naming the problem). Returns (runs, steps); pass
    wait_stats={} to collect how often each wait blocked."""
    rng = random.Random(seed)
    runs = steps = 0
    for _ in range(problems):
        problem = random_problem(rng, getattr(cfg, "block_m", 256),
                                 getattr(cfg, "block_n", 128), max_len)
        programs = rng.randint(1, 4)
        base = rng.randrange(1 << 30)
        try:
            steps += check(lambda sim: model(sim, problem, cfg, programs, head_dim),
                           range(base, base + seeds), **sim_kw)
        except ProtocolError as e:
            e.args = (f"{problem}, {programs} programs, {cfg}, D {head_dim}: {e.args[0]}",)
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
    "cute_fwd_hopper_v_tiles": (partial(cute_fwd_hopper, v_tiles=True),
                                "kernels_cute.fwd_hopper"),
    "tlx_fwd_blackwell": (tlx_fwd_blackwell, "kernels_tlx.fwd_blackwell"),
    "cute_fwd_blackwell": (cute_fwd_blackwell, "kernels_cute.fwd_blackwell"),
    "tlx_bwd_hopper": (tlx_bwd_hopper, "kernels_tlx.bwd_hopper"),
    "cute_bwd_hopper": (cute_bwd_hopper, "kernels_cute.bwd_hopper"),
    "tlx_bwd_blackwell": (tlx_bwd_blackwell, "kernels_tlx.bwd_blackwell"),
    "cute_bwd_blackwell": (cute_bwd_blackwell, "kernels_cute.bwd_blackwell"),
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
        t0, runs, steps, stats = time.time(), 0, 0, {}
        for key, cfg in _configs(module).items():
            d = key if isinstance(key, int) else key[0]  # the tables are keyed by D first
            r, s = sweep(model, cfg, args.problems, args.seeds, args.seed, head_dim=d,
                         wait_stats=stats)
            runs, steps = runs + r, steps + s
        print(f"{name}: {runs} interleavings, {steps} steps, no violation "
              f"({time.time() - t0:.1f} s)")
        idle = [f"{role} on {bar} ({n} waits)" for (role, bar), (n, b) in sorted(stats.items())
                if b == 0]
        if idle:
            print("  waits that never blocked (implied by others?): " + "; ".join(idle))


if __name__ == "__main__":
    main()
