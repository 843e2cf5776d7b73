"""The sweep's warm-up (`bench.sweep(warm=N)`, `harness bench --warm N`), on the CPU: every
job is first gated in N lanes sharing one (fake) GPU, then timed one job at a time by a
lane of its own; the timed rows are those of a run without the warm-up."""
import csv
import json

import pytest

from harness import bench
from harness.suites import suite

FAKE = '''
import json
import os
from harness.backends import Backend, register


def make():
    from harness.oracle import _attend
    import torch

    def fn(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, softmax_scale=None,
           broadcast_q=False):
        with open(os.environ["WARM_RECORD"], "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "max_q": max_q,
                                "gpu_index": os.environ.get("HARNESS_GPU_INDEX")}) + "\\n")
        cq, ck = cu_q.tolist(), cu_k.tolist()
        return torch.cat([_attend(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]],
                                  causal, q.shape[-1] ** -0.5)[0] for b in range(len(ck) - 1)])
    return fn


register(Backend("warm-fake", make, lambda: (True, ""), module=__name__))
'''


def test_warm_lanes_gate_then_one_lane_times(tmp_path, monkeypatch):
    (tmp_path / "warm_fake.py").write_text(FAKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    rec = tmp_path / "record.jsonl"
    monkeypatch.setenv("WARM_RECORD", str(rec))
    from harness import backends
    import warm_fake  # noqa: F401  (registers it here; the workers import it again)
    problems = [p for p in suite("smoke") if p.mode != "broadcast_q"]
    assert len(problems) == 3
    out = tmp_path / "out"
    path = bench.sweep([backends.get("warm-fake")], problems, ("fwd",), out_dir=out,
                       gpus=[0], fake_gpus=True, progress=False, timeout=120, warm=2)
    rows = bench.read_rows(path)
    assert [r["status"] for r in rows] == ["ok"] * 3 and rows[0]["ms"]
    checks = bench.read_rows(out / "logs" / "warm" / "checks.csv")
    assert sorted(r["max_seqlen_q"] for r in checks) == sorted(r["max_seqlen_q"] for r in rows)
    assert all(r["status"] == "ok" and not r.get("ms") for r in checks)
    # two warm workers, one log each, on the one device; then one more that times
    logs = sorted(p.name for p in (out / "logs" / "warm" / "logs").glob("*.log"))
    assert logs == [f"warm-fake.lane{k}.log" for k in range(2)]
    calls = [json.loads(line) for line in open(rec)]
    assert {c["gpu_index"] for c in calls} == {"0"}
    pids = list(dict.fromkeys(c["pid"] for c in calls))  # in order of first call
    warm_pids, timed_pid = pids[:-1], pids[-1]
    assert len(warm_pids) == 2
    first_timed = next(i for i, c in enumerate(calls) if c["pid"] == timed_pid)
    assert all(c["pid"] == timed_pid for c in calls[first_timed:])
    assert {c["max_q"] for c in calls[:first_timed]} == {p.max_seqlen_q for p in problems}
    # resume: a finished run starts nothing; a job with a missing row runs again, alone
    n = len(calls)
    again = bench.sweep([backends.get("warm-fake")], problems, ("fwd",), out_dir=out,
                        gpus=[0], fake_gpus=True, progress=False, timeout=120, warm=2,
                        resume=True)
    assert len(open(rec).readlines()) == n and len(bench.read_rows(again)) == 3
    lost = rows[1]["max_seqlen_q"]
    kept = [r for r in bench.read_rows(path) if r["max_seqlen_q"] != lost]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(kept)
    bench.sweep([backends.get("warm-fake")], problems, ("fwd",), out_dir=out, gpus=[0],
                fake_gpus=True, progress=False, timeout=120, resume=True)
    redo = [json.loads(line) for line in open(rec)][n:]
    assert {c["max_q"] for c in redo} == {int(lost)}
    assert sorted(r["max_seqlen_q"] for r in bench.read_rows(path)) == \
        sorted(r["max_seqlen_q"] for r in rows)
