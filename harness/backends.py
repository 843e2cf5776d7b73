"""The backend registry: every implementation and baseline behind one call signature

    fn(q, k, v, cu_q, cu_k, max_q, max_k, *, causal, softmax_scale, broadcast_q)
        -> out  or  (out, lse)      (differentiable w.r.t. q, k, v)

Each `Backend` says whether it is `available()` here and whether it `supports()` a
problem, both as (bool, reason). Decode backends (`kind="decode"`, their own registry,
names may repeat the jagged ones) take `kvcache_attention`'s signature instead:

    fn(q, k_cache, v_cache, cache_seqlens, *, page_table, cu_seqlens_q, max_seqlen_q,
       causal, softmax_scale, num_splits, return_lse, seqlens_host,
       q_descale, k_descale, v_descale) -> out or (out, lse)

(the descales fp32 [B, H_kv] or None, for an fp8 q / cache) and raise
`harness.decode.Unsupported` for a problem they refuse. Bench workers run in their own
process and find a backend again by importing `Backend.module` (which must register it)
and looking its name up, so tests can register fakes from any importable module.

Baselines get what their users would do, and that work is timed with them:
- fp8 problems (forward only; ours take q_descale / k_descale / v_descale): a baseline
  without an fp8 varlen kernel gets q, k, v dequantized to bf16 per call
  (`dequantizing`), FA4 is `unsupported` (its fp8 runs on sm_100 only, and its varlen
  entry takes no descales);
- broadcast_q: Q is expanded over the batch (`expand`, so autograd sums dq);
- GQA: torch SDPA baselines get K/V heads expanded (`repeat_interleave`); FA4 and
  flex take GQA natively;
- padded SDPA: the gather into [B, H, L, D] and the scatter back are timed.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from typing import Callable

import torch

from .problems import Problem


@dataclass
class Backend:
    name: str
    make: Callable[[], Callable]                 # -> fn (imports lazily)
    available: Callable[[], tuple[bool, str]]
    supports: Callable[[Problem], tuple[bool, str]] = lambda p: (True, "")
    module: str = "harness.backends"             # importing it registers this backend
    env: dict = field(default_factory=dict)      # extra environment for its worker
    own: bool = False                            # one of ours (checked with lse too)
    note: str = ""                               # what the report says about it
    kind: str = "jagged"                         # jagged | decode: which registry, which call
    experimental: bool = False                   # run only when named (never in "all")

    def fn(self) -> Callable:
        return self.make()


REGISTRY: dict[str, Backend] = {}
DECODE: dict[str, Backend] = {}
KINDS = {"jagged": REGISTRY, "decode": DECODE}


def register(b: Backend) -> Backend:
    KINDS[b.kind][b.name] = b
    return b


def get(name: str, module: str | None = None, kind: str = "jagged") -> Backend:
    reg = KINDS[kind]
    if name not in reg and module:
        importlib.import_module(module)
    if name not in reg:
        raise KeyError(f"unknown {kind} backend {name!r}; known: {', '.join(reg)}")
    return reg[name]


def names(kind: str = "jagged", experimental: bool = False) -> list[str]:
    """The registered backends of a kind; experimental ones only when asked for."""
    return [n for n, b in KINDS[kind].items() if experimental or not b.experimental]


# ----------------------------------------------------------------------- helpers

def _cuda() -> tuple[bool, str]:
    return (True, "") if torch.cuda.is_available() else (False, "no CUDA GPU")


def _importable(mod: str) -> tuple[bool, str]:
    try:
        importlib.import_module(mod)
        return True, ""
    except Exception as e:  # ImportError, or a broken install raising anything
        return False, f"cannot import {mod}: {type(e).__name__}: {str(e)[:200]}"


def _all(*checks: Callable[[], tuple[bool, str]]) -> Callable[[], tuple[bool, str]]:
    def check():
        for c in checks:
            ok, why = c()
            if not ok:
                return False, why
        return True, ""
    return check


def _expand_q(q, cu_k, broadcast_q):
    """broadcast_q -> packed [B * L_q, H, D] with cu_q = arange * L_q (what users do)."""
    if not broadcast_q:
        return q, None
    B, Lq = cu_k.shape[0] - 1, q.shape[0]
    qx = q.unsqueeze(0).expand(B, *q.shape).reshape(B * Lq, *q.shape[1:])
    cu_q = torch.arange(0, (B + 1) * Lq, Lq, dtype=torch.int32, device=q.device)
    return qx, cu_q


def dequantize_rows(x, descale, cu):
    """e4m3 x [N, heads, D] times descale[b(row), head] (fp32 [B, heads]) in bf16; the
    row's sequence b found on the device (no host sync)."""
    rows = torch.arange(x.shape[0], device=x.device)
    seq = torch.searchsorted(cu[1:].long(), rows, right=True).clamp(max=cu.shape[0] - 2)
    return (x.float() * descale[seq][..., None]).to(torch.bfloat16)


def dequantizing(fn):
    """A bf16 baseline `fn` made to take an fp8 problem as its user would: q, k, v
    dequantized to bf16 per call (timed), then the bf16 call. broadcast_q: the shared q
    is expanded over the batch first (its real values differ per sequence)."""
    def call(q, k, v, cu_q, cu_k, max_q, max_k, *, q_descale, k_descale, v_descale,
             broadcast_q=False, **kw):
        G = q.shape[1] // k.shape[1]
        if broadcast_q:
            q, cu_q = _expand_q(q, cu_k, True)
        q = dequantize_rows(q, q_descale.repeat_interleave(G, 1), cu_q)
        k, v = dequantize_rows(k, k_descale, cu_k), dequantize_rows(v, v_descale, cu_k)
        return fn(q, k, v, cu_q, cu_k, max_q, max_k, broadcast_q=False, **kw)
    return call


def _expand_kv(q, k, v):
    r = q.shape[1] // k.shape[1]
    return (k, v) if r == 1 else (k.repeat_interleave(r, 1), v.repeat_interleave(r, 1))


# -------------------------------------------------------------- our own kernels

def _ours(style: str):
    """One of our styles through the public entry, `jagged.jagged_attention(...,
    backend=style)`: the default call path, as a user makes it."""
    def make():
        import jagged

        def fn(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, softmax_scale=None,
               broadcast_q=False, **descales):
            return jagged.jagged_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal,
                                           softmax_scale=softmax_scale, broadcast_q=broadcast_q,
                                           return_lse=True, backend=style, **descales)
        return fn

    def available():
        ok, why = _importable("jagged")
        if not ok:
            return ok, why
        import jagged
        return jagged.available().get(style, (False, f"jagged has no backend {style!r}"))
    return make, available


def _ours_supports(style: str):
    """fp8 problems only where the style has an fp8 forward for this device's kernels
    (`jagged.dispatch.style_fp8`)."""
    def supports(p: Problem) -> tuple[bool, str]:
        if p.dtype != "fp8":
            return True, ""
        from jagged.dispatch import style_fp8
        ok, why = style_fp8(style)
        return ok, "" if ok else f"jagged: the {style} style has {why}"
    return supports


for _name, _style, _note in (
        ("triton", "portable", "`jagged_attention(backend=\"portable\")`: the plain-Triton "
         "portable kernel (also runs on the CPU under TRITON_INTERPRET=1)"),
        ("tlx", "tlx", "`jagged_attention(backend=\"tlx\")`: Triton + TLX, Hopper "
         "warp-specialized; its tile lists are built on the GPU once per offsets tensor and "
         "reused while it is unchanged (as across a model's layers)"),
        ("cute", "cute", "`jagged_attention(backend=\"cute\")`: CuteDSL, the same algorithm, "
         "roles and tile lists as tlx")):
    _make, _avail = _ours(_style)
    register(Backend(_name, _make, _avail, supports=_ours_supports(_style), own=True,
                     note=_note))


def _experiment(style: str, apply: Callable[[], None]):
    """One of our styles with a kernel experiment applied in its worker process first
    (`apply` changes that process's configs, so it never shares a process with `style`)."""
    make_style, available = _ours(style)

    def make():
        apply()
        return make_style()
    return make, available


# ---------------------------------------------------------------------------- FA4

def _fa4_make():
    from flash_attn.cute import flash_attn_varlen_func

    def fn(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, softmax_scale=None,
           broadcast_q=False):
        if broadcast_q:
            q, cu_q = _expand_q(q, cu_k, True)
        out, _lse = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                           max_seqlen_q=max_q, max_seqlen_k=max_k,
                                           softmax_scale=softmax_scale, causal=causal)
        return out
    return fn


def _fa4_available():
    ok, why = _all(_cuda, lambda: _importable("flash_attn.cute"))()
    if ok and torch.cuda.get_device_capability()[0] < 9:
        return False, "flash-attn-4 needs sm_90 or newer"
    return ok, why


def _fa4_supports(p: Problem):
    if p.dtype == "fp8":
        return False, ("flash-attn-4: fp8 runs on sm_100 only, and its varlen entry takes no "
                       "descales")
    return True, ""


register(Backend("fa4", _fa4_make, _fa4_available, _fa4_supports, note=(
    "flash-attn-4 `flash_attn.cute.flash_attn_varlen_func` (bottom-right causal, native "
    "GQA); broadcast_q: Q expanded over the batch")))


# ------------------------------------------------------------ torch SDPA, padded

def _lengths(cu):
    return (cu[1:] - cu[:-1]).long()


def _pad_index(cu, L, total):
    """[B, L] indices into the packed rows (clamped) and their validity."""
    ar = torch.arange(L, device=cu.device)
    valid = ar[None, :] < _lengths(cu)[:, None]
    idx = (cu[:-1].long()[:, None] + ar[None, :]).clamp(max=max(total - 1, 0))
    return idx, valid


def _pad(x, idx, valid):
    """packed [N, H, D] -> [B, H, L, D], zeros past each sequence's end."""
    return (x[idx] * valid[:, :, None, None].to(x.dtype)).transpose(1, 2)


def _unpad(o, cu, total):
    """[B, H, L, D] -> packed [N, H, D]."""
    B, H, L, D = o.shape
    tok = torch.arange(total, device=o.device)
    b = torch.searchsorted(cu[1:].long(), tok, right=True)
    flat = b * L + tok - cu.long()[b]
    return o.transpose(1, 2).reshape(B * L, H, D)[flat]


def _sdpa_padded(backend_name: str):
    def make():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa
        kind = getattr(SDPBackend, backend_name)

        def fn(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, softmax_scale=None,
               broadcast_q=False):
            k, v = _expand_kv(q, k, v)
            B = cu_k.shape[0] - 1
            iq, vq = (None, None) if broadcast_q else _pad_index(cu_q, max_q, q.shape[0])
            ik, vk = _pad_index(cu_k, max_k, k.shape[0])
            qp = q.unsqueeze(0).expand(B, *q.shape).transpose(1, 2) if broadcast_q else _pad(q, iq, vq)
            kp, vp = _pad(k, ik, vk), _pad(v, ik, vk)
            mask = None
            if not causal and kind == SDPBackend.CUDNN_ATTENTION:
                # mask padded keys; a sequence with no key attends its zero padding,
                # which gives out = 0 and zero gradients instead of NaN
                mask = (vk | (_lengths(cu_k) == 0)[:, None])[:, None, None, :]
            with sdpa_kernel(kind):
                o = sdpa(qp, kp, vp, attn_mask=mask, is_causal=causal, scale=softmax_scale)
            if broadcast_q:
                return o.transpose(1, 2).reshape(B * q.shape[0], *q.shape[1:])
            return _unpad(o, cu_q, q.shape[0])
        return fn
    return make


def _padded_supports(flash: bool):
    def supports(p: Problem):
        lq, lk = p.lengths()
        if p.causal:
            # SDPA's is_causal is top-left aligned; it equals FA's bottom-right one,
            # and never lets a valid query see a padded key, only where lq == lk
            if p.mode == "broadcast_q" or not torch.equal(lq, lk):
                return False, ("torch SDPA is_causal is top-left aligned: correct for jagged "
                               "only when each sequence has len_q == len_k")
            return True, ""
        if flash and int(lk.min()) < p.max_k:
            return False, ("SDPA FLASH takes no attn_mask, so padded keys would enter the "
                           "softmax; correct only when every key length equals max_seqlen_k "
                           "(use sdpa-nested for jagged keys)")
        return True, ""
    return supports


register(Backend("sdpa-cudnn", _sdpa_padded("CUDNN_ATTENTION"), _cuda, _padded_supports(False),
                 note=("torch SDPA, cuDNN backend, on padded [B, H, L, D] (pad + unpad timed); "
                       "non-causal: boolean key-padding mask; causal: is_causal; K/V heads "
                       "expanded for GQA; broadcast_q: Q expanded")))
register(Backend("sdpa-flash", _sdpa_padded("FLASH_ATTENTION"), _cuda, _padded_supports(True),
                 note=("torch SDPA, FLASH backend, on padded tensors (pad + unpad timed); takes "
                       "no mask, so only causal self attention or dense keys are correct")))


# ---------------------------------------------------------- torch SDPA, nested

def _nested_make(kinds: tuple[str, ...]):
    def make():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa
        sel = [getattr(SDPBackend, s) for s in kinds]

        def nt(x, cu, max_len):
            off = cu.long()
            # min_seqlen=1: fn drops empty sequences first
            return torch.nested.nested_tensor_from_jagged(
                x, off, min_seqlen=1, max_seqlen=max_len).transpose(1, 2)

        def fn(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, softmax_scale=None,
               broadcast_q=False):
            q, cu_q = _expand_q(q, cu_k, broadcast_q) if broadcast_q else (q, cu_q)
            k, v = _expand_kv(q, k, v)
            keep = _lengths(cu_q) > 0
            if not bool(keep.all()):  # fused kernels reject empty sequences: drop them
                if bool((_lengths(cu_k)[~keep] > 0).any()):
                    raise ValueError("a sequence with no query has keys; cannot drop it")
                cu_q, cu_k = (torch.cat([c[:1], c[1:][keep]]) for c in (cu_q, cu_k))
            with sdpa_kernel(sel):
                o = sdpa(nt(q, cu_q, max_q), nt(k, cu_k, max_k), nt(v, cu_k, max_k),
                         is_causal=causal, scale=softmax_scale)
            return o.transpose(1, 2).values()
        return fn
    return make


def _nested_supports(cudnn: bool):
    def supports(p: Problem):
        lq, lk = p.lengths()
        if p.causal and (p.mode == "broadcast_q" or not torch.equal(lq, lk)):
            return False, "torch SDPA is_causal is top-left aligned: needs len_q == len_k"
        if bool(((lq == 0) != (lk == 0)).any()):
            return False, ("torch's fused SDPA kernels reject nested tensors with a length-0 "
                           "sequence, and one with queries but no keys cannot be dropped")
        if cudnn and max(int(lq.max()), p.max_seqlen_q) <= 128:
            return False, "torch's cuDNN path for nested tensors needs max_seqlen_q > 128"
        if cudnn and p.head_dim > 128:
            return False, "torch's cuDNN path for nested tensors needs head_dim <= 128"
        return True, ""
    return supports


register(Backend("sdpa-nested", _nested_make(("FLASH_ATTENTION", "EFFICIENT_ATTENTION")), _cuda,
                 _nested_supports(False),
                 note=("torch SDPA on nested jagged tensors (`nested_tensor_from_jagged`), "
                       "FLASH or EFFICIENT backend (torch's own varlen kernels); K/V heads "
                       "expanded for GQA; broadcast_q: Q expanded")))
register(Backend("sdpa-nested-cudnn", _nested_make(("CUDNN_ATTENTION",)), _cuda,
                 _nested_supports(True),
                 note="torch SDPA on nested jagged tensors, cuDNN backend (ragged offsets)"))


# --------------------------------------------------------------- FlexAttention

def _doc_ids(cu, total):
    return torch.searchsorted(cu[1:].long(), torch.arange(total, device=cu.device), right=True)


def document_block_mask(cu_q, cu_k, nq, nk, causal, mask_mod, block=128):
    """A flex BlockMask for packed documents, built from the offsets (no dense mask):
    each query block sees the key blocks of the documents it touches; a key block
    is 'full' (mask_mod skipped) when both blocks sit inside one document and,
    if causal, the whole key block is visible to the block's first query."""
    from torch.nn.attention.flex_attention import BlockMask
    dev = cu_q.device
    nqb, nkb = -(-nq // block), -(-nk // block)
    cq, ck = cu_q.long(), cu_k.long()
    qs = torch.arange(nqb, device=dev) * block
    qe = torch.clamp(qs + block, max=nq) - 1
    d0 = torch.searchsorted(cq[1:], qs, right=True)    # first document of the q block
    d1 = torch.searchsorted(cq[1:], qe, right=True)    # last one
    kb0 = ck[d0] // block
    kb1 = (ck[d1 + 1] + block - 1) // block              # exclusive
    kb1 = torch.maximum(kb1, kb0)
    width = max(int((kb1 - kb0).max()) if nqb else 0, 1)
    cols = kb0[:, None] + torch.arange(width, device=dev)[None, :]
    used = cols < kb1[:, None]
    # full blocks: one document for the q block and the k block
    ks, ke = cols * block, torch.clamp(cols * block + block, max=nk) - 1
    one_doc = (d0 == d1)[:, None] & (ks >= ck[d0][:, None]) & (ke < ck[d0 + 1][:, None])
    if causal:  # the block's first query (bottom-right aligned) sees key ke
        lq, lk = cq[d0 + 1] - cq[d0], ck[d0 + 1] - ck[d0]
        first_vis = (qs - cq[d0]) + lk - lq + ck[d0]     # last visible key (absolute)
        one_doc &= ke <= first_vis[:, None]
    # an empty row list is fine; partial = used & ~full
    full = used & one_doc
    part = used & ~one_doc

    def pack(sel):
        n = sel.sum(1).to(torch.int32)
        order = torch.argsort((~sel).to(torch.int8), dim=1, stable=True)
        idx = torch.gather(cols, 1, order).clamp(max=nkb - 1).to(torch.int32)
        # torch reads the KV extent (and builds the backward's transposed indices) from
        # the last dim, so it must span all nkb key blocks; columns past n are ignored
        idx = torch.nn.functional.pad(idx, (0, nkb - idx.shape[1]))
        return n[None, None], idx[None, None]

    kv_n, kv_idx = pack(part)
    full_n, full_idx = pack(full)
    return BlockMask.from_kv_blocks(kv_n, kv_idx, full_n, full_idx, BLOCK_SIZE=block,
                                    mask_mod=mask_mod, seq_lengths=(nq, nk))


def _pad_to(x, multiple, value):
    n = -(-x.shape[0] // multiple) * multiple
    return torch.nn.functional.pad(x, (0, n - x.shape[0]), value=value)


def _document_mask(cu_q, cu_k, nq, nk, causal):
    """The BlockMask and mask_mod of packed documents (bottom-right causal)."""
    B = cu_k.shape[0] - 1
    # document ids, padded to whole blocks with two different sentinels (B, B + 1)
    # so mask_mod never reads out of bounds and padding never matches
    doc_q = _pad_to(_doc_ids(cu_q, nq), 128, B)
    doc_k = _pad_to(_doc_ids(cu_k, nk), 128, B + 1)
    cq, ck = cu_q.long(), cu_k.long()
    shift = _pad_to((ck[1:] - ck[:-1]) - (cq[1:] - cq[:-1]), B + 1, 0)  # len_k - len_q

    def mask_mod(b, h, qi, ki):
        same = doc_q[qi] == doc_k[ki]
        if not causal:
            return same
        d = doc_q[qi]
        return same & (ki - ck[d] <= qi - cq[d] + shift[d])

    return document_block_mask(cu_q, cu_k, nq, nk, causal, mask_mod)


def _flex_make():
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention
    for knob in ("cache_size_limit", "recompile_limit"):  # many shapes per worker
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 1024)
    import torch._functorch.config as fconfig
    # the sweep times the backward alone with retain_graph=True, which a compiled
    # backward that donates its saved buffers refuses
    if hasattr(fconfig, "donated_buffer"):
        fconfig.donated_buffer = False
    flex = torch.compile(flex_attention)  # default dynamic: new totals reuse the graph

    last = {}  # the BlockMask of the last offsets seen, as a model reuses one across layers

    def block_mask(ident, cu_q, cu_k, nq, nk, causal):
        """Rebuilt only when the caller's offsets tensors (`ident`: the same objects,
        unmodified) or the sizes change."""
        key = (nq, nk, causal) + tuple(t._version for t in ident)
        ref = last.get("ident", ())
        if len(ref) != len(ident) or any(a is not b for a, b in zip(ref, ident)) or last["key"] != key:
            last.clear()  # free the old mask first: a B=1152 one holds gigabytes
            last.update(ident=ident, key=key, bm=_document_mask(cu_q, cu_k, nq, nk, causal))
        return last["bm"]

    def fn(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, softmax_scale=None,
           broadcast_q=False):
        ident = (cu_k,) if broadcast_q else (cu_q, cu_k)
        q, cu_q = _expand_q(q, cu_k, broadcast_q) if broadcast_q else (q, cu_q)
        bm = block_mask(ident, cu_q, cu_k, q.shape[0], k.shape[0], causal)
        o = flex(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                 block_mask=bm, scale=softmax_scale, enable_gqa=q.shape[1] != k.shape[1])
        return o[0].transpose(0, 1)
    return fn


register(Backend("flex", _flex_make, _all(_cuda, lambda: _importable("torch.nn.attention.flex_attention")),
                 env={"GPU_SITE_OFF": "1"},
                 note=("torch FlexAttention (torch.compile'd) over the packed sequence with a "
                       "document mask; the BlockMask is built from the offsets once and reused "
                       "while they stay the same (as across a model's layers; not timed); native GQA; broadcast_q: Q expanded; its worker runs with "
                       "GPU_SITE_OFF=1 so torch's compiler sees the image's own triton")))


# ============================================================== KV-cache decode

def _ours_decode(style: str):
    """`jagged.kvcache_attention(..., backend=style)`: the default call path."""
    def make():
        import jagged

        def fn(q, k_cache, v_cache, cache_seqlens, *, page_table, cu_seqlens_q, max_seqlen_q,
               causal, softmax_scale, num_splits, return_lse, seqlens_host,
               q_descale=None, k_descale=None, v_descale=None):
            return jagged.kvcache_attention(
                q, k_cache, v_cache, cache_seqlens, page_table=page_table,
                cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, causal=causal,
                softmax_scale=softmax_scale, num_splits=num_splits, return_lse=return_lse,
                q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, backend=style)
        return fn

    def available():
        ok, why = _ours(style)[1]()
        if ok:
            import jagged
            if not hasattr(jagged, "kvcache_attention"):
                return False, "jagged has no kvcache_attention"
        return ok, why
    return make, available


for _name, _note in (("tlx", "`kvcache_attention(backend=\"tlx\")`: Triton + TLX decode kernel "
                      "(split-KV, pack-GQA, any page size), the core's combine"),
                     ("cute", "`kvcache_attention(backend=\"cute\")`: the CuteDSL decode kernel, "
                      "same roles")):
    _make, _avail = _ours_decode(_name)
    register(Backend(_name, _make, _avail, own=True, note=_note, kind="decode"))


def _refused(e: Exception) -> bool:
    """An exception by which FA4 refuses a configuration (its asserts, or its DSL's
    compile errors) rather than failing at run time."""
    mod = type(e).__module__ or ""
    return isinstance(e, (AssertionError, NotImplementedError)) or mod.startswith(
        ("cutlass", "flash_attn"))


def _fa4_decode_make():
    from flash_attn.cute import flash_attn_varlen_func

    from .decode import Unsupported

    def fn(q, k_cache, v_cache, cache_seqlens, *, page_table, cu_seqlens_q, max_seqlen_q,
           causal, softmax_scale, num_splits, return_lse, seqlens_host,
           q_descale=None, k_descale=None, v_descale=None):
        if k_cache.dtype == torch.float8_e4m3fn or q.dtype == torch.float8_e4m3fn:
            raise Unsupported("flash-attn-4: fp8 runs on sm_100 only, and its varlen / "
                              "KV-cache entry takes no descales")
        gqa = q.shape[-2] != k_cache.shape[-2]
        try:
            # num_splits 0 (ours: choose) is FA4's default, 1: on sm90 FA4 has no split-KV,
            # and its own chooser (num_splits < 1) would pick a split it then refuses
            out, lse = flash_attn_varlen_func(
                q, k_cache, v_cache, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                seqused_k=cache_seqlens, page_table=page_table, softmax_scale=softmax_scale,
                causal=causal, num_splits=num_splits or 1, pack_gqa=True if gqa else None,
                return_lse=return_lse)
        except Exception as e:
            if _refused(e):
                raise Unsupported(f"flash-attn-4: {type(e).__name__}: {e}") from e
            raise
        return (out, lse) if return_lse else out
    return fn


register(Backend("fa4", _fa4_decode_make, _fa4_available, kind="decode", note=(
    "flash-attn-4 `flash_attn.cute.flash_attn_varlen_func` with `seqused_k` and "
    "`page_table` (its KV-cache path), pack_gqa on for GQA, num_splits 1 (FA4 has no "
    "split-KV on sm90: a cell asking for more splits is `unsupported`)")))


def _sdpa_decode_make():
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def fn(q, k_cache, v_cache, cache_seqlens, *, page_table, cu_seqlens_q, max_seqlen_q,
           causal, softmax_scale, num_splits, return_lse, seqlens_host,
           q_descale=None, k_descale=None, v_descale=None):
        # timed: everything a user of SDPA runs per call. A paged cache is gathered into
        # [B, L, H_kv, D] through the page table (a copy); a contiguous one is a view.
        # L = the longest sequence, which a serving loop knows on the host. An fp8 cache
        # (and q) is dequantized to bf16 (a copy, timed): SDPA has no fp8 kernel.
        L = int(seqlens_host.max()) if len(seqlens_host) else 0
        if page_table is not None:
            ps = k_cache.shape[1]
            idx = page_table[:, :-(-L // ps)].long()
            k, v = (c[idx].flatten(1, 2)[:, :L] for c in (k_cache, v_cache))
        else:
            k, v = k_cache[:, :L], v_cache[:, :L]
        if k.dtype == torch.float8_e4m3fn:  # descales [B, H_kv] over [B, L, H_kv, D]
            k, v = (_dequantize(c, None if ds is None else ds[:, None])
                    for c, ds in ((k, k_descale), (v, v_descale)))
        if q.dtype == torch.float8_e4m3fn:  # per (sequence, kv head); rows of packed q
            sq = None
            if q_descale is not None:
                sq = q_descale.repeat_interleave(q.shape[-2] // k.shape[2], 1)  # [B, H]
                if cu_seqlens_q is not None:
                    rows = torch.arange(q.shape[0], device=q.device)
                    sq = sq[torch.searchsorted(cu_seqlens_q[1:].long(), rows, right=True)]
                else:
                    sq = sq[:, None]
            q = _dequantize(q, sq)
        n_k = cache_seqlens.long()
        if cu_seqlens_q is not None:  # packed rows -> [B, max_q, H, D], zero padded
            cu = cu_seqlens_q.long()
            row = torch.arange(q.shape[0], device=q.device)
            seq = torch.searchsorted(cu[1:], row, right=True)
            pos = row - cu[seq]
            qd = q.new_zeros(len(n_k), max_seqlen_q, *q.shape[1:])
            qd[seq, pos] = q
            n_q = cu[1:] - cu[:-1]
        else:
            qd, n_q = q, torch.full_like(n_k, q.shape[1])
        Lq = qd.shape[1]
        full = bool((seqlens_host == L).all())
        mask = None
        if cu_seqlens_q is not None or not full or (causal and Lq > 1):
            i = torch.arange(Lq, device=q.device)[None, :, None]
            j = torch.arange(L, device=q.device)[None, None, :]
            mask = j < n_k[:, None, None]
            if causal:
                mask = mask & (j <= i + (n_k - n_q)[:, None, None])
            seen = mask.any(-1, keepdim=True)  # rows with no key: attend anything, then 0
            mask = (mask | ~seen)[:, None]
            # torch's GQA kernels take no mask (its math fallback materializes the fp32
            # scores): the heads are expanded for the masked kernel instead
            group = q.shape[-2] // k.shape[2]
            if group > 1:
                k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
        o = sdpa(qd.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                 scale=softmax_scale, enable_gqa=k.shape[2] != q.shape[-2]).transpose(1, 2)
        if mask is not None:
            o = o * seen[..., None].to(o.dtype)  # [B, Lq, 1, 1]
        return o[seq, pos] if cu_seqlens_q is not None else o
    return fn


def _dequantize(x, descale):
    """e4m3 x times descale (broadcast over x's last dim; None: 1) in bf16."""
    x = x.float()
    return (x if descale is None else x * descale[..., None]).to(torch.bfloat16)


def _sdpa_decode_supports(p) -> tuple[bool, str]:
    masked = p.packed_q or p.sparsity < 1 or (p.causal and p.len_q > 1)
    group = p.heads // p.kv_heads
    kv = p.kv_bytes() * (2 if p.dtype == "fp8" else 1)  # fp8: dequantized to bf16
    need = kv * (group if masked else 1) + (p.kv_bytes() if p.page_size else 0)
    if group > 1 and need > 48e9:
        what = "the gathered cache" + (" expanded to H heads" if masked else "")
        return False, f"torch SDPA here needs {what}: {need / 1e9:.0f} GB"
    return True, ""


register(Backend("sdpa", _sdpa_decode_make, _cuda, _sdpa_decode_supports, kind="decode", note=(
    "torch SDPA on the gathered cache, torch picking the kernel: pages gathered through "
    "the table into [B, L, H_kv, D] per call (timed, as a user must), a contiguous cache "
    "as a view; unmasked: `enable_gqa`; a boolean mask for jagged lengths, packed or "
    "causal rows, with the K/V heads expanded for GQA (timed); fp8 cells: q and the "
    "gathered cache dequantized to bf16 per call (timed), SDPA in bf16")))


def _flashinfer_available():
    if importlib.util.find_spec("flashinfer") is None:
        return False, ("flashinfer-python is not installed (it is not in this offline stack; "
                       "its prebuilt kernels would come with flashinfer-cubin)")
    return _all(_cuda, lambda: _importable("flashinfer"))()


def _flashinfer_make():
    import flashinfer

    from .decode import Unsupported
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    plans = {}  # one plan per batch layout, as a model plans once per step for all layers

    def fn(q, k_cache, v_cache, cache_seqlens, *, page_table, cu_seqlens_q, max_seqlen_q,
           causal, softmax_scale, num_splits, return_lse, seqlens_host,
           q_descale=None, k_descale=None, v_descale=None):
        if cu_seqlens_q is not None or q.shape[1] != 1:
            raise Unsupported("flashinfer: only its batch decode (one new row per sequence) "
                              "is wired here")
        if k_cache.dtype == torch.float8_e4m3fn:
            raise Unsupported("flashinfer: its fp8 KV cache takes one scale a tensor, not "
                              "descales per (sequence, KV head)")
        B, H, D = q.shape[0], q.shape[2], q.shape[3]
        ps = k_cache.shape[1]
        table = page_table if page_table is not None else \
            torch.arange(B, dtype=torch.int32, device=q.device)[:, None]
        key = (id(table), table._version, tuple(seqlens_host.tolist()), q.dtype, softmax_scale)
        if key not in plans:
            plans.clear()
            pages = [max(1, -(-int(n) // ps)) for n in seqlens_host]
            indptr = torch.tensor([0] + pages, dtype=torch.int32).cumsum(0).to(torch.int32)
            indices = torch.cat([table[b, :n] for b, n in enumerate(pages)])
            last = torch.tensor([int(n) - (m - 1) * ps for n, m in zip(seqlens_host, pages)],
                                dtype=torch.int32)
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
            w.plan(indptr.to(q.device), indices.to(q.device), last.to(q.device), H,
                   k_cache.shape[2], D, ps, pos_encoding_mode="NONE", q_data_type=q.dtype,
                   kv_data_type=k_cache.dtype, sm_scale=softmax_scale)
            plans[key] = w
        out = plans[key].run(q[:, 0], (k_cache, v_cache))
        return out[:, None]
    return fn


register(Backend("flashinfer", _flashinfer_make, _flashinfer_available, kind="decode", note=(
    "FlashInfer `BatchDecodeWithPagedKVCacheWrapper` (NHD; a contiguous cache as one page "
    "per sequence), planned once per batch layout (not timed)")))
