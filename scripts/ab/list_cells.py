"""Window-list A/B: python list_cells.py <tag> <backends> [g]
The window list kernel alone under graph replay (fwd over cu_q with the check, bwd over
cu_k), its order against the torch reference, then each backend's gem-jagged 0.1 cells,
oracle-gated (g), eager and replayed."""
import sys, time
import torch
from harness import backends
from harness.bench import _bench_pass, _free, call_kw
from harness.oracle import check
from harness.problems import suites
import jagged
from jagged import tiles

LABELS = ["self B1152 H4/4 D128 Lq256 Lk256 s0.1 bf16", "self B1152 H4/4 D128 Lq512 Lk512 s0.1 bf16",
          "self B1152 H4/4 D128 Lq1024 Lk1024 s0.1 bf16"]


def list_us(f, n=50, reps=20):
    f(); torch.cuda.synchronize()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f(); f()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(n):
                f()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = []
    for _ in range(5):
        g.replay(); torch.cuda.synchronize()
        e0.record(); [g.replay() for _ in range(reps)]; e1.record(); torch.cuda.synchronize()
        best.append(e0.elapsed_time(e1) * 1e3 / (reps * n))
    del g
    return sorted(best)[len(best) // 2]


def main():
    tag, bes = sys.argv[1], sys.argv[2].split(",")
    gate = "g" in sys.argv[3:]
    print(tag, "jagged from", jagged.__file__, "ORDER_LANES", getattr(tiles, "ORDER_LANES", "-"),
          flush=True)
    pool = {p.label(): p for p in suites()["gem-jagged"]}
    for lab in LABELS:
        inp = pool[lab].build("cuda")
        cq, ck = inp.cu_seqlens_q, inp.cu_seqlens_k
        n, mq = int(cq[-1]), int((cq[1:] - cq[:-1]).max())
        row = []
        from kernels_tlx.fwd_hopper import WINDOW_CONFIG as FW
        from kernels_tlx.bwd_hopper import BLOCK_N, window_config
        for name, a, b, bm, bn, chk in (("fwd", cq, ck, FW.block_m, FW.block_n, (n, n, mq, mq)),
                                        ("bwd", ck, cq, BLOCK_N, window_config(128).block_m, None)):
            o, c, w = tiles._build_window_tiles(a, b, n, mq, bm, bn, chk)
            ro, rc, rw = tiles.window_tiles_reference(a.cpu(), b.cpu(), n, bm, bn)
            live = int(rc)
            ok = torch.equal(rw, w.cpu()) and int(c) == live
            # the live windows' order: the reference's buckets (new arms) or its sort (old)
            same = torch.equal(o.cpu()[:live], ro[:live])
            us = list_us(lambda: tiles._build_window_tiles(a, b, n, mq, bm, bn, chk))
            row.append(f"{name} list {us:6.2f} us (live {live}, win ok {ok}, order==ref {same})")
        print(f"{tag:5s} {lab[6:40]:34s} " + " | ".join(row), flush=True)
        del inp; _free()
    for be in bes:
        fn = backends.get(be).fn()
        for lab in LABELS:
            p = pool[lab]
            kw = call_kw(p)
            for ps in ("fwd", "bwd"):
                if ps == "fwd" and "Lq1024" in lab:
                    continue
                t0 = time.time()
                if gate:
                    rep = check(p.build("cuda"), fn, backward=ps == "bwd", check_lse=True, **kw)
                    _free()
                    if not rep.ok:
                        print(f"{tag} {be} {ps} {lab} GATE FAIL\n{rep}", flush=True)
                        continue
                ms, host, graph, why, finite = _bench_pass(fn, p.build("cuda"), ps, kw, False)
                _free()
                print(f"{tag:5s} {be:4s} {ps} {lab[6:40]:34s} {'gated ' if gate else ''}finite {finite} "
                      f"eager {ms:.4f} graph {graph if graph is None else f'{graph:.4f}'} "
                      f"({time.time() - t0:.0f}s) {why}", flush=True)


if __name__ == "__main__":
    main()
