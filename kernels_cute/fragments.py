"""Tile and wgmma fragment helpers shared by the CuteDSL forward and backward. Imported
only inside their kernel factories, so importing kernels_cute never loads the DSL."""
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warpgroup


def replaced(bundle, **fields):
    """A NamedTuple bundle with some fields replaced, rebuilt field by field (traced code:
    `_replace`'s lazy rebuild from an iterator loses the fragments' layouts under the
    DSL's loop tracing)."""
    return type(bundle)(*(fields.get(f, getattr(bundle, f)) for f in bundle._fields))


def head_tile(m, row, h, rows, cols, coord=(0, 0)):
    """The (rows, cols) box of head h of a packed [tokens, heads, D] tensor whose first
    row is token `row`; coord (None, 0): every such box from there on, indexed by block."""
    return cute.local_tile(cute.domain_offset((row, 0), m[None, None, h]), (rows, cols), coord)


def element_swizzled(layout, dtype):
    """A smem atom layout (swizzle o 0 o outer) with its swizzle in elements: the atom's
    swizzle counts bytes (it is meant for the pointer, `get_tensor(outer, swizzle=inner)`),
    but a layout's counts elements. S<3,4,3> -> S<3,3,3> for 16 bits. A view through this
    layout addresses the same bytes as the pointer-swizzled one, with the swizzle folded
    into static offsets."""
    sw, log2_bytes = layout.inner, (dtype.width // 8).bit_length() - 1
    return cute.make_composed_layout(
        cute.make_swizzle(sw.num_bits, sw.num_base - log2_bytes, sw.num_shift), 0, layout.outer)


@cute.jit
def store_rows(tiled_copy, t, s, g, rows_left):
    """A smem tile s (rows, cols) -> the gmem box g by thread t of `tiled_copy` (16-byte
    vectors along a row): all loads first, then the stores; rows from rows_left on are
    never written (they belong to the next sequence)."""
    thr = tiled_copy.get_slice(t)
    src = thr.partition_S(s)
    r = cute.make_fragment_like(src)
    cute.autovec_copy(src, r)
    dst = thr.partition_D(g)
    # flat (row, col) coordinates, also where g's rows mode is hierarchical (packed heads)
    crd = thr.partition_S(cute.make_identity_tensor((cute.size(g, mode=[0]),
                                                     cute.size(g, mode=[1]))))
    for i in cutlass.range_constexpr(cute.size(dst, mode=[1])):
        if crd[0, i, 0][0] < rows_left:
            cute.copy(tiled_copy, r[None, i, None], dst[None, i, None])


def tma_tiles(tma_atom, s, g):
    """(smem, gmem) TMA partitions of an smem buffer and a gmem box, one CTA."""
    return cpasync.tma_partition(tma_atom, 0, cute.make_layout(1), cute.group_modes(s, 0, 2),
                                 cute.group_modes(g, 0, 2))


def acc_rows_cols(t):
    """View a wgmma accumulator-shaped tensor ((2, 2, V), MMA_M, MMA_N) as
    (rows, cols) = ((2, MMA_M), (2, V, MMA_N)) so rows can be reduced."""
    shp = t.layout.shape
    cm = cute.make_layout(shp)  # compact col-major over the fragment coordinates
    st = cm.stride
    rc = cute.make_layout(
        ((shp[0][1], shp[1]), (shp[0][0], shp[0][2], shp[2])),
        stride=((st[0][1], st[1]), (st[0][0], st[0][2], st[2])))
    return cute.make_tensor(t.iterator, cute.composition(t.layout, rc))


def acc_as_operand_a(acc):
    """The S accumulator ((2, 2, V), M, N) seen as the register A operand of the
    PV wgmma ((2, 2, 2), M, (V / 2, N)): k16 = two 8-column groups."""
    l = cute.logical_divide(acc.layout, ((None, None, 2), None, None))
    a = cute.make_layout(
        ((l.shape[0][0], l.shape[0][1], l.shape[0][2][0]), l.shape[1],
         (l.shape[0][2][1], l.shape[2])),
        stride=((l.stride[0][0], l.stride[0][1], l.stride[0][2][0]), l.stride[1],
                (l.stride[0][2][1], l.stride[2])))
    return cute.make_tensor(acc.iterator, a)


def wgmma(tiled_mma, acc, tCrA, tCrB, zero_init, wait):
    """acc (+)= A B over the k-blocks of the fragments; wait < 0 leaves it in flight."""
    warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for kb in range(cute.size(tCrA.shape[2])):
        cute.gemm(atom, acc, tCrA[None, None, kb], tCrB[None, None, kb], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
    if wait >= 0:
        warpgroup.wait_group(wait)


def packed_views(mO, mLSE, pack: int):
    """O [n, H, D] and LSE [H, n] as tiles that pack GQA heads index them: row r of KV
    head hk is query row r // pack of head hk * pack + r % pack, so the rows mode is
    (pack, n) with the head stride inside it (jagged.tiles.gqa_pack)."""
    (n, h, d), (sn, sh, sd) = mO.shape, mO.stride
    mO = cute.make_tensor(mO.iterator, cute.make_layout(
        ((pack, n), h // pack, d), stride=((sh, sn), sh * pack, sd)))
    sl = mLSE.stride[0]
    mLSE = cute.make_tensor(mLSE.iterator, cute.make_layout(
        (h // pack, (pack, n)), stride=(sl * pack, (sl, 1))))
    return mO, mLSE


def red_add_v2(ptr, a, b):
    """red.global.add.v2.f32 of (a, b) at gmem ptr (8-byte aligned; traced in a kernel):
    an add whose result no register receives."""
    from cutlass._mlir.dialects import llvm
    llvm.inline_asm(None, [ptr.toint().ir_value(), cutlass.Float32(a).ir_value(),
                           cutlass.Float32(b).ir_value()],
                    "red.global.add.v2.f32 [$0], {$1, $2};", "l,f,f",
                    has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


def bulk_reduce_add_f32(smem_ptr, gmem_ptr, n_bytes: int):
    """cp.reduce.async.bulk .add.f32 of n_bytes (a multiple of 16, both ends 16-byte
    aligned) from smem to gmem, one thread's issue, in the bulk group the caller commits;
    no tensor map: a contiguous run of floats (traced in a kernel)."""
    from cutlass._mlir.dialects import llvm
    llvm.inline_asm(None, [gmem_ptr.toint().ir_value(), smem_ptr.toint().ir_value(),
                           cutlass.Int32(n_bytes).ir_value()],
                    "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;",
                    "l,r,r", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


def flat_copy(threads: int, groups: int):
    """The 16-byte copy of a block-padded dQ partial (Config.dq_flat): `groups` buffers
    of `threads` x 4 floats a chunk, thread t of group g at floats 4 t.. of every chunk
    of buffer g, so a warp's stores (and loads) are 512 contiguous bytes. Over a (n, groups)
    tensor (buffer g: column g) thread t + threads g holds (4, n / (4 threads))."""
    return cute.make_tiled_copy_tv(
        cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32,
                            num_bits_per_copy=128),
        cute.make_layout((threads, groups)), cute.make_layout(4))


def aligned(ptr, align: int):
    """ptr with `align` bytes of alignment assumed (an offset the compiler cannot see is
    a multiple of it, e.g. of a whole block of floats)."""
    return cute.make_ptr(ptr.dtype, ptr.toint(), mem_space=ptr.memspace, assumed_align=align)
