"""Device matrix (`pytest -m gpu`): every implementation against the oracle on 200
fresh random problems across all modes (self, cross, broadcast_q, causal, GQA/MQA,
D 64/128, bf16/fp16, zero-length and length-1 sequences, sequences long enough for the
CuteDSL backward's 80-row step, and a few B = 1152); a third of them also put a gradient
on the returned lse.

The draw is random per run (the seed is printed in each test id's failure message)
so the kernels face new inputs every time; set JAGGED_MATRIX_SEED to replay one.
JAGGED_MATRIX_SHARD=i/n runs problems idx % n == i, so n processes with one seed share
the draw (the compiles run in parallel).
"""
import functools
import os
import random

import pytest
import torch

from harness.oracle import check
from harness.problems import Problem

N_PROBLEMS = int(os.environ.get("JAGGED_MATRIX_N", "200"))
SEED = int(os.environ.get("JAGGED_MATRIX_SEED", str(random.SystemRandom().randrange(1 << 30))))


def random_problem(rng: random.Random, i: int):
    mode = rng.choice(["self", "self", "cross", "broadcast_q"])
    heads = rng.choice([1, 2, 4, 6])
    kv = rng.choice([h for h in (1, 2, 3, 4, 6) if heads % h == 0])
    batch = 1152 if i % 50 == 0 else rng.randint(1, 9)
    short = batch == 1152
    # 700 dense and 1000 at sparsity 0.9 or dense: the CuteDSL backward's 80-row step
    max_q = rng.choice([1, 7, 64, 65, 128, 200] if short else
                       [1, 7, 63, 64, 129, 300, 700, 1000])
    max_k = max_q if mode == "self" else rng.choice([1, 17, 64, 128, 257, 600])
    p = Problem(batch=batch, heads=heads, kv_heads=kv, head_dim=rng.choice([64, 128]),
                max_seqlen_q=max_q, max_seqlen_k=None if mode == "self" else max_k,
                sparsity=rng.choice([0.1, 0.5, 0.9, 1.0]), mode=mode,
                causal=rng.random() < 0.4, dtype=rng.choice(["bf16", "fp16"]),
                seed=rng.randrange(1 << 30))
    lengths = None
    if i % 7 == 3 and batch < 16:  # plant zero-length and length-1 sequences
        lq, lk = (t.clone() for t in p.lengths())
        for b in range(batch):
            r = rng.random()
            if r < 0.3:
                lk[b] = 0
                lq[b] = lq[b] if mode == "broadcast_q" else rng.choice([0, lq[b]])
            elif r < 0.5:
                lk[b] = 1
                lq[b] = lq[b] if mode == "broadcast_q" else 1
        if mode == "self":
            lk = lq.clone()
        lengths = (lq, lk)
    return p, lengths


SHARD, N_SHARDS = map(int, os.environ.get("JAGGED_MATRIX_SHARD", "0/1").split("/"))
PROBLEMS = [random_problem(random.Random(SEED + i), i) for i in range(N_PROBLEMS)]


def implementations():
    def tlx():
        from kernels_tlx import available, jagged_attention
        return available(), jagged_attention

    def cute():
        from kernels_cute import available, jagged_attention
        return available(), jagged_attention

    def portable():
        from jagged.portable import jagged_attention
        return (True, ""), jagged_attention

    return {"tlx": tlx, "cute": cute, "triton": portable}


@pytest.mark.gpu
@pytest.mark.parametrize("impl", list(implementations()))
@pytest.mark.parametrize("idx", range(SHARD, N_PROBLEMS, N_SHARDS))
def test_matrix(impl, idx):
    (ok, why), fn = implementations()[impl]()
    if not ok:
        pytest.skip(f"{impl}: {why}")
    p, lengths = PROBLEMS[idx]
    inp = p.build("cuda", lengths=lengths)
    dlse = None
    if idx % 3 == 1:  # a third of the problems also put a gradient on lse
        dlse = torch.randn(p.heads, inp.dout.shape[0], device="cuda",
                           generator=torch.Generator("cuda").manual_seed(SEED + idx))
    what = f"{impl} {p.label()} lengths={lengths} JAGGED_MATRIX_SEED={SEED}"
    rep = _checked(what, inp, fn, causal=p.causal, broadcast_q=p.mode == "broadcast_q",
                   dlse=dlse)
    assert rep.ok, f"{what}\n{rep}"


def _checked(what, inp, fn, **kw):
    """The oracle's report on fn (with its lse); an exception in the call names the
    problem and the seed that replays it."""
    try:
        return check(inp, functools.partial(fn, return_lse=True), **kw)
    except Exception as e:
        raise AssertionError(f"{what}: {type(e).__name__}: {e}") from e


def window_problems():
    """Short queries that take the row windows of the forward (mean length <= 64):
    gem-like batches, empties and ones planted, causal, cross, GQA, both head dims."""
    rng = random.Random(SEED)
    out = []
    for i, (mode, causal, d, dt, kv) in enumerate([
            ("self", False, 128, "bf16", 4), ("self", True, 64, "bf16", 2),
            ("self", True, 128, "fp16", 1), ("cross", False, 64, "fp16", 4),
            ("cross", True, 128, "bf16", 2), ("self", False, 64, "bf16", 4)]):
        p = Problem(batch=rng.choice([300, 1152]), heads=4, kv_heads=kv, head_dim=d,
                    max_seqlen_q=rng.choice([64, 128, 256]),
                    max_seqlen_k=None if mode == "self" else rng.choice([40, 300]),
                    sparsity=0.1, mode=mode, causal=causal, dtype=dt,
                    seed=rng.randrange(1 << 30))
        lq, lk = (t.clone() for t in p.lengths())
        for b in rng.sample(range(p.batch), p.batch // 5):  # empty and length-1 sequences
            lq[b] = rng.choice([0, 1])
            lk[b] = rng.choice([0, 1, lk[b]]) if mode == "cross" else lq[b]
        if mode == "self":
            lk = lq.clone()
        out.append((p, (lq, lk)))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["tlx", "cute", "triton"])
@pytest.mark.parametrize("idx", range(6))
def test_windows(impl, idx):
    """The forwards over row windows (every style) against the oracle, forward and
    backward; each problem is checked to take the windows."""
    (ok, why), fn = implementations()[impl]()
    if not ok:
        pytest.skip(f"{impl}: {why}")
    p, lengths = window_problems()[idx]
    inp = p.build("cuda", lengths=lengths)
    n_rows, batch = inp.q.shape[0], inp.cu_seqlens_k.shape[0] - 1
    if impl == "triton":
        from jagged.tiles import windowed
        assert windowed(n_rows, batch, inp.max_seqlen_q, 128, False)
    else:
        import importlib
        fh = importlib.import_module(f"kernels_{impl}.fwd_hopper")
        assert fh.takes_windows(n_rows, inp.k.shape[0], batch, inp.max_seqlen_q, False)
    what = f"{impl} {p.label()} JAGGED_MATRIX_SEED={SEED}"
    rep = _checked(what, inp, fn, causal=p.causal)
    assert rep.ok, f"{what}\n{rep}"


def packed_problems():
    """Broadcast-Q with short L_q under GQA, where the forward packs a group's heads into
    a tile's rows (jagged.tiles.gqa_pack): groups 2 to 16, both head dims and buckets
    (192-row tiles at D = 64 long), causal (keys shorter and longer than L_q), fp16,
    empty and length-1 key sets, fp8."""
    rng = random.Random(SEED)
    out = []
    for heads, kv, d, lq, lk, dt, causal in [
            (32, 4, 64, 16, 128, "bf16", False), (8, 2, 128, 24, 700, "fp16", False),
            (16, 1, 128, 5, 300, "bf16", False), (8, 2, 64, 80, 2000, "bf16", False),
            (12, 3, 64, 7, 64, "bf16", False), (32, 4, 64, 16, 128, "fp8", False),
            (32, 4, 64, 16, 128, "bf16", True), (8, 2, 128, 40, 700, "fp16", True),
            (16, 1, 128, 60, 2000, "bf16", True), (32, 8, 64, 64, 1000, "fp8", True)]:
        p = Problem(batch=rng.choice([5, 37]), heads=heads, kv_heads=kv, head_dim=d,
                    max_seqlen_q=lq, max_seqlen_k=lk, sparsity=0.5, mode="broadcast_q",
                    dtype=dt, causal=causal, seed=rng.randrange(1 << 30))
        lq_t, lk_t = (t.clone() for t in p.lengths())
        lk_t[0], lk_t[1] = 0, 1
        out.append((p, (lq_t, lk_t)))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["tlx", "cute"])
@pytest.mark.parametrize("idx", range(10))
def test_broadcast_q_packed(impl, idx):
    """The forwards that pack GQA heads against the oracle: out, lse (with a gradient on
    it) and the backward through the packed forward's out and lse (fp8: forward only).
    Each problem is checked to pack for the config it gets."""
    from jagged.tiles import gqa_pack
    fn, fh = _hopper_style(impl)
    p, lengths = packed_problems()[idx]
    cfg = fh.pick_config(p.head_dim, p.max_k, p.causal, float(lengths[1].float().mean()))
    assert gqa_pack(True, p.max_seqlen_q, p.heads // p.kv_heads, cfg.block_m) > 1
    _check_with_lse(impl, fn, p, p.build("cuda", lengths=lengths), broadcast_q=True)


def _hopper_style(impl):
    """(the style's jagged_attention, its fwd_hopper module), or a skip saying why not."""
    import importlib
    (ok, why), fn = implementations()[impl]()
    if not ok:
        pytest.skip(f"{impl}: {why}")
    return fn, importlib.import_module(f"kernels_{impl}.fwd_hopper")


def _check_with_lse(impl, fn, p, inp, broadcast_q):
    """The oracle on out, lse with a gradient on it, and the backward (fp8: forward only)."""
    fp8 = p.dtype == "fp8"
    dlse = None if fp8 else torch.randn(p.heads, inp.dout.shape[0], device="cuda")
    what = f"{impl} {p.label()} JAGGED_MATRIX_SEED={SEED}"
    rep = _checked(what, inp, fn, causal=p.causal, broadcast_q=broadcast_q,
                   backward=not fp8, dlse=dlse)
    assert rep.ok, f"{what}\n{rep}"


def direct_problems():
    """Calls whose forward tiles fit one wave, so both Hopper styles run them without a
    tile list (jagged.tiles.fwd_direct): self, cross, broadcast-Q (packed too), causal,
    GQA, both head dims, fp16, query blocks past a short sequence's rows, and empty and
    length-1 sequences."""
    rng = random.Random(SEED)
    out = []
    for mode, b, heads, kv, d, lq, lk, sp, dt, causal in [
            ("self", 24, 2, 2, 128, 128, 128, 1.0, "fp16", False),
            ("cross", 2, 2, 2, 128, 4096, 512, 0.75, "bf16", True),
            ("self", 4, 4, 2, 64, 600, 600, 1.0, "bf16", True),
            ("cross", 5, 4, 4, 128, 300, 900, 0.5, "bf16", False),
            ("broadcast_q", 6, 8, 2, 128, 24, 700, 0.5, "fp16", False),
            ("broadcast_q", 4, 4, 4, 64, 200, 300, 0.5, "bf16", True)]:
        p = Problem(batch=b, heads=heads, kv_heads=kv, head_dim=d, max_seqlen_q=lq,
                    max_seqlen_k=lk, sparsity=sp, mode=mode, dtype=dt, causal=causal,
                    seed=rng.randrange(1 << 30))
        lq_t, lk_t = (t.clone() for t in p.lengths())
        if mode != "broadcast_q" and b > 2:
            lq_t[0], lk_t[0], lq_t[1], lk_t[1] = 0, 0, 1, 1
        out.append((p, (lq_t, lk_t)))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["tlx", "cute"])
@pytest.mark.parametrize("idx", range(6))
def test_direct(impl, idx):
    """The list-free forwards against the oracle: out, lse (with a gradient on it) and
    the backward through them. Each problem is checked to take that path."""
    from jagged.arch import num_sms
    from jagged.tiles import fwd_direct, packed_query, pairs_per_sequence
    fn, fh = _hopper_style(impl)
    p, lengths = direct_problems()[idx]
    bq = p.mode == "broadcast_q"
    inp = p.build("cuda", lengths=lengths)
    q, k = inp.q, inp.k
    assert not fh.takes_windows(q.shape[0], k.shape[0], p.batch, inp.max_seqlen_q, bq)
    cfg = fh.pick_config(p.head_dim, inp.max_seqlen_k, p.causal, k.shape[0] / p.batch)
    q_t, pack = packed_query(q, bq, p.kv_heads, cfg.block_m)
    rows = q_t.shape[0] if bq else inp.max_seqlen_q
    n_tiles = p.batch * pairs_per_sequence(rows, cfg.block_m) * q_t.shape[1]
    assert fwd_direct(n_tiles, num_sms(q.device)), n_tiles
    _check_with_lse(impl, fn, p, inp, broadcast_q=bq)
