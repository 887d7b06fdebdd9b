"""Launching a generated kernel: run-time arguments from the op's inputs, tile sizes, grid."""
from __future__ import annotations

import contextlib
import functools
import math
import threading

import torch
import triton

from ..config import interpreting
from . import tuning
from .emit import KernelPlan, block_dims_of

# Triton's interpreter patches global state while it runs a kernel: launches from several
# threads take turns (compiled GPU kernels launch concurrently).
_INTERPRETER_LOCK = threading.Lock()


def _launching():
    return _INTERPRETER_LOCK if interpreting() else contextlib.nullcontext()


INTERPRETER_TILE = (16, 16, 1, 1)  # small test shapes cross several tiles


@functools.lru_cache(maxsize=None)
def _device_label(index) -> str:
    """The GPU's name and compute capability: part of the tuning key."""
    major, minor = torch.cuda.get_device_capability(index)
    return f"{torch.cuda.get_device_name(index)} sm{major}{minor}"


def tile_for(plan: KernelPlan, inputs: list, frame: list, run) -> tuple:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for this launch: a tile pinned by
    ``tuning.pinned``; else 16×16 tiles in the interpreter; on a GPU the tuned choice for
    this size bucket (tuning.choose)."""
    device = inputs[0].device
    pinned = tuning.pinned_tile()
    if pinned is not None:
        return pinned
    if interpreting() or device.type != "cuda":
        return INTERPRETER_TILE
    return tuning.choose(plan.name, plan.source, plan.configs, [t.dtype for t in inputs], _device_label(device.index),
                         frame, run, capturing=torch.cuda.is_current_stream_capturing(),
                         device_index=device.index)


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


def _kernel_args(specs, inputs, frame, out, sides) -> list:
    """The run-time parameters named by ``plan.args`` (see KernelPlan), in order; each input's
    strides and shape read once."""
    strides = [t.stride() for t in inputs]
    shapes = [t.shape for t in inputs]
    out_strides = out.stride()
    values = []
    for spec in specs:
        kind = spec[0]
        if kind == "stride":
            values.append(strides[spec[1]][spec[2]])
        elif kind == "ptr":
            values.append(inputs[spec[1]])
        elif kind == "size":
            values.append(shapes[spec[1]][spec[2]])
        elif kind == "frame":
            values.append(frame[spec[1]])
        elif kind == "out_stride":
            values.append(out_strides[spec[1]])
        elif kind == "side":
            values.append(sides[spec[1]])
        else:
            raise ValueError(spec)
    return values


def launch(plan: KernelPlan, kernel, inputs: list, frame: list, out_shapes: list) -> list:
    """Run the kernel; ``frame`` = [*batch, M, N] sizes, ``out_shapes`` the shapes of the
    result and of the row values stored beside it. Returns [result, *row values]."""
    out, *sides = empty_results(plan, out_shapes, inputs[0])
    batch = math.prod(frame[:-2])
    args = _kernel_args(plan.args, inputs, frame, out, sides)
    dims = block_dims_of(plan)

    def run(tile):
        bm, bn, warps, stages = tile
        grid = (triton.cdiv(frame[-2], bm) * batch,)
        with _launching():
            kernel[grid](out, *args, **dims, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)

    run(tile_for(plan, inputs, frame, run))
    return [out, *sides]
