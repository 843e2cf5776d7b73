"""Multi-GPU sharding of the sweep, on the CPU: (backend, problem) jobs go longest-first
to one lane per (fake) GPU, each lane pinned to its device with its own warm workers.
The same sweep runs on one fake GPU and on three; the CSVs must have the same rows."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import bench
from harness.suites import suite

REPO = Path(__file__).resolve().parents[1]

FAKES = '''
import json
import os
import torch
from harness.backends import Backend, register

CRASH_Q = 33  # the shard-crashy backend dies on the smoke problem with max_seqlen_q 33


def _make(crashy):
    def make():
        from harness.oracle import _attend

        def fn(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, softmax_scale=None,
               broadcast_q=False):
            with open(os.environ["SHARD_RECORD"], "a") as f:
                f.write(json.dumps({"backend": "shard-crashy" if crashy else "shard-good",
                                    "max_q": max_q, "pid": os.getpid(),
                                    "gpu_index": os.environ.get("HARNESS_GPU_INDEX"),
                                    "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                                    "cuda": torch.cuda.is_available()}) + "\\n")
            if crashy and max_q == CRASH_Q:
                os._exit(3)  # like an illegal memory access: the process is gone
            outs, ck = [], cu_k.tolist()
            cq = None if broadcast_q else cu_q.tolist()
            for b in range(len(ck) - 1):
                qb = q if broadcast_q else q[cq[b]:cq[b + 1]]
                outs.append(_attend(qb, k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]], causal,
                                    qb.shape[-1] ** -0.5)[0])
            return torch.cat(outs)
        return fn
    return make


register(Backend("shard-good", _make(False), lambda: (True, ""), module=__name__))
register(Backend("shard-crashy", _make(True), lambda: (True, ""), module=__name__))
'''

NAMES = ["shard-good", "shard-crashy"]
PASSES = ("fwd",)
CRASH_Q = "33"
SAME = ["status"] + bench.KEY + bench.PROBLEM_COLS  # what must match a one-GPU run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One sweep on one fake GPU, the same sweep on three (HARNESS_FAKE_GPUS=3, every
    visible GPU by default)."""
    tmp = tmp_path_factory.mktemp("shard")
    (tmp / "shard_fakes.py").write_text(FAKES)
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(tmp))
        mp.setenv("PYTHONPATH", str(tmp))
        mp.setenv("HARNESS_FAKE_GPUS", "3")
        from harness import backends
        import shard_fakes  # noqa: F401  (registers the fakes here; workers import them again)
        visible, fake = bench.visible_gpus()
        assert (visible, fake) == ([0, 1, 2], True)
        problems = suite("smoke")
        for n, gpus in ((1, bench.select_gpus("1", visible)), (3, bench.select_gpus(None, visible))):
            rec = tmp / f"record{n}.jsonl"
            mp.setenv("SHARD_RECORD", str(rec))
            path = bench.sweep([backends.get(b) for b in NAMES], problems, PASSES,
                               out_dir=tmp / f"out{n}", gpus=gpus, fake_gpus=True,
                               progress=False, timeout=120)
            jobs = [json.loads(l) for l in open(tmp / f"out{n}" / "logs" / "jobs.jsonl")]
            out[n] = dict(rows=bench.read_rows(path), jobs=jobs, problems=problems,
                          record=[json.loads(l) for l in open(rec)], header=open(path).readline())
    return out


def _key(r):
    return tuple(r[c] for c in SAME)


def test_rows_match_one_gpu_run(runs):
    one, three = runs[1], runs[3]
    assert three["header"] == one["header"]
    assert len(one["rows"]) == len(NAMES) * len(one["problems"]) * len(PASSES)
    # same rows, same keys and statuses, and the same order in the file
    assert [_key(r) for r in three["rows"]] == [_key(r) for r in one["rows"]]
    assert {r["gpu_index"] for r in one["rows"]} == {"0"}


def test_rows_carry_the_lane_that_ran_them(runs):
    three = runs[3]
    rows = three["rows"]
    assert {r["gpu_index"] for r in rows} == {"0", "1", "2"}  # every lane got work
    assert all(r["gpu"] == "cpu" for r in rows)  # fake GPUs: CUDA hidden, CPU workers
    ends = {(j["backend"], j["problem"]): j for j in three["jobs"] if j["event"] == "end"}
    labels = {str(p.max_seqlen_q): p.label() for p in three["problems"]}
    ran = {(x["backend"], str(x["max_q"])): x for x in three["record"]}
    for r in rows:
        lane = ends[r["backend"], labels[r["max_seqlen_q"]]]["gpu_index"]
        assert r["gpu_index"] == lane
        seen = ran[r["backend"], r["max_seqlen_q"]]  # what the worker process itself saw
        assert seen["gpu_index"] == lane and seen["cvd"] == "" and not seen["cuda"]


def test_crash_costs_one_row(runs):
    for n in (1, 3):
        run = runs[n]
        bad = [r for r in run["rows"] if r["status"] != "ok"]
        assert [(r["backend"], r["max_seqlen_q"], r["status"]) for r in bad] == \
            [("shard-crashy", CRASH_Q, "error")], bad
        assert "exit code 3" in bad[0]["error"]
    # the lane that lost its worker went on with other jobs, a fresh worker included
    jobs = runs[3]["jobs"]
    crash = next(j for j in jobs if j["event"] == "end" and j["status"] == "error")
    later = [j for j in jobs if j["event"] == "start" and j["lane"] == crash["lane"]
             and j["seq"] > crash["seq"] and j["t"] >= crash["t"]]
    assert later, "the lane stopped after the crash"
    pids = {x["pid"] for x in runs[3]["record"] if x["backend"] == "shard-crashy"
            and x["gpu_index"] == crash["gpu_index"]}
    if any(j["backend"] == "shard-crashy" for j in later):
        assert len(pids) == 2  # the crashed worker and its replacement


def test_jobs_start_longest_first(runs):
    for n in (1, 3):
        starts = sorted((j for j in runs[n]["jobs"] if j["event"] == "start"), key=lambda j: j["seq"])
        assert [j["t"] for j in starts] == sorted(j["t"] for j in starts)
        expected = bench.plan(NAMES, runs[n]["problems"], PASSES)
        assert [(j["backend"], j["problem"]) for j in starts] == \
            [(j.backend, j.problem.label()) for j in expected]
        gflop = [j["gflop"] for j in starts]
        assert gflop == sorted(gflop, reverse=True) and gflop[0] > gflop[-1]
    assert starts[0]["problem"].endswith("causal")  # the smoke problem with the most FLOPs
    assert {j["lane"] for j in starts[:3]} == {0, 1, 2}  # each lane took one of the first three


def test_select_gpus():
    assert bench.select_gpus(None, [0, 1, 2, 3]) == [0, 1, 2, 3]  # default: every visible GPU
    assert bench.select_gpus("2", [0, 1, 2, 3]) == [0, 1]         # --gpus N: the first N
    assert bench.select_gpus("0,2", [0, 1, 2, 3]) == [0, 2]       # a comma list: those GPUs
    assert bench.select_gpus("3,", [0, 1, 2, 3]) == [3]           # one index: a trailing comma
    for bad in ("5", "0", "1,7", "1,1"):
        with pytest.raises(ValueError):
            bench.select_gpus(bad, [0, 1, 2, 3])


def test_lane_env_pins_the_gpu():
    env = bench.lane_env(2, lanes=8, parent={})
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["HARNESS_GPU_INDEX"] == "2"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and "TRITON_INTERPRET" not in env
    assert int(env["OMP_NUM_THREADS"]) >= 1
    # the parent already sees a subset: lane 1 is the parent's second GPU, physical 6
    env = bench.lane_env(1, lanes=2, parent={"CUDA_VISIBLE_DEVICES": "4,6", "OMP_NUM_THREADS": "4"})
    assert env["CUDA_VISIBLE_DEVICES"] == "6" and env["HARNESS_GPU_INDEX"] == "6"
    assert "OMP_NUM_THREADS" not in env
    assert bench.lane_env(None, parent={}) == {"TRITON_INTERPRET": "1"}
    fake = bench.lane_env(1, fake=True, parent={})
    assert fake["CUDA_VISIBLE_DEVICES"] == "" and fake["HARNESS_GPU_INDEX"] == "1"


def test_cli_fake_gpus(tmp_path):
    """`python -m harness bench` with HARNESS_FAKE_GPUS=3 and `--gpus 2`: two lanes."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "HARNESS_FAKE_GPUS": "3"}
    r = subprocess.run([sys.executable, "-m", "harness", "bench", "--suite", "smoke", "--backends",
                        "triton", "--passes", "fwd", "--limit", "2", "--gpus", "2",
                        "--out", str(tmp_path)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = bench.read_rows(tmp_path / "results.csv")
    assert [(x["backend"], x["status"]) for x in rows] == [("triton", "ok")] * 2, rows
    assert sorted(x["gpu_index"] for x in rows) == ["0", "1"]
    assert sorted(p.name for p in (tmp_path / "logs").glob("triton.*.log")) == \
        ["triton.gpu0.log", "triton.gpu1.log"]
