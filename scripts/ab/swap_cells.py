"""fp8 decode A/B cells, e4m3 and bf16 q: python swap_cells.py <tag>  (TLX). The fp8
sweep's cells and a 32-row twin; each gated (oracle, lse, repeat) at the gate size with
its q, then graph-replayed ms (eager beside) at full size."""
import os, sys, time
import torch
from harness import backends, decode
from harness.bench import _free, graph_time_ms, time_ms
from harness.decode import sweep_cells, with_bf16_q

def main():
    tag = sys.argv[1]
    be = os.environ.get("BACKEND", "tlx")
    b = backends.get(be, None, "decode")
    fn = b.fn()
    print(tag, "from", __import__(f"kernels_{be}").__file__, flush=True)
    cells = [p for p in sweep_cells("fp8") if p.dtype == "fp8"]
    b8 = next(p for p in cells if p.batch == 8 and not p.page_size)
    cells.append(b8.replace(len_q=8))  # GQA 4 x 8 rows: the 32-row tile
    cells.append(b8.replace(len_q=16))  # GQA 4 x 16 rows: the 64-row tile
    if os.environ.get("CELLS2"):  # pages of 128 (TMA in a page), D 64, e4m3 q only
        cells = [b8, b8.replace(page_size=128), b8.replace(head_dim=64),
                 b8.replace(head_dim=64, len_q=8), b8.replace(len_q=8),
                 b8.replace(len_q=16), next(p for p in cells if p.page_size)]
    for p in cells:
        for qm in os.environ.get("QM", "e4m3" if os.environ.get("CELLS2") else "e4m3,bf16").split(","):
            t0 = time.time()
            conv = with_bf16_q if qm == "bf16" else (lambda x: x)
            gp = p.gate(min(p.batch, decode.GATE_MAX_BATCH))
            rep = decode.check(conv(gp.build("cuda")), gp, fn, check_lse=True, repeat=True)
            _free()
            if not rep.ok:
                print(f"{tag:5s} q {qm} {p.label():58s} GATE FAIL {rep}", flush=True)
                continue
            inp = conv(p.build("cuda"))
            run = lambda: decode.call(fn, inp, p, return_lse=False)
            first = run()
            ok = bool(torch.isfinite(first[0] if isinstance(first, tuple) else first).all())
            ms = time_ms(run, False)
            why = []
            g = graph_time_ms(run, False, why=why) or float("nan")
            print(f"{tag:5s} q {qm} {p.label():58s} finite {ok} eager {ms:.5f} graph {g:.5f} "
                  f"TB/s {p.kv_bytes() / (g * 1e-3) / 1e12:.3f} {';'.join(why)} "
                  f"({time.time() - t0:.0f}s)", flush=True)
            del inp
            _free()

if __name__ == "__main__":
    main()
