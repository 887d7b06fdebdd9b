"""Where one forward plus backward of a ``beyond``-suite program goes, kernel by kernel: the CUDA
time of each kernel over a few steps (torch.profiler), fxflash beside torch.compile.

    PYTHONPATH=. python benchmarks/probes/probe_train_step.py [--variant evoformer_row] [--batch 8]
"""
import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fxflash  # noqa: E402,F401
from bench_attention import NO_GRADIENT, beyond_cases  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="evoformer_row")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=4096)
    opts = parser.parse_args()
    fields, fn, args, _ = next(iter(beyond_cases(opts.variant, [opts.seqlen], "cuda", torch.bfloat16,
                                                 batches=(opts.batch,))))
    skip = NO_GRADIENT.get(opts.variant, ())
    leaves = [a.requires_grad_() if i not in skip and a.is_floating_point() else a for i, a in enumerate(args)]
    grad = torch.randn_like(fn(*leaves).detach())
    for name, call in (("fxflash", fxflash.optimize(fn)), ("torch_compile", torch.compile(fn))):
        def step():
            for t in leaves:
                t.grad = None
            call(*leaves).backward(grad)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        print(f"== {name} {fields}: CUDA time per step, by kernel")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))


if __name__ == "__main__":
    main()
