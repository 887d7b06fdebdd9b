"""Estimated bytes of GPU memory traffic of a region, eager against fused.

* eager: every op that materializes its result reads each tensor input and writes its
  output: ``Σ_op (Σ_in bytes(in) + bytes(out))``. Views cost nothing; index expressions the
  region reads (a causal mask) are written once by eager.
* fused: each input the kernel loads is read once at its stored size (a broadcast axis,
  stride 0, is not read again) and each result is written once; index expressions are
  computed in the kernel. This is a lower bound: K and V are re-read by every row tile,
  mostly from L2.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.fx as fx

from .ops import OpKind, packet

aten = torch.ops.aten

# Layout ops that copy their input (the others are views).
COPYING_LAYOUT = {aten.clone, aten._to_copy, aten.copy, aten.contiguous}
MATERIALIZING = {OpKind.CONTRACTION, OpKind.ELEMENTWISE, OpKind.REDUCTION, OpKind.OTHER}


@dataclasses.dataclass(frozen=True)
class Traffic:
    """Bytes moved to and from GPU memory by eager and by the fused kernel."""

    eager: int
    fused: int

    @property
    def saved(self) -> int:
        return self.eager - self.fused

    def __str__(self) -> str:
        share = f" ({100 * self.saved / self.eager:.0f}%)" if self.eager else ""
        return (f"memory traffic (estimate): eager {_human(self.eager)} → fused {_human(self.fused)}, "
                f"{_human(self.saved)} saved{share}")


def _human(n: float) -> str:
    if abs(n) < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB"):
        n /= 1000
        if abs(n) < 1000:
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} GB"


def _val(node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _hint(x) -> int:
    """The example value of a size or stride. A symbolic size (``dynamic=True``) is read from
    its hint, never compared or converted, which would add a guard and recompile."""
    if isinstance(x, torch.SymInt):
        return x.node.hint or 0
    return int(x)


def logical_bytes(node: fx.Node) -> int:
    val = _val(node)
    return 0 if val is None else math.prod(_hint(s) for s in val.shape) * val.element_size()


def stored_bytes(node: fx.Node) -> int:
    """Bytes of the elements a strided read visits once: broadcast (stride-0) axes count once."""
    val = _val(node)
    if val is None:
        return 0
    return math.prod(_hint(s) for s, st in zip(val.shape, val.stride()) if _hint(st) != 0) * val.element_size()


def _materializes(node: fx.Node, kinds: dict) -> bool:
    kind = kinds.get(node)
    return node.op == "call_function" and (
        kind in MATERIALIZING or (kind is OpKind.LAYOUT and packet(node.target) in COPYING_LAYOUT)
    )


def region_traffic(nodes: list, inputs: list, loaded: list, outputs: list, kinds: dict) -> Traffic:
    """``nodes``: the region's nodes; ``inputs``: nodes outside it that eager's ops read;
    ``loaded``: the nodes whose tensors the kernel loads; ``outputs``: the values leaving it."""
    eager = sum(
        logical_bytes(n) + sum(logical_bytes(a) for a in n.all_input_nodes)
        for n in nodes if _materializes(n, kinds)
    )
    eager += sum(logical_bytes(a) for a in inputs if kinds.get(a) is OpKind.INDEX)
    fused = sum(stored_bytes(a) for a in loaded) + sum(logical_bytes(o) for o in outputs)
    return Traffic(eager=eager, fused=fused)


__all__ = ["Traffic", "region_traffic", "stored_bytes"]
