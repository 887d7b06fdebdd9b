"""Region → Triton source.

The kernel is printed from the region's own ops; no per-variant template. Its shape:

* a logical grid over every parallel dimension of the output — the frame's batch axes and
  the row tiles of ``M`` — flattened to one program id and recovered by inverse affine maps
  (``mt = pid % n_row_tiles``, batch indices by unravelling ``pid // n_row_tiles``);
* the operands ``Q[*, M, D]`` and ``Kᵀ[*, D, N]``, ``V[*, N, Dv]`` loaded with their real
  strides (``D``, ``Dv`` eliminated: one tile each);
* a loop over the demoted axis ``N``; per key tile, the score DAG printed op by op, the online
  reductions, and the rescaled accumulator ``acc = acc·α + P·V``;
* an epilogue that finishes the row values, applies the deferred row factors and stores.

Tensor inputs of the score DAG (biases, masks, ids) are loaded per tile at their real
strides, broadcast axes skipped; index expressions (``arange`` and what is computed from it)
are printed from the tile indices and never loaded.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import operator
import re
import sys

import torch
import torch.fx as fx

from ..analysis import OpKind
from ..analysis.ops import CONSTANT_FILLS, constant_value, packet
from ..config import KernelOptions, kernel_options
from .plan import KernelPlan, block_dims_of, pow2, reindexed
from ..patterns.region import PLAIN, ROW as ROW_FORM, ROW_LAYOUTS, Region, uncast
from ..patterns.chains import OUTPUT_REDUCTIONS
from ..patterns.rules import HOMOMORPHISMS, LN2, LOG2E, MAX_HEAD_DIM, ONLINE_REDUCTIONS, POSITIVE_SCALE
from ..tile.ir import Accumulate, Dot, Finish, Index, Load, Map, RowReduce, TileProgram
from ..tile.backward import attention_output, unbounded_p
from ..tile.lower import lower
from ..tile.outside import VECTOR_VIEWS, Outside
from .printers import (GPU_HELPERS, HELPER_CALLS, HELPERS, PRINTERS, TL, Call, Namespace, Unprintable,
                       compute_dtype, dtype_name, literal, refusal)

aten = torch.ops.aten
ROW, COL = "rm", "cn"  # the row / column tile index vectors, shaped [BM, 1] and [1, BN]
DVC = "dvc"            # the output's head-dim index vector, [1, DVP]
# _Printer.vector_producer's limit on the region's frame (its number of scores). On an H100 the
# Evoformer's mask bias computed in the kernel made B=1 (6.7·10⁷ scores) 34 % faster per call (two
# eager launches fewer, in a host-bound call) and B=8 and 32 (5.4·10⁸, 2.1·10⁹) 1.3 % and 3.0 %
# slower (two ops per key tile in every consumer thread cost more than eager's two small kernels;
# benchmarks/NOTES.md, 2026-11-24). Between them, batch 2 to 4 (1.3–2.7·10⁸) changed by
# ±1 %, batch 6 about +1 % (2026-11-25): the limit is batch 2.
VECTOR_PRODUCER_MAX_SCORES = 1 << 27
KEY_TILES = "t"        # tile_range: the indices of a chunk of key tiles being classified, [SCAN]
# The offset that E(x − m) and the rescale subtract: the running maximum m, clamped so that a row
# that has seen only -inf scores (masked so far) subtracts the finite -FLT_MAX instead of -inf:
# E(-inf − (−FLT_MAX)) = 0 where E(-inf − (−inf)) would be NaN. A finite m is unchanged (every
# score ≥ -FLT_MAX), NaN stays NaN. One max per row tile (a compare and a select before).
FLT_MAX = torch.finfo(torch.float32).max
OFFSET_GUARD = f"tl.maximum({{m}}, {-FLT_MAX!r}, propagate_nan=tl.PropagateNan.ALL)"
# The multiply-add form ``2^(x·k − m₂)`` (rules.Homomorphism.apply_fma) rounds ``m₂ = k·max(x)`` on
# its own: while ``|m₂| < 2²⁶`` the exponent is off by at most 4, common to the row and cancelled by
# its sum. A row beyond (or ±inf, NaN) is flagged for the repair kernel, which computes it as eager
# does; fp16 rows from ``|m₂| ≥ 2¹⁴``, where eager's own rounding decides (its ``finfo.min`` mask
# rounds ``s − 65504`` to steps of 32). docs/architecture.md, "Saturated rows and the repair kernel".
SATURATION_LOG2 = {torch.float16: float(1 << 14), torch.bfloat16: float(1 << 26)}
# An unbounded P (tile.backward.unbounded_p) is summed scaled by 1/REDO_SCALE where a sum in the
# kernel's order overflowed: by the repair kernel here, by the backward's REDO launch. A power of two
# scales exactly, and 2⁶⁴ keeps a sum of up to 2³² finite fp32 products below fp32's largest value.
REDO_SCALE = 2.0 ** 64
# The settings under which the kernel prints eager's form: no score fold, no exp2 multiply-add.
EXACT_FORMS = dict(exp2_fma=False, log2_max=False, fold_scale=False, fold_scale_add=False)


# Python arithmetic on floats known only at run time, printed in fp64 (Printer.run_time_scalar).
SCALAR_OPS = {operator.add: "({} + {})", operator.sub: "({} - {})", operator.mul: "({} * {})",
              operator.truediv: "({} / {})", operator.neg: "(-{})"}


def _labels(nodes) -> dict:
    """Node → ``op`` or ``op_k``: the k-th node (from 0, in the region's order) whose name has that op."""
    seen: dict = {}
    labels = {}
    for node in nodes:
        op = re.sub(r"_\d+$", "", node.name)
        k = seen[op] = seen.get(op, -1) + 1
        labels[node] = op if k == 0 else f"{op}_{k}"
    return labels


def _scalar_source(node: fx.Node) -> fx.Node | None:
    """The 0-d float tensor whose ``.item()`` ``node`` is, or None."""
    if node.op != "call_function" or node.target is not torch.ops.aten._local_scalar_dense.default:
        return None
    source = node.args[0]
    val = source.meta.get("val") if isinstance(source, fx.Node) else None
    return source if isinstance(val, torch.Tensor) and val.dim() == 0 and val.is_floating_point() else None


@dataclasses.dataclass
class Value:
    """A printed value. ``bound = (a, b)``: an int64 index value held in int32, exact while
    ``|v| ≤ a·S + b`` with S the largest frame size (checked at every launch). ``scaled =
    (base, c)``: the value equals ``c · base`` for a positive constant ``c`` (rules.POSITIVE_SCALE),
    so a max/min over it is ``c`` times the max/min over ``base`` and ``exp(v − m)`` one
    multiply-add on ``base``. ``row_factor = (f, b)``: the value equals ``f · b`` with ``f`` constant
    along the keys (a scalar or a row vector), so dividing it by a constant costs one operation
    per row, not per score."""

    code: str
    varies_n: bool = False
    is_literal: bool = False
    bound: tuple | None = None
    scaled: tuple | None = None
    row_factor: tuple | None = None


# Integer ops computed in int32 on index values, with the bound of their result from the
# bounds of their arguments: |f(x, y)| ≤ rule(bound x, bound y).
def _sum_bounds(*bounds):
    return (sum(b[0] for b in bounds), sum(b[1] for b in bounds))


def _max_bounds(*bounds):
    return (max(b[0] for b in bounds), max(b[1] for b in bounds))


NARROW_INT_OPS = {
    aten.add: _sum_bounds,
    aten.sub: _sum_bounds,
    aten.neg: _max_bounds,
    aten.abs: _max_bounds,
    aten.maximum: _max_bounds,
    aten.minimum: _max_bounds,
    aten.clone: _max_bounds,
    aten.alias: _max_bounds,
    aten._to_copy: _max_bounds,
    # ⌊x / c⌋ and x mod c pass through x % c + c and x - (x mod c): |·| ≤ |x| + c
    aten.floor_divide: _sum_bounds,
    aten.remainder: _sum_bounds,
}
NARROW_MUL_LIMIT = 1 << 10     # literal factors of a narrowed product
NARROW_LITERAL_LIMIT = 1 << 24  # literals that join a narrowed value
def _size_hint(size, unknown: int) -> int:
    """A size or stride as a number without a guard on it: a symbolic one (torch.compile with
    dynamic shapes) by its example value, ``unknown`` where it has none."""
    if isinstance(size, int):
        return size
    hint = getattr(size.node, "hint", None)
    return int(hint) if hint is not None else unknown


def _frame_scores(frame) -> int:
    """The number of scores of a frame, for VECTOR_PRODUCER_MAX_SCORES: symbolic sizes by their
    example values (no guard), a size without one as over the limit."""
    return math.prod(_size_hint(s, VECTOR_PRODUCER_MAX_SCORES + 1) for s in frame)


class _Printer:
    L = TL   # how its lines name the tile language (printers.Namespace): Triton's

    def __init__(self, region: Region, name: str, options: KernelOptions, dv_split: int = 1):
        self.r = region
        self.options = options
        self.labels = _labels(region.nodes)
        self.name = name
        self.dv_split = dv_split
        self.pre: list[str] = []
        self.loop: list[str] = []
        self.post: list[str] = []
        self.params: list[str] = []
        self.args: list = []
        self.inputs: list = []
        self.summaries: list = []  # (input, axis) summarized per key tile (KernelPlan.summaries)
        self.memo: dict = {}
        self.vars: dict = {}
        self.counter = 0
        self.index_bound = (0, 0)
        self.idx_bound = {ROW: (1, 0), COL: (1, 0), DVC: (0, MAX_HEAD_DIM)}
        self.affine_idx: dict = {}  # index string → (start, inner index string, step)
        self.in_epilogue = False
        self.output_index = self.output_value = None  # store_through_output_ops's
        self.prefetch_epilogue = options.prefetch_epilogue  # load the epilogue's inputs before the loop
        self.skips_tiles = False
        self.unclassified: list = []  # KernelPlan.unclassified
        self.full_proved = False   # tile_range classifies full tiles (every mask has an interval)
        self.scan = 128            # key tiles classified per chunk (tile_range)
        self.mask_conds: dict = {}  # tile-mask condition node → its variables in the loop body
        self.defined: dict = {}     # a placed value's name → (the section, the index of its line)
        self.helpers: set = set()   # the helper functions its lines call (module_source defines them)
        self.outside_values: Outside | None = None  # computed or loaded (tile.outside), from begin's kinds
        self.sym_nodes: list = []  # KernelPlan.sym_nodes
        self.kinds: dict = {}
        self.frame_shape = region.out_frame_shape  # the grid's frame: [*batch, M, N] of P
        self.frame_idx = self.batch_idx + (ROW, COL)
        for name in self.batch_idx:
            self.idx_bound[name] = (1, 0)
        # streams: None alone, or 0..S-1 (values of the score frame are printed once per stream;
        # values in the output frame belong to None)
        split = region.split
        self.streams = [None] if split is None else list(range(split.count))
        self.vars_of = {s: {} for s in {None, *self.streams}}
        self.vars = self.vars_of[None]
        self.stream = None
        self.sixteen_bit = region.q.math_dtype.itemsize == 2
        self.saturable: list = []  # (running maximum, kept in exp2 units, -inf guarded, its rows' seen_) flagged
        self.checks: list = []     # (row value, bound): rows where it reaches ``bound`` are flagged too
        self.checks_output = False  # rows whose output is inf or NaN are flagged too
        self.fill_checks: list = []  # conditions flagging rows a finite-fill mask's skipped tiles may reach
        self.uniform = False         # rows every key masks get V's average (uniform_mask)
        self.seen: list = []         # per unguarded running maximum: its rows saw a score above -inf (seen_)
        self.flags_rows = True     # flag rows for the repair kernel (not in the repair kernel itself)
        self.fma = False           # prints E(x − m) as a multiply-add (then launched with fp contraction)
        # eager's own form (the repair kernel): the row values in a first pass over N, P·V of the
        # finished P in a second, every value rounded to the dtype eager holds it in
        self.two_pass = False
        self.updates: set = set()  # indices in ``loop`` of the reductions' updates (first pass only)
        self.second: list = []     # the second pass's loop body
        self.out_at = 0            # where the lines that combine and store the output begin in ``post``
        self.body: list = []       # the kernel's body (build)
        self.nodes = {n.name: n for n in region.frame.graph.nodes}  # the tile program's value names → FX nodes
        self.reductions = {red.node: red for red in region.reductions}
        self.partner_k_ptrs: dict = {}   # further score contractions' K' tile addresses and masks, by index
        self.partner_k_masks: dict = {}
        # (max node, sum node) of the region's softmax whose row statistics the kernel also stores
        # (the training forward, emit_kernel's ``statistics``), or None
        self.statistics: tuple | None = None

    @property
    def batch_idx(self) -> tuple:
        """The names of the frame's batch indices (``fb0``, …), outside any stream."""
        return tuple(f"fb{i}" for i in range(len(self.frame_shape) - 2))

    def arange(self, size: str) -> str:
        """``[0, size)`` as a vector of indices."""
        return f"{self.L.arange}(0, {size})"

    def constant_mask(self, value: int) -> str:
        """A tile mask's condition where it is the constant ``value`` on every score of the tile."""
        return f"{self.L.full}([1, 1], {value}, {self.L.int1})"

    def printed(self, p, codes: list, node: fx.Node) -> str:
        """``node`` printed by its op's printer (PRINTERS), a helper function it calls recorded."""
        code = PRINTERS[p](codes, node, self.L)
        if isinstance(code, Call):
            self.call(code.helper)
        return code

    def call(self, helper: str) -> None:
        """Record that a line calls the helper function ``helper`` (HELPERS)."""
        self.helpers.add(helper)

    def label(self, node: fx.Node) -> str:
        """``node``'s name in the kernel's variables: its op and its rank among the region's nodes of
        that op (``amax``, ``amax_1``), so that identical regions print one source (one compilation,
        one tuning), whatever the graph named their nodes."""
        return self.labels.get(node, node.name)

    def sfx(self, stream=None) -> str:
        """Suffix of the names of one stream's values (none without streams)."""
        stream = self.stream if stream is None else stream
        return "" if stream is None else f"_{stream}"

    def enter_stream(self, stream) -> None:
        self.stream = stream
        self.vars = self.vars_of[stream]
        if stream is None or self.r.split is None:
            self.frame_idx = self.batch_idx + (ROW, COL)
            return
        split = self.r.split
        j, n = split.axis, split.count
        name = f"sb{j}_{stream}"
        if name not in self.idx_bound:
            code = f"fb{j} * {n} + {stream}" if split.inner else f"{stream} * FB{j} + fb{j}"
            self.pre.append(f"{name} = {code}")
            self.idx_bound[name] = (n, n)
        idx = [*self.batch_idx, ROW, COL]
        idx[j] = name
        self.frame_idx = tuple(idx)

    def stream_lin(self, stream) -> str:
        """The flat batch index of the score frame for ``stream`` (the contraction's batch): a
        variable bound before the loop (``stream_lin_code``)."""
        if stream is None or self.r.split is None:
            return "lin"
        name = f"lin_{stream}"
        self.pre.append(f"{name} = {self.stream_lin_code(stream)}")
        return name

    def stream_lin_code(self, stream) -> str:
        """The expression of ``stream``'s flat batch index: the frame's batch indices with the
        stream's own inserted at the split axis."""
        split = self.r.split
        fb = len(self.frame_shape) - 2
        axes = [(f"fb{i}", f"FB{i}") for i in range(fb)]
        axes.insert(split.axis + 1 if split.inner else split.axis, (str(stream), str(split.count)))
        code = axes[0][0]
        for index, size in axes[1:]:
            code = f"({code}) * {size} + {index}"
        return code

    def dot(self, a: str, b: str, dtype: torch.dtype, acc: str = "") -> str:
        """``tl.dot`` of two tiles as the kernel's place of running computes it (``_dot``)."""
        return _dot(a, b, dtype, acc, self.options.interpreter)

    # -- parameters -------------------------------------------------------------------
    def tmp(self, prefix="t") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def param(self, name: str, source) -> str:
        self.params.append(name)
        self.args.append(source)
        return name

    def tensor_input(self, node: fx.Node) -> int:
        if node not in self.inputs:
            self.inputs.append(node)
        return self.inputs.index(node)

    # -- operands ---------------------------------------------------------------------
    def operand(self, label: str, operand, rows: str, cols: str, row_mask, col_mask,
                lins=("lin",)) -> tuple[list, str]:
        """Pointers to a tile of ``operand`` for each flat batch index in ``lins``, and the mask."""
        i = self.tensor_input(operand.node)
        ptr = self.param(f"{label}_ptr", ("ptr", i))
        rank = operand.batch_rank
        for axis in range(rank):
            self.param(f"{label}_nb{axis}", ("size", i, axis))
            self.param(f"{label}_sb{axis}", ("stride", i, axis))
        row_axis, col_axis = (rank + 1, rank) if operand.transposed else (rank, rank + 1)
        sr = self.param(f"{label}_sr", ("stride", i, row_axis))
        sc = self.param(f"{label}_sc", ("stride", i, col_axis))
        ptrs = []
        for n, lin in enumerate(lins):
            off = f"{label}_boff" + (f"_{n}" if len(lins) > 1 else "")
            lines = [f"{off} = 0", f"rest = {lin}"]
            for axis in reversed(range(rank)):
                lines.append(f"{off} += (rest % {label}_nb{axis}).to({self.L.int64}) * {label}_sb{axis}")
                lines.append(f"rest = rest // {label}_nb{axis}")
            self.pre.extend(lines)
            ptrs.append(f"{ptr} + {off} + {rows} * {sr} + {cols} * {sc}")
        return ptrs, " & ".join(f"({m})" for m in (row_mask, col_mask) if m)

    # -- values of the score DAG -------------------------------------------------------
    def idx_of(self, node, idx: tuple) -> tuple:
        """Index expressions of an argument broadcast into a consumer indexed by ``idx``."""
        shape = tuple(node.meta["val"].shape)
        tail = idx[len(idx) - len(shape):] if shape else ()
        return tuple(None if s == 1 else e for s, e in zip(shape, tail))

    def node_idx(self, node: fx.Node) -> tuple:
        if node in self.r.squeezed:  # a row value without its reduced axis: [*batch, M]
            return self.idx_of(node, self.frame_idx[:-1])
        return self.idx_of(node, self.frame_idx)

    def arg(self, a, idx: tuple) -> Value:
        if not isinstance(a, fx.Node):
            if isinstance(a, (bool, int, float)):
                return Value(literal(a), is_literal=True, bound=_literal_bound(a))
            raise Unprintable(f"argument {a!r}")
        if a in self.vars:
            return self.vars[a]
        value = a.meta.get("val")
        if isinstance(value, torch.SymInt):
            return self.sym_int(a)
        if isinstance(value, (torch.SymFloat, torch.SymBool)):
            if not value.node.has_hint():  # known only at run time
                return self.place(f"({self.run_time_scalar(a)}).to({self.L.float32})", False, "x")
            kind = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(value)]
            return Value(literal(kind(value)), is_literal=True)  # specializes (and guards) on it
        return self.outside(a, self.idx_of(a, idx))

    def sym_int(self, node: fx.Node) -> Value:
        """A symbolic integer (a length under dynamic shapes: a cache's, a position offset) as a
        run-time parameter ``sym<j>`` (``("symint", j)``): specialized to its value, it would guard
        on it, and each other length would compile again (a decode step per token)."""
        if node not in self.sym_nodes:
            self.sym_nodes.append(node)
            self.param(f"sym{len(self.sym_nodes) - 1}", ("symint", len(self.sym_nodes) - 1))
        return Value(f"sym{self.sym_nodes.index(node)}")

    def outside(self, node: fx.Node, idx: tuple) -> Value:
        key = (node, idx, self.in_epilogue)
        if key in self.memo:
            return self.memo[key]
        computed = (self.kinds.get(node) is OpKind.INDEX or self.outside_values.computed(node)
                    or self.vector_producer(node, idx))
        try:
            value = self.index_expr(node, idx) if computed else self.load(*self.viewed(node, idx))
        except Unprintable:
            if not computed:
                raise
            # an op without a printer (a floor division by a negative number): eager computes
            # this value, as it would without fxflash, and the kernel loads it
            value = self.load(*self.viewed(node, idx))
        self.memo[key] = value
        return value

    def viewed(self, node: fx.Node, idx: tuple) -> tuple:
        """``(tensor, idx)`` to load for ``node`` at ``idx``: the tensor it views through VECTOR_VIEWS, at
        its own indices. A mask ``keep[:, None, None, :].expand(B, H, M, N)`` is read as the ``[B, N]``
        vector it broadcasts, one value per key (its expanded axes are stride 0, so the values are
        the same), rather than as a ``[BLOCK_M, BLOCK_N]`` tile; the per-tile tests read that tensor
        too (intervals.of_tensor). A reshape that moves indices stops the walk."""
        while (node.op == "call_function" and self.kinds.get(node) is OpKind.LAYOUT
               and packet(node.target) in VECTOR_VIEWS and isinstance(node.args[0], fx.Node)
               and isinstance(node.args[0].meta.get("val"), torch.Tensor)):
            try:
                idx = self.layout_source_idx(node, idx)
            except Unprintable:
                break
            node = node.args[0]
        return node, idx

    def vector_producer(self, node: fx.Node, idx: tuple) -> bool:
        """Is ``node`` an elementwise op (or a view of one, through VECTOR_VIEWS) that the tile
        reads at ``idx`` as a vector — one value per row, per key or per output column, never
        two of those (the Evoformer's mask bias ``INF·(mask − 1)``, ``[B, N_seq, 1, 1, S]``)? Then the
        kernel computes it on that vector from its inputs, a few ops per key tile, and eager's
        kernels for it (one per op, the result written and read back) go — on frames of at most
        VECTOR_PRODUCER_MAX_SCORES scores, where those launches cost more than the ops."""
        used = " ".join(e for e in idx if e)
        if (not self.options.vector_producers or sum(axis in used for axis in (ROW, COL, DVC)) > 1
                or _frame_scores(self.frame_shape) > VECTOR_PRODUCER_MAX_SCORES):
            return False
        if (node.op == "call_function" and self.kinds.get(node) is OpKind.LAYOUT
                and packet(node.target) in VECTOR_VIEWS and isinstance(node.args[0], fx.Node)):
            try:
                return self.vector_producer(node.args[0], self.layout_source_idx(node, idx))
            except Unprintable:  # a reshape that moves index expressions
                return False
        return self.outside_values.printable_elementwise(node)

    def held(self, code: str, node: fx.Node) -> str:
        """``code`` (an fp32 value of ``node``) as eager holds it: rounded to the node's 16-bit
        dtype in the two-pass form of 16-bit inputs, else unchanged."""
        dtype = node.meta["val"].dtype if isinstance(node.meta.get("val"), torch.Tensor) else None
        if not (self.two_pass and self.sixteen_bit and dtype in (torch.float16, torch.bfloat16)):
            return code
        if dtype is torch.bfloat16 and self.options.interpreter:
            self.call("_fx_round_bf16")
            return f"_fx_round_bf16({code})"
        return f"({code}).to({dtype_name(dtype, self.L)}).to({self.L.float32})"

    def place(self, code: str, varies_n: bool, prefix="t") -> Value:
        """Bind ``code`` to a new name: after the loop in the epilogue, else inside the loop
        when it varies along N, else before the loop."""
        name = self.tmp(prefix)
        section = self.post if self.in_epilogue else (self.loop if varies_n else self.pre)
        section.append(f"{name} = {code}")
        self.defined[name] = (section, len(section) - 1)
        return Value(name, varies_n)

    def load(self, node: fx.Node, idx: tuple) -> Value:
        if not isinstance(node.meta.get("val"), torch.Tensor):
            raise Unprintable(f"{node.name} has no tensor value")
        dtype = node.meta["val"].dtype
        cd = compute_dtype(dtype, self.L)
        ptr, offset = self.input_address(node, idx)
        used = " ".join(e for e in idx if e)
        masks = [m for v, m in ((ROW, f"({ROW} < M)"), (COL, "col_ok"), (DVC, f"({DVC} < DV)")) if v in used]
        mask = f", mask={' & '.join(masks)}, other=0" if masks else ""
        code = f"{self.L.load}({ptr} + {offset}{mask})"
        if self.in_epilogue and self.prefetch_epilogue:
            # an input the epilogue reads (a gate): issued before the loop, so that its latency
            # hides behind the loop's work; converted after it (its storage dtype held across)
            early = self.tmp("pf")
            self.pre.append(f"{early} = {code}")
            code = early
        return self.place(f"{code}.to({cd})", COL in used, "x")

    def run_time_scalar(self, node) -> str:
        """A float known only at run time, in fp64 as Python computes it: the ``.item()`` of a 0-d
        float tensor (Dynamo passes a float that changes between calls so), a literal, or Python
        arithmetic on them (SCALAR_OPS). Its user, a tensor op, reads it in fp32, its op math."""
        if isinstance(node, (int, float)) and not isinstance(node, bool):
            return f"{self.L.full}((), {literal(float(node))}, {self.L.float64})"
        if not isinstance(node, fx.Node):
            raise Unprintable(f"scalar {node!r}")
        source = _scalar_source(node)
        if source is not None:
            ptr, offset = self.input_address(source, ())
            return self.place(f"{self.L.load}({ptr} + {offset}).to({self.L.float64})", False, "x").code
        form = SCALAR_OPS.get(node.target) if node.op == "call_function" and not node.kwargs else None
        if form is None:
            raise Unprintable(f"{node.name} is a {type(node.meta.get('val')).__name__} known only at run time; "
                              "a fused kernel reads such floats from 0-d tensors, and Python arithmetic on them")
        return self.place(form.format(*(self.run_time_scalar(a) for a in node.args)), False, "x").code

    def input_address(self, node: fx.Node, idx: tuple) -> tuple[str, str]:
        """(pointer, offset) of a tensor input at index expressions ``idx`` (None: broadcast)."""
        i = self.tensor_input(node)
        ptr = f"in{i}_ptr"
        if ptr not in self.params:
            self.param(ptr, ("ptr", i))
            for axis in range(node.meta["val"].dim()):
                self.param(f"in{i}_s{axis}", ("stride", i, axis))
        terms = [f"({e}).to({self.L.int64}) * in{i}_s{axis}" if e.startswith("fb") else f"({e}) * in{i}_s{axis}"
                 for axis, e in enumerate(idx) if e is not None]
        return ptr, " + ".join(terms) if terms else "0"

    def summary_address(self, node: fx.Node, axis: int, idx: tuple, tiles: str) -> tuple[str, str, str]:
        """(min pointer, max pointer, offset) of the per-key-tile minimum and maximum of the
        integer input ``node`` along its ``axis`` (``KernelPlan.summaries``), at ``idx`` with
        that axis indexed by the key-tile indices ``tiles``."""
        key = (self.tensor_input(node), axis)
        if key not in self.summaries:
            self.summaries.append(key)
            j = len(self.summaries) - 1
            self.param(f"sum{j}_lo", ("summary", j, 0))
            self.param(f"sum{j}_hi", ("summary", j, 1))
            for a in range(node.meta["val"].dim()):
                self.param(f"sum{j}_s{a}", ("summary_stride", j, a))
        j = self.summaries.index(key)
        terms = [f"({tiles if a == axis else e}).to({self.L.int64}) * sum{j}_s{a}"
                 for a, e in enumerate(idx) if e is not None]
        return f"sum{j}_lo", f"sum{j}_hi", " + ".join(terms)

    def index_expr(self, node: fx.Node, idx: tuple) -> Value:
        """Print an index expression evaluated at tile indices ``idx`` (one per axis)."""
        p = packet(node.target)
        dtype = node.meta["val"].dtype if isinstance(node.meta.get("val"), torch.Tensor) else None
        if p is aten.arange:
            args = list(node.args)
            start, end, step = (0, args[0], 1) if len(args) == 1 else (args + [1])[:3]
            i = idx[0] if idx else None
            if i is None:  # a broadcast axis of size one: the first value
                return Value(literal(start), is_literal=True, bound=_literal_bound(start))
            pos = i
            code = f"({literal(start)} + {pos} * {literal(step)})"
            bound = self.arange_bound(start, step, pos, dtype)
            if bound is not None:
                return self.bounded(code, COL in pos, bound)
            return self.place(f"{code}.to({compute_dtype(dtype, self.L)})", COL in pos)
        if p in CONSTANT_FILLS:
            value = constant_value(node)
            if dtype is not None and not dtype.is_floating_point and dtype is not torch.bool:
                value = int(value)
            elif dtype is not None and dtype.is_floating_point:
                value = float(value)
            return Value(literal(value), is_literal=True, bound=_literal_bound(value))
        if p in (aten.tril, aten.triu):
            x = self.outside(node.args[0], idx)
            diag = node.args[1] if len(node.args) > 1 else 0
            diag = self.arg(diag, ()).code   # a literal, or a symbolic offset's run-time parameter
            row, col = (idx[-2] or "0"), (idx[-1] or "0")
            cmp = "<=" if p is aten.tril else ">="
            kept = f"({col}) - ({row}) {cmp} {diag}"
            if dtype is torch.bool:  # a boolean mask stays boolean: tl.where reads it as its condition
                code = f"({kept})" if x.code == "1" else f"({kept}) & ({x.code} != 0)"
            else:
                code = f"{self.L.where}({kept}, {x.code}, 0)"
            return self.place(code, x.varies_n or COL in f"{row} {col}")
        if p in PRINTERS:
            args = [self.arg(a, idx) for a in node.args]
            return self.apply(node, args)
        return self.outside(node.args[0], self.layout_source_idx(node, idx))

    def layout_source_idx(self, node: fx.Node, idx: tuple) -> tuple:
        """Index expressions of a layout op's input given those of its output."""
        p = packet(node.target)
        src = node.args[0]
        src_shape = tuple(src.meta["val"].shape)
        out_shape = tuple(node.meta["val"].shape)
        rank = len(src_shape)
        if p is aten.unsqueeze:
            d = node.args[1] % (rank + 1)
            return idx[:d] + idx[d + 1:]
        if p is aten.squeeze or p in (aten.view, aten._unsafe_view, aten.reshape):
            nonunit_out = [e for e, s in zip(idx, out_shape) if s != 1]
            if [s for s in src_shape if s != 1] != [s for s in out_shape if s != 1]:
                raise Unprintable(f"{node.name}: a reshape of an index expression")
            it = iter(nonunit_out)
            return tuple(None if s == 1 else next(it) for s in src_shape)
        if p is aten.expand:
            tail = idx[len(idx) - rank:]
            return tuple(None if s == 1 else e for s, e in zip(src_shape, tail))
        if p is aten.permute:
            out = [None] * rank
            for j, d in enumerate(node.args[1]):
                out[d % rank] = idx[j]
            return tuple(out)
        if p is aten.transpose:
            d0, d1 = node.args[1] % rank, node.args[2] % rank
            out = list(idx)
            out[d0], out[d1] = out[d1], out[d0]
            return tuple(out)
        if p is aten.slice:
            d = (node.args[1] if len(node.args) > 1 else 0) % rank
            start = node.args[2] if len(node.args) > 2 and node.args[2] is not None else 0
            step = node.args[4] if len(node.args) > 4 else 1
            start = start + src_shape[d] if start < 0 else min(start, src_shape[d])
            out = list(idx)
            out[d] = f"({start} + ({idx[d] or '0'}) * {step})"
            inner = self.idx_bound.get(idx[d] or "0", (0, 0))
            if isinstance(start, int) and isinstance(step, int):
                self.idx_bound[out[d]] = (inner[0] * abs(step), abs(start) + inner[1] * abs(step))
                self.affine_idx[out[d]] = (start, idx[d], step)
            return tuple(out)
        if p is aten.select:
            d = node.args[1] % rank
            index = node.args[2] % src_shape[d]
            self.idx_bound[str(index)] = (0, abs(int(index)))
            return idx[:d] + (str(index),) + idx[d:]
        if p in (aten.clone, aten.alias, aten.contiguous, aten.lift_fresh_copy, aten.detach):
            return idx
        raise Unprintable(f"{node.name}: layout op {node.target} in an index expression")

    def apply(self, node: fx.Node, args: list[Value]) -> Value:
        p = packet(node.target)
        if p not in PRINTERS:
            raise Unprintable(f"no printer for {node.target}")
        if p is aten.where and any(m.condition is node.args[0] for m in self.r.tile_masks):
            # a tile mask's condition, in the score DAG or in a mask computed per tile: full_tile_loop
            # prints it as a constant on the tiles proved full
            self.mask_conds.setdefault(node.args[0], set()).add(args[0].code)
        folded = _folded_literal(node, args)
        if folded is not None:
            return folded
        varies = any(a.varies_n for a in args)
        dtype = node.meta["val"].dtype if isinstance(node.meta.get("val"), torch.Tensor) else None
        narrowed = [a for a in args if a.bound is not None and not a.is_literal]
        if narrowed:
            bound = self.narrow_bound(node, p, args, dtype)
            if bound is not None:
                code = self.printed(p, [a.code for a in args], node)
                if all(a.is_literal for a in args):
                    return Value(code, is_literal=True, bound=bound)
                return self.bounded(code, varies, bound)
            if dtype is not None and not dtype.is_floating_point and p not in COMPARISONS:
                # widen int32-held index values back to int64 before an integer op that may
                # overflow (comparisons and conversions to float see the same exact value)
                args = [dataclasses.replace(a, code=f"({a.code}).to({self.L.int64})")
                        if a.bound is not None and not a.is_literal else a for a in args]
        code = self.printed(p, [a.code for a in args], node)
        if dtype is not None and not all(a.is_literal for a in args):
            code = self.held(f"({code}).to({compute_dtype(dtype, self.L)})", node)
        value = self.place(code, varies)
        folds = self.options.fold_scale and dtype is not None and dtype.is_floating_point
        scaled = _positive_scale(p, node, args, self.options.fold_scale_add, self.L) if folds else None
        if scaled is not None:
            base, c = scaled
            if not base.isidentifier():   # an expression: bound to a name of its own
                base = self.place(base, varies).code
            value = dataclasses.replace(value, scaled=(base, c))
        if folds and self.options.fold_scale_add:
            value = dataclasses.replace(value, row_factor=_row_factor(p, args))
        return value

    # -- int32 index arithmetic ------------------------------------------------------------
    def bounded(self, code: str, varies_n: bool, bound: tuple) -> Value:
        """An int64 index value printed in int32; its bound joins the launch-time check."""
        self.index_bound = _max_bounds(self.index_bound, bound)
        value = self.place(f"({code}).to({self.L.int32})", varies_n)
        return dataclasses.replace(value, bound=bound)

    def arange_bound(self, start, step, pos: str, dtype) -> tuple | None:
        if dtype is not torch.int64 or not isinstance(start, int) or not isinstance(step, int):
            return None
        inner = self.idx_bound.get(pos, (0, int(pos)) if pos.lstrip("-").isdigit() else None)
        if inner is None or abs(start) >= NARROW_LITERAL_LIMIT or abs(step) >= NARROW_MUL_LIMIT:
            return None
        return (inner[0] * abs(step), abs(start) + inner[1] * abs(step))

    def narrow_bound(self, node, p, args: list[Value], dtype) -> tuple | None:
        """The bound of an int64 op on int32-held index values, or None to compute in int64."""
        if dtype is not torch.int64 or any(a.bound is None for a in args):
            return None
        if p is aten.mul:
            lits = [a for a in args if a.is_literal]
            if len(lits) != 1 or lits[0].bound[1] >= NARROW_MUL_LIMIT:
                return None
            (other,) = [a for a in args if not a.is_literal]
            c = lits[0].bound[1]
            return (other.bound[0] * c, other.bound[1] * c)
        if p is aten.where:
            return _max_bounds(*(a.bound for a in args[1:]))
        if p in (aten.add, aten.sub) and node.kwargs.get("alpha", 1) != 1:
            return None
        rule = NARROW_INT_OPS.get(p)
        if rule is None or (p is aten._to_copy and node.kwargs.get("dtype") not in (None, torch.int64)):
            return None
        return rule(*(a.bound for a in args))

    # -- the kernel ----------------------------------------------------------------------
    def begin(self, kinds: dict) -> int:
        """Start printing a kernel: the graph's op kinds, and the frame sizes ``FB0…, M, N`` as
        its first parameters. Returns the number of frame batch axes."""
        self.kinds = kinds
        self.outside_values = Outside(kinds, self.r.output_ops, PRINTERS)
        fb = len(self.frame_shape) - 2
        for i in range(fb):
            self.param(f"FB{i}", ("frame", i))
        self.param("M", ("frame", fb))
        self.param("N", ("frame", fb + 1))
        return fb

    def build(self, program: TileProgram, kinds: dict, out_dtype: torch.dtype, configs: list) -> KernelPlan:
        """Print the kernel of ``program`` (``tile.lower``'s, the one ``explain()`` shows) by
        walking its operations: the grid and the operands' addresses, then per softmax stream the
        prologue (Q tiles, once per row tile) and the loop body (K tiles, contractions, the score
        chain, the online reductions), then the ops computed from the streams' values, V's tile and
        the accumulations, the running values' update, and the epilogue. Each operation is printed
        by the method ``OP_PRINTERS`` names; the score chain's values (its loads, index expressions
        and elementwise ops, named by the region's FX nodes) by the value printer (``dag_node``)."""
        r = self.r
        fb = self.begin(kinds)
        self.grid(fb)
        self.addresses()
        v_at = next(i for i, op in enumerate(program.body) if isinstance(op, Load) and op.name == "v")
        scores, products = program.body[:v_at], program.body[v_at:]
        for st in self.streams:
            self.enter_stream(st)
            for op in program.prologue:
                self.print_op(op)
            self.running_values(scores)
            for op in scores:
                if not self.combined(op):
                    self.print_op(op)
        self.enter_stream(None)
        for op in scores:
            if self.combined(op):
                self.print_op(op)
        for op in products:
            self.print_op(op)
        self.advance_running_values(scores)
        self.epilogue(program, out_dtype)
        if self.two_pass:
            # P with its row factors applied tile by tile (the finished row values of the first pass)
            finished = [self.finish(code, form.scale, form.factors, form.stream)
                        for (_, _, form), (code, _) in zip(r.terms, self.term_factors)]
            self.second = [line for i, line in enumerate(self.loop) if i not in self.updates]
            self.second += self.v_lines + self.accumulate(r.terms, finished, self.v_dtype, rescale=False)
        self.body = self.kernel_body()
        return KernelPlan(self.name, self.source(), self.args, self.inputs, fb,
                          out_dtype, r.D, r.Dv, configs=tuple(configs),
                          index_bound=self.index_bound,
                          side_dtypes=tuple(n.meta["val"].dtype for n in r.side_outputs)
                          + tuple(dtype for _, dtype in self.training_outputs()),
                          training_outputs=tuple(name for name, _ in self.training_outputs()),
                          partner_dims=tuple(p.d for p in r.partners),
                          out_order=_memory_order(r.output.meta["val"]) if r.output_ops else None,
                          summaries=tuple(self.summaries), dv_split=self.dv_split,
                          unclassified=tuple(dict.fromkeys(self.unclassified)), sym_nodes=tuple(self.sym_nodes))

    # -- the tile program's operations ------------------------------------------------
    def print_op(self, op) -> None:
        """Print one operation of the tile program (OP_PRINTERS)."""
        getattr(self, OP_PRINTERS[type(op)])(op)

    def combined(self, op) -> bool:
        """Is ``op`` computed once from the streams' values, after them (``Region.combined``), not
        once per stream?"""
        node = self.nodes.get(op.name)
        return node is not None and node in self.r.combined

    def grid(self, fb: int) -> None:
        """The program id mapped to its row tile, its batch indices and its part of Dv; the index
        vectors of the row tile and of the head dims."""
        L = self.L
        self.pre += [f"pid = {L.program_id}(0)", *self.tile_of("pid"), "rest = lin"]
        # the parts of one row tile run side by side, sharing its K/V tiles in L2
        dv_start = f"dvb * {self.dv_width} + " if self.dv_split > 1 else ""  # this program's first Dv column
        for i in reversed(range(fb)):
            self.pre += [f"fb{i} = rest % FB{i}", f"rest = rest // FB{i}"]
        self.pre += [
            f"offs_m = mt * BLOCK_M + {self.arange('BLOCK_M')}",
            f"{ROW} = offs_m[:, None]",
            f"offs_d = {self.arange('DP')}",
            f"offs_dv = {dv_start}{self.arange(self.dv_width)}",
            f"{DVC} = offs_dv[None, :]",
        ]

    def addresses(self) -> None:
        """The addresses of the Q and K tiles of every stream and of the V tile, and their masks,
        computed once per row tile before any load."""
        L, r = self.L, self.r
        # head-dim masks only where D, Dv are not already powers of two (tile width = size)
        d_row = "offs_d[None, :] < D" if r.D != pow2(r.D) else None
        d_col = "offs_d[:, None] < D" if r.D != pow2(r.D) else None
        lins = [self.stream_lin(st) for st in self.streams]
        q_ptrs, self.q_mask = self.operand("q", r.q, ROW, "offs_d[None, :]", f"{ROW} < M", d_row, lins)
        k_ptrs, self.k_mask = self.operand("k", r.k, "offs_d[:, None]", COL, d_col, "col_ok", lins)
        self.q_ptrs, self.k_ptrs = dict(zip(self.streams, q_ptrs)), dict(zip(self.streams, k_ptrs))
        # V's padded Dv columns re-read its last column instead of being masked: on an H100 (Triton
        # 3.6) a 16-bit V tile masked along Dv fed to tl.dot at 64-wide tiles gave wrong rows and
        # illegal addresses (benchmarks/NOTES.md, 2026-11-26); the padded output columns are never stored
        v_cols = "offs_dv[None, :]" if r.Dv == pow2(r.Dv) else f"{L.minimum}(offs_dv, DV - 1)[None, :]"
        (self.v_ptr,), self.v_mask = self.operand("v", r.v, "offs_n[:, None]", v_cols, "row_ok", None)

    def load_op(self, op: Load) -> None:
        """A contraction's operand tile (``q``, ``k``, ``v``; a further contraction's ``q<i>``,
        ``k<i>``); a tensor the score chain reads is loaded by the value printer where it is read."""
        if not op.operand:
            return
        L, r, x = self.L, self.r, self.sfx()
        if op.name == "q":
            self.pre.append(f"q{x} = {L.load}({self.q_ptrs[self.stream]}, mask={self.q_mask}, other=0.0)")
            self.pre += _scaled("q" + x, r.q)
        elif op.name == "k":
            self.loop.append(f"k{x} = {L.load}({self.k_ptrs[self.stream]}, mask={self.k_mask}, other=0.0)")
            self.loop += _scaled("k" + x, r.k)
        elif op.name == "v":
            self.v_load()
        elif op.name.startswith("q"):
            self.partner_q(int(op.name[1:]) - 1)
        else:
            self.partner_k(int(op.name[1:]) - 1)

    def dot_op(self, op: Dot) -> None:
        """A score contraction ``Q·Kᵀ`` per key tile: the frame's (``q``, ``k``) or a further one's."""
        r, x = self.r, self.sfx()
        if op.a == "q":
            self.loop.append(f"s{x} = {self.dot(f'q{x}', f'k{x}', r.q.node.meta['val'].dtype)}")
            self.vars[r.frame] = Value(f"s{x}", True) if not self.two_pass else self.place(
                self.held(f"s{x}", r.frame), True, "s")
            return
        j = int(op.a[1:]) - 1
        partner = r.partners[j]
        self.loop.append(f"sx{j} = {self.dot(f'qx{j}', f'kx{j}', partner.q.node.meta['val'].dtype)}")
        self.vars[partner.view] = Value(f"sx{j}", True)

    def value_op(self, op) -> None:
        """A value of the score chain (a Map or an online reduction), printed by the value printer;
        a value from outside the region that the kernel computes, or an index expression, is
        printed where a value reads it."""
        node = self.nodes.get(op.name)
        if node is not None and node in self.r.dag:
            self.dag_node(node, self.reductions)

    def running_values(self, scores) -> None:
        """Each online reduction's running value, initialised before the loop (one per stream)."""
        for op in scores:
            if isinstance(op, RowReduce):
                node = self.nodes[op.name]
                _, init = ONLINE_REDUCTIONS[packet(node.target)]
                self.pre.append(f"acc_{self.label(node)}{self.sfx()} = {self.L.full}([BLOCK_M, 1], {init}, "
                                f"{self.L.float32})")

    def advance_running_values(self, scores) -> None:
        """At the end of a key tile: each running maximum and minimum takes its new value (the
        sums were updated in place)."""
        for st in self.streams:
            for op in scores:
                if isinstance(op, RowReduce) and op.combine in ("max", "min"):
                    name = f"{self.label(self.nodes[op.name])}{self.sfx(st)}"
                    self.updates.add(len(self.loop))
                    self.loop.append(f"acc_{name} = new_{name}")

    def v_load(self) -> None:
        """V's tile, and what the accumulations read: each term's tile of P and its constant
        factor (deferred past ``P·V`` where that cannot overflow, ``deferred_constant``)."""
        L, r = self.L, self.r
        self.v_dtype = r.v.node.meta["val"].dtype
        self.v_lines = [f"v = {L.load}({self.v_ptr}, mask={self.v_mask}, other=0.0)", *_scaled("v", r.v)]
        values = [self.term_value(node, form) for _, node, form in r.terms]
        self.term_factors = [(p.code, 1.0) if self.two_pass else deferred_constant(p, self.v_dtype) for p in values]
        self.checks_output = self.flags_rows and not self.bounded_accumulation()
        if not self.two_pass:
            self.loop += self.v_lines

    def accumulate_op(self, op: Accumulate) -> None:
        """A term's accumulator ``acc<t>`` (zero before the loop), and per key tile ``acc += P·V``,
        rescaled first where the term is computed against a running maximum (the repair kernel's
        second pass accumulates the finished P instead: ``build``)."""
        t = int(op.acc.removeprefix("acc"))
        self.pre.append(f"acc{t} = {self.L.zeros}([BLOCK_M, {self.dv_width}], {self.L.float32})")
        if not self.two_pass:
            self.loop += self.accumulate_term(t, self.r.terms[t][2], self.term_factors[t][0], self.v_dtype, True)

    def training_outputs(self) -> tuple:
        """(name, dtype) of each result the training forward stores after the region's own
        (``statistics``, KernelPlan.training_outputs): a softmax's ``m`` and ``inv_l`` in fp32,
        then ``o``, O = P·V before the ops after it: where ops follow P·V, in its own dtype, and in
        fp32 wherever O is 16-bit and the backward takes each row's Δ = rowsum(dO ⊙ O) from it.
        Rounded to 16 bits, O leaves each dS row summing to dO·(O's rounding) instead of 0, which
        dQ weighs by the row's keys: far outside eager's error on rows a few keys dominate; with
        ``fp32_o`` off, the backward sums Δ over the keys instead."""
        if self.statistics is None:
            return ()
        r = self.r
        o = attention_output(r).meta["val"].dtype
        wide = bool(self.statistics) and o in (torch.float16, torch.bfloat16) and self.options.fp32_o
        return ((("m", torch.float32), ("inv_l", torch.float32)) if self.statistics else ()) + (
            (("o", torch.float32 if wide else o),) if r.output_ops or wide else ())

    def bounded_accumulation(self) -> bool:
        """Can ``Σ P·V``, with P's row factors deferred past it, overflow only where eager's
        ``Σ (P·factors)·V`` does? Yes where nothing is deferred, and for a softmax's terms over
        fp16 V: ``E(x − m) ≤ 1`` against its own maximum, divided by its sum (at least 1) after, so
        the accumulator stays below ``N·65504``. Any other deferral (``s / Σ|s|``, a constant
        below 1, a bf16 or fp32 V) can overflow at extreme values."""
        r = self.r
        if self.scaled_p():
            return False

        def softmax_term(node, form) -> bool:
            while node in r.passthrough or uncast(node) is not node:  # through deferred factors and casts
                node = r.passthrough.get(node) or uncast(node)
            own = r.forms.get(node, PLAIN)
            return (packet(node.target) in HOMOMORPHISMS and form.scale is not None and own.scale is form.scale
                    and all(f.op == "div" and f.row in r.unit_bounded_sums for f in form.factors))

        deferred = any(form.scale is not None or form.factors for _, _, form in r.terms)
        if any(c != 1.0 for _, c in self.term_factors):
            return False
        return not deferred or (r.v.node.meta["val"].dtype is torch.float16
                                and all(softmax_term(node, form) for _, node, form in r.terms))

    def scaled_p(self) -> bool:
        """Is P unbounded (tile.backward.unbounded_p) over a V that is not fp16, so that the kernel
        flags a row whose ``Σ P·V`` is not finite and the repair kernel sums it scaled by
        1/REDO_SCALE? fp16 products are below 2³², and no fp32 sum of them overflows."""
        return unbounded_p(self.r) and self.r.v.node.meta["val"].dtype is not torch.float16

    def accumulate(self, terms: list, tiles: list, v_dtype, rescale: bool) -> list[str]:
        """Loop lines that add each term's ``tile·V`` into its accumulator (accumulate_term)."""
        return [line for t, ((_, _, form), tile) in enumerate(zip(terms, tiles))
                for line in self.accumulate_term(t, form, tile, v_dtype, rescale)]

    def accumulate_term(self, t: int, form, tile: str, v_dtype, rescale: bool) -> list[str]:
        """Loop lines that add term ``t``'s ``tile·V`` into ``acc<t>``, rescaled first by the
        term's running maximum where ``rescale``."""
        lines = []
        scale = f" * {REDO_SCALE ** -1!r}" if self.two_pass and self.scaled_p() else ""
        p_tile = f"({self.L.where}(col_ok, {tile}, 0.0){scale}).to(v_ptr.dtype.element_ty)"
        if rescale and form.scale is not None:
            lines.append(f"acc{t} = acc{t} * alpha_{self.label(form.scale)}{self.sfx(form.stream)}")
        lines.append(f"acc{t} = {self.dot(p_tile, 'v', v_dtype, f'acc{t}')}")
        return lines

    def term_value(self, node: fx.Node, form) -> Value:
        """The tile of a term of P: printed in its own stream's values where it belongs to one,
        else loaded (a term computed outside the region, ``λ·a₁`` of a second softmax that
        another chain computes)."""
        for stream in (form.stream, None, *self.streams):
            if node in self.vars_of.get(stream, {}):
                return self.vars_of[stream][node]
        return self.arg(node, self.node_idx(node))

    def tile_of(self, pid: str, x: str = "") -> list[str]:
        """Lines that map the program id ``pid`` (a scalar, or a vector of them) to its part of the
        Dv columns ``dvb{x}``, its row tile ``mt{x}`` and its flat batch index ``lin{x}``."""
        lines = [f"n_mt = {self.L.cdiv}(M, BLOCK_M)"]
        if self.dv_split > 1:
            lines += [f"dvb{x} = {pid} % {self.dv_split}", f"tile{x} = {pid} // {self.dv_split}"]
            pid = f"tile{x}"
        first = f"n_mt - 1 - {pid} % n_mt" if self.options.heavy_rows_first else f"{pid} % n_mt"
        return lines + [f"mt{x} = {first}",
                        f"lin{x} = {pid} // n_mt"]

    @property
    def dv_width(self) -> str:
        """The Dv columns one program holds: all of them (``DVP``) or its part of a split."""
        return "DVP" if self.dv_split == 1 else f"(DVP // {self.dv_split})"

    def partner_q(self, j: int) -> None:
        """The Q' tile of a further score contraction (head dim ``DX{j}``), once per row tile, and
        the addresses of its Q' and K' tiles."""
        partner = self.r.partners[j]
        pad = partner.d != pow2(partner.d)
        self.pre.append(f"offs_dx{j} = {self.arange(f'DXP{j}')}")
        (q_ptr,), q_mask = self.operand(f"qx{j}", partner.q, ROW, f"offs_dx{j}[None, :]", f"{ROW} < M",
                                        f"offs_dx{j}[None, :] < DX{j}" if pad else None)
        (self.partner_k_ptrs[j],), self.partner_k_masks[j] = self.operand(
            f"kx{j}", partner.k, f"offs_dx{j}[:, None]", COL, f"offs_dx{j}[:, None] < DX{j}" if pad else None, "col_ok")
        self.pre.append(f"qx{j} = {self.L.load}({q_ptr}, mask={q_mask}, other=0.0)")
        self.pre += _scaled(f"qx{j}", partner.q)

    def partner_k(self, j: int) -> None:
        """The K' tile of a further score contraction, per key tile."""
        self.loop.append(f"kx{j} = {self.L.load}({self.partner_k_ptrs[j]}, mask={self.partner_k_masks[j]}, other=0.0)")
        self.loop += _scaled(f"kx{j}", self.r.partners[j].k)

    def dag_node(self, node: fx.Node, reductions: dict) -> None:
        split = self.r.split
        if split is not None and node is split.view:
            return  # read through by its selects
        if split is not None and node in split.selects:
            self.vars[node] = self.vars_of[split.selects[node]][split.view.args[0]]
        elif node in reductions:
            self.reduce(reductions[node])
        elif self.r.forms.get(node) == ROW_FORM or self.r.forms[node].kind == "sum":
            return  # absorbed into a homomorphism, a row op of the epilogue, or a sum whose
            # terms accumulate on their own
        else:
            self.stream_node(node)

    def stream_node(self, node: fx.Node) -> None:
        r = self.r
        form = r.forms.get(node)
        idx = self.node_idx(node)
        p = packet(node.target)
        shift = node.args[0] if node.args else None
        if p in HOMOMORPHISMS and form is not None and form.scale is not None and r.forms.get(shift) == ROW_FORM:
            # E(x - r) printed as E(x - m) against the running maximum m (rules.HOMOMORPHISMS)
            x = self.vars[shift.args[0]]
            hom = HOMOMORPHISMS[p]
            m = f"mu_{self.label(form.scale)}{self.sfx()}"
            if self.prints_fma(hom):
                base, c = x.scaled or (x.code, 1.0)
                form_fma = hom.apply_log2 if self.max_in_log2(form.scale) else hom.apply_fma
                code = form_fma.format(x=base, k=repr(c * LOG2E), m=m)
            else:
                code = hom.apply.format(x=x.code, m=m)
            self.vars[node] = self.place(self.held(code, node), True, "e")
            return
        if node in r.passthrough:
            self.vars[node] = self.vars[r.passthrough[node]]  # its row factor is applied after the loop
            return
        if p in (aten.expand, aten.view, aten._unsafe_view, aten.reshape, aten.contiguous) and node.args[0] in self.vars:
            self.vars[node] = self.vars[node.args[0]]
            return
        self.vars[node] = self.apply(node, [self.arg(a, idx) for a in node.args])

    def prints_fma(self, hom) -> bool:
        """Is ``E(x − m)`` printed as one multiply-add before ``exp2`` (Homomorphism.apply_fma:
        16-bit inputs, ``options.exp2_fma``)?"""
        return hom.apply_fma is not None and self.options.exp2_fma and self.r.q.math_dtype.itemsize == 2

    def max_in_log2(self, m: fx.Node) -> bool:
        """Is the running maximum ``m`` kept in exp2 units (Homomorphism.apply_log2)? Only a
        maximum that a homomorphism printed as a multiply-add reads (``options.log2_max``)."""
        hom = self.r.rescales.get(m)
        return hom is not None and hom.apply_log2 is not None and self.options.log2_max and self.prints_fma(hom)

    def reduce(self, red) -> None:
        start = len(self.loop)
        self.reduce_lines(red)
        self.updates.update(range(start, len(self.loop)))

    def reduce_lines(self, red) -> None:
        L = self.L
        name = f"{self.label(red.node)}{self.sfx()}"
        x = self.vars[red.source]
        acc = f"acc_{name}"
        if red.combine in ("max", "min"):
            fill = "float('-inf')" if red.combine == "max" else "float('inf')"
            pick = L.maximum if red.combine == "max" else L.minimum
            # the maximum is taken over the value its exponent reads: the folded ``base`` where the
            # exponent is the multiply-add on it, else the score itself (then ``x − m ≤ 0`` exactly)
            hom = self.r.rescales.get(red.node)
            fma = red.combine == "max" and hom is not None and self.prints_fma(hom)
            base, c = (x.scaled or (x.code, None)) if fma else (x.code, None)
            log2 = fma and self.max_in_log2(red.node)
            self.fma = self.fma or fma
            if log2:
                c = (c or 1.0) * LOG2E
            factor = f" * {c!r}" if c is not None else ""  # max(c·x) = c·max(x), c > 0
            tile = f"{getattr(L, red.combine)}({L.where}(col_ok, {base}, {fill}), 1, keep_dims=True)"
            if red.combine == "max" and hom is not None and self.flags_rows:
                # the rows that saw a score above -inf (the scaled maximum, in exp2 units, may
                # overflow to -inf where the scores are finite): saturated_rows leaves the others
                # to the kernel
                seen = f"seen_{name}"
                self.pre.append(f"{seen} = {L.full}([BLOCK_M, 1], 0, {L.int1})")
                self.loop += [f"raw_{name} = {tile}", f"{seen} = {seen} | (raw_{name} != float('-inf'))"]
                tile = f"raw_{name}"
                if self.sixteen_bit:
                    self.saturable.append((acc, log2, _neg_inf_guarded(red.node), seen))
                if not _neg_inf_guarded(red.node):
                    self.seen.append(seen)
            self.loop.append(f"tile_{name} = {tile}{factor}")
            self.loop.append(f"new_{name} = {pick}({acc}, tile_{name}, propagate_nan={L.PropagateNan}.ALL)")
            if red.combine == "max":
                hom = self.r.rescales.get(red.node, HOMOMORPHISMS[aten.exp])  # exp: nothing reads alpha
                rescale = hom.rescale_log2 if log2 else hom.rescale
                self.loop.append(f"mu_{name} = {OFFSET_GUARD.format(m=f'new_{name}')}")
                self.loop.append(f"alpha_{name} = {rescale.format(old=acc, new=f'mu_{name}')}")
            self.vars[red.node] = Value(f"(new_{name} * {LN2!r})" if log2 else f"new_{name}", True)
            return
        tile = f"{L.sum}({L.where}(col_ok, {x.code}, 0.0), 1, keep_dims=True)"
        if red.scale is not None:
            self.loop.append(f"{acc} = {acc} * alpha_{self.label(red.scale)}{self.sfx()} + {tile}")
        else:
            self.loop.append(f"{acc} = {acc} + {tile}")
        self.vars[red.node] = Value(acc, True)

    def epilogue(self, program: TileProgram, out_dtype) -> None:
        """After the loop, from the program's epilogue: per stream (then in the output frame, for
        the row values combined from the streams), each running maximum's rows that saw no score
        above -inf marked, then the row values in program order (running values final with their
        deferred factors, row ops); the row values stored beside the output (the program's "row
        values" Stores); each term's factors applied and ``Σ ± acc_t`` stored."""
        L = self.L
        r = self.r
        terms = r.terms
        self.in_epilogue = True
        epilogue = set(r.epilogue)
        row_ops = [op for op in program.epilogue if op.name in self.nodes and (
            isinstance(op, Finish) and self.nodes[op.name] in self.reductions
            or isinstance(op, Map) and self.nodes[op.name] in epilogue)]
        for st in [*self.streams, None] if r.split is not None else [None]:
            self.enter_stream(st)
            x = self.sfx()
            own = st is not None or r.split is None  # the stream's own row values (or there are no streams)
            for op in row_ops if own else ():
                node = self.nodes[op.name]
                if isinstance(op, Finish) and self.reductions[node].combine == "max":
                    # eager computes exp(-inf - (-inf)) = nan for a row whose every score is
                    # -inf; its sums are 0, so the shift factor E(m - r) may see m as 0 here
                    # (the loop subtracted -FLT_MAX, OFFSET_GUARD)
                    m = f"{self.label(node)}{x}"
                    if self.max_in_log2(node):
                        self.post.append(f"acc_{m} = acc_{m} * {LN2!r}")  # back from exp2 units
                    self.post.append(f"nanrow_{m} = acc_{m} == float('-inf')")
                    self.post.append(f"mu_{m} = {L.where}(nanrow_{m}, 0.0, acc_{m})")
            for op in row_ops:
                node = self.nodes[op.name]
                if isinstance(op, Finish):
                    if own:
                        red = self.reductions[node]
                        value = self.finish(f"acc_{self.label(node)}{x}", red.scale, red.factors, st)
                        self.vars[node] = self.place(self.held(value, node), False, "row")
                        self.check_range(red)
                elif (node in r.combined) != (st is None and r.split is not None):
                    continue
                elif packet(node.target) in ROW_LAYOUTS:
                    self.vars[node] = self.vars[node.args[0]]  # a row value's unit axis dropped or restored
                else:
                    idx = self.node_idx(node)
                    self.vars[node] = self.apply(node, [self.arg(a, idx) for a in node.args])
        rows = [self.vars[self.nodes[op.value]].code for op in program.stores if op.tile == "row values"]
        if self.statistics:
            # the backward's P = exp(x − m) · (1/l): the maximum the exponent was taken against
            # (natural units) and the reciprocal of the finished sum. The repair kernel's rows are
            # marked instead (m = +inf): its x is rounded as eager holds it, the backward's is not,
            # so the backward computes their statistics again from its own (STATISTICS_REPAIRED)
            m, l = self.statistics
            rows += [f"{L.full}([BLOCK_M, 1], float('inf'), {L.float32})" if self.two_pass else self.vars[m].code,
                     f"(1.0 / {self.vars[l].code})"]
        for i, code in enumerate(rows):
            ptr = self.param(f"side{i}_ptr", ("side", i))
            self.post.append(f"{L.store}({ptr} + lin.to({L.int64}) * M + {ROW}, "
                             f"{code}.to({ptr}.dtype.element_ty), mask={ROW} < M)")
        self.out_at = len(self.post)
        unscale = f" * {REDO_SCALE!r}" if self.two_pass and self.scaled_p() else ""   # accumulate_term's scale undone
        finished = [f"acc{t}{unscale}" if self.two_pass else self.finish(f"acc{t}", form.scale, form.factors, form.stream)
                    for t, (_, _, form) in enumerate(terms)]
        parts = [("+" if sign > 0 else "-") + f" {acc}" + (f" * {c!r}" if c != 1.0 else "")
                 for (sign, _, _), acc, (_, c) in zip(terms, finished, self.term_factors)]
        self.post.append(f"out = {' '.join(parts).lstrip('+ ')}")
        if any(name == "o" for name, _ in self.training_outputs()):
            # the training forward: O = P·V (before the ops after it, for their backward: autograd's)
            ptr = self.param(f"side{len(rows)}_ptr", ("side", len(rows)))
            self.post.append(f"{L.store}({ptr} + lin.to({L.int64}) * M * DV + {ROW} * DV + offs_dv[None, :], "
                             f"out.to({ptr}.dtype.element_ty), mask=({ROW} < M) & (offs_dv[None, :] < DV))")
        if r.output_ops:
            self.store_through_output_ops()
            return
        self.post.append(
            f"{L.store}(out_ptr + lin.to({L.int64}) * M * DV + {ROW} * DV + offs_dv[None, :], "
            f"out.to(out_ptr.dtype.element_ty), mask=({ROW} < M) & (offs_dv[None, :] < DV))"
        )

    def check_range(self, red) -> None:
        """A finished row sum that eager holds in a 16-bit dtype and that is not a softmax's
        denominator (at most N): flag the rows where it reaches that dtype's largest value, where
        eager's sum is inf (and ``s / Σ|s|`` is 0 in eager, finite and non-zero in fp32)."""
        dtype = red.node.meta["val"].dtype
        if (self.flags_rows and red.combine == "sum" and dtype in (torch.float16, torch.bfloat16)
                and red.node not in self.r.unit_bounded_sums):
            self.checks.append((self.vars[red.node].code, torch.finfo(dtype).max))

    def store_through_output_ops(self) -> None:
        """Apply the output ops to the tile ``out`` (indexed ``[*fb, rm, dvc]``), following
        transposes as a permutation of those index names, and store the result at the output
        tensor's own strides."""
        L = self.L
        r = self.r
        names = [*self.batch_idx, ROW, DVC]
        self.vars[r.output_ops[0].args[0]] = Value("out", True)
        for op in r.output_ops:
            p = packet(op.target)
            if p is aten.transpose:
                rank = len(names)
                d0, d1 = op.args[1] % rank, op.args[2] % rank
                names[d0], names[d1] = names[d1], names[d0]
            elif p is aten.permute:
                names = [names[d % len(names)] for d in op.args[1]]
            if p in (aten.transpose, aten.permute):
                self.vars[op] = self.vars[op.args[0]]
                continue
            if p in OUTPUT_REDUCTIONS:
                self.vars[op] = self.reduce_output(op, names)
                continue
            self.vars[op] = self.apply(op, [self.arg(a, tuple(names)) for a in op.args])
        wide = f".to({L.int64})"
        offset = " + ".join(f"{name}{wide if name.startswith('fb') or name == ROW else ''} * out_s{axis}"
                            for axis, name in enumerate(names))
        for axis in range(len(names)):
            self.param(f"out_s{axis}", ("out_stride", axis))
        self.output_index = tuple(names)  # the stored tile's axes as index names, and its value:
        self.output_value = self.vars[r.output].code  # what gluon's TMA store writes
        self.post.append(f"{L.store}(out_ptr + {offset}, {self.vars[r.output].code}.to(out_ptr.dtype.element_ty), "
                         f"mask=({ROW} < M) & ({DVC} < DV))")

    def reduce_output(self, op: fx.Node, names: list) -> Value:
        """A reduction over the output's last axis (whole in one tile): ``sum``, ``mean`` or
        ``amax`` of the tile's Dv columns, the padded columns left out."""
        if names[-1] != DVC:
            raise Unprintable(f"{op.name}: an output reduction over an axis other than Dv")
        x = self.vars[op.args[0]].code
        p = packet(op.target)
        fill = "float('-inf')" if p is aten.amax else "0.0"
        combine = "max" if p is aten.amax else "sum"
        code = f"{getattr(self.L, combine)}({self.L.where}({DVC} < DV, {x}, {fill}), 1, keep_dims=True)"
        if p is aten.mean:
            code = f"{code} / DV"
        return self.place(code, False, "red")

    def finish(self, acc: str, scale, factors, stream) -> str:
        """An accumulated value of ``stream`` with its row factors applied. A value computed
        against the running maximum with no shift factor of its own is NaN where that maximum
        is -inf."""
        x = self.sfx(stream)
        vars_ = self.vars_of[stream if stream in self.vars_of else None]
        reciprocal = self.reciprocal_rows()
        out = acc
        nan_from_factor = any(f.op == "shift" or (f.op == "div" and reciprocal.get(f.row) is scale) for f in factors)
        if scale is not None and not nan_from_factor:
            out = f"{self.L.where}(nanrow_{self.label(scale)}{x}, float('nan'), {out})"
        for f in factors:
            row = vars_[f.row].code if f.row in vars_ else self.arg(f.row, self.node_idx(f.row)).code
            if f.op == "shift":
                out = f"({out} * {f.hom.rescale.format(old=f'mu_{self.label(f.max)}{x}', new=row)})"
            elif f.op == "div" and f.row in reciprocal:
                out = f"({out} * (1.0 / {row}))"
            else:
                out = f"({out} {'*' if f.op == 'mul' else '/'} {row})"
        return out

    def reciprocal_rows(self) -> dict:
        """``{sum: its max}`` for the row sums divided out as one reciprocal per row and one multiply
        per element (Region.unit_bounded_sums, ``options.row_reciprocal``). The finished sum is NaN
        where its maximum's row is all -inf, so a value computed against that same maximum needs
        no NaN select of its own."""
        if not self.options.row_reciprocal:
            return {}
        scales = {red.node: red.scale for red in self.r.reductions}
        return {node: scales[node] for node in self.r.unit_bounded_sums}

    def tile_range(self) -> list[str]:
        """Lines that classify this row tile's key tiles, SCAN of them at a time (vectors: no
        scalar loop over tiles; a tensor summarized per tile is one load of its per-tile
        minimum and maximum per chunk, KernelPlan.summaries), into
        ``[lo_t, hi_t)``, the tiles to visit (leading and trailing tiles that a tile mask
        empties are skipped), and (with ``options.full_tiles``) ``[f_lo, f_hi)`` inside it, a run
        of whole tiles where every
        tile mask is proved to keep every score (visited without evaluating the masks). Tiles
        inside ``[lo_t, hi_t)`` that a mask empties are still visited, masked: sound for any
        mask. ``f_lo == f_hi`` when the full tiles are not one contiguous run."""
        L = self.L
        tests = self.tile_tests()
        if tests is None:
            return ["lo_t = 0", f"hi_t = {L.cdiv}(N, BLOCK_N)"]
        (row_part, key_part), empty, full = tests
        self.full_proved = full is not None
        out = ["m_lo = mt * BLOCK_M", f"m_hi = {L.minimum}(m_lo + BLOCK_M, M) - 1", *row_part,
               f"n_tiles = {L.cdiv}(N, BLOCK_N).to({L.int32})", "lo_t = n_tiles", "hi_t = n_tiles * 0",
               *(FULL_RUN_INIT if self.full_proved else []),
               f"for c0 in range(0, n_tiles, {self.scan}):",
               f"    {KEY_TILES} = c0 + {self.arange(self.scan)}",
               f"    n_lo = {KEY_TILES} * BLOCK_N", f"    n_hi = {L.minimum}(n_lo + BLOCK_N, N) - 1"]
        out += ["    " + line for line in key_part]
        t = KEY_TILES
        out += [f"    live = ({t} < n_tiles) & ~({empty})",
                f"    lo_t = {L.minimum}(lo_t, {L.min}({L.where}(live, {t}, n_tiles), 0))",
                f"    hi_t = {L.maximum}(hi_t, {L.max}({L.where}(live, {t} + 1, 0), 0))"]
        if self.full_proved:
            out += ["    " + line for line in full_run_chunk(t, "N // BLOCK_N", full, self.L)]
        out.append(f"hi_t = {L.maximum}(hi_t, lo_t)")
        if self.full_proved:
            out += full_run_finish(self.L)
        return out + self.bounded_skips()

    def bounded_skips(self) -> list[str]:
        """Lines that keep the tile range only where every additive mask's bound holds
        (``TileMask.bounded``): the scores it is added to are at most ``addend`` of
        ``D · max|Q| · max|K|`` (the launch's summaries of the whole Q and K, with 1/64 of slack
        for the roundings), below ``addend_below`` (``T`` of a finite fill, so that a skipped
        score is below ``-3T``; for ``-inf``, so that none is ``+inf``). Where a bound fails, every
        tile is visited with the masks evaluated, as eager computes them (a ``+inf + -inf`` is
        eager's NaN)."""
        L = self.L
        masks = [m for m in self.r.tile_masks if m.bounded]
        if not masks:
            return []
        out = [f"skip_dot = {float(self.r.D)!r} * {self.operand_max('q', whole=True)} * {self.operand_max('k')} "
               "* 1.015625"]
        for j, m in enumerate(masks):
            out.append(f"skip_bound{j} = {m.addend.dot!r} * skip_dot + {m.addend.const!r}")
        holds = " & ".join(f"(skip_bound{j} + {L.abs}(skip_bound{j}) * 0.015625 + 1.0 < {m.addend_below!r})"
                           for j, m in enumerate(masks))
        out += [f"skips = {holds}", f"lo_t = {L.where}(skips, lo_t, 0)", f"hi_t = {L.where}(skips, hi_t, n_tiles)"]
        if self.full_proved:
            out += [f"f_lo = {L.where}(skips, f_lo, 0)", f"f_hi = {L.where}(skips, f_hi, 0)"]
        return out

    def tile_tests(self):
        """((lines once per row tile, lines per chunk of key tiles), empty, full): ``empty`` is true
        for a key tile ``[n_lo, n_hi]`` (vectors over tiles) that one of the region's tile masks
        masks everywhere on rows ``[m_lo, m_hi]``; ``full`` (None when not every mask has an
        interval, or ``options.full_tiles`` is off) is true where every tile mask keeps every
        score. None when no mask has one."""
        from .intervals import IntervalPrinter, NoInterval

        ranges = {ROW: ("m_lo", "m_hi"), COL: ("n_lo", "n_hi")}
        ranges.update({f"fb{i}": (f"fb{i}", f"fb{i}") for i in range(len(self.frame_shape) - 2)})
        ip = IntervalPrinter(self, ranges, KEY_TILES, COL)
        # each stream reads the masks at its own batch indices and all share the key loop: a
        # tile is empty when every stream has a mask that empties it, full when no mask of
        # any stream masks a score of it
        empty, full, complete = [], [], True
        for stream in self.streams:
            self.enter_stream(stream)
            empty_here = []
            for mask in self.r.tile_masks:
                known = len(ip.unknown)
                try:
                    iv = ip.of(mask.condition, self.idx_of(mask.condition, self.frame_idx))
                except (NoInterval, Unprintable) as exc:
                    complete = False
                    self.unclassified.append(f"no per-tile test for {mask.condition.name} ({exc}); "
                                             "every tile is visited with the mask evaluated")
                    continue
                self.unclassified += [f"the per-tile test of {mask.condition.name} takes {part} as unknown: "
                                      "only the rest of the mask skips tiles" for part in ip.unknown[known:]]
                if not iv.is_bool:
                    complete = False
                    continue
                empty_here.append(f"({iv.must})" if mask.masked_when else f"(~({iv.may}))")
                full.append(f"(~({iv.may}))" if mask.masked_when else f"({iv.must})")
            if not empty_here:
                empty = None
            elif empty is not None:
                empty.append("(" + " | ".join(empty_here) + ")")
        self.enter_stream(None)
        if not empty:
            return None
        self.skips_tiles = True
        # the interpreter's test shapes have few tiles: small chunks so that they take several
        self.scan = 4 if self.options.interpreter else 128
        return ip.split_lines(), " & ".join(empty), " & ".join(full) if complete and self.options.full_tiles else None

    def full_tile_loop(self) -> list | None:
        """The loop body for tiles where every tile mask keeps every score: each mask's
        condition, proved constant on such a tile, is bound to that constant instead (its line,
        recorded where it was placed, printed again), so Triton folds the ``where`` away (and the
        index arithmetic or id loads that fed it). None when a mask's condition is not a line of
        the loop body."""
        if not self.r.tile_masks or any(m.condition not in self.mask_conds for m in self.r.tile_masks):
            return None
        body = list(self.loop)
        for mask in self.r.tile_masks:
            for code in self.mask_conds[mask.condition]:
                section, at = self.defined.get(code, (None, None))
                if section is not self.loop:
                    return None
                body[at] = f"{code} = {self.constant_mask(0 if mask.masked_when else 1)}"
        return body

    def finite_fill_checks(self) -> list[str]:
        """Conditions that flag a row for the repair kernel where a tile mask with a finite fill
        ``F`` (patterns.sparsity) may have skipped a tile the row needs: the row's maximum is not
        above ``-T`` (every score it saw masked, or none seen). (An additive mask's bound on the
        scores it is added to is the tile range's: ``bounded_skips``.) The lines that compute them
        go right after the output's, which they may replace (``uniform_mask``)."""
        L = self.L
        finite = [m for m in self.r.tile_masks if m.threshold is not None]
        if not finite:
            return []
        (scale,) = {form.scale for _, _, form in self.r.terms}
        unresolved = " | ".join(f"~(acc_{self.label(scale)}{self.sfx(st)} > {-min(m.threshold for m in finite)!r})"
                                for st in self.streams)
        uniform = self.uniform_mask()  # one finite mask
        lines = []
        if uniform is not None:
            # every score of a row every key masks is F: its output is the plain average of V
            lines += [f"dot_bound = {float(self.r.D)!r} * {self.operand_max('q')} * {self.operand_max('k')} * 1.015625",
                      f"live_bound = {uniform.scores.dot!r} * dot_bound + {uniform.scores.const!r} "
                      f"+ {L.zeros}([BLOCK_M, 1], {L.float32})",
                      f"uniform = ({unresolved}) & (live_bound * 1.015625 + 1.0 < {uniform.exact_below!r})",
                      f"v_mean = {L.load}({self.summary_param(self.r.v.node, 'colsum')} + lin.to({L.int64}) * DV "
                      "+ offs_dv[None, :], mask=offs_dv[None, :] < DV, other=0.0) / N",
                      f"out = {L.where}(uniform, v_mean, out)"]
            if self.statistics:   # such a row visited no tile: its statistics are marked, as repaired rows'
                m_ptr = f"side{len(self.r.side_outputs)}_ptr"
                lines.append(f"{L.store}({m_ptr} + lin.to({L.int64}) * M + {ROW}, "
                             f"{L.full}([BLOCK_M, 1], float('inf'), {L.float32}), mask=({ROW} < M) & uniform)")
            self.uniform = True
        self.post[self.out_at + 1:self.out_at + 1] = lines
        return [f"({unresolved}) & ~uniform" if uniform is not None else unresolved]

    def uniform_mask(self):
        """The tile mask under which a row every key masks is computed without visiting a tile, or
        None: the region is ``softmax(x)·V`` (one stream, V unscaled) under one finite-fill mask
        with a bound on the scores beneath it (TileMask.scores); then, where that bound is below
        the mask's ``exact_below``, such a row's scores are all ``F`` and its output is the average
        of V over all keys, read from the column sums the launch computes (``colsum``)."""
        from .gluon import softmax_of  # the softmax analysis the Gluon kernel is printed from

        (mask, *others), r = self.r.tile_masks, self.r
        if (others or mask.scores is None or mask.exact_below is None or r.split is not None or r.v.scale
                or r.v.transposed or isinstance(softmax_of(r), str)):  # colsum sums V stored [*, N, Dv]
            return None
        return mask

    def operand_max(self, label: str, whole: bool = False) -> str:
        """The largest magnitude of the Q tile (this program's rows; with ``whole``, of the whole
        Q) or of the whole K (a scalar the launch computes), as the score contraction reads them
        (_scaled)."""
        L = self.L
        if label == "q" and not whole:
            return functools.reduce(lambda a, b: f"{L.maximum}({a}, {b})",
                                    [f"{L.max}({L.abs}(q{self.sfx(st)}.to({L.float32})))" for st in self.streams])
        operand = self.r.q if label == "q" else self.r.k
        code = f"{L.load}({self.summary_param(operand.node, 'absmax')}).to({L.float32})"
        for op, c in operand.scale:
            code += f" * {abs(float(c)) if op == 'mul' else 1.0 / abs(float(c))!r}"
        return code

    def summary_param(self, node: fx.Node, kind: str) -> str:
        """The parameter holding a summary of input ``node`` that the launch computes at each call
        (``KernelPlan.summaries``): ``absmax``, its largest magnitude (a scalar), or ``colsum``, its
        sums over N in fp32 (``[batch, Dv]``, the batch flat as ``lin``)."""
        key = (self.tensor_input(node), kind)
        if key not in self.summaries:
            self.summaries.append(key)
            self.param(f"sum{len(self.summaries) - 1}_{kind}", ("summary", len(self.summaries) - 1, 0))
        return f"sum{self.summaries.index(key)}_{kind}"

    @property
    def flags(self) -> bool:
        """Does this kernel flag rows for the repair kernel (``sat_ptr``)?"""
        return bool(self.saturable or self.checks or self.checks_output or self.fill_checks)

    def saturated_rows(self) -> list[str]:
        """Lines that set ``saturated`` where a row of this program is left to the repair kernel:
        its running maximum in exp2 units reaches SATURATION_LOG2 (or is infinite or NaN; not
        where the row saw no score above -inf and the region guards it, ``_neg_inf_guarded``, or
        the kernel's output row is NaN throughout, as eager's), a
        checked row value reaches its bound, or (``checks_output``) its output is inf or NaN,
        which an accumulation of unnormalized terms can reach where eager's normalized one does
        not. Rows past ``M`` are left out."""
        L = self.L
        bound = SATURATION_LOG2.get(self.r.q.math_dtype)  # 16-bit inputs: their maxima flagged
        kept = " & ~uniform" if self.uniform else ""  # those rows are exact (uniform_mask)
        # the running maximum is back in natural units here (``epilogue``): one kept in exp2 units
        # is compared with the bound times ln 2, one held in natural units is scaled to exp2's
        bad = [(f"~({L.abs}({acc}) < {bound * LN2!r})" if log2 else f"~({L.abs}({acc} * {LOG2E!r}) < {bound!r})")
               + (f" & {seen}" if guarded else "") + kept for acc, log2, guarded, seen in self.saturable]
        if self.checks_output:
            bad.append(f"({L.max}((~({L.abs}(out) < float('inf'))).to({L.int32}), 1, keep_dims=True) > 0)")
        if bad and self.seen:
            # a row that saw only -inf scores is NaN throughout in eager (exp(-inf − (-inf))): where
            # the kernel's is NaN throughout too (the softmax's 0/0), the repair kernel would
            # compute the same again
            unseen = " | ".join(f"~{seen}" for seen in self.seen)
            bad = [f"{b} & ~(({unseen}) & ({L.min}((out != out).to({L.int32}), 1, keep_dims=True) > 0))" for b in bad]
        bad += [f"~({L.abs}({value}) < {bound!r})" for value, bound in self.checks]
        bad += self.fill_checks
        lines = [f"saturated = {ROW} < 0"]
        lines += [f"saturated = saturated | (({ROW} < M) & {b})" for b in bad]
        return lines

    def kernel_body(self) -> list[str]:
        """The kernel's body, unindented. The loop over N is printed twice: over the full key
        tiles, where ``col_ok`` is a constant true the compiler folds away (no bound checks, no
        masking of the reductions), then over the one partial tile, if any, with the checks."""
        L = self.L
        tile_range = self.tile_range()  # may add parameters: tensors summarized per tile
        if self.skips_tiles and self.flags_rows:
            self.fill_checks = self.finite_fill_checks()
        body = [*self.pre, *tile_range, f"n_split = {L.minimum}(hi_t, N // BLOCK_N)"]
        full_loop = self.full_tile_loop() if self.full_proved and not self.two_pass else None
        body += self.key_loops(self.loop, full_loop)
        if self.two_pass:  # the row values finished, then P·V of the finished P
            body += self.post[:self.out_at]
            body += [f"new_{self.label(red.node)}{self.sfx(st)} = acc_{self.label(red.node)}{self.sfx(st)}"
                     for st in self.streams for red in self.r.reductions if red.combine in ("max", "min")]
            body += self.key_loops(self.second, None)
            body += self.post[self.out_at:]
        else:
            body += self.post
        if self.flags:  # flagged for the repair kernel (one int8 per row; streams share it)
            body += [*self.saturated_rows(),
                     f"{L.store}(sat_ptr + lin.to({L.int64}) * M + {ROW}, saturated.to({L.int8}), mask={ROW} < M)"]
        return body

    def key_loops(self, loop: list, full_loop: list | None) -> list[str]:
        """The loops over N that run ``loop``: over the whole key tiles, where ``col_ok`` is a
        constant true, with ``full_loop`` (the masks folded) over the full ones where given, then
        over the one partial tile, if any, with the checks."""
        L = self.L
        whole = (f"{L.full}([1, BLOCK_N], 1, {L.int1})", f"{L.full}([BLOCK_N, 1], 1, {L.int1})")
        if full_loop is None:   # whole key tiles, then the partial one
            loops = [("lo_t", "n_split", *whole, loop)]
        else:                   # masked, full (masks folded), masked, then the partial one
            loops = [("lo_t", "f_lo", *whole, loop), ("f_lo", "f_hi", *whole, full_loop),
                     ("f_hi", "n_split", *whole, loop)]
        loops.append(("n_split" if not self.skips_tiles else f"{L.maximum}(lo_t, n_split)", "hi_t", "cn < N",
                      "offs_n[:, None] < N", loop))
        body = []
        for start, stop, col_ok, row_ok, lines in loops:
            body.append(f"for start_n in range(({start}) * BLOCK_N, ({stop}) * BLOCK_N, BLOCK_N):")
            body += ["    " + line for line in (
                f"offs_n = start_n + {self.arange('BLOCK_N')}", f"{COL} = offs_n[None, :]",
                f"col_ok = {col_ok}", f"row_ok = {row_ok}")]
            body += ["    " + line for line in lines]
        return body

    def function(self, lead: tuple = ("out_ptr",), body: list | None = None, tail: tuple = ()) -> list[str]:
        """The ``@triton.jit`` function's lines: parameters ``lead``, the run-time ones, the
        constexprs, ``tail``; its body (this printer's by default)."""
        L = self.L
        params = ", ".join([*lead, *self.params, f"BLOCK_M: {L.constexpr}", f"BLOCK_N: {L.constexpr}",
                            f"D: {L.constexpr}", f"DP: {L.constexpr}", f"DV: {L.constexpr}", f"DVP: {L.constexpr}",
                            *(f"DX{j}: {L.constexpr}, DXP{j}: {L.constexpr}" for j in range(len(self.r.partners))),
                            *tail])
        return ["@triton.jit", f"def {self.name}({params}):", *("    " + line for line in (body or self.body))]

    def source(self, repair: "_Printer | None" = None) -> str:
        """The module source: this printer's kernel (with ``sat_ptr`` after ``out_ptr`` where it flags
        saturated rows), and given ``repair`` (the region printed in eager's own forms,
        EXACT_FORMS), the repair kernel (repair_body)."""
        L = self.L
        functions = self.function(("out_ptr", "sat_ptr") if self.flags else ("out_ptr",))
        if repair is not None:
            functions += ["", *repair.function(("out_ptr", "sat_ptr"), repair.repair_body(),
                                               (f"SAT_STREAMS: {L.constexpr}", f"REPAIR_SCAN: {L.constexpr}"))]
        return module_source(functions, self.helpers | (repair.helpers if repair is not None else set()),
                             self.options.interpreter)

    def repair_body(self) -> list[str]:
        """The repair kernel's body: a grid of a few programs per multiprocessor scans the row
        flags that the kernel stored (``sat_ptr``, one int8 per row and softmax stream: the row's
        maximum left the multiply-add form's range) for REPAIR_SCAN row tiles at once, and computes
        each tile with a flagged row in this printer's form. One program per tile cost the
        Evoformer at B=8 9 % on an H200 (32768 programs reading 64 flags each), and so did one
        program walking tile after tile, one dependent load each. Program ``p`` of ``G`` takes the
        tiles ``p, p + G, p + 2G, …``: flagged tiles come in runs (a left-padded sequence's first
        row tiles, in every head), which a program taking consecutive tiles would compute alone."""
        L = self.L
        assert self.body[0] == f"pid = {L.program_id}(0)", self.body[0]
        items = " * ".join([f"{L.cdiv}(M, BLOCK_M)", *(f"FB{i}" for i in range(len(self.frame_shape) - 2)),
                            str(self.dv_split)])
        scan = self.arange("REPAIR_SCAN")
        rows = f"(mt_v * BLOCK_M)[:, None] + {self.arange('BLOCK_M')}[None, :]"
        return [
            f"n_items = {items}",
            f"prog, progs = {L.program_id}(0), {L.num_programs}(0)",
            f"for first in range(0, {L.cdiv}(n_items - prog, progs), REPAIR_SCAN):",
            *("    " + line for line in [
                f"items_v = prog + (first + {scan}) * progs", *self.tile_of("items_v", "_v"),
                f"ok = ({rows} < M) & (items_v < n_items)[:, None]",
                f"at = (lin_v.to({L.int64}) * M)[:, None] + {rows}",
                f"flagged = {L.zeros}([REPAIR_SCAN], {L.int32})",
                f"for stream in {L.static_range}(SAT_STREAMS):",
                f"    flagged = {L.maximum}(flagged, {L.max}({L.load}(sat_ptr + at * SAT_STREAMS + stream, mask=ok, "
                f"other=0).to({L.int32}), 1))",
                "for j in range(0, REPAIR_SCAN):",
                f"    if {L.max}({L.where}({scan} == j, flagged, 0)) > 0:",
                *("        " + line for line in ["pid = prog + (first + j) * progs", *self.body[1:]])])]


# The tile program's operations in the loop and before it, each printed by a _Printer method (an
# Index is printed where a value reads it; the epilogue and stores by ``_Printer.epilogue``).
OP_PRINTERS = {Load: "load_op", Dot: "dot_op", Index: "value_op", Map: "value_op", RowReduce: "value_op",
               Accumulate: "accumulate_op"}

COMPARISONS = {aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge}


# The one run ``[f_lo, f_hi)`` of full tiles among those a loop visits (``[lo_t, hi_t)``), found
# a chunk of tiles at a time (the forward's tile_range, the backward's); empty (at ``lo_t``) when
# the full tiles are not one contiguous run.
FULL_RUN_INIT = ["f_lo = n_tiles", "f_hi = n_tiles * 0", "n_full = n_tiles * 0"]
def full_run_finish(L: Namespace = TL) -> list[str]:
    """After the chunks: the run, or none (at ``lo_t``) where the full tiles were not contiguous."""
    return ["one_run = (n_full > 0) & (n_full == f_hi - f_lo)",
            f"f_lo = {L.where}(one_run, f_lo, lo_t)", f"f_hi = {L.where}(one_run, f_hi, lo_t)"]


def full_run_chunk(t: str, whole: str, full: str, L: Namespace = TL) -> list[str]:
    """Per chunk of tiles ``t`` (live ones: ``live``): those below ``whole`` (inside the size)
    where ``full`` holds widen the run and are counted."""
    return [f"full = live & ({t} < {whole}) & ({full})",
            f"f_lo = {L.minimum}(f_lo, {L.min}({L.where}(full, {t}, n_tiles), 0))",
            f"f_hi = {L.maximum}(f_hi, {L.max}({L.where}(full, {t} + 1, 0), 0))",
            f"n_full += {L.sum}(full.to({L.int32}), 0)"]


def module_source(functions: list[str], helpers: set, interpreter: bool) -> str:
    """A kernel module: the imports, the helper functions ``functions`` call (``helpers``, as their
    printers recorded them, and those these call), and ``functions``; for Triton's ``interpreter``,
    without the GPU's own helpers (libdevice)."""
    table = HELPERS if interpreter else {**HELPERS, **GPU_HELPERS}
    called = set(helpers) | {callee for name in helpers for callee in HELPER_CALLS.get(name, ())}
    used = [src for name, src in table.items() if name in called]
    return "\n".join([
        "import triton",
        "import triton.language as tl",
        *(["from triton.language.extra import libdevice"] if not interpreter else []),
        *used,
        *functions,
        "",
    ])


def _literal_value(code: str):
    """The Python scalar that printers.literal printed as ``code``."""
    return {"float('inf')": math.inf, "float('-inf')": -math.inf, "float('nan')": math.nan}.get(code) or (
        float(code) if any(c in code for c in ".e") else int(code))


def _folded_literal(node: fx.Node, args: list) -> Value | None:
    """An op whose arguments are all literals (a size-one axis's index, ``arange(1)``), computed
    now by the op itself in its own dtypes, as eager computes it: a literal. None otherwise."""
    if not args or not all(a.is_literal for a in args) or not isinstance(node.meta.get("val"), torch.Tensor):
        return None
    try:
        # a tensor argument as a 0-d tensor of its dtype; a size (a SymInt node) as the Python int
        operands = [(torch.tensor(_literal_value(v.code), dtype=a.meta["val"].dtype)
                     if isinstance(a.meta.get("val"), torch.Tensor) else _literal_value(v.code))
                    if isinstance(a, fx.Node) else a for v, a in zip(args, node.args)]
        value = node.target(*operands, **node.kwargs).item()
    except (TypeError, ValueError, RuntimeError):
        return None
    return Value(literal(value), is_literal=True, bound=_literal_bound(value))


def _positive_literal(v: Value) -> float | None:
    """The value of a finite positive float or int literal, else None."""
    if not v.is_literal:
        return None
    try:
        c = float(v.code)
    except ValueError:
        return None
    return c if 0 < c < math.inf else None


def _times(x: Value, c: float | None) -> tuple | None:
    """``x · c`` as ``(base, c')`` for a positive literal ``c`` (None otherwise)."""
    if c is None or x.is_literal:
        return None
    base, c0 = x.scaled or (x.code, 1.0)
    return base, c0 * c


def _over(x: Value, c: float | None) -> tuple | None:
    """``x / c`` as ``x · (1/c)``."""
    return _times(x, 1 / c) if c is not None else None


def _masked(node, args, L: Namespace) -> tuple | None:
    """``where(m, -inf, c·x)`` or ``where(m, c·x, -inf)`` as ``c · where(m, -inf, x)``."""
    cond, a, b = args
    fill = literal(-math.inf)
    for x, other in ((b, a), (a, b)):
        if other.code == fill and x.scaled is not None:
            base, c = x.scaled
            pair = (fill, base) if x is b else (base, fill)
            return f"{L.where}({cond.code}, {pair[0]}, {pair[1]})", c
    return None


def _row_factor(p, args: list) -> tuple | None:
    """Value.row_factor of ``p(*args)``: a product of a value constant along the keys and one
    that varies, or a float cast of such a product."""
    if p is aten.mul and len(args) == 2 and all(isinstance(a, Value) for a in args):
        a, b = args
        for f, x in ((a, b), (b, a)):
            if not f.varies_n and x.varies_n:
                return f.code, x.code
    if POSITIVE_SCALE.get(p) == "same":
        return args[0].row_factor
    return None


# The scales ``c`` a bias may be divided by: ``b/c`` overflows only where ``|b| > c·FLT_MAX``,
# within 2⁸ of where the scores themselves would (the exp2 form's own limit, rules.HOMOMORPHISMS).
BIAS_FOLD_RANGE = (2.0 ** -8, 2.0 ** 24)


def _plus(node, args, sign: str, past_adds: bool, L: Namespace = TL) -> tuple | None:
    """``c·x ± y`` as ``(x ± y/c, c)``, where ``y/c`` costs one operation per row: ``y`` constant
    along the keys, or ``f·b`` with ``f`` constant along them (Value.row_factor); only
    ``past_adds`` (options.fold_scale_add)."""
    if node.kwargs.get("alpha", 1) != 1 or not past_adds or len(args) != 2:
        return None
    for x, y in (args, args[::-1]) if sign == "+" else (args,):  # c·x − y needs x first
        if x.scaled is None or not BIAS_FOLD_RANGE[0] <= x.scaled[1] <= BIAS_FOLD_RANGE[1]:
            continue
        base, c = x.scaled
        if not y.varies_n and _finite_over(y.code, c):
            return f"{base} {sign} {_divided(y.code, c, L)}", c
        if y.row_factor is not None and _finite_over(y.row_factor[0], c):
            f, b = y.row_factor
            return f"{base} {sign} ({_divided(f, c, L)}) * {b}", c
    return None


def _divided(code: str, c: float, L: Namespace = TL) -> str:
    """``code / c`` as the fold prints it, times ``1/c``. Where ``c < 1`` a finite value known only
    at run time can overflow there (a mask's ``(1 − m)·finfo.min`` over ``1/√d``: eager's
    ``s/√d + b`` stays finite): it is clamped to ±FLT_MAX, ±inf and NaN kept as they are, so the
    row stays finite as eager's does, leaves the multiply-add form's range and is computed again
    (SATURATION_LOG2). A literal is never clamped: ``_finite_over`` refuses one that overflows."""
    product = f"{code} * {1 / c!r}"
    if c >= 1 or _is_literal(code):
        return product
    clamped = f"{L.minimum}({L.maximum}({product}, {-FLT_MAX!r}), {FLT_MAX!r})"
    return f"{L.where}({L.abs}({code}) < float('inf'), {clamped}, {product})"


def _is_literal(code: str) -> bool:
    try:
        _literal_value(code)
    except ValueError:
        return False
    return True



def _finite_over(code: str, c: float) -> bool:
    """Is ``code / c`` finite in fp32 where ``code`` is a literal (a mask's ``finfo.min`` factor
    would overflow, and ``-inf · 0`` is NaN)? A value computed at run time may overflow too; the
    row it reaches then leaves the multiply-add form's range and is computed again (SATURATION_LOG2)."""
    return not _is_literal(code) or abs(_literal_value(code) / c) < FLT_MAX


# How each kind of rules.POSITIVE_SCALE carries ``(base, c)`` through an op: f(node, args,
# past_adds, L), past_adds being options.fold_scale_add, L the printer's Namespace.
SCALE_CARRIERS = {
    "times": lambda node, a, _, L: _times(a[0], _positive_literal(a[1])) or _times(a[1], _positive_literal(a[0])),
    "over": lambda node, a, _, L: (_over(a[0], _positive_literal(a[1]))
                                   if node.kwargs.get("rounding_mode") is None else None),
    "same": lambda node, a, _, L: a[0].scaled,
    "masked": lambda node, a, _, L: _masked(node, a, L),
    "plus": lambda node, a, past_adds, L: _plus(node, a, "+", past_adds, L),
    "minus": lambda node, a, past_adds, L: _plus(node, a, "-", past_adds, L),
}


def _positive_scale(p, node: fx.Node, args: list, past_adds: bool, L: Namespace = TL) -> tuple | None:
    """``(base, c)`` with the op's result ``= c · base``, ``c > 0`` a constant, when ``p`` keeps a
    positive scale (rules.POSITIVE_SCALE); ``base`` is source, a name or an expression."""
    how = POSITIVE_SCALE.get(p)
    return SCALE_CARRIERS[how](node, args, past_adds, L) if how is not None else None


def _literal_bound(value) -> tuple | None:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= NARROW_LITERAL_LIMIT:
        return None
    return (0, abs(value))


def row_guard(value: fx.Node, empty: float) -> fx.Node | None:
    """The node ``where(value == empty, c, value)`` (``c`` a finite constant, not 0 where ``empty``
    is 0) where that guard is ``value``'s only use besides its test: the safe softmax of SDPA's math
    form, which replaces a fully masked row's maximum -inf by 0 and its sum 0 by 1. None otherwise."""
    def is_test(node) -> bool:
        return (isinstance(node, fx.Node) and packet(node.target) is aten.eq and node.args[0] is value
                and node.args[1] == empty)

    def is_guard(node) -> bool:
        if packet(node.target) is not aten.where or len(node.args) != 3:
            return False
        test, fill, kept = node.args
        c = constant_value(fill, None)
        return kept is value and is_test(test) and c is not None and math.isfinite(c) and (c != 0 or empty != 0)

    users = list(value.users)
    guards = [u for u in users if is_guard(u)]
    if len(guards) != 1 or not all(u in guards or (is_test(u) and set(u.users) <= set(guards)) for u in users):
        return None
    return guards[0]


def _neg_inf_guarded(row_max: fx.Node) -> bool:
    """Does the region replace the row maximum's -inf by a finite constant before any other use
    (``row_guard``)? A row that saw only -inf scores then gives eager ``exp(-inf − c) = 0`` for every
    score, the zeros the kernel's clamped offset gives (OFFSET_GUARD): the row needs no repair."""
    return row_guard(row_max, float("-inf")) is not None


def _scaled(name: str, operand, L: Namespace = TL) -> list:
    """Lines that apply an operand's scalar scale to its loaded tile ``name``: computed in fp32
    and rounded back to the tile's dtype, as eager's ``x * c`` rounds."""
    ops = {"mul": "*", "div": "/"}
    return [f"{name} = ({name}.to({L.float32}) {ops[op]} {literal(float(c))}).to({name}.dtype)"
            for op, c in operand.scale]


def _memory_order(val: torch.Tensor) -> tuple:
    """Axes of ``val`` from the largest stride to the smallest: eager's layout of the result.
    Strides are read by their example values (_size_hint): a guard on them would specialize
    torch.compile's dynamic sizes (the Evoformer recompiled at every length), and a dense
    tensor's axis order does not change with its sizes. A stride without one sorts first, ties in
    axis order."""
    strides = val.stride()
    return tuple(sorted(range(val.dim()), key=lambda a: (-_size_hint(strides[a], sys.maxsize), a)))


def deferred_constant(p: Value, v_dtype: torch.dtype) -> tuple[str, float]:
    """``(base, c)`` for a term ``P = c·base`` of the consumer contraction, ``c`` a positive
    constant (Value.scaled): ``Σ (c·base)·V = c·Σ base·V``, so ``base`` goes into the dot and
    ``c`` multiplies the finished accumulator (one multiply per score less: the λ of
    differential attention, ReLU attention's ``1/N``). ``(p.code, 1.0)`` otherwise, and for fp16
    with ``c < 1``, where ``base`` could exceed fp16's range when cast for the dot while
    ``c·base`` would not."""
    if p.scaled is None:
        return p.code, 1.0
    base, c = p.scaled
    if v_dtype == torch.float16 and c < 1:
        return p.code, 1.0
    return base, c


def _dot(a: str, b: str, dtype: torch.dtype, acc: str = "", interpreter: bool = False) -> str:
    """``tl.dot`` of tiles of ``dtype``. Triton's ``interpreter`` multiplies bf16 tiles wrongly (errors
    of 10⁸ on unit inputs, Triton 3.6–3.9), so there both are widened to fp32 first: the same
    exact products and fp32 sums as a GPU's bf16 dot."""
    if interpreter and dtype is torch.bfloat16:
        a, b, dtype = f"{a}.to(tl.float32)", f"{b}.to(tl.float32)", torch.float32
    return f"tl.dot({a}, {b}{', ' + acc if acc else ''}{_dot_precision(dtype)})"


def _dot_precision(dtype: torch.dtype) -> str:
    if dtype is not torch.float32:
        return ""
    return ", input_precision='tf32'" if torch.backends.cuda.matmul.allow_tf32 else ", input_precision='ieee'"


# Tile configurations timed on GPUs (tuning.choose), by the larger head dim:
# (BLOCK_M, BLOCK_N, num_warps, num_stages). The 64-row tiles keep several programs per SM
# busy when each has only a few key tiles to visit (the Evoformer's 256 keys: 64×64 with 2
# stages at head dim 128 measured 12 % faster than the tuner's earlier pick,
# benchmarks/results/logs/probe_edits_H200.log; with 3 stages at head dim 64, 4 % for the
# Evoformer and 12 % for the document mask at 16k). 64×64 with 3 stages is faster at full clock
# for vanilla and causal too, but slower sustained (it draws more power per unit of work); the
# tuner's sustained runs pick 128×64 there (benchmarks/results/logs/probe_tuner_rest_H200.log).
TILE_CONFIGS = (
    (64, [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 4, 2), (64, 64, 4, 2), (64, 128, 4, 2),
          (64, 64, 4, 3)]),
    (128, [(128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 64, 4, 2)]),
    (256, [(64, 32, 4, 2), (64, 64, 4, 2), (32, 32, 4, 2)]),
)


# Shared memory per program, (streams·BLOCK_M·D + stages·BLOCK_N·(streams·D + Dv)) · bytes, times a
# slack for Triton's own buffers. The default tile (the first candidate, launched untimed where
# tuning is off) keeps a wide margin; further candidates need only fit a tight one: a tile
# that then does not compile is recorded by the tuner and skipped. (128×64 tiles, 8 warps,
# 3 stages for differential attention's halves of Dv = 256: 208 KB by the formula, compiles
# on an H200 and is the fastest, benchmarks/results/logs/probe_edits_half_dv_H200.log.)
SHARED_MEMORY = {"default": (1.2, 220 * 1024), "further": (1.05, 227 * 1024)}  # (slack, bytes)


REGISTER_BUDGET = 128  # fp32 accumulator registers per thread before they spill


def tile_configs(d: int, dv: int, elem_bytes: int = 2, streams: int = 1, accumulators: int = 1) -> list:
    """Candidate tiles for head dims d, dv: each stream's Q tile once, its K tile and the V tile
    per pipeline stage must fit in shared memory (``SHARED_MEMORY``: the tiles that fit its
    default margin first, in table order, then those that fit only the tight one), and the
    ``accumulators`` [BLOCK_M, Dv] fp32 tiles in registers (8 warps where 4 would spill); the
    smallest tile if none fits."""
    size = max(d, dv)
    dp, dvp = pow2(d), pow2(dv)
    fitting: dict[str, list] = {margin: [] for margin in SHARED_MEMORY}
    for bm, bn, w, st in next(c for limit, c in TILE_CONFIGS if size <= limit):
        shared = (streams * bm * dp + st * bn * (streams * dp + dvp)) * elem_bytes
        if accumulators * bm * dvp > REGISTER_BUDGET * 32 * w:
            w = 8
        if accumulators * bm * dvp > REGISTER_BUDGET * 32 * w:
            continue
        margin = next((m for m, (slack, budget) in SHARED_MEMORY.items() if shared * slack <= budget), None)
        if margin is not None and all((bm, bn, w, st) not in tiles for tiles in fitting.values()):
            fitting[margin].append((bm, bn, w, st))
    return [tile for tiles in fitting.values() for tile in tiles] or [(32, 32, 4, 1)]


# fp32 accumulator columns (Σ over P·V terms of the Dv tile width) one program holds: above
# it, the output's Dv is split between programs, each recomputing the scores for its part.
# Differential attention at head dim 128 (two [BLOCK_M, 256] accumulators, which leave only
# 64-row, 2-stage tiles): split in two, its best tile 128×64/8 warps/3 stages is 12 % (512)
# to 21 % (16k) faster in total than the unsplit kernel (benchmarks/results/logs/
# probe_edits_half_dv_H200.log).
DV_SPLIT_COLUMNS = 256


def dv_split_of(region: Region) -> int:
    """Programs per row tile (``DV_SPLIT_COLUMNS``). Not split where a row of the output is
    needed whole in one program: an epilogue reduction over Dv (a per-head RMSNorm) or row
    values stored beside the output."""
    columns = len(region.terms) * pow2(region.Dv)
    whole_rows = region.side_outputs or any(packet(op.target) in OUTPUT_REDUCTIONS for op in region.output_ops)
    split = 1
    while not whole_rows and columns // split > DV_SPLIT_COLUMNS:
        split *= 2
    return split


def _elementwise_ops(program: TileProgram, region: Region, kinds: dict) -> list:
    """The FX nodes of the program's elementwise Maps of the region's own ops: those the kernel
    prints with PRINTERS or not at all. (A value from outside the region whose printer refuses is
    loaded instead, computed by eager: ``_Printer.outside``.)"""
    own = {n.name: n for n in region.nodes}
    return [own[op.name] for op in program.ops()
            if isinstance(op, Map) and op.name in own and kinds.get(own[op.name]) is OpKind.ELEMENTWISE]


def emit_kernel(region: Region, kinds: dict, name: str = "fxflash_region",
                options: KernelOptions | None = None, statistics: tuple | None = None,
                program: TileProgram | None = None) -> KernelPlan:
    """Print the Triton kernel of ``region`` (a plain ``@triton.jit`` function whose tile sizes
    are constexprs) and its candidate tile configurations, with the kernel settings ``options``
    (``config``'s now where None). ``statistics``: the (max, sum) nodes of the region's softmax
    whose row statistics the kernel stores after the row values (the training forward: two more
    fp32 rows, ``m`` and ``1/l``, then where ops follow P·V the output before them,
    ``KernelPlan.side_dtypes``), or () for a P that needs none (elementwise). ``program``: the
    region's tile program (``tile.lower``'s), lowered here where None. Raises Unprintable for an
    op with no printer."""
    options = options or kernel_options()
    elem_bytes = region.q.node.meta["val"].element_size()
    streams = region.split.count if region.split is not None else 1
    # further score contractions hold their Q' and K' tiles too: counted as a wider head dim
    d = region.D + sum(pow2(p.d) for p in region.partners)
    dv_split = dv_split_of(region)
    configs = tile_configs(d, pow2(region.Dv) // dv_split, elem_bytes, streams, len(region.terms))
    out_dtype = region.output.meta["val"].dtype
    printer = _Printer(region, name, options, dv_split)
    printer.statistics = statistics
    program = program or lower(region, kinds, PRINTERS, name)
    why = refusal(_elementwise_ops(program, region, kinds))
    if why is not None:   # decided before anything is printed
        raise Unprintable(why)
    plan = printer.build(program, kinds, out_dtype, configs)
    plan.flags, plan.fp_fusion, plan.options = printer.flags, printer.fma, options
    if not plan.flags and elem_bytes != 2:
        return plan  # eager's own form, and no Gluon kernel (16-bit inputs only) whose rows to repair
    # eager's form over every key tile (no tile summaries)
    dense = dataclasses.replace(region, tile_masks=[])
    repair = _Printer(dense, f"{name}_repair", dataclasses.replace(options, **EXACT_FORMS), dv_split)
    repair.two_pass, repair.flags_rows, repair.statistics = True, False, statistics
    repair.build(lower(dense, kinds, PRINTERS, f"{name}_repair"), kinds, out_dtype, configs)
    plan.source = printer.source(repair)
    # the repair kernel reads some of the plan's inputs (not the ids its tile summaries need): its
    # arguments refer to them by their place among the plan's
    if all(n in printer.inputs for n in repair.inputs) and all(n in printer.sym_nodes for n in repair.sym_nodes):
        plan.repair_args = tuple(reindexed(spec, printer.inputs, repair.inputs, printer.sym_nodes, repair.sym_nodes)
                                 for spec in repair.args)
    elif plan.flags:
        raise Unprintable("the repair kernel reads a tensor or size the kernel does not")
    return plan


__all__ = ["KernelPlan", "Unprintable", "block_dims_of", "emit_kernel"]
