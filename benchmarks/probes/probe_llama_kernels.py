"""The CUDA kernels of one Llama-shaped prefill (benchmarks/hf_llama.py's model, unpadded), through
``fxflash.optimize`` and through transformers' sdpa attention: torch.profiler's table of each.

    PYTHONPATH=. python benchmarks/probes/probe_llama_kernels.py
"""
import os
import sys

import torch
sys.argv = [sys.argv[0]]
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import hf_llama as H
import argparse
args = argparse.Namespace(layers=16, batch=4, seq=4096)
import fxflash
from torch.profiler import profile, ProfilerActivity
for path in ("optimize", "sdpa"):
    model = H._model(args, "sdpa" if path == "sdpa" else "eager")
    run = fxflash.optimize(model) if path == "optimize" else model
    x = H._inputs(args, False)
    with torch.no_grad():
        run(**x); run(**x); torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            run(**x); torch.cuda.synchronize()
    print("=====", path)
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=70))
    del model, run; torch.cuda.empty_cache()
