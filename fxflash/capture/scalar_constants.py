"""A zero-dimensional tensor constant in the graph is the scalar it holds.

``torch.tensor(0.0, device="cuda")`` in traced code becomes ``detach(lift_fresh_copy(c))`` of a
constant ``c`` the graph module holds (on a CPU the trace gives ``scalar_tensor(0.0)``). The
fusion rules read a constant only from a factory op, so transformers' eager mask, ``where(keep,
torch.tensor(0.0, device=…), finfo.min)``, was neither computed in the kernel nor seen as a mask.
The pass rewrites

    detach(lift_fresh_copy(c)), lift_fresh_copy(c)  →  scalar_tensor(c.item(), dtype, device)

for a ``c`` of zero dimensions holding a real value: a fresh tensor of the same value, dtype and
device. Other constants are left as they are.
"""
from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten


def _scalar_of(gm: fx.GraphModule, node) -> torch.Tensor | None:
    """The 0-d real tensor ``node`` copies (``lift_fresh_copy`` of a ``get_attr``), else None."""
    if not (isinstance(node, fx.Node) and node.target is aten.lift_fresh_copy.default):
        return None
    (source,) = node.args
    if not (isinstance(source, fx.Node) and source.op == "get_attr"):
        return None
    value = getattr(gm, source.target, None)
    if (not isinstance(value, torch.Tensor) or value.dim() != 0 or isinstance(value, torch._subclasses.FakeTensor)
            or value.is_meta):
        return None
    return value


def scalars_from_constants(gm: fx.GraphModule) -> int:
    """Rewrite each copy of a 0-d tensor constant (and its ``detach``) into ``scalar_tensor``; how
    many."""
    done = 0
    for node in reversed(list(gm.graph.nodes)):  # a detach before the copy it reads
        copy = node.args[0] if node.target is aten.detach.default and node.args else node
        value = _scalar_of(gm, copy)
        if value is None:
            continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(aten.scalar_tensor.default, (value.item(),),
                                         {"dtype": value.dtype, "layout": torch.strided, "device": value.device})
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        done += 1
    return done


__all__ = ["scalars_from_constants"]
