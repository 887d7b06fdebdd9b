"""Launching a region's Gluon kernel (gluon.py): which configurations a launch can use, the
TMA descriptors of Q, K and V, and the launch itself."""
from __future__ import annotations

import dataclasses
import functools
import math

import torch
import triton

from ..config import config
from ..codegen.gluon_plan import (GLUON_CONFIGS, PERSISTENT_CONFIGS, ROWS_PER_CONSUMER, STREAM_CONFIGS, GluonPlan, fits_shared_memory,
                    gluon_tile, register_budget, shared_bytes)

INT32_ROWS = 1 << 31  # TMA coordinates are 32-bit


@functools.lru_cache(maxsize=None)
def _hopper(index) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


def _rows_view_refusal(t: torch.Tensor, d: int, what: str = "an operand", last: str = "head dim") -> str | None:
    """Why ``t`` ([*batch, rows, d]) cannot be read by TMA as one matrix [R, sr] (sr: its row
    stride), each batch item's ``[rows, d]`` block at a row and column of it: the last axis
    contiguous, the rows 16-byte aligned; each batch axis either a whole number of rows apart
    (``[B, H, S, D]``'s heads) or inside one row, all such offsets together leaving ``d``
    columns (``[B, S, H, D]``'s heads, ``sr = H·D``); the matrix inside ``t``'s storage.
    ``what`` and ``last`` name ``t`` and its last axis in the reason."""
    sr = t.stride(-2)
    if t.shape[-1] != d or t.stride(-1) != 1 or sr <= 0:
        return f"{what} whose {last} is not contiguous"
    if (sr * t.element_size()) % 16 or t.data_ptr() % 16:
        return f"{what} whose rows are not 16-byte aligned"
    # the offsets of the axes that are not whole rows apart, and D, must fit in one row
    inside = sum((n - 1) * st for n, st in zip(t.shape[:-2], t.stride()[:-2]) if n > 1 and st % sr)
    if inside + d > sr:
        return f"{what} whose batch axes are neither whole rows apart nor inside one row"
    if _rows_total(t) >= INT32_ROWS:
        return "more than 2³¹ rows"
    storage = t.untyped_storage().nbytes() // t.element_size()
    if t.storage_offset() + _rows_total(t) * sr > storage:
        return f"{what} whose last row ends outside its storage"
    return None


def _rows_total(t: torch.Tensor) -> int:
    """Rows R of ``t``'s [R, sr] matrix: from its first element's row to its last element's."""
    last = sum((n - 1) * st for n, st in zip(t.shape[:-1], t.stride()[:-1]) if n > 1) + t.shape[-1] - 1
    return last // t.stride(-2) + 1


def launch_refusal(gplan: GluonPlan, inputs: list, frame, tile) -> str | None:
    """Why this launch cannot use the Gluon configuration ``tile``, or None."""
    t = gluon_tile(tile)
    if t.streams != gplan.streams:
        return f"a configuration for {t.streams} softmax stream(s); the region has {gplan.streams}"
    if t.consumer_rows != ROWS_PER_CONSUMER and t.streams > 1:
        return "a consumer of more than 64 rows with two softmax streams (each stream's consumer owns the same 64)"
    if t.persistent and not gplan.dense:
        return "a persistent grid needs every item to visit every key tile (the region has tile masks)"
    device = inputs[0].device
    if device.type != "cuda" or not _hopper(device.index):
        return "the Gluon kernel needs a Hopper GPU (sm_90)"
    for view, cols, what, last in _tma_reads(gplan, inputs):
        why = _rows_view_refusal(view, cols, what, last)
        if why:
            return why
    rows_tiles = len(gplan.tiles) - len(gplan.vectors)
    if rows_tiles and t.consumers & (t.consumers - 1):
        return "a score input read by TMA needs a power-of-two number of consumers (its block holds the CTA's rows)"
    if frame[-1] % t.block_n:
        return f"N = {frame[-1]} is not a multiple of the Gluon key tile {t.block_n}"
    elem = inputs[gplan.operands[0]].element_size()
    if not fits_shared_memory(tile, shared_bytes(tile, gplan.d, elem, rows_tiles, gplan.dv, len(gplan.vectors),
                                                  mma_row_sum=gplan.options.gluon_mma_row_sum)):
        return "its buffers exceed shared memory"
    return None


# The tuner offers one-CTA-per-item Gluon configurations (gluon_plan.GLUON_CONFIGS) on rows of at least
# this many keys and persistent ones (gluon_plan.PERSISTENT_CONFIGS) on shorter rows; a pinned
# configuration runs at any length. On the H200 (benchmarks/NOTES.md): below it the Triton kernel
# beat every one-CTA-per-item configuration in every suite run (1024 keys; the Evoformer's 256:
# 1.12 against 0.90 ms) while the persistent grid beat both (vanilla 1k 0.176 against 0.188,
# Evoformer 0.841–0.858 against 0.892); from 2048 keys one CTA per item wins (vanilla and ALiBi,
# gluon_min_keys_2k_H200.log) and the persistent grid trails it (ALiBi 16k 2.643 against 2.578 ms
# with ping-pong; persistent_grid_H200.log).
GLUON_MIN_KEYS = 2048


def candidates(gplan: GluonPlan | None, inputs: list, frame) -> list:
    """The Gluon configurations the tuner times for this launch: none with ``config.gluon`` off,
    persistent ones on rows shorter than GLUON_MIN_KEYS, one CTA per item on longer ones (with
    two streams all of STREAM_CONFIGS: the persistent grid won up to 8k keys), none that cannot
    run it."""
    if gplan is None or not config.gluon:
        return []
    configs = (STREAM_CONFIGS if gplan.streams > 1 else GLUON_CONFIGS if frame[-1] >= GLUON_MIN_KEYS
               else PERSISTENT_CONFIGS)
    tiles = configs[gplan.configs_dim]
    return [tile for tile in tiles if launch_refusal(gplan, inputs, frame, tile) is None]


def _blocks(gplan: GluonPlan, tile) -> tuple:
    """The TMA block of Q, K and V: one consumer's rows of Q, one key tile of K and V; then of
    each score tile (GluonPlan.tiles): the CTA's rows of one key tile (one row of a key vector);
    then of the output gate (GluonPlan.gates) and of the output stored by TMA (GluonPlan.store):
    one consumer's rows, as Q's."""
    t = gluon_tile(tile)
    tiles = [[1 if i in gplan.vectors else t.rows, t.block_n] for i in gplan.tiles]
    gates = [[t.consumer_rows, gplan.d]] * len(gplan.gates)
    store = [[t.consumer_rows, gplan.dv]] * (gplan.store is not None)
    return [t.consumer_rows, gplan.d], [t.block_n, gplan.d], [t.block_n, gplan.dv], *tiles, *gates, *store


def tma_inputs(gplan: GluonPlan) -> tuple:
    """The input indices the kernel's TMA descriptors read, in the kernel's order: Q, K, V, the
    score's tiles, the output gate."""
    return (*gplan.operands, *gplan.tiles, *(i for i, _ in gplan.gates))


def _tma_reads(gplan: GluonPlan, inputs: list, out: torch.Tensor | None = None) -> list:
    """What each TMA descriptor reads (or writes), in the kernel's order (tma_inputs, then the
    output), as (a ``[*batch, rows, cols]`` view, cols, and how a refusal names the tensor and its
    last axis): Q, K and V, the score's [rows, keys] tiles, the output gate with its row axis moved
    next to its last, and ``out`` if given (where the kernel stores it by TMA: GluonPlan.store). Each view
    starts at its tensor's first element, so a descriptor can be rebased on the tensor."""
    return [*((inputs[i], d, "an operand", "head dim") for i, d in zip(gplan.operands, (gplan.d, gplan.d, gplan.dv))),
            *((inputs[i], inputs[i].shape[-1], "a [rows, keys] score input", "key axis") for i in gplan.tiles),
            *((inputs[i].movedim(axis, -2), gplan.d, "an output gate", "head dim") for i, axis in gplan.gates),
            *([(out.movedim(gplan.store, -2), gplan.dv, "the output", "head dim")] if out is not None else [])]


def descriptors(gplan: GluonPlan, tile, inputs: list, out: torch.Tensor | None = None) -> tuple:
    """The TMA descriptors of Q, K, V, the score's tiles, the gate and the output stored by TMA
    for configuration ``tile`` (the kernel's first arguments), each tensor as its ``[R, sr]``
    matrix (_rows_view_refusal), with its block's shared-memory layout (~12 µs of host time each
    to build; launch.BoundGluonLaunch builds them once)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dtypes = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
    reads = _tma_reads(gplan, inputs, out if gplan.store is not None else None)
    if gplan.store is not None:  # an output that breaks gluon._GluonPrinter.tma_store's rule: a bug
        why = "no output (none given)" if out is None else _rows_view_refusal(*reads[-1])
        if why:
            raise RuntimeError(f"fxflash: bug: the Gluon kernel would store {why} by TMA")
    descs = []
    for (t, *_), block in zip(reads, _blocks(gplan, tile)):
        layout = gl.NVMMASharedLayout.get_default_for(block, dtypes[t.dtype])
        rows = t.as_strided((_rows_total(t), t.stride(-2)), (t.stride(-2), 1))
        descs.append(TensorDescriptor.from_tensor(rows, block, layout))
    return tuple(descs)


def rebased(desc, tensor: torch.Tensor):
    """``desc``, a descriptor ``descriptors`` built at a bound launch's first call, pointing at
    ``tensor``: an input with the same layout key (shape, strides, dtype, 16-byte alignment), so
    the same ``[R, sr]`` matrix at another address, which is all a TMA descriptor holds. Copied
    without the dataclass's validation (~5 µs per descriptor, three per call; what it checks is
    in the key); a descriptor class without ``__dict__`` is replaced through the constructor.
    ``tensor`` None detaches ``desc`` from its input: a bound launch keeps its descriptors
    without keeping the first call's tensors alive."""
    try:
        new = object.__new__(type(desc))
        new.__dict__.update(desc.__dict__)
    except (AttributeError, TypeError):
        return desc if tensor is None else dataclasses.replace(desc, base=tensor)
    new.base = tensor
    return new


def constexprs(tile, tma_store: bool = False) -> dict:
    """The kernel's compile-time arguments (its last ones) for configuration ``tile``; ``tma_store``:
    the output's rows are stored by TMA (stores_by_tma)."""
    t = gluon_tile(tile)
    return dict(CONSUMERS=t.consumers, NBUF=t.nbuf, CONSUMER_REGS=register_budget(t.consumers, t.ctas)[1],
                PINGPONG=bool(t.pingpong), ROWS_P2=triton.next_power_of_2(t.rows), PERSISTENT=t.persistent,
                CTAS=t.ctas, TMA_STORE=tma_store)


def stores_by_tma(gplan: GluonPlan, tile, frame) -> bool:
    """Does the kernel store the output's rows by TMA at this launch: where the region can
    (GluonPlan.store) and M is a multiple of the CTA's rows, so that every consumer's block of
    rows is whole and its item's (gluon._tma_store_lines)."""
    return gplan.store is not None and frame[-2] % gluon_tile(tile).rows == 0


@functools.lru_cache(maxsize=None)
def _multiprocessors(index) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def grid(tile, frame, device=None) -> tuple:
    """One CTA per work item (batch indices, block of CONSUMERS·64 rows, or 64 with two streams);
    on a persistent grid
    at most ``ctas`` CTAs per multiprocessor of ``device``, each walking items pid, pid + grid, …
    Where the last row block leaves a consumer without rows (its items are lighter), the grid
    and the number of row blocks are coprime, so that each CTA's items cycle through the row
    blocks and every CTA gets its share of light items."""
    t = gluon_tile(tile)
    rows = t.rows
    blocks = triton.cdiv(frame[-2], rows)
    items = blocks * math.prod(frame[:-2])
    if not t.persistent:
        return (items,)
    size = min(items, t.ctas * _multiprocessors(device.index if device is not None else None))
    if 0 < frame[-2] % rows <= rows - t.consumer_rows:  # a consumer idles in the last block
        while math.gcd(size, blocks) > 1:
            size -= 1
    return (size,)


def launch(gplan: GluonPlan, kernel, tile, inputs: list, frame, out: torch.Tensor, flags: torch.Tensor, args: list):
    """Launch ``kernel`` (gplan's module's kernel) with configuration ``tile``; ``flags``: one int8
    per row and stream, set where the row needs the repair kernel; ``args``: the values of
    ``gplan.args`` for this launch. Returns what Triton's JIT returns: the compiled kernel
    (launch.BoundGluonLaunch calls it directly)."""
    t = gluon_tile(tile)
    maxnreg, _ = register_budget(t.consumers, t.ctas)
    return kernel[grid(tile, frame, out.device)](*descriptors(gplan, tile, inputs, out), out, flags, *args,
                                                  **constexprs(tile, stores_by_tma(gplan, tile, frame)),
                                                  num_warps=4, maxnreg=maxnreg)
