"""Whether a beyond-suite call is bound by the GPU or by the host: its time three ways.

    PYTHONPATH=. python benchmarks/time_split.py --variant evoformer_row --head-dim 64 --batches 1 8
    PYTHONPATH=. python benchmarks/time_split.py --variant diff_attention --head-dim 64 --seqlens 512

Takes ``bench_attention.beyond_cases``' shapes (bf16): ``--batches`` for the Evoformer,
``--seqlens`` for the others.

For fxflash and torch.compile at each batch, prints
- ``do_bench``: the suite's median (``bench_attention.settled_ms``: the L2 flushed before each
  call, host time included where the GPU waits for it);
- ``span``: the GPU's time from the end of the flush to the end of the call's last kernel, and
  ``kernels``: the sum of the call's kernel times, both medians of a profiled
  (``torch.profiler``) flush-and-call loop; ``gap``: from the flush to the first kernel,
  ``flush``: the flush's own time;
- ``host``: host µs per call while the GPU is held busy (``torch.cuda._sleep``), so that
  no call waits for the GPU (``host_us``).
A call is GPU-bound when ``host`` is below the flush plus ``kernels`` (the host issues the next
call before the GPU is done) and ``span`` ≈ ``kernels``; then ``do_bench`` ≈ ``span``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fxflash  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from bench_attention import beyond_cases, settled_ms  # noqa: E402

FLUSH_BYTES = 256 * 1024 * 1024  # do_bench's L2 flush buffer
FLUSH_MIN_US = 40  # a flush's fill kernel runs longer than this; the calls' own fills (if any) shorter


def is_flush(event) -> bool:
    return "fill" in event.name.lower() and event.time_range.end - event.time_range.start > FLUSH_MIN_US


def gpu_times(call, flush: torch.Tensor, iters: int = 60) -> tuple[float, float, float, float]:
    """Medians over ``iters`` flush-and-call rounds: (span ms, kernels ms, gap µs, flush µs)."""
    for _ in range(10):
        flush.zero_()
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            flush.zero_()
            call()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                     and e.time_range.end > e.time_range.start), key=lambda e: e.time_range.start)
    rounds, current = [], None
    for event in events:
        if is_flush(event):
            current = (event.time_range.end, [], event.time_range.end - event.time_range.start)
            rounds.append(current)
        elif current is not None:
            current[1].append(event)
    rounds = [(end, ks, took) for end, ks, took in rounds if ks]
    spans = [ks[-1].time_range.end - end for end, ks, _ in rounds]
    busy = [sum(k.time_range.end - k.time_range.start for k in ks) for _, ks, _ in rounds]
    gaps = [ks[0].time_range.start - end for end, ks, _ in rounds]
    flushes = [took for _, _, took in rounds]
    return (statistics.median(spans) / 1e3, statistics.median(busy) / 1e3, statistics.median(gaps),
            statistics.median(flushes))


def host_us(call, calls: int = 40, rounds: int = 5) -> float:
    """Host µs per call with the GPU held busy by a spin kernel, so that no call waits for it:
    the least over ``rounds`` of ``calls`` calls. Few calls a round: past about a thousand
    queued kernels a launch blocks until the GPU drains the queue."""
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda._sleep(int(2e8))  # ~0.1 s at 2 GHz
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="evoformer_row")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 8], help="the Evoformer's")
    parser.add_argument("--seqlens", nargs="*", type=int, default=[512], help="the other variants'")
    opts = parser.parse_args()
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int, device="cuda")
    for fields, fn, args, _ in beyond_cases(opts.variant, opts.seqlens, "cuda", torch.bfloat16, batches=tuple(opts.batches)):
        if fields["D"] != opts.head_dim:
            continue
        for label, compiled in (("fxflash", fxflash.optimize(fn)), ("torch.compile", torch.compile(fn))):
            call = lambda: compiled(*args)  # noqa: E731
            call()
            torch.cuda.synchronize()
            span, kernels, gap, flush_us = gpu_times(call, flush)
            print(f"{opts.variant} {fields} {label:13s} do_bench {settled_ms(call):.4f} ms | span {span:.4f} ms, "
                  f"kernels {kernels:.4f} ms, gap {gap:.1f} us, flush {flush_us:.1f} us | host {host_us(call):.1f} us/call", flush=True)


if __name__ == "__main__":
    main()
