"""Tiles from a counter for the roles of a CuteDSL kernel, the twin of
`kernels_tlx/tile_counter.py` (the backward's packed lists, `jagged.tiles.bwd_dynamic`;
the Hopper forward's causal packed lists, `jagged.tiles.fwd_dynamic`): the load warp
takes each CTA's next tile with an atomic add (`next_tile`) and hands it to the other
roles through a two-slot ring (`publish_tile`, `fetch_tile`); without `dynamic` every
role steps the static round-robin itself.

The ring is in global memory, as TLX's (a scheduling buffer: the backward's in
`jagged.tiles.dq_accumulator`, zeroed before the launch; the forward's after its tile
list's count, `jagged.tiles.fwd_sched`, zeroed again by its last CTA,
`finish_tiles`): [0] the counter, [1] the CTAs finished (forward), [4 + 2p,
4 + 2p + 2) CTA p's slots, guarded by a two-stage `PipelineAsync` whose barriers the
helpers drive with a slot and phase derived from a loop-carried count i: a pipeline state
advanced inside a called helper is not carried by the caller's tile loop. Imported only
inside the kernel factories (the DSL loads with it)."""
import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr


@cute.jit
def next_tile(t: Int32, step: Int32, mSched: cute.Tensor, dynamic: cutlass.Constexpr):
    """The load warp's next tile: from the counter (dynamic; every CTA's first tile is its
    CTA id, so the counter starts past them), else the round-robin's next."""
    if const_expr(dynamic):
        ticket = Int32(0)
        if cute.arch.lane_idx() == 0:
            ticket = cute.arch.atomic_add(mSched.iterator, Int32(1), sem="relaxed", scope="gpu")
        t = cute.arch.grid_dim()[0] + cute.arch.shuffle_sync(ticket, 0)
    else:
        t = t + step
    return t


@cute.jit
def publish_tile(mSched: cute.Tensor, pipeline_tile, t: Int32, i: Int32):
    """dynamic: the load warp hands tile t (the CTA's i-th; past the list: stop) to the
    other roles through this CTA's two slots, published by the arrive (release; the
    readers' wait acquires, in this CTA)."""
    full, empty = pipeline_tile.sync_object_full, pipeline_tile.sync_object_empty
    s, ph = i % 2, (i // 2) % 2
    empty.wait(s, ph ^ 1)
    if cute.arch.lane_idx() == 0:
        mSched[4 + 2 * cute.arch.block_idx()[0] + s] = t
    full.arrive(s, None)


@cute.jit
def fetch_tile(mSched: cute.Tensor, pipeline_tile, t: Int32, step: Int32, i: Int32,
               dynamic: cutlass.Constexpr):
    """The CTA's i-th tile in a role other than load: the one the load warp published
    (dynamic), else the round-robin's next after t."""
    if const_expr(dynamic):
        full, empty = pipeline_tile.sync_object_full, pipeline_tile.sync_object_empty
        s, ph = i % 2, (i // 2) % 2
        full.wait(s, ph)
        slot = mSched.iterator + (4 + 2 * cute.arch.block_idx()[0] + s)
        t = cute.arch.load(slot, Int32, sem="relaxed", scope="gpu")
        empty.arrive(s, None)
    else:
        t = t + step
    return t


@cute.jit
def finish_tiles(mSched: cute.Tensor):
    """The load warp past its last tile: count this CTA finished, and the last one zeroes
    the counter and that count for the next launch over the same buffer (the forward's,
    which lives with its cached tile list: jagged.tiles.fwd_sched). Every CTA's counter
    adds (its lane 0's) come before its own finished add (acq_rel), so none follows the
    reset."""
    if cute.arch.lane_idx() == 0:
        done = cute.arch.atomic_add(mSched.iterator + 1, Int32(1), sem="acq_rel", scope="gpu")
        if done == cute.arch.grid_dim()[0] - 1:
            mSched[0] = Int32(0)
            mSched[1] = Int32(0)
