"""Interval arithmetic over index expressions, printed as scalar Triton code.

For a tile of rows ``[m_lo, m_hi]`` and keys ``[n_lo, n_hi]`` (batch indices exact), an
integer index expression gets an interval ``[lo, hi]`` containing every value it takes on the
tile, and a boolean one a pair ``(must, may)``: ``must`` — true at every element, ``may`` —
true at some element. Both are sound over-approximations, so a tile is declared empty only if
every element of it is masked.

The key range ``[n_lo, n_hi]`` may be vectors (one entry per key tile: codegen classifies a
chunk of tiles at once); every rule is elementwise, so the same code serves both.

An integer tensor read along one tile axis (document ids ``ids[n]``) gets the exact interval
``[min, max]`` of its values over the tile's index range: for the query tile, loaded and
reduced in the kernel; for key tiles, a per-tile summary the launch computes once for all
programs (``launch.min_max_per_tile``; one load per chunk of key tiles), so
``ids[:, None] == ids[None, :]`` is false on a whole tile when the query tile's ids and the key
tile's ids do not overlap. A boolean tensor is summarized the same way as 0/1 (a key-padding
mask ``[B, 1, 1, N]``: a key tile where it is False throughout is empty), and an input read at
batch indices only has its exact value (per-batch lengths: ``j < lengths[b]``).

An operand of ``&`` or ``|`` without an interval (a product of two indices, a mask read along
both tile axes, a float comparison) is *unknown*: ``(must, may) = (False, True)``, true or
false anywhere, which keeps every rule sound. ``a & unknown`` still empties the tiles ``a``
empties and ``a | unknown`` still fills the tiles ``a`` fills; such parts are listed in
``IntervalPrinter.unknown`` for explain().
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.fx as fx

from ..analysis import OpKind
from ..analysis.ops import CONSTANT_FILLS, LAYOUTS, constant_value, packet
from .printers import Unprintable, floor_div_code, positive_int_divisor

aten = torch.ops.aten


class NoInterval(Exception):
    """The expression has an op without an interval rule."""


@dataclasses.dataclass
class Interval:
    lo: str = ""      # integers: bounds
    hi: str = ""
    must: str = ""    # booleans
    may: str = ""
    varies: bool = False  # its code reads the key tiles' range (IntervalPrinter.varying)

    @property
    def is_bool(self) -> bool:
        return bool(self.must)


def ip_bool(value: bool) -> str:
    """A scalar boolean tensor (``~`` of a Python bool would be an integer)."""
    return "(m_lo == m_lo)" if value else "(m_lo != m_lo)"


def _int(lo, hi):
    return Interval(lo=lo, hi=hi)


def _bool(must, may):
    return Interval(must=must, may=may)


class IntervalPrinter:
    """Prints the interval of an index expression at tile index expressions ``idx``."""

    def __init__(self, printer, index_ranges: dict, key_tiles: str, key_index: str):
        self.p = printer
        self.ranges = dict(index_ranges)  # index string → (lo, hi) code
        self.key_tiles = key_tiles        # the key tiles' indices (a vector), for their summaries
        self.key_index = key_index        # the index whose range is the key tiles' (emit's COL)
        self.lines: list[str] = []
        self.varying: set[str] = set()    # lines that read the key tiles' range: per chunk of tiles
        self.count = 0
        self.unknown: list[str] = []      # "node (why)": junction operands taken as unknown
        self._reads_keys = False          # does the node being printed read the key tiles' range?

    def bind(self, code: str) -> str:
        """A line ``iv<k> = code`` of the node being printed; it varies with the key tiles where
        that node's interval does (decided from the operands and indices, not the code)."""
        self.count += 1
        name = f"iv{self.count}"
        self.lines.append(f"{name} = {code}")
        if self._reads_keys:
            self.varying.add(self.lines[-1])
        return name

    def split_lines(self) -> tuple[list, list]:
        """(lines computed once per row tile, lines computed per chunk of key tiles), in order."""
        return ([line for line in self.lines if line not in self.varying],
                [line for line in self.lines if line in self.varying])

    def range_varies(self, e: str | None) -> bool:
        """Does index ``e``'s range follow the key tiles (the key index, or an affine map of it)?"""
        if e is None or e in self.ranges:
            return e == self.key_index
        affine = self.p.affine_idx.get(e)
        return affine is not None and self.range_varies(affine[1])

    def _printing(self, reads_keys: bool) -> bool:
        self._reads_keys = reads_keys
        return reads_keys

    def index_range(self, e: str | None) -> tuple[str, str]:
        if e is None:
            return "0", "0"
        if e in self.ranges:
            return self.ranges[e]
        if e.lstrip("-").isdigit():
            return e, e
        affine = self.p.affine_idx.get(e)
        if affine is None:
            raise NoInterval(f"index {e}")
        start, inner, step = affine
        lo, hi = self.index_range(inner)
        a, b = f"({start} + ({lo}) * {step})", f"({start} + ({hi}) * {step})"
        return (a, b) if step >= 0 else (b, a)

    def of(self, node, idx: tuple) -> Interval:
        L = self.p.L
        if not isinstance(node, fx.Node):
            if isinstance(node, bool):
                return _bool(*(ip_bool(node),) * 2)
            if isinstance(node, int):
                return _int(str(node), str(node))
            raise NoInterval(f"literal {node!r}")
        value = node.meta.get("val")
        if isinstance(value, torch.SymInt):  # a symbolic size: the kernel's run-time parameter
            code = self.p.sym_int(node).code
            return _int(code, code)
        if self.p.kinds.get(node) is not OpKind.INDEX:
            return self.of_tensor(node, idx)
        p = packet(node.target)
        dtype = node.meta["val"].dtype
        if p is aten.arange:
            args = list(node.args)
            start, _, step = (0, args[0], 1) if len(args) == 1 else (args + [1])[:3]
            if not isinstance(start, int) or not isinstance(step, int):
                raise NoInterval("arange with symbolic start or step")
            lo, hi = self.index_range(idx[0] if idx else None)
            a, b = f"({start} + ({lo}) * {step})", f"({start} + ({hi}) * {step})"
            iv = _int(a, b) if step >= 0 else _int(b, a)
            iv.varies = self.range_varies(idx[0] if idx else None)
            return iv
        if p in CONSTANT_FILLS:
            value = constant_value(node)
            if dtype is torch.bool:
                return _bool(*(ip_bool(bool(value)),) * 2)
            if dtype.is_floating_point:
                # a finite float is its own interval (an infinite one would make inf − inf = NaN
                # bounds, whose comparisons are all false: no rule could trust them)
                if not math.isfinite(float(value)):
                    raise NoInterval("an infinite constant")
                return _int(repr(float(value)), repr(float(value)))
            return _int(str(int(value)), str(int(value)))
        if p in (aten.tril, aten.triu):
            x = self.of(node.args[0], idx)
            varies = self._printing(x.varies or self.range_varies(idx[-2]) or self.range_varies(idx[-1]))
            diag = node.args[1] if len(node.args) > 1 else 0
            if isinstance(diag, fx.Node):   # a symbolic offset (dynamic=True): the kernel's run-time size
                diag = self.of(diag, ()).lo
            rlo, rhi = self.index_range(idx[-2])
            clo, chi = self.index_range(idx[-1])
            if p is aten.tril:   # keep where col - row <= diag
                must, may = f"(({chi}) - ({rlo}) <= {diag})", f"(({clo}) - ({rhi}) <= {diag})"
            else:                # keep where col - row >= diag
                must, may = f"(({clo}) - ({rhi}) >= {diag})", f"(({chi}) - ({rlo}) >= {diag})"
            if x.is_bool:
                return Interval(must=self.bind(f"{x.must} & {must}"), may=self.bind(f"{x.may} & {may}"),
                                varies=varies)
            # numbers: x where kept, 0 elsewhere (torch.triu(torch.ones(L, L), 1))
            kept_all, kept_any = self.bind(must), self.bind(may)
            return Interval(
                lo=self.bind(f"{L.where}({kept_all}, {x.lo}, {L.where}({kept_any}, {L.minimum}({x.lo}, 0), 0))"),
                hi=self.bind(f"{L.where}({kept_all}, {x.hi}, {L.where}({kept_any}, {L.maximum}({x.hi}, 0), 0))"),
                varies=varies)
        rule = RULES.get(p)
        if rule is not None:
            return self._ruled(rule, node, self.operands(node, idx))
        if p in LAYOUTS:
            return self.of(node.args[0], self.p.layout_source_idx(node, idx))
        raise NoInterval(f"{node.name}: no interval rule for {node.target}")

    def _ruled(self, rule, node: fx.Node, operands: list) -> Interval:
        """``rule``'s interval of ``node``: it reads the key tiles where an operand does (unless
        its bounds are constants: READS_NO_OPERAND)."""
        varies = self._printing(rule not in READS_NO_OPERAND and any(x.varies for x in operands))
        iv = rule(self, node, operands)
        if iv.varies != varies:  # a rule may return an operand itself (a copy): never changed in place
            iv = dataclasses.replace(iv, varies=varies)
        return iv

    def operands(self, node: fx.Node, idx: tuple) -> list[Interval]:
        """The intervals of ``node``'s arguments. Boolean operands of ``&`` and ``|`` without
        an interval are unknown (see the module's doc), unless every operand is."""
        junction = packet(node.target) in JUNCTIONS and node.meta["val"].dtype is torch.bool
        out, why = [], []
        for a in node.args:
            try:
                out.append(self.of(a, self.p.idx_of(a, idx) if _is_tensor(a) else idx))
            except (NoInterval, Unprintable) as exc:
                if not junction:
                    raise
                why.append(f"{getattr(a, 'name', a)} ({exc})")
                out.append(_bool(ip_bool(False), ip_bool(True)))
        if why and len(why) == len(out):
            raise NoInterval("; ".join(why))
        self.unknown += why
        return out

    def of_tensor(self, node: fx.Node, idx: tuple) -> Interval:
        """A tensor the region reads (not an index expression): an integer input gets the
        min/max of its values over the tile range of the one tile axis it is read along (its
        exact value if read at batch indices only), a boolean one ``(must, may)`` from the same
        min/max; elementwise and layout ops on such inputs follow the same rules as index ones."""
        kind = self.p.kinds.get(node)
        dtype = node.meta["val"].dtype
        if kind in (OpKind.ELEMENTWISE, OpKind.LAYOUT) and node.op == "call_function":
            rule = RULES.get(packet(node.target))
            if rule is not None:
                return self._ruled(rule, node, self.operands(node, idx))
            if kind is OpKind.LAYOUT:
                return self.of(node.args[0], self.p.layout_source_idx(node, idx))
            raise NoInterval(f"{node.name}: no interval rule")
        if dtype.is_floating_point:
            raise NoInterval(f"{node.name}: a {dtype} tensor, not summarized per tile (integer and boolean ones are)")
        values = self.of_integer_input(node, idx)
        if dtype is torch.bool:  # False < True: all true where the minimum is, some where the maximum is
            return Interval(must=self.bind(f"({values.lo}) != 0"), may=self.bind(f"({values.hi}) != 0"),
                            varies=values.varies)
        return values

    def of_integer_input(self, node: fx.Node, idx: tuple) -> Interval:
        """``[min, max]`` of an integer (or boolean, as 0/1) input over the tile: its exact value
        where it is read at batch indices only (per-batch lengths), the reduction of the query
        tile's values, or the key tiles' summaries."""
        L = self.p.L
        tile_axes = [(axis, e) for axis, e in enumerate(idx) if e in ("rm", "cn")]
        if len(tile_axes) > 1 or any(e is not None and not e.startswith("fb") and e not in ("rm", "cn")
                                     for e in idx):
            raise NoInterval(f"{node.name}: read along more than one tile axis")
        if not tile_axes:  # one value per program
            self._printing(False)
            ptr, offset = self.p.input_address(node, idx)
            value = self.bind(f"{L.load}({ptr} + {offset}).to({L.int64})")
            return _int(value, value)
        (axis, e), = tile_axes
        big = "9223372036854775807"
        self._printing(e != "rm")  # the key tiles' summaries vary with them, the row tile's values do not
        if e == "rm":   # the one query tile: a vector of its rows
            offs = self.bind(f"m_lo + {self.p.arange('BLOCK_M')}")
            inside = f"{offs} <= m_hi"
            ptr, offset = self.p.input_address(node, tuple(offs if x == e else x for x in idx))
            values = self.bind(f"{L.load}({ptr} + {offset}, mask={inside}, other=0).to({L.int64})")
            return _int(self.bind(f"{L.min}({L.where}({inside}, {values}, {big}), 0)"),
                        self.bind(f"{L.max}({L.where}({inside}, {values}, -{big}), 0)"))
        # key tiles, a vector of them at a time: their min and max, computed once per launch
        lo, hi, offset = self.p.summary_address(node, axis, idx, self.key_tiles)
        inside = f"{self.key_tiles} < n_tiles"
        return Interval(lo=self.bind(f"{L.load}({lo} + {offset}, mask={inside}, other=0).to({L.int64})"),
                        hi=self.bind(f"{L.load}({hi} + {offset}, mask={inside}, other=0).to({L.int64})"), varies=True)


def _is_tensor(arg) -> bool:
    return isinstance(arg, fx.Node) and isinstance(arg.meta.get("val"), torch.Tensor)


def _add(ip, node, a):
    if node.kwargs.get("alpha", 1) != 1:
        raise NoInterval("alpha")
    return _int(ip.bind(f"{a[0].lo} + {a[1].lo}"), ip.bind(f"{a[0].hi} + {a[1].hi}"))


def _sub(ip, node, a):
    if node.kwargs.get("alpha", 1) != 1:
        raise NoInterval("alpha")
    return _int(ip.bind(f"{a[0].lo} - {a[1].hi}"), ip.bind(f"{a[0].hi} - {a[1].lo}"))


def _neg(ip, node, a):
    return _int(ip.bind(f"-({a[0].hi})"), ip.bind(f"-({a[0].lo})"))


def _mul(ip, node, a):
    lits = [x for x in node.args if isinstance(x, int) and not isinstance(x, bool)]
    if len(lits) != 1:
        raise NoInterval("product of two index values")
    c = lits[0]
    (x,) = [iv for arg, iv in zip(node.args, a) if isinstance(arg, fx.Node)]
    lo, hi = f"({x.lo}) * {c}", f"({x.hi}) * {c}"
    return _int(ip.bind(lo), ip.bind(hi)) if c >= 0 else _int(ip.bind(hi), ip.bind(lo))


def _abs(ip, node, a):
    L = ip.p.L
    lo, hi = a[0].lo, a[0].hi
    return _int(ip.bind(f"{L.maximum}({L.maximum}({lo}, -({hi})), 0)"),
                ip.bind(f"{L.maximum}({hi}, -({lo}))"))


def _minmax(name):
    def rule(ip, node, a):
        fn = getattr(ip.p.L, name)
        return _int(ip.bind(f"{fn}({a[0].lo}, {a[1].lo})"), ip.bind(f"{fn}({a[0].hi}, {a[1].hi})"))
    return rule


def _compare(op):
    def rule(ip, node, a):
        x, y = a
        if x.is_bool or y.is_bool:
            raise NoInterval("comparison of booleans")
        must, may = {
            "le": (f"({x.hi}) <= ({y.lo})", f"({x.lo}) <= ({y.hi})"),
            "lt": (f"({x.hi}) < ({y.lo})", f"({x.lo}) < ({y.hi})"),
            "ge": (f"({x.lo}) >= ({y.hi})", f"({x.hi}) >= ({y.lo})"),
            "gt": (f"({x.lo}) > ({y.hi})", f"({x.hi}) > ({y.lo})"),
            "eq": (f"(({x.lo}) == ({x.hi})) & (({y.lo}) == ({y.hi})) & (({x.lo}) == ({y.lo}))",
                   f"(({x.lo}) <= ({y.hi})) & (({y.lo}) <= ({x.hi}))"),
            "ne": (f"(({x.hi}) < ({y.lo})) | (({y.hi}) < ({x.lo}))",
                   f"~((({x.lo}) == ({x.hi})) & (({y.lo}) == ({y.hi})) & (({x.lo}) == ({y.lo})))"),
        }[op]
        return _bool(ip.bind(must), ip.bind(may))
    return rule


def _booleans(a, what: str) -> None:
    """``&``, ``|`` of integers (``i & 1``) are bitwise: no interval rule follows them."""
    if not all(x.is_bool for x in a):
        raise NoInterval(f"bitwise {what} of integers")


def _and(ip, node, a):
    _booleans(a, "and")
    return _bool(ip.bind(f"({a[0].must}) & ({a[1].must})"), ip.bind(f"({a[0].may}) & ({a[1].may})"))


def _or(ip, node, a):
    _booleans(a, "or")
    return _bool(ip.bind(f"({a[0].must}) | ({a[1].must})"), ip.bind(f"({a[0].may}) | ({a[1].may})"))


def _not(ip, node, a):
    if not a[0].is_bool:
        raise NoInterval("bitwise not of integers")
    return _bool(ip.bind(f"~({a[0].may})"), ip.bind(f"~({a[0].must})"))


def _same(ip, node, a):
    """A copy, or a cast between booleans and numbers (``.bool()`` is ``x != 0``, ``.float()`` of a
    boolean its 0 or 1); other casts (a float to an integer rounds) have no rule."""
    L = ip.p.L
    dtype = node.kwargs.get("dtype")
    if dtype in (None, node.args[0].meta["val"].dtype):
        return a[0]
    x = a[0]
    if dtype is torch.bool and not x.is_bool:
        return _bool(ip.bind(f"(({x.lo}) > 0) | (({x.hi}) < 0)"), ip.bind(f"~((({x.lo}) == 0) & (({x.hi}) == 0))"))
    if dtype is not torch.bool and x.is_bool:
        return _int(ip.bind(f"{L.where}({x.must}, 1, 0)"), ip.bind(f"{L.where}({x.may}, 1, 0)"))
    raise NoInterval("a cast")


def _floor_divide(ip, node, a):
    """``⌊x / c⌋``, c > 0, is non-decreasing in x."""
    c = positive_int_divisor(node)
    return _int(ip.bind(floor_div_code(a[0].lo, c)), ip.bind(floor_div_code(a[0].hi, c)))


def _div(ip, node, a):
    if node.kwargs.get("rounding_mode") != "floor":
        raise NoInterval(f"{node.name}: division")
    return _floor_divide(ip, node, a)


def _remainder(ip, node, a):
    """``x mod c``, c > 0, lies in ``[0, c - 1]`` (Python's sign rule), whatever ``x``.

    Deliberately no tighter: a rule that also followed ``x`` within one period (``[lo mod c,
    hi mod c]`` when ``⌊lo/c⌋ = ⌊hi/c⌋``) was compiled wrongly by Triton 3.6 on an H200 (tile
    tests that declared every tile empty; ``benchmarks/probes/repro_tile_test_miscompile.py``). The
    bounds are scalar tensors, not Python ints, so ``~`` and comparisons of them stay boolean
    tensors."""
    c = positive_int_divisor(node)
    return _int(ip.bind("m_lo * 0"), ip.bind(f"m_lo * 0 + {c - 1}"))


def _where(ip, node, a):
    """``x`` where the condition holds throughout the tile, ``y`` where it holds nowhere, either
    elsewhere (``where(triu(ones), c, 0)``, the capture's form of a triangle of a constant)."""
    L = ip.p.L
    c, x, y = a
    if x.is_bool or not c.is_bool:
        raise NoInterval("where of booleans")
    return _int(ip.bind(f"{L.where}({c.must}, {x.lo}, {L.where}(~({c.may}), {y.lo}, {L.minimum}({x.lo}, {y.lo})))"),
                ip.bind(f"{L.where}({c.must}, {x.hi}, {L.where}(~({c.may}), {y.hi}, {L.maximum}({x.hi}, {y.hi})))"))


RULES = {
    aten.add: _add, aten.sub: _sub, aten.neg: _neg, aten.mul: _mul, aten.abs: _abs,
    aten.floor_divide: _floor_divide, aten.div: _div, aten.remainder: _remainder,
    aten.maximum: _minmax("maximum"), aten.minimum: _minmax("minimum"),
    aten.le: _compare("le"), aten.lt: _compare("lt"), aten.ge: _compare("ge"), aten.gt: _compare("gt"),
    aten.eq: _compare("eq"), aten.ne: _compare("ne"),
    aten.logical_and: _and, aten.bitwise_and: _and, aten.logical_or: _or, aten.bitwise_or: _or,
    aten.logical_not: _not, aten.bitwise_not: _not,
    aten._to_copy: _same, aten.clone: _same, aten.alias: _same, aten.where: _where,
}
READS_NO_OPERAND = (_remainder,)  # [0, c − 1] whatever x: computed once per row tile
JUNCTIONS = (aten.logical_and, aten.bitwise_and, aten.logical_or, aten.bitwise_or)
