"""``lower(region, kinds, printable) → TileProgram``: a fused region as the tile operations of its kernel.

The region (patterns/region.py) already holds every decision the kernel follows: its operands,
the form of each score value, the online reductions and what each rescales, the accumulators of
``P·V`` and the row factors deferred past them, the epilogue, the output ops and the tile-skip
predicates. Lowering lays those out in program order; it decides nothing new.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..analysis.ops import OpKind, packet
from ..patterns.region import PLAIN, Region
from .ir import (Accumulate, Dot, Finish, Index, Load, Map, RowReduce, SkipIf, Store, TileProgram)
from .outside import Outside


def lower(region: Region, kinds: dict, printable, name: str = "fxflash_region") -> TileProgram:
    """The tile program of ``region``; ``printable``: the ops the backend prints (a value from
    outside the region is computed in the kernel only from those, ``tile.outside``)."""
    return _Lowering(region, kinds, printable).program(name)


def _op_name(node: fx.Node) -> str:
    p = packet(node.target)
    return getattr(p, "__name__", str(p)).split(".")[-1]


def _read_along(node: fx.Node) -> str:
    """The Load tile of a tensor read into a computed value, by its last two axes (rows, keys):
    ``ids[:, :, None]`` is read as row values, ``ids[:, None, :]`` along the keys."""
    shape = tuple(node.meta["val"].shape)
    rows, keys = shape[-2:] if len(shape) >= 2 else (1, *shape) if shape else (1, 1)
    # a symbolic size is never 1 (Dynamo specializes sizes of one): compared without a guard
    varies = tuple(not (isinstance(s, int) and s == 1) for s in (rows, keys))
    return {(True, True): "scores", (True, False): "row values", (False, True): "keys"}.get(varies, "program")


def _size(s) -> str | int:
    return int(s) if isinstance(s, int) else str(s)


class _Lowering:
    def __init__(self, region: Region, kinds: dict, printable):
        self.r, self.kinds = region, kinds
        self.inside = set(region.nodes)
        self.alias: dict = {}   # nodes the program names otherwise (the P·V result: "o")
        self.bound: set = set()  # outside values already loaded or computed
        self.outside = Outside(kinds, region.output_ops, printable)

    def program(self, name: str) -> TileProgram:
        r = self.r
        prologue = [self._operand("q", r.q, "rows", r.D)]
        body = [self._operand("k", r.k, "keys", r.D, key_side=True), Dot(r.frame.name, "q", "k")]
        for i, partner in enumerate(r.partners, 1):
            prologue.append(self._operand(f"q{i}", partner.q, "rows", partner.d))
            body += [self._operand(f"k{i}", partner.k, "keys", partner.d, key_side=True),
                     Dot(partner.view.name, f"q{i}", f"k{i}")]
        self.bound |= {r.frame, *(p.view for p in r.partners)}
        online = {red.node: red for red in r.reductions}
        for node in r.dag:
            body += self._inputs(node, "scores")
            red = online.get(node)
            if red is not None:
                body.append(RowReduce(node.name, red.combine, self._name(red.source),
                                      red.scale.name if red.scale is not None else None))
            else:
                body.append(Map(node.name, _op_name(node), self._args(node), self._form(node)))
            self.bound.add(node)
        body.append(self._operand("v", r.v, "keys", r.Dv))
        terms = r.terms
        body += [Accumulate(f"acc{i}", node.name, "v", 1, form.scale.name if form.scale is not None else None)
                 for i, (_, node, form) in enumerate(terms)]
        epilogue = []
        order = {n: i for i, n in enumerate(r.frame.graph.nodes)}
        for node in sorted([*online, *r.epilogue], key=order.__getitem__):  # row values, in graph order
            if node in online:  # a running value final, its deferred row factors applied
                epilogue.append(Finish(node.name, node.name, tuple((f.op, f.row.name) for f in online[node].factors)))
                continue
            epilogue += self._inputs(node, "row values")
            epilogue.append(Map(node.name, _op_name(node), self._args(node), "row"))
            self.bound.add(node)
        finished = []
        for i, (_, node, form) in enumerate(terms):
            factors = tuple((f.op, f.row.name) for f in form.factors)
            if factors or len(terms) > 1:
                epilogue.append(Finish(f"o{i}", f"acc{i}", factors))
                finished.append(f"o{i}")
            else:
                finished.append(f"acc{i}")
        if len(terms) > 1:
            epilogue.append(Map("o", "sum", tuple(f"{'+' if sign > 0 else '-'}{o}"
                                                  for (sign, _, _), o in zip(terms, finished))))
            result = "o"
        else:
            result = finished[0]
        for node in self._trailing():
            self.alias[node] = result
        for op in r.output_ops:
            epilogue += self._inputs(op, "output")
            epilogue.append(Map(op.name, _op_name(op), self._args(op)))
            self.bound.add(op)
            result = op.name
        stores = [Store(result, r.output.name), *(Store(n.name, n.name, "row values") for n in r.side_outputs)]
        skips = [SkipIf(mask.condition.name, mask.masked_when) for mask in r.tile_masks]
        frame = tuple(_size(s) for s in r.frame.meta["val"].shape)
        streams = r.split.count if r.split is not None else 1
        return TileProgram(name, frame, tuple(prologue), tuple(skips), tuple(body), tuple(epilogue),
                           tuple(stores), streams)

    def _operand(self, name, operand, tile, cols, key_side=False) -> Load:
        # a key-side operand of the scores is Kᵀ [*, D, N]: ``transposed`` means its tensor holds K [*, N, D]
        transposed = not operand.transposed if key_side else operand.transposed
        return Load(name, operand.node.name, tile, cols, transposed, tuple(operand.scale), operand=True)

    def _trailing(self) -> list:
        """The P·V contraction and the views after it, up to the output ops: the output tile."""
        ops = set(self.r.output_ops)
        return [n for n in self.r.nodes if n not in self.bound and n not in ops]

    def _inputs(self, node: fx.Node, tile: str | None) -> list:
        """The ops that give the values from outside the region that ``node`` reads: index
        computations, the ops of a value the kernel computes from its own inputs
        (``tile.outside``), and loads of the others (along ``tile``, else as their shape reads)."""
        ops = []
        for a in node.all_input_nodes:
            if a in self.inside or a in self.bound or not isinstance(a.meta.get("val"), torch.Tensor):
                continue
            self.bound.add(a)
            if self.kinds.get(a) is OpKind.INDEX:
                ops.append(Index(a.name, _op_name(a), self._args(a)))
            elif self.outside.computed(a):
                ops += self._inputs(a, None)
                ops.append(Map(a.name, _op_name(a), self._args(a)))
            else:
                ops.append(Load(a.name, a.name, tile or _read_along(a)))
        return ops

    def _name(self, a) -> str:
        return self.alias.get(a, a.name)

    def _args(self, node: fx.Node) -> tuple:
        return tuple(self._arg(a) for a in node.args)

    def _arg(self, a):
        if isinstance(a, fx.Node):
            return self._name(a)
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(str(self._arg(x)) for x in a) + "]"
        if isinstance(a, (bool, int, float)) or a is None:
            return a
        return str(a).removeprefix("torch.")

    def _form(self, node: fx.Node) -> str:
        form = self.r.forms.get(node, PLAIN)
        if form.kind == "scaled" and form.scale is not None:
            return f"against the running {form.scale.name}"
        if form.kind == "deferred":
            return "row factors deferred: " + ", ".join(f"{f.op} {f.row.name}" for f in form.factors)
        if form.kind == "sum":
            return "a sum of accumulated terms"
        if form.kind == "row":  # in the loop: read with the running row values
            return "with the running row values"
        return form.kind
