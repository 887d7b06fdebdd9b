"""Does the tuner's timing agree with the same timing taken after tuning? (causal 16k, vanilla 4k)

    PYTHONPATH=. python benchmarks/probe_tuner_bias.py

Tunes afresh, keeps the tuner's own launch function, then times two tiles with the tuner's
``do_bench`` settings (five times), with longer ``do_bench`` runs, by CUDA-graph replay and
through the whole optimized call: a tuner's pick that loses in all four after tuning was
decided by the moment of tuning, not by the kernels.
"""
import os
import statistics
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
import fxflash  # noqa: E402
from fxflash.codegen import tuning  # noqa: E402
from bench_attention import case  # noqa: E402

TILES = [(128, 64, 8, 3), (64, 64, 4, 3)]  # the pair the tuner misordered (seventh session)


def main():
    captured = {}
    tune = tuning._tune

    def keep_launcher(name, key, candidates, frame, run, timer, device_index):
        captured["run"] = run  # the tuner's own launch function: run(tile)
        return tune(name, key, candidates, frame, run, timer, device_index)

    tuning._tune = keep_launcher
    for variant, S in (("causal", 16384), ("vanilla", 4096)):
        fn, args = case(variant, 16384 // S, 16, 16, S, 64, "cuda", torch.bfloat16)[:2]
        tuning.forget(disk=True)
        fast = fxflash.optimize(fn)
        fast(*args)
        run = captured["run"]
        print(variant, S, "tuner picked", tuning.history[-1]["config"], flush=True)
        for tile in TILES * 2:
            short = [triton.testing.do_bench(lambda: run(tile), warmup=5, rep=25) for _ in range(5)]
            long_ = triton.testing.do_bench(lambda: run(tile), warmup=25, rep=100)
            with torch.cuda.stream(torch.cuda.Stream()):
                graph = triton.testing.do_bench_cudagraph(lambda: run(tile), rep=100)
            with tuning.pinned(tile):
                whole = triton.testing.do_bench(lambda: fast(*args), warmup=25, rep=100)
            print(f"  {tile}: tuner-style {statistics.median(short):.4f} ({min(short):.4f}-{max(short):.4f}) "
                  f"long {long_:.4f} graph {graph:.4f} whole call {whole:.4f}", flush=True)


if __name__ == "__main__":
    main()
