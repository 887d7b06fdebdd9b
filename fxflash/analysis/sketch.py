"""Computation sketches ``[(P…), (R…)]`` and op kinds.

A sketch names the parallel dimensions of an op's output and the dimensions it reduces, in
dimension ids of :mod:`fxflash.analysis.dims`:

* elementwise ``C[p0, p1] = f(A[p0, p1], …)``          → ``[(P0, P1), ()]``
* contraction ``C[m, n] = Σ_k A[m, k] · B[k, n]``       → ``[(M, N), (K)]``
* reduction over the last axis ``r[m] = ⊕_n x[m, n]``  → ``[(M), (N)]``
* layout ops and index expressions: their output axes, nothing reduced.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from .dims import DimensionTable
from .ops import INDEX_PRESERVING, INDEX_SOURCES, LIKE_FILLS, OpKind, packet, static_kind


@dataclasses.dataclass(frozen=True)
class Sketch:
    """``[(parallel…), (reduced…)]``; each entry a dimension id (a tuple of atoms)."""

    parallel: tuple
    reduced: tuple

    def __str__(self) -> str:
        return f"[({', '.join(map(dim_name, self.parallel))}), ({', '.join(map(dim_name, self.reduced))})]"

    def names(self) -> tuple[list[str], list[str]]:
        return [dim_name(d) for d in self.parallel], [dim_name(d) for d in self.reduced]


def dim_name(dim_id: tuple) -> str:
    """``d3`` for a plain dimension, ``(d0·d1)`` for a merged one."""
    if len(dim_id) == 1:
        return f"d{dim_id[0]}"
    return "(" + "·".join(f"d{a}" for a in dim_id) + ")"


def op_kinds(gm: fx.GraphModule) -> dict[fx.Node, OpKind]:
    """Each node's kind. A node whose every input is an index expression, and which is itself a
    factory, elementwise, layout or index-preserving op, is an index expression: its value is
    a function of tile indices and constants, computed in a kernel, never loaded."""
    kinds: dict[fx.Node, OpKind] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node.op == "get_attr":
            kinds[node] = OpKind.INPUT
            continue
        if node.op == "output":
            kinds[node] = OpKind.OUTPUT
            continue
        if node.op != "call_function":
            kinds[node] = OpKind.OTHER
            continue
        kind = static_kind(node.target)
        inputs = [i for i in node.all_input_nodes if isinstance(i.meta.get("val"), torch.Tensor)]
        p = packet(node.target)
        if (p in INDEX_SOURCES and not inputs) or p in LIKE_FILLS:
            kind = OpKind.INDEX
        elif inputs and all(kinds.get(i) is OpKind.INDEX for i in inputs) and (
            kind in (OpKind.ELEMENTWISE, OpKind.LAYOUT) or p in INDEX_PRESERVING
        ):
            kind = OpKind.INDEX
        kinds[node] = kind
    return kinds


def sketch_of(node: fx.Node, kind: OpKind, table: DimensionTable, reduced: dict) -> Sketch | None:
    """The sketch of one node, or None for nodes without a tensor value."""
    axes = table.axes.get(node)
    if axes is None:
        return None
    parallel = tuple(table.dim_id(ax) for ax in axes if _size_of(table, ax) != 1)
    red = tuple(table.dim_id(ax) for ax in reduced.get(node, ()))
    return Sketch(parallel, red)


def _size_of(table: DimensionTable, axis) -> int | None:
    size = 1
    for a in axis:
        s = table.atom_size[a]
        if s is None:
            return None
        size *= s
    return size
