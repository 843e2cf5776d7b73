"""The TLX backward's own host Python (launches stubbed, as scripts/ab/host_cpu.py) on a
worker thread woken for each call, as autograd wakes its device thread for each CUDA
backward: median microseconds a call over 16 rounds of 100, the decisions memoized per
site (bwd_hopper.MEMO) and not, interleaved in one process. The calling thread's figure
for the same calls is host_cpu.py's.

    PYTHONPATH=. python scripts/ab/host_cold.py 24,2,2,128,128,0 [B,H,HKV,D,L,causal ...]
"""
import os
import queue
import statistics
import sys
import threading
import time

os.environ["TRITON_INTERPRET"] = "1"  # the list kernels' first build

import jagged.launch as launch  # noqa: E402
from kernels_tlx import bwd_hopper as bw  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import host_cpu  # noqa: E402


def main():
    bw.fast_at = bw.fast = host_cpu.Stub
    bw.num_sms = lambda dev: 132
    jobs, times = queue.Queue(), queue.Queue()

    def worker():
        while True:
            job = jobs.get()
            time.sleep(0.0003)  # idle between calls, as between training steps' backwards
            t = time.perf_counter()
            job()
            times.put(time.perf_counter() - t)
    threading.Thread(target=worker, daemon=True).start()
    for spec in sys.argv[1:] or ["24,2,2,128,128,0"]:
        B, H, HKV, D, L, c = map(int, spec.split(","))
        f = host_cpu.call(B, H, HKV, D, L, bool(c))
        launch.INTERPRET = True
        f()  # the tile lists, interpreted and cached
        launch.INTERPRET = False  # descriptors as on a GPU: cached by address
        f()
        res = {False: [], True: []}
        for r in range(16):
            for memo in (False, True) if r % 2 else (True, False):
                bw.MEMO = memo
                one = []
                for _ in range(100):
                    jobs.put(f)
                    one.append(times.get())
                res[memo].append(statistics.median(one) * 1e6)
        print(f"{spec}: woken thread, median us a call: decided each call "
              f"{statistics.median(res[False]):.1f}, once a site {statistics.median(res[True]):.1f}",
              flush=True)


if __name__ == "__main__":
    main()
