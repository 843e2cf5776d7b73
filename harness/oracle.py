"""The correctness oracle shared by every implementation and baseline.

Reference forward (out, lse) and backward (dq, dk, dv) in fp32 on a GPU (fp64 on the
CPU), per sequence, for every mode. A result passes when its max error against that
reference is at most 2x the error of PyTorch computing the same thing in the input
dtype, plus a small floor (the FlashAttention test rule).

fp8 inputs (forward only): the reference computes on the dequantized values (e4m3
times its descale, formed in fp32 / fp64) and the allowance is PyTorch's error
computing in bf16 on them; out must be bf16.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import sys
import traceback
from dataclasses import dataclass, field

import torch

from .problems import Inputs, offsets


def _attend(q, k, v, causal: bool, scale: float):
    """One sequence. q [Lq,H,D], k/v [Lk,Hkv,D] -> out [Lq,H,D], lse [H,Lq] (fp32).

    Scores and softmax statistics in fp32 at least, P cast to the value dtype before
    PV (what a low-precision kernel does); rows with no key give out 0, lse -inf."""
    Lq, H, _ = q.shape
    Lk, Hkv, _ = k.shape
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, k).to(torch.promote_types(q.dtype, torch.float32)) * scale
    if causal:
        i = torch.arange(Lq, device=q.device)[:, None]
        j = torch.arange(Lk, device=q.device)[None, :]
        s = s.masked_fill(j > i + Lk - Lq, float("-inf"))
    empty = (s == float("-inf")).all(dim=-1)  # rows that see no key: lse -inf, no gradient
    lse = torch.logsumexp(s.masked_fill(empty[..., None], 0.0), dim=-1).masked_fill(empty, float("-inf"))
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # empty rows: exp(-inf - -inf)
    out = torch.einsum("hqk,khd->qhd", p.to(v.dtype), v)
    return out, lse.float()


# Query heads are taken in chunks whose score tensor [heads, L_q, L_k] stays under this
# many bytes (whole KV-head groups while one fits, else slices of one group): the
# reference's autograd keeps several score-sized tensors alive at once, and a long
# sequence with many heads does not fit otherwise. One head is the least a chunk holds.
SCORE_BYTES = 2 << 30


def _head_chunks(H: int, Hkv: int, per_head: int, budget: int):
    """(h0, h1, g0, g1): query heads [h0, h1) read KV heads [g0, g1)."""
    G = H // Hkv
    n = max(1, budget // max(per_head, 1))  # heads a chunk may hold
    if n >= G:
        step = n // G
        return [(g * G, min(g + step, Hkv) * G, g, min(g + step, Hkv))
                for g in range(0, Hkv, step)]
    return [(h, min(h + n, (g + 1) * G), g, g + 1)
            for g in range(Hkv) for h in range(g * G, (g + 1) * G, n)]


def reference(inp: Inputs, *, causal=False, softmax_scale=None, broadcast_q=False,
              compute_dtype=None, backward=True, dlse=None,
              score_bytes=None) -> dict[str, torch.Tensor]:
    """out [Nq,H,D], lse [H,Nq] and, with `backward`, dq/dk/dv (dq summed over the batch
    in broadcast_q mode) for the upstream gradient inp.dout on out and `dlse` ([H,Nq],
    None: 0) on lse. `compute_dtype` None means the high-precision reference.

    Per sequence and per chunk of query heads (`score_bytes`, None: SCORE_BYTES), the
    forward and, with `backward`, its gradient at once: no graph outlives its chunk.
    dk / dv of a KV head split over several chunks are sums of the chunks' parts."""
    hi = torch.float64 if inp.q.device.type == "cpu" else torch.float32
    dt = compute_dtype or hi
    budget = SCORE_BYTES if score_bytes is None else score_bytes
    D = inp.q.shape[-1]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    q, k, v = (t.detach().to(dt) for t in (inp.q, inp.k, inp.v))
    H, Hkv = q.shape[1], k.shape[1]
    acc_dt = torch.promote_types(dt, torch.float32)
    itemsize = acc_dt.itemsize
    lq, lk = inp.lengths_q.tolist(), inp.lengths_k.tolist()
    rows = [len(q) if broadcast_q else n for n in lq]
    starts_q = [0] * len(lk) if broadcast_q else [0, *itertools.accumulate(lq)][:-1]
    out = q.new_zeros(sum(rows), H, D)
    lse = q.new_zeros(H, sum(rows), dtype=torch.float32)
    res = {"out": out, "lse": lse}
    if backward:
        dout = inp.dout.detach().to(dt)
        dl = None if dlse is None else dlse.detach().to(torch.float32)
        # dk / dv in fp32 at least: a group split over chunks adds its parts rounded once
        dq = torch.zeros_like(q)
        dk, dv = (torch.zeros_like(t, dtype=acc_dt) for t in (k, v))
    starts_out, starts_k = ([0, *itertools.accumulate(x)][:-1] for x in (rows, lk))
    with torch.enable_grad():
        # last sequence first: broadcast_q's dq then adds the sequences' parts in the
        # order autograd adds a shared leaf's gradients
        for b in reversed(range(len(lk))):
            n, q0, r, k0 = rows[b], starts_q[b], starts_out[b], starts_k[b]
            for h0, h1, g0, g1 in _head_chunks(H, Hkv, n * lk[b] * itemsize, budget):
                qc = q[q0:q0 + n, h0:h1].detach().requires_grad_(backward)
                kc = k[k0:k0 + lk[b], g0:g1].detach().requires_grad_(backward)
                vc = v[k0:k0 + lk[b], g0:g1].detach().requires_grad_(backward)
                o, l = _attend(qc, kc, vc, causal, scale)
                out[r:r + n, h0:h1] = o.detach()
                lse[h0:h1, r:r + n] = l.detach()
                if backward:
                    outs, grads = (o,), (dout[r:r + n, h0:h1],)
                    if dl is not None:
                        outs, grads = (o, l), (grads[0], dl[h0:h1, r:r + n])
                    g = torch.autograd.grad(outs, (qc, kc, vc), grads, allow_unused=True)
                    for acc, x in zip((dq[q0:q0 + n, h0:h1], dk[k0:k0 + lk[b], g0:g1],
                                       dv[k0:k0 + lk[b], g0:g1]), g):
                        if x is not None:
                            acc += x
    if backward:
        res.update(dq=dq, dk=dk.to(dt), dv=dv.to(dt))
    return res


def dequantized(inp: Inputs) -> Inputs:
    """An fp8 problem's real values, fp64 on the CPU and fp32 on a GPU: each row of
    sequence b and KV head h times descale[b, h] (q: its KV head's). broadcast_q: q
    differs per sequence, so it comes expanded over the batch, as a cross attention
    with L_q rows a sequence (the same out and lse layout)."""
    hi = torch.float64 if inp.q.device.type == "cpu" else torch.float32
    dev, B = inp.q.device, len(inp.lengths_k)
    G = inp.q.shape[1] // inp.k.shape[1]
    lq = inp.lengths_q
    q = inp.q.to(hi)
    if inp.cu_seqlens_q is None:  # broadcast_q
        q = q.repeat(B, 1, 1)

    def real(x, descale, lens, group=1):
        seq = torch.repeat_interleave(torch.arange(B), lens).to(dev)
        return x * descale.to(hi).repeat_interleave(group, 1)[seq][..., None]

    return dataclasses.replace(
        inp, q=real(q, inp.q_descale, lq, G), k=real(inp.k.to(hi), inp.k_descale, inp.lengths_k),
        v=real(inp.v.to(hi), inp.v_descale, inp.lengths_k), cu_seqlens_q=offsets(lq).to(dev),
        q_descale=None, k_descale=None, v_descale=None)


@dataclass
class Check:
    name: str
    max_err: float      # max |got - ref|
    tol: float          # 2 * max |lowp - ref| + floor
    rel_l2: float       # ||got - ref|| / ||ref||
    worst: tuple        # index of the worst element
    ok: bool

    def __str__(self):
        mark = "ok " if self.ok else "BAD"
        return (f"{mark} {self.name:4s} max_err {self.max_err:.3e} (tol {self.tol:.3e}) "
                f"rel_l2 {self.rel_l2:.2e} worst at {self.worst}")


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def __str__(self):
        return "\n".join(str(c) for c in self.checks)

    def summary(self) -> str:
        bad = [c for c in self.checks if not c.ok]
        return "; ".join(str(c) for c in bad) if bad else "ok"


def _floor(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The rounding error of `dtype` at the reference's scale (FA's atol rule)."""
    r = ref.to(dtype)
    return 2.0 * float(((r + 0.3 - 0.3) - r).abs().max()) + 1e-5 if r.numel() else 1e-5


def compare(name, got, ref, lowp, dtype, extra: float = 0.0) -> Check:
    """max |got - ref| <= 2 max |lowp - ref| + floor + `extra` (an absolute allowance)."""
    got, ref, lowp = (t.detach().double().cpu() for t in (got, ref, lowp))
    if got.shape != ref.shape:
        return Check(name, math.inf, 0.0, math.inf, (f"shape {tuple(got.shape)} != {tuple(ref.shape)}",), False)
    both_inf = torch.isinf(ref) & (got == ref)  # e.g. lse = -inf on rows with no key
    err = (got - ref).abs().masked_fill(both_inf, 0.0).nan_to_num(math.inf)
    base = (lowp - ref).abs().masked_fill(torch.isinf(ref) & (lowp == ref), 0.0).nan_to_num(0.0)
    fin = torch.isfinite(ref)
    tol = 2.0 * float(base.max()) + _floor(ref[fin], dtype) + extra if ref.numel() else 1.0
    if not err.numel():
        return Check(name, 0.0, tol, 0.0, (), True)
    max_err = float(err.max())
    worst = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))
    diff = (got - ref).masked_fill(both_inf, 0.0)
    rel = float(diff.norm() / ref.masked_fill(~fin, 0.0).norm().clamp_min(1e-30))
    return Check(name, max_err, tol, rel, worst, bool(max_err <= tol))


def poison(*like: torch.Tensor, copies: int = 2) -> None:
    """Fill the allocator's free blocks of the outputs' sizes with NaN bytes, so an
    output the kernel allocates and then fails to write shows up as NaN."""
    if not like or like[0].device.type != "cuda":
        return
    blocks = [torch.empty(t.numel() * t.element_size(), dtype=torch.uint8, device=t.device)
              for t in like for _ in range(copies)]
    for b in blocks:
        b.fill_(0xFF)  # all-ones bytes are NaN in fp32, fp16 and bf16
    del blocks


def _stored_o_delta(inp: Inputs, out, ref, dlse, kw) -> dict[str, torch.Tensor]:
    """The reference gradients as a flash kernel forms them: delta = rowsum(dO * O) from
    the O it stored (rounded to the output dtype), not the exact O. That shifts each
    row's delta by rowsum(dO * (out - O_ref)), so dS = P (dP - delta) by -P times it:
    exactly what a gradient of minus the shift on lse does. Where P is nearly one-hot dS
    is small and this rounding is most of it (matrix seed 973477401, problem 129: a
    query that sees two keys, dq 17 % off by this alone, dv exact)."""
    r = ref["out"]
    shift = (inp.dout.to(r.dtype) * (out.detach().to(r.dtype) - r)).sum(-1).T.nan_to_num(0.0)
    return reference(inp, dlse=-shift if dlse is None else dlse.to(r.dtype) - shift, **kw)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def check(inp: Inputs, fn, *, causal=False, softmax_scale=None, broadcast_q=False,
          backward=True, ref=None, lowp=None, check_lse=True, dlse=None) -> Report:
    """Run `fn(q, k, v, cu_q, cu_k, max_q, max_k, causal=, softmax_scale=,
    broadcast_q=)` -> out or (out, lse) with autograd, and compare with the oracle.
    dlse: also a gradient on lse in the backward (fn must return lse).

    An exception (e.g. out of memory) propagates with the locals of the frames it
    unwound below this one cleared: held by a caller, it keeps none of the check's
    tensors or graphs alive (its traceback still names every line)."""
    outer = sys.exc_info()[1]
    try:
        return _check(inp, fn, causal=causal, softmax_scale=softmax_scale,
                      broadcast_q=broadcast_q, backward=backward, ref=ref, lowp=lowp,
                      check_lse=check_lse, dlse=dlse)
    except BaseException as e:
        _clear_frames(e, outer)
        raise


def _clear_frames(e: BaseException, outer: BaseException | None) -> None:
    """Clear the finished frames in the tracebacks of `e` and of the exceptions it
    chains (cause, context), short of `outer`: the one being handled when the check began."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop()
        if x is None or x is outer or id(x) in seen:
            continue
        seen.add(id(x))
        traceback.clear_frames(x.__traceback__)  # skips the frames still executing
        todo += [x.__cause__, x.__context__]


def _check(inp: Inputs, fn, *, causal, softmax_scale, broadcast_q, backward, ref, lowp,
           check_lse, dlse) -> Report:
    kw = dict(causal=causal, softmax_scale=softmax_scale, broadcast_q=broadcast_q)
    if inp.fp8:  # forward only, on the real values (dequantized, q expanded if shared)
        if backward or dlse is not None:
            raise ValueError("fp8 inputs are forward only: check with backward=False")
        real = dequantized(inp)
        ref = ref or reference(real, backward=False, causal=causal, softmax_scale=softmax_scale)
        lowp = lowp or reference(real, backward=False, compute_dtype=torch.bfloat16,
                                 causal=causal, softmax_scale=softmax_scale)
    else:
        ref = ref or reference(inp, backward=backward, dlse=dlse, **kw)
        lowp = lowp or reference(inp, backward=backward, compute_dtype=inp.q.dtype, dlse=dlse, **kw)
    q, k, v = (t.detach().clone().requires_grad_(backward) for t in (inp.q, inp.k, inp.v))
    poison(ref["out"].to(inp.out_dtype), ref["lse"])
    res = fn(q, k, v, inp.cu_seqlens_q, inp.cu_seqlens_k, inp.max_seqlen_q, inp.max_seqlen_k,
             **kw, **inp.descales())
    out, lse = res if isinstance(res, tuple) else (res, None)
    rep = Report([compare("out", out, ref["out"], lowp["out"], inp.out_dtype)])
    if out.dtype != inp.out_dtype:
        rep.checks.append(Check("dtype", math.inf, 0.0, math.inf,
                                (f"out {out.dtype}, expected {inp.out_dtype}",), False))
    if lse is not None and check_lse:
        rep.checks.append(compare("lse", lse, ref["lse"], lowp["lse"], torch.float32))
    if backward:
        poison(q, k, v)
        outs, grads = ((out, lse), (inp.dout, dlse)) if dlse is not None else (out, inp.dout)
        dq, dk, dv = torch.autograd.grad(outs, (q, k, v), grads)
        # dS = P * (dP - delta) cancels to exactly 0 where a row sees one key, and the
        # low-precision PyTorch reference gets that 0 exactly; a flash kernel forms dP
        # and delta = rowsum(dO * O) by different fp32 sums, so it is left with fp32
        # rounding noise at the scale of dP, whose size dV's entries share
        # (sums of dO rows): allow 2^-16 of that in dq and dk
        noise = 2.0 ** -16 * float(ref["dv"].abs().max()) if ref["dv"].numel() else 0.0
        moved = _stored_o_delta(inp, out, ref, dlse, kw)
        for name, g in (("dq", dq), ("dk", dk), ("dv", dv)):
            extra = 0.0 if name == "dv" else noise + _max_diff(moved[name], ref[name])
            rep.checks.append(compare(name, g, ref[name], lowp[name], inp.q.dtype, extra=extra))
    return rep
