"""Time one fused region under each tile configuration, and the tuner's pick.

    PYTHONPATH=. python benchmarks/tile_sweep.py --variant evoformer_row --batch 8 --head-dim 64
    PYTHONPATH=. python benchmarks/tile_sweep.py --variant sliding_window --gqa --seqlen 4096
    PYTHONPATH=. python benchmarks/tile_sweep.py --variant evoformer_row --batch 8 --gluon
    PYTHONPATH=. python benchmarks/tile_sweep.py --variant vanilla --seqlen 1024 --gluon-only

For profiling a variant whose fused kernel is slower than expected: prints, for every
(BLOCK_M, BLOCK_N, num_warps, num_stages) in the autotuner's table and a few beyond it, the
``do_bench`` median of the whole optimized call, each tile timed after a rest
(``bench_attention.settled_ms``: timed one after another without it, a tile that follows a
hotter one runs at a lower clock), and the median of its CUDA-graph replays
(``do_bench_cudagraph``: no host time between launches; a large gap between the two says the
call is host-bound), then what fxflash's tuner chose (timed afresh: the tuning cache is not
read). ``--gluon`` adds the Gluon configurations (Hopper; two-stream ones for differential
attention), ``--gluon-only`` times only those.
Each configuration's output is checked against the tuner's pick (its largest difference
relative to the output's largest value). Softmax-suite variants (vanilla … document_mask) take
the suite's shapes: bf16, 16 query heads (2 KV heads with ``--gqa``), head dim 64, batch ×
seqlen = 16k tokens.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fxflash  # noqa: E402
from fxflash.codegen import emit  # noqa: E402
from fxflash.runtime import tuning
from fxflash.codegen.gluon_plan import GLUON_CONFIGS, PERSISTENT_CONFIGS, STREAM_CONFIGS  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from bench_attention import SUITES, beyond_cases, case, medians, settled_ms  # noqa: E402

EXTRA_CONFIGS = [(64, 256, 4, 1), (128, 256, 8, 1), (64, 32, 4, 2), (32, 64, 4, 2), (64, 64, 8, 2)]
# Gluon configurations beyond gluon.GLUON_CONFIGS and PERSISTENT_CONFIGS (``--gluon``): 64-key
# tiles at head dim 64, more persistent grids (regions without tile masks only)
GLUON_EXTRA = {64: [("gluon", 2, 64, 3, 0, 1), ("gluon", 1, 64, 3, 0, 2), ("gluon", 2, 64, 4, 0, 1),
                    ("gluon", 3, 64, 3, 0, 1), ("gluon", 3, 128, 3, 1, 1, 1), ("gluon", 2, 128, 2, 0, 1, 1),
                    ("gluon", 1, 128, 2, 0, 2, 1), ("gluon", 3, 128, 4, 0, 1, 1), ("gluon", 2, 128, 4, 0, 1, 1),
                    ("gluon", 3, 64, 4, 0, 1, 1), ("gluon", 1, 64, 2, 0, 3, 1), ("gluon", 1, 64, 3, 0, 3, 1),
                    ("gluon", 2, 64, 2, 0, 2, 1), ("gluon", 1, 64, 2, 0, 2, 1), ("gluon", 1, 64, 3, 0, 2, 1)],
               128: [("gluon", 2, 64, 3, 0, 1, 1), ("gluon", 2, 64, 2, 0, 1, 1), ("gluon", 2, 64, 3, 1, 1, 1),
                     ("gluon", 1, 64, 2, 0, 2, 1), ("gluon", 1, 64, 3, 0, 2, 1)]}


def add_case_options(parser) -> None:
    """The options that pick one suite case (``case_of``)."""
    parser.add_argument("--variant", default="evoformer_row")
    parser.add_argument("--batch", type=int, default=8, help="the case whose B (or B·N_seq / 256) matches")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--gqa", action="store_true", help="softmax suite: 2 KV heads")


def case_of(opts) -> tuple:
    """``(fields, fn, args, flops)`` of the suite case the options name, on the GPU in bf16."""
    if opts.variant in SUITES["softmax"]:
        B, H, D = max(1, 16384 // opts.seqlen), 16, 64
        hkv = 2 if opts.gqa else H
        fn, args = case(opts.variant, B, H, hkv, opts.seqlen, D, "cuda", torch.bfloat16)[:2]
        fields = dict(B=B, H=H, Hkv=hkv, M=opts.seqlen, N=opts.seqlen, D=D, Dv=D)
        return fields, fn, args, 4 * B * H * opts.seqlen * opts.seqlen * D
    for c in beyond_cases(opts.variant, [opts.seqlen], "cuda", torch.bfloat16):
        if c[0]["D"] == opts.head_dim and c[0]["B"] in (opts.batch, opts.batch * 256):
            return c
    raise SystemExit(f"no {opts.variant} case with head dim {opts.head_dim}, batch {opts.batch} and seqlen "
                     f"{opts.seqlen} in the suite")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_case_options(parser)
    parser.add_argument("--gluon", action="store_true", help="also time the Gluon configurations (Hopper)")
    parser.add_argument("--gluon-only", action="store_true", help="time the Gluon configurations only")
    opts = parser.parse_args()
    fields, fn, args, flops = case_of(opts)
    print(opts.variant, fields, torch.cuda.get_device_name(), flush=True)
    fast = fxflash.optimize(fn)
    reference = fast(*args).float()
    configs = [] if opts.gluon_only else emit.tile_configs(fields["D"], fields["Dv"], 2) + EXTRA_CONFIGS
    if opts.gluon or opts.gluon_only:
        configs += [*GLUON_CONFIGS.get(fields["D"], ()), *PERSISTENT_CONFIGS.get(fields["D"], ()),
                    *GLUON_EXTRA.get(fields["D"], ()), *STREAM_CONFIGS.get(max(fields["D"], fields["Dv"]), ())]
    for tile in configs:
        name = f"{tuning.describe(tile):<72}"
        try:
            with tuning.pinned(tile):
                diff = ((fast(*args).float() - reference).abs().max() / reference.abs().max()).item()
                ms, graph_ms = medians(lambda: fast(*args))
            print(f"  {name} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s, graph replay {graph_ms:8.3f} ms, "
                  f"rel. diff from the tuner's pick {diff:.1e}", flush=True)
        except Exception as exc:  # out of shared memory or registers for this tile
            print(f"  {name} {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    fxflash.config.kernel_cache_dir = tempfile.mkdtemp()  # an empty tuning cache: time afresh
    tuning.forget()
    fast(*args)
    ms = settled_ms(lambda: fast(*args))
    picks = sorted({tuning.describe(tile) for tile in tuning.chosen().values()})
    print(f"  tuned: {ms:.3f} ms, picked {picks}", flush=True)


if __name__ == "__main__":
    main()
