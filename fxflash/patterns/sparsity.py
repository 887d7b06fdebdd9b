"""Which masks let a key tile be skipped, proved from the region's algebra.

A key tile may be skipped when every score of it is ``-inf`` and everything the region
accumulates over N is scaled by ``E(x - m)`` with ``x`` those scores: then the tile leaves
the running maximum unchanged and adds exactly zero to every sum and to ``P·V``. The scores
are ``-inf`` on a tile when ``x = where(c, s, -inf)`` (or ``where(c, -inf, s)``, possibly
through float casts and further masks of that form) and the condition ``c`` — an index
expression, or one over integer tensors such as document ids — is false (true) everywhere
on the tile, which codegen decides per tile by interval arithmetic over the tile's index
ranges and per-tile min/max of the tensors read (:mod:`fxflash.codegen.intervals`).
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.fx as fx

from ..analysis import OpKind
from ..analysis.ops import constant_value, packet

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class TileMask:
    """``-inf`` where ``condition`` equals ``masked_when``; ``condition`` is an index expression."""

    condition: fx.Node
    masked_when: bool


def _is_neg_inf(arg) -> bool:
    value = constant_value(arg, None)
    return isinstance(value, float) and value == -math.inf


def _is_mask_expression(cond: fx.Node, kinds: dict, region_nodes: set) -> bool:
    """An index expression, or elementwise and layout ops over index expressions and integer
    or boolean tensors from outside the region (document ids): codegen summarizes those per
    tile, exactly (min/max of the values read), so a skipped tile is masked everywhere."""
    stack, seen = [cond], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in region_nodes:
            return False
        kind = kinds.get(node)
        if kind is OpKind.INDEX:
            continue
        val = node.meta.get("val")
        if node.op == "placeholder":
            if not isinstance(val, torch.Tensor) or val.dtype.is_floating_point:
                return False
            continue
        if kind not in (OpKind.ELEMENTWISE, OpKind.LAYOUT):
            return False
        stack.extend(node.all_input_nodes)
    return True


def skippable_masks(region, kinds: dict) -> list[TileMask]:
    """The masks that make a key tile skippable, or [] when skipping is not provable."""
    scales = {form.scale for _, _, form in region.terms}
    if len(scales) != 1 or None in scales:
        return []
    (scale,) = scales
    if any(r.node is not scale and r.scale is not scale for r in region.reductions):
        return []
    masks = []
    node = scale.args[0]
    while isinstance(node, fx.Node) and node.op == "call_function":
        p = packet(node.target)
        if p is aten._to_copy and node.kwargs.get("dtype") in (torch.float32, torch.float16, torch.bfloat16):
            node = node.args[0]
            continue
        if p is not aten.where:
            break
        cond, a, b = node.args
        if not (isinstance(cond, fx.Node) and _is_mask_expression(cond, kinds, set(region.nodes))):
            break
        if _is_neg_inf(b):
            masks.append(TileMask(cond, False))
            node = a
        elif _is_neg_inf(a):
            masks.append(TileMask(cond, True))
            node = b
        else:
            break
    return masks
