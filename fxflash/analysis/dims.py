"""Logical dimension ids for every tensor axis.

Each axis of each tensor is described by a tuple of *atoms*: an axis that is the merge of
others (``view(B*H, M, D)``) holds the atoms of every merged axis, in order, and a later split
(``view(B, H, M, N)``) gives them back one by one. Axes that must be equal (the operands of an
elementwise op along a non-broadcast axis, the contracted axes of a matmul, an axis kept by
permute / expand / unsqueeze / a full slice) are united in a union-find over atoms. A
dimension id is the representative atom of a class.

An axis that the rules cannot relate to its input (a partial slice, a reshape that splits an
atom) gets fresh atoms: the analysis never claims an equality it did not prove.
"""
from __future__ import annotations

import itertools
import operator
from typing import Iterable

import torch
import torch.fx as fx

from .ops import CONTRACTIONS, OpKind, packet, static_kind

aten = torch.ops.aten
_getitem = operator.getitem
_SPLITS = {aten.split, aten.split_with_sizes, aten.unbind}

Axis = tuple  # tuple of atom ids


def _int(size):
    """A size as an int, or for a symbolic size its sympy expression — never ``int()`` of a
    SymInt, which would specialize (and guard) a dynamic graph on its current value."""
    if isinstance(size, torch.SymInt):
        expr = size.node.expr
        return int(expr) if expr.is_number else expr
    try:
        return int(size)
    except (TypeError, ValueError):
        return None


def _same_size(a, b) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return (a - b).expand() == 0


def node_value(node: fx.Node):
    return node.meta.get("val", None)


def tensor_shape(node) -> tuple | None:
    val = node_value(node) if isinstance(node, fx.Node) else None
    if isinstance(val, torch.Tensor):
        return tuple(val.shape)
    return None


class DimensionTable:
    """Atoms, their sizes and the union-find over them; axes of every node."""

    def __init__(self):
        self._parent: dict[int, int] = {}
        self.atom_size: dict[int, int | None] = {}
        self.axes: dict[fx.Node, list[Axis]] = {}
        self._ids = itertools.count()

    # -- atoms ---------------------------------------------------------------------------
    def new_atom(self, size) -> int:
        a = next(self._ids)
        self._parent[a] = a
        self.atom_size[a] = _int(size)
        return a

    def find(self, a: int) -> int:
        root = a
        while self._parent[root] != root:
            root = self._parent[root]
        while self._parent[a] != root:
            self._parent[a], a = root, self._parent[a]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self._parent[max(ra, rb)] = min(ra, rb)

    def unite_axes(self, x: Axis, y: Axis) -> None:
        """Declare two axes equal: atom by atom when both are split alike."""
        if len(x) == len(y):
            for a, b in zip(x, y):
                self.union(a, b)

    def dim_id(self, axis: Axis) -> tuple:
        """The canonical id of an axis: its atoms' representatives (one element if unmerged)."""
        return tuple(self.find(a) for a in axis)

    def fresh_axes(self, shape: Iterable) -> list[Axis]:
        return [(self.new_atom(s),) for s in shape]

    def axes_of(self, node) -> list[Axis] | None:
        return self.axes.get(node) if isinstance(node, fx.Node) else None

    def dims(self, node: fx.Node) -> list[tuple]:
        """Canonical dimension ids of every axis of ``node``."""
        return [self.dim_id(ax) for ax in self.axes[node]]


def _norm(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _atom_sizes(table: DimensionTable, axis: Axis) -> list:
    return [table.atom_size[a] for a in axis]


def _group_atoms(table: DimensionTable, atoms: list, sizes: list) -> tuple[list, int]:
    """Greedily give each size in ``sizes`` the next atoms whose product is that size; stops
    at the first size that would split an atom. Returns (groups, atoms consumed)."""
    groups, i = [], 0
    for size in sizes:
        if size == 1:
            groups.append((table.new_atom(1),))
            continue
        group, prod, j = [], 1, i
        while j < len(atoms) and not _same_size(prod, size):
            group.append(atoms[j])
            prod = prod * table.atom_size[atoms[j]]
            j += 1
        if not _same_size(prod, size):
            break
        groups.append(tuple(group))
        i = j
    return groups, i


def _reshape_axes(table: DimensionTable, src: list[Axis], src_shape, out_shape) -> list[Axis]:
    """Axes of ``reshape(src, out_shape)``: regroup the source atoms by size products.

    Atoms of size one are dropped; an output axis takes the next atoms whose product is its
    size, from the front and then from the back. Axes between, where an atom would have to be
    split (``view(B, 2H, M, N) → (B, H, 2, M, N)``), get fresh atoms; those around keep theirs.
    """
    atoms = [a for ax in src for a in ax if table.atom_size[a] != 1]
    if any(table.atom_size[a] is None for a in atoms) or any(_int(s) is None for s in out_shape):
        return table.fresh_axes(out_shape)
    sizes = [_int(s) for s in out_shape]
    front, used = _group_atoms(table, atoms, sizes)
    if len(front) == len(sizes):
        return front
    back, _ = _group_atoms(table, atoms[used:][::-1], sizes[len(front):][::-1])
    back = [tuple(reversed(g)) for g in reversed(back)]
    middle = out_shape[len(front):len(sizes) - len(back)]
    return front + table.fresh_axes(middle) + back


def _broadcast_axes(table: DimensionTable, node: fx.Node, out_shape) -> list[Axis]:
    """Elementwise with broadcasting: align right; an input axis of the output's size (not a
    broadcast 1) is the same dimension as the output axis."""
    rank = len(out_shape)
    out: list[Axis | None] = [None] * rank
    for arg in node.all_input_nodes:
        axes, shape = table.axes_of(arg), tensor_shape(arg)
        if axes is None or shape is None:
            continue
        offset = rank - len(shape)
        for j, (ax, size) in enumerate(zip(axes, shape)):
            i = offset + j
            if i < 0 or _int(size) == 1 and _int(out_shape[i]) != 1:
                continue
            if out[i] is None:
                out[i] = ax
            else:
                table.unite_axes(out[i], ax)
    return [ax if ax is not None else (table.new_atom(s),) for ax, s in zip(out, out_shape)]


def _contraction_axes(table: DimensionTable, node: fx.Node) -> tuple[list[Axis], list[Axis]]:
    """``C[b.., m, n] = Σ_k A[b.., m, k] B[b.., k, n]``: unite batch and k axes.
    Returns (output axes, contracted axes)."""
    nbatch = CONTRACTIONS[packet(node.target)]
    a, b = node.args[0], node.args[1]
    ax_a, ax_b = table.axes[a], table.axes[b]
    for i in range(nbatch):
        table.unite_axes(ax_a[i], ax_b[i])
    table.unite_axes(ax_a[-1], ax_b[-2])
    return list(ax_a[:nbatch]) + [ax_a[-2], ax_b[-1]], [ax_a[-1]]


def reduction_dims(node: fx.Node) -> tuple[list[int], bool]:
    """(normalized reduced axes, keepdim) of a reduction node."""
    shape = tensor_shape(node.args[0])
    rank = len(shape)
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", None)
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if dims is None or dims == []:
        dims = list(range(rank))
    elif isinstance(dims, int):
        dims = [dims]
    return sorted(_norm(d, rank) for d in dims), bool(keepdim)


def _layout_axes(table: DimensionTable, node: fx.Node, out_shape) -> list[Axis]:
    p = packet(node.target)
    src = node.args[0]
    src_axes, src_shape = table.axes_of(src), tensor_shape(src)
    if src_axes is None:
        return table.fresh_axes(out_shape)
    rank = len(src_shape)
    if p in (aten.view, aten._unsafe_view, aten.reshape, aten._reshape_alias):
        return _reshape_axes(table, src_axes, src_shape, out_shape)
    if p is aten.permute:
        return [src_axes[_norm(d, rank)] for d in node.args[1]]
    if p is aten.transpose:
        d0, d1 = _norm(node.args[1], rank), _norm(node.args[2], rank)
        axes = list(src_axes)
        axes[d0], axes[d1] = axes[d1], axes[d0]
        return axes
    if p is aten.t:
        return list(reversed(src_axes))
    if p is aten.expand:
        offset = len(out_shape) - rank
        out = []
        for i, size in enumerate(out_shape):
            j = i - offset
            if j >= 0 and _int(src_shape[j]) == _int(size):
                out.append(src_axes[j])
            else:
                out.append((table.new_atom(size),))
        return out
    if p is aten.unsqueeze:
        d = _norm(node.args[1], rank + 1)
        return list(src_axes[:d]) + [(table.new_atom(1),)] + list(src_axes[d:])
    if p is aten.squeeze:
        dims = node.args[1] if len(node.args) > 1 else list(range(rank))
        dims = {_norm(d, rank) for d in ([dims] if isinstance(dims, int) else dims)}
        return [ax for i, ax in enumerate(src_axes) if not (i in dims and _int(src_shape[i]) == 1)]
    if p is aten.select:
        d = _norm(node.args[1], rank)
        return list(src_axes[:d]) + list(src_axes[d + 1:])
    if p is aten.slice:
        d = _norm(node.args[1] if len(node.args) > 1 else 0, rank)
        axes = list(src_axes)
        if _int(out_shape[d]) != _int(src_shape[d]):
            axes[d] = (table.new_atom(out_shape[d]),)
        return axes
    # clone, alias, contiguous, detach, lift_fresh_copy: same axes
    if len(out_shape) == rank:
        return list(src_axes)
    return table.fresh_axes(out_shape)


def _split_piece_axes(table: DimensionTable, getitem: fx.Node, out_shape) -> list[Axis]:
    """Axes of one piece of ``split``/``unbind``: the split axis is new, the others kept."""
    split = getitem.args[0]
    src = split.args[0]
    src_axes, src_shape = table.axes_of(src), tensor_shape(src)
    if src_axes is None:
        return table.fresh_axes(out_shape)
    rank = len(src_shape)
    p = packet(split.target)
    if p is aten.unbind:
        d = _norm(split.args[1] if len(split.args) > 1 else 0, rank)
        return list(src_axes[:d]) + list(src_axes[d + 1:])
    d = _norm(split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0), rank)
    axes = list(src_axes)
    if _int(out_shape[d]) != _int(src_shape[d]):
        axes[d] = (table.new_atom(out_shape[d]),)
    return axes


def build_dimension_table(gm: fx.GraphModule) -> tuple[DimensionTable, dict]:
    """Propagate dimension ids through the graph in topological order.

    Returns the table and, for each contraction and reduction node, its reduced axes.
    """
    table = DimensionTable()
    reduced: dict[fx.Node, list[Axis]] = {}
    for node in gm.graph.nodes:
        shape = tensor_shape(node)
        if shape is None:
            continue
        if node.op != "call_function":
            table.axes[node] = table.fresh_axes(shape)
            continue
        kind = static_kind(node.target)
        if node.target is _getitem and packet(node.args[0].target) in _SPLITS:
            axes = _split_piece_axes(table, node, shape)
        elif kind is OpKind.CONTRACTION:
            axes, reduced[node] = _contraction_axes(table, node)
        elif kind is OpKind.REDUCTION:
            src_axes = table.axes[node.args[0]]
            dims, keepdim = reduction_dims(node)
            reduced[node] = [src_axes[d] for d in dims]
            axes = []
            for i, ax in enumerate(src_axes):
                if i not in dims:
                    axes.append(ax)
                elif keepdim:
                    axes.append((table.new_atom(1),))
        elif kind is OpKind.LAYOUT:
            axes = _layout_axes(table, node, shape)
        elif kind is OpKind.ELEMENTWISE:
            axes = _broadcast_axes(table, node, shape)
        else:
            axes = table.fresh_axes(shape)
        if len(axes) != len(shape):  # a rule did not apply: never guess
            axes = table.fresh_axes(shape)
        table.axes[node] = axes
    return table, reduced

