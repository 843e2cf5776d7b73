"""The step loop of each main kernel in SASS, FA4's beside ours, compiled on the CPU for
sm_90a: what one step issues (wgmmas, their waits, exp2s, shared-memory traffic,
barriers) and in what order. A count, not a time: it shows where the dots wait for each
other and how much work a step carries, so a schedule can be compared before any GPU
minute is spent.

    python -m harness.sass_steps --pass bwd --head-dim 64 [--causal] [--backends fa4,cute,tlx]
    python -m harness.sass_steps --pass decode --rows 16 --cache fp8 --backends tlx
    python -m harness.sass_steps --pass decode --rows 16 --cache fp8 --q fp8 --backends cute

A step loop is an innermost loop with wgmmas (a backward branch's range holding no other
such loop); each prints its instruction count by class (and, where a forward branch in it
skips part of the step, such as a mask, its count with that branch taken), and the
shortest one its issue order (runs of one kind collapsed: `HGMMA.64x128x16x4` is four
wgmmas in a row, `(RS)` one reading A from registers, `WARPGROUP.DEPBAR.LE` a wait on
wgmmas in flight).
FA4 is compiled through its own entry under FakeTensorMode (the SM count stubbed), as a
varlen GQA call; ours as the default call builds them (bf16, long sequences). A forward
step loop is one consumer warpgroup's KV step (TLX compiles each consumer's copy: two
loops a bucket).
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from typing import NamedTuple

from .compile_check import _run_job, compile_kernel, sass_of, tlx_bwd_job, tlx_fwd_job

# instruction classes by opcode prefix; the last takes the rest
CLASSES = [("HGMMA", ("HGMMA",)), ("QGMMA", ("QGMMA",)), ("HMMA", ("HMMA",)),
           ("WARPGROUP", ("WARPGROUP",)),
           ("MUFU", ("MUFU",)),
           ("FP32", ("FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP")),
           ("F2F", ("F2F", "F2FP")), ("LDS", ("LDS", "LDSM")), ("STS", ("STS", "STSM")),
           ("BAR", ("BAR",)), ("SYNCS", ("SYNCS",)), ("TMA", ("UTMA", "UBLK")),
           ("GLOBAL", ("LDG", "STG", "RED", "ATOM")), ("SHFL", ("SHFL",)),
           ("INT", ("IMAD", "IADD3", "LEA", "SHF", "LOP3")), ("other", ())]
MMA = ("HGMMA", "QGMMA", "HMMA")  # a step loop issues tensor-core work of one of these
# (QGMMA: an fp8 wgmma)
# the kinds the issue order names
ORDERED = {"HGMMA", "QGMMA", "HMMA", "WARPGROUP", "BAR", "SYNCS", "MUFU", "LDS", "STS", "SHFL",
           "TMA"}


class Ins(NamedTuple):
    addr: int
    op: str
    target: int | None  # a branch's target address
    text: str


def parse(sass: str) -> list[Ins]:
    """The instructions of cuobjdump -sass output, in address order."""
    out = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if not m:
            continue
        text = m.group(2)
        parts = text.split()
        op = parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]
        t = re.search(r"0x([0-9a-f]+)", text) if op.startswith("BRA") else None
        out.append(Ins(int(m.group(1), 16), op, int(t.group(1), 16) if t else None, text))
    return out


def kind(op: str) -> str:
    return next(name for name, pre in CLASSES if not pre or op.startswith(pre))


def step_loops(ins: list[Ins]) -> list[list[Ins]]:
    """The innermost loops that issue MMAs (wgmma, or mma.sync), each as its
    instructions."""
    at = {x.addr: i for i, x in enumerate(ins)}
    spans = [(at[x.target], i) for i, x in enumerate(ins)
             if x.target is not None and x.target <= x.addr and x.target in at]
    spans = [(s, e) for s, e in spans if any(x.op.startswith(MMA) for x in ins[s:e + 1])]
    inner = [(s, e) for s, e in spans
             if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in spans)]
    return [ins[s:e + 1] for s, e in sorted(set(inner))]


def branch_paths(body: list[Ins]) -> list[int]:
    """The step's length on each forward branch in its loop taken (the loop less the
    instructions the branch jumps over): a step that branches around its mask runs the
    shorter path where it needs none."""
    at = {x.addr: i for i, x in enumerate(body)}
    return [len(body) - (at[x.target] - i - 1) for i, x in enumerate(body)
            if x.target in at and x.target > x.addr]


def counts(body: list[Ins]) -> Counter:
    return Counter(kind(x.op) for x in body)


def _tag(x: Ins) -> str:
    k = kind(x.op)
    if k in ("HGMMA", "QGMMA"):  # shape, and (RS) when A comes from registers
        a = x.text.split(",")[1].strip() if "," in x.text else ""
        return k + "." + x.op.split(".")[1] + ("(RS)" if re.match(r"R\d", a) else "")
    if k in ("WARPGROUP", "BAR", "SYNCS", "TMA"):
        return x.op
    return k


def order(body: list[Ins]) -> str:
    """The issue order of the kinds in ORDERED, runs of one tag collapsed."""
    runs: list[list] = []
    for x in body:
        if kind(x.op) not in ORDERED:
            continue
        t = _tag(x)
        if runs and runs[-1][0] == t:
            runs[-1][1] += 1
        else:
            runs.append([t, 1])
    return " ".join(t if n == 1 else f"{t}x{n}" for t, n in runs)


def before_first_wait(body: list[Ins]) -> list[str]:
    """The issue order's tags (`order`) ahead of the step's first wgmma wait."""
    tags = order(body)
    return tags[:tags.index("WARPGROUP.DEPBAR")].split()


def summary(body: list[Ins]) -> str:
    c = counts(body)
    return f"{len(body)} instructions: " + ", ".join(
        f"{k} {c[k]}" for k, _ in CLASSES if c[k])


# ----------------------------------------------------------------------------- builds
_FA4 = """
import torch, cutlass.utils, cutlass.utils.hardware_info as hw
from torch._subclasses.fake_tensor import FakeTensorMode
class HW:  # the SM count without a driver
    def __init__(self, device_id=0): pass
    def get_device_multiprocessor_count(self): return 132
    def get_max_active_clusters(self, cluster_size, stream=None): return 132 // cluster_size
cutlass.utils.HardwareInfo = hw.HardwareInfo = HW
import flash_attn.cute.tile_scheduler as ts
ts.HardwareInfo = HW
from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd
D, causal, H, Hkv, seq = {D}, {causal}, 8, 2, [3000, 2000]
n = sum(seq)
with FakeTensorMode():
    e = lambda *s, dt=torch.bfloat16: torch.empty(*s, dtype=dt, device="cuda")
    cu = e(len(seq) + 1, dt=torch.int32)
    kw = dict(causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(seq),
              max_seqlen_k=max(seq))
    if {bwd}:
        _flash_attn_bwd(e(n, H, D), e(n, Hkv, D), e(n, Hkv, D), e(n, H, D), e(n, H, D),
                        e(H, n, dt=torch.float32), **kw)
    else:
        _flash_attn_fwd(e(n, H, D), e(n, Hkv, D), e(n, Hkv, D), return_lse=True, **kw)
"""
_CUTE = """
import sys, torch
sys.path.insert(0, {root!r})
from kernels_cute import bwd_hopper, fwd_hopper
if {bwd}:
    bwd_hopper.compile_main(torch.bfloat16, {D}, {causal}, False)
else:
    fwd_hopper.compile_forward(torch.bfloat16, {D}, {causal}, False)
"""
_CUTE_DECODE = """
import sys, torch
sys.path.insert(0, {root!r})
from kernels_cute import decode_hopper as K
fp8 = {fp8}
q_dt = torch.float8_e4m3fn if {q_fp8} else torch.bfloat16
kv_dt = torch.float8_e4m3fn if fp8 else torch.bfloat16
cfg = (K.FP8_CONFIGS if fp8 else K.CONFIGS)[({D}, {rows})]
K.compile_decode(q_dt, {D}, cfg, causal=True, paged=False, packed=False, split=True,
                 kv_dtype=kv_dt)
"""


def _dsl_build(code: str, pattern: str, extra_env: dict) -> str:
    """Run a CuteDSL compile script for sm_90a in a fresh process and return the SASS of
    the kept cubin whose name matches `pattern`."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin",
                   CUTE_DSL_DUMP_DIR=d, CUTE_DSL_DISABLE_FILE_CACHING="1", **extra_env)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, cwd=d)
        found = glob.glob(os.path.join(d, f"*{pattern}*.cubin"))
        if not found:
            raise RuntimeError(f"no {pattern} cubin: {(r.stdout + r.stderr)[-2000:]}")
        return sass_of(found[0])


def _tlx_decode(head_dim: int, rows: int, cache: str, q: str) -> str:
    """TLX's decode kernel for a contiguous cache (bf16, or e4m3 with a bf16 or e4m3 q),
    GQA 4, one new row, causal, split."""
    from kernels_tlx import decode_hopper as dh
    fp8 = cache == "fp8"
    cfg = dh.CONFIGS[(head_dim, rows, "contig", 1 if fp8 else 2)]
    q_dt = ("fp8e4nv" if q == "fp8" else "bf16") if fp8 else cache
    return compile_kernel(
        dh.decode_kernel, dh.signature(cfg, head_dim, "contig", "fp8e4nv" if fp8 else cache,
                                       True, q_dt),
        dh.kernel_args(cfg, head_dim, 4, rows, 0, "contig", False, True, True, fp8=fp8,
                       q8=q_dt == "fp8e4nv"),
        arch=90, num_warps=cfg.num_warps, name=f"decode D{head_dim} M{rows} {cache}").sass


def build(backend: str, pass_: str, head_dim: int, causal: bool, rows: int = 16,
          cache: str = "bf16", q: str = "bf16") -> str:
    """The SASS of `backend`'s main kernel of a pass (bf16, non-broadcast, long; decode:
    TLX's or CuteDSL's, `rows` query rows a tile, a `cache` of bf16 or fp8 (with a `q` of
    bf16 or fp8), contiguous, causal, split)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if pass_ == "decode":
        if backend == "cute":
            return _dsl_build(_CUTE_DECODE.format(root=root, D=head_dim, rows=rows,
                                                  fp8=cache == "fp8",
                                                  q_fp8=cache == "fp8" and q == "fp8"),
                              "DecodeHopper", {})
        if backend != "tlx":
            raise ValueError("decode: tlx or cute")
        return _tlx_decode(head_dim, rows, cache, q)
    bwd = pass_ == "bwd"
    if backend == "fa4":
        return _dsl_build(_FA4.format(D=head_dim, causal=causal, bwd=bwd),
                          "BackwardSm90" if bwd else "ForwardSm90",
                          dict(FLASH_ATTENTION_ARCH="sm_90", FLASH_ATTENTION_NUM_SMS="132"))
    if backend == "cute":
        return _dsl_build(_CUTE.format(root=root, D=head_dim, causal=causal, bwd=bwd),
                          "BwdMain" if bwd else "FwdHopper", {})
    if backend == "tlx":
        job = (tlx_bwd_job if bwd else tlx_fwd_job)(head_dim, "long", causal, False)
        return _run_job(job).sass
    raise ValueError(f"backend {backend!r}: fa4, cute or tlx")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m harness.sass_steps")
    ap.add_argument("--pass", dest="pass_", choices=("fwd", "bwd", "decode"), default="bwd")
    ap.add_argument("--rows", type=int, default=16, help="decode: query rows a tile")
    ap.add_argument("--cache", choices=("bf16", "fp8"), default="bf16", help="decode's cache")
    ap.add_argument("--q", choices=("bf16", "fp8"), default="bf16",
                    help="decode over an fp8 cache: q's dtype")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--backends", default="fa4,cute,tlx")
    a = ap.parse_args(argv)
    for b in a.backends.split(","):
        loops = step_loops(parse(build(b, a.pass_, a.head_dim, a.causal, a.rows, a.cache, a.q)))
        if a.pass_ == "decode":
            what = f"{a.rows} rows, {a.cache} cache" + (f", {a.q} q" if a.cache == "fp8" else "")
        else:
            what = "causal" if a.causal else ""
        print(f"== {b} {a.pass_}, D {a.head_dim}{', ' + what if what else ''}: "
              f"{len(loops)} step loops")
        for body in loops:
            taken = ", ".join(map(str, branch_paths(body)))
            print(f"  [{body[0].addr:#x}, {body[-1].addr:#x}] {summary(body)}"
                  + (f"; a forward branch taken: {taken}" if taken else ""))
        if loops:
            print("  order of the shortest: " + order(min(loops, key=len)) + "\n")


if __name__ == "__main__":
    main()
