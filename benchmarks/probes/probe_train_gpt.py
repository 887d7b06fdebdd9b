"""Where a training step of examples/train_gpt.py goes, per path: wall time per step against the
GPU's busy time, and the kernels and host ops that take it (torch profiler, 5 steps after 12).

    PYTHONPATH=. python benchmarks/probes/probe_train_gpt.py [--paths fxflash inductor] [--rows 12] [--cprofile]

``--cprofile`` also prints the host functions of fxflash's that take the most time over 5 steps
(cProfile, cumulative).
"""
import cProfile
import pstats
import argparse
import copy
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from train_gpt import GPT, markov_batches  # noqa: E402

import fxflash  # noqa: E402,F401 - registers the backend (not installed as a package here)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--paths", nargs="*", default=["fxflash", "inductor"])
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--cprofile", action="store_true")
    opts = parser.parse_args()
    torch.manual_seed(0)
    initial = GPT(512, 512, 6, 8, 1024)
    batches = [b.cuda() for b in markov_batches(20, 8, 1024, 512)]
    for path in opts.paths:
        torch._dynamo.reset()
        model = copy.deepcopy(initial).cuda()
        step_model = torch.compile(model, backend=path)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(tokens):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(step_model(tokens[:, :-1]).float().flatten(0, 1), tokens[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        for tokens in batches[:12]:
            step(tokens)
        torch.cuda.synchronize()
        times = []
        for tokens in batches[12:]:
            start = time.perf_counter()
            step(tokens)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for tokens in batches[15:20]:
                step(tokens)
            torch.cuda.synchronize()
        if opts.cprofile:
            host = cProfile.Profile()
            host.enable()
            for tokens in batches[15:20]:
                step(tokens)
            torch.cuda.synchronize()
            host.disable()
            pstats.Stats(host).sort_stats("cumulative").print_stats("fxflash", opts.rows * 2)
        events = prof.key_averages()
        busy = sum(e.self_device_time_total for e in events) / 5 / 1e3
        print(f"== {path}: median step {statistics.median(times) * 1e3:.2f} ms, GPU busy {busy:.2f} ms per step")
        print(events.table(sort_by="self_device_time_total", row_limit=opts.rows, max_name_column_width=50))
        print(events.table(sort_by="self_cpu_time_total", row_limit=opts.rows, max_name_column_width=50))


if __name__ == "__main__":
    main()
