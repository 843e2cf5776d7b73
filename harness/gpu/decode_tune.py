"""Where KV-cache decode time goes, and which configs / splits read the cache fastest:

    python -m harness.gpu.decode_tune --styles tlx,cute --out decode_tune.csv [--quick]
    python -m harness.gpu.decode_tune --styles tlx,cute --dry-run     # the plan, no GPU

For each style and each cell of CELLS (GQA 32/8, D 128; bf16, or --dtype fp16 / fp8):
1. breakdown at the default config and splits, under CUDA-graph replay: the whole
   `kvcache_attention` call, the style's forward alone (partials allocated once), the
   device value check (`check_inputs_async`) alone, `combine` alone, and the size's
   ceiling: a device copy moving the call's KV bytes, timed the same way (at 100 MB a
   launch and the ramp of the memory system are a visible part of any kernel);
2. sweep: num_splits around the default x the style's configs. Each pair is checked
   against the oracle first (`harness.decode.check`: outputs NaN-poisoned, the harness's
   allowance; a failure is timed no further), then its forward alone and its whole call
   (the core's steps with that config: `check_inputs_async` + `kvcache.run`) are timed
   under graph replay.
One CSV row per (style, cell, config, splits), written and flushed as it is measured;
a summary per cell at the end (default against best call bandwidth). The cute configs
go through each style's `forward(config=...)`.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import os
import sys
import time
from functools import partial

import torch

from harness.decode import DecodeProblem

K = 1024
H200_SMS = 132  # --dry-run's SM count (no device to ask)
# (name, problem): GQA 32/8, D 128, bf16; causal, dense q
_P = lambda **kw: DecodeProblem(**{**dict(heads=32, kv_heads=8, head_dim=128, len_q=1,
                                          dtype="bf16"), **kw}, suite="decode_tune")
CELLS = (
    ("B1 32k contig", _P(batch=1, cache_len=32 * K)),
    ("B1 32k page16", _P(batch=1, cache_len=32 * K, page_size=16)),
    ("B8 32k contig", _P(batch=8, cache_len=32 * K)),
    ("B8 32k page1", _P(batch=8, cache_len=32 * K, page_size=1)),
    ("B64 4k contig", _P(batch=64, cache_len=4 * K)),
    ("B8 32k Lq16 contig", _P(batch=8, cache_len=32 * K, len_q=16)),
)
QUICK = ("B1 32k contig", "B8 32k page1", "B8 32k Lq16 contig")
COLUMNS = ("style", "cell", "config", "num_splits", "is_default", "status", "call_us",
           "kernel_us", "check_us", "combine_us", "call_tbps", "kernel_tbps", "copy_tbps",
           "same_copy_us", "same_copy_tbps")
TLX_GRID = dict(block_n=(32, 64, 128), num_stages=(3, 4, 6), num_warps=(4, 8))
CUTE_GRID = dict(block_n=(64, 128), stages=(3, 4, 6))
SMEM_LIMIT = 227 * 1024  # an H100 / H200 CTA's shared memory


def cells(quick: bool = False, dtype: str = "bf16") -> list[tuple[str, DecodeProblem]]:
    """CELLS (QUICK's only if `quick`) in `dtype` ("fp8": q and cache in e4m3)."""
    return [(name, dataclasses.replace(p, dtype=dtype)) for name, p in CELLS
            if not quick or name in QUICK]


def tile_rows(p: DecodeProblem) -> int:
    from kernels_tlx.decode_hopper import rows_per_tile
    return rows_per_tile(p.heads // p.kv_heads, p.len_q)


def default_splits(p: DecodeProblem, sms: int, style: str = "tlx") -> int:
    """The split count kvcache_attention chooses for `p` with `style`."""
    from jagged.kvcache import choose_splits, style_decode
    rows = p.heads // p.kv_heads * p.len_q
    per_sm = style_decode(style).programs_per_sm(p.head_dim, rows, p.dtype == "fp8")
    return choose_splits(p.batch, p.kv_heads, p.capacity(), sms, rows, per_sm)


def splits_list(default: int) -> list[int]:
    """default / 2, default, 2x, 4x (at least 1, each once), the default first."""
    out = [default]
    for s in (max(1, default // 2), default * 2, default * 4):
        if s not in out:
            out.append(s)
    return out


# ------------------------------------------------------------------ configs per style
def _tlx_default(p: DecodeProblem):
    from kernels_tlx.decode_hopper import pick_config
    paged = object() if p.page_size else None  # pick_config reads only `is None`
    return pick_config(p.head_dim, tile_rows(p), paged, p.page_size or 1, p.elsize())[0]


def _cute_default(p: DecodeProblem):
    from kernels_cute.decode_hopper import pick_config
    return pick_config(p.head_dim, p.heads // p.kv_heads * p.len_q, fp8=p.dtype == "fp8")


def configs(style: str, p: DecodeProblem) -> list:
    """The style's default config of `p` first, then the sweep's (each once). cute: the
    variants whose K / V slots fit shared memory."""
    if style == "tlx":
        from kernels_tlx.decode_hopper import Config
        grid = [Config(bn, st, w) for bn in TLX_GRID["block_n"] for st in TLX_GRID["num_stages"]
                for w in TLX_GRID["num_warps"]]
        base = _tlx_default(p)
    elif style == "cute":
        from kernels_cute.decode_hopper import smem_bytes
        base = _cute_default(p)
        grid = [dataclasses.replace(base, block_n=bn, stages=st)
                for bn in CUTE_GRID["block_n"] for st in CUTE_GRID["stages"]]
        grid = [c for c in grid if smem_bytes(c, p.head_dim, p.elsize()) <= SMEM_LIMIT]
    else:
        raise ValueError(f"style {style!r}: expected tlx or cute")
    return [base] + [c for c in grid if c != base]


def config_name(cfg) -> str:
    if hasattr(cfg, "num_stages"):  # tlx
        return f"n{cfg.block_n}/s{cfg.num_stages}/w{cfg.num_warps}"
    return f"m{cfg.block_m}/n{cfg.block_n}/s{cfg.stages}/wm{cfg.warps_m}/w{cfg.warps}"


def plan(styles, quick: bool, sms: int, defaults_only: bool = False,
         dtype: str = "bf16") -> list[dict]:
    """Every row the run measures, in order (the default pair first in each cell);
    `defaults_only`: the default config alone (at every splits of the list)."""
    rows = []
    for style in styles:
        for name, p in cells(quick, dtype):
            d = default_splits(p, sms, style)
            for ci, cfg in enumerate(configs(style, p)):
                for s in splits_list(d):
                    rows.append(dict(style=style, cell=name, problem=p, cfg=cfg, cfg_index=ci,
                                     num_splits=s, is_default=ci == 0 and s == d))
    return [r for r in rows if r["cfg_index"] == 0] if defaults_only else rows


# ------------------------------------------------------------------ forwards and calls
def style_forward(style: str, cfg, is_default_cfg: bool):
    from jagged import kvcache
    if is_default_cfg:
        return kvcache.style_forward(style)
    return partial(kvcache.style_forward(style), config=cfg)


def core_call(forward):
    """A callable with kvcache_attention's signature (as harness.decode.call uses it)
    doing the core's steps with `forward`: validate, check_inputs_async, run."""
    from jagged import kvcache

    def fn(q, k_cache, v_cache, cache_seqlens, *, page_table=None, cu_seqlens_q=None,
           max_seqlen_q=None, causal=True, softmax_scale=None, num_splits=0,
           return_lse=False, q_descale=None, k_descale=None, v_descale=None, **_):
        B, len_q, cap = kvcache.validate(q, k_cache, v_cache, cache_seqlens, page_table,
                                         cu_seqlens_q, max_seqlen_q, num_splits)
        fp8 = kvcache.validate_descales(q, k_cache, B, q_descale, k_descale, v_descale)
        descale = (kvcache.fill_descales(B, k_cache.shape[2], q.device, q_descale, k_descale,
                                         v_descale) if fp8 else None)
        H, D = q.shape[-2:]
        q3 = q.reshape(-1, H, D)
        scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(D)
        kvcache.check_inputs_async(q3.shape[0], k_cache, cache_seqlens, page_table,
                                   cu_seqlens_q, len_q, cap)
        out, lse = kvcache.run(forward, q3, k_cache, v_cache, cache_seqlens, page_table,
                               cu_seqlens_q, int(len_q), bool(causal), scale, int(num_splits),
                               descale)
        out = out.view(q.shape)
        if not return_lse:
            return out
        if cu_seqlens_q is None:
            lse = lse.view(H, B, len_q).permute(1, 0, 2)
        return out, lse

    return fn


class Parts:
    """The pieces of one call on `inp` at `num_splits`, outputs allocated once (graph
    replay times them without host work)."""

    def __init__(self, inp, p: DecodeProblem, num_splits: int):
        from jagged import kvcache
        self.inp, self.p, self.S = inp, p, num_splits
        self.B, self.len_q, self.cap = kvcache.validate(
            inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens, inp.page_table,
            inp.cu_seqlens_q, inp.max_seqlen_q, num_splits)
        H, D = inp.q.shape[-2:]
        self.q3 = inp.q.reshape(-1, H, D)
        self.scale = 1.0 / math.sqrt(D)
        n = self.q3.shape[0]
        fp8 = kvcache.validate_descales(inp.q, inp.k_cache, self.B, inp.q_descale,
                                        inp.k_descale, inp.v_descale)
        self.descale = (kvcache.fill_descales(self.B, inp.k_cache.shape[2], inp.q.device,
                                              inp.q_descale, inp.k_descale, inp.v_descale)
                        if fp8 else None)
        self.out = torch.empty_like(self.q3, dtype=torch.bfloat16 if fp8 else self.q3.dtype)
        self.lse = torch.empty(H, n, device=inp.q.device, dtype=torch.float32)
        self.o_part = self.lse_part = None
        if num_splits > 1:
            self.o_part = torch.empty(num_splits, n, H, D, device=inp.q.device,
                                      dtype=torch.float32)
            self.lse_part = torch.empty(num_splits, H, n, device=inp.q.device,
                                        dtype=torch.float32)

    def forward(self, fwd):
        i = self.inp
        return lambda: fwd(self.q3, i.k_cache, i.v_cache, i.cache_seqlens, i.page_table,
                           i.cu_seqlens_q, self.out, self.lse, self.o_part, self.lse_part,
                           len_q=self.len_q, causal=self.p.causal, scale=self.scale,
                           num_splits=self.S,
                           **({} if self.descale is None else {"descale": self.descale}))

    def check(self):
        from jagged import kvcache
        i = self.inp
        return lambda: kvcache.check_inputs_async(self.q3.shape[0], i.k_cache, i.cache_seqlens,
                                                  i.page_table, i.cu_seqlens_q, self.len_q,
                                                  self.cap)

    def combine(self):
        from jagged import kvcache
        if self.S <= 1:
            return None
        return lambda: kvcache.combine(self.o_part, self.lse_part, self.out, self.lse)


# ------------------------------------------------------------------ measuring
STICKY = ("illegal memory access", "illegal instruction", "misaligned address",
          "unspecified launch failure", "device-side assert")


def _short(e: Exception) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}"[:160]


def _us(fn, quick: bool) -> float | None:
    from harness import bench
    ms = bench.graph_time_ms(fn, quick)
    return None if ms is None else ms * 1e3


def _fmt(x, nd=4):
    return "" if x is None else f"{x:.{nd}g}"


def measure(row: dict, inp, ref, lowp, quick: bool) -> dict:
    """One CSV row: oracle first, then graph-replay timings."""
    import jagged
    from harness import decode
    style, p, cfg, S = row["style"], row["problem"], row["cfg"], row["num_splits"]
    is_default_cfg = row["cfg_index"] == 0
    fwd = style_forward(style, cfg, is_default_cfg)
    pS = p.replace(num_splits=S)
    call = core_call(fwd)
    rec = dict(status="ok")
    try:
        rep = decode.check(inp, pS, call, check_lse=True, ref=ref, lowp=lowp)
        torch.cuda.synchronize()
    except Exception as e:
        if not any(s in str(e) for s in STICKY):
            torch.cuda.synchronize()
        return dict(status=f"error: {_short(e)}")
    if not rep.ok:
        return dict(status="fail: " + "; ".join(
            f"{c.name} {c.max_err:.2e} > {c.tol:.2e}" for c in rep.checks if not c.ok)[:160])
    kv = p.kv_bytes()
    tb = lambda us: None if us is None else kv / (us * 1e-6) / 1e12
    try:
        parts = Parts(inp, p, S)
        if row["is_default"]:  # the public call itself, splits chosen by the core
            call_fn = lambda: jagged.kvcache_attention(
                inp.q, inp.k_cache, inp.v_cache, inp.cache_seqlens, page_table=inp.page_table,
                causal=p.causal, backend=style)
            rec["check_us"] = _us(parts.check(), quick)
            comb = parts.combine()
            rec["combine_us"] = _us(comb, quick) if comb is not None else None
            # the ceiling at this size: a device copy moving the call's KV bytes (half
            # read, half written), graph-replayed and timed the same way
            src = torch.empty(kv // 2, dtype=torch.uint8, device="cuda").fill_(1)
            dst = torch.empty_like(src)
            rec["same_copy_us"] = _us(lambda: dst.copy_(src), quick)
            rec["same_copy_tbps"] = tb(rec["same_copy_us"])
            del src, dst
        else:
            call_fn = lambda: decode.call(call, inp, pS, return_lse=False)
        rec["kernel_us"] = _us(parts.forward(fwd), quick)
        rec["call_us"] = _us(call_fn, quick)
        del parts
    except Exception as e:
        return dict(status=f"error: {_short(e)}")
    rec["call_tbps"], rec["kernel_tbps"] = tb(rec.get("call_us")), tb(rec.get("kernel_us"))
    if rec["call_us"] is None or rec["kernel_us"] is None:
        rec["status"] = "ok (no graph timing)"
    return rec


def _cells_data(p: DecodeProblem, device: str = "cuda"):
    """The cell's inputs and its fp32 / low-precision references (the oracle's: fp8
    cells on the dequantized values, the low precision bf16)."""
    from harness import decode
    inp = p.build(device)
    ref = decode.reference(inp, causal=p.causal)
    lowp = decode.reference(inp, causal=p.causal, compute_dtype=decode.lowp_dtype(inp))
    return inp, ref, lowp


def summary(rows: list[dict]) -> str:
    """Per (style, cell): the default pair's call TB/s against the best pair's."""
    lines = [f"{'style':5s} {'cell':20s} {'default':>8s} {'best':>8s}  best config / splits"]
    keys = []
    for r in rows:
        if (r["style"], r["cell"]) not in keys:
            keys.append((r["style"], r["cell"]))
    for st, cell in keys:
        mine = [r for r in rows if (r["style"], r["cell"]) == (st, cell)]
        d = next((r for r in mine if r["is_default"]), None)
        ok = [r for r in mine if r["call_tbps"] not in ("", None)]
        best = max(ok, key=lambda r: float(r["call_tbps"]), default=None)
        dv = d["call_tbps"] if d and d["call_tbps"] not in ("", None) else (d or {}).get(
            "status", "-")[:8]
        lines.append(f"{st:5s} {cell:20s} {str(dv):>8s} "
                     f"{(best['call_tbps'] if best else '-'):>8s}  "
                     + (f"{best['config']} / {best['num_splits']}" if best else ""))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m harness.gpu.decode_tune")
    ap.add_argument("--styles", default="tlx", help="comma list of: tlx, cute")
    ap.add_argument("--out", default="decode_tune.csv")
    ap.add_argument("--quick", action="store_true", help=f"only the cells {', '.join(QUICK)}")
    ap.add_argument("--dry-run", action="store_true", help="print the planned rows; no GPU")
    ap.add_argument("--defaults-only", action="store_true",
                    help="only each cell's default config (the splits sweep kept)")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="stop starting rows after this many seconds (0: no limit)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp8"),
                    help="the cells' dtype (fp8: q and cache e4m3 with descales)")
    ap.add_argument("--sms", type=int, default=0,
                    help=f"SM count for the default splits (0: the device's; dry run {H200_SMS})")
    a = ap.parse_args(argv)
    styles = [s for s in a.styles.split(",") if s]
    for s in styles:
        if s not in ("tlx", "cute"):
            ap.error(f"--styles: unknown style {s!r} (tlx, cute)")
    if a.dry_run:
        rows = plan(styles, a.quick, a.sms or H200_SMS, a.defaults_only, a.dtype)
        for r in rows:
            print(f"{r['style']:5s} {r['cell']:20s} rows/tile {tile_rows(r['problem']):3d} "
                  f"{config_name(r['cfg']):24s} splits {r['num_splits']:3d}"
                  + ("  default" if r["is_default"] else ""))
        print(f"{len(rows)} rows")
        return rows
    if not torch.cuda.is_available():
        sys.exit("decode_tune needs a CUDA GPU (--dry-run prints the plan)")
    from harness import bench
    from jagged.arch import num_sms
    sms = a.sms or num_sms(torch.device("cuda"))
    rows = plan(styles, a.quick, sms, a.defaults_only, a.dtype)
    copy = bench.copy_tbps()
    print(f"copy bandwidth {copy:.3f} TB/s; {sms} SMs; {len(rows)} rows", flush=True)
    done, t0 = [], time.perf_counter()
    data_key, data, failed = None, None, {}
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        f.flush()
        for r in rows:
            if a.budget_s and time.perf_counter() - t0 > a.budget_s:
                print(f"--budget-s {a.budget_s:g} spent: {len(rows) - len(done)} rows not run",
                      flush=True)
                break
            if data_key != r["cell"]:
                data = None
                torch.cuda.empty_cache()
                data, data_key = _cells_data(r["problem"]), r["cell"]
            t1 = time.perf_counter()
            build = (r["style"], r["cell"], r["cfg"], r["num_splits"] > 1)  # one compile
            if build in failed:  # a build that did not compile fails at every splits
                rec = dict(status=failed[build])
            else:
                with torch.no_grad():
                    rec = measure(r, *data, quick=True)
                if rec["status"].startswith("error: ") and r["cfg_index"] > 0:
                    failed[build] = rec["status"]
            out = dict(style=r["style"], cell=r["cell"], config=config_name(r["cfg"]),
                       num_splits=r["num_splits"], is_default=r["is_default"],
                       status=rec["status"], copy_tbps=_fmt(copy))
            for c in ("call_us", "kernel_us", "check_us", "combine_us", "same_copy_us"):
                out[c] = _fmt(rec.get(c), 5)
            for c in ("call_tbps", "kernel_tbps", "same_copy_tbps"):
                out[c] = _fmt(rec.get(c))
            w.writerow(out)
            f.flush()
            done.append(out)
            print(f"{out['style']:5s} {out['cell']:20s} {out['config']:24s} "
                  f"S{out['num_splits']:<3} {'*' if r['is_default'] else ' '} "
                  f"call {out['call_us']:>8s} us {out['call_tbps']:>6s} TB/s  "
                  f"kernel {out['kernel_us']:>8s} us {out['kernel_tbps']:>6s} TB/s  "
                  f"check {out['check_us']:>6s} combine {out['combine_us']:>6s}  "
                  f"same-size copy {out['same_copy_us']:>6s} us  "
                  f"{out['status'][:60]}  [{time.perf_counter() - t1:.1f} s]", flush=True)
            if any(s in rec["status"] for s in STICKY):
                print("CUDA context lost: stopping (rows so far are in the CSV)", flush=True)
                print(summary(done))
                os._exit(3)
    print(f"\n{len(done)} rows in {time.perf_counter() - t0:.0f} s -> {a.out}")
    print(summary(done))
    return done


if __name__ == "__main__":
    main()
