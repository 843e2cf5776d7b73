"""Probe: can this triton-utlx build (3.8.0.post16 on triton 3.8.0) express the 2-CTA
(cta_group::2) pair the CuteDSL broadcast-Q backward uses?

Run on a CPU: .venv/bin/python scripts/tlx_2cta_probe.py 2>/dev/null   (compiles for sm_100a)

Each case compiles one minimal kernel with num_ctas=2 (what uTLX's ctas_per_cga=(2,1,1)
launch option becomes, utlx_plugin/_ctas_per_cga.py) and prints what it got: the PTX's
cta_group / cluster ops, or the error. The pair needs all of: a cluster launch,
cluster_cta_rank, shared memory and mbarriers under the cluster, a cta_group::2
tcgen05.mma (with a two-CTA TMEM accumulator), a commit multicast to both CTAs, an arrive
on the peer's mbarrier, and a copy into the peer's shared memory (the dS exchange).

Seen (utlx_plugin.SUPPORTS_MULTI_CTA is False):
  controls at num_ctas=1                      compile (cta_group::1 MMA)
  cluster launch + rank                       compiles (no shared memory)
  one smem buffer + TMA under the cluster     fails: "Result has an invalid layout:
                                              #ttg.nvmma_shared<...>" (uTLX emits
                                              single-CTA shared layouts, no CGA layout)
  pair commit (tcgen05_commit two_ctas)       fails: the same, on the mbarrier's
                                              #ttg.swizzled_shared layout
  cluster barrier                             fails: "'ttng.cluster_barrier' op requires
                                              ttg.num-ctas > 1" (TTIR has no num-ctas)
  1-CTA MMA inside the cluster (control)      fails: invalid nvmma_shared layout
  two_ctas MMA, acc [128, 128]                fails: "'ttng.tc_gen5_mma' op expected the
                                              output shape to be the concatenation ..."
                                              (upstream wants cluster-wide shapes and a
                                              twoCTAs TMEM layout; uTLX's TMEM layout
                                              factory hard-codes twoCTAs=False)
  two_ctas MMA, acc [128, 64]                 fails in uTLX's dot_precheck: "expected
                                              accumulator shape [128, 128]"
  barrier_arrive(remote_cta_rank=)            fails: NotImplementedError, tlx.remote_view
                                              needs ttng.map_to_remote_buffer
  async_remote_shmem_store                    fails: "'ttg.async_remote_shmem_store' is
                                              not registered in this Triton build"
"""
import re
import traceback

import triton
import triton.language as tl
import triton.language.extra.tlx as tlx
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def pair_mma(a_desc, b_desc, c_ptr, ACC_N: tl.constexpr, TWO: tl.constexpr):
    """A [128, 64] per CTA (the pair's M = 256), B [64, 64] per CTA (its N half)."""
    rank = tlx.cluster_cta_rank()
    a = tlx.local_alloc((128, 64), tl.bfloat16, 1)
    b = tlx.local_alloc((64, 64), tl.bfloat16, 1)
    bars = tlx.alloc_barriers(1)
    done = tlx.alloc_barriers(1)
    acc = tlx.local_alloc((128, ACC_N), tl.float32, 1, tlx.storage_kind.tmem)
    tlx.barrier_expect_bytes(bars[0], 128 * 64 * 2 + 64 * 64 * 2)
    tlx.async_descriptor_load(a_desc, a[0], [rank * 128, 0], bars[0])
    tlx.async_descriptor_load(b_desc, b[0], [0, rank * 64], bars[0])
    tlx.barrier_wait(bars[0], 0)
    tlx.async_dot(a[0], b[0], acc[0], use_acc=False, mBarriers=[done[0]], two_ctas=TWO)
    tlx.barrier_wait(done[0], 0)
    x = tlx.local_load(acc[0])
    rows = tl.arange(0, 128)
    cols = tl.arange(0, ACC_N)
    tl.store(c_ptr + rank * 128 * ACC_N + rows[:, None] * ACC_N + cols[None, :], x)


@triton.jit
def peer_arrive(c_ptr):
    """The peer arrives on the leader's mbarrier (the pair's hand-over to the leader)."""
    rank = tlx.cluster_cta_rank()
    bar = tlx.alloc_barriers(1, arrive_count=2)
    tlx.barrier_arrive(bar[0], 1, remote_cta_rank=rank & ~1)
    tlx.barrier_wait(bar[0], 0, pred=rank % 2 == 0)
    tl.store(c_ptr + rank, rank)


@triton.jit
def peer_store(c_ptr):
    """A tile written into the peer's shared memory, completing on its mbarrier (the dS
    half exchange)."""
    rank = tlx.cluster_cta_rank()
    buf = tlx.local_alloc((128, 64), tl.bfloat16, 1)
    bar = tlx.alloc_barriers(1)
    x = tl.full((128, 64), 1.0, tl.bfloat16)
    tlx.barrier_expect_bytes(bar[0], 128 * 64 * 2)
    tlx.async_remote_shmem_store(buf[0], x, rank ^ 1, bar[0])
    tlx.barrier_wait(bar[0], 0)
    y = tlx.local_load(buf[0])
    rows = tl.arange(0, 128)
    cols = tl.arange(0, 64)
    tl.store(c_ptr + rows[:, None] * 64 + cols[None, :], y.to(tl.float32))


@triton.jit
def cluster_only(c_ptr):
    """Cluster launch, rank and a cluster barrier, nothing else."""
    rank = tlx.cluster_cta_rank()
    tlx.cluster_barrier()
    tl.store(c_ptr + tl.program_id(0) * 2 + rank, rank)


@triton.jit
def rank_only(c_ptr):
    """Cluster launch and rank, no shared memory."""
    tl.store(c_ptr + tl.program_id(0) * 2 + tlx.cluster_cta_rank(), tlx.cluster_cta_rank())


@triton.jit
def smem_only(a_desc, c_ptr):
    """One TMA load into one shared-memory buffer, under a 2-CTA cluster."""
    a = tlx.local_alloc((128, 64), tl.bfloat16, 1)
    bar = tlx.alloc_barriers(1)
    tlx.barrier_expect_bytes(bar[0], 128 * 64 * 2)
    tlx.async_descriptor_load(a_desc, a[0], [tlx.cluster_cta_rank() * 128, 0], bar[0])
    tlx.barrier_wait(bar[0], 0)
    x = tlx.local_load(a[0])
    rows = tl.arange(0, 128)
    cols = tl.arange(0, 64)
    tl.store(c_ptr + rows[:, None] * 64 + cols[None, :], x.to(tl.float32))


@triton.jit
def pair_commit(c_ptr):
    """A commit multicast to both CTAs' mbarriers (tcgen05_commit two_ctas)."""
    bar = tlx.alloc_barriers(1)
    tlx.tcgen05_commit(bar[0], two_ctas=True)
    tlx.barrier_wait(bar[0], 0)
    tl.store(c_ptr + tlx.cluster_cta_rank(), 1)


def compile_case(name, fn, sig, num_ctas=2, **constexprs):
    sig = dict(sig, **{k: "constexpr" for k in constexprs})
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    try:
        k = triton.compile(src, target=GPUTarget("cuda", 100, 32),
                           options=dict(num_warps=4, num_ctas=num_ctas))
    except BaseException as e:  # noqa: BLE001
        lines = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
        print(f"[{name}] FAILS: {type(e).__name__}: {lines[-1][:600]}")
        return None
    ptx = k.asm["ptx"]
    found = {op: sorted(set(re.findall(op + r"[.\w:]*", ptx)))
             for op in ("tcgen05.mma", "tcgen05.alloc", "mapa", "barrier.cluster",
                        "st.async", "cp.async.bulk.shared::cluster")}
    print(f"[{name}] compiles: num_ctas={k.metadata.num_ctas} "
          f"{ {o: f for o, f in found.items() if f} }")
    return ptx


if __name__ == "__main__":
    import utlx_plugin
    print("utlx_plugin.SUPPORTS_MULTI_CTA =", getattr(utlx_plugin, "SUPPORTS_MULTI_CTA", None))
    mma_sig = {"a_desc": "tensordesc<bf16[128, 64]>", "b_desc": "tensordesc<bf16[64, 64]>",
               "c_ptr": "*fp32"}
    compile_case("control: smem + TMA, no cluster (num_ctas=1)", smem_only,
                 {"a_desc": "tensordesc<bf16[128, 64]>", "c_ptr": "*fp32"}, num_ctas=1)
    compile_case("control: 1-CTA MMA, no cluster (num_ctas=1)", pair_mma,
                 {"a_desc": "tensordesc<bf16[128, 64]>", "b_desc": "tensordesc<bf16[64, 64]>",
                  "c_ptr": "*fp32"}, num_ctas=1, ACC_N=64, TWO=False)
    compile_case("cluster launch + rank", rank_only, {"c_ptr": "*i32"})
    compile_case("one smem buffer + TMA under the cluster", smem_only,
                 {"a_desc": "tensordesc<bf16[128, 64]>", "c_ptr": "*fp32"})
    compile_case("pair commit (tcgen05_commit two_ctas)", pair_commit, {"c_ptr": "*i32"})
    compile_case("cluster launch + rank + cluster barrier", cluster_only, {"c_ptr": "*i32"})
    compile_case("1-CTA MMA inside a 2-CTA cluster (control)", pair_mma, mma_sig,
                 ACC_N=64, TWO=False)
    # TLX's convention: acc N = both CTAs' B halves (uTLX's dot_precheck asks for it)
    compile_case("two_ctas MMA, acc [128, 128] (TLX convention)", pair_mma, mma_sig,
                 ACC_N=128, TWO=True)
    compile_case("two_ctas MMA, acc [128, 64] (per-CTA B's N)", pair_mma, mma_sig,
                 ACC_N=64, TWO=True)
    compile_case("arrive on the peer's mbarrier (remote_cta_rank)", peer_arrive,
                 {"c_ptr": "*i32"})
    compile_case("async store into the peer's smem (async_remote_shmem_store)", peer_store,
                 {"c_ptr": "*fp32"})
