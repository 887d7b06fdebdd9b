"""Rewrite: replace each fused region's nodes by one call to ``fxflash::region``."""
from __future__ import annotations

import torch
import torch.fx as fx

from ..patterns.region import Region
from .emit import KernelPlan
from .op import RegisteredRegion, register


def reference_subgraph(output: fx.Node, inputs: list[fx.Node]) -> tuple[fx.GraphModule, list[fx.Node]]:
    """The ops that compute ``output`` from ``inputs``, as a GraphModule of its own. Values
    that are not tensors (sizes, symbolic or read off another tensor) become its extra
    trailing inputs; they are returned too."""
    needed, stack, extra = [], [output], []
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
    graph.output(env[output])
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


def replace_region(gm: fx.GraphModule, region: Region, plan: KernelPlan, kernel, node_map: dict) -> str:
    """Insert the custom-op call into ``gm`` (a copy of the analysed graph; ``node_map`` maps
    the analysed nodes to its nodes) and redirect the region output's users to it. The
    replaced nodes become dead and are removed by the caller's dead-code elimination."""
    reference, extra = reference_subgraph(region.output, plan.input_nodes)
    output = node_map[region.output]
    inputs = [node_map[n] for n in plan.input_nodes]
    sources = [node_map[n] for n in plan.input_nodes] + [n for n in gm.graph.nodes if n.op == "placeholder"]
    out_val = region.output.meta["val"]
    with gm.graph.inserting_before(output):
        frame = [_size_arg(gm, s, sources) for s in region.out_frame_shape]
        out_shape = [_size_arg(gm, s, sources) for s in out_val.shape]
        is_float = tuple(isinstance(n.meta.get("val"), (float, torch.SymFloat)) for n in extra)
        key = register(RegisteredRegion(plan, kernel, reference, out_val.dim(), is_float))
        sizes = frame + out_shape + [node_map[n] for n, f in zip(extra, is_float) if not f]
        scalars = [node_map[n] for n, f in zip(extra, is_float) if f]
        call = gm.graph.call_function(torch.ops.fxflash.region.default, (key, inputs, sizes, scalars))
    call.meta["val"] = region.output.meta["val"]
    output.replace_all_uses_with(call)
    return key
