"""The TLX forward's and backward's call sites (jagged.launch.fast_at) fix every launch
argument's specialization: calls that share a site, over offsets of other lengths with
the same shapes, bounds and flags, launch with the same plan key. Recorded on the CPU
(the list kernels run in the interpreter, the TLX kernels are not launched)."""
import inspect
import os
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU interpreter test (TRITON_INTERPRET=1)")

from harness.problems import offsets  # noqa: E402
from jagged import launch  # noqa: E402
from kernels_tlx import bwd_hopper as bw  # noqa: E402
from kernels_tlx import fwd_hopper as fh  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_decisions(monkeypatch):
    """No site decided by an earlier test: each test's monkeypatched choices count."""
    monkeypatch.setattr(bw, "_DECIDED", {})


def plan_key(kernel, args, kw):
    """_Fast.key of an interpreted kernel's call (its parameters' kinds as the JITFunction
    would give them)."""
    nospec = set(kernel.kwargs.get("do_not_specialize") or ())
    kinds = tuple(2 if str(p.annotation).endswith("constexpr") else 1 if p.name in nospec
                  else 0 for p in inspect.signature(kernel.fn).parameters.values())
    return launch._Fast.key(SimpleNamespace(kinds=kinds, fn=SimpleNamespace(debug=False)),
                            0, args, kw)


def record_sites(monkeypatch, *modules):
    """(kernel name, site, plan key) of each fast_at launch, as the host issues it."""
    seen = []

    def fast_at(fn, site):
        class Rec:
            def __getitem__(self, grid):
                return lambda *args, **kw: seen.append(
                    (fn.fn.__name__, site, plan_key(fn, args, kw)))
        return Rec()
    for m in modules:
        monkeypatch.setattr(m, "fast_at", fast_at)
    return seen


def lengths(g, b, total, cap):
    """b lengths of at most cap summing to total."""
    while True:
        cut = torch.sort(torch.randint(0, total + 1, (b - 1,), generator=g)).values
        lk = torch.diff(torch.cat([torch.tensor([0]), cut, torch.tensor([total])]))
        if int(lk.max()) <= cap:
            return lk


CASES = [  # (batch, tokens, bound, H, H_kv, D, causal, broadcast_q)
    (3, 900, 512, 4, 2, 128, False, False),
    (3, 900, 512, 4, 2, 64, True, False),
    (40, 1200, 64, 2, 1, 128, True, False),   # key windows
    (6, 3000, 2048, 8, 1, 64, True, False),   # split tiles
    (5, 700, 512, 4, 4, 128, False, True),    # broadcast-Q (7 query rows)
]


@pytest.mark.parametrize("case", CASES)
def test_sites_fix_the_specialization(monkeypatch, case):
    b, total, cap, H, HKV, D, causal, bq = case
    seen = record_sites(monkeypatch, bw, fh)
    monkeypatch.setattr(bw, "num_sms", lambda dev: 132)
    monkeypatch.setattr(fh, "num_sms", lambda dev: 132)
    g = torch.Generator().manual_seed(b)
    n_q = 7 if bq else total
    for _ in range(3):
        cu = offsets(lengths(g, b, total, cap))
        cu_q = None if bq else cu
        q = torch.randn(n_q, H, D, generator=g).half()
        k = torch.randn(total, HKV, D, generator=g).half()
        fh.forward(q, k, k, cu_q, cu, n_q if bq else cap, cap, causal, 0.1, bq)
        n_out = n_q * b if bq else n_q
        o = torch.zeros(n_out, H, D, dtype=torch.float16)
        bw.backward(o, q, k, k, o, torch.zeros(H, n_out), cu_q, cu, n_q if bq else cap,
                    cap, causal, 0.1, bq)
    by_site = {}
    for name, site, key in seen:
        assert by_site.setdefault((name, site), key) == key, (name, site)
    names = {name for name, _ in by_site}
    assert {"fwd_kernel", "bwd_kernel", "_bwd_preprocess"} <= names, names
    assert len(by_site) == len(names)  # one site a kernel: the three calls shared it
