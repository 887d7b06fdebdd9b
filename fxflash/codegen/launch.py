"""Launching a generated kernel: run-time arguments from the op's inputs, tile sizes, grid."""
from __future__ import annotations

import contextlib
import math
import threading

import torch
import triton

from ..config import interpreting
from .emit import KernelPlan, block_dims_of

# Triton's interpreter patches global state while it runs a kernel: launches from several
# threads take turns (compiled GPU kernels launch concurrently).
_INTERPRETER_LOCK = threading.Lock()


def _launching():
    return _INTERPRETER_LOCK if interpreting() else contextlib.nullcontext()


def tile_config(plan: KernelPlan, device: torch.device) -> dict:
    """Tile sizes of a kernel that is not autotuned: in the interpreter, 16×16 tiles so that
    small test shapes cross several tiles; otherwise the first autotuning candidate."""
    if interpreting() or device.type != "cuda":
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)
    bm, bn, warps, stages = plan.configs[0]
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)


def empty_results(plan: KernelPlan, shapes: list, like: torch.Tensor) -> list:
    """``[result, *row values]`` of the given shapes, uninitialized: the result contiguous, or
    laid out in ``plan.out_order`` (eager's layout of the region's last op); the row values
    (a logsumexp) contiguous."""
    sides = [like.new_empty(shape, dtype=dtype) for shape, dtype in zip(shapes[1:], plan.side_dtypes)]
    if plan.out_order is None:
        return [like.new_empty(shapes[0], dtype=plan.out_dtype), *sides]
    order = plan.out_order
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return [like.new_empty([shapes[0][a] for a in order], dtype=plan.out_dtype).permute(inverse), *sides]


def _arg(spec, inputs, frame, out, sides):
    kind = spec[0]
    if kind == "out_stride":
        return out.stride(spec[1])
    if kind == "side":
        return sides[spec[1]]
    if kind == "ptr":
        return inputs[spec[1]]
    if kind == "stride":
        return inputs[spec[1]].stride(spec[2])
    if kind == "size":
        return inputs[spec[1]].shape[spec[2]]
    if kind == "frame":
        return frame[spec[1]]
    raise ValueError(spec)


def launch(plan: KernelPlan, kernel, inputs: list, frame: list, out_shapes: list) -> list:
    """Run the kernel; ``frame`` = [*batch, M, N] sizes, ``out_shapes`` the shapes of the
    result and of the row values stored beside it. Returns [result, *row values]."""
    device = inputs[0].device
    out, *sides = empty_results(plan, out_shapes, inputs[0])
    batch = math.prod(frame[:-2])
    args = [_arg(spec, inputs, frame, out, sides) for spec in plan.args]
    if plan.autotuned:
        def grid(meta):
            return (triton.cdiv(frame[-2], meta["BLOCK_M"]) * batch,)

        kernel[grid](out, *args, **block_dims_of(plan))
        return [out, *sides]
    cfg = tile_config(plan, device)
    grid = (triton.cdiv(frame[-2], cfg["BLOCK_M"]) * batch,)
    with _launching():
        kernel[grid](out, *args, **block_dims_of(plan), **cfg)
    return [out, *sides]
