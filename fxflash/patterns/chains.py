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
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..analysis import GraphAnalysis, OpKind
from ..analysis.dims import reduction_dims
from ..analysis.ops import LAYOUTS, packet
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
    escapes:        region nodes other than the output that are used outside the region
                    (allowed when they are row values: the logsumexp returned beside O).
    output:         the node whose value the region's main result replaces.
    """

    first: fx.Node
    second: fx.Node
    demoted: tuple
    reductions: list
    nodes: list
    inputs: list
    escapes: list
    output: fx.Node = None
    output_ops: list = dataclasses.field(default_factory=list)
    partners: list = dataclasses.field(default_factory=list)  # [[ops…, view, contraction]] added to S

    def describe(self) -> str:
        return (
            f"{self.first.name} → {', '.join(r.name for r in self.reductions)} → "
            f"{self.second.name} (demoted {dim_name(self.demoted)})"
        )


def _demoted_dim(analysis: GraphAnalysis, first: fx.Node) -> tuple:
    return analysis.dims.dim_id(analysis.dims.axes[first][-1])


def _contracted_dim(analysis: GraphAnalysis, node: fx.Node) -> tuple:
    return analysis.dims.dim_id(analysis.reduced[node][0])


def _shape_of(node) -> tuple:
    return tuple(node.meta["val"].shape)


def _reduces_only(analysis: GraphAnalysis, node: fx.Node, dim: tuple) -> bool:
    return all(analysis.dims.dim_id(ax) == dim for ax in analysis.reduced[node])


def is_convex(g: nx.DiGraph, nodes: set, order: dict) -> bool:
    """No path leaves ``nodes`` and comes back into it. Such a path returns to a node no later (in
    the topological ``order``) than the last of ``nodes``: the search stops past it."""
    last = max(order[n] for n in nodes)
    seen = {w for u in nodes for w in g.successors(u) if w not in nodes and order[w] < last}
    stack = list(seen)
    while stack:
        for w in g.successors(stack.pop()):
            if w in nodes:
                return False
            if w not in seen and order[w] < last:
                seen.add(w)
                stack.append(w)
    return True


@dataclasses.dataclass
class NearMiss:
    """Two batched contractions that chain over the demoted axis, but with something between
    them that no region can hold; explain() reports it with ``reason``."""

    chain: Chain
    reason: str
    node: fx.Node | None = None  # the node that stopped it


def _is_weight(node) -> bool:
    """Is ``node`` a module's parameter (``meta["is_parameter"]``, set at capture), or a layout op
    of one (a transpose, a view)?"""
    while isinstance(node, fx.Node) and node.op == "call_function" and packet(node.target) in LAYOUTS:
        node = node.args[0]
    return isinstance(node, fx.Node) and node.op == "placeholder" and node.meta.get("is_parameter", False)


def _chain_between(analysis: GraphAnalysis, first: fx.Node, second: fx.Node, order,
                   between: set | None = None) -> Chain | NearMiss | None:
    """The chain ``first → second``, a near miss, or None; ``between``: the nodes on paths from
    one to the other, where the caller knows them."""
    g = analysis.dataflow
    demoted = _demoted_dim(analysis, first)
    if between is None:
        between = (nx.descendants(g, first) & nx.ancestors(g, second)) - {first, second}

    def near_miss(reason: str, node: fx.Node | None = None):
        if not all(packet(c.target) is aten.bmm for c in (first, second)):
            return None  # only attention-like (batched) pairs are worth reporting
        nodes = sorted(between | {first, second}, key=order.__getitem__)
        return NearMiss(Chain(first, second, demoted, [], nodes, [], [], second), f"chain discovery: {reason}", node)

    other = [n for n in between if analysis.kinds[n] not in INNER_KINDS]
    if _contracted_dim(analysis, second) != demoted:
        # a symbolic size compares without a guard (a guard would compile again at the other sizes)
        if other and statically_known_true(_shape_of(second.args[0])[-1] == _shape_of(first)[-1]):
            n = min(other, key=order.__getitem__)
            return near_miss(f"{n.name} ({n.target}) between the contractions hides whether the consumer "
                             "contracts the producer's key axis", n)
        return None
    if other:
        n = min(other, key=order.__getitem__)
        return near_miss(f"{n.name} ({n.target}) between the contractions is not an elementwise, layout, "
                         "index or reduction op", n)
    reductions = [n for n in between if analysis.kinds[n] is OpKind.REDUCTION]
    if _is_weight(first.args[1]) and not any(packet(r.target) is aten.amax for r in reductions):
        # not attention: a norm over a weight's output features (RMSNorm or LayerNorm between two
        # linear layers, mm → mean → mm), not a softmax over keys; a softmax over a learned memory's
        # keys stays a candidate
        return None
    across = sorted((r for r in reductions if not _reduces_only(analysis, r, demoted)), key=order.__getitem__)
    if across:
        return near_miss(f"{across[0].name} reduces an axis other than the demoted {dim_name(demoted)} "
                         "(e.g. a softmax over the queries)", across[0])
    if not reductions and (not all(packet(c.target) is aten.bmm for c in (first, second))
                           or not any(analysis.kinds[n] is OpKind.ELEMENTWISE for n in between)):
        return None
    nodes = between | {first, second} | _side_branches(analysis, between | {first}, second, demoted)
    last = second
    while len(last.users) == 1:
        (user,) = last.users
        if user.op != "call_function" or packet(user.target) not in TRAILING_VIEWS:
            break
        nodes.add(user)
        last = user
    if not is_convex(g, nodes, order):
        return near_miss("a path leaves the region and comes back into it")
    ordered = sorted(nodes, key=order.__getitem__)
    inputs = sorted(
        {i for n in ordered for i in n.all_input_nodes if i not in nodes}, key=order.__getitem__
    )
    escapes = [n for n in ordered if n is not last and any(u not in nodes for u in n.users)]
    reductions = [n for n in ordered if analysis.kinds[n] is OpKind.REDUCTION]
    return Chain(first, second, demoted, reductions, ordered, inputs, escapes, last)


def _side_branches(analysis: GraphAnalysis, region: set, second: fx.Node, demoted: tuple) -> set:
    """Ops that compute further values from the scores without reaching the consumer — the
    ``logsumexp`` of the scores returned beside the output: elementwise, layout and
    reductions over N whose other inputs do not depend on the region. Whether their results
    may leave the region (row values only) is the fusion rules' decision."""
    def accept(node):
        kind = analysis.kinds.get(node)
        return (node.op == "call_function" and kind in INNER_KINDS
                and (kind is not OpKind.REDUCTION or _reduces_only(analysis, node, demoted)))

    return set(_grow_downstream(analysis.dataflow, region, {second}, accept))


def _grow_downstream(g: nx.DiGraph, seeds: set, blocked: set, accept) -> list:
    """Users of ``seeds`` — and of what is taken — that ``accept`` and whose other inputs
    depend neither on ``seeds``, ``blocked`` nor what is taken (they are read beside the
    region, never computed from it), in the order taken."""
    taken: list = []
    grown = True
    while grown:
        grown = False
        for node in [u for n in (*seeds, *taken) for u in n.users]:
            reached = seeds | set(taken)
            if node in reached or node in blocked or not accept(node):
                continue
            outer = [a for a in node.all_input_nodes if a not in reached]
            if any(a in blocked or nx.ancestors(g, a) & (reached | blocked) for a in outer):
                continue
            taken.append(node)
            grown = True
    return taken


OUTPUT_REDUCTIONS = {aten.sum, aten.mean, aten.amax}


def _is_output_op(analysis: GraphAnalysis, node: fx.Node, last: fx.Node) -> bool:
    """An op the output tile can go through: it keeps the tile's elements (elementwise ops,
    transposes) or reduces its last axis with keepdim (sum, mean, amax)."""
    kind, p = analysis.kinds.get(node), packet(node.target)
    val = node.meta.get("val")
    if node.op != "call_function" or not isinstance(val, torch.Tensor):
        return False
    tile = last.meta["val"].numel()
    if kind is OpKind.REDUCTION:
        src = node.args[0].meta["val"]
        dims, keepdim = reduction_dims(node)
        return (p in OUTPUT_REDUCTIONS and src.numel() == tile and keepdim and dims == [src.dim() - 1]
                and node.kwargs.get("dtype") is None)
    if p in EPILOGUE_LAYOUTS:
        return val.numel() == tile
    rows = tile // max(1, int(last.meta["val"].shape[-1]))
    return kind is OpKind.ELEMENTWISE and val.numel() in (tile, rows)  # per element, or per row


def _output_ops(analysis: GraphAnalysis, last: fx.Node, nodes: set, others: set) -> list:
    """The ops after ``last`` that the kernel can apply to its output tile: transposes,
    elementwise ops whose other inputs depend neither on this region nor on another chain's
    (they are loaded, or computed, per output tile) and reductions over the output's last
    axis (an RMSNorm of each head), grown while they form a DAG with ``last`` as its only
    entry and one value leaving it."""
    taken = _grow_downstream(analysis.dataflow, {last}, (set(nodes) | others) - {last},
                             lambda node: _is_output_op(analysis, node, last))
    order = {n: i for i, n in enumerate(last.graph.nodes)}
    taken.sort(key=order.__getitem__)
    # keep the longest prefix (in graph order) from which exactly one value leaves
    while taken:
        group = {last, *taken}
        leaving = [n for n in group if any(u not in group for u in n.users)]
        if leaving == [taken[-1]] and _ends_full(taken[-1], last):
            break
        taken.pop()
    # a transpose is worth taking only when an op after it reads the new order
    while taken and packet(taken[-1].target) in EPILOGUE_LAYOUTS:
        taken.pop()
    return taken


def _ends_full(out: fx.Node, last: fx.Node) -> bool:
    """The region's result has as many elements as its output tile (no broadcast up or down)."""
    return out.meta["val"].numel() == last.meta["val"].numel()


def _score_partners(analysis: GraphAnalysis, chain: Chain, others: set) -> list:
    """Further contractions added to the scores, ``S = Q1·K1ᵀ + Q2·K2ᵀ + b`` (AlphaFold's
    invariant point attention once its squared distances are expanded): a ``bmm`` whose rows
    and columns are the producer's ``M`` and ``N``, read by the region only, through the view
    that restores its batch axes and elementwise ops (a scale, a bias) used by nothing else.
    Returns the nodes of each such path, the contraction last; the kernel computes it per
    key tile and the ops on the path in the score DAG."""
    dims = analysis.dims
    first_axes = [dims.dim_id(a) for a in dims.axes[chain.first][-2:]]
    inside = set(chain.nodes)

    def path_to_contraction(node, seen):
        if node.op != "call_function" or node in others or not all(u in seen for u in node.users):
            return None
        if packet(node.target) is aten.bmm:
            return [node] if [dims.dim_id(a) for a in dims.axes[node][-2:]] == first_axes else None
        if analysis.kinds.get(node) is not OpKind.ELEMENTWISE and packet(node.target) not in TRAILING_VIEWS:
            return None
        for arg in node.all_input_nodes:
            path = path_to_contraction(arg, seen | {node})
            if path:
                return [node, *path]
        return None

    partners = []
    for node in chain.inputs:
        path = path_to_contraction(node, inside)
        if path and len(path) >= 2 and packet(path[-2].target) in TRAILING_VIEWS:
            partners.append(path)
            inside.update(path)
    return partners


def _next_contractions(analysis: GraphAnalysis, first: fx.Node) -> tuple[set, set]:
    """The contractions that ``first`` reaches along a path with no contraction inside it, and the
    other nodes on such paths. A chain holds no contraction between its two, so only these can
    close one with ``first``; looking no further keeps chain discovery linear in the graph's size
    (a layer's producers would otherwise be paired with every later layer's contractions)."""
    found, seen, stack = set(), {first}, [first]
    while stack:
        for node in analysis.dataflow.successors(stack.pop()):
            if node in seen:
                continue
            seen.add(node)
            if analysis.kinds[node] is OpKind.CONTRACTION:
                found.add(node)
            else:
                stack.append(node)
    return found, seen - found - {first}


def _between(analysis: GraphAnalysis, second: fx.Node, inside: set) -> set:
    """The nodes of ``inside`` (those ``first`` reaches with no contraction on the way) from which
    ``second`` is reached: every node between ``first`` and ``second`` where no contraction lies
    between them (each such path stays inside)."""
    found, stack = set(), [second]
    while stack:
        for node in analysis.dataflow.predecessors(stack.pop()):
            if node in inside and node not in found:
                found.add(node)
                stack.append(node)
    return found


def _reaching(contractions: list, nexts: dict) -> dict:
    """For each contraction, the contractions it reaches along any path: the transitive closure of
    ``nexts`` (each one's next contractions), which every such path passes through in turn."""
    reach = {}
    for c in reversed(contractions):  # in graph order: a contraction's next ones come later
        reach[c] = set(nexts[c]).union(*(reach[n] for n in nexts[c]))
    return reach


def _contraction_between(first: fx.Node, second: fx.Node, nexts: dict, reach: dict) -> bool:
    """Does a contraction lie on some path from ``first`` to ``second``? Then the nodes between them
    hold an op no region holds."""
    return any(c is not second and second in reach[c] for c in nexts[first])


def find_chains(analysis: GraphAnalysis, near_misses: list | None = None) -> list[Chain]:
    """Every chain in the graph; for each producer, the nearest consumer that closes one.
    Producers whose batched consumers close no chain are appended to ``near_misses``."""
    order = analysis.order
    contractions = sorted(analysis.nodes_of_kind(OpKind.CONTRACTION), key=order.__getitem__)
    nexts, inside = {}, {}
    for c in contractions:
        nexts[c], inside[c] = _next_contractions(analysis, c)
    reach = _reaching(contractions, nexts)
    chains, missed = [], []
    for first in contractions:
        later = nexts[first]
        first_miss = None
        for second in (c for c in contractions if c in later):
            # where no contraction lies between them, the nodes between are found inside what
            # ``first`` reaches; else every node downstream of ``first`` would be searched (a
            # residual stream pairs each layer's projections with every later layer's). Such a
            # pair is no chain, and only batched pairs are reported as near misses.
            crossed = _contraction_between(first, second, nexts, reach)
            if crossed and not all(packet(c.target) is aten.bmm for c in (first, second)):
                continue
            between = None if crossed else _between(analysis, second, inside[first])
            chain = _chain_between(analysis, first, second, order, between)
            if isinstance(chain, NearMiss):
                first_miss = first_miss or chain
            elif chain is not None and not any(set(chain.nodes) & set(c.nodes) for c in chains):
                chains.append(chain)
                first_miss = None
                break
        if first_miss is not None:
            missed.append(first_miss)
    for chain in chains:
        others = {n for c in chains if c is not chain for n in c.nodes}
        chain.partners = _score_partners(analysis, chain, others)
        chain.nodes = sorted(set(chain.nodes).union(*chain.partners), key=order.__getitem__)
        chain.output_ops = _output_ops(analysis, chain.output, set(chain.nodes), others)
        if chain.output_ops:
            chain.output = chain.output_ops[-1]
        chain.nodes = sorted(set(chain.nodes) | set(chain.output_ops), key=order.__getitem__)
        chain.inputs = sorted({i for n in chain.nodes for i in n.all_input_nodes if i not in chain.nodes},
                              key=order.__getitem__)
    if near_misses is not None:
        taken = {n for c in chains for n in c.nodes}
        near_misses.extend(m for m in missed if not set(m.chain.nodes) & taken)
    return chains
