"""The forward Blackwell kernels' protocols (kernels_tlx/ and kernels_cute/
fwd_blackwell.py)."""
from __future__ import annotations

from functools import partial

from .sim import (Arrive, BarArrive, BarSync, Commit, Mma, publish_tile, Read, ring, Sim,
                  Take, tile_fetcher, Tma, Wait, Write)
from .tiles import consumer_steps, FwdTile, kv_block, Problem, Walk


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

        # the kernel's _fetch
        fetch = tile_fetcher(tile_slot, tile_full, tile_empty, dyn, P, before=True)

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
