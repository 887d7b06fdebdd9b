"""Chain discovery: contraction → (elementwise)* → reduction(s) → contraction.

A *chain* is the candidate of one fused region. With ``C1 = A·Bᵀ`` producing ``S[…, M, N]``,
it is every node on a path from ``C1`` to a contraction ``C2`` that contracts the axis ``N``
(``O = P·V``), where the nodes between them are elementwise, layout, index-expression or
reduction ops, and every reduction reduces over ``N`` (the softmax's ``amax``/``sum``) and
no other axis. A chain with no reduction at all (sigmoid or ReLU attention) is taken only
between batched contractions (``bmm``) with an elementwise op between them: a plain
``mm → relu → mm`` is an MLP and ``(A·B)·C`` a matmul chain, both left to Inductor. Chains
never share nodes: a later one that overlaps an earlier one is dropped. The set ``descendants(C1) ∩ ancestors(C2)`` is convex by
construction (a path that leaves it and comes back would lie inside it); the check is kept
for the trailing layout ops that are added to the region's end.
"""
from __future__ import annotations

import dataclasses

import networkx as nx
import torch
import torch.fx as fx

from ..analysis import GraphAnalysis, OpKind
from ..analysis.ops import packet
from ..analysis.sketch import dim_name

aten = torch.ops.aten
INNER_KINDS = {OpKind.ELEMENTWISE, OpKind.LAYOUT, OpKind.REDUCTION, OpKind.INDEX}
TRAILING_VIEWS = {aten.view, aten._unsafe_view, aten.reshape}
EPILOGUE_LAYOUTS = {aten.permute, aten.transpose}


@dataclasses.dataclass
class Chain:
    """One candidate region.

    first / second: the producer contraction (``QKᵀ``) and the consumer (``P·V``).
    demoted:        dimension id of ``N``: the producer's parallel axis that becomes the
                    region's reduction axis (dimension demotion).
    output_ops:     ops after the consumer (and the view that restores its batch axes) that
                    the kernel applies to its output tile before storing it: transposes and
                    elementwise ops with inputs from outside the region (a sigmoid gate).
    reductions:     the reductions over ``N`` between them (``amax``, ``sum``).
    nodes:          every node of the region, in graph order; the last is its output.
    inputs:         nodes outside the region that it reads.
    escapes:        region nodes other than the output that are used outside the region.
    """

    first: fx.Node
    second: fx.Node
    demoted: tuple
    reductions: list
    nodes: list
    inputs: list
    escapes: list
    output_ops: list = dataclasses.field(default_factory=list)

    @property
    def output(self) -> fx.Node:
        return self.nodes[-1]

    def describe(self) -> str:
        return (
            f"{self.first.name} → {', '.join(r.name for r in self.reductions)} → "
            f"{self.second.name} (demoted {dim_name(self.demoted)})"
        )


def _demoted_dim(analysis: GraphAnalysis, first: fx.Node) -> tuple:
    return analysis.dims.dim_id(analysis.dims.axes[first][-1])


def _contracted_dim(analysis: GraphAnalysis, node: fx.Node) -> tuple:
    return analysis.dims.dim_id(analysis.reduced[node][0])


def _reduces_only(analysis: GraphAnalysis, node: fx.Node, dim: tuple) -> bool:
    return all(analysis.dims.dim_id(ax) == dim for ax in analysis.reduced[node])


def _graph_order(analysis: GraphAnalysis) -> dict:
    return {n: i for i, n in enumerate(analysis.graph.graph.nodes)}


def is_convex(g: nx.DiGraph, nodes: set) -> bool:
    """No path leaves ``nodes`` and comes back into it."""
    outside = {w for u in nodes for w in g.successors(u) if w not in nodes}
    for w in outside:
        if nx.descendants(g, w) & nodes:
            return False
    return True


def _chain_between(analysis: GraphAnalysis, first: fx.Node, second: fx.Node, order) -> Chain | None:
    g = analysis.dataflow
    demoted = _demoted_dim(analysis, first)
    if _contracted_dim(analysis, second) != demoted:
        return None
    between = (nx.descendants(g, first) & nx.ancestors(g, second)) - {first, second}
    if any(analysis.kinds[n] not in INNER_KINDS for n in between):
        return None
    reductions = [n for n in between if analysis.kinds[n] is OpKind.REDUCTION]
    if not all(_reduces_only(analysis, r, demoted) for r in reductions):
        return None
    if not reductions and (not all(packet(c.target) is aten.bmm for c in (first, second))
                           or not any(analysis.kinds[n] is OpKind.ELEMENTWISE for n in between)):
        return None
    nodes = between | {first, second}
    last = second
    while len(last.users) == 1:
        (user,) = last.users
        if user.op != "call_function" or packet(user.target) not in TRAILING_VIEWS:
            break
        nodes.add(user)
        last = user
    if not is_convex(g, nodes):
        return None
    ordered = sorted(nodes, key=order.__getitem__)
    inputs = sorted(
        {i for n in ordered for i in n.all_input_nodes if i not in nodes}, key=order.__getitem__
    )
    escapes = [n for n in ordered[:-1] if any(u not in nodes for u in n.users)]
    return Chain(first, second, demoted, sorted(reductions, key=order.__getitem__), ordered, inputs, escapes)


def _output_ops(analysis: GraphAnalysis, last: fx.Node, nodes: set, others: set) -> list:
    """The single-user run of transposes and elementwise ops after ``last`` whose other inputs
    depend neither on this region nor on another chain's (they are loaded, or computed, per
    output tile)."""
    ops, inside = [], set(nodes) | others
    g = analysis.dataflow
    while len(last.users) == 1:
        (user,) = last.users
        if user.op != "call_function":
            break
        kind, p = analysis.kinds.get(user), packet(user.target)
        others = [a for a in user.all_input_nodes if a is not last]
        if kind is OpKind.ELEMENTWISE:
            if any(a in inside or nx.ancestors(g, a) & inside for a in others):
                break
            if tuple(user.meta["val"].shape) != tuple(last.meta["val"].shape):
                break  # an op that broadcasts the output up
        elif p not in EPILOGUE_LAYOUTS:
            break
        ops.append(user)
        inside.add(user)
        last = user
    # a transpose is worth taking only when an elementwise op after it reads the new order
    while ops and packet(ops[-1].target) in EPILOGUE_LAYOUTS:
        ops.pop()
    return ops


def find_chains(analysis: GraphAnalysis) -> list[Chain]:
    """Every chain in the graph; for each producer, the nearest consumer that closes one."""
    order = _graph_order(analysis)
    contractions = sorted(analysis.nodes_of_kind(OpKind.CONTRACTION), key=order.__getitem__)
    chains = []
    for first in contractions:
        later = nx.descendants(analysis.dataflow, first)
        for second in (c for c in contractions if c in later):
            chain = _chain_between(analysis, first, second, order)
            if chain is not None and not any(set(chain.nodes) & set(c.nodes) for c in chains):
                chains.append(chain)
                break
    for chain in chains:
        others = {n for c in chains if c is not chain for n in c.nodes}
        chain.output_ops = _output_ops(analysis, chain.output, set(chain.nodes), others)
        chain.nodes = sorted(set(chain.nodes) | set(chain.output_ops), key=order.__getitem__)
        chain.inputs = sorted({i for n in chain.nodes for i in n.all_input_nodes if i not in chain.nodes},
                              key=order.__getitem__)
    return chains
