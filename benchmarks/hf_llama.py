"""A Llama-shaped transformers model, prefill through each path: time per call and first-call time.

    PYTHONPATH=. python benchmarks/hf_llama.py [--paths sdpa,eager,inductor,backend,optimize,backend_sdpa,…]
                                               [--layers 16] [--batch 4] [--seq 4096] [--out CSV]

Random weights, bf16, a 1B-class config (hidden 2048, 32 heads, 8 KV heads, head dim 64,
intermediate 8192, vocabulary 32000), ``logits_to_keep=1`` as ``generate()``'s prefill. Each path
runs in a fresh process with empty caches (Inductor's, Triton's, fxflash's), unpadded and then
with a left-padded batch (row i loses i·seq/8 tokens):

* ``sdpa``: transformers' own sdpa attention, eager;
* ``eager``: transformers' eager attention, eager;
* ``inductor``: ``torch.compile`` (Inductor) on the eager attention;
* ``backend``: ``torch.compile(backend="fxflash")`` on the eager attention;
* ``optimize``: ``fxflash.optimize`` on the eager attention (on a GPU, Inductor compiles the rest);
* ``optimize_eager``: ``fxflash.optimize(model, inner="eager")`` on the eager attention, the rest
  of the graph run as eager ATen ops;
* the same compiled paths with a ``_sdpa`` suffix (``backend_sdpa``, …) on transformers' sdpa
  attention, whose ``scaled_dot_product_attention`` calls fxflash reads as their math form.

Each row: the first call's seconds (compilation included) and the median of 10 timed calls (ms),
and for the fxflash paths the number of fused regions in the call.
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time

PATHS = ["sdpa", "eager", "inductor", "backend", "optimize", "optimize_eager"]
SDPA_PATHS = ["inductor_sdpa", "backend_sdpa", "optimize_sdpa", "optimize_eager_sdpa"]
FIELDS = ["path", "padded", "first_call_s", "ms", "fused", "layers", "batch", "seq", "device", "torch", "triton"]


def _model(args, attention: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=args.layers,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=32000,
                         max_position_embeddings=max(8192, args.seq))
    config._attn_implementation = attention
    torch.manual_seed(0)
    with torch.device("cuda"):
        return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def _inputs(args, padded: bool) -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 32000, (args.batch, args.seq), generator=g)
    mask = torch.ones(args.batch, args.seq, dtype=torch.long)
    if padded:
        for row in range(args.batch):
            mask[row, : row * args.seq // 8] = 0
    return dict(input_ids=ids.cuda(), attention_mask=mask.cuda(), logits_to_keep=1)


def _child(args) -> None:
    """One path, in this (fresh) process: one CSV row per padding."""
    import torch
    import triton

    path = args.child.removesuffix("_sdpa")
    model = _model(args, "sdpa" if args.child.endswith("sdpa") else "eager")
    if path == "inductor":
        run = torch.compile(model)
    elif path == "backend":
        import fxflash  # noqa: F401 - registers the backend where fxflash is not installed

        run = torch.compile(model, backend="fxflash")
    elif path.startswith("optimize"):
        import fxflash

        run = fxflash.optimize(model, inner="eager" if path == "optimize_eager" else "auto")
    else:
        run = model
    rows = []
    for padded in (False, True):
        inputs = _inputs(args, padded)
        fused = ""
        with torch.no_grad():
            torch.cuda.synchronize()
            start = time.perf_counter()
            if path in ("backend", "optimize", "optimize_eager"):
                from fxflash.backend import recording

                with recording() as reports:
                    run(**inputs)
                fused = sum(r.fused for report in reports for r in report.regions)
            else:
                run(**inputs)
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            times = []
            for _ in range(12):
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                run(**inputs)
                end.record()
                torch.cuda.synchronize()
                times.append(begin.elapsed_time(end))
        times = sorted(times[2:])
        rows.append(dict(path=args.child, padded=padded, first_call_s=f"{first:.1f}", ms=f"{times[len(times) // 2]:.2f}",
                         fused=fused, layers=args.layers, batch=args.batch, seq=args.seq,
                         device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__))
        print(rows[-1], flush=True)
    with open(args.out, "a", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writerows(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", default=",".join(PATHS + SDPA_PATHS))
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)
    import torch

    if args.out is None:
        name = torch.cuda.get_device_name().replace(" ", "_")
        args.out = os.path.join(os.path.dirname(__file__), "results", f"hf_llama_{name}.csv")
    if not os.path.exists(args.out):
        with open(args.out, "w", newline="") as f:
            csv.DictWriter(f, FIELDS).writeheader()
    for path in args.paths.split(","):
        with tempfile.TemporaryDirectory() as caches:  # every cache empty: a cold first call
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{caches}/inductor", TRITON_CACHE_DIR=f"{caches}/triton",
                       FXFLASH_CACHE_DIR=f"{caches}/fxflash")
            command = [sys.executable, __file__, "--child", path, "--layers", str(args.layers),
                       "--batch", str(args.batch), "--seq", str(args.seq), "--out", args.out]
            subprocess.run(command, env=env, check=False)


if __name__ == "__main__":
    main()
