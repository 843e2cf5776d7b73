"""The barrier-protocol model checker (harness/protocol/) and the models of the
kernels' protocols (forward and backward, Hopper and Blackwell, both styles): the
checker finds each kind of violation in small hand-written protocols;
every model runs clean over random jagged tile lists (zero- and one-length sequences,
causal or not, broadcast-Q, GQA, several programs, tiles from the counter) under random
interleavings, at every config of its kernel; and mutated models (a release dropped, a
wrong parity, a stage too few, a wrong arrival count, a release before the MMA retired,
a lost issue turn, TMEM freed early) are caught with the specific report."""
import dataclasses
from functools import partial
import random

import pytest
import torch
import triton
import triton.language as tl
import zlib

from harness import protocol as P
from harness.problems import offsets
from harness.protocol import (Arrive, BarArrive, BarSync, Commit, Mma, MmaWait, Problem,
                              ProtocolError, Read, Sim, Take, Tma, Wait, Write, ring)


# ----------------------------------------------------------------------------- the checker
def _ring(sim, n, stages, consumers=1, count=None, skip_wait=False):
    """A producer filling a `stages`-deep ring n times, `consumers` readers."""
    buf = sim.buffers("b", stages)
    full = sim.mbarriers("full", stages, 1)
    empty = sim.mbarriers("empty", stages, count or consumers)

    def producer():
        for i in range(n):
            s, ph = ring(i, stages)
            if not skip_wait:
                yield Wait(empty[s], ph ^ 1)
            yield Arrive(full[s], tx=64)
            yield Tma(full[s], {buf[s]: i}, 64)

    def consumer():
        for i in range(n):
            s, ph = ring(i, stages)
            yield Wait(full[s], ph)
            yield Read(buf[s], i)
            yield Arrive(empty[s], release=(buf[s],))

    sim.role("producer", producer())
    for c in range(consumers):
        sim.role(f"consumer{c}", consumer())


def test_ring_runs_clean_and_is_deterministic():
    steps = [P.check(lambda sim: _ring(sim, 7, 2, consumers=2), range(s, s + 1))
             for s in range(50)]
    assert all(s > 0 for s in steps)
    traces = []
    for _ in range(2):
        sim = Sim(seed=11)
        _ring(sim, 5, 2)
        sim.run()
        traces.append(list(sim.trace))
    assert traces[0] == traces[1]


def test_deadlock_lists_every_pending_wait():
    def build(sim):
        _ring(sim, 4, 2)
        sim.mutate = lambda role, op: None if type(op) is Arrive and "empty" in op.bar else op
    with pytest.raises(ProtocolError) as e:
        P.check(build, range(3))
    assert e.value.kind == "deadlock"
    assert "producer: wait empty[0] parity 0 (completed phases 0, arrivals left 1/1" in str(e.value)


def test_lost_arrival_at_the_end():
    """An arrive dropped where nobody waits for it any more (the last release) shows as a
    phase left part done when the run ends."""
    def build(sim):
        _ring(sim, 3, 4, consumers=2)
        sim.mutate = lambda role, op: (None if role == "consumer1" and type(op) is Arrive
                                       and op.bar == "empty[2]" else op)
    with pytest.raises(ProtocolError, match="arrival: empty.2. ends with phase 0 part done: "
                                            "1 of 2 arrivals"):
        P.check(build, range(3))


def test_overwrite_before_release():
    """No empty-barrier wait: the producer rewrites a slot its reader still holds, the
    reader finds the slot already rewritten, or the producer arrives on a full barrier
    whose phase still waits for its copy, or the full barrier runs two phases ahead of
    the reader. (An interleaving where the reader keeps up
    shows nothing: random interleavings find it, not every one.)"""
    kinds = []
    for seed in range(40):
        try:
            P.check(lambda sim: _ring(sim, 6, 2, skip_wait=True), [seed])
        except ProtocolError as e:
            kinds.append(e.kind)
    assert len(kinds) >= 30 and set(kinds) == {"race", "stale", "arrival", "aliasing"}


def test_arrival_count_too_low_is_aliasing_or_race():
    """An empty barrier expecting 1 arrival with 2 readers completes twice a use."""
    seen = set()
    for seed in range(40):
        with pytest.raises(ProtocolError) as e:
            P.check(lambda sim: _ring(sim, 8, 2, consumers=2, count=1), [seed])
        seen.add(e.value.kind)
    assert "aliasing" in seen and seen <= {"aliasing", "race", "stale", "arrival"}


def test_wait_on_a_stale_phase_is_aliasing():
    """A wait whose parity is flipped at its third use passes on phase 1 while it means
    phase 2: reported as aliasing, before any data is read."""
    def build(sim):
        _ring(sim, 6, 1)
        n = {"k": 0}

        def mutate(role, op):
            if role == "consumer0" and type(op) is Wait:
                n["k"] += 1
                if n["k"] == 3:
                    return op._replace(parity=op.parity ^ 1)
            return op
        sim.mutate = mutate
    with pytest.raises(ProtocolError, match="aliasing: consumer0 waits full.0. parity 1 "
                                            "meaning phase 2"):
        P.check(build, range(5))


def test_named_barriers():
    """bar.sync waits for the thread count; a generation completed by arrives alone is a
    lost turn; thread counts must agree."""
    def turns(sim, first_arrive=True, extra=False):
        b = [sim.named_barrier("t0"), sim.named_barrier("t1")]

        def wg(c):
            if c == 1 and first_arrive:
                yield BarArrive(b[0], 256)
                if extra:
                    yield BarArrive(b[0], 256)
            for _ in range(3):
                yield BarSync(b[c], 256)
                yield BarArrive(b[1 - c], 256)
        sim.role("wg0", wg(0))
        sim.role("wg1", wg(1))
    P.check(turns, range(20))
    with pytest.raises(ProtocolError, match="deadlock(.|\n)*wg0: bar.sync t0"):
        P.check(lambda sim: turns(sim, first_arrive=False), range(3))
    with pytest.raises(ProtocolError, match="t[01] completed by arrives alone"):
        P.check(lambda sim: turns(sim, extra=True), range(3))


def test_mma_reads_are_in_flight_until_retired():
    """A release while the role's own wgmma still reads the buffer is a race; the same
    release after wait_group(0) is not."""
    def build(sim, wait_first):
        b = sim.buffers("k", 1)
        full = sim.mbarriers("full", 1, 1)
        empty = sim.mbarriers("empty", 1, 1)

        def producer():
            yield Arrive(full[0], tx=8)
            yield Tma(full[0], {b[0]: "K"}, 8)
            yield Wait(empty[0], 0)

        def consumer():
            yield Wait(full[0], 0)
            yield Mma({b[0]: "K"})
            if wait_first:
                yield MmaWait(0)
            yield Arrive(empty[0], release=(b[0],))
            yield MmaWait(0)
        sim.role("producer", producer())
        sim.role("consumer", consumer())
    P.check(lambda sim: build(sim, True), range(10))
    with pytest.raises(ProtocolError, match="race: consumer releases k.0. while its own MMA"):
        P.check(lambda sim: build(sim, False), range(10))


def test_commit_completes_mmas_then_arrives():
    """tcgen05 style: an MMA writes S in tensor memory, its commit arrives on s_full; the
    reader of S sees the MMA's version only after that phase; reading earlier is a race;
    a second MMA of the same role may read what the first still writes."""
    def build(sim, reader_waits=True):
        s, o = sim.buffers("S", 1), sim.buffers("O", 1)
        s_full = sim.mbarriers("s_full", 1, 1)

        def mma():
            yield Mma({}, {s[0]: "S0"})
            yield Mma({s[0]: "S0"}, {o[0]: "O0"})
            yield Commit(s_full[0])

        def softmax():
            if reader_waits:
                yield Wait(s_full[0], 0)
            yield Read(s[0], "S0")
            yield Read(o[0], "O0")
        sim.role("mma", mma(), threads=32)
        sim.role("softmax", softmax())
    P.check(build, range(20))
    with pytest.raises(ProtocolError) as e:
        P.check(lambda sim: build(sim, False), range(20))
    assert e.value.kind in ("race", "stale")


def test_counter_hands_out_each_value_once():
    got = []

    def build(sim):
        c = sim.counter("tiles", 3)

        def prog():
            for _ in range(4):
                got.append((yield Take(c)))
        for p in range(3):
            sim.role(f"p{p}", prog())
    got.clear()
    P.check(build, [5])
    assert sorted(got) == list(range(3, 15))


def test_model_helpers_mirror_the_kernels():
    """The models' kv_steps / kv_block are the kernels' (the CuteDSL ones are plain
    arithmetic on ints; the TLX ones are tested equal to them in test_tlx_schedule)."""
    from kernels_cute.schedule import kv_block, kv_steps
    from kernels_tlx.schedule import kv_block as tlx_kv_block
    for mf in (False, True):
        for n_end in range(1, 7):
            for n_bulk in range(n_end + 1):
                assert P.kv_steps(n_bulk, n_end, mf) == tuple(int(x) for x in
                                                             kv_steps(n_bulk, n_end, mf))
                for j in range(n_end):
                    assert P.kv_block(j, n_end, mf) == kv_block(j, n_end, mf) \
                        == tlx_kv_block.fn(j, n_end, mf)


@triton.jit
def _walk(pairs, n_pairs, cu_q, cu_k, out, H, NBLK, CAUSAL: tl.constexpr):
    """As a persistent TLX program walks its tiles: (b, h, m0, n_bulk, n_end) per loop
    step i at out[(pid * 64 + i) * 5]."""
    from kernels_tlx.schedule import tile_coords
    i = 0
    for t in range(tl.program_id(0), n_pairs * H, tl.num_programs(0)):
        h, hk, m0, q_start, k_start, out_start, len_q, len_k, n_bulk, n_end, b, _ = tile_coords(
            t, pairs, n_pairs, cu_q, cu_k, 0, H, 1, NBLK, 64, 64, CAUSAL, False)
        base = out + (tl.program_id(0) * 64 + i) * 5
        tl.store(base, k_start)
        tl.store(base + 1, h)
        tl.store(base + 2, m0)
        tl.store(base + 3, n_bulk)
        tl.store(base + 4, n_end)
        i += 1


@pytest.mark.parametrize("causal", [False, True])
def test_model_walk_is_the_kernels(causal):
    """The tiles each model program walks are those of the TLX kernel's tile_coords (in
    the interpreter): same order, same KV split, zero- and one-length sequences."""
    from kernels_tlx.schedule import build_tiles
    lq, lk = (130, 1, 0, 64, 200, 5), (40, 1, 7, 64, 300, 0)
    prob = Problem(lq, lk, heads=2, causal=causal)
    programs = 3
    walk = P.Walk(prob, 64, 64, programs)
    cq = offsets(torch.tensor(lq))
    # k_start encodes b: sequences with distinct key offsets (lk has no two equal prefixes
    # except where a length is 0, and those sequences' tiles are told apart by m0 / len)
    ck = offsets(torch.tensor(lk))
    pairs, count, nblk = build_tiles(cq, ck, len(lq), max(lq), None, 64, 64, causal)
    out = torch.full((programs * 64 * 5,), -1, dtype=torch.int32)
    _walk[(programs,)](pairs, int(count), cq, ck, out, 2, nblk, causal)
    out = out.view(programs, 64, 5)
    starts = ck[:-1].tolist()
    for p in range(programs):
        got = [tuple(r) for r in out[p].tolist() if r[0] >= 0]
        want = [(starts[t.b], t.h, t.m0, t.n_bulk, t.n_end) for t in walk.tiles[p]]
        assert got == want


# ----------------------------------------------------------------------------- the models
def _seed(key) -> int:
    return zlib.crc32(repr(key).encode())


def _tlx_configs():
    from kernels_tlx.fwd_hopper import CONFIGS
    return CONFIGS


def _cute_configs():
    from kernels_cute.fwd_hopper import CONFIGS
    return CONFIGS


KEYS = [(d, b, c) for d in (64, 128) for b in ("long", "short") for c in (False, True)]


@pytest.mark.parametrize("key", KEYS, ids=lambda k: f"{k[0]}-{k[1]}-{'causal' if k[2] else 'full'}")
def test_tlx_fwd_hopper_protocol(key):
    runs, steps = P.sweep(P.tlx_fwd_hopper, _tlx_configs()[key], problems=8, seeds=4,
                          seed=_seed(key))
    assert runs == 32 and steps > 0


@pytest.mark.parametrize("key", KEYS, ids=lambda k: f"{k[0]}-{k[1]}-{'causal' if k[2] else 'full'}")
def test_cute_fwd_hopper_protocol(key):
    runs, steps = P.sweep(P.cute_fwd_hopper, _cute_configs()[key], problems=8, seeds=4,
                          seed=_seed(key))
    assert runs == 32 and steps > 0


def test_tile_lists_cover_the_edges():
    """The random problems hold zero- and one-length sequences, causal and not,
    broadcast-Q, and tiles with no KV block; the walks cover every list."""
    rng = random.Random(0)
    seen = set()
    for _ in range(200):
        pr = P.random_problem(rng, 128, 128)
        seen |= {("zero", 0 in pr.lens_k), ("one", 1 in pr.lens_q), ("causal", pr.causal),
                 ("bq", pr.broadcast_q)}
        w = P.Walk(pr, 128, 128, 3)
        if any(t.n_end == 0 for ts in w.tiles for t in ts):
            seen.add("no kv")
    assert {("zero", True), ("one", True), ("causal", True), ("causal", False),
            ("bq", True), "no kv"} <= seen


# ----------------------------------------------------------------------------- mutations
# one CTA, two tiles of five KV blocks each (the rings wrap), two consumers
LONG = Problem((128, 128), (600, 600), heads=1, causal=False)


def _drop(role_part, pred):
    return lambda role, op: None if role_part in role and pred(op) else op


def _rename(mapping):
    """Every buffer name in an operation through `mapping` (a stage too few: two ring
    slots on one buffer)."""
    def m(role, op):
        f = lambda b: mapping.get(b, b)
        t = type(op)
        if t is Tma:
            return op._replace(writes={f(b): v for b, v in op.writes.items()})
        if t is Mma:
            return op._replace(reads={f(b): v for b, v in op.reads.items()},
                               writes={f(b): v for b, v in op.writes.items()})
        if t in (Read, Write):
            return op._replace(buf=f(op.buf))
        if t is Arrive:
            return op._replace(release=tuple(f(b) for b in op.release))
        return op
    return m


def _flip_parity(role_part, bar_part):
    return lambda role, op: (op._replace(parity=op.parity ^ 1)
                             if role_part in role and type(op) is Wait and bar_part in op.bar
                             else op)


def _reject(model, cfg, seeds=range(8), **kw):
    """Every seed finds a violation; -> the set of (kind, message) reports."""
    reports = []
    for seed in seeds:
        with pytest.raises(ProtocolError) as e:
            P.check(lambda sim: model(sim, LONG, cfg, 1), [seed], **kw)
        reports.append((e.value.kind, str(e.value)))
    return reports


MODELS = [("tlx", P.tlx_fwd_hopper, _tlx_configs, "consumer"),
          ("cute", P.cute_fwd_hopper, _cute_configs, "compute")]


@pytest.mark.parametrize("name,model,configs,consumer", MODELS, ids=[m[0] for m in MODELS])
def test_mutations_are_caught(name, model, configs, consumer):
    cfg = configs()[(128, "long", False)]  # 2 consumers, 2 K/V stages
    c1 = f"{consumer}1"

    # a dropped release arrive: the load role waits forever on that empty barrier
    for kind, msg in _reject(model, cfg, mutate=_drop(c1, lambda op: type(op) is Arrive
                                                      and "v_empty" in op.bar)):
        assert kind == "deadlock" and "cta0.load: wait cta0.v_empty[" in msg

    # a consumer waiting the full barrier with the wrong parity: it reads K before its
    # copy landed, or reads the previous block's K, or its wait is on the wrong phase
    reports = _reject(model, cfg, seeds=range(12), mutate=_flip_parity(c1, "k_full"))
    for kind, msg in reports:
        assert kind in ("race", "stale", "aliasing") and f"cta0.{c1} " in msg
        assert "reads cta0.k[" in msg or "waits cta0.k_full[" in msg

    # the producer waiting the empty barrier with the wrong parity never starts
    for kind, msg in _reject(model, cfg, mutate=_flip_parity("load", "k_empty")):
        assert kind == "deadlock" and "cta0.load: wait cta0.k_empty[0] parity 0" in msg

    # a stage too few: slots 0 and 1 of the K ring on one buffer
    for kind, msg in _reject(model, cfg, mutate=_rename({"cta0.k[1]": "cta0.k[0]"})):
        assert kind in ("race", "stale") and "cta0.k[0]" in msg

    # an empty barrier counting a single consumer's arrival: it runs ahead of the load
    reports = _reject(model, cfg, seeds=range(16),
                      counts={"cta0.k_empty": 1 if name == "tlx" else 4})
    assert {k for k, _ in reports} <= {"race", "aliasing", "stale"}
    assert any(k == "aliasing" and "cta0.load waits cta0.k_empty" in m for k, m in reports)

    # the K release before the wgmma reading it retired (the wait_group(1) dropped)
    for kind, msg in _reject(model, cfg, mutate=_drop(c1, lambda op: op == MmaWait(1))):
        assert kind == "race" and f"cta0.{c1} releases cta0.k[" in msg and "own MMA" in msg

    # consumer 0's issue turn never handed to it
    first = "consumer1" if name == "tlx" else "compute0"
    turn = "bar9" if name == "tlx" else "bar2"
    for kind, msg in _reject(model, cfg, mutate=_drop(first, lambda op: type(op) is BarArrive
                                                      and op.id.endswith(turn))):
        assert kind == "deadlock" and f"bar.sync cta0.{turn}" in msg


COUNTER_MODELS = [("tlx", P.tlx_fwd_hopper, _tlx_configs, "consumer1"),
                  ("cute", P.cute_fwd_hopper, _cute_configs, "compute1"),
                  ("cute-v-tiles", partial(P.cute_fwd_hopper, v_tiles=True), _cute_configs,
                   "convert2")]


@pytest.mark.parametrize("name,model,configs,reader", COUNTER_MODELS,
                         ids=[m[0] for m in COUNTER_MODELS])
def test_fwd_hopper_counter_handoff(name, model, configs, reader):
    """Causal packed lists take their tiles from the counter (jagged.tiles.fwd_dynamic):
    every tile finished once with several programs, and a reader that never frees its
    handoff slot is caught (the load role's third publish waits forever)."""
    cfg = configs()[(128, "long", True)]
    causal = Problem((300, 40, 530, 128), (300, 40, 530, 128), heads=2, causal=True)
    assert P.check(lambda sim: model(sim, causal, cfg, 3), range(6)) > 0
    for seed in range(4):
        with pytest.raises(ProtocolError) as e:
            P.check(lambda sim: model(sim, causal, cfg, 1), [seed],
                    mutate=_drop(reader, lambda op: type(op) is Arrive
                                 and "tile_empty" in op.bar))
        assert e.value.kind == "deadlock" and "cta0.load: wait cta0.tile_empty[" in str(e.value)


# ----------------------------------------------------------------------------- Blackwell
def _tlx_bw_configs():
    from kernels_tlx.fwd_blackwell import CONFIGS
    return CONFIGS


def _cute_bw_configs():
    from kernels_cute.fwd_blackwell import CONFIGS
    return CONFIGS


def _variants(configs, **fields):
    """Each config, and each with one field changed (the knobs the defaults leave off)."""
    out = dict(configs)
    for key, cfg in configs.items():
        for name, values in fields.items():
            for v in values:
                if getattr(cfg, name) != v:
                    out[(*key, f"{name}={v}")] = dataclasses.replace(cfg, **{name: v})
    return out


@pytest.mark.parametrize("dynamic", [True, False], ids=["counter", "round-robin"])
def test_tlx_fwd_blackwell_protocol(dynamic):
    """Clean at every config; and the P parts' barriers are live: the MMA's wait for a P
    part blocks in some interleavings (alpha goes out before P, so the rescale does not
    already imply every part, and P V of part 0 can start before part 1 is written)."""
    runs, stats = 0, {}
    for key, cfg in _tlx_bw_configs().items():
        cfg = dataclasses.replace(cfg, dynamic=dynamic)
        r, _ = P.sweep(P.tlx_fwd_blackwell, cfg, problems=3, seeds=3,
                       seed=_seed((key, dynamic)), max_len=300, wait_stats=stats)
        runs += r
    assert runs == 8 * 9
    assert stats[("mma", "p_full")][1] > 0


def test_cute_fwd_blackwell_protocol():
    configs = _variants(_cute_bw_configs(), clc=[False], early_release=[False],
                        num_buffers_kv=[2, 4])
    runs = 0
    for key, cfg in configs.items():
        r, _ = P.sweep(P.cute_fwd_blackwell, cfg, problems=3, seeds=3,
                       seed=_seed(key), max_len=300)
        runs += r
    assert runs == len(configs) * 9


@pytest.mark.parametrize("style", ["tlx", "cute"])
def test_fwd_blackwell_direct_protocol(style):
    """The list-free one-wave launch (jagged.tiles.fwd_direct: TLX's DIRECT, CuteDSL's
    Config.direct): a program a tile, every pair in order (those past a sequence's
    queries visit no block), no counter or CLC query; clean at every config, each
    (pair, head) finished once."""
    model = partial(P.tlx_fwd_blackwell, direct=True) if style == "tlx" else \
        P.cute_fwd_blackwell
    configs = _tlx_bw_configs() if style == "tlx" else {
        k: dataclasses.replace(c, direct=True) for k, c in _cute_bw_configs().items()}
    runs = 0
    for key, cfg in configs.items():
        r, _ = P.sweep(model, cfg, problems=3, seeds=3, seed=_seed((key, "direct")),
                       max_len=300)
        runs += r
    assert runs == len(configs) * 9


def test_direct_walk_takes_every_pair():
    """Walk(direct=True): a program per (pair, head) of the upper bound whatever the
    programs asked, pairs in order, a pair past its queries (a zero-length sequence's
    too) with no block, and the coverage check over every pair."""
    prob = Problem((300, 0, 1), (40, 7, 600), heads=2, causal=True)
    walk = P.Walk(prob, 256, 128, 1, flip=False, direct=True)
    assert walk.programs == walk.total == walk.bound == 3 * 2 * 2
    tiles = [walk.coords(t) for t in range(walk.total)]
    assert [(t.b, t.m0, t.h) for t in tiles[:4]] == [(0, 0, 0), (0, 256, 0), (0, 0, 1),
                                                    (0, 256, 1)]
    # (b, m0) -> blocks: sequence 0's first rows see no key (causal, 300 queries over 40
    # keys); past the queries: (0, 256) is not, (1, *) and (2, 256) are
    n_end = {(0, 0): 0, (0, 256): 1, (1, 0): 0, (1, 256): 0, (2, 0): 5, (2, 256): 0}
    assert {(t.b, t.m0): t.n_end for t in tiles} == n_end
    assert all(t.n_bulk <= t.n_end for t in tiles)
    assert len(walk.want) == walk.total


def test_cute_blackwell_walk_is_the_kernels():
    """The CuteDSL Blackwell tiles decode as its `tile_of` (no round-robin flip)."""
    fb = pytest.importorskip("kernels_cute.fwd_blackwell")
    if not hasattr(fb, "tile_of"):
        pytest.skip("no host-side tile_of")
    prob = Problem((300, 1, 0, 64, 600), (40, 1, 7, 64, 900), heads=2, causal=True)
    walk = P.Walk(prob, 256, 128, 3, flip=False)
    pairs, count, nblk = P.fwd_tile_list(prob, 256, 128)
    cq = [0]
    ck = [0]
    for a, b in zip(prob.lens_q, prob.lens_k):
        cq.append(cq[-1] + a)
        ck.append(ck[-1] + b)
    sched = fb.Sched(pairs, [count], cq, ck, 0, 2, 1, nblk)
    for t in range(walk.total):
        got = fb.tile_of(t, sched, 256, 128, True, False)
        want = walk.coords(t)
        assert (int(got.h), int(got.m0), int(got.n_end)) == (want.h, want.m0, want.n_end)
        assert int(got.seq.k_start) == ck[want.b]


# a longer list: rings wrap, several tiles a program, tiles with no key
BW = Problem((256, 300, 40, 512, 0), (600, 700, 50, 900, 30), heads=2, causal=False)


def _bw_reports(model, cfg, seeds=range(10), factory=None, **kw):
    """(kind, message) of each seed's violation; factory: makes a (stateful) mutation
    afresh for each seed."""
    out = []
    for seed in seeds:
        if factory is not None:
            kw["mutate"] = factory()
        try:
            P.check(lambda sim: model(sim, BW, cfg, 2), [seed], **kw)
        except ProtocolError as e:
            out.append((e.kind, str(e)))
    return out


def _has_kind(role, what):
    return lambda r, op: None if role in r and type(op) is what[0] and what[1] in op.bar else op


BW_MUTATIONS = [
    # (id, model, configs, key, mutation kwargs, allowed kinds, text in every report,
    #  every seed must fail)
    ("tlx-no-kv-release", P.tlx_fwd_blackwell, _tlx_bw_configs, (128, "long", False),
     dict(mutate=_has_kind("mma", (Commit, "kv_empty"))), {"deadlock"},
     "cta0.load: wait cta0.kv_empty[", True),
    ("tlx-pv-before-rescale", P.tlx_fwd_blackwell, _tlx_bw_configs, (128, "long", False),
     dict(mutate=_has_kind("mma", (Wait, "o_ready"))), {"stale", "race", "aliasing"}, "O",
     False),
    ("tlx-epilogue-before-o-full", P.tlx_fwd_blackwell, _tlx_bw_configs, (64, "long", True),
     dict(mutate=_has_kind("correction", (Wait, "o_full"))), {"stale", "race"},
     "correction reads cta", False),
    ("tlx-softmax-wrong-parity", P.tlx_fwd_blackwell, _tlx_bw_configs, (64, "short", False),
     dict(mutate=_flip_parity("softmax1", "s_full")), {"stale", "race", "aliasing"},
     "softmax1", True),
    ("tlx-tile-handoff-one-reader-short", P.tlx_fwd_blackwell, _tlx_bw_configs,
     (128, "long", False), dict(counts={"cta0.tile_empty": 3}),
     {"stale", "race", "aliasing", "deadlock", "arrival", "coverage"}, "", False),
    ("tlx-kv-stage-too-few", P.tlx_fwd_blackwell, _tlx_bw_configs, (128, "long", False),
     dict(mutate=_rename({"cta0.kv[3]": "cta0.kv[0]"})), {"stale", "race"}, "cta0.kv[0]",
     False),
    ("cute-no-q-release", P.cute_fwd_blackwell, _cute_bw_configs, (128, False),
     dict(mutate=_has_kind("mma", (Commit, "q_empty"))), {"deadlock"},
     "cta0.load: wait cta0.q_empty[", True),
    ("cute-pv-before-p", P.cute_fwd_blackwell, _cute_bw_configs, (128, False),
     dict(mutate=_has_kind("mma", (Wait, "p_full"))), {"stale", "race"}, "S", False),
    ("cute-clc-count", P.cute_fwd_blackwell, _cute_bw_configs, (64, True),
     dict(counts={"cta0.clc_empty": 448}), {"arrival", "aliasing", "race", "stale"},
     "clc", True),
    ("cute-store-before-o-full", P.cute_fwd_blackwell, _cute_bw_configs, (128, True),
     dict(mutate=_has_kind("correction", (Wait, "o_full"))), {"stale", "race"}, "O", False),
    ("cute-stats-overwrite", P.cute_fwd_blackwell, _cute_bw_configs, (64, False),
     dict(mutate=_has_kind("softmax", (Wait, "stats_empty"))),
     {"stale", "race", "aliasing"}, "stats", True),
    ("cute-tmem-freed-early", P.cute_fwd_blackwell, _cute_bw_configs, (128, False),
     dict(factory=lambda: _nth(lambda r, op: r == "cta0.mma" and type(op) is BarSync, 2)),
     {"race", "stale"}, "freed", False),
]


def _nth(pred, n):
    """Drop the n-th operation matching pred (the MMA warp's wait for the TMEM users
    before it frees TMEM)."""
    seen = [0]

    def m(role, op):
        if pred(role, op):
            seen[0] += 1
            if seen[0] == n:
                return None
        return op
    return m


@pytest.mark.parametrize("case", BW_MUTATIONS, ids=[c[0] for c in BW_MUTATIONS])
def test_blackwell_mutations_are_caught(case):
    _, model, configs, key, kw, kinds, text, every = case
    reports = _bw_reports(model, configs()[key], **kw)
    assert reports, "no seed found the violation"
    assert not every or len(reports) == 10
    for kind, msg in reports:
        assert kind in kinds and text in msg, msg


# ----------------------------------------------------------------------------- TLX backward
def _tlx_bwd_configs():
    from kernels_tlx.bwd_hopper import CONFIGS
    return CONFIGS


BWD_KEYS = [(64, "short"), (64, "mid"), (64, "long"), (128, "short"), (128, "long")]


@pytest.mark.parametrize("key", BWD_KEYS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_tlx_bwd_hopper_protocol(key):
    """Every step size: the reduce warp (32 rows) or the load task reducing one step
    behind (64, 128), the consumers meeting on dS^T (D = 128, 128-row steps) or summing
    dQ (D = 64 below); causal packed lists from the counter, GQA, broadcast-Q."""
    runs, _ = P.sweep(P.tlx_bwd_hopper, _tlx_bwd_configs()[key], problems=5, seeds=3,
                      seed=_seed(key), max_len=300, head_dim=key[0])
    assert runs == 15


BWD = Problem((300, 200, 64, 1), (400, 300, 100, 5), heads=2, kv_heads=1, causal=True)


def _bwd_reports(key, seeds=range(8), **kw):
    out = []
    for seed in seeds:
        try:
            P.check(lambda sim: P.tlx_bwd_hopper(sim, BWD, _tlx_bwd_configs()[key], 2, key[0]),
                    [seed], **kw)
        except ProtocolError as e:
            out.append((e.kind, str(e)))
    return out


@pytest.mark.parametrize("key", [(128, "long"), (64, "long")], ids=lambda k: f"{k[0]}-{k[1]}")
def test_tlx_bwd_ds_needs_two_buffers_where_consumers_meet(key):
    """dS^T single-buffered: a consumer overwrites its dS^T while the other's dQ MMA still
    needs it (where each consumer reads both, D = 128 and 128-row steps)."""
    reports = _bwd_reports(key, mutate=_rename({f"cta0.ds[{2 + c}]": f"cta0.ds[{c}]"
                                                for c in range(2)}))
    assert len(reports) == 8
    assert all(k in ("race", "stale") and "cta0.ds[" in m for k, m in reports)


def test_tlx_bwd_tile_handoff_counts_the_reduce_warp():
    """The tile handoff's empty barrier counting the consumers only (not reduce_dq): it
    runs ahead of the load task's waits, or ends part done."""
    reports = _bwd_reports((128, "short"), counts={"cta0.tile_empty": 2})
    assert len(reports) == 8
    assert all(k in ("aliasing", "arrival", "race", "stale") and "tile" in m
               for k, m in reports)


@pytest.mark.parametrize("style", ["tlx", "cute", "cute-flat"])
@pytest.mark.parametrize("parts", [2, 4, 8])
def test_bwd_split_tiles_protocol(style, parts):
    """Tiles split over programs by their steps (jagged.tiles.bwd_parts, schedule
    part_steps): every part of every (tile, KV head) finished once, parts with no step
    among them (a tile of one or two steps in four or eight parts), with no race or
    deadlock, in both styles' models (CuteDSL's also with Config.dq_flat)."""
    model, cfg = ((P.tlx_bwd_hopper, _tlx_bwd_configs()[(128, "long")]) if style == "tlx"
                  else (P.cute_bwd_hopper, _cute_bwd_configs()[(128, "long")]))
    if style == "cute-flat":
        cfg = dataclasses.replace(cfg, dq_flat=True)
    for prob in (BWD, Problem((300, 70, 64, 1), (400, 300, 100, 5), heads=4, kv_heads=2)):
        assert P.check(lambda sim: model(sim, prob, cfg, 3, 128, parts=parts), range(3)) > 0
    w = P.BwdWalk(BWD, 64, 128, 3, parts)
    got = [len(w.steps(t, 0)[1]) for t in range(w.range(0)[2])]
    tiles = [got[t:t + parts] for t in range(0, len(got), parts)]
    assert all(max(x) - min(x) <= 1 for x in tiles) and max(got) > 0
    assert (0 in got) == (parts > 2)   # the shortest tile: 2 steps


@pytest.mark.parametrize("style", ["tlx", "cute"])
@pytest.mark.parametrize("run", [2, 3])
def test_bwd_head_run_protocol(style, run):
    """List entries a KV head in runs (jagged.tiles.bwd_head_run, schedule.head_run_coords),
    the last run shorter: every (tile, KV head) finished once, with no race or deadlock,
    in both styles' models, whole tiles and split ones; and the walk's order: a run's
    entries for head 0, then head 1."""
    prob = Problem((300, 70, 64, 1, 200), (400, 300, 100, 5, 130), heads=4, kv_heads=2)
    if style == "tlx":
        cfg = _tlx_bwd_configs()[(128, "long")]
        model = lambda sim, parts: P.tlx_bwd_hopper(sim, prob, cfg, 3, 128, parts=parts,
                                                    head_run=run)
    else:
        cfg = dataclasses.replace(_cute_bwd_configs()[(128, "long")], head_run=run)
        model = lambda sim, parts: P.cute_bwd_hopper(sim, prob, cfg, 3, 128, parts=parts)
    for parts in (1, 2):
        assert P.check(lambda sim: model(sim, parts), range(3)) > 0
    w = P.BwdWalk(prob, 64, 128, 3, 1, run)
    order = [w.coords(t, 0)[0][:2] for t in range(w.range(0)[2])]
    assert sorted(order) == [(e, h) for e in range(w.n_real) for h in range(2)]
    assert order[:2 * run] == [(e, h) for h in range(2) for e in range(run)]


# ----------------------------------------------------------------------------- CuteDSL backward
def _cute_bwd_configs():
    from kernels_cute.bwd_hopper import CONFIGS
    return CONFIGS


CUTE_BWD_KEYS = [(64, "mid"), (64, "long"), (128, "long"), (128, "plain")]


@pytest.mark.parametrize("flat", [False, True], ids=["rows", "flat"])
@pytest.mark.parametrize("key", CUTE_BWD_KEYS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_cute_bwd_hopper_protocol(key, flat):
    """128-row steps (D = 64, two K/V stages), 64-row steps (D = 128, one; D = 64, two)
    and 80-row ones (D = 128, dQ^T): the dS^T and dQ buffers behind named barriers, tiles
    from the counter for causal packed lists; flat: a dQ buffer a warpgroup
    (Config.dq_flat)."""
    d = key[0]
    cfg = dataclasses.replace(_cute_bwd_configs()[key], dq_flat=flat)
    runs, _ = P.sweep(P.cute_bwd_hopper, cfg, problems=5, seeds=3,
                      seed=_seed(("cute bwd",) + key), max_len=300, head_dim=d)
    assert runs == 15


def test_cute_bwd_ds_stages_need_both_buffers():
    """Config.ds_stages 2 (one dS^T barrier a step): its two buffers folded into one, a
    warpgroup overwrites its dS^T half while the other's dQ MMA still reads it."""
    cfg = dataclasses.replace(_cute_bwd_configs()[(128, "plain")], ds_stages=2)
    assert P.check(lambda sim: P.cute_bwd_hopper(sim, BWD, cfg, 2, 128), range(4)) > 0
    out = []
    for seed in range(6):
        try:
            P.check(lambda sim: P.cute_bwd_hopper(sim, BWD, cfg, 2, 128), [seed],
                    mutate=_rename({f"cta0.ds[{2 + w}]": f"cta0.ds[{w}]" for w in range(2)}))
        except ProtocolError as e:
            out.append((e.kind, str(e)))
    assert len(out) == 6 and all(k in ("race", "stale") and "ds[" in m for k, m in out)


def test_cute_bwd_flat_mutations_are_caught():
    """Config.dq_flat's hand-over: a warpgroup's buffer handed back before its bulk add
    has read it (reduce_dq's bulk waits one short), or written without its empty barrier
    (one warpgroup skips it), is reported on every seed."""
    cfg = dataclasses.replace(_cute_bwd_configs()[(128, "plain")], dq_flat=True)

    def reports(mutate):
        out = []
        for seed in range(6):
            try:
                P.check(lambda sim: P.cute_bwd_hopper(sim, BWD, cfg, 2, 128), [seed],
                        mutate=mutate)
            except ProtocolError as e:
                out.append((e.kind, str(e)))
        return out

    early = reports(lambda r, op: MmaWait(op.pending + 1) if (
        r.endswith("reduce_dq") and type(op) is MmaWait and op.pending < 1) else op)
    assert len(early) == 6 and all(k == "race" and "dq[" in m for k, m in early)
    skip = reports(lambda r, op: None if (
        r.endswith("compute1") and type(op) is BarSync and op.id.endswith("bar9")) else op)
    assert len(skip) == 6 and all(k in ("arrival", "race", "stale", "deadlock")
                                  for k, _ in skip)


def _cute_bwd_reports(d, seeds=range(6), **kw):
    out = []
    for seed in seeds:
        try:
            P.check(lambda sim: P.cute_bwd_hopper(sim, BWD, _cute_bwd_configs()[(d, "long")],
                                                  2, d), [seed], **kw)
        except ProtocolError as e:
            out.append((e.kind, str(e)))
    return out


@pytest.mark.parametrize("d", [64, 128])
def test_cute_bwd_mutations_are_caught(d):
    # the first dS^T barrier of a step dropped in one warpgroup: its dQ MMA reads the
    # other's half before it is written (or the generations pair up into a deadlock)
    reports = _cute_bwd_reports(d, mutate=lambda r, op: None if (
        r.endswith("compute0") and type(op) is BarSync and op.id.endswith("bar1")
        and op.release) else op)
    assert len(reports) == 6 and all(k == "deadlock" or k in ("stale", "race")
                                     and "compute0 reads cta" in m and "ds[1]" in m
                                     for k, m in reports)
    assert any(k == "stale" for k, _ in reports)
    # the dQ staging's empty barrier skipped by one warpgroup: the barrier generations
    # pair up wrongly
    reports = _cute_bwd_reports(d, mutate=lambda r, op: None if (
        r.endswith("compute1") and type(op) is BarSync and op.id.endswith("bar3")) else op)
    assert len(reports) == 6 and all(k in ("deadlock", "race", "stale", "arrival")
                                     for k, _ in reports)
    # the tile handoff's empty barrier not counting reduce_dq's 32 threads
    reports = _cute_bwd_reports(d, counts={"cta0.tile_empty": 256})
    assert len(reports) == 6 and all(k in ("arrival", "aliasing", "race", "stale")
                                     and "tile" in m for k, m in reports)


@pytest.mark.parametrize("style", ["tlx", "cute"])
def test_bwd_broadcast_q_programs_pinned_to_heads(style):
    """Broadcast-Q with two KV heads: each program walks the list for its pinned head; all
    (tile, head) pairs are finished, each once (one-row queries, a keyless sequence)."""
    prob = Problem((1, 1, 1, 1), (315, 319, 128, 0), heads=2, causal=True, broadcast_q=True)
    if style == "tlx":
        for key, cfg in _tlx_bwd_configs().items():
            P.check(lambda sim: P.tlx_bwd_hopper(sim, prob, cfg, 4, key[0]), range(3))
    else:
        for (d, _), cfg in _cute_bwd_configs().items():
            P.check(lambda sim: P.cute_bwd_hopper(sim, prob, cfg, 4, d), range(3))


# ------------------------------------------------------------------- TLX Blackwell backward
def _tlx_bw_bwd_configs():
    from kernels_tlx.bwd_blackwell import CONFIGS
    return CONFIGS


@pytest.mark.parametrize("d", [64, 128])
def test_tlx_bwd_blackwell_protocol(d):
    """D = 128: dQ over dP^T's columns (one buffer); D = 64: two dQ buffers of its own."""
    runs, _ = P.sweep(P.tlx_bwd_blackwell, _tlx_bw_bwd_configs()[d], problems=5, seeds=3,
                      seed=_seed(("tlx bw bwd", d)), max_len=300, head_dim=d)
    assert runs == 15


# --------------------------------------------------------------- CuteDSL Blackwell backward
def _cute_bw_bwd_configs():
    from kernels_cute.bwd_blackwell import CONFIGS
    return CONFIGS


@pytest.mark.parametrize("d", [64, 128])
def test_cute_bwd_blackwell_protocol(d):
    runs, _ = P.sweep(P.cute_bwd_blackwell, _cute_bw_bwd_configs()[d], problems=5, seeds=3,
                      seed=_seed(("cute bw bwd", d)), max_len=300, head_dim=d)
    assert runs == 15


@pytest.mark.parametrize("start", [lambda n_m: n_m + 1, lambda n_m: -1])
def test_cute_bwd_blackwell_split_is_checked(monkeypatch, start):
    """compute walks each head's Q blocks as the kernel splits them (bulk_start): a
    split outside a tile's blocks gives compute steps the other roles never issue."""
    from kernels_cute import bwd_blackwell as B
    monkeypatch.setattr(B, "bulk_start", lambda seq, n0, m_lo, n_m, *a: start(n_m))
    cfg = _cute_bw_bwd_configs()[128]
    with pytest.raises(ProtocolError) as e:
        P.check(lambda sim: P.cute_bwd_blackwell(sim, BWD, cfg, 2, 128), [0])
    assert e.value.kind in ("deadlock", "stale", "arrival"), e.value


@pytest.mark.parametrize("style", ["tlx", "cute"])
def test_bwd_blackwell_mutations_are_caught(style):
    """Both styles' models catch the same two planted bugs (D = 128)."""
    d = 128
    model, cfg = ((P.tlx_bwd_blackwell, _tlx_bw_bwd_configs()[d]) if style == "tlx"
                  else (P.cute_bwd_blackwell, _cute_bw_bwd_configs()[d]))

    def reports(**kw):
        out = []
        for seed in range(6):
            try:
                P.check(lambda sim: model(sim, BWD, cfg, 2, d), [seed], **kw)
            except ProtocolError as e:
                out.append((e.kind, str(e)))
        return out
    # dP^T issued without waiting for reduce_dq to read dQ out of the same columns
    got = reports(mutate=lambda r, op: None if r.endswith("mma") and type(op) is Wait
                  and "dq_empty" in op.bar else op)
    assert got and all(k in ("race", "stale", "aliasing") and "dP" in m for k, m in got)
    # a dQ staging buffer rewritten while its bulk store / reduce still reads it (the
    # wait on the bulk group dropped)
    got = reports(mutate=lambda r, op: None if r.endswith("reduce_dq") and op == MmaWait(1)
                  else op)
    assert len(got) == 6 and all(k == "race" and "dq_stage" in m for k, m in got)


# ------------------------------------------------- CuteDSL Blackwell backward, the pair build
# broadcast-Q, an odd tile count (the last pair's peer takes the tile of no keys), a
# one-key and a keyless sequence, two KV heads
PAIR = Problem((130,) * 4, (300, 1, 0, 129), heads=2, causal=False, broadcast_q=True)


def _pair_cfg():
    from kernels_cute.bwd_blackwell import TWO_CTA
    return TWO_CTA


@pytest.mark.parametrize("causal", [False, True])
def test_cute_bwd_blackwell_pair_protocol(causal):
    """The pair's cross-CTA barriers (the leader's full and empty barriers, multicast
    commits, the dS exchange and its relay, the dealloc handshake) over random jagged
    broadcast-Q lists: no deadlock, no buffer reused before its release, every tile
    finished once."""
    prob = dataclasses.replace(PAIR, causal=causal)
    P.check(lambda sim: P.cute_bwd_blackwell_pair(sim, prob, _pair_cfg(), 2), range(6))
    runs, _ = P.sweep(P.cute_bwd_blackwell_pair, _pair_cfg(), problems=8, seeds=3,
                      seed=_seed(("cute bw bwd pair", causal)), max_len=300)
    assert runs == 24


def _pair_reports(seeds=range(6), **kw):
    out = []
    for seed in seeds:
        try:
            P.check(lambda sim: P.cute_bwd_blackwell_pair(sim, PAIR, _pair_cfg(), 1),
                    [seed], **kw)
        except ProtocolError as e:
            out.append((e.kind, str(e)))
    return out


def _no_wait(role_part, bar_part):
    return lambda r, op: None if (role_part in r and type(op) is Wait
                                  and bar_part in op.bar) else op


def test_cute_bwd_blackwell_pair_mutations_are_caught():
    # the leader not waiting for its own half to land in the peer: dQ reads the peer's
    # stage while the copy still writes it (a narrow window: the copy has to be slower
    # than the leader's dV, dK issue)
    reports = _pair_reports(seeds=range(150), mutate=_no_wait("c0.mma", "ds_pair"))
    assert reports and all(k == "race" and "c1.ds[0]" in m for k, m in reports)
    # the relay's arrival lost: the leader waits forever
    reports = _pair_reports(mutate=lambda r, op: None if (
        r.endswith("c1.mma") and type(op) is Arrive and "ds_pair" in op.bar) else op)
    assert len(reports) == 6 and all(k == "deadlock" and "ds_pair" in m for k, m in reports)
    # the multicast commit of S^T, dP^T not reaching the peer
    reports = _pair_reports(mutate=lambda r, op: None if (
        type(op) is Commit and op.bar.startswith("pair0.c1.sdp_full")) else op)
    assert len(reports) == 6 and all(k == "deadlock" for k, _ in reports)
    # the leader's empty barrier counting one CTA's threads: the next S^T overwrites what
    # the peer still reads
    reports = _pair_reports(counts={"pair0.c0.sdp_empty": 128})
    assert len(reports) == 6 and all(k in ("race", "stale", "arrival", "aliasing")
                                     for k, _ in reports)
    # the leader's full barrier expecting one CTA's bytes: the MMAs read the peer's Q
    # while its TMA still writes it
    reports = _pair_reports(mutate=lambda r, op: op._replace(tx=op.tx // 2) if (
        r.endswith("c0.load") and type(op) is Arrive and "q_full" in op.bar) else op)
    assert reports and all(k in ("race", "stale", "arrival", "aliasing") for k, _ in reports)
    # the leader's half of the dealloc handshake lost: the peer never frees its TMEM
    reports = _pair_reports(mutate=lambda r, op: None if (
        r.endswith("c0.mma") and type(op) is Arrive and "dealloc" in op.bar) else op)
    assert len(reports) == 6 and all(k == "deadlock" and "dealloc" in m for k, m in reports)
