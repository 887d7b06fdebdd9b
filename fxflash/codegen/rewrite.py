"""Rewrite: replace each fused region's nodes by one call to ``fxflash::region``."""
from __future__ import annotations

import torch
import torch.fx as fx

from ..patterns.region import Region
from .emit import KernelPlan
from .op import RegisteredRegion, register


def reference_subgraph(output: fx.Node, inputs: list[fx.Node]) -> fx.GraphModule:
    """The ops that compute ``output`` from ``inputs``, as a GraphModule of its own."""
    needed, stack = [], [output]
    seen = set(inputs)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "placeholder":
            raise ValueError(f"region output depends on graph input {node.name} outside its inputs")
        needed.append(node)
        stack.extend(node.all_input_nodes)
    order = {n: i for i, n in enumerate(output.graph.nodes)}
    graph = fx.Graph()
    env = {}
    for i, node in enumerate(inputs):
        env[node] = graph.placeholder(f"in{i}")
        env[node].meta = dict(node.meta)
    for node in sorted(needed, key=order.__getitem__):
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(env[output])
    owner = output.graph.owning_module
    return fx.GraphModule(owner if owner is not None else torch.nn.Module(), graph)


def replace_region(gm: fx.GraphModule, region: Region, plan: KernelPlan, kernel, node_map: dict) -> str:
    """Insert the custom-op call into ``gm`` (a copy of the analysed graph; ``node_map`` maps
    the analysed nodes to its nodes) and redirect the region output's users to it. The
    replaced nodes become dead and are removed by the caller's dead-code elimination."""
    reference = reference_subgraph(region.output, plan.input_nodes)
    key = register(RegisteredRegion(plan, kernel, reference))
    frame = [int(s) for s in region.frame.meta["val"].shape]
    out_shape = [int(s) for s in region.output.meta["val"].shape]
    output = node_map[region.output]
    inputs = [node_map[n] for n in plan.input_nodes]
    with gm.graph.inserting_before(output):
        call = gm.graph.call_function(torch.ops.fxflash.region.default, (key, inputs, frame, out_shape))
    call.meta["val"] = region.output.meta["val"]
    output.replace_all_uses_with(call)
    return key
