"""fxflash: plain PyTorch attention code → fused FlashAttention-style Triton kernels.

    fast = fxflash.optimize(model)                      # nn.Module or function
    print(fxflash.explain(model, q, k, v))              # regions, sketches, why not fused
    model = torch.compile(model, backend="fxflash")     # inside torch.compile
"""
from __future__ import annotations

import os as _os
import sys as _sys

import torch as _torch

# Without a CUDA GPU, generated kernels can only run in Triton's interpreter, which must be
# chosen before triton is imported: do it when fxflash is the first to import triton.
if not _torch.cuda.is_available() and "triton" not in _sys.modules:
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
