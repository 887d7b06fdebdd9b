"""What fxflash costs before and around its kernels: first call (cold and warm caches) and per call.

    PYTHONPATH=. python benchmarks/compile_cost.py [--variants …] [--out CSV] [--profile]

For each variant, two fresh processes run the same program on the same inputs (bf16, the
softmax suite's 4k config, or the Evoformer's B=1 config), sharing one fxflash cache and one
Triton cache, both empty before the first:

* ``cold``: nothing cached — capture, analysis, fusion, code generation, tuning (every
  candidate tile compiled and timed) and Triton's compilation all happen in the first call;
* ``warm``: a new process with the caches the first one left — tuning.json gives the tile
  and Triton's cache the binary, so the first call is capture + analysis + code generation.

Each row: seconds from process start to ``import fxflash`` done and to the first fused call
done, the report's stage times, the tuning time, the first and second call's wall time.

Then, in this process, the warm-call overhead: host time per call (mean over 300 calls
enqueued without synchronizing, on a problem small enough that the GPU waits for the host:
B=1, H=1, S=128) of fxflash, eager, torch.compile and SDPA for vanilla attention. With
``--profile``, the cProfile of those fxflash calls (top 25 by own time).

Rows go to ``benchmarks/results/compile_cost_<gpu-name>.csv``.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

START = time.perf_counter()

FIELDS = ("variant,cache,import_s,capture_s,analysis_s,fusion_s,codegen_s,tuning_s,first_call_s,"
          "process_to_first_call_s,second_call_ms,host_us_per_call,system,device,torch,triton").split(",")
VARIANTS = ["vanilla", "causal", "document_mask", "diff_attention", "evoformer_row"]


def _inputs(name):
    import torch

    sys.path.insert(0, os.path.dirname(__file__))
    from bench_attention import beyond_cases, case

    if name in ("diff_attention", "evoformer_row"):
        fields, fn, args, _ = next(beyond_cases(name, [4096], "cuda", torch.bfloat16))
        return fn, args
    fn, args, *_ = case(name, 4, 16, 16, 4096, 64, "cuda", torch.bfloat16)
    return fn, args


def child(name: str) -> None:
    """One process: import, first call, second call; prints a JSON line."""
    import torch

    import fxflash
    from fxflash.runtime import tuning

    imported = time.perf_counter() - START
    fn, args = _inputs(name)
    torch.cuda.synchronize()
    fast = fxflash.optimize(fn)
    t0 = time.perf_counter()
    fast(*args)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    done = time.perf_counter() - START
    t0 = time.perf_counter()
    fast(*args)
    torch.cuda.synchronize()
    second = time.perf_counter() - t0
    seconds = fast.report(*args).seconds
    print(json.dumps(dict(
        import_s=imported, capture_s=seconds.get("capture", 0), analysis_s=seconds.get("analysis", 0),
        fusion_s=seconds.get("fusion", 0), codegen_s=seconds.get("code generation", 0),
        tuning_s=sum(h["seconds"] for h in tuning.history), first_call_s=first,
        process_to_first_call_s=done, second_call_ms=second * 1e3)))


def host_overhead(profile: bool) -> dict:
    """Mean host time per call (µs) of each system on a tiny vanilla attention."""
    import torch

    import fxflash
    from fxflash import variants as V

    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fast = fxflash.optimize(V.vanilla)
    compiled = torch.compile(V.vanilla, dynamic=False)
    calls = {"fxflash": lambda: fast(q, k, v), "eager": lambda: V.vanilla(q, k, v),
             "torch_compile": lambda: compiled(q, k, v),
             "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)}
    result = {}
    for system, call in calls.items():
        for _ in range(20):
            call()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(300):
            call()
        result[system] = (time.perf_counter() - t0) / 300 * 1e6
        torch.cuda.synchronize()
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            calls["fxflash"]()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="*", default=VARIANTS)
    parser.add_argument("--out", default=None)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.child)
        return
    import torch
    import triton

    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    name = meta["device"].replace(" ", "_")
    out = opts.out or os.path.join(os.path.dirname(__file__), "results", f"compile_cost_{name}.csv")
    rows = []
    for variant in opts.variants:
        with tempfile.TemporaryDirectory() as fx_cache, tempfile.TemporaryDirectory() as triton_cache:
            env = dict(os.environ, FXFLASH_CACHE_DIR=fx_cache, TRITON_CACHE_DIR=triton_cache, FXFLASH_PROGRESS="0")
            for cache in ("cold", "warm"):
                proc = subprocess.run([sys.executable, __file__, "--child", variant], env=env, capture_output=True,
                                      text=True, timeout=600)
                if proc.returncode != 0:
                    raise SystemExit(f"{variant} ({cache}) failed:\n{proc.stderr}")
                values = json.loads(proc.stdout.strip().splitlines()[-1])
                row = dict(variant=variant, cache=cache, system="fxflash", **meta,
                           **{key: f"{value:.4g}" for key, value in values.items()})
                rows.append(row)
                print(f"{variant:<16} {cache}: import {values['import_s']:.2f} s, first fused call done "
                      f"{values['process_to_first_call_s']:.2f} s after start (first call {values['first_call_s']:.2f} s:"
                      f" capture {values['capture_s']:.2f}, analysis {values['analysis_s']:.2f}, fusion "
                      f"{values['fusion_s']:.3f}, codegen {values['codegen_s']:.3f}, tuning {values['tuning_s']:.2f});"
                      f" second call {values['second_call_ms']:.2f} ms", flush=True)
    for system, us in host_overhead(opts.profile).items():
        rows.append(dict(variant="vanilla_tiny", cache="warm", system=system, host_us_per_call=f"{us:.1f}", **meta))
        print(f"host time per call, B=1 H=1 S=128: {system:<14} {us:8.1f} µs", flush=True)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    new = not os.path.exists(out)
    with open(out, "a", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        if new:
            writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
