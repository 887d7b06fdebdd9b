"""The ``fxflash::region`` custom op: one fused region, opaque to Dynamo, AOTAutograd, Inductor.

``region(key, inputs, sizes, scalars)`` runs the generated kernel registered under ``key`` on
``inputs`` (the tensors the kernel reads). ``sizes`` holds the frame sizes ``[*batch, M, N]``,
then the result's shape, then the integer sizes the region's own ops read (symbolic under
``dynamic=True``); ``scalars`` the float values they read (``size(-1) ** -0.5``). The
result is a new tensor, contiguous or in eager's layout of the region's last op. Its fake implementation gives the shape and
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
from .launch import empty_output, launch


@dataclasses.dataclass
class RegisteredRegion:
    plan: KernelPlan
    kernel: object
    reference: fx.GraphModule  # (inputs, extras) → the region's output: the replaced ops
    out_rank: int
    extra_is_float: tuple      # for each extra input of the reference: float (else int)

    def split(self, sizes):
        nf = self.plan.frame_rank + 2
        return sizes[:nf], sizes[nf:nf + self.out_rank], sizes[nf + self.out_rank:]

    def extras(self, sizes, scalars) -> list:
        ints, floats = iter(self.split(sizes)[2]), iter(scalars)
        return [next(floats) if f else next(ints) for f in self.extra_is_float]

    def run(self, inputs, sizes, scalars):
        frame, out_shape, _ = self.split(sizes)
        if any(s == 0 for s in frame) or any(s == 0 for s in out_shape) or not self.plan.int32_index_ok(frame):
            # nothing to tile (eager's semantics for empty sums), or sizes so large that the
            # kernel's int32 index arithmetic could overflow: run the replaced ops as they were
            return self.reference(*inputs, *self.extras(sizes, scalars))
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
def region(key: str, inputs: list[torch.Tensor], sizes: list[int], scalars: list[float]) -> torch.Tensor:
    return registered(key).run(inputs, sizes, scalars)


@region.register_fake
def _region_fake(key, inputs, sizes, scalars):
    entry = registered(key)
    _, out_shape, _ = entry.split(sizes)
    return empty_output(entry.plan, out_shape, inputs[0])


def _setup_context(ctx, inputs, output):
    key, tensors, sizes, scalars = inputs
    ctx.key = key
    ctx.extra = registered(key).extras(sizes, scalars)
    # the gradient of ``scalars`` must have its structure: an empty list stays a list
    ctx.no_scalars = [] if not scalars else None
    ctx.needs = [t.requires_grad for t in tensors]
    ctx.save_for_backward(*tensors)


def _backward(ctx, grad):
    tensors = ctx.saved_tensors
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(need) for t, need in zip(tensors, ctx.needs)]
        out = registered(ctx.key).reference(*leaves, *ctx.extra)
        wanted = [leaf for leaf, need in zip(leaves, ctx.needs) if need]
        grads = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True))
    return None, [next(grads) if need else None for need in ctx.needs], None, ctx.no_scalars


region.register_autograd(_backward, setup_context=_setup_context)
