"""Time one fused region under each tile configuration, and the autotuner's pick.

    PYTHONPATH=. python benchmarks/tile_sweep.py --variant evoformer_row --batch 8 --head-dim 64

For profiling a variant whose fused kernel is slower than expected: prints, for every
(BLOCK_M, BLOCK_N, num_warps, num_stages) in the autotuner's table and a few beyond it, the
``do_bench`` median of the whole optimized call, then what ``triton.autotune`` chose.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fxflash  # noqa: E402
from fxflash.codegen import emit, launch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from bench_attention import beyond_cases  # noqa: E402

EXTRA_CONFIGS = [(64, 256, 4, 1), (128, 256, 8, 1), (64, 32, 4, 2), (32, 64, 4, 2), (64, 64, 8, 2)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="evoformer_row")
    parser.add_argument("--batch", type=int, default=8, help="the case whose B (or B·N_seq / 256) matches")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seqlen", type=int, default=4096)
    opts = parser.parse_args()
    cases = [c for c in beyond_cases(opts.variant, [opts.seqlen], "cuda", torch.bfloat16)
             if c[0]["D"] == opts.head_dim and c[0]["B"] in (opts.batch, opts.batch * 256)]
    fields, fn, args, flops = cases[0]
    print(opts.variant, fields, torch.cuda.get_device_name(), flush=True)
    fxflash.config.autotune = False
    fast = fxflash.optimize(fn)
    configs = emit.tile_configs(fields["D"], fields["Dv"], 2) + EXTRA_CONFIGS
    for bm, bn, warps, stages in configs:
        cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
        launch.tile_config = lambda plan, device, cfg=cfg: cfg
        try:
            fast(*args)
            ms = triton.testing.do_bench(lambda: fast(*args), warmup=25, rep=100, return_mode="median")
            print(f"  {bm:>4} {bn:>4} w{warps} s{stages}: {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s", flush=True)
        except Exception as exc:  # out of shared memory or registers for this tile
            print(f"  {bm:>4} {bn:>4} w{warps} s{stages}: {type(exc).__name__}", flush=True)
    fxflash.config.autotune = True
    tuned = fxflash.optimize(fn)
    tuned(*args)
    ms = triton.testing.do_bench(lambda: tuned(*args), warmup=25, rep=100, return_mode="median")
    from fxflash.codegen.op import _REGISTRY

    picks = {str(getattr(e.kernel, "best_config", None)) for e in _REGISTRY.values()} - {"None"}
    print(f"  autotuned: {ms:.3f} ms, picked {sorted(picks)}", flush=True)


if __name__ == "__main__":
    main()
