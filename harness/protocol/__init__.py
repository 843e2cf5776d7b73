"""A CPU model checker for the barrier protocols of the warp-specialized kernels, and
the models of those protocols.

- `sim`: the checker (the synchronizing operations a role yields, `Sim`, `check`);
- `tiles`: the calls the models run over (`Problem`) and their tile walks;
- `fwd_hopper`, `fwd_blackwell`, `bwd_hopper`, `bwd_blackwell`: the models, named and
  split as the kernels are, both styles side by side. Each is read from its kernel's
  code: the same roles, rings, barriers (names and arrival counts), the same order of
  waits, arrives, copies and MMAs, and the same tile walk. A model adds one CTA's roles
  per persistent program and returns a walk that checks, when the run is over, that the
  programs took every tile of the list exactly once;
- `sweep`: every model over random jagged tile lists (`MODELS`); `python -m
  harness.protocol` runs them all and lists the waits that never blocked.
"""
from .sim import (Arrive, BarArrive, BarSync, Commit, Mma, MmaWait, ProtocolError, Read,
                  Release, Sim, Take, Tma, Wait, Write, check, fetch_tile, kv_rings, load_kv,
                  publish_tile, ring, tile_fetcher)
from .tiles import (BwdWalk, FwdTile, Problem, Walk, consumer_steps, fwd_tile_list,
                    kv_block, kv_steps, random_problem)
from .fwd_hopper import cute_fwd_hopper, tlx_fwd_hopper
from .fwd_blackwell import cute_fwd_blackwell, tlx_fwd_blackwell
from .bwd_hopper import cute_bwd_hopper, tlx_bwd_hopper
from .bwd_blackwell import cute_bwd_blackwell, cute_bwd_blackwell_pair, tlx_bwd_blackwell
from .sweep import MODELS, main, sweep

__all__ = [
    "Arrive", "BarArrive", "BarSync", "Commit", "Mma", "MmaWait", "ProtocolError", "Read",
    "Release", "Sim", "Take", "Tma", "Wait", "Write", "check", "fetch_tile", "kv_rings",
    "load_kv", "publish_tile", "ring", "tile_fetcher", "BwdWalk", "FwdTile", "Problem", "Walk",
    "consumer_steps", "fwd_tile_list", "kv_block", "kv_steps", "random_problem",
    "cute_fwd_hopper", "tlx_fwd_hopper", "cute_fwd_blackwell", "tlx_fwd_blackwell",
    "cute_bwd_hopper", "tlx_bwd_hopper", "cute_bwd_blackwell", "cute_bwd_blackwell_pair",
    "tlx_bwd_blackwell", "MODELS", "main", "sweep",
]
