"""The CuteDSL Hopper forward takes a causal packed list's tiles from a counter
(Config.dynamic, jagged.tiles.fwd_dynamic), on the CPU: the builds compile for sm_90a
with the counter's atomics, the handoff's barriers sized to the threads that fetch, no
spills and no ptxas-serialized wgmma; and host.forward launches the dynamic build with
the list's scheduling buffer (jagged.tiles.fwd_sched) exactly where fwd_dynamic says so,
every other build with an unused stand-in in its place. On the GPU, the forward suites
run it through the oracle."""
import os
import re
import textwrap

import pytest

from _cute import ROOT, compile_in_subprocess, have_dsl, ptxas_report
from _interp import interp

_ok, _why = have_dsl()
needs_dsl = pytest.mark.skipif(not _ok, reason=_why)


def _ptxas(path):
    """ptxas -v on the PTX: (spill bytes, the C751x lines that say it serialized wgmmas),
    or None without ptxas."""
    r = ptxas_report(path)
    if r is None:
        return None
    assert r.returncode == 0 and r.spills, r.stderr[-2000:]
    return r.spill_bytes, r.advisories


@needs_dsl
@pytest.mark.parametrize("D,fp8_v", [(128, False), (64, False), (128, True)])
def test_forward_dynamic_builds(tmp_path, D, fp8_v):
    """The causal long default with `dynamic` (D = 128: two consumer warpgroups, D = 64:
    three, 192-row tiles; fp8 with V tiles: the load warpgroup's three other warps walk
    the tiles too): the load warp's relaxed counter add (tile_counter.next_tile) and its
    acq_rel finished count (`tile_counter.finish_tiles`), then the reset of both; the other roles'
    relaxed slot reads (fetch_tile); the handoff's full barriers count the load warp's 32
    threads, its empty ones every fetching thread; the registers, the single
    griddepcontrol.wait and the spill-free cubin of the static build; no wgmma serialized
    by ptxas."""
    from kernels_cute import fwd_hopper as F
    cfg = F.CONFIGS[(D, "long", True)]
    dtype = "torch.float8_e4m3fn" if fp8_v else "torch.bfloat16"
    script = textwrap.dedent(f"""
        import sys, torch
        from dataclasses import replace
        sys.path.insert(0, {ROOT!r})
        from kernels_cute import fwd_hopper as F
        cfg = replace(F.CONFIGS[({D}, "long", True)], dynamic=True, fp8_v={fp8_v})
        F.compile_forward({dtype}, {D}, True, False, cfg)
        print("COMPILED")
    """)
    path = compile_in_subprocess(tmp_path, script, timeout=900)
    if path is None:
        pytest.skip("compiled, but the DSL kept no PTX to inspect")
    ptx = open(path).read()
    assert len(re.findall(r"atom\.global\.add\.u32", ptx)) == 1, "the counter's add"
    assert len(re.findall(r"atom\.global\.acq_rel\.add\.u32", ptx)) == 1, "finished count"
    assert re.search(r"st\.global\.b32\s+\[(%rd\d+)\], 0;\s*\n\s*st\.global\.b32\s+"
                     r"\[\1\+4\], 0;", ptx), "the reset of the counter and the count"
    assert re.findall(r"ld\.relaxed\.gpu\.global\.b32", ptx), "no fetch_tile"
    inits = [int(n) for n in re.findall(r"mov\.b32\s+%r\d+, (\d+);\s*\n\s*"
                                        r"mbarrier\.init\.shared\.b64", ptx)]
    consumers = cfg.block_m // 64
    assert 32 in inits and 128 * consumers + 96 * fp8_v in inits, inits
    regs = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)
    assert sorted(regs) == [("dec", "24"), ("inc", "160" if consumers == 3 else "240")]
    assert len(re.findall(r"griddepcontrol\.wait;", ptx)) == 1
    cubin = path[:-len(".ptx")] + ".cubin"
    if os.path.exists(cubin):
        from harness.compile_check import _resource_usage
        use = _resource_usage(open(cubin, "rb").read())
        use.pop("sass")
        print(f"dynamic D={D} fp8_v={fp8_v}: {use}")
        assert use["STACK"] + use["LOCAL"] + use["spill_insts"] == 0, use
    res = _ptxas(path)
    if res is not None:
        print(f"dynamic D={D} fp8_v={fp8_v}: ptxas spill bytes, advisories {res}")
        assert res == (0, []), res


@interp
def test_host_forward_dynamic(monkeypatch):
    """host.forward with Hopper's kernel set (the kernel a recorder, the list in the
    interpreter): a causal packed list launches the `dynamic` build with fwd_sched(count),
    the list's own memory right after its count, zeroed by the list kernel; non-causal,
    broadcast-Q and a one-wave (direct) call launch the static build with the unused
    stand-in in that place; a kernel set without `dynamic` (Blackwell's) passes no such
    argument. The compile caches tell the two builds apart."""
    from dataclasses import replace

    import torch
    from harness.problems import offsets
    from jagged.tiles import FWD_SCHED_INTS, fwd_sched, fwd_tiles
    from kernels_cute import disk_cache
    from kernels_cute import fwd_hopper as F
    from kernels_cute import host

    monkeypatch.setattr(host, "num_sms", lambda dev: 132)
    calls = []

    def compiled(*key):
        return lambda *args: calls.append((key, args))

    kern = F.KERNELS._replace(compiled=compiled)
    assert kern.dynamic and not host.FwdKernels(F.pick_config, compiled, None).dynamic
    H, D = 16, 128
    lq = torch.tensor([300, 200, 5, 130])
    cu = offsets(lq)
    q = torch.zeros(int(cu[-1]), H, D, dtype=torch.bfloat16)
    k = torch.zeros(int(cu[-1]), 4, D, dtype=torch.bfloat16)
    unused = host._unused_list(q.device)[1]
    for causal in (True, False):
        calls.clear()
        host.forward(kern, q, k, k, cu, cu, 300, 300, causal, 0.125, False)
        (key, args), = calls
        cfg = key[-1]
        assert key == (q.dtype, D, causal, False, cfg)
        assert cfg.dynamic == causal and not (cfg.windows or cfg.direct or cfg.pack > 1)
        pairs, count, _ = fwd_tiles(cu, cu, len(lq), 300, None, cfg.block_m, cfg.block_n,
                                    causal)
        assert torch.equal(args[7], pairs) and torch.equal(args[8], count)
        sched = args[13]   # q, k, v, out, lse, cu_q, cu_k, pairs, count, 3 descales, table
        if causal:
            ref = fwd_sched(args[8])          # the launched list's, after its count
            assert sched.dtype == torch.int32 and sched.shape == (FWD_SCHED_INTS,)
            assert sched.data_ptr() == ref.data_ptr() == args[8].data_ptr() + 4
            assert sched[:2].tolist() == [0, 0]
        else:
            assert sched is unused
        assert args[9:13] == (None, None, None, None) and len(args) == 19
    # broadcast-Q (causal), and a one-wave call: static, the stand-in in the buffer's place
    calls.clear()
    host.forward(kern, q[:64], k, k, None, cu, 64, 300, True, 0.125, True)
    host.forward(kern, q[:, :2], k[:, :2], k[:, :2], cu[:2], cu[:2], 300, 300, True, 0.125,
                 False)
    assert [c[0][-1].dynamic for c in calls] == [False, False]
    assert calls[1][0][-1].direct
    assert all(c[1][13] is unused for c in calls)
    # a set without `dynamic`: the scalars right after the window table
    calls.clear()
    host.forward(kern._replace(dynamic=False), q, k, k, cu, cu, 300, 300, True, 0.125, False)
    (key, args), = calls
    assert not key[-1].dynamic and args[9:13] == (None,) * 4 and len(args) == 18
    # the in-memory and disk caches key the two builds apart
    static = F.pick_config(D, 300, True, k.shape[0] / len(lq))
    dyn = replace(static, dynamic=True)
    assert static != dyn
    assert disk_cache.entry(F.compile_forward, (q.dtype, D, True, False, static)) != \
        disk_cache.entry(F.compile_forward, (q.dtype, D, True, False, dyn))
