"""The ``fxflash::region`` custom op: one fused region, opaque to Dynamo, AOTAutograd, Inductor.

``region(key, inputs, frame, out_shape)`` runs the generated kernel registered under ``key``
on ``inputs`` (the tensors the kernel reads), with the frame sizes ``[*batch, M, N]``, and
returns a new contiguous tensor of ``out_shape``. Its fake implementation gives the shape and
dtype without running anything. Its autograd formula recomputes the region's own subgraph
with eager autograd (no fused backward yet), so training through a fused region is exact.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading

import torch
import torch.fx as fx

from .emit import KernelPlan
from .launch import launch


@dataclasses.dataclass
class RegisteredRegion:
    plan: KernelPlan
    kernel: object
    reference: fx.GraphModule  # inputs → the region's output, the ops the kernel replaces

    def run(self, inputs, frame, out_shape):
        if any(s == 0 for s in frame) or any(s == 0 for s in out_shape):
            return self.reference(*inputs)  # nothing to tile; eager's semantics for empty sums
        return launch(self.plan, self.kernel, inputs, frame, out_shape)


_REGISTRY: dict[str, RegisteredRegion] = {}
_ids = itertools.count()
_lock = threading.Lock()


def register(entry: RegisteredRegion) -> str:
    with _lock:
        key = f"{entry.plan.name}#{next(_ids)}"
        _REGISTRY[key] = entry
    return key


def registered(key: str) -> RegisteredRegion:
    try:
        return _REGISTRY[key]
    except KeyError:
        raise RuntimeError(
            f"fxflash: fused region {key!r} is not registered in this process; graphs holding fused "
            "regions cannot be saved and reloaded elsewhere — optimize the model again"
        ) from None


@torch.library.custom_op("fxflash::region", mutates_args=())
def region(key: str, inputs: list[torch.Tensor], frame: list[int], out_shape: list[int]) -> torch.Tensor:
    return registered(key).run(inputs, frame, out_shape)


@region.register_fake
def _region_fake(key, inputs, frame, out_shape):
    return inputs[0].new_empty(out_shape, dtype=registered(key).plan.out_dtype)


def _setup_context(ctx, inputs, output):
    key, tensors, _, _ = inputs
    ctx.key = key
    ctx.needs = [t.requires_grad for t in tensors]
    ctx.save_for_backward(*tensors)


def _backward(ctx, grad):
    tensors = ctx.saved_tensors
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(need) for t, need in zip(tensors, ctx.needs)]
        out = registered(ctx.key).reference(*leaves)
        wanted = [leaf for leaf, need in zip(leaves, ctx.needs) if need]
        grads = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True))
    return None, [next(grads) if need else None for need in ctx.needs], None, None


region.register_autograd(_backward, setup_context=_setup_context)
