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

The models of the kernels' protocols are the package's other modules (`__init__`).
"""
from __future__ import annotations

import random
from collections import deque
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


def tile_fetcher(slots, full, empty, dynamic: bool, step: int, before: bool = False):
    """A program's tile walk for its reading roles -> fetch(t, i, threads=1), a generator
    giving the i-th tile after tile t: dynamic, from the tile handoff (fetch_tile, the
    reader's `threads` arriving on the empty barrier); else the static round-robin,
    t + step, the first (i = 0) t itself unless `before` (then the first t is the program
    id minus step, as kernels_tlx/fwd_blackwell.py's _fetch passes it)."""
    def fetch(t, i, threads=1):
        if not dynamic:
            return t + step if i or before else t
        return (yield from fetch_tile(slots, full, empty, i, threads))
    return fetch


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
