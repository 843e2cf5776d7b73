"""What the CuteDSL Blackwell (sm_100a) forward and backward kernel classes share: the
base they derive from (`kernel_base`: their tcgen05 k-block loop, the TMEM allocation's
hand-over, the TMA-to-MMA and MMA-to-threads rings and the persistent launch) and the
tcgen05 fence after a barrier wait.

The DSL is imported inside the functions only: importing this module touches neither
the DSL nor the driver.
"""
import functools

def tc_fence_after():
    """tcgen05.fence::after_thread_sync: tcgen05 work after an mbarrier wait is ordered
    after the tcgen05 work the arriving threads did before arriving (traced in a kernel)."""
    from cutlass._mlir.dialects import llvm
    llvm.inline_asm(None, [], "tcgen05.fence::after_thread_sync;", "",
                    has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


def bulk_copy_to_peer(src, dst, mbar, nbytes, peer):
    """cp.async.bulk of `nbytes` from this CTA's smem `src` to `dst` (this CTA's address of
    it) in cluster CTA `peer`, completing the transaction on the peer's `mbar` (traced in a
    kernel; src, dst 16-byte aligned)."""
    from cutlass import Int32
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T

    def remote(p):
        return llvm.inline_asm(T.i32(), [p.toint().ir_value(), Int32(peer).ir_value()],
                               "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r",
                               has_side_effects=False, is_align_stack=False,
                               asm_dialect=llvm.AsmDialect.AD_ATT)
    llvm.inline_asm(
        None, [remote(dst), src.toint().ir_value(), remote(mbar), Int32(nbytes).ir_value()],
        "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes "
        "[$0], [$1], $3, [$2];", "r,r,r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@functools.cache
def kernel_base():
    """The base class of the Blackwell kernel classes (built on first use: it imports the
    DSL). A subclass sets num_threads and cluster_shape."""
    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    from cutlass import Float32
    from cutlass.cute.nvgpu import tcgen05

    class Sm100Kernel:
        def launch(self, kernel, num_programs, stream, use_pdl: bool = False):
            """The launch of `kernel` (a bound @cute.kernel call): `num_programs` CTAs;
            use_pdl: as a programmatic dependent of the kernel ahead."""
            kernel.launch(grid=[num_programs, 1, 1], block=[self.num_threads, 1, 1],
                          cluster=list(self.cluster_shape), stream=stream, min_blocks_per_mp=1,
                          use_pdl=use_pdl)

        @staticmethod
        def tma_to_mma(mbar, stages: int, tx_count: int):
            """A ring of TMA loads (one thread expects `tx_count` bytes a stage) read by
            the mma warp (its tcgen05.commit frees the slot); `mbar` its barrier storage."""
            one = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
            return pipeline.PipelineTmaUmma.create(
                barrier_storage=mbar.data_ptr(), num_stages=stages, producer_group=one,
                consumer_group=one, tx_count=tx_count, defer_sync=True)

        @staticmethod
        def mma_to(mbar, stages: int, threads: int):
            """A ring of MMA results (a tcgen05.commit of the mma warp completes a stage)
            read by `threads` threads, which hand the stage back."""
            group = pipeline.CooperativeGroup
            return pipeline.PipelineUmmaAsync.create(
                barrier_storage=mbar.data_ptr(), num_stages=stages,
                producer_group=group(pipeline.Agent.Thread, 1),
                consumer_group=group(pipeline.Agent.Thread, threads), defer_sync=True)

        @staticmethod
        def tmem_allocator(storage, barrier_id: int, mma_warp: int):
            """-> (the TMEM allocator of `mma_warp`, the named barrier over warps 0 to
            mma_warp that hands the allocation to its readers and back)."""
            barrier = pipeline.NamedBarrier(barrier_id=barrier_id,
                                            num_threads=32 * (mma_warp + 1))
            tmem = cutlass.utils.TmemAllocator(storage.tmem_holding.ptr,
                                               barrier_for_retrieve=barrier,
                                               allocator_warp_id=mma_warp)
            return tmem, barrier

        @staticmethod
        def tmem_acquire(tmem, barrier, cols: int):
            """The mma warp: allocate `cols` columns, hand them out -> their address."""
            tmem.allocate(cols)
            barrier.arrive_and_wait()
            return tmem.retrieve_ptr(Float32)

        @staticmethod
        def tmem_release(tmem, barrier, ptr):
            """The mma warp: once every reader has arrived, free the allocation."""
            tmem.relinquish_alloc_permit()
            barrier.arrive_and_wait()
            tmem.free(ptr)

        @cute.jit
        def gemm(self, tiled_mma, acc, tA, tB, accumulate):
            """acc (+)= A B over the k-blocks (issued by one thread of the warp)."""
            atom = cute.make_mma_atom(tiled_mma.op)    # a local atom: its field is state
            for kb in cutlass.range_constexpr(cute.size(tA.shape[2])):
                atom.set(tcgen05.Field.ACCUMULATE, accumulate if kb == 0 else True)
                cute.gemm(atom, acc, tA[None, None, kb], tB[None, None, kb], acc)

    return Sm100Kernel
