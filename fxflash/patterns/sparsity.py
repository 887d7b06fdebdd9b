"""Which masks let a key tile be skipped, proved from the region's algebra.

A key tile may be skipped when every score of it is masked and everything the region
accumulates over N is scaled by ``E(x - m)`` with ``x`` those scores: then the tile leaves
the running maximum unchanged and adds exactly zero to every sum and to ``P·V``. The scores
are masked on a tile when ``x = where(c, s, fill)`` (or ``where(c, fill, s)``), or ``x = s +
where(c, 0, fill)`` (or ``s`` plus a sum of such terms whose fills are ``-inf``), possibly through
float casts and further masks of those forms, and the
condition ``c`` — an index expression, or one over integer tensors such as document ids — is
false (true) everywhere on the tile, which codegen decides per tile by interval arithmetic over
the tile's index ranges and per-tile min/max of the tensors read
(:mod:`fxflash.codegen.intervals`).

A ``-inf`` fill is masked outright. A finite fill ``F`` (transformers' ``finfo.min``) is not: a row
that every key masks averages all of them in eager. Skipping is exact for a row whose maximum
exceeds ``-T`` (``T = |F| / 4``, the mask's ``threshold``) while the skipped scores stay below
``-3T``: then ``exp(x − m) < exp(−2T)`` is exactly 0. Codegen flags the other rows (and, for an
additive mask, every row of a program where the bound on ``s`` reaches ``T``) for the repair
kernel, which computes them over every key as eager does, except a row every key masks where the
bound proves each of its scores is ``F``: that row is V's average (``exact_below``). An additive
mask's skipped scores are ``s + F``: its ``addend`` is an upper bound on ``s`` in terms of the
score contraction's largest magnitude (codegen: ``D · max|q| · max|k|`` per program), checked
against ``addend_below`` (for ``-inf``, so that no ``s`` is ``+inf``). A fill is read as the
``where`` holds it and must reach the maximum unchanged through the casts after it.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.fx as fx

from ..analysis import OpKind
from ..analysis.ops import constant_value, packet

aten = torch.ops.aten

# The smallest |fill| a finite mask may have: its threshold |F| / 4 ≥ 64 leaves skipped scores at
# least 2·64 below a row's maximum, where exp is 0 in fp32 (below e^-104).
FINITE_FILL_MIN = 256.0


@dataclasses.dataclass(frozen=True)
class Affine:
    """``dot · S + const``, where ``S`` bounds the score contraction's magnitude on a tile."""

    dot: float
    const: float

    def __add__(self, other: "Affine") -> "Affine":
        return Affine(self.dot + other.dot, self.const + other.const)

    def scaled(self, c: float) -> "Affine":
        return Affine(self.dot * c, self.const * c)

    def join(self, other: "Affine") -> "Affine":
        """A bound on either (sound for ``S ≥ 0``)."""
        return Affine(max(self.dot, other.dot), max(self.const, other.const))


@dataclasses.dataclass(frozen=True)
class TileMask:
    """``fill`` where ``condition`` equals ``masked_when``; ``condition`` is an index expression.
    ``addend``: for an additive mask, an upper bound on what it is added to, which codegen checks
    against ``addend_below`` (the threshold of a finite fill; for ``-inf``, a quarter of the largest
    value of the dtypes the scores are held in, so that no score is ``+inf``, whose sum with ``-inf``
    is NaN in eager).
    ``scores``: a bound on the magnitude of the scores beneath the masks (None: no rule), and
    ``exact_below``: for a finite fill, the magnitude of those scores below which every masked
    score is ``F`` exactly (in fp32 and in the mask's dtype), so that a row every key masks is the
    plain average over all keys."""

    condition: fx.Node
    masked_when: bool
    fill: float = -math.inf
    addend: Affine | None = None
    addend_below: float | None = None  # an additive mask skips only while the bound on its addend is below this
    scores: Affine | None = None
    exact_below: float | None = None

    @property
    def threshold(self) -> float | None:
        """``T`` of a finite fill (module docstring); None for ``-inf``."""
        return abs(self.fill) / 4 if math.isfinite(self.fill) else None

    @property
    def checked(self) -> bool:
        """Does skipping by this mask need the kernels' row checks at run time (a finite fill: rows
        whose maximum is not above ``-T`` are computed again by the repair kernel)?"""
        return self.threshold is not None

    @property
    def bounded(self) -> bool:
        """An additive mask: it skips tiles only while the launch's bound on the scores it is added
        to stays below ``addend_below`` (no ``+inf`` beside ``-inf``, whose sum is eager's NaN; for a
        finite fill, skipped scores below ``-3T``); the tile range checks it (emit's
        ``bounded_skips``), and where it fails every tile is visited, masked."""
        return self.addend is not None


def _exact_below(fill: float, dtype: torch.dtype, additive: bool) -> float:
    """The score magnitude below which ``fill`` masks exactly (TileMask.exact_below): no live score
    reaches ``−T`` (so a row whose maximum is below it saw none), and an additive mask's ``s + F``
    rounds to ``F`` (a quarter of its spacing in fp32 and in ``dtype``)."""
    below = abs(fill) / 4
    if additive:
        top = 2.0 ** math.floor(math.log2(abs(fill)))
        below = min(below, *(top * torch.finfo(d).eps / 4 for d in (torch.float32, dtype)))
    return below


def _fill(arg, where: fx.Node) -> float | None:
    """The fill a mask may have, as the ``where`` that selects it holds it (fp32's ``finfo.min`` is
    ``-inf`` in bf16): ``-inf``, or a finite constant at most ``-FINITE_FILL_MIN``."""
    value = constant_value(arg, None)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    value = torch.tensor(float(value), dtype=where.meta["val"].dtype).item()
    return value if value == -math.inf or -math.inf < value <= -FINITE_FILL_MIN else None


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


def _is_float_cast(node) -> bool:
    return (isinstance(node, fx.Node) and node.op == "call_function" and packet(node.target) is aten._to_copy
            and node.kwargs.get("dtype") in (torch.float32, torch.float16, torch.bfloat16))


# Ops that pass a score bound through unchanged (views, copies)
_SAME = {aten.view, aten._unsafe_view, aten.reshape, aten.expand, aten.clone, aten.alias, aten.unsqueeze,
         aten.squeeze, aten.contiguous}
_UNIT = {aten.tanh, aten.sigmoid}  # |f(x)| ≤ 1


def score_bound(node, frame: fx.Node, limit: float) -> tuple[Affine, Affine] | None:
    """(upper bound, magnitude bound) of ``node``, a function of the scores ``frame``, as Affine
    forms in ``S`` (a bound on ``|frame|``); None where an op has no rule. A float cast to a
    dtype whose largest value is below ``limit`` has none (it could overflow where ``S`` is
    still below the threshold the kernel checks)."""
    if node is frame:
        return Affine(1.0, 0.0), Affine(1.0, 0.0)
    value = constant_value(node, None)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return Affine(0.0, float(value)), Affine(0.0, abs(float(value)))
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return None
    p, args = packet(node.target), node.args
    if p in _SAME or _is_float_cast(node):
        if _is_float_cast(node) and torch.finfo(node.kwargs["dtype"]).max < limit:
            return None
        return score_bound(args[0], frame, limit)
    if p in _UNIT:
        return Affine(0.0, 1.0), Affine(0.0, 1.0)
    if p is aten.neg:
        inner = score_bound(args[0], frame, limit)
        return inner and (inner[1], inner[1])
    if p in (aten.mul, aten.div):
        x, c = args[0], constant_value(args[1], None)
        if p is aten.mul and c is None:
            x, c = args[1], constant_value(args[0], None)
        if not isinstance(c, (int, float)) or isinstance(c, bool) or not math.isfinite(c) or (p is aten.div and c == 0):
            return None
        inner = score_bound(x, frame, limit)
        if inner is None:
            return None
        f = c if p is aten.mul else 1.0 / c
        hi, mag = inner
        return (hi.scaled(f) if f >= 0 else mag.scaled(-f)), mag.scaled(abs(f))
    if p in (aten.add, aten.sub) and len(args) == 2 and "alpha" not in node.kwargs:
        a, b = (score_bound(x, frame, limit) for x in args)
        if a is None or b is None:
            return None
        return (a[0] + (b[0] if p is aten.add else b[1])), a[1] + b[1]
    if p is aten.where:
        a, b = (score_bound(x, frame, limit) for x in args[1:])
        if a is None or b is None:
            return None
        return a[0].join(b[0]), a[1].join(b[1])
    return None


def _masks_of(node, kinds: dict, region_nodes: set) -> list | None:
    """``[(condition, masked_when, fill)]`` of an additive mask's values: ``where(c, 0, fill)`` /
    ``where(c, fill, 0)`` through float casts, or a sum of such masks whose fills are all
    ``-inf`` (``-inf`` wherever one of them masks, as ``full(-inf).triu(1) + full(-inf).tril(-w)``
    spells a window: a tile any of them masks everywhere is masked everywhere); None otherwise."""
    while _is_float_cast(node):
        node = node.args[0]
    if not (isinstance(node, fx.Node) and node.op == "call_function"):
        return None
    if packet(node.target) is aten.add and len(node.args) == 2 and "alpha" not in node.kwargs:
        parts = [_masks_of(a, kinds, region_nodes) for a in node.args]
        if any(p is None for p in parts) or any(fill != -math.inf for p in parts for _, _, fill in p):
            return None
        return parts[0] + parts[1]
    if packet(node.target) is not aten.where:
        return None
    cond, a, b = node.args
    if not (isinstance(cond, fx.Node) and _is_mask_expression(cond, kinds, region_nodes)):
        return None
    if constant_value(a, None) == 0 and _fill(b, node) is not None:
        return [(cond, False, _fill(b, node))]
    if constant_value(b, None) == 0 and _fill(a, node) is not None:
        return [(cond, True, _fill(a, node))]
    return None


def skippable_masks(region, kinds: dict) -> list[TileMask]:
    """The masks that make a key tile skippable, or [] when skipping is not provable."""
    scales = {form.scale for _, _, form in region.terms}
    if len(scales) != 1 or None in scales:
        return []
    (scale,) = scales
    if any(r.node is not scale and r.scale is not scale for r in region.reductions):
        return []
    masks, nodes, casts = [], set(region.nodes), []  # casts: the float casts above the node reached

    def kept_through_casts(fill: float) -> bool:
        """Does ``fill`` reach the maximum unchanged through the casts above its mask? (fp32's
        ``finfo.min`` cast to bf16 is ``-inf``; such a mask is left alone.)"""
        value = fill
        for dtype in reversed(casts):
            value = torch.tensor(value, dtype=dtype).item()
        return value == fill

    node = scale.args[0]
    while isinstance(node, fx.Node) and node.op == "call_function":
        p = packet(node.target)
        if _is_float_cast(node):
            casts.append(node.kwargs["dtype"])
            node = node.args[0]
            continue
        if p is aten.add and len(node.args) == 2 and "alpha" not in node.kwargs:
            # s + where(c, 0, F): skipped scores s + F, bounded through s's ops (for F = -inf, the
            # bound rules out a +inf score, whose sum with -inf is NaN in eager)
            for s, m in (node.args, reversed(node.args)):
                found = _masks_of(m, kinds, nodes)
                if found and not region.partners and all(kept_through_casts(fill) for _, _, fill in found):
                    dtype, fill = node.meta["val"].dtype, found[0][2]   # several: all -inf
                    if math.isfinite(fill):
                        below, exact = abs(fill) / 4, _exact_below(fill, dtype, True)
                    else:
                        below = min(torch.finfo(d).max for d in (dtype, region.frame.meta["val"].dtype)) / 4
                        exact = None
                    bound = score_bound(s, region.frame, 4 * below)
                    if bound is not None:
                        masks += [TileMask(*mask, addend=bound[0], addend_below=below, exact_below=exact)
                                  for mask in found]
                        node = s
                        break
            else:
                break
            continue
        if p is not aten.where:
            break
        cond, a, b = node.args
        if not (isinstance(cond, fx.Node) and _is_mask_expression(cond, kinds, nodes)):
            break
        fill, kept, masked_when = (_fill(b, node), a, False)
        if fill is None:
            fill, kept, masked_when = _fill(a, node), b, True
        if fill is None or not kept_through_casts(fill):
            break
        masks.append(TileMask(cond, masked_when, fill,
                              exact_below=_exact_below(fill, node.meta["val"].dtype, False)
                              if math.isfinite(fill) else None))
        node = kept
    if not masks:
        return []
    bound = score_bound(node, region.frame, max(abs(m.fill) for m in masks))
    return [dataclasses.replace(m, scores=bound and bound[1]) for m in masks]
