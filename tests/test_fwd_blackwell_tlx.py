"""The TLX Blackwell forward (kernels_tlx/fwd_blackwell.py), compiled for sm_100a on the CPU
(no B200 here: it has not run).

Default run: one variant (D = 128, long, non-causal, bf16) and a broadcast-Q build that
packs GQA heads, the config table, the host checks (a packing call's launch, recorded)
and the tile hand-out. `-m matrix` compiles every default variant
(~20-40 s each on 2 cores), and the first for sm_103a (B300, which dispatch sends here
too). `-m gpu` on a B200 runs it against the oracle.

Each compile must show: a griddepcontrol.wait a task (the launch is a programmatic
dependent of the tile-list kernel), tcgen05.mma (P V with its A operand in TMEM) and
tcgen05.alloc in the PTX, every alloc matched by a dealloc and the allocation permit
relinquished, TMEM within 512 columns (the alloc), shared memory within the limit.
Spills: Triton 3.8's OptimizePartitionWarps pass (sm_100 only) overwrites the tasks' requested registers with
its fixed guess (88 for a task with tensors, 24 without), so the softmax tasks spill a
little; an xfail, bounded by SPILL_BOUND. The hand-out (one program per SM at most, every
tile once) and the barrier protocol (a model of the five tasks) are CPU tests.
"""
import functools
import math
from functools import partial
import random

import pytest
import torch

pytest.importorskip("triton")

from _blackwell import (Bar, b200_matrix, check_on_b200, check_tcgen05,  # noqa: E402
                        forward_fn, handoff_tiles, packing_call, problem, publish_tile,
                        skip_unless_b200, tlx_compile_tests, xfail_spills)
from _interp import interp  # noqa: E402
from harness.compile_check import SMEM_LIMIT, compile_kernel  # noqa: E402
from harness.problems import offsets  # noqa: E402
from kernels_tlx import fwd_blackwell as fb  # noqa: E402


# (head_dim, bucket, causal, broadcast_q, dtype[, pack]): every config of fb.CONFIGS,
# broadcast-Q and fp16 on some (GQA is a runtime argument: no build of its own), and
# broadcast-Q packing GQA heads into a tile's rows (pack: jagged.tiles.gqa_pack)
VARIANTS = [
    (128, "long", False, False, "bf16"),
    (128, "long", True, False, "bf16"),
    (128, "long", False, True, "fp16"),
    (128, "short", False, False, "bf16"),
    (128, "short", True, True, "bf16"),
    (64, "long", False, False, "bf16"),
    (64, "long", True, False, "fp16"),
    (64, "short", False, True, "bf16"),
    (64, "short", True, False, "bf16"),
    (64, "short", False, True, "bf16", 8),
    (128, "long", True, True, "bf16", 4),
]
SPILL_BOUND = 200  # spill instructions (LDL + STL): 31..101 at the defaults


@functools.lru_cache(maxsize=None)
def compile_fwd(d, bucket, causal, bq, dt, pack=1, arch=100):
    cfg = fb.CONFIGS[(d, bucket, causal)]
    name = (f"bw fwd D{d} {bucket} {'causal' if causal else 'full'}{' bq' if bq else ''}"
            f"{f' pack {pack}' if pack > 1 else ''} {dt}")
    return compile_kernel(fb.fwd_kernel, fb.signature(cfg, d, dt),
                          fb.kernel_args(cfg, d, causal, bq, pack), arch=arch, num_warps=4,
                          num_stages=1, name=name)


def _check(d, bucket, causal, bq, dt, pack=1, arch=100):
    rep = compile_fwd(d, bucket, causal, bq, dt, pack, arch)
    cols = check_tcgen05(rep)  # P V reads P from TMEM; S and O are TMEM accumulators
    assert 2 * (fb.CONFIGS[(d, bucket, causal)].block_n + d) <= max(cols)
    # a dependent launch of the list kernel: every task (correction, the softmax groups,
    # mma, load) waits before it reads global memory
    assert rep.ptx.count("griddepcontrol.wait") == 3 + fb.GROUPS.value, rep.row()
    return rep


test_compiles_sm100, test_compiles_sm103 = tlx_compile_tests(
    _check, VARIANTS, SPILL_BOUND, "softmax at 88 registers (OptimizePartitionWarps)")


def test_packed_compiles_sm100():
    """A broadcast-Q build packing 8 GQA heads into a tile's rows (its stores map rows
    back to (query row, head)) compiles for sm_100a as the unpacked builds do."""
    xfail_spills(_check(64, "short", False, True, "bf16", 8), SPILL_BOUND,
                 "softmax at 88 registers (OptimizePartitionWarps)")


def test_config_table():
    assert set(fb.CONFIGS) == {(d, b, c) for d in (64, 128) for b in ("short", "long")
                               for c in (False, True)}
    for (d, bucket, causal), cfg in fb.CONFIGS.items():
        assert cfg.mask_first == (not causal)
        assert cfg.block_n == (128 if bucket == "long" else 64)
        assert 2 * (cfg.block_n + d) <= 512                       # TMEM columns
        smem = 2 * (cfg.num_buffers_q * fb.BLOCK_M.value * d + cfg.num_buffers_kv * cfg.block_n * d)
        assert smem <= SMEM_LIMIT[100] - 1024, (d, bucket, causal, smem)
        assert cfg.num_buffers_kv >= 4                             # K/V two steps ahead
        fb.kernel_args(cfg, d, causal, False)                      # valid
    with pytest.raises(ValueError, match="p_slices=3"):
        from dataclasses import replace
        fb.kernel_args(replace(fb.CONFIGS[(128, "long", False)], p_slices=3), 128, False, False)


def _walk(n_tiles, n_progs, dynamic, rng):
    """The persistent hand-out: program p takes p first, then p + P, ... (static) or the
    counter's next value past the first round, in whatever order the programs ask."""
    got = {p: [] for p in range(n_progs)}
    nxt = {p: p for p in range(n_progs)}
    counter = 0
    live = list(range(n_progs))
    while live:
        p = rng.choice(live)
        t = nxt[p]
        if t >= n_tiles:
            live.remove(p)
            continue
        got[p].append(t)
        if dynamic:
            nxt[p] = n_progs + counter
            counter += 1
        else:
            nxt[p] = t + n_progs
    return got


@pytest.mark.parametrize("dynamic", [False, True])
def test_hand_out_covers_list(dynamic):
    """Every tile of the list x heads once, each program's tiles in list order (longest
    first), the grid one program per SM at most and at least one."""
    rng = random.Random(0)
    for n_tiles in (1, 5, 131, 1000):
        for sms in (1, 7, 148):
            P = fb.grid_size(sms, n_tiles)
            assert 1 <= P <= min(sms, n_tiles)
            got = _walk(n_tiles, P, dynamic, rng)
            flat = sorted(t for ts in got.values() for t in ts)
            assert flat == list(range(n_tiles))
            assert all(ts == sorted(ts) for ts in got.values())
    assert fb.grid_size(148, 0) == 1


def test_tile_list_is_the_core_list():
    """The kernel walks the core's forward list built at BLOCK_M = 256 (two 128-row groups):
    the same pairs and count as jagged.tiles' torch reference, longest first."""
    from jagged.tiles import longest_first_tiles
    from kernels_tlx.schedule import build_tiles
    g = torch.Generator().manual_seed(1)
    for causal in (False, True):
        lq = torch.randint(0, 700, (6,), generator=g)
        lk = torch.randint(0, 900, (6,), generator=g)
        cu_q, cu_k = offsets(lq), offsets(lk)
        bm, bn = fb.BLOCK_M.value, 128
        pairs, count, nblk = build_tiles(cu_q, cu_k, 6, int(lq.max()), None, bm, bn, causal)
        ref_pairs, ref_count, ref_nblk = longest_first_tiles(cu_q, cu_k, 6, int(lq.max()), None,
                                                             bm, bn, causal)
        assert nblk == ref_nblk == max(1, math.ceil(int(lq.max()) / bm))
        assert int(count) == int(ref_count)
        n = int(count)
        assert ((pairs[:n] & 0xFFFFFFFF).to(torch.int32) == ref_pairs[:n]).all()


# ----------------------------------------------------------------------------- B200
@b200_matrix
@pytest.mark.parametrize("kv_heads", [4, 1])
@pytest.mark.parametrize("max_len", [100, 1000])
def test_b200_oracle(mode, causal, head_dim, dtype, kv_heads, max_len):
    """The forward (out and lse) against the oracle on a B200, every mode: self, cross,
    broadcast-Q, causal, GQA / MQA, D 64 / 128, bf16 / fp16, short and long sequences
    (zero-length and length-1 ones planted)."""
    skip_unless_b200()
    check_on_b200(problem(mode, causal, head_dim, dtype, kv_heads, max_len),
                  forward_fn(fb.forward), backward=False)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_b200_packed(causal, head_dim):
    """Broadcast-Q with a short L_q under GQA (L_q 16, H 32 / H_kv 4: 8 heads a tile's
    rows, jagged.tiles.gqa_pack) against the oracle on a B200."""
    from jagged.tiles import gqa_pack
    skip_unless_b200()
    assert gqa_pack(True, 16, 8, fb.BLOCK_M.value) == 8
    check_on_b200(problem("broadcast_q", causal, head_dim, "bf16", 4, 16, heads=32),
                  forward_fn(fb.forward), backward=False)


@interp
def test_host_launches_a_packing_build(monkeypatch):
    """forward() (the tile list in the interpreter, the launch recorded): a broadcast-Q
    GQA call with a short L_q, causal or not, launches PACK = G on the packed q (its
    descriptor over L_q * G rows of H_kv heads), L_q * G query rows, H_kv heads of group
    1 and the list over L_q * G rows; O and lse keep the caller's shapes."""
    from jagged.tiles import fwd_tiles, pack_heads
    calls = []

    class Rec:
        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, args, kw))

    monkeypatch.setattr(fb, "fast", lambda fn: Rec())
    monkeypatch.setattr(fb, "num_sms", lambda dev: 8)  # past one wave: the list (one
    # wave runs without: test_fwd_direct_blackwell.py)
    D = 64
    q, k, cu, B, L_q, G, Hkv = packing_call(D)
    H = q.shape[1]
    for causal in (False, True):
        calls.clear()
        out, lse = fb.forward(q, k, k, None, cu, L_q, 100, causal, 0.125, True)
        (grid, args, kw), = calls
        cfg = fb.pick_config(D, 100, causal, 100.0)
        pairs, count, nblk = fwd_tiles(None, cu, B, L_q * G, L_q * G, fb.BLOCK_M.value,
                                       cfg.block_n, causal)
        assert kw["PACK"] == G and kw == fb.kernel_args(cfg, D, causal, True, G) | {
            "num_warps": 4, "num_stages": 1, "launch_pdl": True}
        assert torch.equal(args[0].base, pack_heads(q, G))
        assert list(args[0].shape) == [L_q * G, Hkv * D]
        assert torch.equal(args[7], pairs) and torch.equal(args[8], count)
        assert args[10:15] == (L_q * G, Hkv, 1, nblk, B * L_q)
        assert grid == (min(8, B * nblk * Hkv),)
        assert out.shape == (B * L_q, H, D) and lse.shape == (H, B * L_q)


# ----------------------------------------------------------------------------- protocol
def _protocol(n_ends, NQ, NKV, PS, dynamic, rng):
    """fwd_blackwell's roles as generators of ("wait", bar, parity), ("arrive", bar) and
    buffer events, transcribed from the kernel (a tcgen05 commit arrives at issue: the
    tensor core waits on nothing). A random interleaving; returns "ok" or the failure:
    a deadlock, a wait passing at another offset from its barrier's completions than
    before (a phase overrun), or a buffer read before its write / overwritten before
    its read (S_g, P_g parts, alpha_g, l and m)."""
    G = fb.GROUPS.value
    B = {}

    def bar(name, count=1):
        B.setdefault(name, Bar(count))
        return name

    for i in range(NQ * G):
        bar(f"q_full{i}"), bar(f"q_empty{i}")
    for i in range(NKV):
        bar(f"kv_full{i}"), bar(f"kv_empty{i}")
    for g in range(G):
        for n in ("s_full", "alpha_full", "o_ready", "o_full", "stats_full", "s_free"):
            bar(f"{n}{g}")
        for i in range(PS):
            bar(f"p_full{g * PS + i}")
    for s in range(2):
        bar(f"tile_full{s}"), bar(f"tile_empty{s}", fb.READERS.value)
    W = lambda name, ph: ("wait", name, ph)  # noqa: E731
    A = lambda name: ("arrive", name)  # noqa: E731
    total, slots = len(n_ends), {}

    tiles_of = partial(handoff_tiles, slots, total, dynamic)

    def load():
        tw = kv = 0
        for t in range(total + 1):
            if dynamic:
                yield from publish_tile(slots, t)
            if t == total:
                return
            n = n_ends[t]
            if n == 0:
                continue
            qb, qph = tw % NQ, (tw // NQ) & 1
            for g in range(G):
                yield W(f"q_empty{qb * G + g}", qph ^ 1)
                yield A(f"q_full{qb * G + g}")
            for c in range(kv, kv + 2 * n):
                yield W(f"kv_empty{c % NKV}", ((c // NKV) & 1) ^ 1)
                yield A(f"kv_full{c % NKV}")
            kv += 2 * n
            tw += 1

    def pv(g, step, vb, release):
        ph = step & 1
        yield W(f"o_ready{g}", ph)
        for i in range(PS):
            yield W(f"p_full{g * PS + i}", ph)
            yield ("pv", g, step, i)
        if release:
            yield A(f"kv_empty{vb}")

    def mma():
        tw = kv = step = 0
        for ev in tiles_of():
            if ev[0] != "tile":
                yield ev
                continue
            n = n_ends[ev[1]]
            if n == 0:
                continue
            qb, qph = tw % NQ, (tw // NQ) & 1
            kb = kv % NKV
            yield W(f"kv_full{kb}", (kv // NKV) & 1)
            for g in range(G):
                yield W(f"q_full{qb * G + g}", qph)
                yield W(f"s_free{g}", (tw & 1) ^ 1)
                yield ("qk", g, step)
                yield A(f"s_full{g}")
                if g == G - 1:
                    yield A(f"kv_empty{kb}")
            vb = (kv + 1) % NKV
            yield W(f"kv_full{vb}", ((kv + 1) // NKV) & 1)
            yield from pv(0, step, vb, False)
            for j in range(1, n):
                v_prev, c = vb, kv + 2 * j
                kb, vb = c % NKV, (c + 1) % NKV
                yield W(f"kv_full{kb}", (c // NKV) & 1)
                yield ("qk", 0, step + j)
                yield A("s_full0")
                yield from pv(1, step + j - 1, v_prev, True)
                yield ("qk", 1, step + j)
                yield A("s_full1")
                yield A(f"kv_empty{kb}")
                yield W(f"kv_full{vb}", ((c + 1) // NKV) & 1)
                yield from pv(0, step + j, vb, False)
            for g in range(G):
                yield A(f"q_empty{qb * G + g}")
            yield A("o_full0")
            yield from pv(1, step + n - 1, vb, True)
            yield A("o_full1")
            kv, step, tw = kv + 2 * n, step + n, tw + 1

    def softmax(g):
        step = 0
        for ev in tiles_of():
            if ev[0] != "tile":
                yield ev
                continue
            for _ in range(n_ends[ev[1]]):
                yield W(f"s_full{g}", step & 1)
                yield ("read_s", g, step)          # the max pass
                yield ("write_alpha", g, step)
                yield A(f"alpha_full{g}")
                for i in range(PS):
                    yield ("read_s", g, step)      # the exp2 pass, part i
                    yield ("write_p", g, step, i)
                    yield A(f"p_full{g * PS + i}")
                step += 1
            if n_ends[ev[1]]:
                yield ("write_stats", g)
                yield A(f"stats_full{g}")

    def correction():
        tw = step = 0
        for ev in tiles_of():
            if ev[0] != "tile":
                yield ev
                continue
            n = n_ends[ev[1]]
            if n == 0:
                continue
            for j in range(n):
                for g in range(G):
                    yield W(f"alpha_full{g}", (step + j) & 1)
                    yield ("read_alpha", g, step + j)  # the rescale (none at j = 0)
                    yield A(f"o_ready{g}")
            for g in range(G):
                yield W(f"stats_full{g}", tw & 1)
                yield ("read_stats", g)
                yield A(f"s_free{g}")
                yield W(f"o_full{g}", tw & 1)
            step, tw = step + n, tw + 1

    roles = {"load": load(), "mma": mma(), "sm0": softmax(0), "sm1": softmax(1),
             "correction": correction()}
    cur, done, offs, passes = dict.fromkeys(roles), set(), {}, {}
    s_ver, s_read, alpha_w, p_w, stats = {}, {}, {}, {}, {}
    while len(done) < len(roles):
        ready = []
        for r, gen in roles.items():
            if r in done:
                continue
            if cur[r] is None:
                try:
                    cur[r] = next(gen)
                except StopIteration:
                    done.add(r)
                    continue
            ev = cur[r]
            if ev[0] != "wait" or (B[ev[1]].done & 1) != ev[2]:
                ready.append(r)
        if len(done) == len(roles):
            return "ok"
        if not ready:
            return f"deadlock: {[(r, cur[r]) for r in roles if r not in done]}"
        r = rng.choice(ready)
        ev, cur[r] = cur[r], None
        kind = ev[0]
        if kind == "wait":
            key = (r, ev[1])
            off = B[ev[1]].done - passes.get(key, 0)
            if offs.setdefault(key, off) != off:
                return f"phase overrun: {key}"
            passes[key] = passes.get(key, 0) + 1
        elif kind == "arrive":
            B[ev[1]].arrive()
        elif kind == "qk":       # S_g(step) overwrites S_g, P_g (its lower half)
            g, st = ev[1], ev[2]
            if st and (s_read.get(g) != st - 1 or any(p_w.get((g, i)) != ("read", st - 1)
                                                      for i in range(PS))):
                return f"S_{g} overwritten before step {st - 1} was read: {ev}"
            s_ver[g] = st
        elif kind == "read_s":
            if s_ver.get(ev[1]) != ev[2]:
                return f"S read before it was written: {ev}"
            s_read[ev[1]] = ev[2]
        elif kind == "write_alpha":
            if alpha_w.get(ev[1], (None, "read"))[1] != "read":
                return f"alpha overwritten before it was read: {ev}"
            alpha_w[ev[1]] = (ev[2], "written")
        elif kind == "read_alpha":
            if alpha_w.get(ev[1]) != (ev[2], "written"):
                return f"alpha read before it was written: {ev}"
            alpha_w[ev[1]] = (ev[2], "read")
        elif kind == "write_stats":
            if stats.get(ev[1], "read") != "read":
                return f"l, m overwritten before they were read: {ev}"
            stats[ev[1]] = "written"
        elif kind == "read_stats":
            if stats.get(ev[1]) != "written":
                return f"l, m read before they were written: {ev}"
            stats[ev[1]] = "read"
        elif kind == "write_p":
            p_w[(ev[1], ev[3])] = ("written", ev[2])
        elif kind == "pv":
            if p_w.get((ev[1], ev[3])) != ("written", ev[2]):
                return f"P read before it was written: {ev}"
            p_w[(ev[1], ev[3])] = ("read", ev[2])
    return "ok"


def test_barrier_protocol_model():
    """No deadlock, no phase overrun, no buffer hazard over random jagged tile lists
    (tiles with no keys, one block, several), Q / K-V ring depths, P parts and both
    hand-outs, under random interleavings of the five tasks."""
    rng = random.Random(0)
    for _ in range(400):
        n_ends = [rng.choice([0, 0, 1, 1, 2, 3, 5]) for _ in range(rng.randint(0, 6))]
        args = (n_ends, rng.choice([1, 2]), rng.choice([2, 3, 4, 5, 6]), rng.choice([1, 2]),
                rng.random() < 0.5)
        res = _protocol(*args, rng)
        assert res == "ok", (args, res)
