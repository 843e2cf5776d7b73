"""`python -m harness balance`: the backward's tile balance, simulated on the host (no GPU).

A problem's KV-tile list x KV heads x P parts, as the kernels walk it (protocol.BwdWalk:
jagged.tiles.kv_tiles_reference, the GPU list's tiles in its order), is dealt by the tile
counter: each program takes the next
item when it is free (kernels_*/tile_counter.py). An item costs its steps (a part's share
of the tile's group x n_m, schedule.part_steps; `--split runs`: runs of ceil(n_m / P) Q
blocks for all the group's heads, for comparison) plus the rule's fixed costs
(jagged.tiles: BWD_TILE_STEPS a whole tile, BWD_PART_ROWS / block_m a part;
BWD_SPLIT_CALL_STEPS a split call). The span is the last program's end, reported against
whole tiles, with the parts bwd_parts takes. A model of balance only (no memory traffic,
no clocks): read its gains as upper bounds (PERF.md, "Backward tiles split over
programs": host models against the H200's A/Bs).
"""
from __future__ import annotations

import heapq

from jagged.tiles import (BWD_PART_ROWS, BWD_SPLIT_CALL_STEPS, BWD_TILE_STEPS, bwd_mean_q,
                          bwd_parts)

from . import protocol

BLOCK_N = 128
PARTS = (1, 2, 4, 8)


def block_m(p) -> int:
    """The backward's query rows a step for problem p (the TLX build's choice; CuteDSL's
    split builds take the same)."""
    from kernels_tlx.bwd_hopper import pick_config
    lq, lk = p.lengths()
    B = len(lk)
    return pick_config(p.head_dim, int(lk.sum()) / B, bwd_mean_q(int(lq.sum()), B, False)).block_m


def items(p, parts: int, bm: int, split: str = "even") -> list[float]:
    """The costs of problem p's items in the order the counter deals them."""
    lq, lk = p.lengths()
    walk = protocol.BwdWalk(protocol.Problem(tuple(lq.tolist()), tuple(lk.tolist()), p.heads,
                                             p.causal, kv_heads=p.hkv), bm, BLOCK_N, 1, parts)
    G = p.heads // p.hkv
    fixed = BWD_TILE_STEPS if parts == 1 else BWD_PART_ROWS / bm
    out = []
    for t in range(walk.range(0)[2]):
        if split == "even":
            steps = len(walk.steps(t, 0)[1])
        else:  # the part's run of ceil(n_m / parts) Q blocks, all the group's heads
            (_, _, part), _, _, _, n_m = walk.coords(t, 0)
            per = -(-n_m // parts)
            steps = G * max(min(per, n_m - part * per), 0)
        out.append(steps + fixed)
    return out


def span(costs: list[float], programs: int) -> float:
    """The tile counter: each item to the program that frees first, in list order."""
    free = [0.0] * programs
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)


def simulate(p, programs: int = 132, split: str = "even") -> dict:
    """{'rule': the parts bwd_parts takes, P: span at P parts over whole tiles'}."""
    lq, lk = p.lengths()
    bm = block_m(p)
    base = span(items(p, 1, bm), programs)
    out = {"rule": bwd_parts(int(lq.sum()), int(lk.sum()), len(lk), p.hkv, p.heads // p.hkv,
                             p.causal, False, bm, BLOCK_N, programs, int(lq.max()),
                             int(lk.max()))}
    for P in PARTS:
        s = span(items(p, P, bm, split), programs) + (BWD_SPLIT_CALL_STEPS if P > 1 else 0)
        out[P] = s / base if base else 1.0
    return out


def report(problems, programs: int = 132, split: str = "even", split_only: bool = False):
    """One line a problem (broadcast-Q left out: its tiles stay whole)."""
    yield f"{'problem':58s} rule " + " ".join(f"{'P' + str(P):>6s}" for P in PARTS) + "  best"
    for p in problems:
        if p.mode == "broadcast_q":
            continue
        r = simulate(p, programs, split)
        if split_only and r["rule"] == 1 and min(r[P] for P in PARTS) > 0.95:
            continue
        best = min(PARTS, key=lambda P: r[P])
        yield (f"{p.label():58s} {r['rule']:4d} " + " ".join(f"{r[P]:6.3f}" for P in PARTS)
               + f"  {best}")
