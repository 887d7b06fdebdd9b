"""Where a host-bound call's time goes: one spelling of ``benchmarks/bench_spellings.py`` (B = 4,
H = 16, L = 4096, D = 64, bf16) through ``fxflash.optimize``: the host's time per call with the GPU
running behind it and with the GPU idle between calls, then torch.profiler's CPU activity over 100
calls (the ops' own CPU time; the profiler adds its own overhead).

    PYTHONPATH=. python benchmarks/probes/probe_host_time.py [spelling]   # default window_tril_triu
"""
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_spellings as spellings  # noqa: E402

import fxflash  # noqa: E402


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "window_tril_triu"
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(spellings.B, spellings.H, spellings.L, spellings.D, device="cuda", dtype=torch.bfloat16,
                           generator=g) for _ in range(3))
    fast = fxflash.optimize(getattr(spellings, name))
    with torch.no_grad():
        fast(q, k, v), fast(q, k, v)   # tuned, then a bound launch
        torch.cuda.synchronize()
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(300):
                fast(q, k, v)
            host = (time.perf_counter() - start) / 300 * 1e6
            torch.cuda.synchronize()
            print(f"{name}: host {host:.1f} µs per call, the GPU running behind")
        idle = 0.0
        for _ in range(100):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fast(q, k, v)
            idle += time.perf_counter() - start
        print(f"{name}: host {idle / 100 * 1e6:.1f} µs per call, the GPU idle")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(100):
                fast(q, k, v)
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
