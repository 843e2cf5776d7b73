"""Every model over random jagged calls: `sweep`, `MODELS` (model name -> the model and
the module whose CONFIGS it runs) and the command line (`python -m harness.protocol`)."""
from __future__ import annotations

import random
from functools import partial

from .sim import check, ProtocolError
from .tiles import random_problem
from .fwd_hopper import cute_fwd_hopper, tlx_fwd_hopper
from .fwd_blackwell import cute_fwd_blackwell, tlx_fwd_blackwell
from .bwd_hopper import cute_bwd_hopper, tlx_bwd_hopper
from .bwd_blackwell import cute_bwd_blackwell, tlx_bwd_blackwell


def sweep(model, cfg, problems: int, seeds: int, seed: int = 0, max_len: int | None = None,
          head_dim: int = 128, **sim_kw) -> tuple[int, int]:
    """`problems` random problems, each under `seeds` interleavings with 1-4 programs.
    Raises the first ProtocolError (naming the problem). Returns (runs, steps); pass
    wait_stats={} to collect how often each wait blocked."""
    rng = random.Random(seed)
    runs = steps = 0
    for _ in range(problems):
        problem = random_problem(rng, getattr(cfg, "block_m", 256),
                                 getattr(cfg, "block_n", 128), max_len)
        programs = rng.randint(1, 4)
        base = rng.randrange(1 << 30)
        try:
            steps += check(lambda sim: model(sim, problem, cfg, programs, head_dim),
                           range(base, base + seeds), **sim_kw)
        except ProtocolError as e:
            e.args = (f"{problem}, {programs} programs, {cfg}, D {head_dim}: {e.args[0]}",)
            raise
        runs += seeds
    return runs, steps


def _configs(module: str) -> dict:
    import importlib
    return importlib.import_module(module).CONFIGS


# model name -> (model, the module whose CONFIGS it runs)
MODELS = {
    "tlx_fwd_hopper": (tlx_fwd_hopper, "kernels_tlx.fwd_hopper"),
    "cute_fwd_hopper": (cute_fwd_hopper, "kernels_cute.fwd_hopper"),
    "cute_fwd_hopper_v_tiles": (partial(cute_fwd_hopper, v_tiles=True),
                                "kernels_cute.fwd_hopper"),
    "tlx_fwd_blackwell": (tlx_fwd_blackwell, "kernels_tlx.fwd_blackwell"),
    "cute_fwd_blackwell": (cute_fwd_blackwell, "kernels_cute.fwd_blackwell"),
    "tlx_bwd_hopper": (tlx_bwd_hopper, "kernels_tlx.bwd_hopper"),
    "cute_bwd_hopper": (cute_bwd_hopper, "kernels_cute.bwd_hopper"),
    "tlx_bwd_blackwell": (tlx_bwd_blackwell, "kernels_tlx.bwd_blackwell"),
    "cute_bwd_blackwell": (cute_bwd_blackwell, "kernels_cute.bwd_blackwell"),
}


def main(argv=None):
    import argparse
    import time
    ap = argparse.ArgumentParser(description="Model-check the kernels' barrier protocols.")
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--problems", type=int, default=50, help="random problems per config")
    ap.add_argument("--seeds", type=int, default=10, help="interleavings per problem")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name in args.models:
        model, module = MODELS[name]
        t0, runs, steps, stats = time.time(), 0, 0, {}
        for key, cfg in _configs(module).items():
            d = key if isinstance(key, int) else key[0]  # the tables are keyed by D first
            r, s = sweep(model, cfg, args.problems, args.seeds, args.seed, head_dim=d,
                         wait_stats=stats)
            runs, steps = runs + r, steps + s
        print(f"{name}: {runs} interleavings, {steps} steps, no violation "
              f"({time.time() - t0:.1f} s)")
        idle = [f"{role} on {bar} ({n} waits)" for (role, bar), (n, b) in sorted(stats.items())
                if b == 0]
        if idle:
            print("  waits that never blocked (implied by others?): " + "; ".join(idle))
