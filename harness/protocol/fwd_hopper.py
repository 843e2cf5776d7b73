"""The forward Hopper kernels' protocols (kernels_tlx/ and kernels_cute/ fwd_hopper.py)."""
from __future__ import annotations

from functools import partial

from .sim import (Arrive, BarArrive, BarSync, kv_rings, load_kv, Mma, MmaWait, publish_tile,
                  Read, ring, Sim, Take, tile_fetcher, Tma, Wait, Write)
from .tiles import consumer_steps, kv_block, Problem, Walk


# ----------------------------------------------------------------------------- TLX, Hopper
def tlx_fwd_hopper(sim: Sim, problem: Problem, cfg, programs: int, head_dim: int = 128,
                   elem_bytes: int = 2) -> Walk:
    """kernels_tlx/fwd_hopper.py: `load` (the producer warpgroup) and block_m // 64
    `compute` + `store` consumers per program. Q: a (buffer, consumer) slot each, full /
    empty barriers of one arrival; K and V: num_buffers_kv-deep rings, full barriers of
    one arrival (the producer's expect) plus the TMA bytes, empty barriers of one
    arrival per consumer; the consumers' wgmma issue turns: named barriers 9.. of 256
    threads (`_hand_over`), the last consumer handing the first turn to consumer 0.
    Causal packed lists (jagged.tiles.fwd_dynamic): the producer takes each next tile
    from the counter and hands it to the consumers through the two-slot ring
    (tile_counter.py), else everyone steps the static round-robin."""
    from jagged.tiles import fwd_dynamic
    walk = Walk(problem, cfg.block_m, cfg.block_n, programs)
    NC, S, NBQ = cfg.block_m // 64, cfg.num_buffers_kv, cfg.num_buffers_q
    P, total = walk.programs, walk.total
    dyn = fwd_dynamic(problem.causal, problem.broadcast_q, False, False)
    Q_BYTES = 64 * head_dim * elem_bytes
    KV_BYTES = cfg.block_n * head_dim * elem_bytes
    counter = sim.counter("tile_counter")
    for p in range(P):
        pre = f"cta{p}."
        q = sim.buffers(pre + "q", NBQ * NC)
        k, v, k_full, k_empty, v_full, v_empty = kv_rings(sim, pre, S, NC)
        q_full = sim.mbarriers(pre + "q_full", NBQ * NC, 1)
        q_empty = sim.mbarriers(pre + "q_empty", NBQ * NC, 1)
        turn = [sim.named_barrier(f"{pre}bar{9 + c}") for c in range(NC)]
        tile_slot = sim.buffers(pre + "tile", 2)
        tile_full = sim.mbarriers(pre + "tile_full", 2, 1)
        tile_empty = sim.mbarriers(pre + "tile_empty", 2, NC)
        publish = partial(publish_tile, tile_slot, tile_full, tile_empty)

        fetch = tile_fetcher(tile_slot, tile_full, tile_empty, dyn, P)  # read by the consumers

        def load(p=p, q=q, k=k, v=v, q_full=q_full, q_empty=q_empty, k_full=k_full,
                 k_empty=k_empty, v_full=v_full, v_empty=v_empty, publish=publish):
            kv_cnt = i = 0
            tid = p
            if dyn:
                yield from publish(tid, 0)
            while tid < total:
                t = walk.coords(tid)
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
                i += 1
                tid = P + (yield Take(counter)) if dyn else tid + P
                if dyn:
                    yield from publish(tid, i)

        def consumer(cid, p=p, q=q, k=k, v=v, q_full=q_full, q_empty=q_empty, k_full=k_full,
                     k_empty=k_empty, v_full=v_full, v_empty=v_empty, turn=turn, fetch=fetch):
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
            kv_cnt = i = 0
            tid = yield from fetch(p, 0)
            while tid < total:
                t = walk.coords(tid)
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
                i += 1
                tid = yield from fetch(tid, i)

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
    the consumers read all four parts.
    Causal packed lists (jagged.tiles.fwd_dynamic): the load warp takes each next tile
    from the counter and hands it over through the two-slot ring (tile_counter.py) to
    every thread that walks the tiles (the consumers', v_tiles' three other converting
    warps'), each arriving on the slot's empty barrier."""
    from jagged.tiles import fwd_dynamic
    walk = Walk(problem, cfg.block_m, cfg.block_n, programs)
    NC, S, NBQ = cfg.block_m // 64, cfg.num_buffers_kv, cfg.num_buffers_q
    W = 4 if v_tiles else 1   # parts of a V slot: the converting warps' rows
    Q_BYTES = cfg.block_m * head_dim * elem_bytes
    KV_BYTES = cfg.block_n * head_dim * elem_bytes
    SCHED = 2
    P, total = walk.programs, walk.total
    dyn = fwd_dynamic(problem.causal, problem.broadcast_q, False, False)
    counter = sim.counter("tile_counter")
    for p in range(P):
        pre = f"cta{p}."
        tile_slot = sim.buffers(pre + "tile", 2)
        tile_full = sim.mbarriers(pre + "tile_full", 2, 32)
        tile_empty = sim.mbarriers(pre + "tile_empty", 2, 128 * NC + 32 * (W - 1))
        publish = partial(publish_tile, tile_slot, tile_full, tile_empty, threads=32)

        fetch = tile_fetcher(tile_slot, tile_full, tile_empty, dyn, P)  # read by every walking role
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

        def convert(w, p=p, to_f16=to_f16, fetch=fetch):
            """Warp w's conversions, in the order of CuteDSL `load` (fp8_v)."""
            cnt = i = 0
            tid = yield from fetch(p, 0, 32)
            while tid < total:
                t = walk.coords(tid)
                for n in range(1, t.n_end + 1):
                    yield from to_f16(w, cnt, t.key, kv_block(n - 1, t.n_end, cfg.mask_first))
                    cnt += 1
                i += 1
                tid = yield from fetch(tid, i, 32)

        def load(p=p, q=q, k=k, v=v, q_full=q_full, q_empty=q_empty, k_full=k_full,
                 k_empty=k_empty, v_full=v_full, v_empty=v_empty, to_f16=to_f16, v8=v8,
                 v8_full=v8_full, v8_empty=v8_empty, publish=publish):
            q_cnt = kv_cnt = i = 0
            tid = p
            if dyn:
                yield from publish(tid, 0)
            while tid < total:
                t = walk.coords(tid)
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
                i += 1
                tid = P + (yield Take(counter)) if dyn else tid + P
                if dyn:
                    yield from publish(tid, i)

        def compute(wg, p=p, q=q, k=k, v=v, q_full=q_full, q_empty=q_empty,
                    k_full=k_full, k_empty=k_empty, v_full=v_full, v_empty=v_empty,
                    turn=turn, epi=epi, v_parts=v_parts, fetch=fetch):
            if wg == 0:  # consumer 0 issues first
                yield BarArrive(turn[0], 256)
            q_cnt = kv_cnt = i = 0
            tid = yield from fetch(p, 0, 128)
            while tid < total:
                t = walk.coords(tid)
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
                i += 1
                tid = yield from fetch(tid, i, 128)

        sim.role(pre + "load", load())
        for w in range(1, W):
            sim.role(f"{pre}convert{w}", convert(w))
        for c in range(NC):
            sim.role(f"{pre}compute{c}", compute(c))
    return walk
