"""fxflash: plain PyTorch attention code → fused FlashAttention-style Triton kernels.

    fast = fxflash.optimize(model)                      # nn.Module or function
    print(fxflash.explain(model, q, k, v))              # regions, sketches, why not fused
    model = torch.compile(model, backend="fxflash")     # inside torch.compile
"""
from __future__ import annotations

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
