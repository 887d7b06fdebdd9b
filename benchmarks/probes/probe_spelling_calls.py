"""Where one call of a mask's spelling goes (``benchmarks/bench_spellings.py``'s shapes: B = 4,
H = 16, L = 4096, D = 64, bf16): the call's median (``do_bench``), the host's time per call with
the GPU running behind it, and the GPU's time per call by kernel (torch.profiler), for the spellings
named (default: the causal and window spellings, arange against an additive ``-inf`` triangle).

    PYTHONPATH=. python benchmarks/probes/probe_spelling_calls.py [spelling ...]
"""
import os
import sys
import time

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_spellings as spellings  # noqa: E402

import fxflash  # noqa: E402

CALLS = 50


def main() -> None:
    names = sys.argv[1:] or ["causal_arange", "causal_additive_full", "window_tril_triu", "window_additive_full"]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(spellings.B, spellings.H, spellings.L, spellings.D, device="cuda", dtype=torch.bfloat16,
                           generator=g) for _ in range(3))
    for name in names:
        fast = fxflash.optimize(getattr(spellings, name))
        with torch.no_grad():
            fast(q, k, v), fast(q, k, v)   # tuned, then a bound launch
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(CALLS):
                fast(q, k, v)
            host = (time.perf_counter() - start) / CALLS * 1e3
            torch.cuda.synchronize()
            ms = do_bench(lambda: fast(q, k, v), warmup=30, rep=200)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    fast(q, k, v)
                torch.cuda.synchronize()
        kernels = {e.key[:60]: round(e.device_time_total / 20 / 1e3, 4) for e in prof.key_averages()
                   if e.device_time_total > 0}
        print(f"{name}: call {ms:.3f} ms, host {host:.3f} ms per call, GPU per call {kernels}")


if __name__ == "__main__":
    main()
