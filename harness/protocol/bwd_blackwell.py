"""The backward Blackwell kernels' protocols (kernels_tlx/ and kernels_cute/
bwd_blackwell.py), the CuteDSL CTA-pair build included."""
from __future__ import annotations

from functools import partial

from .sim import (Arrive, BarArrive, BarSync, Commit, Mma, MmaWait, publish_tile, Read,
                  Release, ring, Sim, Take, tile_fetcher, Tma, Wait, Write)
from .tiles import BwdWalk, Problem


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
    dyn = bwd_dynamic(problem.broadcast_q)
    walk = BwdWalk(problem, BM, BN, programs)
    P = walk.programs
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

        fetch = tile_fetcher(tile_slot, tile_full, tile_empty, dyn, step)

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
