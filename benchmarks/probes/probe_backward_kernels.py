"""Each kernel of a training step through a fused region, by the torch profiler: the forward, and
the backward's L, Δ, dK·dV and dQ; bf16, B = 4, H = 16, L = 4096, D = 64, no mask and causal.

    PYTHONPATH=. python benchmarks/probes/probe_backward_kernels.py

Prints the profiler's table of five steps (CUDA time per kernel, summed over the five).
"""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_training import attention, causal_attention  # noqa: E402

import fxflash  # noqa: E402

B, H, L, D = 4, 16, 4096, 64


def main() -> None:
    for fn in (attention, causal_attention):
        q, k, v, grad = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        fast = fxflash.optimize(fn)
        for _ in range(3):   # compiled and tuned
            fast(q, k, v).backward(grad)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fast(q, k, v).backward(grad)
            torch.cuda.synchronize()
        print(fn.__name__)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=40))


if __name__ == "__main__":
    main()
