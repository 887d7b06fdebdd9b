"""Rewrite: replace each fused region's nodes by one call to ``fxflash::region`` (in a copy of
the graph); for graphs that run as Python, call the regions directly (``with_direct_calls``)."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..patterns.region import FusionRefused, Region
from ..codegen.plan import KernelPlan
from .launch import FOLDED_VIEWS
from ..tile.backward import attention_output
from .op import RegisteredRegion, Subgraph, call_region, owned, register, registered


def copy_graph(gm: fx.GraphModule) -> tuple[fx.GraphModule, dict]:
    """A new GraphModule with a copy of ``gm``'s graph (and of its hold on the regions it calls:
    op.register), and the map from its nodes to the copy's."""
    graph = fx.Graph()
    node_map: dict = {}
    out = graph.graph_copy(gm.graph, node_map, return_output_node=True)
    graph.output(out[0] if isinstance(out, tuple) else out)
    copy = fx.GraphModule(gm, graph)
    if gm in owned:
        owned[copy] = list(owned[gm])
    return copy, node_map


_VIEW_NAMES = {op: name for name, op in FOLDED_VIEWS.items()}


def _plain(arg):
    """``arg`` as a hashable constant of ints, or None when it is not one (a symbolic size)."""
    if isinstance(arg, (list, tuple)):
        items = [_plain(a) for a in arg]
        return None if any(i is None for i in items) else tuple(items)
    return arg if isinstance(arg, int) and not isinstance(arg, bool) else None


def _view_chain(node: fx.Node) -> tuple[fx.Node, tuple]:
    """(base, chain): the view ops of launch.FOLDED_VIEWS that lead to ``node``, each used once and with
    constant arguments, innermost first, as ``(name, args)``; ``(node, ())`` when none."""
    chain = []
    while (node.op == "call_function" and node.target in _VIEW_NAMES and len(node.users) == 1
           and not node.kwargs and isinstance(node.args[0], fx.Node)):
        args = _plain(list(node.args[1:]))
        if args is None:
            break
        chain.append((_VIEW_NAMES[node.target], args))
        node = node.args[0]
    return node, tuple(reversed(chain))


# The views a grouped key program reads through (codegen/backward.group_axis): each keeps the
# order of its base's axes, so the base's gradient is the K/V heads' sums laid out as the base.
GROUP_VIEWS = ("unsqueeze", "expand")


def grouped_views(plan: KernelPlan, inputs: list) -> tuple[list, tuple | None]:
    """(the op's inputs, RegisteredRegion.views): where the fused backward has grouped key programs
    (GQA's K and V broadcast over query heads), K and V given before their ``unsqueeze`` and
    ``expand``, which the op replays, so that autograd asks the op for the K/V heads' gradients
    (summed in the kernel) rather than a gradient per query head that it would sum itself."""
    backward = plan.backward
    if backward is None or not backward.grouped:
        return inputs, None
    summarized = {i for i, _ in plan.summaries}
    given, views = list(inputs), [None] * len(inputs)
    for i in dict.fromkeys((backward.k[0], backward.v[0])):
        base, chain = _view_chain(inputs[i])
        if i in summarized or not chain or any(name not in GROUP_VIEWS for name, _ in chain):
            return inputs, None
        given[i], views[i] = base, chain
    return given, tuple(views)


def with_direct_calls(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` whose region calls go through ``call_region`` (for graphs that run as
    Python, never handed to a compiler). The view ops that only feed a region's input (GQA's
    ``unsqueeze`` and ``expand`` of k and v, the Evoformer's transposes) move into the call:
    a bound launch reads their bases and never runs them (inputs summarized per tile keep
    theirs: their summaries are taken along the view's axes)."""
    copy, _ = copy_graph(gm)
    for node in list(copy.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.fxflash.region.default:
            node.target = call_region
            summarized = {i for i, _ in registered(node.args[0]).plan.summaries}
            inputs, views = [], []
            for i, arg in enumerate(node.args[1]):
                base, chain = _view_chain(arg) if i not in summarized else (arg, ())
                inputs.append(base)
                views.append(chain)
            node.args = (node.args[0], inputs, *node.args[2:4], tuple(views) if any(views) else None)
    copy.graph.eliminate_dead_code()
    copy.recompile()
    return copy


def with_training_calls(gm: fx.GraphModule, copy: bool = True) -> fx.GraphModule:
    """A copy of ``gm`` (``gm`` itself with ``copy=False``) whose region calls go through
    ``training_call`` (as ``fxflash::region_call``), for a compiler that traces the graph with
    autograd (Inductor's AOTAutograd): where a call's backward is the fused one, the trace records
    the training forward, which stores the row statistics that backward reads."""
    if copy:
        gm, _ = copy_graph(gm)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.fxflash.region.default:
            node.target, node.args = torch.ops.fxflash.region_call.default, node.args[:4]
    gm.recompile()
    return gm


def reference_subgraph(outputs: list[fx.Node], inputs: list[fx.Node]) -> tuple[fx.GraphModule, list[fx.Node]]:
    """The ops that compute ``outputs`` from ``inputs``, as a GraphModule of its own that
    returns them as a tuple. Values that are not tensors (sizes, symbolic or read off another
    tensor) become its extra trailing inputs; they are returned too."""
    output = outputs[0]
    needed, stack, extra = [], list(outputs), []
    seen = set(inputs)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if not isinstance(node.meta.get("val"), torch.Tensor):
            extra.append(node)
            continue
        if node.op == "placeholder":
            raise ValueError(f"region output depends on graph input {node.name} outside its inputs")
        needed.append(node)
        stack.extend(node.all_input_nodes)
    order = {n: i for i, n in enumerate(output.graph.nodes)}
    graph = fx.Graph()
    env = {}
    extra.sort(key=order.__getitem__)
    for i, node in enumerate([*inputs, *extra]):
        env[node] = graph.placeholder(f"in{i}")
        env[node].meta = dict(node.meta)
    for node in sorted(needed, key=order.__getitem__):
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[o] for o in outputs))
    owner = output.graph.owning_module
    return fx.GraphModule(owner if owner is not None else torch.nn.Module(), graph), extra


class SymbolicSizeUnavailable(Exception):
    """A symbolic size of the region is not a size of any of its inputs."""


def _size_arg(gm: fx.GraphModule, size, sources: list):
    """A static size as an int; a symbolic one as a ``sym_size`` node on an input that has it
    (or the SymInt placeholder itself), so one graph serves every size (dynamic=True)."""
    if not isinstance(size, torch.SymInt):
        return int(size)
    expr = size.node.expr
    if expr.is_number:
        return int(expr)
    for node in sources:
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and val.node.expr == expr:
            return node
        if isinstance(val, torch.Tensor):
            for axis, s in enumerate(val.shape):
                if isinstance(s, torch.SymInt) and s.node.expr == expr:
                    sym = gm.graph.call_function(torch.ops.aten.sym_size.int, (node, axis))
                    sym.meta["val"] = s
                    return sym
    raise SymbolicSizeUnavailable(f"size {size} is not a size of the region's inputs")


def _insertion_point(gm: fx.GraphModule, results: list, region: set) -> fx.Node:
    """The first node that reads one of the region's results from outside the region."""
    for node in gm.graph.nodes:
        if node not in region and any(r in node.all_input_nodes for r in results):
            return node
    return results[0]


def placement(gm: fx.GraphModule, region: Region, plan: KernelPlan, node_map: dict) -> fx.Node:
    """Where the region's call goes in ``gm`` (a copy of the analysed graph; ``node_map`` maps the
    analysed nodes to its nodes): before the first node that reads one of its results from outside
    it. Raises FusionRefused where an input the kernel reads is computed only after that point; the
    pipeline asks before it compiles the kernel."""
    results = [region.output, *region.side_outputs]
    inputs = [node_map[n] for n in plan.input_nodes]
    inside = {node_map[n] for n in region.nodes}
    at = _insertion_point(gm, [node_map[r] for r in results], inside)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    # an input the program writes in place (functionalization's copy_ into it, at the graph's end)
    # is read before that write, as the replaced ops read it
    writes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.copy_.default
              and n.args[0] in inputs and order[n] < order[at]]
    if writes:
        at = writes[0]
    late = [n for n in inputs if order[n] >= order[at]]
    if late:
        raise FusionRefused("rewrite", late[0], "a value the region returns is used before one of its inputs "
                            "is computed; the region stays as written")
    return at


def _subgraph(value: fx.Node, lead: list, plan: KernelPlan, extra: list) -> Subgraph | None:
    """The ops that compute ``value`` from ``lead`` (nodes the caller passes first) and the op's
    inputs, as a Subgraph; None where they read what the op is not given."""
    try:
        module, own_extra = reference_subgraph([value], [*lead, *plan.input_nodes])
    except ValueError:
        return None
    if any(n not in extra for n in own_extra):
        return None
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"][len(lead):len(lead) + len(plan.input_nodes)]
    read = tuple(i for i, (p, n) in enumerate(zip(placeholders, plan.input_nodes))
                 if p.users and n.meta["val"].is_floating_point())
    return Subgraph(module, tuple(extra.index(n) for n in own_extra), read)


def _computed(plan: KernelPlan, extra: list) -> dict:
    """For each gradient tile of a value the kernels compute rather than load (slot ``None``), the
    ops that compute it from the op's inputs (ALiBi's bias from its slopes): their vjp takes the
    tile to the inputs' gradients."""
    if plan.backward is None:
        return {}
    nodes = {n.name: n for n in plan.input_nodes[0].graph.nodes}
    slots = [i for kernel in plan.backward.kernels for i in kernel.input_grads]
    found = {j: _subgraph(nodes[name], [], plan, extra)
             for j, (name, i) in enumerate(zip(plan.backward.slot_values, slots)) if i is None and name in nodes}
    return {j: sub for j, sub in found.items() if sub is not None and sub.inputs}


def _epilogue(region: Region, plan: KernelPlan, extra: list) -> Subgraph | None:
    """The region's ops after P·V as a graph of their own, for their backward (runtime/backward.py),
    where the region has them and a fused backward; None where they read another value of the
    region than O (then its backward is eager recomputation: ``fused_backward_applies``)."""
    if not region.output_ops or plan.backward is None:
        return None
    o = attention_output(region)
    ops, inside = set(region.output_ops), set(region.nodes) | {region.frame}
    stack, seen = [region.output], set()
    while stack:   # from the output back to O and values from outside the region
        node = stack.pop()
        if node is o or node in seen:
            continue
        seen.add(node)
        if node in inside and node not in ops:
            return None
        stack += node.all_input_nodes
    return _subgraph(region.output, [o], plan, extra)


def replace_region(gm: fx.GraphModule, region: Region, plan: KernelPlan, kernel, node_map: dict,
                   at: fx.Node) -> str:
    """Insert the custom-op call into ``gm`` before ``at`` (``placement``) and redirect the region
    output's users to it. The replaced nodes become dead and are removed by the caller's dead-code
    elimination."""
    results = [region.output, *region.side_outputs]
    reference, extra = reference_subgraph(results, plan.input_nodes)
    inputs = [node_map[n] for n in plan.input_nodes]
    sources = inputs + [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs, views = grouped_views(plan, inputs)
    inside = {node_map[n] for n in region.nodes}
    with gm.graph.inserting_before(at):
        frame = [_size_arg(gm, s, sources) for s in region.out_frame_shape]
        shapes = [_size_arg(gm, s, sources) for r in results for s in r.meta["val"].shape]
        is_float = tuple(isinstance(n.meta.get("val"), (float, torch.SymFloat)) for n in extra)
        ranks = tuple(r.meta["val"].dim() for r in results)
        key = register(RegisteredRegion(plan, kernel, reference, ranks, is_float,
                                        _epilogue(region, plan, extra), _computed(plan, extra), views), gm)
        # the reference's integers, then the kernel's (KernelPlan.sym_nodes: the launch reads the last ones)
        sizes = (frame + shapes + [node_map[n] for n, f in zip(extra, is_float) if not f]
                 + [node_map[n] for n in plan.sym_nodes])
        scalars = [node_map[n] for n, f in zip(extra, is_float) if f]
        call = gm.graph.call_function(torch.ops.fxflash.region.default, (key, inputs, sizes, scalars, False))
        call.meta["val"] = [r.meta["val"] for r in results]
        for i, result in enumerate(results):
            item = gm.graph.call_function(operator.getitem, (call, i))
            item.meta["val"] = result.meta["val"]
            node_map[result].replace_all_uses_with(item, delete_user_cb=lambda user: user not in inside)
    return key
