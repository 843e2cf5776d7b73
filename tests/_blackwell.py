"""Shared by the Blackwell kernel tests (tests/test_{fwd,bwd}_blackwell_{tlx,cute}.py):
the CuteDSL builds (a fresh process each, PTX kept, ptxas -v on it) and their common
checks, the B200 oracle problems and parameters, the mbarrier of the TLX protocol models,
and the TLX builds' common checks.

Dispatch sends compute capability 10.0 (B200) and 10.3 (B300) to the same kernels: each
kernel's tests build its default variant for sm_103a too (`-m matrix`)."""
import re
import functools
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import torch

from _cute import ROOT, have_dsl

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


def cute_build(d, dtype: str, body: str, arch: str = "sm_100a"):
    """Run CUTE_PRELUDE + `body` (which prints "INFO <json>" and "COMPILED") with
    CUTE_DSL_ARCH=arch in a fresh process in the new folder `d` -> (info dict, PTX
    text, ptxas -v log), or (None, None, the output's tail) when it did not compile."""
    d.mkdir()
    env = dict(os.environ, CUTE_DSL_ARCH=arch, CUTE_DSL_KEEP="ptx,cubin",
               CUTE_DSL_DUMP_DIR=str(d), CUTE_DSL_DISABLE_FILE_CACHING="1")
    script = f"DTYPE = {dtype!r}\n" + CUTE_PRELUDE + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                       text=True, timeout=600, cwd=str(d))
    if "COMPILED" not in r.stdout:
        return None, None, (r.stdout + r.stderr)[-3000:]
    info = json.loads(r.stdout.split("INFO ", 1)[1].splitlines()[0])
    ptx_path = next(str(d / f) for f in os.listdir(d) if f.endswith(".ptx"))
    ptx = open(ptx_path).read()
    assert re.search(rf"^\.target {arch}$", ptx, re.M), f"not built for {arch}"
    log = subprocess.run([ptxas(), "-v", f"-arch={arch}", "-O3", ptx_path, "-o", os.devnull],
                         capture_output=True, text=True).stderr
    return info, ptx, log


def cute_variant(tmp_path, body: str, variant, arch: str = "sm_100a"):
    """Build `variant` (D, causal, broadcast_q, dtype[, config fields]) from `body` (a
    template of {D}, {causal}, {bq}, {cfg}) in its own folder -> cute_build's triple."""
    D, causal, bq, dtype, *rest = variant
    cfg = rest[0] if rest else {}
    d = tmp_path / f"{arch}_d{D}_c{int(causal)}_b{int(bq)}_{dtype}_{len(cfg)}{''.join(cfg)}"
    return cute_build(d, dtype, body.format(D=D, causal=causal, bq=bq, cfg=cfg), arch)


def check_cute(variant, info, ptx, log, mmas: int, threads: int, max_regs: int):
    """What every CuteDSL Blackwell build shows: exactly `mmas` 1-CTA tcgen05 MMAs, one
    TMEM allocation freed once and the permit relinquished, 1-CTA clusters of `threads`
    threads, TMEM and shared memory within the limits, no spills or stack and at most
    `max_regs` registers a thread (ptxas -v)."""
    assert ptx is not None, f"{variant} did not compile:\n{log}"
    mma = re.findall(r"tcgen05\.mma\.cta_group::1\.kind::f16", ptx)
    assert len(mma) == mmas, len(mma)
    for op in (r"alloc\.cta_group::1", r"dealloc\.cta_group::1", "relinquish_alloc_permit"):
        assert len(re.findall(r"tcgen05\." + op, ptx)) == 1, op
    assert "cta_group::2" not in ptx                        # 1-CTA MMAs, 1-CTA clusters
    assert info["cluster"] == [1, 1, 1] and info["threads"] == threads
    assert info["tmem_total"] <= TMEM_COLS
    assert info["smem"] <= SMEM_LIMIT, info
    assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log), log
    assert re.search(r"\b0 bytes stack frame", log), log
    used = int(re.search(r"Used (\d+) registers", log).group(1))
    assert used <= max_regs, used


def cute_tests(body: str, default, matrix, check):
    """A CuteDSL Blackwell kernel's compile tests, built by cute_variant from `body` and
    checked by check(variant, info, ptx, log): the `default` variants, the `matrix` ones
    (`-m matrix`), and the first default for sm_103a (`-m matrix`)."""
    import pytest
    ok, why = have_dsl()
    needs_dsl = pytest.mark.skipif(not ok, reason=why)

    def run(tmp_path, variants, arch="sm_100a"):
        cute_run(variants, functools.partial(cute_variant, tmp_path, body, arch=arch), check)

    @needs_dsl
    def test_default_builds(tmp_path):
        run(tmp_path, default)

    @needs_dsl
    @pytest.mark.matrix
    def test_compile_matrix(tmp_path):
        run(tmp_path, matrix)

    @needs_dsl
    @pytest.mark.matrix
    def test_default_build_sm103(tmp_path):
        """B300 (compute capability 10.3): dispatch sends it these kernels."""
        run(tmp_path, default[:1], arch="sm_103a")

    return test_default_builds, test_compile_matrix, test_default_build_sm103


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


def packing_call(D: int):
    """A broadcast-Q GQA call whose forward packs heads (L_q 16, H 32 / H_kv 4: G = 8), on
    the CPU: (q, k, cu_k, B, L_q, G, H_kv); k serves as v."""
    import torch
    B, L_q, H, Hkv = 5, 16, 32, 4
    q = torch.randn(L_q, H, D).to(torch.bfloat16)
    cu = torch.arange(0, 100 * (B + 1), 100, dtype=torch.int32)
    k = torch.zeros(int(cu[-1]), Hkv, D, dtype=torch.bfloat16)
    return q, k, cu, B, L_q, H // Hkv, Hkv


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


def b200_matrix(test):
    """A `-m gpu` test over every mode, causality, head dim and dtype."""
    import pytest
    for name, values in (("dtype", ["bf16", "fp16"]), ("head_dim", [64, 128]),
                         ("causal", [False, True]), ("mode", ["self", "cross", "broadcast_q"])):
        test = pytest.mark.parametrize(name, values)(test)
    return pytest.mark.gpu(test)


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


def publish_tile(slots: dict, t: int):
    """The tile handoff's writer (the load task, tile_counter.publish_tile): tile t into
    slot t % 2 once its readers have freed it, as ("wait" | "arrive", barrier[, parity])
    events."""
    s, ph = t % 2, (t // 2) & 1
    yield ("wait", f"tile_empty{s}", ph ^ 1)
    slots[s] = t
    yield ("arrive", f"tile_full{s}")


def handoff_tiles(slots: dict, total: int, dynamic: bool):
    """A reading task's tiles ("tile", t) of a list of `total`, with its handoff events
    (tile_counter.fetch_tile) when `dynamic`, else the round-robin of one program."""
    i = 0
    while True:
        t = i
        if dynamic:
            s, ph = i % 2, (i // 2) & 1
            yield ("wait", f"tile_full{s}", ph)
            t = slots[s]
            yield ("arrive", f"tile_empty{s}")
        if t >= total:
            return
        yield ("tile", t)
        i += 1


# ------------------------------------------------------------------------------ TLX builds
def first_then_matrix(variants):
    """pytest params: the first variant by default, the others under `-m matrix`."""
    import pytest
    return variants[:1] + [pytest.param(v, marks=pytest.mark.matrix) for v in variants[1:]]


def tcgen05_mmas(rep) -> int:
    """The tcgen05 MMAs in a TLX build's PTX (sm_100a or sm_103a)."""
    from harness.compile_check import MMA_PATTERNS
    return len(re.findall(MMA_PATTERNS[100], rep.ptx))


def check_tcgen05(rep) -> list[int]:
    """What every TLX Blackwell build (harness.compile_check report `rep`, sm_100a or
    sm_103a) shows: tcgen05 MMAs, one with its A operand in TMEM; TMEM allocations within
    512 columns, each freed, the allocation permit relinquished; shared memory within the
    limit (sm_103a: sm_100a's, the same 227 KB a block). -> the allocations' column
    counts."""
    from harness.compile_check import SMEM_LIMIT as LIMITS
    print(rep.row())
    ptx = rep.ptx
    assert rep.arch in (100, 103) and tcgen05_mmas(rep) > 0, rep.row()
    assert re.search(rf"^\.target sm_{rep.arch}a$", ptx, re.M), rep.row()
    cols = [int(x) for x in re.findall(
        r"tcgen05\.alloc\.cta_group::1\.sync\.aligned\.shared::cta\.b32\s+\[[^\]]+\],\s*(\d+);",
        ptx)]
    assert cols and all(c <= TMEM_COLS for c in cols), cols
    n_alloc = len(re.findall(r"tcgen05\.alloc\.", ptx))
    assert n_alloc >= 1 and len(re.findall(r"tcgen05\.dealloc\.", ptx)) >= n_alloc, \
        "a TMEM allocation is never freed"
    assert "tcgen05.relinquish_alloc_permit" in ptx
    assert rep.total_smem <= LIMITS[100], rep.row()  # sm_103a: the same limit
    assert re.search(r"tcgen05\.mma\.cta_group::1\.kind::f16\s+\[[^\]]+\],\s*\[", ptx), \
        "no MMA with its A operand in TMEM"
    return cols


def tlx_compile_tests(check, variants, spill_bound: int, why: str):
    """A TLX Blackwell kernel's compile tests: check(*variant, arch=...) -> its report,
    spills within `spill_bound` an xfail (`why`). Every variant for sm_100a (the first
    by default, the others under `-m matrix`), and the first for sm_103a (`-m matrix`)."""
    import pytest

    @pytest.mark.parametrize("v", first_then_matrix(variants),
                             ids=lambda v: "-".join(map(str, v)))
    def test_compiles_sm100(v):
        xfail_spills(check(*v), spill_bound, why)

    @pytest.mark.matrix
    def test_compiles_sm103():
        """B300 (compute capability 10.3): dispatch sends it these kernels."""
        xfail_spills(check(*variants[0], arch=103), spill_bound, why)

    return test_compiles_sm100, test_compiles_sm103


def xfail_spills(rep, bound: int, why: str):
    """Spills within `bound` instructions are an expected failure (`why`), beyond it a
    failure."""
    import pytest
    if rep.spills:
        assert rep.spill_insts <= bound, rep.row()
        pytest.xfail(f"{why}: {rep.row()}")
