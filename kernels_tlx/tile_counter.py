"""Tiles from a counter for the roles of a TLX kernel (the backward's packed lists,
`jagged.tiles.bwd_dynamic`; the Hopper forward's causal packed lists,
`jagged.tiles.fwd_dynamic`): the load role takes each program's next tile with an atomic
add (`next_tile`) and hands it to the other roles through a two-slot ring
(`publish_tile`, `fetch_tile`); without DYNAMIC every role steps the static round-robin
itself. `kernels_cute/tile_counter.py` is its CuteDSL twin.

The ring is in global memory (a scheduling buffer: the backward's in
`jagged.tiles.dq_accumulator`, zeroed before the launch; the forward's after its tile
list's count, `jagged.tiles.fwd_sched`, zeroed again by its last program,
`finish_tiles`): [0] the counter, [1] the programs finished (forward), [4 + 2p,
4 + 2p + 2) program p's slots,
guarded by two full / two empty mbarriers: a 1-warp TLX task (the backward's reduce_dq)
cannot load a tensor from shared memory with this TLX (its layout is built for 4 warps:
"Layout has 4 warps per CTA, but the context requires 1").
"""
from __future__ import annotations

import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

__all__ = ["fetch_tile", "finish_tiles", "next_tile", "publish_tile"]


@triton.jit
def next_tile(t, step, sched_ptr, DYNAMIC: tl.constexpr):
    """The load task's next tile: from the counter (DYNAMIC; every program's first tile is
    its program id, so the counter starts past them), else the round-robin's next."""
    if DYNAMIC:
        return tl.num_programs(0) + tl.atomic_add(sched_ptr, 1, sem="relaxed")
    else:
        return t + step


@triton.jit
def publish_tile(sched_ptr, tile_full, tile_empty, t, i):
    """DYNAMIC: the load task hands tile t (the program's i-th; past the list: stop) to the
    other roles through this program's two slots, published by the arrive (release; the
    readers' wait acquires, in this CTA)."""
    s = i % 2
    ph = (i // 2) & 1
    tlx.barrier_wait(tile_empty[s], ph ^ 1)
    tl.store(sched_ptr + 4 + 2 * tl.program_id(0) + s, t)
    tlx.barrier_arrive(tile_full[s], 1)


@triton.jit
def fetch_tile(sched_ptr, tile_full, tile_empty, t, step, i, DYNAMIC: tl.constexpr):
    """The program's i-th tile in a role other than load: the one the load task published
    (DYNAMIC), else the round-robin's next after t."""
    if DYNAMIC:
        s = i % 2
        ph = (i // 2) & 1
        tlx.barrier_wait(tile_full[s], ph)
        t = tl.load(sched_ptr + 4 + 2 * tl.program_id(0) + s, volatile=True)
        tlx.barrier_arrive(tile_empty[s], 1)
    else:
        t = t + step
    return t


@triton.jit
def finish_tiles(sched_ptr):
    """The load task past its last tile: count this program finished, and the last one
    zeroes the counter and that count for the next launch over the same buffer (the
    forward's, which lives with its cached tile list: jagged.tiles.fwd_sched). Every
    program's counter adds come before its own finished add (acq_rel), so none follows
    the reset."""
    done = tl.atomic_add(sched_ptr + 1, 1, sem="acq_rel")
    if done == tl.num_programs(0) - 1:
        tl.store(sched_ptr, 0)
        tl.store(sched_ptr + 1, 0)
