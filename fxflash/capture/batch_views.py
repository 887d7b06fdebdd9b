"""A view that splits the leading batch axis moves up through the elementwise ops before it.

BLOOM computes its scores in the contraction's own frame, ``[B·H, M, N]`` (``alibi.baddbmm(q, k)``:
a scale and the ALiBi bias added there), and only then views them as ``[B, H, M, N]`` for the mask
and the softmax. The fusion rules read the scores in one frame, the view right after the
contraction. An elementwise op commutes with a reshape of all its operands, so

    view(op(x, y), [B, H, *rest])  →  op(view(x, [B, H, *rest]), view(y, [B, H, *rest']))

where the view splits only the first axis (``B·H → B, H``; the other axes unchanged), ``op`` is
one of ELEMENTWISE or a cast of the dtype (``_elementwise``) whose only user is the view, and a
contraction lies behind ``op`` through such ops. An operand of full rank with the whole first axis
is viewed the same way, one with a first axis of one as ``[1, 1, …]``, one of lower rank (it
broadcasts from the right) or a scalar is left as it is. Repeated until the view reaches an op
that is not elementwise (the contraction). The split sizes must be integers; one other axis may be
symbolic (a decode step's key length: the view's ``-1``), compared without a guard.
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

aten = torch.ops.aten

VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
ELEMENTWISE = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor}


def _elementwise(node: fx.Node) -> bool:
    """One of ELEMENTWISE, or a cast that changes the dtype only (``_to_copy(x, dtype=…)``: torch's
    ``baddbmm`` decomposition computes in fp32 and casts a 16-bit result back)."""
    return node.target in ELEMENTWISE or (node.target is aten._to_copy.default and set(node.kwargs) <= {"dtype"})


def _split(view: fx.Node) -> tuple | None:
    """``(B, H)`` where ``view`` splits its source's first axis into two and keeps the others."""
    src, out = view.args[0].meta.get("val"), view.meta.get("val")
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor) or out.dim() != src.dim() + 1:
        return None
    if not all(isinstance(s, int) for s in (out.shape[0], out.shape[1], src.shape[0])):
        return None
    if out.shape[0] * out.shape[1] != src.shape[0]:
        return None
    if not all(statically_known_true(a == b) for a, b in zip(out.shape[2:], src.shape[1:])):
        return None
    return out.shape[0], out.shape[1]


def _reaches_contraction(node) -> bool:
    """Is a ``bmm`` behind ``node`` through elementwise ops that only lead here? Only a view on the
    way from a contraction's scores moves: another (differential attention's ``[B, H, 2, M, N]``
    view of its softmax, which splits a batch axis of one) stays where the stream rules read it."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    if node.target is aten.bmm.default:
        return True
    return (_elementwise(node) and len(node.users) == 1
            and any(_reaches_contraction(a) for a in node.args))


def _hoistable(view: fx.Node) -> tuple | None:
    src = view.args[0]
    if not (view.op == "call_function" and view.target in VIEWS and isinstance(src, fx.Node)
            and src.op == "call_function" and _elementwise(src) and len(src.users) == 1
            and _reaches_contraction(src)):
        return None
    return _split(view)


def _viewed(gm: fx.GraphModule, arg, rank: int, first: int, split: tuple):
    """``arg`` of an op whose result has ``rank`` axes, the first ``first`` long, as the split views it."""
    val = arg.meta.get("val") if isinstance(arg, fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() < rank:
        return arg  # a scalar, or broadcast from the right: the split axes lie left of it
    if statically_known_true(val.shape[0] == first):
        lead = list(split)
    elif statically_known_true(val.shape[0] == 1):
        lead = [1, 1]
    else:
        return None
    rest = [size if isinstance(size, int) else -1 for size in val.shape[1:]]
    if rest.count(-1) > 1:
        return None  # two symbolic sizes: no -1 stands for both
    node = gm.graph.call_function(aten.view.default, (arg, [*lead, *rest]))
    node.meta["val"] = val.view([*lead, *val.shape[1:]])
    return node


def hoist_batch_views(gm: fx.GraphModule) -> int:
    """Apply the rewrite everywhere in ``gm`` (in place); returns how many views moved."""
    moved = 0
    changed = True
    while changed:
        changed = False
        for view in list(gm.graph.nodes):
            split = _hoistable(view) if view.op == "call_function" else None
            if split is None:
                continue
            op = view.args[0]
            val = op.meta["val"]
            with gm.graph.inserting_before(view):
                args = [_viewed(gm, a, val.dim(), val.shape[0], split) for a in op.args]
                if any(a is None for a in args):
                    continue
                new = gm.graph.call_function(op.target, tuple(args), dict(op.kwargs))
            new.meta = {**op.meta, "val": view.meta["val"]}
            view.replace_all_uses_with(new)
            gm.graph.erase_node(view)
            gm.graph.erase_node(op)
            moved += 1
            changed = True
    return moved
