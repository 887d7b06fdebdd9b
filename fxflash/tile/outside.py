"""Which values from outside a region its kernel computes per tile, and which it loads.

A value the region reads from outside is computed in the kernel from its inputs where eager would
otherwise materialize an O(M·N) tensor for the kernel to load: an elementwise op larger than the
tensors it reads (``ids[:, None] == ids[None, :]``, a padding mask broadcast to ``[B, H, M, N]``),
an op on such a value, a view of one (transformers' ``where(keep.expand(B, -1, M, N), 0,
finfo.min)``), or an op whose only use is one of the region's output ops (the gate's sigmoid).
Index expressions (``arange`` and what is computed from it) are always computed.

The decision is the lowering's (``tile.lower``: what ``explain()``'s tile program shows) and the
Triton printer's (``codegen.emit``). The backend's printer table is passed in: an op is computed
only where the backend can print it.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..analysis.ops import OpKind, packet

aten = torch.ops.aten

# Views through which the kernel reads what they view (``am.bool()[:, None, None, :].expand(B, H, M,
# N)``), its indices mapped to their source's without side effects (emit's layout_source_idx).
VECTOR_VIEWS = {aten.unsqueeze, aten.squeeze, aten.view, aten._unsafe_view, aten.expand, aten.permute, aten.transpose,
                aten.clone, aten.alias, aten.contiguous, aten.detach}


def broadcast_source(node: fx.Node) -> fx.Node:
    """The tensor ``node`` is a view of (``am.bool()[:, None, None, :].expand(B, H, M, N)``:
    ``am.bool()``), through VECTOR_VIEWS. An elementwise op larger than it is computed per tile from
    it, never from the O(M·N) tensor eager would materialize."""
    while (node.op == "call_function" and packet(node.target) in VECTOR_VIEWS
           and isinstance(node.args[0], fx.Node)):
        node = node.args[0]
    return node


class Outside:
    """Computed or loaded, for the values from outside a region that it reads (``computed``),
    memoized per node."""

    def __init__(self, kinds: dict, output_ops, printers):
        self.kinds, self.output_ops, self.printers = kinds, set(output_ops), printers
        self.memo: dict = {}

    def printable_elementwise(self, node: fx.Node) -> bool:
        """Is ``node`` an elementwise op on tensors that the backend can print?"""
        return (node.op == "call_function" and isinstance(node.meta.get("val"), torch.Tensor)
                and self.kinds.get(node) is OpKind.ELEMENTWISE and packet(node.target) in self.printers)

    def computed(self, node: fx.Node) -> bool:
        """Does the kernel compute ``node`` per tile from its inputs (module docstring)?"""
        if node in self.memo:
            return self.memo[node]
        val = node.meta.get("val")
        ok = False
        if (node.op == "call_function" and self.kinds.get(node) is OpKind.LAYOUT
                and packet(node.target) in VECTOR_VIEWS and isinstance(node.args[0], fx.Node)):
            ok = self.computed(node.args[0])
        elif self.printable_elementwise(node):
            inputs = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
            largest = max((broadcast_source(a).meta["val"].numel() for a in inputs), default=0)
            ok = bool(inputs) and (val.numel() > largest or any(self.computed(a) for a in inputs)
                                   or (len(node.users) == 1 and next(iter(node.users)) in self.output_ops))
        self.memo[node] = ok
        return ok


__all__ = ["VECTOR_VIEWS", "Outside", "broadcast_source"]
