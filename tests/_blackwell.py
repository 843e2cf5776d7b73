"""Shared by the Blackwell kernel tests (tests/test_{fwd,bwd}_blackwell_{tlx,cute}.py):
the CuteDSL sm_100a builds (a fresh process each, PTX kept, ptxas -v on it), the B200
oracle problems, and the mbarrier of the TLX protocol models."""
import functools
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import torch

from _cute import ROOT

SMEM_LIMIT = 227 * 1024
TMEM_COLS = 512

# the head of a CuteDSL build script: the repo on the path, the SM count without a driver
# (nothing in a compile should ask for it)
CUTE_PRELUDE = textwrap.dedent(f"""
    import json, sys, torch
    sys.path.insert(0, {ROOT!r})
    import cutlass.utils, cutlass.utils.hardware_info as hw

    class _Sms:
        def __init__(self, *a): pass
        def get_device_multiprocessor_count(self): return 148
        def get_max_active_clusters(self, n, *a): return 148 // n
    cutlass.utils.HardwareInfo = hw.HardwareInfo = _Sms
    dt = {{"bf16": torch.bfloat16, "fp16": torch.float16}}[DTYPE]
""")


def ptxas() -> str:
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "ptxas-blackwell")


def cute_build(d, dtype: str, body: str):
    """Run CUTE_PRELUDE + `body` (which prints "INFO <json>" and "COMPILED") with
    CUTE_DSL_ARCH=sm_100a in a fresh process in the new folder `d` -> (info dict, PTX
    text, ptxas -v log), or (None, None, the output's tail) when it did not compile."""
    d.mkdir()
    env = dict(os.environ, CUTE_DSL_ARCH="sm_100a", CUTE_DSL_KEEP="ptx,cubin",
               CUTE_DSL_DUMP_DIR=str(d), CUTE_DSL_DISABLE_FILE_CACHING="1")
    script = f"DTYPE = {dtype!r}\n" + CUTE_PRELUDE + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                       text=True, timeout=600, cwd=str(d))
    if "COMPILED" not in r.stdout:
        return None, None, (r.stdout + r.stderr)[-3000:]
    info = json.loads(r.stdout.split("INFO ", 1)[1].splitlines()[0])
    ptx_path = next(str(d / f) for f in os.listdir(d) if f.endswith(".ptx"))
    ptx = open(ptx_path).read()
    log = subprocess.run([ptxas(), "-v", "-arch=sm_100a", "-O3", ptx_path, "-o", os.devnull],
                         capture_output=True, text=True).stderr
    return info, ptx, log


def cute_run(variants, build, check):
    """build(variant) two at a time, then check(variant, info, ptx, log) each; skips when
    the DSL cannot compile on this machine."""
    import pytest
    with ThreadPoolExecutor(max_workers=2) as ex:
        results = list(ex.map(build, variants))
    if all(p is None and ("libcuda" in l or "CUDA driver" in l) for _, p, l in results):
        pytest.skip("CuteDSL cannot compile here")
    for v, (info, ptx, log) in zip(variants, results):
        check(v, info, ptx, log)


# ------------------------------------------------------------------------------ B200
def on_b200() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10


def skip_unless_b200():
    import pytest
    if not on_b200():
        pytest.skip("needs a B200 (compute capability 10.x)")


def planted(p):
    """Problem `p`'s lengths with zero-length and length-1 sequences planted (batch >= 4):
    keys of sequences 1 and 2, and queries of 2 and 3 outside broadcast-Q."""
    lq, lk = (t.clone() for t in p.lengths())
    lk[1], lk[2] = 0, 1
    if p.mode != "broadcast_q":
        lq[2], lq[3] = 1, 0
    if p.mode == "self":
        lk = lq.clone()
    return lq, lk


def problem(mode, causal, head_dim, dtype, kv_heads, max_len, heads=4, batch=7):
    from harness.problems import Problem
    return Problem(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                   max_seqlen_q=max_len, max_seqlen_k=None if mode == "self" else max_len + 37,
                   sparsity=0.6, mode=mode, causal=causal, dtype=dtype, seed=head_dim + max_len)


def forward_fn(forward):
    """An architecture's `forward` in the oracle's calling convention."""
    def fn(q, k, v, cu_q, cu_k, max_q, max_k, causal, softmax_scale, broadcast_q):
        scale = softmax_scale or q.shape[-1] ** -0.5
        return forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, broadcast_q)
    return fn


@functools.lru_cache(maxsize=None)  # an op name registers once
def backward_fn(name: str, backward):
    """The portable forward with `backward`, one autograd op (a failure is the
    backward's), in the oracle's calling convention, lse returned (its gradient flows)."""
    from jagged import portable
    from jagged.api import make_jagged_attention
    attn = make_jagged_attention(name, portable.fwd, backward)

    def fn(q, k, v, cu_q, cu_k, max_q, max_k, causal, softmax_scale, broadcast_q):
        return attn(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                    softmax_scale=softmax_scale, broadcast_q=broadcast_q, return_lse=True)
    return fn


def check_on_b200(p, fn, backward: bool, seed: int = 3):
    """`fn` against the oracle on problem `p` with short sequences planted; the backward
    with a gradient on lse too."""
    from harness.oracle import check
    lq, lk = planted(p)
    inp = p.build("cuda", lengths=(lq, lk))
    dlse = None
    bq = p.mode == "broadcast_q"
    if backward:
        rows = (inp.cu_seqlens_k.shape[0] - 1) * inp.q.shape[0] if bq else inp.q.shape[0]
        dlse = torch.randn(inp.q.shape[1], rows, device="cuda",
                           generator=torch.Generator(device="cuda").manual_seed(seed))
    rep = check(inp, fn, causal=p.causal, broadcast_q=bq, backward=backward, dlse=dlse)
    assert rep.ok, f"{p.label()} lengths={(lq.tolist(), lk.tolist())}\n{rep}"


# ------------------------------------------------------------------------------ protocol
class Bar:
    """An mbarrier: `count` arrivals complete a phase; wait(parity) passes while the
    current (incomplete) phase's parity differs from it."""

    def __init__(self, count=1):
        self.count, self.pending, self.done = count, 0, 0

    def arrive(self):
        self.pending += 1
        if self.pending == self.count:
            self.pending, self.done = 0, self.done + 1

    def passes(self, parity):
        return (self.done & 1) != parity


# ------------------------------------------------------------------------------ TLX builds
def first_then_matrix(variants):
    """pytest params: the first variant by default, the others under `-m matrix`."""
    import pytest
    return variants[:1] + [pytest.param(v, marks=pytest.mark.matrix) for v in variants[1:]]


def check_tcgen05(rep) -> list[int]:
    """What every TLX sm_100a build (harness.compile_check report `rep`) shows: tcgen05
    MMAs, one with its A operand in TMEM; TMEM allocations within 512 columns, each
    freed, the allocation permit relinquished; shared memory within the limit. -> the
    allocations' column counts."""
    import re

    from harness.compile_check import SMEM_LIMIT as LIMITS
    print(rep.row())
    ptx = rep.ptx
    assert rep.mma == "tcgen05" and rep.has_mma, rep.row()
    cols = [int(x) for x in re.findall(
        r"tcgen05\.alloc\.cta_group::1\.sync\.aligned\.shared::cta\.b32\s+\[[^\]]+\],\s*(\d+);",
        ptx)]
    assert cols and all(c <= TMEM_COLS for c in cols), cols
    n_alloc = len(re.findall(r"tcgen05\.alloc\.", ptx))
    assert n_alloc >= 1 and len(re.findall(r"tcgen05\.dealloc\.", ptx)) >= n_alloc, \
        "a TMEM allocation is never freed"
    assert "tcgen05.relinquish_alloc_permit" in ptx
    assert rep.total_smem <= LIMITS[100], rep.row()
    assert re.search(r"tcgen05\.mma\.cta_group::1\.kind::f16\s+\[[^\]]+\],\s*\[", ptx), \
        "no MMA with its A operand in TMEM"
    return cols


def xfail_spills(rep, bound: int, why: str):
    """Spills within `bound` instructions are an expected failure (`why`), beyond it a
    failure."""
    import pytest
    if rep.spills:
        assert rep.spill_insts <= bound, rep.row()
        pytest.xfail(f"{why}: {rep.row()}")
