"""The one problem generator shared by every implementation and baseline.

A `Problem` is a frozen description (shape, sparsity, mode, dtype, seed); `build()`
turns it into packed tensors and offsets, deterministically per seed.

fp8 (`dtype="fp8"`, forward only): q, k, v in float8_e4m3fn, drawn in bf16 (the same
values as the bf16 twin's) and quantized per (sequence, KV head) with descale =
amax / 448 (`harness.fp8.quantize`); `Inputs.descales()` gives the call's
q_descale, k_descale, v_descale (fp32 [B, H_kv]); out is bf16.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import torch

from .fp8 import FP8, quantize

MODES = ("self", "cross", "broadcast_q")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": FP8}


def jagged_lengths(batch: int, max_len: int, sparsity: float, gen: torch.Generator) -> torch.Tensor:
    """Meta's convention: uniform integer lengths with mean `sparsity * max_len`.

    s >= 0.5 draws from [(2s-1)*max, max], s < 0.5 from [1, 2s*max]; s = 1 is dense.
    """
    if not 0.0 < sparsity <= 1.0:
        raise ValueError(f"sparsity must be in (0, 1], got {sparsity}")
    if sparsity >= 0.5:
        lo, hi = round((2 * sparsity - 1) * max_len), max_len
    else:
        lo, hi = 1, max(1, round(2 * sparsity * max_len))
    lo = min(max(lo, 0), hi)
    return torch.randint(lo, hi + 1, (batch,), generator=gen, dtype=torch.int64)


def offsets(lengths: torch.Tensor) -> torch.Tensor:
    """int32 prefix sums starting at 0 (the FA varlen convention)."""
    return torch.nn.functional.pad(torch.cumsum(lengths, 0), (1, 0)).to(torch.int32)


def causal_pairs(len_q: torch.Tensor, len_k: torch.Tensor) -> torch.Tensor:
    """Unmasked (query, key) pairs per sequence under bottom-right causal alignment:
    query i sees keys j <= i + len_k - len_q."""
    lq, lk = len_q.to(torch.int64), len_k.to(torch.int64)
    # rows i >= lq - lk see i + lk - lq + 1 keys (capped at lk); earlier rows see none
    full = torch.clamp(lq - lk, min=0)  # rows that see nothing
    seen = lq - full                   # rows that see 1 .. min(lq, lk)
    first = lk - lq + full + 1         # keys seen by the first such row
    return seen * first + seen * (seen - 1) // 2


@dataclass(frozen=True)
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor | None
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    dout: torch.Tensor
    lengths_q: torch.Tensor  # int64, CPU, per batch element (L_q repeated in broadcast_q)
    lengths_k: torch.Tensor
    q_descale: torch.Tensor | None = None  # fp8: fp32 [B, H_kv] each
    k_descale: torch.Tensor | None = None
    v_descale: torch.Tensor | None = None

    def args(self):
        return (self.q, self.k, self.v, self.cu_seqlens_q, self.cu_seqlens_k,
                self.max_seqlen_q, self.max_seqlen_k)

    @property
    def fp8(self) -> bool:
        return self.q.dtype == FP8

    @property
    def out_dtype(self) -> torch.dtype:
        """bf16 for fp8 inputs, else q's dtype."""
        return torch.bfloat16 if self.fp8 else self.q.dtype

    def descales(self) -> dict:
        """The call's descale keywords: {} for 16-bit inputs."""
        if not self.fp8:
            return {}
        return dict(q_descale=self.q_descale, k_descale=self.k_descale, v_descale=self.v_descale)


@dataclass(frozen=True)
class Problem:
    batch: int
    heads: int
    head_dim: int
    max_seqlen_q: int
    max_seqlen_k: int | None = None  # None: same as q (self attention)
    kv_heads: int | None = None      # None: same as heads (MHA)
    sparsity: float = 1.0
    mode: str = "self"               # self | cross | broadcast_q
    causal: bool = False
    dtype: str = "bf16"
    seed: int = 0
    suite: str = ""
    dense_q: bool = False            # cross: every sequence has max_seqlen_q queries and
                                     # broadcast_q's key lengths (its unshared twin)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if self.heads % self.hkv:
            raise ValueError(f"heads={self.heads} not a multiple of kv_heads={self.hkv}")
        if self.mode == "self" and self.max_seqlen_k not in (None, self.max_seqlen_q):
            raise ValueError("self attention has max_seqlen_k == max_seqlen_q")
        if self.dense_q and self.mode != "cross":
            raise ValueError("dense_q applies to cross attention only")

    @property
    def hkv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def max_k(self) -> int:
        return self.max_seqlen_k or self.max_seqlen_q

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def replace(self, **kw) -> "Problem":
        return dataclasses.replace(self, **kw)

    def label(self) -> str:
        bits = [self.mode, f"B{self.batch}", f"H{self.heads}/{self.hkv}", f"D{self.head_dim}",
                f"Lq{self.max_seqlen_q}", f"Lk{self.max_k}", f"s{self.sparsity:g}", self.dtype]
        bits += ["denseq"] if self.dense_q else []
        return " ".join(bits + (["causal"] if self.causal else []))

    def lengths(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sequence (len_q, len_k), int64 on CPU; deterministic per seed."""
        gen = torch.Generator().manual_seed(self.seed)
        if self.mode == "broadcast_q" or self.dense_q:
            lk = jagged_lengths(self.batch, self.max_k, self.sparsity, gen)
            return torch.full((self.batch,), self.max_seqlen_q, dtype=torch.int64), lk
        lq = jagged_lengths(self.batch, self.max_seqlen_q, self.sparsity, gen)
        if self.mode == "self":
            return lq, lq.clone()
        return lq, jagged_lengths(self.batch, self.max_k, self.sparsity, gen)

    def pairs(self) -> int:
        """Exact count of unmasked score pairs over the batch (per head)."""
        lq, lk = self.lengths()
        per_seq = causal_pairs(lq, lk) if self.causal else lq * lk
        return int(per_seq.sum())

    def flops(self, pass_: str = "fwd") -> float:
        fwd = 4.0 * self.heads * self.head_dim * self.pairs()
        return fwd if pass_ == "fwd" else 2.5 * fwd

    def build(self, device="cpu", lengths=None) -> Inputs:
        """Packed q, k, v, dout and offsets; values ~ N(0, 1) from the problem's seed.

        `lengths` = (len_q, len_k) overrides the drawn lengths (tests use it for
        zero-length and length-1 sequences)."""
        lq, lk = lengths if lengths is not None else self.lengths()
        lq, lk = torch.as_tensor(lq, dtype=torch.int64), torch.as_tensor(lk, dtype=torch.int64)
        # drawn where they live: a B=1152 problem has ~10^9 values per tensor, seconds on
        # a CPU; the values depend on the seed and on the device type
        dev = torch.device(device)
        gen = torch.Generator(dev).manual_seed(self.seed + 1)
        dt, H, Hkv, D = self.torch_dtype, self.heads, self.hkv, self.head_dim
        bq = self.mode == "broadcast_q"
        nq = self.max_seqlen_q if bq else int(lq.sum())
        nk = int(lk.sum())
        nout = self.batch * self.max_seqlen_q if bq else nq

        fp8 = dt == FP8
        drawn = torch.bfloat16 if fp8 else dt

        def randn(*shape):
            return torch.randn(*shape, generator=gen, device=dev).to(drawn)

        q, k, v = randn(nq, H, D), randn(nk, Hkv, D), randn(nk, Hkv, D)
        dout = randn(nout, H, D)
        descales = {}
        if fp8:
            (q, k, v), descales = quantize_qkv(q, k, v, lq, lk, bq)
        cu_k = offsets(lk).to(device)
        cu_q = None if bq else offsets(lq).to(device)
        # the declared maxima (what a caller configures), raised to any longer override
        max_q = max(self.max_seqlen_q, int(lq.max()) if len(lq) else 0)
        max_k = max(self.max_k, int(lk.max()) if len(lk) else 0)
        return Inputs(q, k, v, cu_q, cu_k, max_q, max_k, dout, lq, lk, **descales)


def quantize_qkv(q, k, v, lq, lk, broadcast_q: bool):
    """bf16 q [Nq, H, D], k / v [Nk, H_kv, D] -> their e4m3 values and descales fp32
    [B, H_kv], per (sequence, KV head): descale = amax / 448 (`harness.fp8.quantize`;
    a query head shares its KV head's). broadcast_q: the one shared q gets one descale
    per KV head, repeated for every sequence."""
    B, Hkv, dev = len(lk), k.shape[1], q.device
    seq_k = torch.repeat_interleave(torch.arange(B), lk).to(dev)
    kq, kd = quantize(k[:, None], seq_k, B)
    vq, vd = quantize(v[:, None], seq_k, B)
    # q's unit: a row with its KV head's query heads side by side
    qv = q.view(q.shape[0], 1, Hkv, -1)
    if broadcast_q:
        qq, qd = quantize(qv, torch.zeros(q.shape[0], dtype=torch.int64, device=dev), 1)
        qd = qd.expand(B, Hkv).contiguous()
    else:
        qq, qd = quantize(qv, torch.repeat_interleave(torch.arange(B), lq).to(dev), B)
    return ((qq.view(q.shape), kq.view(k.shape), vq.view(v.shape)),
            dict(q_descale=qd, k_descale=kd, v_descale=vd))


def _grid(suite, lengths, sparsities, **kw):
    return [Problem(max_seqlen_q=n, sparsity=s, suite=suite, **kw)
            for n in lengths for s in sparsities]


# varlen-llm: packed causal training batches, lengths from 1k up to the class's maximum.
# Under `jagged_lengths`' convention s >= 0.5 draws from [(2s-1)*max, max], so
# s = 1/2 + 512/max gives [1024, max]: 16k -> s 0.53125, 8k -> s 0.5625, 4k -> s 0.625.
VARLEN_LLM_CLASSES = ((16384, 5), (8192, 10), (4096, 20))  # (max length, sequences)
VARLEN_LLM_HEADS = ((32, 8, 128),   # Llama-3-8B, GQA 4:1
                    (64, 8, 128),   # Llama-3-70B, GQA 8:1
                    (32, 8, 64),    # Llama-3.2-1B, GQA 4:1
                    (16, 2, 64))    # GQA 8:1 at D = 64
VARLEN_LLM_MIN = 1024


def varlen_llm() -> list[Problem]:
    return [Problem(batch=b, heads=h, kv_heads=hkv, head_dim=d, max_seqlen_q=n,
                    sparsity=0.5 + VARLEN_LLM_MIN / (2 * n), causal=True, suite="varlen-llm")
            for (n, b) in VARLEN_LLM_CLASSES for (h, hkv, d) in VARLEN_LLM_HEADS]


FUZZ_TOKENS = 65536  # cap on packed query and key tokens (broadcast_q: queries as expanded)
FUZZ_LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FUZZ_SPARSITIES = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


def _fuzz_one(rng: random.Random) -> Problem:
    hkv = rng.choice((1, 2, 4, 8))
    group = rng.choice([g for g in (1, 2, 4, 8) if hkv * g <= 32])
    mode = rng.choices(("self", "cross", "broadcast_q"), weights=(3, 1, 1))[0]
    n = rng.choice(FUZZ_LENGTHS)
    sparsity = rng.choice(FUZZ_SPARSITIES)
    if mode == "self":
        lq, lk = n, None
    elif mode == "cross":
        lq, lk = n, rng.choice(FUZZ_LENGTHS)
    else:  # one dense Q of lq rows shared by every sequence
        lq, lk = rng.choice((16, 64, 128, 256, 512, 1024)), n
    mean = max(1.0, sparsity * max(lq, lk or lq))
    batch = rng.randint(1, max(1, min(1024, int(FUZZ_TOKENS / mean))))
    p = Problem(batch=batch, heads=hkv * group, kv_heads=hkv, head_dim=rng.choice((64, 128)),
                max_seqlen_q=lq, max_seqlen_k=lk, sparsity=sparsity, mode=mode,
                causal=rng.random() < 0.5, dtype=rng.choice(("bf16", "fp16")),
                seed=rng.randrange(1 << 30), suite="fuzz")
    while p.batch > 1 and fuzz_tokens(p) > FUZZ_TOKENS:
        p = p.replace(batch=p.batch * 3 // 4)
    return p


def fuzz_tokens(p: Problem) -> int:
    """The larger of a problem's packed query and key token counts (broadcast_q: the
    queries expanded over the batch, as a baseline without broadcast runs them)."""
    lq, lk = p.lengths()
    return max(int(lq.sum()), int(lk.sum()))


def fuzz_problems(n: int = 40, seed: int = 0) -> list[Problem]:
    """`n` jagged problems drawn from `seed` (deterministic per seed) over batch, heads and
    group, head dim, maximum lengths, sparsity, causal, mode and dtype; at most
    FUZZ_TOKENS packed tokens each, seconds per problem on one GPU."""
    rng = random.Random(seed)
    return [_fuzz_one(rng) for _ in range(n)]


def fp8_twins(problems: list[Problem]) -> list[Problem]:
    """Each bf16 problem again in fp8 (the same drawn values, quantized): the forward's
    fp8 rows beside their bf16 twins."""
    return [p.replace(dtype="fp8") for p in problems if p.dtype == "bf16"]


def suites() -> dict[str, list[Problem]]:
    gem = dict(batch=1152, heads=4, head_dim=128)
    jag = _grid("gem-jagged", (256, 512, 1024, 2048), (0.1, 0.5, 0.9), **gem)
    jag += fp8_twins(jag)
    # the same grid at D = 64 (opt-in: not in `make bench`'s SUITES), where the backward's
    # step size (64 or 128 query rows) turns on the lengths
    jag64 = _grid("gem-jagged-d64", (256, 512, 1024, 2048), (0.1, 0.5, 0.9),
                  **dict(gem, head_dim=64))
    cross = [Problem(max_seqlen_q=n, max_seqlen_k=kv, sparsity=s, mode="cross",
                     suite="gem-cross", **gem)
             for n in (512, 1024, 2048) for kv in (64, 256) for s in (0.5, 0.9)]
    # each broadcast shape beside its unshared twin (same lengths, a Q per sequence)
    bq = [Problem(max_seqlen_q=lq, max_seqlen_k=1024, sparsity=0.5, suite="gem-broadcast-q",
                  **mode, **gem) for lq in (64, 256)
          for mode in (dict(mode="broadcast_q"), dict(mode="cross", dense_q=True))]
    llm = [Problem(batch=b, heads=h, kv_heads=hkv, head_dim=d, max_seqlen_q=n, causal=c,
                   suite="llm-dense")
           for (b, h, hkv, d, n) in ((8, 16, 16, 128, 8192), (4, 32, 8, 128, 4096),
                                     (16, 16, 16, 64, 2048))
           for c in (False, True)]
    llm += fp8_twins(llm)
    smoke = [Problem(batch=3, heads=2, head_dim=64, max_seqlen_q=40, sparsity=0.5, suite="smoke"),
             Problem(batch=3, heads=4, kv_heads=2, head_dim=64, max_seqlen_q=33, causal=True,
                     sparsity=0.9, suite="smoke"),
             Problem(batch=2, heads=2, head_dim=64, max_seqlen_q=24, max_seqlen_k=17,
                     mode="cross", suite="smoke"),
             Problem(batch=3, heads=2, head_dim=64, max_seqlen_q=16, max_seqlen_k=30,
                     mode="broadcast_q", sparsity=0.5, suite="smoke")]
    return {"gem-jagged": jag, "gem-jagged-d64": jag64, "gem-cross": cross, "gem-broadcast-q": bq,
            "llm-dense": llm, "smoke": smoke, "varlen-llm": varlen_llm(),
            "fuzz": fuzz_problems(40, 0)}
