"""A/B timing of one fxflash setting in one process, on the same inputs.

    PYTHONPATH=. python benchmarks/ab_setting.py --setting exp2_fma [another_setting …] \
        --variants vanilla alibi causal --seqlens 1024 4096 16384 [--pin gluon,3,128,3,0,1] [--out CSV]

For each case (the softmax suite's shapes: bf16, 16 heads, head dim 64, batch × seqlen = 16k
tokens; for other variants, the ``beyond`` suite's configs of head dim ``--head-dim`` at
``--seqlens``, the Evoformer's at its own sizes (batch ``--batches``): ``bench_attention.beyond_cases``, which also
times ``diff_attention_chunked`` as ``diff_attention``) fxflash is compiled twice, with the
``fxflash.config`` settings all False (A) and all True (B), each autotuned as usual; then A
and B are timed alternately ``--rounds`` times (``bench_attention.medians``: do_bench
medians, each after a rest, and CUDA-graph replays) and the median of each side is reported
with B/A (below 1: the setting helps). ``--pin`` compiles and times both sides with one tile
configuration instead of the tuner's picks (a setting of one kernel form, e.g. the Gluon kernel's). Both outputs are checked against FlexAttention (softmax suite)
or eager (beyond suite).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import os
import statistics
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
from bench_attention import (EVOFORMER_BATCHES, SUITES, beyond_cases, case, check, check_fused, flex_api,  # noqa: E402
                             medians)

import fxflash  # noqa: E402
from fxflash.runtime import tuning  # noqa: E402

FIELDS = "setting,variant,B,H,S,D,a_ms,b_ms,b_over_a,device,torch,triton".split(",")


def compiled_with(fn, args, settings: list, value: bool):
    """An optimized callable with each ``config.<setting> = value`` while it compiles, tunes and
    runs: settings read at each launch (``gluon``: which kernels the tuner may pick; a bound
    launch is keyed on it) must hold in the timed calls too, not only at the first."""
    fast = fxflash.optimize(fn)

    def call(*inputs):
        with fxflash.config.overridden(**dict.fromkeys(settings, value)):
            return fast(*inputs)

    call(*args)
    torch.cuda.synchronize()
    check_fused(fast, args, f"with {'+'.join(settings)} = {value}")
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", nargs="+", required=True, help="boolean fields of fxflash.config")
    parser.add_argument("--variants", nargs="+", default=["vanilla"])
    parser.add_argument("--seqlens", nargs="+", type=int, default=[4096])
    parser.add_argument("--head-dim", type=int, default=64, help="beyond suite: the configs of this head dim")
    parser.add_argument("--batches", nargs="+", type=int, default=list(EVOFORMER_BATCHES),
                        help="the Evoformer's batch sizes (N_seq = S = 256, 4 heads)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pin", help="a tile configuration for both sides, comma-separated (default: the tuner's)")
    parser.add_argument("--out", default=None)
    opts = parser.parse_args()
    for setting in opts.setting:
        if not isinstance(getattr(fxflash.config, setting, None), bool):
            raise SystemExit(f"fxflash.config has no boolean setting {setting!r}")
    settings = "+".join(opts.setting)
    flex, _ = flex_api()
    rows = []
    tile = tuning.tile_of(opts.pin.replace(",", "x")) if opts.pin else None
    for name, fields, fn, args, reference in cases(opts, flex):
        with tuning.pinned(tile) if tile else contextlib.nullcontext():
            a, b = (compiled_with(fn, args, opts.setting, value) for value in (False, True))
            label = f"{name:<16} " + " ".join(f"{k}={fields[k]}" for k in ("B", "M", "D"))
            if reference is not None:
                for side, fast in (("A", a), ("B", b)):
                    check(fast(*args), reference, f"{label} {side}")
            times = {"A": [], "B": []}
            for r in range(opts.rounds):
                for side, fast in ((("A", a), ("B", b)) if r % 2 == 0 else (("B", b), ("A", a))):
                    times[side].append(medians(lambda: fast(*args)))
        (a_ms, a_graph), (b_ms, b_graph) = ([statistics.median(x) for x in zip(*times[side])] for side in "AB")
        rows.append(dict(setting=settings, variant=name, B=fields["B"], H=fields["H"], S=fields["M"],
                         D=fields["D"], a_ms=f"{a_ms:.4f}", b_ms=f"{b_ms:.4f}", b_over_a=f"{b_ms / a_ms:.3f}",
                         device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__))
        print(f"{label} {settings} off {a_ms:.3f} ms  on {b_ms:.3f} ms  B/A {b_ms / a_ms:.3f}; graph replay "
              f"{a_graph:.3f} / {b_graph:.3f} ms, B/A {b_graph / a_graph:.3f}", flush=True)
        torch._dynamo.reset()
    if opts.out:
        new = not os.path.exists(opts.out)
        with open(opts.out, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            if new:
                writer.writeheader()
            writer.writerows(rows)


def cases(opts, flex):
    """(variant, row fields, program, args, reference output or None) for each case."""
    H, D, tokens = 16, 64, 16384
    for S in opts.seqlens:
        for name in opts.variants:
            if name not in SUITES["softmax"]:  # the beyond suite's, and its other variants (beyond_cases)
                if name.startswith("evoformer") and S != opts.seqlens[0]:
                    continue  # its sizes are its own: once
                for fields, fn, args, _ in beyond_cases(name, [S], "cuda", torch.bfloat16, batches=opts.batches):
                    if fields["D"] == opts.head_dim:
                        yield name, fields, fn, args, fn(*args)
                continue
            B = max(1, tokens // S)
            fn, args, score_mod, mask_mod, _ = case(name, B, H, H, S, D, "cuda", torch.bfloat16)
            reference = flex(*args[:3], score_mod=score_mod) if mask_mod is None else None
            yield name, dict(B=B, H=H, M=S, D=D), fn, args, reference


if __name__ == "__main__":
    main()
