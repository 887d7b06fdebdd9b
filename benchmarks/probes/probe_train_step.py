"""Where one forward plus backward goes, kernel by kernel: the CUDA time of each kernel over a few
steps (torch.profiler), fxflash beside torch.compile (a ``beyond``-suite program) or SDPA (the
softmax family, as the ``train`` suite builds it), and the tiles fxflash's tuner chose.

    PYTHONPATH=. python benchmarks/probes/probe_train_step.py [--variant evoformer_row] [--batch 8]
    PYTHONPATH=. python benchmarks/probes/probe_train_step.py --variant vanilla --batch 4 [--heads 16 --kv-heads 16 --head-dim 64]

``FXFLASH_DQ_ATOMICS=0`` (or ``=1``) fixes how the backward computes dQ instead of the tuner.
"""
import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fxflash  # noqa: E402,F401
from bench_attention import NO_GRADIENT, SUITES, beyond_cases, case  # noqa: E402
from fxflash.runtime import tuning  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="evoformer_row")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=16, help="the softmax family's query heads")
    parser.add_argument("--kv-heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=64)
    opts = parser.parse_args()
    if opts.variant in SUITES["softmax"]:
        shape = (opts.batch, opts.heads, opts.kv_heads, opts.seqlen, opts.head_dim)
        fn, args, _, _, sdpa = case(opts.variant, *shape, "cuda", torch.bfloat16)
        fields, other = dict(zip(("B", "H", "Hkv", "S", "D"), shape)), ("sdpa", sdpa)
    else:
        fields, fn, args, _ = next(iter(beyond_cases(opts.variant, [opts.seqlen], "cuda", torch.bfloat16,
                                                     batches=(opts.batch,))))
        other = ("torch_compile", torch.compile(fn))
    skip = NO_GRADIENT.get(opts.variant, ())
    leaves = [a.requires_grad_() if i not in skip and a.is_floating_point() else a for i, a in enumerate(args)]
    grad = torch.randn_like(fn(*leaves).detach())
    for name, call in (("fxflash", fxflash.optimize(fn)), other):
        if call is None:
            continue
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
        if name == "fxflash":
            for choice in tuning.history:
                print(f"   tuned {choice['kernel']}: {tuning.describe(choice['config'])}")


if __name__ == "__main__":
    main()
