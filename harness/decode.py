"""KV-cache decode: problems, the oracle and the `decode` suite.

A `DecodeProblem` is a frozen description of one `kvcache_attention` call (batch, heads,
head dim, cache length, new query rows, page size, splits, dtype, seed); `build()` turns
it into the call's tensors, deterministically per seed: a contiguous cache
`[B, L_max, H_kv, D]`, or a pool of pages `[num_pages, page_size, H_kv, D]` a little
larger than the sequences need, their pages in shuffled order, with an int32 page table.

The oracle gathers each sequence's keys through the page table and computes in fp32
(fp64 on the CPU), bottom-right causal within the new rows; a row that sees no key has
out 0, lse -inf. A result passes when its error is at most 2x PyTorch's own in the input
dtype plus a floor (`harness.oracle.compare`), with the outputs' memory NaN-poisoned
before the checked call.

fp8 (`dtype="fp8"`): q, K and V in float8_e4m3fn, drawn in bf16 and quantized per
(sequence, KV head) with descale = amax / 448 (fp32 [B, H_kv], passed as q_descale,
k_descale, v_descale); out is bf16. The oracle computes on the dequantized values and
the allowance is 2x PyTorch's error in bf16 on them; the K / V bytes count 1 a value.

The suite is a few sweeps around one base cell (GQA 32/8, D 128, one new row, a
contiguous cache), not their cross product: `SWEEPS` names them and `cells()` lists
their cells once each, ordered so cells sharing a kernel build run one after another.

`harness.bench.run_decode_problem` (inside a bench worker) gates a cell with the oracle at
a cut size, then times it at full size.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from . import oracle
from .fp8 import FP8, quantize
from .problems import DTYPES as JAGGED_DTYPES
from .problems import causal_pairs, jagged_lengths, offsets

MAX_CACHE_GB = 40.0       # suite cells holding more K + V than this are left out
GATE_MAX_BATCH = 16       # the correctness gate's cut of a timed cell
GATE_MAX_CACHE = 8192
DTYPES = {**JAGGED_DTYPES, "fp8": FP8}  # "fp8": q, K and V in e4m3 with descales


class Unsupported(Exception):
    """A backend refuses this problem (its own message); the row is `unsupported`."""


@dataclass(frozen=True)
class DecodeInputs:
    q: torch.Tensor                    # dense [B, L_q, H, D] or packed [total_q, H, D]
    k_cache: torch.Tensor              # [B, L_max, H_kv, D] or [num_pages, page_size, H_kv, D]
    v_cache: torch.Tensor
    cache_seqlens: torch.Tensor        # int32 [B]
    page_table: torch.Tensor | None    # int32 [B, max_pages]
    cu_seqlens_q: torch.Tensor | None  # int32 [B + 1], packed q only
    max_seqlen_q: int | None           # packed q only
    lengths_q: torch.Tensor            # int64 on the CPU: new rows per sequence
    lengths_k: torch.Tensor            # int64 on the CPU: cached keys per sequence
    q_descale: torch.Tensor | None = None  # fp8: fp32 [B, H_kv] each (None: 1)
    k_descale: torch.Tensor | None = None
    v_descale: torch.Tensor | None = None

    @property
    def page_size(self) -> int:
        return self.k_cache.shape[1] if self.page_table is not None else 0

    def args(self):
        return self.q, self.k_cache, self.v_cache, self.cache_seqlens

    @property
    def fp8(self) -> bool:
        return self.k_cache.dtype == FP8 or self.q.dtype == FP8

    @property
    def out_dtype(self) -> torch.dtype:
        """bf16 for an fp8 call, else q's dtype."""
        return torch.bfloat16 if self.fp8 else self.q.dtype

    def kwargs(self) -> dict:
        """Every decode backend's keywords besides causal / scale / splits / return_lse.
        `seqlens_host` is what a serving loop keeps on the host anyway (baselines that
        plan on the host read it; ours do not)."""
        return dict(page_table=self.page_table, cu_seqlens_q=self.cu_seqlens_q,
                    max_seqlen_q=self.max_seqlen_q, seqlens_host=self.lengths_k,
                    q_descale=self.q_descale, k_descale=self.k_descale,
                    v_descale=self.v_descale)


@dataclass(frozen=True)
class DecodeProblem:
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    cache_len: int                 # keys cached per sequence (the most, with sparsity < 1)
    len_q: int = 1                 # new query rows per sequence (the most, with packed_q)
    page_size: int = 0             # 0: contiguous cache
    dtype: str = "bf16"
    causal: bool = True
    packed_q: bool = False         # q packed with cu_seqlens_q, 1..len_q rows per sequence
    num_splits: int = 0            # 0: the implementation chooses
    sparsity: float = 1.0          # cache lengths with mean sparsity * cache_len (1: all full)
    seed: int = 0
    suite: str = ""

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} not a multiple of kv_heads={self.kv_heads}")
        if self.page_size < 0 or self.len_q < 1 or self.cache_len < 0 or self.num_splits < 0:
            raise ValueError(f"bad sizes in {self}")

    @property
    def hkv(self) -> int:
        return self.kv_heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def replace(self, **kw) -> "DecodeProblem":
        return dataclasses.replace(self, **kw)

    def label(self) -> str:
        bits = ["decode", f"B{self.batch}", f"H{self.heads}/{self.kv_heads}", f"D{self.head_dim}",
                f"Lq{self.len_q}", f"Lk{self.cache_len}",
                f"p{self.page_size}" if self.page_size else "contig", f"s{self.sparsity:g}",
                self.dtype, f"splits{self.num_splits}" if self.num_splits else "splits-auto"]
        bits += ["packed"] if self.packed_q else []
        return " ".join(bits + (["causal"] if self.causal else []))

    def lengths(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(new rows, cached keys) per sequence, int64 on the CPU; deterministic per seed.
        Keys include the new rows' own, so n_k >= n_q."""
        gen = torch.Generator().manual_seed(self.seed)
        if self.packed_q:
            lq = torch.randint(1, self.len_q + 1, (self.batch,), generator=gen, dtype=torch.int64)
        else:
            lq = torch.full((self.batch,), self.len_q, dtype=torch.int64)
        lk = jagged_lengths(self.batch, self.cache_len, self.sparsity, gen) if self.cache_len \
            else torch.zeros(self.batch, dtype=torch.int64)
        return lq, torch.maximum(lk, lq) if self.cache_len else lk

    def capacity(self, lk: torch.Tensor | None = None) -> int:
        """Keys one sequence can hold: the contiguous cache's L_max, or a table row's
        pages times the page size."""
        lk = self.lengths()[1] if lk is None else lk
        n = max(self.cache_len, int(lk.max()) if len(lk) else 0)
        return n if not self.page_size else -(-n // self.page_size) * self.page_size

    def pool_pages(self, lk: torch.Tensor) -> int:
        """Pages the pool holds: those the sequences use plus 1/16 spare (at least 2)."""
        used = int(sum(-(-int(n) // self.page_size) for n in lk))
        return used + max(2, used // 16)

    def elsize(self) -> int:
        return torch.empty(0, dtype=self.torch_dtype).element_size()

    def kv_bytes(self) -> int:
        """K and V bytes a call must read: sum_b n_k(b) * H_kv * D * 2 tensors * dtype size."""
        return int(self.lengths()[1].sum()) * self.kv_heads * self.head_dim * 2 * self.elsize()

    def cache_bytes(self) -> int:
        """K and V bytes the cache holds (the contiguous cache or the whole pool)."""
        lk = self.lengths()[1]
        tokens = (self.batch * self.capacity(lk) if not self.page_size
                  else self.pool_pages(lk) * self.page_size)
        return tokens * self.kv_heads * self.head_dim * 2 * self.elsize()

    def pairs(self) -> int:
        lq, lk = self.lengths()
        return int((causal_pairs(lq, lk) if self.causal else lq * lk).sum())

    def flops(self, pass_: str = "fwd") -> float:
        return 4.0 * self.heads * self.head_dim * self.pairs()

    def gate(self, max_batch: int = GATE_MAX_BATCH) -> "DecodeProblem":
        """The same layout, splits and rows at a size the fp32 reference handles."""
        return self.replace(batch=max(1, min(self.batch, max_batch)),
                            cache_len=min(self.cache_len, GATE_MAX_CACHE))

    def build(self, device="cpu", lengths=None, unused: float | None = None) -> DecodeInputs:
        """The call's tensors; values ~ N(0, 1) everywhere in the cache (unused slots
        too: finite, never zero). `lengths` = (n_q, n_k) overrides the drawn ones.
        `unused` (e.g. NaN): the value of every cache slot past a sequence's length and
        of every page no sequence uses, so a read of one reaches the output.
        fp8: q, K and V drawn in bf16 and quantized per (sequence, KV head), descale =
        amax / 448 (`quantize`)."""
        lq, lk = lengths if lengths is not None else self.lengths()
        lq, lk = torch.as_tensor(lq, dtype=torch.int64), torch.as_tensor(lk, dtype=torch.int64)
        dev = torch.device(device)
        gen = torch.Generator(dev).manual_seed(self.seed + 1)
        dt, B, H, Hkv, D = self.torch_dtype, len(lk), self.heads, self.kv_heads, self.head_dim
        fp8 = dt == FP8

        def randn(*shape):  # drawn in the dtype where it lives: a cache can be tens of GB
            return torch.randn(*shape, generator=gen, device=dev,
                               dtype=torch.bfloat16 if fp8 else dt)

        descales = {}

        def draw(name, owner, *shape):  # fp8: quantized before the next draw (memory)
            x = randn(*shape)
            if fp8:
                x, descales[name] = quantize(x, owner.to(dev), B)
            return x

        if self.packed_q:
            cu_q, max_q = offsets(lq).to(dev), int(lq.max())
            q_shape = (int(lq.sum()), H, D)
        else:
            cu_q, max_q = None, None
            q_shape = (B, int(lq[0]) if B else self.len_q, H, D)
        # fp8 q: a unit is a row with its KV head's query heads side by side
        q = draw("q_descale", torch.repeat_interleave(torch.arange(B), lq),
                 int(lq.sum()), 1, Hkv, H // Hkv * D).view(q_shape)
        cap = self.capacity(lk)
        if not self.page_size:
            owner = torch.arange(B)  # the sequence whose keys a unit (dim 0) holds
            k = draw("k_descale", owner, B, max(cap, 1), Hkv, D)
            v = draw("v_descale", owner, B, max(cap, 1), Hkv, D)
            table = None
        else:
            ps = self.page_size
            pages = self.pool_pages(lk)
            cpu = torch.Generator().manual_seed(self.seed + 2)
            perm = torch.randperm(pages, generator=cpu)
            # unused table slots hold valid page indices too (stale entries of a real
            # server); a kernel must not read them
            table = torch.randint(0, pages, (B, max(1, cap // ps)), generator=cpu)
            owner = torch.full((pages,), -1, dtype=torch.int64)  # -1: no sequence's
            at = 0
            for b in range(B):
                n = -(-int(lk[b]) // ps)
                table[b, :n] = perm[at:at + n]
                owner[perm[at:at + n]] = b
                at += n
            table = table.to(torch.int32).to(dev)
            k = draw("k_descale", owner, pages, ps, Hkv, D)
            v = draw("v_descale", owner, pages, ps, Hkv, D)
        seqlens = lk.to(torch.int32).to(dev)
        inp = DecodeInputs(q, k, v, seqlens, table, cu_q, max_q, lq, lk, **descales)
        if unused is not None:
            keep = torch.zeros(k.shape[:2], dtype=torch.bool, device=dev)
            for b, n in enumerate(lk.tolist()):
                j = torch.arange(n, device=dev)
                if table is None:
                    keep[b, :n] = True
                else:
                    keep[table[b].long()[j // self.page_size], j % self.page_size] = True
            if fp8:  # e4m3 has no masked_fill: its bytes
                byte = torch.tensor(float(unused)).to(FP8).view(torch.uint8).item()
                for c in (k, v):
                    c.view(torch.uint8)[~keep] = byte
            else:
                k[~keep], v[~keep] = unused, unused
        return inp


def with_bf16_q(inp: DecodeInputs) -> DecodeInputs:
    """An fp8 problem's inputs with q dequantized to bf16 (no q_descale): a bf16 q over
    the e4m3 cache."""
    if inp.q_descale is None:
        return inp
    H, D = inp.q.shape[-2:]
    seq = torch.repeat_interleave(torch.arange(len(inp.lengths_q)), inp.lengths_q)
    qd = inp.q_descale[seq.to(inp.q.device)].repeat_interleave(H // inp.k_cache.shape[2], 1)
    q = (inp.q.reshape(-1, H, D).float() * qd[..., None]).to(torch.bfloat16).view(inp.q.shape)
    return dataclasses.replace(inp, q=q, q_descale=None)


# ------------------------------------------------------------------------- oracle

def gather_kv(inp: DecodeInputs, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence b's cached keys and values, [n_k, H_kv, D] each, in token order."""
    n = int(inp.lengths_k[b])
    if inp.page_table is None:
        return inp.k_cache[b, :n], inp.v_cache[b, :n]
    ps = inp.page_size
    j = torch.arange(n, device=inp.k_cache.device)
    page = inp.page_table[b].long()[j // ps]
    return inp.k_cache[page, j % ps], inp.v_cache[page, j % ps]


def _rows(inp: DecodeInputs) -> list[tuple[int, int]]:
    """(first, end) of each sequence's rows in the flattened [Nq, H, D] q."""
    lq = inp.lengths_q.tolist()
    ends = [sum(lq[:b + 1]) for b in range(len(lq))]
    return [(e - n, e) for e, n in zip(ends, lq)]


def lowp_dtype(inp: DecodeInputs) -> torch.dtype:
    """The dtype PyTorch computes in for the allowance: the input dtype, bf16 for fp8
    (on the dequantized values); also the output's."""
    return inp.out_dtype


def reference(inp: DecodeInputs, *, causal: bool, softmax_scale=None,
              compute_dtype=None) -> dict[str, torch.Tensor]:
    """out in q's layout and lse (dense [B, H, L_q], packed [H, total_q]), computed in
    `compute_dtype` (None: fp32 on a GPU, fp64 on the CPU). fp8: on the dequantized
    values (e4m3 times its descale, formed in fp32 / fp64, then cast to
    `compute_dtype`)."""
    hi = torch.float64 if inp.q.device.type == "cpu" else torch.float32
    dt = compute_dtype or hi
    H, D = inp.q.shape[-2:]
    G = H // inp.k_cache.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    q = inp.q.reshape(-1, H, D)
    outs, lses = [], []

    def real(x, descale, b, group=1):  # x [n, heads, D] of sequence b
        x = x.to(hi)
        if descale is not None:
            x = x * descale[b].to(hi).repeat_interleave(group)[None, :, None]
        return x.to(dt)

    for b, (r0, r1) in enumerate(_rows(inp)):
        kb, vb = gather_kv(inp, b)
        o, lse = oracle._attend(real(q[r0:r1], inp.q_descale, b, G),
                                real(kb, inp.k_descale, b), real(vb, inp.v_descale, b),
                                causal, scale)
        outs.append(o)
        lses.append(lse)
    out = torch.cat(outs) if outs else q.new_zeros(0, H, D, dtype=dt)
    lse = torch.cat(lses, dim=1) if lses else q.new_zeros(H, 0, dtype=torch.float32)
    if inp.cu_seqlens_q is None:  # dense: [B, L_q, H, D] and lse [B, H, L_q]
        B, Lq = inp.q.shape[:2]
        out = out.reshape(B, Lq, H, D)
        lse = lse.reshape(H, B, Lq).permute(1, 0, 2)
    return {"out": out, "lse": lse.float()}


def call(fn, inp: DecodeInputs, p: DecodeProblem, *, return_lse: bool, softmax_scale=None):
    """One backend call on `inp` with `p`'s causal flag and splits."""
    with torch.no_grad():
        return fn(*inp.args(), causal=p.causal, softmax_scale=softmax_scale,
                  num_splits=p.num_splits, return_lse=return_lse, **inp.kwargs())


def poison_outputs(inp: DecodeInputs, p: DecodeProblem, copies: int = 2) -> None:
    """NaN bytes into free allocator blocks of the sizes the call allocates (out, lse and
    the fp32 split-KV partials, at the splits asked for or else 64, the most the core
    chooses: the allocator cuts smaller requests from a larger free block), so an output
    element left unwritten shows up as NaN (as oracle.poison)."""
    if inp.q.device.type != "cuda":
        return
    H, D = inp.q.shape[-2:]
    nq = inp.q.numel() // (H * D)
    splits = p.num_splits or 64
    out_size = torch.empty(0, dtype=inp.out_dtype).element_size()
    sizes = [nq * H * D * out_size, 4 * H * nq]
    if splits > 1:
        sizes += [4 * splits * nq * H * D, 4 * splits * H * nq]
    blocks = [torch.empty(n, dtype=torch.uint8, device=inp.q.device)
              for n in sizes for _ in range(copies)]
    for blk in blocks:
        blk.fill_(0xFF)  # all-ones bytes are NaN in fp32, fp16 and bf16
    del blocks


def check(inp: DecodeInputs, p: DecodeProblem, fn, *, check_lse=True, repeat=False,
          softmax_scale=None, ref=None, lowp=None) -> oracle.Report:
    """The oracle on one call: out (and lse with `check_lse`) against the fp32 reference,
    allowed 2x PyTorch's own error in the input dtype plus a floor. `repeat`: a second
    call after poisoning again must give the same bits (`same` check: no dependence on
    timing, e.g. in the split-KV combine). fp8: the reference and PyTorch's bf16 on the
    dequantized values; out must be bf16."""
    kw = dict(causal=p.causal, softmax_scale=softmax_scale)
    ref = ref or reference(inp, **kw)
    lowp = lowp or reference(inp, compute_dtype=lowp_dtype(inp), **kw)
    results = []
    for _ in range(2 if repeat else 1):
        poison_outputs(inp, p)
        res = call(fn, inp, p, return_lse=check_lse, softmax_scale=softmax_scale)
        results.append(res if isinstance(res, tuple) else (res, None))
    out, lse = results[0]
    rep = oracle.Report([oracle.compare("out", out, ref["out"], lowp["out"], inp.out_dtype)])
    if out.dtype != inp.out_dtype:
        rep.checks.append(oracle.Check("dtype", math.inf, 0.0, math.inf,
                                       (f"out {out.dtype}, expected {inp.out_dtype}",), False))
    if check_lse:
        rep.checks.append(oracle.compare("lse", lse, ref["lse"], lowp["lse"], torch.float32)
                          if lse is not None else
                          oracle.Check("lse", math.inf, 0.0, math.inf, ("no lse returned",), False))
    if repeat:
        a, b = (torch.cat([t.detach().double().flatten().cpu() for t in r if t is not None])
                for r in results)
        neq = a != b  # NaN differs from itself: a NaN output is never "the same"
        diff = float((a - b).abs()[neq].nan_to_num(math.inf).max()) if bool(neq.any()) else 0.0
        rep.checks.append(oracle.Check("same", diff, 0.0, 0.0, (), not bool(neq.any())))
    return rep


# -------------------------------------------------------------------------- suite

BASE = dict(heads=32, kv_heads=8, head_dim=128, len_q=1, page_size=0, dtype="bf16",
            causal=True, packed_q=False, num_splits=0, sparsity=1.0)
K = 1024


@dataclass(frozen=True)
class Sweep:
    """One sweep of the suite: the cells BASE | fixed | point for each point."""
    name: str
    title: str
    points: tuple                  # dicts of fields
    fixed: tuple = ()              # (field, value) pairs on top of BASE
    quick: tuple = ()              # the points `--quick` keeps

    def cells(self, quick=False) -> list[DecodeProblem]:
        pts = [pt for pt in self.points if not quick or pt in self.quick]
        cells = [DecodeProblem(**{**BASE, **dict(self.fixed), **pt}, suite="decode") for pt in pts]
        return [c for c in cells if c.cache_bytes() <= MAX_CACHE_GB * 1e9]


def _pts(**axes):
    """The cross product of the given fields' values, as dicts (first field outermost)."""
    out = [{}]
    for k, vals in axes.items():
        out = [{**o, k: v} for o in out for v in vals]
    return tuple(out)


_AT = ({"batch": 8, "cache_len": 32 * K}, {"batch": 64, "cache_len": 4 * K})
_BL = lambda b, n: {"batch": b, "cache_len": n}
_FP8_AT = (_BL(1, 32 * K), _BL(8, 32 * K), _BL(64, 32 * K), {**_BL(8, 32 * K), "page_size": 16})
SWEEPS = (
    Sweep("grid", "KV bandwidth against cache length",
          _pts(batch=(1, 8, 64, 256), cache_len=(K, 4 * K, 32 * K, 128 * K)),
          quick=(_BL(1, 4 * K), _BL(1, 32 * K), _BL(8, 32 * K), _BL(64, 4 * K),
                 _BL(64, 32 * K), _BL(256, 4 * K))),
    Sweep("pages", "Page size",
          tuple({**at, "page_size": ps} for at in _AT for ps in (0, 1, 16, 64, 128)),
          quick=tuple({**_AT[0], "page_size": ps} for ps in (1, 16, 128))),
    Sweep("len_q", "New query rows (causal)",
          tuple({**at, "len_q": n} for at in _AT for n in (1, 4, 16)),
          quick=({**_AT[0], "len_q": 16},)),
    Sweep("heads", "Heads and head dim",
          tuple({**at, "heads": h, "kv_heads": hkv, "head_dim": d} for at in _AT
                for h, hkv, d in ((32, 8, 128), (64, 8, 128), (32, 32, 128), (32, 8, 64),
                                  (32, 32, 64)))),
    Sweep("splits", "KV splits (B = 1, 32k cached keys)",
          _pts(num_splits=(0, 1, 2, 4, 8, 16, 32)), fixed=(("batch", 1), ("cache_len", 32 * K)),
          quick=({"num_splits": 1}, {"num_splits": 8})),
    Sweep("fp8", "fp8 (e4m3) cache and q beside bf16",
          tuple({**at, "dtype": dt} for at in _FP8_AT for dt in ("bf16", "fp8")),
          quick=({**_FP8_AT[0], "dtype": "fp8"}, {**_FP8_AT[3], "dtype": "fp8"})),
    Sweep("mixed", "Jagged cache lengths, packed queries, fp16",
          ({"batch": 64, "cache_len": 32 * K, "sparsity": 0.5},
           {"batch": 64, "cache_len": 32 * K, "sparsity": 0.5, "page_size": 16},
           {"batch": 64, "cache_len": 4 * K, "len_q": 16, "packed_q": True, "page_size": 16},
           {"batch": 8, "cache_len": 32 * K, "dtype": "fp16"})),
)


def build_order(p: DecodeProblem) -> tuple:
    """Cells that share a kernel build (head dim, dtype, rows per tile, page class)
    next to each other, the build's cells by size."""
    return (p.dtype, p.head_dim, p.heads // p.kv_heads * p.len_q, p.packed_q, p.causal,
            p.page_size, p.num_splits, p.sparsity, p.batch, p.cache_len)


def cells(quick=False) -> list[DecodeProblem]:
    """Each cell of every sweep once, in build order."""
    seen = {}
    for s in SWEEPS:
        for c in s.cells(quick):
            seen.setdefault(c, None)
    return sorted(seen, key=build_order)


def suites() -> dict[str, list[DecodeProblem]]:
    return {"decode": cells()}


def quick_subset(problems: list[DecodeProblem]) -> list[DecodeProblem]:
    keep = set(cells(quick=True))
    return [p for p in problems if p in keep]


def sweep_cells(name: str) -> list[DecodeProblem]:
    return next(s for s in SWEEPS if s.name == name).cells()


# ------------------------------------------------------------------------- runner

def cols(p: DecodeProblem) -> dict:
    """results.csv columns of a decode problem (the jagged columns where they mean the
    same: max_seqlen_q = L_q, max_seqlen_k = cache length; total_k = keys read)."""
    lq, lk = p.lengths()
    return {"suite": p.suite, "mode": "decode", "causal": p.causal, "dtype": p.dtype,
            "batch": p.batch, "heads": p.heads, "kv_heads": p.kv_heads, "head_dim": p.head_dim,
            "max_seqlen_q": p.len_q, "max_seqlen_k": p.cache_len, "sparsity": p.sparsity,
            "seed": p.seed, "total_q": int(lq.sum()), "total_k": int(lk.sum()),
            "page_size": p.page_size, "num_splits": p.num_splits, "packed_q": p.packed_q,
            "kv_bytes": p.kv_bytes()}


def problem_of(r: dict) -> DecodeProblem:
    """The DecodeProblem of a results.csv row (its columns as strings or numbers)."""
    t = lambda c: str(r[c]) == "True"
    return DecodeProblem(batch=int(r["batch"]), heads=int(r["heads"]), kv_heads=int(r["kv_heads"]),
                         head_dim=int(r["head_dim"]), cache_len=int(r["max_seqlen_k"]),
                         len_q=int(r["max_seqlen_q"]), page_size=int(r["page_size"]),
                         dtype=str(r["dtype"]), causal=t("causal"), packed_q=t("packed_q"),
                         num_splits=int(r["num_splits"]), sparsity=float(r["sparsity"]),
                         seed=int(r["seed"]), suite=str(r["suite"]))
