"""harness.sass_steps reads a step loop out of SASS: the innermost backward branch whose
range issues wgmmas, its instructions by class, its issue order and its paths past
forward branches."""
from harness.sass_steps import branch_paths, counts, order, parse, step_loops

SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x0 */
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;  /* 0x0 */
        /*0020*/                   WARPGROUP.ARRIVE ;                     /* 0x0 */
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT ; /* 0x0 */
        /*0040*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], R24 ; /* 0x0 */
        /*0050*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;        /* 0x0 */
        /*0060*/                   MUFU.EX2 R5, R6 ;                      /* 0x0 */
        /*0070*/                   FFMA R7, R5, R8, R9 ;                  /* 0x0 */
        /*0080*/                   HGMMA.64x64x16.F32.BF16 R88, R40, gdesc[UR16], R88 ; /* 0x0 */
        /*0090*/              @!P1 BRA 0x10 ;                             /* 0x0 */
        /*00a0*/                   STS [R3], R7 ;                         /* 0x0 */
        /*00b0*/                   BAR.SYNC.DEFER_BLOCKING 0x1, 0x100 ;   /* 0x0 */
        /*00c0*/                   BRA 0x0 ;                              /* 0x0 */
        /*00d0*/                   MUFU.EX2 R5, R6 ;                      /* 0x0 */
        /*00e0*/                   BRA 0xd0 ;                             /* 0x0 */
        /*00f0*/                   EXIT ;                                 /* 0x0 */
"""


def test_parse_reads_ops_and_branch_targets():
    ins = parse(SASS)
    assert len(ins) == 16 and ins[9].op == "BRA" and ins[9].target == 0x10
    assert ins[3].op.startswith("HGMMA") and ins[-1].op == "EXIT"


def test_step_loop_is_the_innermost_loop_with_wgmmas():
    """[0x10, 0x90] nests in [0x0, 0xc0]; [0xd0, 0xe0] has no wgmma."""
    (body,) = step_loops(parse(SASS))
    assert (body[0].addr, body[-1].addr) == (0x10, 0x90)
    c = counts(body)
    assert (c["HGMMA"], c["WARPGROUP"], c["MUFU"], c["FP32"], c["SYNCS"]) == (3, 2, 1, 1, 1)


def test_order_collapses_runs_and_marks_register_operands():
    (body,) = step_loops(parse(SASS))
    assert order(body) == ("SYNCS.PHASECHK.TRANS64.TRYWAIT WARPGROUP.ARRIVE "
                           "HGMMA.64x128x16x2 WARPGROUP.DEPBAR.LE MUFU HGMMA.64x64x16(RS)")


def test_tlx_jobs_name_the_launched_kernels():
    """The compile jobs sass_steps builds TLX's kernels from are the kernels the host
    launches, with the host's own signature and constexprs."""
    from harness.compile_check import tlx_bwd_job, tlx_fwd_job
    from kernels_tlx import bwd_hopper as bw, fwd_hopper as fh
    f = tlx_fwd_job(128, "long", True, False)
    cfg = fh.CONFIGS[(128, "long", True)]
    assert (f["qualname"], f["signature"]) == ("fwd_kernel", fh.signature(cfg, 128, "bf16"))
    assert f["constexprs"] == fh.kernel_args(cfg, 128, True, False)
    b = tlx_bwd_job(64, "long", False, False)
    assert b["qualname"] == "bwd_kernel" and b["constexprs"]["BLOCK_M"] == \
        bw.CONFIGS[(64, "long")].block_m


def test_mma_sync_loops_count_as_steps():
    """A decode's step loop issues mma.sync (HMMA), not wgmma; integer address work is
    its own class."""
    sass = SASS.replace("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT",
                        "HMMA.16816.F32.BF16 R24, R4, R8, RZ") \
        .replace("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], R24", "IMAD R9, R2, 0x80, R3") \
        .replace("HGMMA.64x64x16.F32.BF16 R88, R40, gdesc[UR16], R88", "LDS.U8 R7, [R9]")
    (body,) = step_loops(parse(sass))
    c = counts(body)
    assert (c["HMMA"], c["HGMMA"], c["INT"], c["LDS"]) == (1, 0, 1, 1)


def test_branch_paths_leave_out_what_a_forward_branch_jumps_over():
    """A branch inside the step loop (0x50 -> 0x80) skips 0x60 and 0x70: taken, the step
    runs 7 of the loop's 9 instructions; the loop's own back branch is no path."""
    sass = SASS.replace("WARPGROUP.DEPBAR.LE gsb0, 0x0 ;", "@P2 BRA 0x80 ;")
    (body,) = step_loops(parse(sass))
    assert len(body) == 9 and branch_paths(body) == [7]
    (plain,) = step_loops(parse(SASS))
    assert branch_paths(plain) == []


def test_cute_fp8_decode_converts_without_bf16_packs():
    """CuteDSL's fp8 decode (D 128, 16 rows, bf16 q) converts each thread's 16-byte
    chunks with one LDS.128, e4m3x2 -> f16x2 cvts and two STS.128, and reaches bf16 by
    prmt, not by F2FP.BF16.F32 (a conversion-pipe instruction a pair)."""
    import pytest
    from _cute import have_dsl
    ok, why = have_dsl()
    if not ok:
        pytest.skip(why)
    from harness.sass_steps import build
    loops = step_loops(parse(build("cute", "decode", 128, False, 16, "fp8", "bf16")))
    assert len(loops) == 1
    ops = [x.op for x in loops[0]]
    chunks = 2 * 64 * 128 // 16 // 128          # K and V of a 64-key block, 128 threads
    assert sum(o.startswith("F2FP.F16.E4M3.UNPACK_B") for o in ops) == 8 * chunks
    # only P's packs for P V (16 rows x 16 keys of a key group: 8 fp32 a thread)
    assert sum(o.startswith("F2FP.BF16") for o in ops) == 4
    assert sum(o == "LDS.128" for o in ops) == chunks
    assert sum(o == "STS.128" for o in ops) == 2 * chunks
