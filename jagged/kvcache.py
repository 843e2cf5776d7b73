"""KV-cache attention for inference (forward only), FA's `flash_attn_with_kvcache`
conventions:

    out = kvcache_attention(q, k_cache, v_cache, cache_seqlens, *, page_table=None,
                            cu_seqlens_q=None, max_seqlen_q=None, causal=True,
                            softmax_scale=None, num_splits=0, return_lse=False,
                            q_descale=None, k_descale=None, v_descale=None,
                            backend="auto", check_inputs=False)

q: dense [B, L_q, H, D], or packed [total_q, H, D] with int32 cu_seqlens_q [B + 1] and
max_seqlen_q. k_cache / v_cache: contiguous [B, L_max, H_kv, D], or paged
[num_pages, page_size, H_kv, D] with int32 page_table [B, max_pages] (any page size,
pages in any order). cache_seqlens int32 [B]: sequence b holds n_k keys, the last n_q of
them the queries' own. causal is bottom-right: query i of n_q sees key j iff
j <= i + n_k - n_q; a row that sees no key gets out 0 and lse -inf. D 64 or 128, H a
multiple of H_kv. lse fp32: [B, H, L_q] dense, [H, total_q] packed.

dtypes: k_cache and v_cache share one of bf16, fp16, float8_e4m3fn. A bf16 / fp16 cache
takes q of its dtype and gives out of it. An fp8 cache takes an fp8 or a bf16 q and
gives bf16 out, with FA's descales: fp32 contiguous [B, H_kv] on q's device, None
meaning 1; the values are q[b, :, h] * q_descale[b, h // (H / H_kv)],
K[b, j, h_kv] * k_descale[b, h_kv], V likewise with v_descale. q_descale only with an
fp8 q, k_descale / v_descale only with an fp8 cache.

Each style's `decode_hopper.forward` runs one program per (sequence, KV head, split)
with the KV head's whole query group packed into its rows (pack-GQA). An fp8 call
passes it `descale=(q_descale, k_descale, v_descale)`, each missing one filled with
ones, so its kernel reads all three or none; the program scales its logits by
q_descale * k_descale and its output by v_descale (the partials too: the combine is
linear in them). With num_splits > 1 (num_splits=0 chooses from the shapes and the SM
count) every split writes a normalized partial output and its LSE, and `combine`
(jagged/kvcache_kernels.py) merges them in a fixed order, so the result does not
depend on timing.

Launch order: the hardware issues a grid's programs in index order, sequences outermost.
When they exceed one wave (`wants_order`), the programs issued last set the call's end,
and a long sequence among them runs on while most SMs idle. The call then has the value
check write `order` int32 [B], the sequences longest first (a rank per sequence, on the
device, no host sync), and the style's programs at batch coordinate p work on sequence
order[p]. Within one wave every program starts at once: no order is passed.

The call never synchronizes the host: `validate` reads shapes only; the values
(cache_seqlens within the capacity, the page table's used entries inside the pool,
cu_seqlens_q) are checked by a small device kernel whose failed assertion names the
argument and stops the kernels queued behind it. `check_inputs=True` reads them on the
host first and raises a ValueError instead.
"""
from __future__ import annotations

import importlib
from typing import Optional

import torch

from .dispatch import STYLES, constant_result, style_available
from .fp8 import FP8, check_descale, fill_descales
from .kvcache_kernels import check_inputs_async, combine  # noqa: F401  (the core's kernels)
from .validate import HEAD_DIMS, _host_check, default_scale

CACHE_DTYPES = (torch.bfloat16, torch.float16, FP8)

# backend="auto" on Hopper: the first of these that runs. H200, the decode suite at
# 0c19a97, graph replay, KV TB/s TLX / CuteDSL: 64-row tiles (16 query rows x GQA 4)
# B8 32k 4.17 / 3.68, B64 4k 4.11 / 3.54; fp8 B8 32k 3.45 / 2.56, B64 32k 3.87 / 2.72;
# 16-bit single rows within 1 % (pages of 1 4.14 / 4.14).
DECODE_ORDER = ("tlx", "cute")

# num_splits=0: as many splits as keep B * H_kv * row blocks * splits within one wave of
# the style's `decode_hopper.programs_per_sm` programs an SM, with at least MIN_SPLIT_KEYS
# keys a split and at most MAX_SPLITS splits. A second wave (TLX B8 x 8 heads x 5 splits
# = 320 programs over 264 slots: 3.3 TB/s against 4.1 at 2 splits) or short programs
# cost more.
MIN_SPLIT_KEYS = 512
MAX_SPLITS = 64
MAX_TILE_ROWS = 128  # both styles' largest row tile (more packed rows: more row blocks)

# A launch order (`wants_order`) for batches of ORDER_MIN_BATCH to ORDER_MAX_BATCH
# sequences: one sequence has nothing to order; the rank reads every length once a
# sequence (B^2 loads), while past 4096 sequences the grid is 15+ waves even at one KV
# head and two programs an SM (H200: 264 slots), so the last wave's tail is a few
# percent at most.
ORDER_MIN_BATCH = 2
ORDER_MAX_BATCH = 4096


# ------------------------------------------------------------------ host checks
def validate(q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, max_seqlen_q,
             num_splits) -> tuple[int, int, int]:
    """Raise TypeError/ValueError naming the bad argument; return (batch, len_q,
    capacity), capacity being the most keys a sequence can hold. Reads no value."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("cache_seqlens", cache_seqlens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if k_cache.dtype not in CACHE_DTYPES:
        raise TypeError(f"k_cache must be bfloat16, float16 or float8_e4m3fn, got "
                        f"{k_cache.dtype}")
    if v_cache.dtype != k_cache.dtype:
        raise TypeError(f"v_cache must have k_cache's dtype {k_cache.dtype}, got {v_cache.dtype}")
    if k_cache.dtype == FP8:
        if q.dtype not in (FP8, torch.bfloat16):
            raise TypeError(f"q must be float8_e4m3fn or bfloat16 with a float8_e4m3fn cache, "
                            f"got {q.dtype}")
    elif q.dtype != k_cache.dtype:
        raise TypeError(f"q must have the cache's dtype {k_cache.dtype} (a float8_e4m3fn q "
                        f"needs a float8_e4m3fn cache), got {q.dtype}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", cache_seqlens),
                    ("page_table", page_table), ("cu_seqlens_q", cu_seqlens_q)):
        if t is not None and t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache and v_cache must be one 4-D shape ([B, L_max, H_kv, D] or "
                         f"[num_pages, page_size, H_kv, D]), got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    D = q.shape[-1]
    if D not in HEAD_DIMS:
        raise ValueError(f"head_dim {D} (q.shape[-1]) not supported; supported: {HEAD_DIMS}")
    if k_cache.shape[3] != D:
        raise ValueError(f"k_cache head_dim {k_cache.shape[3]} differs from q's {D}")
    H, H_kv = q.shape[-2], k_cache.shape[2]
    if H % H_kv:
        raise ValueError(f"q heads ({H}) must be a multiple of k_cache heads ({H_kv})")
    if cache_seqlens.dtype != torch.int32 or cache_seqlens.dim() != 1:
        raise TypeError(f"cache_seqlens must be 1-D int32 [B], got {cache_seqlens.dtype} "
                        f"{tuple(cache_seqlens.shape)}")
    if not cache_seqlens.is_contiguous():
        raise ValueError("cache_seqlens must be contiguous")
    B = cache_seqlens.shape[0]
    if cu_seqlens_q is None:
        if q.dim() != 4:
            raise ValueError(f"q must be [B, L_q, H, D] (or packed [total_q, H, D] with "
                             f"cu_seqlens_q), got shape {tuple(q.shape)}")
        if q.shape[0] != B:
            raise ValueError(f"q holds {q.shape[0]} sequences, cache_seqlens {B}")
        len_q = q.shape[1]
        if max_seqlen_q is not None and max_seqlen_q != len_q:
            raise ValueError(f"max_seqlen_q={max_seqlen_q} differs from q.shape[1]={len_q}")
    else:
        if q.dim() != 3:
            raise ValueError(f"q must be packed [total_q, H, D] with cu_seqlens_q, got shape "
                             f"{tuple(q.shape)}")
        if not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.dtype != torch.int32 \
                or cu_seqlens_q.dim() != 1 or not cu_seqlens_q.is_contiguous():
            raise TypeError("cu_seqlens_q must be a contiguous 1-D int32 tensor [B + 1]")
        if cu_seqlens_q.shape[0] != B + 1:
            raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries, cache_seqlens "
                             f"{B}: expected {B + 1}")
        if not isinstance(max_seqlen_q, int) or isinstance(max_seqlen_q, bool) or max_seqlen_q < 0:
            raise TypeError(f"max_seqlen_q must be a non-negative int with cu_seqlens_q, got "
                            f"{max_seqlen_q!r}")
        len_q = max_seqlen_q
    if page_table is None:
        if k_cache.shape[0] != B:
            raise ValueError(f"k_cache holds {k_cache.shape[0]} sequences, cache_seqlens {B} "
                             f"(a paged cache needs page_table)")
        capacity = k_cache.shape[1]
    else:
        if not isinstance(page_table, torch.Tensor) or page_table.dtype != torch.int32 \
                or page_table.dim() != 2:
            raise TypeError("page_table must be a 2-D int32 tensor [B, max_pages]")
        if page_table.shape[0] != B:
            raise ValueError(f"page_table has {page_table.shape[0]} rows, cache_seqlens {B}")
        if not page_table.is_contiguous():
            raise ValueError("page_table must be contiguous")
        if k_cache.shape[1] < 1:
            raise ValueError("page_size (k_cache.shape[1]) must be at least 1")
        capacity = page_table.shape[1] * k_cache.shape[1]
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 0:
        raise TypeError(f"num_splits must be a non-negative int (0: chosen), got {num_splits!r}")
    return B, len_q, capacity


def validate_descales(q, k_cache, batch: int, q_descale, k_descale, v_descale) -> bool:
    """Raise TypeError/ValueError naming the bad descale; return whether the call is
    fp8 (q or the cache float8_e4m3fn). A descale is fp32, contiguous, [B, H_kv] on q's
    device, q_descale only with an fp8 q, k_descale / v_descale only with an fp8 cache.
    Reads no value."""
    H_kv = k_cache.shape[2]
    for name, t, fp8 in (("q_descale", q_descale, q.dtype == FP8),
                         ("k_descale", k_descale, k_cache.dtype == FP8),
                         ("v_descale", v_descale, k_cache.dtype == FP8)):
        if t is None:
            continue
        if isinstance(t, torch.Tensor) and not fp8:
            what = "q" if name == "q_descale" else "k_cache / v_cache"
            raise ValueError(f"{name} is only for a float8_e4m3fn {what}, got "
                             f"{q.dtype if name == 'q_descale' else k_cache.dtype}")
        check_descale(name, t, batch, H_kv, q.device)
    return q.dtype == FP8 or k_cache.dtype == FP8


def check_inputs_host(q_rows, k_cache, cache_seqlens, page_table, cu_seqlens_q, max_seqlen_q,
                      capacity):
    """`check_inputs=True`: the values read on the host; a ValueError naming the
    argument and the entry."""
    n = cache_seqlens.cpu().to(torch.int64)
    if len(n) and int(n.min()) < 0:
        raise ValueError(f"cache_seqlens[{int(n.argmin())}] = {int(n.min())} is negative")
    if len(n) and int(n.max()) > capacity:
        b = int(n.argmax())
        where = "page_table.shape[1] * page_size" if page_table is not None else "k_cache.shape[1]"
        raise ValueError(f"cache_seqlens[{b}] = {int(n[b])} exceeds the cache's capacity "
                         f"({where} = {capacity})")
    if page_table is not None:
        pages, page_size = k_cache.shape[0], k_cache.shape[1]
        pt = page_table.cpu().to(torch.int64)
        used = torch.arange(pt.shape[1])[None, :] < (n[:, None] + page_size - 1) // page_size
        bad = used & ((pt < 0) | (pt >= pages))
        if bad.any():
            b, p = (int(i) for i in torch.nonzero(bad)[0])
            raise ValueError(f"page_table[{b}, {p}] = {int(pt[b, p])} is outside the page pool "
                             f"(k_cache.shape[0] = {pages} pages)")
    if cu_seqlens_q is not None:
        _host_check("cu_seqlens_q", cu_seqlens_q, q_rows, max_seqlen_q)


# ------------------------------------------------------------------ splits
def choose_splits(batch: int, kv_heads: int, capacity: int, sms: int,
                  rows: int = 1, per_sm: int = 1) -> int:
    """num_splits from the shapes alone (the lengths live on the device): the most
    that keep the programs within one wave of `per_sm` programs an SM, each split at
    least MIN_SPLIT_KEYS keys of the capacity. rows: a KV head's packed query rows
    (group * L_q); past MAX_TILE_ROWS they take several row blocks, each its own
    program. A split past a sequence's end costs one early exit."""
    programs = max(batch * kv_heads * -(-rows // MAX_TILE_ROWS), 1)
    want = per_sm * sms // programs
    most = max(capacity // MIN_SPLIT_KEYS, 1)
    return max(1, min(want, most, MAX_SPLITS))


def wants_order(batch: int, kv_heads: int, rows: int, num_splits: int, slots: int) -> bool:
    """Whether the call launches its sequences longest first: when its programs (B x
    H_kv x row blocks x splits) exceed one wave of `slots`. Past one wave the programs
    issued last set the end; with the lengths as drawn a long one may start late and
    run alone (H200, B64 32k, lengths at sparsity 0.5: TLX 3.85 TB/s as drawn, 4.42
    sorted longest first)."""
    programs = batch * kv_heads * -(-rows // MAX_TILE_ROWS) * num_splits
    return ORDER_MIN_BATCH <= batch <= ORDER_MAX_BATCH and programs > slots


# ------------------------------------------------------------------ the call
def run(forward, q3, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, len_q: int,
        causal: bool, scale: float, num_splits: int, descale=None, order=None):
    """Outputs of one call of a style's `forward` (q3 [Nq, H, D]; num_splits >= 1
    already chosen; descale None, or (q_descale, k_descale, v_descale) fp32 [B, H_kv]
    each for an fp8 call; order None, or the launch order int32 [B] that
    `check_inputs_async` writes): (out [Nq, H, D], bf16 for an fp8 call, else q's
    dtype; lse [H, Nq])."""
    n_rows, H, D = q3.shape
    out_dtype = torch.bfloat16 if descale is not None else q3.dtype
    out = torch.empty(q3.shape, device=q3.device, dtype=out_dtype)
    lse = torch.empty(H, n_rows, device=q3.device, dtype=torch.float32)
    if n_rows == 0:
        return out, lse
    # a bf16 / fp16 call passes no descale keyword: the forward's default (None)
    kw = dict(len_q=len_q, causal=causal, scale=scale, num_splits=num_splits)
    if descale is not None:
        kw["descale"] = descale
    if order is not None:
        kw["order"] = order
    if num_splits == 1:
        forward(q3, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, out, lse, None,
                None, **kw)
        return out, lse
    n_o = num_splits * n_rows * H * D  # one allocation for both partials (host time)
    part = torch.empty(n_o + num_splits * H * n_rows, device=q3.device, dtype=torch.float32)
    o_part = part[:n_o].view(num_splits, n_rows, H, D)
    lse_part = part[n_o:].view(num_splits, H, n_rows)
    forward(q3, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, None, None, o_part,
            lse_part, **kw)
    combine(o_part, lse_part, out, lse)
    return out, lse


_CHOSEN: dict = {}
_MODULES: dict = {}  # style -> its decode_hopper module


@constant_result
def resolve(backend: str, device_index: int) -> str:
    """The style `backend` names on CUDA device `device_index`; "auto" takes the first
    of DECODE_ORDER that runs there. There is no portable decode kernel: a device
    where neither style runs gets a RuntimeError saying why."""
    key = (backend, device_index)
    hit = _CHOSEN.get(key)
    if hit is not None:
        return hit
    if device_index < 0:
        raise RuntimeError("kvcache_attention runs on CUDA tensors (the cute or tlx style)")
    whys = []
    for cand in DECODE_ORDER if backend == "auto" else (backend,):
        ok, why = style_available(cand, device_index, archs=("hopper",))
        if ok:
            style_forward(cand)
            _CHOSEN[key] = cand
            return cand
        whys.append(f"{cand}: {why}")
    raise RuntimeError(f"kvcache_attention(backend={backend!r}) cannot run here: " + "; ".join(whys))


_SLOTS: dict = {}  # (style, device index, head_dim, rows, fp8) -> programs in one wave


@constant_result
def wave_slots(name: str, device_index: int, head_dim: int, rows: int, fp8: bool) -> int:
    """Programs of style `name` that run at once on CUDA device `device_index`: its
    programs_per_sm for the tile times the SM count; one on the CPU (-1: the Triton
    interpreter runs one program at a time)."""
    if device_index < 0:
        return 1
    key = (name, device_index, head_dim, rows, fp8)
    n = _SLOTS.get(key)
    if n is None:
        from .arch import num_sms
        n = _SLOTS[key] = style_decode(name).programs_per_sm(head_dim, rows, fp8) * \
            num_sms(torch.device("cuda", device_index))
    return n


@constant_result
def auto_splits(name: str, batch: int, kv_heads: int, capacity: int, device_index: int,
                head_dim: int, rows: int, fp8: bool) -> int:
    from .arch import num_sms
    per_sm = style_decode(name).programs_per_sm(head_dim, rows, fp8)
    return choose_splits(batch, kv_heads, capacity, num_sms(torch.device("cuda", device_index)),
                         rows, per_sm)


def style_decode(name: str):
    """Style `name`'s decode module (`forward`, `programs_per_sm`)."""
    mod = _MODULES.get(name)
    if mod is None:
        mod = _MODULES[name] = importlib.import_module(STYLES[name][0] + ".decode_hopper")
    return mod


def style_forward(name: str):
    return style_decode(name).forward


def _make_op(name: str):
    """The torch.library op of style `name` (what torch.compile traces). Registered at
    import: defining an op inside a traced function would break the graph."""

    @torch.library.custom_op(f"jagged_attn::kvcache_{name}", mutates_args=())
    def op(q3: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           cache_seqlens: torch.Tensor, page_table: Optional[torch.Tensor],
           cu_seqlens_q: Optional[torch.Tensor], len_q: int, causal: bool, scale: float,
           num_splits: int, capacity: int, ordered: bool, q_descale: Optional[torch.Tensor],
           k_descale: Optional[torch.Tensor], v_descale: Optional[torch.Tensor]
           ) -> tuple[torch.Tensor, torch.Tensor]:
        order = launch_order(cache_seqlens, ordered)
        check_inputs_async(q3.shape[0], k_cache, cache_seqlens, page_table, cu_seqlens_q,
                           len_q, capacity, order)
        descale = None if q_descale is None else (q_descale, k_descale, v_descale)
        return run(style_forward(name), q3, k_cache, v_cache, cache_seqlens, page_table,
                   cu_seqlens_q, len_q, causal, scale, num_splits, descale, order)

    @op.register_fake
    def _(q3, k_cache, *rest):
        fp8 = q3.dtype == FP8 or k_cache.dtype == FP8
        return (q3.new_empty(q3.shape, dtype=torch.bfloat16 if fp8 else q3.dtype),
                q3.new_empty(q3.shape[1], q3.shape[0], dtype=torch.float32))

    return op


_OPS = {name: _make_op(name) for name in ("cute", "tlx")}


def launch_order(cache_seqlens, ordered: bool):
    """The buffer the value check writes the launch order into, or None (index order)."""
    if not ordered:
        return None
    return torch.empty(cache_seqlens.shape, device=cache_seqlens.device, dtype=torch.int32)


def kvcache_attention(q, k_cache, v_cache, cache_seqlens, *, page_table=None,
                      cu_seqlens_q=None, max_seqlen_q=None, causal=True, softmax_scale=None,
                      num_splits=0, return_lse=False, q_descale=None, k_descale=None,
                      v_descale=None, backend="auto", check_inputs=False):
    B, len_q, capacity = validate(q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q,
                                  max_seqlen_q, num_splits)
    fp8 = validate_descales(q, k_cache, B, q_descale, k_descale, v_descale)
    if torch.is_grad_enabled() and (q.requires_grad or k_cache.requires_grad
                                    or v_cache.requires_grad):
        raise RuntimeError("kvcache_attention is forward only: call it under torch.no_grad() "
                           "or with tensors that do not require grad")
    if backend not in ("auto", "cute", "tlx"):
        raise ValueError(f"backend={backend!r}: expected 'auto', 'cute' or 'tlx'")
    name = resolve(backend, q.device.index if q.is_cuda else -1)
    H, D = q.shape[-2], q.shape[-1]
    q3 = q.reshape(-1, H, D)
    if check_inputs:
        check_inputs_host(q3.shape[0], k_cache, cache_seqlens, page_table, cu_seqlens_q,
                          len_q, capacity)
    scale = default_scale(D, softmax_scale)
    rows = H // k_cache.shape[2] * len_q
    if num_splits == 0:
        num_splits = auto_splits(name, B, k_cache.shape[2], capacity, q.device.index, D, rows,
                                 fp8)
    ordered = wants_order(B, k_cache.shape[2], rows, num_splits,
                          wave_slots(name, q.device.index if q.is_cuda else -1, D, rows, fp8))
    descale = fill_descales(B, k_cache.shape[2], q.device, q_descale, k_descale,
                            v_descale) if fp8 else None
    args = (q3, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, int(len_q),
            bool(causal), scale, int(num_splits))
    if torch.compiler.is_compiling():
        out, lse = _OPS[name](*args, capacity, ordered, *(descale or (None, None, None)))
    else:
        order = launch_order(cache_seqlens, ordered)
        check_inputs_async(q3.shape[0], k_cache, cache_seqlens, page_table, cu_seqlens_q,
                           len_q, capacity, order)
        out, lse = run(style_forward(name), *args, descale, order)
    out = out.view(q.shape)
    if not return_lse:
        return out
    if cu_seqlens_q is None:  # [H, B * L_q] -> [B, H, L_q]
        lse = lse.view(H, B, len_q).permute(1, 0, 2)
    return out, lse
