"""Calls of ``scaled_dot_product_attention`` in Dynamo's graph, read as the chain they compute.

PyTorch's fused attention is one opaque op to the ATen trace. Before that trace, each call that
``config.sdpa_calls`` names (by default those with a mask) whose arguments are plain (no
dropout; literal ``is_causal``, ``scale`` and ``enable_gqa``; no operand that requires grad) is
replaced by :func:`math_form`, the attention it computes written in ops the chain rules read;
the backend puts back the calls whose math form did not fuse (``expand(gm, kept)``), so that a
refused call still runs PyTorch's kernel, never its math form.

The ATen nodes traced from a call carry its Dynamo node's name in ``meta["source_fn_stack"]``
(the graph is traced with node metadata preserved), which is how ``unfused`` finds them.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from ..config import config

SDPA = torch._C._nn.scaled_dot_product_attention
PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
CONTRACTIONS = (torch.ops.aten.bmm.default, torch.ops.aten.mm.default)
SETTINGS = ("none", "masked", "all")  # config.sdpa_calls


def math_form(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
    """``scaled_dot_product_attention`` without dropout, as PyTorch's math backend defines it:
    a causal mask aligned top-left, a boolean mask keeps where True, a float mask is added, and a
    row that every key masks gives 0 (``_safe_softmax``), not NaN. The scores and softmax of 16-bit
    operands are in fp32, P is rounded to V's dtype for ``P·V``, as fused kernels do.

    The fully masked row: its maximum is -inf, replaced by 0, so its exponentials are all 0; the
    sum is 0 only for such a row (any other row holds exp(0) = 1), and dividing by 1 there gives 0.
    """
    if enable_gqa:
        query_heads, key_heads = query.size(-3), key.size(-3)
        key = key.repeat_interleave(query_heads // key_heads, -3)
        value = value.repeat_interleave(query_heads // key_heads, -3)
    if scale is None:
        scale = 1.0 / math.sqrt(query.size(-1))
    scores = query @ key.transpose(-2, -1)
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()
    scores = scores * scale
    if is_causal:
        keep = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        scores = scores + attn_mask.to(scores.dtype)
    row_max = scores.amax(-1, keepdim=True)
    row_max = torch.where(row_max == float("-inf"), 0.0, row_max)
    weights = torch.exp(scores - row_max)
    row_sum = weights.sum(-1, keepdim=True)
    probs = weights / torch.where(row_sum == 0, 1.0, row_sum)
    return probs.to(value.dtype) @ value


def calls(gm: fx.GraphModule) -> list:
    """The graph's ``scaled_dot_product_attention`` nodes, in order."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is SDPA]


def _arguments(node: fx.Node) -> dict:
    bound = dict(zip(PARAMETERS, node.args))
    bound.update(node.kwargs)
    return {**DEFAULTS, **bound}


def _example(value):
    return value.meta.get("example_value", value.meta.get("val")) if isinstance(value, fx.Node) else value


def why_not(node: fx.Node) -> str:
    """Why this call keeps PyTorch's kernel whatever fuses, or "" when its math form may be tried."""
    arguments = _arguments(node)
    if arguments["dropout_p"] != 0.0 or isinstance(arguments["dropout_p"], fx.Node):
        return "dropout is not fused (dropout_p is not 0)"
    for name in ("is_causal", "enable_gqa"):
        if not isinstance(arguments[name], bool):
            return f"{name} is not a constant"
    if arguments["scale"] is not None and not isinstance(arguments["scale"], (int, float)):
        return "scale is not a constant"
    if config.sdpa_calls not in SETTINGS:
        return f"config.sdpa_calls is {config.sdpa_calls!r}, not one of {SETTINGS}"
    if config.sdpa_calls == "none":
        return "config.sdpa_calls is 'none'"
    if arguments["attn_mask"] is None and config.sdpa_calls != "all":
        return "no attn_mask: PyTorch's kernel is as fast or faster there (config.sdpa_calls)"
    if arguments["is_causal"] and arguments["attn_mask"] is not None:
        return "attn_mask with is_causal (PyTorch's own error)"
    query, key, value = (_example(arguments[name]) for name in ("query", "key", "value"))
    mask = _example(arguments["attn_mask"])
    tensors = [query, key, value] + ([mask] if mask is not None else [])
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return "its operands' shapes are unknown"
    if any(t.is_nested for t in tensors) or not all(t.is_floating_point() for t in (query, key, value)):
        return "nested or non-floating operands"
    if query.dim() < 2 or key.dim() != query.dim() or value.dim() != query.dim():
        return "operands of different ranks"
    if any(t.requires_grad for t in tensors):
        return ("its operands require grad: PyTorch's kernel has a fused backward, a fused region's backward "
                "is recomputed eagerly")
    if arguments["scale"] is None and not isinstance(query.shape[-1], int):
        return "the default scale of a symbolic head dim"
    return ""


def expand(gm: fx.GraphModule, kept: dict) -> tuple[fx.GraphModule, list]:
    """A copy of ``gm`` with each SDPA call not in ``kept`` (name → why) and with no reason to stay
    (``why_not``) replaced by :func:`math_form`, with its default scale made explicit; the names of
    the replaced calls. ``kept`` gains the calls that must stay, with their reasons."""
    expanded = []
    for node in calls(gm):
        name = origin(node)
        why = kept.get(name) or why_not(node) or ("" if name else "its node has no source name")
        if why:
            kept[name or node.name] = why
        else:
            expanded.append(name)
    if not expanded:
        return gm, []
    graph = fx.Graph()
    env: dict = {}
    for node in gm.graph.nodes:
        new = graph.node_copy(node, lambda n: env[n])
        if node.target is SDPA and origin(node) in expanded:
            arguments = _arguments(node)
            scale = arguments["scale"]
            if scale is None:
                scale = 1.0 / math.sqrt(_example(arguments["query"]).shape[-1])
            call = {k: (env[v] if isinstance(v, fx.Node) else v) for k, v in arguments.items()}
            new.target, new.args = math_form, ()
            new.kwargs = {**call, "scale": float(scale)}
        env[node] = new
    return fx.GraphModule(gm, graph), expanded


def origin(node: fx.Node) -> str:
    """The name Dynamo recorded for the torch call a node is (or was traced from), "" if none."""
    stack = node.meta.get("source_fn_stack")
    return stack[-1][0] if stack else ""


def unfused(aten_gm: fx.GraphModule, regions: list, expanded: list) -> dict:
    """Expanded calls whose contractions are not all inside fused regions: name → the verdict of
    the candidate region that held them, or why none did."""
    fused = {name for r in regions if r.fused for name in r.nodes}
    missing: dict = {}
    found = set()
    for node in aten_gm.graph.nodes:
        name = origin(node)
        if name in expanded and node.target in CONTRACTIONS:
            found.add(name)
            if node.name not in fused:
                verdict = next((r.verdict() for r in regions if not r.fused and node.name in r.nodes),
                               "its math form formed no candidate region")
                missing.setdefault(name, f"its math form did not fuse: {verdict}")
    for name in expanded:
        if name not in found:  # never count a call fused without finding its ops
            missing.setdefault(name, "its math form's ops were not found in the traced graph")
    return missing


def mark_origins(aten_gm: fx.GraphModule, regions: list, expanded: list) -> None:
    """Set ``origin`` of each fused region read from an expanded call to that call's name."""
    origins = {n.name: origin(n) for n in aten_gm.graph.nodes if origin(n) in expanded}
    for region in regions:
        names = {origins[n] for n in region.nodes if n in origins}
        if region.fused and names:
            region.origin = ", ".join(sorted(names))


__all__ = ["SDPA", "calls", "expand", "mark_origins", "math_form", "origin", "unfused", "why_not"]
