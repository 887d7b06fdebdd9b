"""A triangle of a constant is a choice between the constant and zero.

``torch.full((L, L), -inf).triu(1)`` (an additive causal mask) is ``c`` where ``col − row ≥ 1`` and
0 elsewhere. The fusion rules read a mask from ``where(condition, fill, 0)`` over a boolean index
expression, and intervals give no bound for an infinite number, so the triangle of a constant had no
per-tile test and skipped nothing. The pass rewrites

    triu(full(shape, c), d)  →  where(triu(ones(shape, bool), d), full(shape, c), 0)

(``tril`` alike), the same values: ``c`` where the triangle keeps, 0 elsewhere, in the fill's dtype.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..analysis.ops import packet

aten = torch.ops.aten

# Constant fills whose first argument is the size (``full(size, c)``, ``ones(size)``, ``zeros(size)``).
SIZED_FILLS = {aten.full.default, aten.ones.default, aten.zeros.default}


def triangles_of_constants(gm: fx.GraphModule) -> int:
    """Rewrite each ``triu``/``tril`` of a constant-filled tensor as a ``where``; how many."""
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or packet(node.target) not in (aten.triu, aten.tril):
            continue
        source = node.args[0]
        val = node.meta.get("val")
        if not (isinstance(source, fx.Node) and source.op == "call_function" and source.target in SIZED_FILLS
                and isinstance(val, torch.Tensor) and val.dtype.is_floating_point):
            continue
        g = gm.graph
        with g.inserting_before(node):
            ones = g.call_function(aten.ones.default, (source.args[0],),
                                   {"dtype": torch.bool, "layout": torch.strided, "device": val.device})
            ones.meta = {"val": val.new_ones(val.shape, dtype=torch.bool)}
            keep = g.call_function(node.target, (ones, *node.args[1:]), dict(node.kwargs))
            keep.meta = {"val": ones.meta["val"]}
            zero = g.call_function(aten.scalar_tensor.default, (0.0,),
                                   {"dtype": val.dtype, "layout": torch.strided, "device": val.device})
            zero.meta = {"val": val.new_zeros(())}
            new = g.call_function(aten.where.self, (keep, source, zero))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        g.erase_node(node)
        done += 1
    return done


__all__ = ["triangles_of_constants"]
