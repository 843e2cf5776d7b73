"""Compile-only check for any Triton / TLX kernel; no GPU needed.

    rep = compile_kernel(fn, signature={"x": "*bf16", "n": "i32", "desc": "tensordesc<bf16[64,128]>"},
                         constexprs={"BLOCK": 128}, arch=90, num_warps=4)
    rep.smem_bytes, rep.registers, rep.spill_bytes, rep.local_bytes, rep.stack_bytes,
    rep.has_mma, rep.mma_count

`arch` 90 compiles for sm_90a (Hopper, looks for `wgmma`), 100 for sm_100a
(Blackwell, looks for `tcgen05.mma`). Resource usage comes from `cuobjdump
--dump-resource-usage` on the cubin (the one that ships with Triton), spills from
counting local-memory loads/stores (LDL/STL) in the SASS.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

MMA_PATTERNS = {90: r"\bwgmma\.mma_async", 100: r"\btcgen05\.mma", 103: r"\btcgen05\.mma"}
MMA_NAMES = {90: "wgmma", 100: "tcgen05", 103: "tcgen05"}
from jagged.arch import SMEM_LIMIT  # noqa: F401  (re-exported for the checks)


@dataclass
class CompileReport:
    name: str
    arch: int
    smem_bytes: int       # dynamic shared memory Triton asks for at launch
    static_smem_bytes: int  # from cuobjdump SHARED
    registers: int        # per thread, kernel-level (before any setmaxnreg)
    stack_bytes: int
    local_bytes: int
    spill_insts: int      # LDL + STL instructions in the SASS
    mma: str              # "wgmma" or "tcgen05"
    mma_count: int        # MMA instructions in the PTX
    num_warps: int
    setmaxnreg: tuple     # the distinct register counts passed to setmaxnreg
    ptx_lines: int
    mma_wait0: int        # wgmma.wait_group 0 in the PTX (a wait for every wgmma in flight)
    ttgir: str = dataclasses.field(default="", repr=False)  # for tests that read the IR
    ptx: str = dataclasses.field(default="", repr=False)
    sass: str = dataclasses.field(default="", repr=False)  # cuobjdump -sass of the cubin

    @property
    def has_mma(self) -> bool:
        return self.mma_count > 0

    @property
    def spills(self) -> bool:
        return self.spill_insts > 0 or self.local_bytes > 0 or self.stack_bytes > 0

    @property
    def total_smem(self) -> int:
        return self.smem_bytes + self.static_smem_bytes

    def fits(self) -> bool:
        return self.total_smem <= SMEM_LIMIT.get(self.arch, 227 * 1024)

    def row(self) -> str:
        return (f"{self.name:28s} sm_{self.arch}: smem {self.total_smem / 1024:6.1f} KB  "
                f"regs {self.registers:3d}  setmaxnreg {list(self.setmaxnreg)}  "
                f"{self.mma} x{self.mma_count}  spill-insts {self.spill_insts}  "
                f"local {self.local_bytes}  stack {self.stack_bytes}")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _tool(name: str) -> str:
    import triton
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    return path if os.path.exists(path) else name


def sass_of(cubin_path: str) -> str:
    """cuobjdump -sass of a cubin file (Triton's bundled cuobjdump)."""
    return subprocess.run([_tool("cuobjdump"), "-sass", cubin_path], check=True,
                          capture_output=True, text=True).stdout


def _resource_usage(cubin: bytes) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", path],
                               check=True, capture_output=True, text=True).stdout
        sass = sass_of(path)
    finally:
        os.remove(path)
    out = {}
    for key in ("REG", "STACK", "SHARED", "LOCAL"):
        m = re.search(rf"\b{key}:(\d+)", usage)
        out[key] = int(m.group(1)) if m else 0
    out["spill_insts"] = len(re.findall(r"\b(?:LDL|STL)(?:\.\w+)*\b", sass))
    out["sass"] = sass
    return out


def compile_kernel(fn, signature: dict, constexprs: dict | None = None, arch: int = 90,
                   num_warps: int = 4, num_stages: int = 1, name: str | None = None,
                   **opts) -> CompileReport:
    """Compile `fn` (a @triton.jit function) for sm_{arch}a and report its resources.

    `signature` maps every non-constexpr argument to a Triton type string ("*bf16",
    "i32", "fp32", "tensordesc<bf16[64,128]>"); `constexprs` maps the rest to values
    (constexpr arguments may also appear in `signature` as "constexpr").

    Under TRITON_INTERPRET=1 (the CPU test default) @triton.jit makes interpreter
    objects that cannot be compiled; the kernel is then compiled in a subprocess that
    re-imports its module with the interpreter off."""
    import triton
    from triton.backends.compiler import GPUTarget

    if not isinstance(fn, triton.runtime.JITFunction):
        return _compile_in_subprocess(fn, signature, constexprs, arch, num_warps,
                                      num_stages, name, opts)

    constexprs = dict(constexprs or {})
    sig = dict(signature)
    for k in constexprs:
        sig.setdefault(k, "constexpr")
    # as a launch with 16-byte aligned tensors specializes: pointers divisible by 16 (it
    # changes vectorization and register allocation, so spill counts match a real launch)
    attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]]
             for k, t in sig.items() if t.startswith("*")}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    target = GPUTarget("cuda", arch, 32)
    options = dict(num_warps=num_warps, num_stages=num_stages, **opts)
    kernel = triton.compile(src, target=target, options=options)
    ptx = kernel.asm["ptx"]
    usage = _resource_usage(kernel.asm["cubin"])
    regs = tuple(sorted({int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}))
    return CompileReport(
        name=name or fn.__name__, arch=arch,
        smem_bytes=int(kernel.metadata.shared), static_smem_bytes=usage["SHARED"],
        registers=usage["REG"], stack_bytes=usage["STACK"], local_bytes=usage["LOCAL"],
        spill_insts=usage["spill_insts"], mma=MMA_NAMES.get(arch, "mma"),
        mma_count=len(re.findall(MMA_PATTERNS.get(arch, r"\bmma\."), ptx)),
        num_warps=num_warps, setmaxnreg=regs, ptx_lines=ptx.count("\n"),
        mma_wait0=len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+0;", ptx)),
        ttgir=kernel.asm.get("ttgir", ""), ptx=ptx, sass=usage["sass"])


def _compile_in_subprocess(fn, signature, constexprs, arch, num_warps, num_stages, name, opts):
    import pickle
    import sys
    py = getattr(fn, "fn", fn)
    job = dict(module=py.__module__, qualname=py.__qualname__, signature=signature,
               constexprs=constexprs, arch=arch, num_warps=num_warps, num_stages=num_stages,
               name=name or py.__name__, opts=opts)
    env = dict(os.environ, TRITON_INTERPRET="0")
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
    code = ("import pickle, sys, importlib; from harness.compile_check import _run_job; "
            "sys.stdout.buffer.write(pickle.dumps(_run_job(pickle.loads(sys.stdin.buffer.read()))))")
    res = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(job), env=env,
                         capture_output=True)
    if res.returncode != 0:
        raise RuntimeError(f"compiling {job['name']} in a subprocess failed:\n"
                           f"{res.stderr.decode(errors='replace')[-4000:]}")
    return pickle.loads(res.stdout)


def _run_job(job: dict) -> CompileReport:
    import importlib
    obj = importlib.import_module(job["module"])
    for part in job["qualname"].split("."):
        obj = getattr(obj, part)
    return compile_kernel(obj, job["signature"], job["constexprs"], arch=job["arch"],
                          num_warps=job["num_warps"], num_stages=job["num_stages"],
                          name=job["name"], **job["opts"])


def tlx_bwd_job(d, bucket, causal, bq, dt="bf16", H=4, HKV=2, windows=False,
                parts=1, head_run=1) -> dict:
    """A `_run_job` job: the TLX backward's main kernel as `backward` launches it (bucket:
    a key of its CONFIGS; windows: over key windows, its window_config; parts: programs a
    tile, jagged.tiles.bwd_parts, dK / dV then fp32 accumulators; head_run: list entries a
    KV head in turn, jagged.tiles.bwd_head_run)."""
    from jagged.tiles import bwd_dynamic
    from kernels_tlx import bwd_hopper as bw
    cfg = bw.window_config(d) if windows else bw.CONFIGS[(d, bucket)]
    bm, bnc = cfg.block_m, bw.BLOCK_N // bw.NUM_CONSUMERS.value
    sig = {"q_desc": f"tensordesc<{dt}[{bm},{d}]>", "k_desc": f"tensordesc<{dt}[{bnc},{d}]>",
           "v_desc": f"tensordesc<{dt}[{bnc},{d}]>", "do_desc": f"tensordesc<{dt}[{bm},{d}]>",
           "lse_ptr": "*fp32", "delta_ptr": "*fp32",
           "dq_desc": f"tensordesc<fp32[{bw.dq_rows(bm)},{bw.dq_cols(d)}]>",
           "dk_ptr": f"*{'fp32' if parts > 1 else dt}",
           "dv_ptr": f"*{'fp32' if parts > 1 else dt}"}
    sig.update({n: "*i32" for n in ("cu_q_ptr", "cu_k_ptr", "tile_b_ptr", "tile_n_ptr",
                                    "n_tiles_ptr", "sched_ptr")})
    sig.update(scale="fp32", L_q="i32", n_slots="i32", stride_k_tok="i32", stride_k_h="i32",
               stride_lse_h="i32", col_rows="constexpr",  # None: not over key windows
               dq_ptr="constexpr")
    const = dict(H=H, HKV=HKV, D=d, BLOCK_M=cfg.block_m, BLOCK_N=bw.BLOCK_N, CAUSAL=causal,
                 BROADCAST_Q=bq, DQ_COLS=bw.dq_cols(d),
                 DYNAMIC=bwd_dynamic(bq) and not windows,
                 KV_STAGES=cfg.kv_stages, Q_LOOP_STAGES=cfg.num_stages, WINDOWS=windows,
                 SDP_TOGETHER=bw.sdp_together(cfg, bq), PARTS=parts, HEAD_RUN=head_run)
    if windows:  # with each key column's query rows (bw.window_rows) and dQ (_store_dq)
        sig.update(col_rows="*i32", dq_ptr=f"*{dt}")
    else:
        const.update(col_rows=None, dq_ptr=None)
    return dict(module=bw.__name__, qualname="bwd_kernel", signature=sig,
                constexprs=const, arch=90, num_warps=4, num_stages=cfg.num_stages,
                name=f"bwd D{d} {'windows' if windows else bucket} "
                     f"{'causal' if causal else 'full'} {'bq' if bq else 'packed'} {dt}"
                     f"{f' parts {parts}' if parts > 1 else ''}"
                     f"{f' run {head_run}' if head_run > 1 else ''}",
                opts={})


def tlx_fwd_job(d, bucket, causal, bq, dt="bf16") -> dict:
    """A `_run_job` job: the TLX Hopper forward as `forward` launches it (bucket: a key of
    its CONFIGS)."""
    from kernels_tlx import fwd_hopper as fh
    cfg = fh.CONFIGS[(d, bucket, causal)]
    return dict(module=fh.__name__, qualname="fwd_kernel", signature=fh.signature(cfg, d, dt),
                constexprs=fh.kernel_args(cfg, d, causal, bq), arch=90, num_warps=4,
                num_stages=1, opts={},
                name=f"fwd D{d} {bucket} {'causal' if causal else 'full'}"
                     f"{' bq' if bq else ''} {dt}")
