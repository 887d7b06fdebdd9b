"""Is a tile faster because of the kernel, or because of the GPU's clock while it is timed?

    PYTHONPATH=. python benchmarks/probes/probe_power.py --variant causal --seqlen 16384

Times two tiles of one case three ways, twice each, logging the SM clock, power and
temperature (``nvidia-smi -lms``) during every phase: interleaved launches (the tuner's
rounds), sustained ``do_bench`` blocks of one tile (as the suite times), and CUDA-graph
replays of one tile. If the orders disagree and the clocks differ between the phases, the
order is the power state's, not the kernels'.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path[:0] = [os.path.dirname(__file__), os.path.join(os.path.dirname(__file__), "..")]
import fxflash  # noqa: E402
from fxflash.codegen import tuning  # noqa: E402
from tile_sweep import add_case_options, case_of  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_case_options(parser)
    parser.add_argument("--tiles", nargs=2, default=["128x64x8x3", "64x64x4x3"])
    parser.add_argument("--trace", action="store_true",
                        help="instead: after 1 s idle, each tile back to back for 400 ms, twice; "
                             "median launch time per 20 ms (how fast the clock settles)")
    parser.add_argument("--rest-ms", type=float, default=0, help="--trace: idle between the tiles' runs")
    opts = parser.parse_args()
    tiles = [tuple(map(int, t.split("x"))) for t in opts.tiles]
    fields, fn, args, _ = case_of(opts)
    fast = fxflash.optimize(fn)
    for tile in tiles:
        with tuning.pinned(tile):
            fast(*args)

    def run_of(tile):
        def run():
            with tuning.pinned(tile):
                fast(*args)
        return run

    runs = {tile: run_of(tile) for tile in tiles}
    clock = tuning.CudaClock()
    print(opts.variant, fields, torch.cuda.get_device_name(), flush=True)
    if opts.trace:
        return trace(runs, opts.rest_ms)
    log = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits", "-lms", "50"], stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    phases = []

    def phase(label, fn):
        torch.cuda.synchronize()
        t0 = time.time()
        ms = fn()
        torch.cuda.synchronize()
        phases.append((label, t0, time.time(), ms))

    for rep in range(2):
        phase("interleaved", lambda: {t: statistics.median(s) for t, s in
                                      tuning.interleaved_samples(runs, clock, 100).items()})
        for tile in tiles:
            phase(f"do_bench {tile}", lambda: {tile: triton.testing.do_bench(runs[tile], warmup=100, rep=1000)})
        for tile in tiles:
            def graph(tile=tile):
                with torch.cuda.stream(torch.cuda.Stream()):
                    return {tile: triton.testing.do_bench_cudagraph(runs[tile], rep=1000)}
            phase(f"graph {tile}", graph)
    time.sleep(0.5)
    log.terminate()
    out, _ = log.communicate()
    samples = []
    for line in out.splitlines():
        stamp, *vals = [v.strip() for v in line.split(",")]
        try:
            t = time.mktime(time.strptime(stamp.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + stamp.split(".")[1])
            samples.append((t, *map(float, vals)))
        except (ValueError, IndexError):
            continue
    for label, t0, t1, ms in phases:
        inside = [s for s in samples if t0 <= s[0] <= t1]
        gpu = (f"SM {statistics.mean(s[1] for s in inside):.0f} MHz (min {min(s[1] for s in inside):.0f}), "
               f"{statistics.mean(s[2] for s in inside):.0f} W, {max(s[3] for s in inside):.0f} C"
               if inside else "no samples")
        times = ", ".join(f"{'x'.join(map(str, t))} {v:.4f}" for t, v in ms.items())
        print(f"  {label:<28} {times:<44} {t1 - t0:5.1f} s  {gpu}", flush=True)


def trace(runs, rest_ms, ms_each=400, bin_ms=20):
    """Launch times over time: each tile back to back (no flush) for ``ms_each``, in the
    order A B A B after the GPU idled for a second, and ``rest_ms`` between the runs."""
    time.sleep(1.0)
    events = []
    for i, tile in enumerate(list(runs) * 2):
        if i and rest_ms:
            torch.cuda.synchronize()
            time.sleep(rest_ms / 1e3)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < ms_each / 1e3:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            runs[tile]()
            end.record()
            events.append((tile, start, end))
            if len(events) > 8:
                events[-8][2].synchronize()  # stay a few launches ahead, not the whole phase
    torch.cuda.synchronize()
    origin = events[0][1]
    rows, current = [], None
    for tile, start, end in events:
        at, ms = origin.elapsed_time(start), start.elapsed_time(end)
        key = (tile, int(at // bin_ms))
        if current is None or current[0] != key:
            current = (key, [])
            rows.append(current)
        current[1].append(ms)
    for (tile, b), times in rows:
        print(f"  {b * bin_ms:6d} ms {'x'.join(map(str, tile)):>12} {statistics.median(times):.4f} ({len(times)})")


if __name__ == "__main__":
    main()
