"""fxflash: plain PyTorch attention code → fused FlashAttention-style Triton kernels.

    fast = fxflash.optimize(model)                      # nn.Module or function
    print(fxflash.explain(model, q, k, v))              # regions, sketches, why not fused
    model = torch.compile(model, backend="fxflash")     # inside torch.compile
"""
from __future__ import annotations

import os as _os

import torch as _torch

# Without a CUDA GPU, generated kernels can only run in Triton's interpreter. ``@triton.jit`` reads
# TRITON_INTERPRET when it defines a kernel, and fxflash defines its kernels after this line, so the
# interpreter serves them whatever imported triton first (transformers and torch.compile do, before
# fxflash); triton.language's own jit functions, defined then, are swapped for interpreted ones
# around each launch (runtime/interpreted.py).
if not _torch.cuda.is_available():
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from .backend import backend, fxflash_backend
from .backend import register as _register_backend
from .capture import CaptureError
from .config import config
from .optimize import OptimizedFunction, OptimizedModule, explain, optimize
from .report import RegionReport, Report

__version__ = "0.1.0"

_register_backend()

__all__ = [
    "CaptureError",
    "OptimizedFunction",
    "OptimizedModule",
    "RegionReport",
    "Report",
    "backend",
    "config",
    "explain",
    "fxflash_backend",
    "optimize",
]
