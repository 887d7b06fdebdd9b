"""Indexing a tensor by the positions of its own axes is a view of it.

transformers builds a padding mask as ``padding[batch_idx, kv_idx]`` with ``batch_idx =
arange(B)[:, None, None, None]`` and ``kv_idx = arange(N)[None, None, None, :]``: advanced
indexing whose every index is the iota of the axis it indexes, each along its own axis of the
result. Element ``[b, 0, 0, n]`` of the result is ``padding[b, n]``, so the result is the view
``padding[:, None, None, :]``, which the fusion rules read as a tensor loaded per key tile (and the
gather as an op they do not know). The pass rewrites

    index(x, [i₀, …, i_{k−1}])  →  view(x, S)

where each ``iⱼ`` is ``arange(x.size(j))`` (plus a literal 0) behind unsqueezes, whose one axis
above size one is at position ``pⱼ`` of the indices' broadcast shape, with ``p₀ < p₁ < …``; ``S``
holds ``x.size(j)`` at ``pⱼ``, 1 at the other positions of the broadcast shape, then the sizes of
the axes of ``x`` not indexed. Any other index, and one with a symbolic size, is left as it is.
"""
from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten

THROUGH = {aten.unsqueeze.default, aten.view.default, aten._unsafe_view.default, aten.reshape.default}


def _iota_length(node) -> object:
    """``n`` where ``node`` is ``arange(n)`` (or ``arange(n) + 0``) behind layout ops that only add
    or drop ones, else None."""
    while isinstance(node, fx.Node) and node.op == "call_function" and node.target in THROUGH:
        node = node.args[0]
    if isinstance(node, fx.Node) and node.target is aten.add.Tensor and node.args[1] == 0:
        node = node.args[0]
    if not (isinstance(node, fx.Node) and node.target in (aten.arange.default, aten.arange.start)):
        return None
    if node.target is aten.arange.start:  # arange(start, end): an iota where start is 0 (no step here)
        start, end = node.args
        return end if start == 0 else None
    return node.args[0]  # arange(end)


def _view_shape(node: fx.Node) -> list | None:
    """``S`` for an index by iotas with static sizes (see the module docstring), else None."""
    x, indices = node.args
    shape, out = list(x.meta["val"].shape), list(node.meta["val"].shape)
    if (not indices or any(i is None for i in indices) or len(indices) > len(shape)
            or not all(isinstance(s, int) for s in shape + out)):
        return None
    rank = len(out) - (len(shape) - len(indices))  # the indices' broadcast rank
    positions = []
    for j, index in enumerate(indices):
        sizes = list(index.meta["val"].shape)
        above_one = [rank - len(sizes) + a for a, s in enumerate(sizes) if s != 1]
        if _iota_length(index) != shape[j] or len(above_one) > 1 or (not above_one and shape[j] != 1):
            return None
        positions.append(above_one[0] if above_one else None)
    placed = [p for p in positions if p is not None]
    if placed != sorted(set(placed)):
        return None
    view = [1] * rank + shape[len(indices):]
    for j, p in enumerate(positions):
        if p is not None:
            view[p] = shape[j]
    return view if view == out else None


def index_by_iotas(gm: fx.GraphModule) -> int:
    """Rewrite each index of a tensor by the iotas of its own axes into a view; how many."""
    done = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.index.Tensor:
            continue
        view = _view_shape(node)
        if view is None:
            continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(aten.view.default, (node.args[0], view))
        new.meta = {**node.meta, "val": node.args[0].meta["val"].view(view)}
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        done += 1
    return done


__all__ = ["index_by_iotas"]
