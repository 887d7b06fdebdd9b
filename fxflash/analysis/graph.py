"""The analysis of one captured graph: a networkx view plus dimension ids, kinds, sketches."""
from __future__ import annotations

import dataclasses
import functools

import networkx as nx
import torch.fx as fx

from .dims import DimensionTable, build_dimension_table
from .ops import RANDOM, OpKind, packet
from .sketch import Sketch, op_kinds, sketch_of


def dataflow_graph(gm: fx.GraphModule) -> nx.DiGraph:
    """One vertex per FX node (the node itself), one edge per use (producer → consumer).
    Vertex attributes: ``op`` (FX opcode) and ``target`` (printable)."""
    g = nx.DiGraph()
    for node in gm.graph.nodes:
        g.add_node(node, op=node.op, target=str(node.target))
        for inp in node.all_input_nodes:
            g.add_edge(inp, node)
    return g


@dataclasses.dataclass
class GraphAnalysis:
    """Everything the pattern stage reads about a graph.

    graph:     the FX graph module.
    dataflow:  networkx DiGraph over its nodes.
    dims:      dimension table (axes → dimension ids).
    reduced:   reduced axes of every contraction and reduction node.
    kinds:     each node's OpKind.
    sketches:  each tensor node's Sketch.
    """

    graph: fx.GraphModule
    dataflow: nx.DiGraph
    dims: DimensionTable
    reduced: dict
    kinds: dict
    sketches: dict

    def nodes_of_kind(self, kind: OpKind) -> list[fx.Node]:
        return [n for n, k in self.kinds.items() if k is kind]

    @functools.cached_property
    def order(self) -> dict:
        """Each node's place in the graph, a topological order."""
        return {n: i for i, n in enumerate(self.graph.graph.nodes)}

    @functools.cached_property
    def random_downstream(self) -> set:
        """The nodes that read a value drawn from the random number generator (``ops.RANDOM``),
        directly or through others, the draws included: one search for the whole graph."""
        found = {n for n in self.dataflow if n.op == "call_function" and packet(n.target) in RANDOM}
        stack = list(found)
        while stack:
            for node in self.dataflow.successors(stack.pop()):
                if node not in found:
                    found.add(node)
                    stack.append(node)
        return found

    def sketch(self, node: fx.Node) -> Sketch | None:
        return self.sketches.get(node)


def analyse(gm: fx.GraphModule) -> GraphAnalysis:
    table, reduced = build_dimension_table(gm)
    kinds = op_kinds(gm)
    sketches = {}
    for node in gm.graph.nodes:
        s = sketch_of(node, kinds[node], table, reduced)
        if s is not None:
            sketches[node] = s
    return GraphAnalysis(gm, dataflow_graph(gm), table, reduced, kinds, sketches)
