"""The TLX Blackwell forward (kernels_tlx/fwd_blackwell.py), compiled for sm_100a on the CPU
(no B200 here: it has not run).

Default run: one variant (D = 128, long, non-causal, bf16), the config table, the host
checks and the tile hand-out. JAGGED_COMPILE_MATRIX=1 compiles every default variant
(~20-40 s each on 2 cores). `-m gpu` on a B200 runs it against the oracle.

Each compile must show: tcgen05.mma and tcgen05.alloc in the PTX, every alloc matched by
a dealloc and the allocation permit relinquished, TMEM within 512 columns (metadata
tmem_size), shared memory within the limit, one program per SM at most. Spills: Triton's
OptimizePartitionWarps pass (sm_100 only) replaces the softmax tasks' requested registers
by its own estimate (88), so the softmax spills a little; recorded as xfail, bounded.
"""
import functools
import math
import os
import random
import re

import pytest
import torch

pytest.importorskip("triton")

from harness.compile_check import SMEM_LIMIT, compile_kernel  # noqa: E402
from kernels_tlx import fwd_blackwell as fb  # noqa: E402

MATRIX = os.environ.get("JAGGED_COMPILE_MATRIX") == "1"

# (head_dim, bucket, causal, broadcast_q, dtype): every config of fb.CONFIGS, broadcast-Q
# and fp16 on some (GQA is a runtime argument: no build of its own)
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
]
SPILL_BOUND = 400  # spill instructions (LDL + STL) seen at most: 61..185 at the defaults


@functools.lru_cache(maxsize=None)
def compile_fwd(d, bucket, causal, bq, dt):
    cfg = fb.CONFIGS[(d, bucket, causal)]
    name = f"bw fwd D{d} {bucket} {'causal' if causal else 'full'}{' bq' if bq else ''} {dt}"
    return compile_kernel(fb.fwd_kernel, fb.signature(cfg, d, dt),
                          fb.kernel_args(cfg, d, causal, bq), arch=100, num_warps=4,
                          num_stages=1, name=name)


def _tmem_cols(rep):
    m = re.findall(r"tcgen05\.alloc\.cta_group::1\.sync\.aligned\.shared::cta\.b32\s+\[[^\]]+\],\s*(\d+);",
                   rep.ptx)
    return [int(x) for x in m]


def _check(d, bucket, causal, bq, dt):
    rep = compile_fwd(d, bucket, causal, bq, dt)
    print(rep.row())
    cfg = fb.CONFIGS[(d, bucket, causal)]
    assert rep.mma == "tcgen05" and rep.has_mma, rep.row()
    ptx = rep.ptx
    cols = _tmem_cols(rep)
    assert cols and all(c <= 512 for c in cols), cols
    assert 2 * (cfg.block_n + d) <= max(cols)
    n_alloc = len(re.findall(r"tcgen05\.alloc\.", ptx))
    assert n_alloc >= 1 and len(re.findall(r"tcgen05\.dealloc\.", ptx)) >= n_alloc, \
        "a TMEM allocation is never freed"
    assert "tcgen05.relinquish_alloc_permit" in ptx
    assert rep.total_smem <= SMEM_LIMIT[100], rep.row()
    # P V reads P from TMEM (the A operand's kind) and S / O are TMEM accumulators
    assert re.search(r"tcgen05\.mma\.cta_group::1\.kind::f16\s+\[[^\]]+\],\s*\[", ptx), \
        "no MMA with its A operand in TMEM"
    return rep


@pytest.mark.parametrize("v", VARIANTS[:1] if not MATRIX else VARIANTS,
                         ids=lambda v: "-".join(map(str, v)))
def test_compiles_sm100(v):
    rep = _check(*v)
    if rep.spills:
        assert rep.spill_insts <= SPILL_BOUND, rep.row()
        pytest.xfail(f"softmax at 88 registers (OptimizePartitionWarps): {rep.row()}")


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
        cu_q = torch.cat([torch.zeros(1, dtype=torch.int64), lq.cumsum(0)]).to(torch.int32)
        cu_k = torch.cat([torch.zeros(1, dtype=torch.int64), lk.cumsum(0)]).to(torch.int32)
        bm, bn = fb.BLOCK_M.value, 128
        pairs, count, nblk = build_tiles(cu_q, cu_k, 6, int(lq.max()), None, bm, bn, causal)
        ref_pairs, ref_count, ref_nblk = longest_first_tiles(cu_q, cu_k, 6, int(lq.max()), None,
                                                             bm, bn, causal)
        assert nblk == ref_nblk == max(1, math.ceil(int(lq.max()) / bm))
        assert int(count) == int(ref_count)
        n = int(count)
        assert ((pairs[:n] & 0xFFFFFFFF).to(torch.int32) == ref_pairs[:n]).all()


# ----------------------------------------------------------------------------- B200
def _blackwell():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["self", "cross", "broadcast_q"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("kv_heads", [4, 1])
@pytest.mark.parametrize("max_len", [100, 1000])
def test_b200_oracle(mode, causal, head_dim, dtype, kv_heads, max_len):
    """The forward (out and lse) against the oracle on a B200, every mode: self, cross,
    broadcast-Q, causal, GQA / MQA, D 64 / 128, bf16 / fp16, short and long sequences
    (zero-length and length-1 ones planted)."""
    if not _blackwell():
        pytest.skip("needs a B200 (compute capability 10.x)")
    from harness.oracle import check
    from harness.problems import Problem
    p = Problem(batch=7, heads=4, kv_heads=kv_heads, head_dim=head_dim, max_seqlen_q=max_len,
                max_seqlen_k=None if mode == "self" else max_len + 37, sparsity=0.6,
                mode=mode, causal=causal, dtype=dtype, seed=head_dim + max_len)
    lq, lk = (t.clone() for t in p.lengths())
    lk[1] = 0
    lk[2] = 1
    if mode != "broadcast_q":
        lq[2] = 1
        lq[3] = 0
    if mode == "self":
        lk = lq.clone()
    inp = p.build("cuda", lengths=(lq, lk))

    def fn(q, k, v, cu_q, cu_k, max_q, max_k, causal, softmax_scale, broadcast_q):
        scale = softmax_scale or q.shape[-1] ** -0.5
        return fb.forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q)

    rep = check(inp, fn, causal=causal, broadcast_q=mode == "broadcast_q", backward=False)
    assert rep.ok, f"{p.label()} lengths={(lq.tolist(), lk.tolist())}\n{rep}"
