"""Where the first call's time goes: the Llama 1B-class model of ``benchmarks/hf_llama.py`` (sdpa
attention, 4 × 4096, bf16, unpadded) through ``torch.compile(backend="fxflash")``, once.

    FXFLASH_CACHE_DIR=/tmp/fxc TRITON_CACHE_DIR=/tmp/tc TORCHINDUCTOR_CACHE_DIR=/tmp/ic \\
        PYTHONPATH=. python benchmarks/probes/probe_first_call.py

Prints the seconds from ``torch.compile(...)`` to the first call's output (``torch.compile`` with
Inductor imports Inductor's compiler when it is called, the fxflash backend at its first call: each
compiler's imports are counted once either way) and the first call's alone, the next calls' time, fxflash's stages (the report's ``seconds``) and the tuner's
seconds per region (``tuning.history``) and Inductor's cache counters; the rest is Dynamo, Inductor and kernel loading. Point
the cache variables at empty directories for a cold call.
"""
import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import hf_llama  # noqa: E402

import fxflash  # noqa: E402,F401 - registers the backend
from fxflash.backend import recording  # noqa: E402
from fxflash.runtime import tuning  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compiler", choices=["fxflash", "inductor"], default="fxflash")
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--phases", action="store_true", help="print Dynamo's compile_times()")
    parser.add_argument("--dump", help="with --profile: also write the profile to this file (pstats)")
    options = parser.parse_args()
    compiler = options.compiler
    args = argparse.Namespace(layers=16, batch=4, seq=4096)
    model = hf_llama._model(args, "sdpa")
    inputs = hf_llama._inputs(args, False)
    profile = cProfile.Profile() if options.profile else None
    built = time.perf_counter()
    run = torch.compile(model, backend="fxflash" if compiler == "fxflash" else "inductor")
    start = time.perf_counter()
    with torch.no_grad(), recording() as reports:
        if profile:
            profile.enable()
        run(**inputs)
        torch.cuda.synchronize()
        if profile:
            profile.disable()
    total = time.perf_counter() - start
    with_construction = total + (start - built)
    with torch.no_grad():
        steady = time.perf_counter()
        for _ in range(5):
            run(**inputs)
        torch.cuda.synchronize()
    print(f"then {(time.perf_counter() - steady) / 5 * 1e3:.1f} ms per call")
    stages: dict = {}
    for report in {id(r): r for r in reports}.values():
        for stage, seconds in report.seconds.items():
            stages[stage] = stages.get(stage, 0.0) + seconds
    tuned = [f"{h['seconds']:.1f} s ({h['compile_seconds']:.1f} compiling {h['candidates']}, "
             f"{h.get('compiled_in_workers', 0)} kernels in worker processes)"
             if not h["from_disk"] else "from disk" for h in tuning.history]
    print(f"{compiler}: torch.compile and first call {with_construction:.1f} s (first call {total:.1f} s); fxflash stages", {k: round(v, 2) for k, v in stages.items()},
          "; tuning", tuned)
    from torch._dynamo.utils import counters

    print("inductor counters", {k: v for k, v in counters["inductor"].items() if "cache" in k},
          "aot_autograd", dict(counters["aot_autograd"]))
    if options.phases:
        print(torch._dynamo.utils.compile_times(repr="str"))
    if profile:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(options.profile)
        if options.dump:
            profile.dump_stats(options.dump)


if __name__ == "__main__":
    main()
