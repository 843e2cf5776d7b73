"""kernels_tlx.bwd_hopper.backward against the oracle under the Triton interpreter (CPU),
for every tile config in bwd_hopper.CONFIGS.

fp16 only: Triton 3.8's interpreter keeps bf16 as raw uint16 and its tl.dot multiplies
those integers, so bf16 results are meaningless there (see kernels_tlx/portable.py).
The interpreter has no TMA reduce, so dQ goes through the pointer-atomic path
(TMA_REDUCE=False); TMA loads, the jagged schedule, masking, GQA, the broadcast-Q
slots and the dq_t form of the dQ partial are all exercised. out/lse come from the
fp64 oracle. Shapes are small but cross the tile sizes (several KV tiles and Q blocks
per sequence, zero-length and length-1 sequences, rows that see no key).
"""
import math
import os

import pytest
import torch

from harness.oracle import compare, reference
from harness.problems import Problem

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU interpreter test (TRITON_INTERPRET=1)")

from kernels_tlx import bwd_hopper as bw  # noqa: E402

P = dict(dtype="fp16")
# (id, problem, (len_q, len_k)); fp16 throughout
CASES = [
    ("self-d64-empty-len1", Problem(batch=5, heads=2, head_dim=64, max_seqlen_q=150, seed=1, **P),
     ([150, 0, 1, 37, 64],) * 2),
    ("self-d128-gqa-causal", Problem(batch=4, heads=4, kv_heads=2, head_dim=128, max_seqlen_q=140,
                                     causal=True, seed=2, **P), ([140, 1, 0, 65],) * 2),
    ("cross-d128-causal-lq>lk", Problem(batch=4, heads=2, head_dim=128, max_seqlen_q=150,
                                        max_seqlen_k=140, mode="cross", causal=True, seed=3, **P),
     ([150, 5, 0, 70], [20, 140, 3, 0])),
    ("cross-d64-mqa-lq<lk", Problem(batch=3, heads=4, kv_heads=1, head_dim=64, max_seqlen_q=40,
                                    max_seqlen_k=200, mode="cross", seed=4, **P),
     ([7, 40, 1], [200, 65, 0])),
    ("bcast-d128-gqa-causal", Problem(batch=4, heads=4, kv_heads=2, head_dim=128, max_seqlen_q=33,
                                      max_seqlen_k=200, mode="broadcast_q", causal=True, seed=5, **P),
     ([33] * 4, [0, 1, 200, 17])),
    ("bcast-d64-lq1", Problem(batch=3, heads=2, head_dim=64, max_seqlen_q=1, max_seqlen_k=130,
                              mode="broadcast_q", seed=6, **P), ([1] * 3, [130, 1, 0])),
    ("self-d128-all-empty", Problem(batch=2, heads=2, head_dim=128, max_seqlen_q=8, seed=7, **P),
     ([0, 0],) * 2),
    # no query anywhere, keys present (the GPU matrix's illegal address, session 6)
    ("cross-d64-mqa-no-queries", Problem(batch=2, heads=6, kv_heads=1, head_dim=64, max_seqlen_q=8,
                                         max_seqlen_k=130, mode="cross", seed=8, **P),
     ([0, 0], [100, 30])),
]


def run_backward(p: Problem, lengths, config, with_dlse=False):
    inp = p.build("cpu", lengths=lengths)
    bq = p.mode == "broadcast_q"
    dlse = None
    if with_dlse:  # a gradient on lse too (jagged.api)
        dlse = torch.randn(p.heads, inp.dout.shape[0], generator=torch.Generator().manual_seed(1))
    kw = dict(causal=p.causal, broadcast_q=bq, dlse=dlse)
    ref = reference(inp, **kw)
    lowp = reference(inp, compute_dtype=inp.q.dtype, **kw)
    out = ref["out"].to(inp.q.dtype)
    lse = ref["lse"].float().contiguous()
    grads = bw.backward(inp.dout, inp.q, inp.k, inp.v, out, lse, inp.cu_seqlens_q,
                        inp.cu_seqlens_k, inp.max_seqlen_q, inp.max_seqlen_k, p.causal,
                        1.0 / math.sqrt(p.head_dim), bq, config=config, dlse=dlse)
    return [compare(n, g, ref[n], lowp[n], inp.q.dtype)
            for n, g in zip(("dq", "dk", "dv"), grads)]


@pytest.mark.parametrize("config", sorted(bw.CONFIGS))
@pytest.mark.parametrize("p, lengths", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_against_oracle(p, lengths, config):
    checks = run_backward(p, lengths, config)
    assert all(c.ok for c in checks), f"{config} {p.label()} {lengths}\n" + "\n".join(map(str, checks))


@pytest.mark.parametrize("p, lengths", [c[1:] for c in CASES[:5]], ids=[c[0] for c in CASES[:5]])
def test_gradient_through_lse(p, lengths):
    """dq/dk/dv with a gradient on lse as well as on out."""
    checks = run_backward(p, lengths, None, with_dlse=True)
    assert all(c.ok for c in checks), f"{p.label()} {lengths}\n" + "\n".join(map(str, checks))


def test_default_config_path():
    """config=None: the picked default runs (short and long buckets)."""
    p = Problem(batch=2, heads=2, head_dim=128, max_seqlen_q=60, causal=True, seed=8, **P)
    checks = run_backward(p, ([60, 9],) * 2, None)
    assert all(c.ok for c in checks), "\n".join(map(str, checks))


def test_pick_config(monkeypatch):
    monkeypatch.delenv("JAGGED_BWD_CONFIG", raising=False)
    assert bw.pick_config(128, 64) == bw.DEFAULTS[(128, "short")]
    assert bw.pick_config(128, 65) == bw.DEFAULTS[(128, "long")]
    assert bw.pick_config(64, 8192, True, False) == bw.DEFAULTS[(64, "long")]
    assert bw.pick_config(128, 256, mean_k=26.5) == bw.DEFAULTS[(128, "short")]
    assert bw.pick_config(128, 512, mean_k=52.0) == bw.DEFAULTS[(128, "long")]
    monkeypatch.setenv("JAGGED_BWD_CONFIG", "base")
    assert bw.pick_config(128, 4096) == "base"
    monkeypatch.setenv("JAGGED_BWD_CONFIG", "nope")
    with pytest.raises(ValueError):
        bw.pick_config(128, 4096)
    with pytest.raises(ValueError):
        bw.get_config("nope")
    assert bw.get_config(bw.CONFIGS["m64n64"]) is bw.CONFIGS["m64n64"]
