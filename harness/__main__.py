"""python -m harness {bench,check,profile,clocks,compare,plot,report,lines,sidebyside} ...
(see --help)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPORTS = REPO / "reports"


def quick_subset(problems):
    """bench-quick: a few shapes per suite (the long and short ends of each; decode:
    `harness.decode.quick_subset`)."""
    from . import decode
    dec = set(decode.quick_subset([p for p in problems if isinstance(p, decode.DecodeProblem)]))
    problems = [p for p in problems if not isinstance(p, decode.DecodeProblem) or p in dec]
    ends = lambda p: p.max_seqlen_q in (512, 2048)
    keep = {"gem-jagged": ends, "gem-jagged-d64": ends,
            "gem-cross": lambda p: p.max_seqlen_q == 1024,
            "gem-broadcast-q": lambda p: p.max_seqlen_q == 64,
            "llm-dense": lambda p: p.heads == 32}
    # fp8 twins: two cells a suite (llm-dense's heads == 32 pair; gem-jagged's ends at s 0.5)
    fp8 = {"gem-jagged": lambda p: p.sparsity == 0.5}
    return [p for p in problems if keep.get(p.suite, lambda p: True)(p)
            and (p.dtype != "fp8" or fp8.get(p.suite, lambda p: True)(p))]


def _csv_list(s):
    return [x for x in s.split(",") if x]


def _report_dirs(out):
    if out:
        return [Path(out)]
    from .bench import device_name, gpu_slug
    mine = REPORTS / gpu_slug(device_name())
    if (mine / "results.csv").exists():
        return [mine]
    return sorted(d.parent for d in REPORTS.glob("*/results.csv"))


def known_suites() -> list[str]:
    from . import decode
    from .problems import suites
    return list(suites()) + list(decode.suites())


def _groups(problems, names, passes):
    """(backends, problems, passes) per kind of problem: jagged problems with the jagged
    backends among `names`, decode cells (forward only) with the decode ones."""
    from . import backends
    from .decode import DecodeProblem
    out = []
    for kind, ps in (("jagged", passes), ("decode", [p for p in passes if p == "fwd"])):
        probs = [p for p in problems if isinstance(p, DecodeProblem) == (kind == "decode")]
        bs = [n for n in names if n in backends.names(kind, experimental=True)]
        if probs and not (bs and ps):
            print(f"{len(probs)} {kind} problem(s) skipped: no {kind} backend among "
                  f"{names} or no pass among {passes}", file=sys.stderr)
        elif probs:
            out.append(([backends.get(n, kind=kind) for n in bs], probs, ps))
    return out


def cmd_sweep(a, timing: bool):
    import torch
    from . import backends, bench
    suites, names, passes = _csv_list(a.suite), _csv_list(a.backends), _csv_list(a.passes)
    every = list(dict.fromkeys(backends.names() + backends.names("decode")))
    if names == ["all"]:
        names = every
    for what, asked, known in (("suite", suites, known_suites()),
                               ("backend", names, every + backends.names(experimental=True)),
                               ("pass", passes, list(bench.PASSES))):
        unknown = [x for x in asked if x not in known]
        if unknown or not asked:
            sys.exit(f"unknown {what}(s) {unknown}; known: {', '.join(known)}")
    visible, fake = bench.visible_gpus()  # HARNESS_FAKE_GPUS=N: N lanes on the CPU
    try:
        gpus = bench.select_gpus(a.gpus, visible) if visible else []
    except ValueError as e:
        sys.exit(str(e))
    if gpus and not fake:
        slug = bench.gpu_slug(torch.cuda.get_device_name(gpus[0]))
    else:
        print("No CUDA GPU on this machine: running the smoke suite through the `triton` "
              "backend on the CPU (Triton interpreter, TRITON_INTERPRET=1) instead; "
              "its times are not GPU numbers.", file=sys.stderr)
        suites, names, slug = ["smoke"], ["triton"], "cpu"
    problems = [p for s in suites for p in _suite(s, a)]
    if a.quick:
        problems = quick_subset(problems)
    problems = [p for p in problems if matches(p, a.match)]
    if a.limit:
        problems = problems[:a.limit]
    out = Path(a.out) if a.out else REPORTS / slug
    for bs, probs, ps in _groups(problems, names, passes):
        path = bench.sweep(bs, probs, ps, out_dir=out, gpus=gpus or None, fake_gpus=fake,
                           gate_batch=a.gate_batch, quick=a.quick,
                           timeout=a.timeout, timing=timing, warm=a.warm,
                           resume=a.resume)
    path = out / ("results.csv" if timing else "checks.csv")
    ran = {bench.row_key(bench.problem_cols(p), bench.PROBLEM_KEY) for p in problems}
    rows = [r for r in bench.read_rows(path) if r["backend"] in names and r["pass"] in passes
            and bench.row_key(r, bench.PROBLEM_KEY) in ran]  # this run's rows, not the whole file's
    _print_table(rows, timing)
    print(f"rows in {path}")
    if timing and gpus and not fake:  # the charts' ceiling line, measured as the rows were
        from .gpu.clocks import run as clocks
        with torch.cuda.device(gpus[0]):
            clocks([], [], out=out, with_gemm=True)


def _seeds(text: str) -> str:
    """--fuzz-seed: one integer or a comma list of them (kept as given)."""
    try:
        [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"takes an integer or a comma list of them (0,4,7), got {text!r}") from None
    return text


def _suite(name: str, a) -> list:
    """A suite's problems; `fuzz` drawn from --fuzz-seed (one or a comma list) / --fuzz-n."""
    from .problems import fuzz_problems
    from .suites import suite
    if name == "fuzz":
        return [p for seed in str(a.fuzz_seed).split(",")
                for p in fuzz_problems(a.fuzz_n, int(seed))]
    return suite(name)


MATCH_HELP = "only problems whose label contains this (a|b: either)"


def matches(p, match: str) -> bool:
    """`--match`: the problem's label contains the text, or one of its |-separated parts."""
    return any(m in p.label() for m in match.split("|"))


def _jagged_only(a, tool: str) -> None:
    from .decode import suites as decode_suites
    if set(_csv_list(a.suite)) & set(decode_suites()):
        sys.exit(f"{tool} takes the jagged suites; decode cells run through bench "
                 "(and python -m harness.gpu.decode_check)")


def _one_process(tool: str, names) -> None:
    """An experimental backend changes its process's kernels: it runs alone in a tool
    that keeps every backend in one process (`bench` gives each its own worker)."""
    from . import backends
    experiments = set(backends.names(experimental=True)) - set(backends.names())
    if len(names) > 1 and experiments & set(names):
        sys.exit(f"{tool} runs its backends in one process: run an experimental backend "
                 "alone, or A/B it with `bench` (a worker per backend)")


def cmd_profile(a):
    import torch
    from .suites import suite
    _jagged_only(a, "profile")
    _one_process("profile", _csv_list(a.backends))
    if not torch.cuda.is_available():
        sys.exit("profile needs a CUDA GPU")
    from .gpu.profile import run
    problems = [p for s in _csv_list(a.suite) for p in suite(s) if matches(p, a.match)]
    run(_csv_list(a.backends), problems, _csv_list(a.passes), n=a.n, rounds=a.rounds,
        host=a.host)


def cmd_clocks(a):
    import torch
    from .suites import suite
    _jagged_only(a, "clocks")
    _one_process("clocks", _csv_list(a.backends))
    if not torch.cuda.is_available():
        sys.exit("clocks needs a CUDA GPU")
    from .gpu.clocks import run
    problems = [p for s in _csv_list(a.suite) for p in suite(s) if matches(p, a.match)]
    if a.gemm:  # the ceilings first: the bf16 GEMM, then the fp8 (e4m3) one
        from .gpu.fp8_gemm import run as run_fp8
        run([], [], a.seconds, a.out, with_gemm=True)
        run_fp8(a.seconds, a.out)
    run(_csv_list(a.backends), problems, a.seconds, a.out, _csv_list(a.passes))


def _print_table(rows, timing):
    w = max([len(r["backend"]) for r in rows] + [7])
    for r in rows:
        timed = r["status"] == "ok" and timing and r.get("ms")
        what = (f"{float(r['tflops']):8.1f} TFLOP/s {float(r['ms']):9.3f} ms" if timed
                else r["status"])
        shape = (f"{r['suite']} {r['mode']} B{r['batch']} H{r['heads']}/{r['kv_heads']} "
                 f"D{r['head_dim']} L{r['max_seqlen_q']}/{r['max_seqlen_k']} s{r['sparsity']}"
                 + (" causal" if r["causal"] == "True" else ""))
        if r["mode"] == "decode":
            shape += (f" {'p' + r['page_size'] if r['page_size'] != '0' else 'contig'}"
                      f" splits{r['num_splits']}" + (" packed" if r["packed_q"] == "True" else ""))
            if timed and r.get("kv_tbps"):
                pct = (f" ({float(r['kv_tbps']) / float(r['copy_tbps']):.0%} of copy)"
                       if r.get("copy_tbps") else "")
                what = f"{float(r['kv_tbps']):6.3f} KV TB/s{pct} {what}"
                if r.get("graph_kv_tbps"):
                    what += f"  graph {float(r['graph_kv_tbps']):6.3f} TB/s"
        err = f"  {r['error'][:90]}" if r["status"] != "ok" else ""
        print(f"{r['backend']:{w}s} {r['pass']} {shape:55s} {what}{err}")


def _diagnostic(sub, name: str, help_: str, suite: str, backends: str):
    """A per-problem diagnostic's parser: which problems and backends."""
    s = sub.add_parser(name, help=help_)
    s.add_argument("--suite", default=suite)
    s.add_argument("--backends", default=backends)
    s.add_argument("--match", default="", help=MATCH_HELP)
    return s


def main(argv=None):
    from . import backends
    ap = argparse.ArgumentParser(prog="python -m harness")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="command")
    for name, help_ in (("bench", "gate then time backends over suites"),
                        ("check", "oracle gate only; prints a pass/fail table")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("--suite", default="gem-jagged,gem-cross,llm-dense",
                       help=f"comma list of: {', '.join(known_suites())} (default: %(default)s)")
        s.add_argument("--backends", default="all", help=(
            f"comma list of: {', '.join(backends.names())}; decode: "
            f"{', '.join(backends.names('decode'))}; or all (default: %(default)s); "
            "experiments, only when named: "
            f"{', '.join(sorted(set(backends.names(experimental=True)) - set(backends.names())))}"))
        s.add_argument("--passes", default="fwd,bwd", help="fwd and / or bwd (default: %(default)s)")
        s.add_argument("--quick", action="store_true", help="a subset of shapes, shorter timing")
        s.add_argument("--out", help="results folder (default reports/<gpu>)")
        s.add_argument("--gpus", help=("N: the first N visible GPUs; a comma list (0,2 or 3,): "
                                       "those GPUs; default: every visible GPU. One lane "
                                       "per GPU, jobs (backend, problem) longest first"))
        s.add_argument("--gate-batch", type=int, default=64,
                       help="sequences in the correctness gate's problem (0: the whole "
                            "problem; default: %(default)s)")
        s.add_argument("--timeout", type=float, default=600.0,
                       help="seconds per job (one backend on one problem, all passes; "
                            "default: %(default)s)")
        s.add_argument("--limit", type=int, default=0, help="only the first N problems")
        s.add_argument("--warm", type=int, default=0, help=(
            "bench: first gate every job in N processes spread over the GPUs, compiling "
            "the kernels in parallel into the disk caches, then time one job a GPU "
            "(default: %(default)s, no warm-up)"))
        s.add_argument("--resume", action="store_true", help=(
            "leave out the (backend, problem) jobs that have their rows in the results "
            "already (a stopped run goes on)"))
        s.add_argument("--match", default="", help=MATCH_HELP)
        s.add_argument("--fuzz-seed", type=_seeds, default="0",
                       help="the fuzz suite's seed, or seeds: 0,4,7 (default: %(default)s)")
        s.add_argument("--fuzz-n", type=int, default=40,
                       help="the fuzz suite's number of problems (default: %(default)s)")
    s = _diagnostic(sub, "profile", "host time, GPU kernel time and do_bench of each backend per "
                    "problem; several backends: an A/B", "gem-jagged", "tlx")
    s.add_argument("--passes", default="fwd,bwd")
    s.add_argument("--n", type=int, default=10, help="calls per measurement")
    s.add_argument("--rounds", type=int, default=1,
                   help="measure every backend this many times in turn (an A/B of backends)")
    s.add_argument("--host", action="store_true", help="also print a cProfile of the calls")
    s = _diagnostic(sub, "clocks", "sustained TFLOP/s, SM clock and power per backend and "
                    "problem", "llm-dense", "tlx,cute,fa4")
    s.add_argument("--passes", default="fwd", help="fwd and / or bwd")
    s.add_argument("--seconds", type=float, default=4.0, help="back-to-back calls per row")
    s.add_argument("--out", help="also append the rows to OUT/clocks.csv (charted by plot)")
    s.add_argument("--gemm", action="store_true",
                   help="first the sustained GEMM ceilings: bf16 (a row of backend gemm), "
                        "then e4m3 -> bf16 (torch._scaled_mm, a row of backend gemm-fp8)")
    s = sub.add_parser("compare", help="results folders side by side: each backend against "
                       "FA4 in its folder and against the first folder (an A/B of trees)")
    s.add_argument("dirs", nargs="+", help="results folders (bench --out); the first is the base")
    for name in ("plot", "report"):
        sub.add_parser(name, help=f"{name} from reports/<gpu>/results.csv").add_argument("--out")
    s = sub.add_parser("lines", help="code lines of each kernel style by role")
    s.add_argument("--out", help="folder for lines.md / lines.png (default reports/)")
    s = sub.add_parser("sidebyside", help="the TLX and CuteDSL kernels next to each other, "
                       "role by role (HTML)")
    s.add_argument("--out", help="the page (default reports/side_by_side.html)")
    s = sub.add_parser("worker")  # the sweep's worker process (not listed)
    s.add_argument("--backend", required=True)
    s.add_argument("--module", default="harness.backends")
    s.add_argument("--kind", default="jagged", choices=("jagged", "decode"))
    a = ap.parse_args(argv)

    if a.cmd == "worker":
        from .bench import serve
        serve(a.backend, a.module, a.kind)
    elif a.cmd in ("bench", "check"):
        cmd_sweep(a, timing=a.cmd == "bench")
    elif a.cmd == "profile":
        cmd_profile(a)
    elif a.cmd == "clocks":
        cmd_clocks(a)
    elif a.cmd == "compare":
        from .compare import compare
        print("\n".join(compare(a.dirs)))
    elif a.cmd == "plot":
        from .plots import plot_all
        for d in _report_dirs(a.out):
            for f in plot_all(d):
                print(f)
    elif a.cmd == "report":
        from .report import write_report
        for d in _report_dirs(a.out):
            print(write_report(d))
    elif a.cmd == "lines":
        from .lines import write_lines
        for f in write_lines(Path(a.out) if a.out else REPORTS):
            print(f)
    elif a.cmd == "sidebyside":
        from .sidebyside import write_side_by_side
        print(write_side_by_side(a.out or REPORTS / "side_by_side.html"))


if __name__ == "__main__":
    main()
