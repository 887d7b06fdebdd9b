"""Host time per call of an optimized softmax-suite variant, and where it goes.

    PYTHONPATH=. python benchmarks/host_profile.py --variant sliding_window [--gqa] [--calls 2000] [--gluon]

The problem is tiny (B=1, 16 heads, 128 tokens), so the GPU finishes each kernel long before
the host issues the next: wall time over calls is the host time per call. Prints it for the
optimized call (with and without bound launches: launch.Launcher) and eager, then the top of a
cProfile of the optimized calls. ``--gluon`` makes the tuner keep the region's first Gluon
configuration (Hopper only); its bound launch (``launch.BoundGluonLaunch``) is timed with
``config.bind_gluon_launches`` on, the other number with both settings off.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fxflash  # noqa: E402
from fxflash.runtime import launch  # noqa: E402
from fxflash.codegen.gluon_plan import GLUON_CONFIGS  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from bench_attention import case  # noqa: E402


def per_call_us(fn, args, calls: int) -> float:
    for _ in range(20):
        fn(*args)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="vanilla")
    parser.add_argument("--gqa", action="store_true")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--gluon", action="store_true", help="run the Gluon kernel (first configuration)")
    opts = parser.parse_args()
    if opts.gluon:  # the tuner's choice, so that the launch is remembered like a tuned one
        launch.tile_for = lambda plan, inputs, frame, run: GLUON_CONFIGS[64][0]
        fxflash.config.bind_gluon_launches = True
    measure(opts)


def measure(opts) -> None:
    fn, args = case(opts.variant, 1, 16, 2 if opts.gqa else 16, 128, 64, "cuda", torch.bfloat16)[:2]
    fast = fxflash.optimize(fn)
    label = opts.variant + (" (GQA)" if opts.gqa else "") + (" (Gluon kernel)" if opts.gluon else "")
    fxflash.config.bind_launches = False
    unbound = per_call_us(fast, args, opts.calls)
    fxflash.config.bind_launches = True
    print(f"{label}: fxflash {per_call_us(fast, args, opts.calls):.1f} us/call "
          f"({unbound:.1f} with every launch through Triton's JIT, config.bind_launches off), "
          f"eager {per_call_us(fn, args, opts.calls):.1f} us/call", flush=True)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(opts.calls):
        fast(*args)
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
