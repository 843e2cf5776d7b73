"""The backward Hopper kernels' protocols (kernels_tlx/ and kernels_cute/ bwd_hopper.py)."""
from __future__ import annotations

from functools import partial

from .sim import (Arrive, BarArrive, BarSync, Mma, MmaWait, publish_tile, Read, ring, Sim,
                  Take, tile_fetcher, Tma, Wait, Write)
from .tiles import BwdWalk, Problem


# ----------------------------------------------------------------------------- TLX, Hopper backward
def tlx_bwd_hopper(sim: Sim, problem: Problem, cfg, programs: int, head_dim: int = 128,
                   elem_bytes: int = 2, parts: int = 1, head_run: int = 1) -> BwdWalk:
    """kernels_tlx/bwd_hopper.py's bwd_kernel: per program `load` (the producer
    warpgroup), two `compute` consumers (64 keys of the 128-key tile each) and, at 32-row
    steps, a 1-warp `reduce_dq` (at 64- and 128-row steps the load task reduces dQ one
    step behind its loads). K/V: kv_stages stages, each consumer's K and V halves, full
    (one arrival + the bytes) / empty (one a consumer); Q/dO: a 2-deep ring, with lse2 /
    delta beside it at 64- and 128-row steps; dS^T: two steps deep, the consumers meeting
    on named barrier 8 (256 threads) where a consumer reads the other's; dQ: a staging
    buffer a consumer, full / empty to the reduce (a bulk reduce-add: an async read of the
    staging, retired by its wait), at D = 64 below 128-row steps summed into the last
    consumer's first. Packed lists: tiles from the counter, handed to the
    consumers (and reduce_dq) through the two-slot ring. parts: each tile split over that
    many programs by its steps (jagged.tiles.bwd_parts, schedule.part_steps). head_run:
    list entries a KV head in turn (the HEAD_RUN launch constant, schedule.head_run_coords;
    CuteDSL's is Config.head_run)."""
    from jagged.tiles import bwd_dynamic

    from kernels_tlx.bwd_hopper import BLOCK_N, NUM_BUF_Q, NUM_CONSUMERS, dq_cols
    D, BM, NC, NB, NKV = head_dim, cfg.block_m, NUM_CONSUMERS.value, NUM_BUF_Q.value, cfg.kv_stages
    BNC = BLOCK_N // NC
    M64, M128 = BM >= 64, BM >= 128
    DQ_COLS = dq_cols(D)
    DQS = DQ_COLS == D and not M128
    MEET = DQ_COLS < D or M128           # a consumer's dQ reads the other's dS^T (and K)
    dyn = bwd_dynamic(problem.broadcast_q)
    walk = BwdWalk(problem, BM, BLOCK_N, programs, parts, head_run)
    P = walk.programs
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

        fetch = tile_fetcher(tile_slot, tile_full, tile_empty, dyn, step)

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
                    else:
                        yield Mma({kc: K, q[buf]: Q})                   # S^T
                        yield Mma({vc: V, do[buf]: dO})                 # dP^T
                        yield MmaWait(1)
                        if M64:
                            yield Read(stat[buf], ("lse", qkey))
                        yield Mma({do[buf]: dO})                        # dV += P^T dO
                        yield MmaWait(1)
                    yield Write(ds[sb + cid], ("dS", qkey, cid))
                    if MEET:  # both dS^T in smem; the other parity's reads are done
                        other = tuple(ds[(NC - sb) % (2 * NC) + c] for c in range(NC))
                        yield BarSync(meet, NC * 128, release=other)
                        yield Mma({**{ds[sb + c]: ("dS", qkey, c) for c in range(NC)},
                                   **{k[kvb * NC + c]: ("K", key, c) for c in range(NC)}})
                    else:
                        yield Mma({kc: K, ds[sb + cid]: ("dS", qkey, cid)})
                    yield Mma({q[buf]: Q})                              # dK += dS^T Q
                    yield MmaWait(1)                                    # dQ (dK in flight)
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
                    yield MmaWait(0)                                    # dK
                    yield Arrive(q_empty[buf], release=(q[buf], do[buf]) +
                                 ((stat[buf],) if M64 else ()))
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
                    elem_bytes: int = 2, parts: int = 1) -> BwdWalk:
    """kernels_cute/bwd_hopper.py's BwdMain: per CTA the `load` warp, the `reduce_dq`
    warp and two `compute` warpgroups (64 of the 128 keys each: K and V by halves).
    PipelineTmaAsync rings for K/V (kv_stages) and Q/dO (2, with the step's lse / delta
    rows beside), empty barriers of one arrival per compute warp; the tile handoff
    (packed lists) a PipelineAsync of 32 producer and 288 consumer threads. Named
    barriers: 1 (256 threads) twice a step around the single dS^T buffer (both halves
    free, then both written: the dQ MMA reads both), once a step with cfg.ds_stages 2
    (a buffer a Q stage: both written, and the other stage's readers done); 3 and 2 (288 threads: the compute
    warpgroups and reduce_dq) for the single dQ staging buffer (empty, pre-arrived by
    reduce_dq; full); 4 + w (128) inside a warpgroup's store through its V half.
    cfg.dq_flat: a dQ buffer a warpgroup behind barriers of its own (8 + w empty, 6 + w
    full, 160 threads: the warpgroup and reduce_dq), which reduce_dq hands back at the
    next step's start once that buffer's bulk add has read it (bulk waits of 1, then 0),
    the other's still in flight. parts: as tlx_bwd_hopper's."""
    from jagged.tiles import bwd_dynamic

    from kernels_cute.bwd_hopper import BLOCK_N, NUM_MMA_WG, Q_STAGES
    D, BM, NW, NKV = head_dim, cfg.block_m, NUM_MMA_WG, cfg.kv_stages
    dyn = bwd_dynamic(problem.broadcast_q)
    walk = BwdWalk(problem, BM, BLOCK_N, programs, parts, cfg.head_run)
    P = walk.programs
    KV_BYTES, Q_BYTES = BLOCK_N * D * elem_bytes, BM * D * elem_bytes
    DQ_THREADS = 128 * NW + 32
    FLAT = cfg.dq_flat
    DS = cfg.ds_stages
    WG_THREADS = 128 + 32
    counter = sim.counter("tile_counter")
    for p in range(P):
        pre = f"cta{p}."
        k = sim.buffers(pre + "k", NKV * NW)      # [stage * 2 + half]
        v = sim.buffers(pre + "v", NKV * NW)
        q = sim.buffers(pre + "q", Q_STAGES)
        do = sim.buffers(pre + "do", Q_STAGES)
        ld = sim.buffers(pre + "lse_delta", Q_STAGES)
        ds = sim.buffers(pre + "ds", DS * NW)     # [stage * 2 + half]: a half a warpgroup
        dq = sim.buffers(pre + "dq", NW)
        tile_slot = sim.buffers(pre + "tile", 2)
        bar = lambda name, n, count=1: sim.mbarriers(pre + name, n, count)
        kv_full, kv_empty = bar("kv_full", NKV), bar("kv_empty", NKV, 4 * NW)
        q_full, q_empty = bar("q_full", Q_STAGES), bar("q_empty", Q_STAGES, 4 * NW)
        tile_full, tile_empty = bar("tile_full", 2, 32), bar("tile_empty", 2, DQ_THREADS)
        pds, dq_full_b, dq_empty_b = (sim.named_barrier(f"{pre}bar{n}") for n in (1, 2, 3))
        store_b = [sim.named_barrier(f"{pre}bar{4 + w}") for w in range(NW)]
        full_w = [sim.named_barrier(f"{pre}bar{6 + w}") for w in range(NW)]   # dq_flat
        empty_w = [sim.named_barrier(f"{pre}bar{8 + w}") for w in range(NW)]
        first, step, end = walk.range(p)

        steps = partial(walk.steps, pid=p)

        fetch = tile_fetcher(tile_slot, tile_full, tile_empty, dyn, step)

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
                    full_w=full_w, empty_w=empty_w, fetch=fetch, first=first, end=end,
                    steps=steps):
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
                    if BM == 128:                                    # compute_step_128
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
                        if cfg.dq_t:                                     # dV after dS^T
                            yield MmaWait(0)
                        yield Mma({do[qs]: dO})                          # dV += P^T dO
                        if not cfg.dq_t:
                            yield MmaWait(1)
                    # dk_dq: dS^T to smem once both halves' previous readers are done
                    sb = qcnt % DS * NW                              # the Q stage's
                    if DS == 1:
                        yield BarSync(pds, 128 * NW, release=tuple(ds))
                        yield Write(ds[w], ("dS", qkey, w))
                        yield BarSync(pds, 128 * NW)
                    else:  # its dQ MMAs over the other stage are done: that stage is free
                        yield Write(ds[sb + w], ("dS", qkey, w))
                        yield BarSync(pds, 128 * NW,
                                      release=tuple(ds[NW - sb + c] for c in range(NW)))
                    if cfg.dq_t:
                        yield MmaWait(0)                             # dV
                    yield Mma({**{ds[sb + c]: ("dS", qkey, c) for c in range(NW)},  # dQ
                               **{k[st * NW + c]: ("K", key, c) for c in range(NW)}})
                    yield Mma({q[qs]: Q})                            # dK += dS^T Q
                    yield MmaWait(1)
                    if FLAT:                                         # its own buffer
                        yield BarSync(empty_w[w], WG_THREADS)
                        yield Write(dq[w], ("dQ", qkey, w))
                        yield BarArrive(full_w[w], WG_THREADS)
                    else:
                        yield BarSync(dq_empty_b, DQ_THREADS)        # the dQ partial out
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
                      full_w=full_w, empty_w=empty_w, first=first, end=end, steps=steps):
            if not FLAT:
                yield BarArrive(dq_empty_b, DQ_THREADS)              # it starts empty
            t, i = (yield from fetch(first, 0, 32)), 0
            while t < end:
                _, qsteps = steps(t)
                for qkey in qsteps:
                    if FLAT:                                         # reduce_flat
                        for c in range(NW):
                            yield MmaWait(NW - 1 - c)                # buffer c's last add
                            yield BarArrive(empty_w[c], WG_THREADS, release=(dq[c],))
                        for c in range(NW):
                            yield BarSync(full_w[c], WG_THREADS)
                            yield Mma({dq[c]: ("dQ", qkey, c)})      # 1-D bulk add
                        continue
                    yield BarSync(dq_full_b, DQ_THREADS)
                    yield Mma({dq[c]: ("dQ", qkey, c) for c in range(NW)})   # bulk reduce
                    yield MmaWait(0)                                 # its reads of sdQ
                    yield BarArrive(dq_empty_b, DQ_THREADS, release=tuple(dq))
                i += 1
                t = yield from fetch(t, i, 32)
            yield MmaWait(0)

        sim.role(pre + "load", load(), threads=32)
        sim.role(pre + "reduce_dq", reduce_dq(), threads=32)
        for w in range(NW):
            sim.role(f"{pre}compute{w}", compute(w))
    return walk
