"""fp8 decode A/B cells: python dec_cells.py <tag> [bf16]  (the fp8 sweep's cells and a
32-row twin; with bf16 the sweep's bf16 cells too; BACKEND=cute for CuteDSL's). Gate (oracle, lse, repeat) then eager
and graph-replayed ms, as the bench's decode rows."""
import os, sys, time
from harness import backends
from harness.bench import run_decode_problem
from harness.decode import sweep_cells

def main():
    tag = sys.argv[1]
    be = os.environ.get("BACKEND", "tlx")
    b = backends.get(be, None, "decode")
    fn = b.fn()
    mod = __import__(f"kernels_{be}")
    print(tag, be, "from", mod.__file__, flush=True)
    cells = [p for p in sweep_cells("fp8") if p.dtype == "fp8" or "bf16" in sys.argv[2:]]
    b8 = next(p for p in cells if p.dtype == "fp8" and p.batch == 8 and not p.page_size)
    cells.append(b8.replace(len_q=8))  # GQA 4 x 8 rows: the 32-row tile
    for p in cells:
        t0 = time.time()
        r = run_decode_problem(b, fn, p)[0]
        print(f"{tag:4s} {p.label():62s} {r['status']} eager {r.get('ms', '')} graph "
              f"{r.get('graph_ms', '')} TB/s {r.get('graph_kv_tbps', '')} "
              f"{r.get('error', '')[:120]} ({time.time() - t0:.0f}s)", flush=True)

if __name__ == "__main__":
    main()
