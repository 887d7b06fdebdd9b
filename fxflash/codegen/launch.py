"""Launching a generated kernel: run-time arguments from the op's inputs, tile sizes, grid."""
from __future__ import annotations

import math

import torch
import triton

from ..config import interpreting
from .emit import KernelPlan, block_dims_of, tile_configs



def tile_config(plan: KernelPlan, device: torch.device) -> dict:
    """Tile sizes of a kernel that is not autotuned: in the interpreter, 16×16 tiles so that
    small test shapes cross several tiles; otherwise the first autotuning candidate."""
    if interpreting() or device.type != "cuda":
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)
    bm, bn, warps, stages = tile_configs(plan.d, plan.dv, plan.elem_bytes)[0]
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)


def _arg(spec, inputs, frame):
    kind = spec[0]
    if kind == "ptr":
        return inputs[spec[1]]
    if kind == "stride":
        return inputs[spec[1]].stride(spec[2])
    if kind == "size":
        return inputs[spec[1]].shape[spec[2]]
    if kind == "frame":
        return frame[spec[1]]
    raise ValueError(spec)


def launch(plan: KernelPlan, kernel, inputs: list, frame: list, out_shape: list) -> torch.Tensor:
    """Run the kernel; ``frame`` = [*batch, M, N] sizes, ``out_shape`` the result's shape."""
    device = inputs[0].device
    out = torch.empty(out_shape, dtype=plan.out_dtype, device=device)
    batch = math.prod(frame[:-2])
    args = [_arg(spec, inputs, frame) for spec in plan.args]
    if plan.autotuned:
        def grid(meta):
            return (triton.cdiv(frame[-2], meta["BLOCK_M"]) * batch,)

        kernel[grid](out, *args, **block_dims_of(plan))
        return out
    cfg = tile_config(plan, device)
    grid = (triton.cdiv(frame[-2], cfg["BLOCK_M"]) * batch,)
    kernel[grid](out, *args, **block_dims_of(plan), **cfg)
    return out
