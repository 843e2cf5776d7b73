"""The forward's tile counter on the GPU (`pytest -m gpu`): causal packed calls of more
than one wave take their tiles from a counter that lives with their cached tile list
(jagged.tiles.fwd_sched), which the kernel's last program zeroes again. So calls on the
same offsets tensors, one after another, with other heads, and on a second stream, each
match the oracle (outputs NaN-poisoned by harness.oracle.check); on Hopper the second
stream takes a list and counter of its own (the cache keys them by stream)."""
import dataclasses

import pytest
import torch

from harness.oracle import check
from harness.problems import Problem

# more tiles than SMs (a list, not the one-wave direct launch): B5 H8 1500 makes ~300
PROBLEMS = {
    "d128-gqa": Problem(batch=5, heads=8, kv_heads=2, head_dim=128, max_seqlen_q=1500,
                        sparsity=0.5, causal=True, seed=21),
    "d64": Problem(batch=7, heads=4, kv_heads=4, head_dim=64, max_seqlen_q=2048,
                   sparsity=0.75, causal=True, dtype="fp16", seed=22),
    # e4m3: CuteDSL's converting warps (fp8 V) fetch the counter's tiles too
    "fp8": Problem(batch=5, heads=8, kv_heads=2, head_dim=128, max_seqlen_q=1500,
                   sparsity=0.5, causal=True, dtype="fp8", seed=23),
}


def style_fn(style):
    from jagged.dispatch import style_available, style_fn
    ok, why = style_available(style)
    if not ok:
        pytest.skip(f"{style}: {why}")
    return style_fn(style)


def _other_heads(p: Problem, inp, heads: int, kv_heads: int):
    """Fresh inputs with other head counts on `inp`'s offsets tensors (the same list)."""
    other = dataclasses.replace(p, heads=heads, kv_heads=kv_heads, seed=p.seed + 1)
    new = other.build("cuda", lengths=(inp.lengths_q, inp.lengths_k))
    return other, dataclasses.replace(new, cu_seqlens_q=inp.cu_seqlens_q,
                                      cu_seqlens_k=inp.cu_seqlens_k)


@pytest.mark.gpu
@pytest.mark.parametrize("style", ["tlx", "cute"])
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_counter_calls_on_one_list(style, name):
    fn = style_fn(style)
    p = PROBLEMS[name]
    inp = p.build("cuda")
    for i in range(3):  # the same list each time: its counter zeroed by the call before
        rep = check(inp, fn, causal=True, backward=False)
        assert rep.ok, f"call {i}: {rep.summary()}"
    p2, inp2 = _other_heads(p, inp, 2 * p.heads, p.kv_heads)  # more tiles, same list
    rep = check(inp2, fn, causal=True, backward=False)
    assert rep.ok, f"{p2}: {rep.summary()}"
    default, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(default)
    with torch.cuda.stream(side):  # another stream: a list (and counter) of its own
        rep = check(inp, fn, causal=True, backward=False)
    default.wait_stream(side)
    assert rep.ok, f"second stream: {rep.summary()}"
    from jagged.dispatch import kernel_arch
    from jagged.tiles import _build_fwd_tiles, cached_builds, fwd_sched
    # the streams wait for each other, so the oracle passes even with one counter shared:
    # the cache (keyed by the stream where the counter is used) must hold a list per stream
    per_stream = {params[-1]: out
                  for params, out in cached_builds(_build_fwd_tiles, inp.cu_seqlens_k)}
    assert per_stream
    if kernel_arch() == "hopper":  # these calls take their tiles from the counter
        assert {default.cuda_stream, side.cuda_stream} <= per_stream.keys(), list(per_stream)
        ours, theirs = per_stream[default.cuda_stream], per_stream[side.cuda_stream]
        assert ours[0].data_ptr() != theirs[0].data_ptr(), "one tile list for two streams"
        assert fwd_sched(ours[1]).data_ptr() != fwd_sched(theirs[1]).data_ptr(), \
            "one counter for two streams"
    torch.cuda.synchronize()
    lists = [out for _, out in cached_builds()  # forward lists: nblk an int
             if isinstance(out, tuple) and len(out) == 3 and isinstance(out[2], int)]
    assert lists
    for _, count, _ in lists:  # zeroed again by each launch's last program
        assert fwd_sched(count)[:2].tolist() == [0, 0]
