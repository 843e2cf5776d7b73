"""CuteDSL fp8 decode A/B cells: python c64_cells.py <tag>. 64-row cells (GQA 4 x 16 new
rows) with an e4m3 q, a 16-row control, a bf16-q 64-row control; each gated (oracle, lse,
repeat) at the gate size, then graph-replayed ms (eager beside) at full size."""
import os, sys, time
import torch
from harness import backends, decode
from harness.bench import _free, graph_time_ms, time_ms
from harness.decode import sweep_cells, with_bf16_q

K = 1024


def main():
    tag = sys.argv[1]
    b = backends.get("cute", None, "decode")
    fn = b.fn()
    print(tag, "from", __import__("kernels_cute").__file__, flush=True)
    fp8 = [p for p in sweep_cells("fp8") if p.dtype == "fp8"]
    b8 = next(p for p in fp8 if p.batch == 8 and not p.page_size)
    b1 = next(p for p in fp8 if p.batch == 1)
    b64 = next(p for p in fp8 if p.batch == 64)
    p16 = next(p for p in fp8 if p.page_size)
    cells = [(b8.replace(len_q=16), "e4m3"), (b1.replace(len_q=16), "e4m3"),
             (b64.replace(len_q=16, cache_len=4 * K), "e4m3"), (p16.replace(len_q=16), "e4m3"),
             (b8.replace(len_q=16, page_size=128), "e4m3"),
             (b8.replace(len_q=16, head_dim=64), "e4m3"),
             (b8, "e4m3"), (b8.replace(len_q=16), "bf16")]
    for p, qm in cells:
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
