"""The backward kernels of a fused region, printed from its backward tile programs.

``emit_backward`` prints one Triton module of kernels, each from one tile program of
``tile/backward.py``: the row statistics ``m`` and ``1/l`` (``lower_statistics``, launched only
after a forward that did not store them: KernelPlan.training does), Δ, dK and dV per key tile,
and dQ per row tile. The printer walks each program's
operations in order and prints them from a table (``_MAPS``); the values of the score chain
(its loads, index expressions and elementwise ops, named by the region's FX nodes) are printed
by the forward's value printer (``emit._Printer``), so a bias, a mask or a softcap is recomputed
exactly as the forward computes it, from the same inputs.

Layout: the operands Q, K, V and the score chain's inputs are read at their own strides, as in
the forward; O, dO, m, 1/l and Δ are contiguous ``[B·H, M, …]`` tensors the launch makes; dQ, dK and dV
are written to contiguous tensors ``[B·H, M|N, D|Dv]``, one per query head (a GQA group's
heads are summed by the backward of the user's own expand). These kernels use no atomics; a
fifth (``BackwardPlan.atomics``) replaces the last two where atomics are allowed, adding each
key tile's share of dQ to a zeroed fp32 ``dq_sum``; a sixth (``BackwardPlan.exact_delta``)
replaces Δ's where Δ is summed as P·dP over the key tiles (no fp32 O stored: config.exact_delta).
Each loop visits only the tiles that the region's -inf masks do not empty, by the masks'
intervals, as the forward does (``tile_range``).

Raises BackwardRefused where a program holds what the printer does not print, so the region's
backward recomputes it eagerly; the reason is reported by ``explain()``.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from ..analysis import OpKind
from ..tile import ir
from ..tile.backward import BackwardRefused, attention_output, elementwise_form, lower_backward, lower_statistics
from ..patterns.rules import LN2
from .emit import (COL, EXACT_FORMS, FLT_MAX, FULL_RUN_INIT, KEY_TILES, REDO_SCALE, ROW, SATURATION_LOG2, Value,
                   _Printer, _dot, _scaled, full_run_chunk, full_run_finish, module_source)
from .intervals import IntervalPrinter, NoInterval
from .backward_plan import BackwardKernel, BackwardPlan
from .plan import KernelPlan, reindexed
from .printers import TRITON_DTYPES, Unprintable, literal

# The programs' own tensors (the launch makes them, contiguous [B·H, M or N, columns]; the kernel
# parameter ``<name>_ptr``), by the name the programs give their tiles: name → (the tile's rows,
# its columns; None for a row value, one per row). Besides them, ``dg<j>``: the j-th input
# gradient stored per score tile, [B·H, M, N]; and ``held`` (int8, [B·H, M]) and ``held_heads``
# (int32, [B·H]): the rows and heads whose chain is taken in eager's rounding (held_block).
_OWN = {"m": ("rows", None), "inv_l": ("rows", None), "delta": ("rows", None), "do": ("rows", "DV"), "o": ("rows", "DV"),
        "dq": ("rows", "D"), "dk": ("keys", "D"), "dv": ("keys", "DV"), "dq_sum": ("rows", "D")}

# Elementwise ops of the backward programs on printed values: op → Triton format.
_MAPS = {
    "alias": "{0}", "neg": "(-{0})", "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
    "div": "({0} / {1})", "exp": "tl.exp({0})", "log": "tl.log({0})", "abs": "tl.abs({0})",
    "sign": "tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, 0.0))", "ge": "({0} >= {1})", "ne": "({0} != {1})",
    "rsub": "({1} - {0})",
    "where": "tl.where({0}, {1}, {2})",
    "tanh_backward": "({0} * (1.0 - {1} * {1}))",       # ATen's: d tanh = g·(1 − y²)
    "sigmoid_backward": "({0} * {1} * (1.0 - {1}))",   # d sigmoid = g·y·(1 − y)
    "threshold_backward": "tl.where({1} <= {2}, 0.0, {0})",  # ATen's: g where y > threshold
}

# The backward programs' own value names, printed as they are (``_Kernel.var``).
_FIXED_NAMES = {"p", "e", "x_minus_m", "dp", "dp_minus_delta", "dx", "ds", "do_o", "delta", "dv_acc", "dk_acc",
                "dq_acc", "dq_part", "dq_sum", "dq", "dk", "dv", "m", "l", "inv_l", "xs", "p_dp", "pdp_sum", "p_sum",
                "p_some", "p_norm", "p_ratio", "neg_m", "e_neg_m", "r_share", "p_total", "p_scaled"}

aten = torch.ops.aten
_VIEWS = {aten.expand.default, aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten.clone.default, aten.alias.default}

class _ValuePrinter(_Printer):
    """The forward's value printer, placing every value it prints in the section being printed
    (``target``) rather than choosing by what the value varies along: in a program per key tile
    the rows vary inside the loop."""

    target: list

    def place(self, code: str, varies_n: bool, prefix="t") -> Value:
        name = self.tmp(prefix)
        self.target.append(f"{name} = {code}")
        self.defined[name] = (self.target, len(self.target) - 1)
        return Value(name, varies_n)


class _Kernel:
    """Prints one tile program as one ``@triton.jit`` function."""

    def __init__(self, region, kinds, options, program: ir.TileProgram, held: bool = False):
        self.r, self.program = region, program
        self.held = held          # rows the forward computed in eager's 16-bit rounding take the chain so (held_block)
        self.chain_ops: list = []  # the score chain's ops in the loop, in order, and where the last one ends
        self.chain_end = None
        self.vp = _ValuePrinter(region, program.name, dataclasses.replace(options, **EXACT_FORMS))
        self.vp.begin(kinds)
        self.nodes = {n.name: n for n in region.frame.graph.nodes}
        self.chain = {n.name for n in region.nodes} | {region.frame.name}
        self.values: dict = {}   # IR name → (code, dtype of the tile: a torch dtype, or None for fp32)
        self.transposed: set = set()  # names whose variable holds the tile's transpose
        self.own: list = []
        self.renamed: dict = {}   # IR value name → printed variable (``var``)
        self.input_grads: list = []   # the inputs whose gradient tiles it stores (Store "scores")
        self.valid_at = 0             # the index of the loop body's ``valid`` line (full_loop)
        self.operands = {"q": region.q, "k": region.k, "v": region.v}  # by the programs' names of their tiles
        self.redo: set = set()          # the accumulators summed again where they overflowed (constexpr REDO)
        self.redo_values: set = set()   # … and the values computed from them after the loop

    # -- values --------------------------------------------------------------------------
    def ref(self, a) -> str:
        if not isinstance(a, str):
            return literal(a)
        if a in self.values:   # elementwise math in fp32, as the forward's (a loaded tile widened)
            code, dtype = self.values[a]
            return code if dtype in (None, torch.float32) else f"{code}.to(tl.float32)"
        node = self.nodes.get(a)
        if node is None:
            raise BackwardRefused(f"{self.program.name}: the value {a} is not printed")
        return self.vp.arg(node, self.vp.frame_idx).code

    def var(self, name: str) -> str:
        """The variable of the program's value ``name``: the programs name values by the FX nodes
        they come from (``d_div_3_from_where_3``), which differ between identical layers; printed
        as ``g<i>`` in order of first appearance, so that identical regions print one source (one
        compilation, one tuning). The programs' own names (``p``, ``ds``, ``dk_acc``) stay."""
        if name in _FIXED_NAMES:
            return name
        return self.renamed.setdefault(name, f"g{len(self.renamed)}")

    def own_param(self, name: str) -> str:
        if name not in self.own:
            self.own.append(name)
        return f"{name}_ptr"

    # -- operations ----------------------------------------------------------------------
    def load(self, op: ir.Load, out: list) -> None:
        vp = self.vp
        if op.name in _OWN:
            _, cols = _OWN[op.name]
            ptr = self.own_param(op.name)
            if cols is None:   # a row value, [BM, 1]
                out.append(f"{op.name} = tl.load({ptr} + lin.to(tl.int64) * M + {ROW}, mask={ROW} < M, other=0.0)")
                self.values[op.name] = (op.name, None)
            else:
                out.append(f"{op.name} = tl.load({ptr} + (lin.to(tl.int64) * M + {ROW}) * {cols} + offs_dv[None, :], "
                           f"mask=({ROW} < M) & (offs_dv[None, :] < {cols}), other=0.0)")
                self.values[op.name] = (op.name, self.out_dtype)
            return
        operand = self.operands.get(op.name) if op.cols is not None else None
        if operand is None:
            return  # a score-chain input: printed where a value reads it (the value printer)
        rows = ROW if op.tile == "rows" else "offs_n[:, None]"
        if op.name == "k":       # Kᵀ [D, BN], as the forward reads it
            (ptr,), mask = vp.operand("k", operand, "offs_d[:, None]", COL, "offs_d[:, None] < D", "col_ok")
            self.transposed.add("k")
        elif op.name == "q":
            (ptr,), mask = vp.operand("q", operand, ROW, "offs_d[None, :]", f"{ROW} < M", "offs_d[None, :] < D")
        else:                    # V [BN, Dv]
            (ptr,), mask = vp.operand("v", operand, rows, "offs_dv[None, :]", "offs_n[:, None] < N",
                                      "offs_dv[None, :] < DV")
        out.append(f"{op.name} = tl.load({ptr}, mask={mask}, other=0.0)")
        out.extend(_scaled(op.name, operand))
        self.values[op.name] = (op.name, operand.node.meta["val"].dtype)

    def tile(self, name: str, transpose: bool) -> tuple[str, object]:
        """The variable of tile ``name`` as its logical tile (or its transpose), and its dtype."""
        code, dtype = self.values[name]
        if (name in self.transposed) != transpose:
            code = f"tl.trans({code})"
        return code, dtype

    def dot(self, a: tuple, b: tuple, acc: str = "") -> str:
        """``a · b`` of two printed tiles: a value computed in fp32 (P, dS: dtype None) is rounded
        to the other operand's dtype, as FlashAttention's backward does."""
        (ca, da), (cb, db) = a, b
        dtype = da or db or torch.float32
        if self.vp.options.interpreter and dtype is torch.bfloat16:
            # the interpreter's bf16 conversions go wrong (emit._dot): the fp32 dot of the
            # widened tiles, the same products, P and dS unrounded
            ca, cb = (c if d is None else f"{c}.to(tl.float32)" for c, d in ((ca, da), (cb, db)))
            return _dot(ca, cb, torch.float32, acc, True)
        ca = ca if da is dtype else f"{ca}.to({TRITON_DTYPES[dtype]})"
        cb = cb if db is dtype else f"{cb}.to({TRITON_DTYPES[dtype]})"
        return _dot(ca, cb, dtype, acc, self.vp.options.interpreter)

    def op(self, op, out: list) -> None:
        vp = self.vp
        vp.target = out
        if isinstance(op, ir.Load):
            self.load(op, out)
        elif isinstance(op, ir.Index):
            return  # printed where a value reads it
        elif isinstance(op, ir.Dot):   # name = a · bᵀ
            out.append(f"{self.var(op.name)} = {self.dot(self.tile(op.a, False), self.tile(op.b, True))}")
            self.values[op.name] = (self.var(op.name), None)
            if op.name == self.r.frame.name:
                vp.vars[self.r.frame] = Value(self.var(op.name), True)
                self.chain_op(op, out)
        elif isinstance(op, ir.Map) and op.form == "binds":   # a region node's value, the program's
            self.map(op, out)
            vp.vars[self.nodes[op.name]] = Value(self.values[op.name][0], False)
        elif isinstance(op, ir.Map) and op.name in self.chain and op.name in self.nodes:
            node = self.nodes[op.name]
            if node.target in _VIEWS and node.args[0] in vp.vars:   # a view in the score frame
                vp.vars[node] = vp.vars[node.args[0]]
            else:
                value = vp.apply(node, [vp.arg(a, vp.node_idx(node)) for a in node.args])
                if self.held and not value.code.isidentifier() and not value.is_literal:
                    # a variable the held block can select into
                    out.append(f"{self.var(op.name)} = {value.code}")
                    value = dataclasses.replace(value, code=self.var(op.name))
                vp.vars[node] = value
            self.values[op.name] = (vp.vars[node].code, None)
            self.chain_op(op, out)
        elif isinstance(op, ir.Map) and op.name in self.nodes and self.nodes[op.name].op == "call_function":
            return  # a value from outside the region that the kernel computes: printed where read
        elif isinstance(op, ir.Map):
            self.map(op, out)
        elif isinstance(op, ir.RowReduce):
            self.row_reduce(op, out)
        elif isinstance(op, ir.Accumulate) and _holds_transpose(op):   # accᵀ += vᵀ · p
            acc = self.var(op.acc)
            p = self.redo_scaled(op, out)
            out.append(f"{acc} = {self.dot(self.tile(op.v, True), self.tile(p, False), acc)}")
            self.values[op.acc] = (f"tl.trans({acc})", None)
        elif isinstance(op, ir.Accumulate):
            p = self.tile(self.redo_scaled(op, out), op.transposed)
            out.append(f"{self.var(op.acc)} = {self.dot(p, self.tile(op.v, False), '' if op.fresh else self.var(op.acc))}")
            self.values[op.acc] = (self.var(op.acc), None)
        elif isinstance(op, ir.SkipIf):
            return  # the loop's range (tile_range)
        elif isinstance(op, ir.Store):
            self.store(op, out)
        else:
            raise BackwardRefused(f"{self.program.name}: {type(op).__name__} is not printed")

    def redo_scaled(self, op: ir.Accumulate, out: list) -> str:
        """The name of the tile ``op`` sums: ``p`` itself, or for an unbounded ``p``
        (``Accumulate.unbounded``) over a V-side tile that is not fp16, ``p·2⁻⁶⁴`` in the REDO
        launch. A power of two scales exactly; an fp16 product is below 2³² and no fp32 sum of
        them overflows."""
        code, dtype = self.values[op.p]
        if not op.unbounded or self.values[op.v][1] is torch.float16 or not code.isidentifier():
            return op.p
        self.redo.add(op.acc)
        low = f"{code}_redo"
        out += ["if REDO:", f"    {low} = {code} * {REDO_SCALE ** -1!r}", "else:", f"    {low} = {code}"]
        self.values[low] = (low, dtype)
        if op.p in self.transposed:
            self.transposed.add(low)
        return low

    def map(self, op: ir.Map, out: list) -> None:
        if op.op == "sum" and len(op.args) == 2 and op.args[1] == -1:   # a row sum, [BM, 1]
            code = f"tl.sum({self.ref(op.args[0])}, 1)[:, None]"
        elif op.op in _MAPS:
            code = _MAPS[op.op].format(*(self.ref(a) for a in op.args))
        else:
            raise BackwardRefused(f"{self.program.name}: no printer for the backward op {op.op}")
        if op.name in ("p", "ds"):   # rows and keys outside the frame hold no probability
            code = f"tl.where(valid, {code}, 0.0)"
        out.append(f"{self.var(op.name)} = {code}")
        self.values[op.name] = (self.var(op.name), None)

    def row_reduce(self, op: ir.RowReduce, out: list) -> None:
        """The statistics program's online max and sum (``e`` is printed against the running
        maximum, clamped so that a row that has seen only -inf subtracts a finite value)."""
        if op.combine == "max":
            x = self.ref(op.source)
            out += [f"xs = tl.where(valid, {x}, float('-inf'))",
                    "new_m = tl.maximum(m, tl.max(xs, 1)[:, None])",
                    f"mg = tl.maximum(new_m, {-FLT_MAX!r})", "alpha = tl.exp(m - mg)", "m = new_m"]
            self.values["m"] = ("mg", None)
        elif op.combine == "sum":   # rescaled as the running maximum grows, or a plain sum (retention's, Δ's)
            acc = self.var(op.name)
            rescale = f"{acc} * alpha" if op.rescaled_by == "m" else acc
            out.append(f"{acc} = {rescale} + tl.sum(tl.where(valid, {self.ref(op.source)}, 0.0), 1)[:, None]")
            self.values[op.name] = (acc, None)
        else:
            raise BackwardRefused(f"{self.program.name}: the row reduction {op}")

    def store(self, op: ir.Store, out: list) -> None:
        """A Store's lines; in a program with REDO launches, the value from an accumulator summed
        again is stored where the first launch's is not finite, and every other store is the first
        launch's alone."""
        lines: list = []
        self.store_lines(op, lines)
        if not self.redo:
            out += lines
        elif op.value in self.redo_values:
            own = op.value
            address, mask = self.address(own)
            out += ["if REDO:", f"    tl.store({address}, tl.where(tl.abs(first_{own}) < float('inf'), first_{own}, "
                    f"{self.ref(op.value)}), mask={mask})", "else:", *("    " + line for line in lines)]
        else:
            out += ["if not REDO:", *("    " + line for line in lines)]

    def address(self, own: str, lin: str = "lin") -> tuple[str, str]:
        """(address, mask) of this program's tile of its own tensor ``own`` (``_OWN``), a tile of
        rows or keys by D or Dv, in the batch item ``lin``."""
        tile, cols = _OWN[own]
        rows, size = (ROW, "M") if tile == "rows" else ("offs_n[:, None]", "N")
        offs = "offs_d" if cols == "D" else "offs_dv"
        return (f"{self.own_param(own)} + ({lin}.to(tl.int64) * {size} + {rows}) * {cols} + {offs}[None, :]",
                f"({rows} < {size}) & ({offs}[None, :] < {cols})")

    def redo_check(self, lin: str) -> list[str]:
        """The REDO launch's first lines: each stored tile summed again, as the first launch left
        it, and a return unless one of its values is not finite."""
        lines, bad = ["if REDO:"], []
        for own in sorted(self.redo_values & set(_OWN)):
            address, mask = self.address(own, lin)
            lines.append(f"    first_{own} = tl.load({address}, mask={mask}, other=0.0).to(tl.float32)")
            bad.append(f"~(tl.abs(first_{own}) < float('inf'))")
        return [*lines, f"    if tl.max(({' | '.join(bad)}).to(tl.int32)) == 0:", "        return"]

    def store_lines(self, op: ir.Store, out: list) -> None:
        if op.tile == "scores":   # an input's gradient tile, written where the launch asks for it
            name = f"dg{len(self.input_grads)}"
            self.input_grads.append(op.tensor[1:])   # "d<input>"
            self.own.append(name)
            value = self.ref(op.value)
            store = (f"tl.store({name}_ptr + (lin.to(tl.int64) * M + {ROW}) * N + {COL}, {value}, mask=valid)")
            added = self.added_gradient(self.nodes[op.tensor[1:]], value)
            if added is None:
                out.append(f"if STORE_DG: {store}")
            else:   # ADD_DG: added into the input's own gradient, else the tile stored whole
                self.own.append(f"dga{len(self.input_grads) - 1}")
                out += ["if ADD_DG:", f"    {added}", "elif STORE_DG:", f"    {store}"]
            return
        # a row value goes to the tensor the Store names (the quiet softmax's c to ``m``); a
        # gradient tile to the program's own tensor of its value's name (``dk``: ``dk_ptr``)
        own = op.tensor if op.tile == "row values" else op.value
        tile, cols = _OWN[own]
        ptr = self.own_param(own)
        value = self.ref(op.value)
        if cols is None and own == "m" and self.held and self.r.q.math_dtype in SATURATION_LOG2:
            # computed here from the fp32 chain, a row whose maximum leaves the forward's multiply-add
            # range is marked (+inf) as the forward's repair kernel marks it; the REPAIRED_ONLY launch
            # then computes it in eager's rounding (held_block)
            bound = SATURATION_LOG2[self.r.q.math_dtype] * LN2
            out += [f"m_out = {value}", "if not REPAIRED_ONLY:",
                    f"    m_out = tl.where(~(tl.abs(m_out) < {bound!r}), float('inf'), m_out)"]
            value = "m_out"
        if cols is None:
            out.append(f"tl.store({ptr} + lin.to(tl.int64) * M + {ROW}, {value}, mask={ROW} < M)")
            return
        address, mask = self.address(own)
        # a partial sum (op.add) goes to an fp32 tensor the launch zeroes; relaxed: only the sum matters
        store, sem = ("tl.atomic_add", ", sem='relaxed'") if op.add else ("tl.store", "")
        out.append(f"{store}({address}, {value}, mask={mask}{sem})")

    def added_gradient(self, node: fx.Node, value: str) -> str | None:
        """The atomic add of this tile's gradient of the input ``node`` into ``dga<j>``, an fp32
        tensor of the input's own shape (dense, zeroed by the launch) at the tile's places in it:
        the input's index expressions with that tensor's strides (``dense_stride``), so the tiles
        of every batch item the input broadcasts over add into one place (the Evoformer's pair
        bias over its N_seq rows) and no [B·H, M, N] tile per item is kept. None for a value the
        kernel computes rather than loads (its tile goes through the ops computing it)."""
        vp = self.vp
        idx = vp.idx_of(node, vp.frame_idx)
        if vp.kinds.get(node) is OpKind.INDEX or vp.outside_values.computed(node) or vp.vector_producer(node, idx):
            return None
        i = vp.tensor_input(node)
        terms = []
        for axis, e in enumerate(idx):
            if e is None:
                continue
            stride = f"in{i}_g{axis}"
            if stride not in vp.params:
                vp.param(stride, ("dense_stride", i, axis))
            terms.append(f"({e}).to(tl.int64) * {stride}" if e.startswith("fb") else f"({e}) * {stride}")
        # an input constant along the tile's rows or keys (a key mask's bias, [B, 1, 1, N]) takes
        # the tile's sum along them
        value, used = f"tl.where(valid, {value}, 0.0)", {e for e in idx if e}
        masks = {ROW: f"({ROW} < M)", COL: "col_ok"}
        if used & {ROW, COL}:
            for axis, index in ((0, ROW), (1, COL)):
                if index not in used:
                    value = f"tl.sum({value}, {axis}, keep_dims=True)"
        else:   # one value per batch item (a temperature) at a scalar address: the tile's sum, a scalar
            value = f"tl.sum(tl.sum({value}, 1), 0)"
        mask = " & ".join(masks[index] for index in (ROW, COL) if index in used) or None
        j = len(self.input_grads) - 1
        return (f"tl.atomic_add(dga{j}_ptr + {' + '.join(terms) or '0'}, {value}"
                + (f", mask={mask}" if mask else "") + ", sem='relaxed')")

    def tile_range(self, prog: ir.TileProgram) -> list | None:
        """Lines that bound the loop to ``[lo_t, hi_t)``: the tiles it visits outside that range are
        empty under one of the program's skip masks on every score of this program's tile, by the
        masks' intervals (codegen/intervals.py), a chunk of tiles at a time. None where a mask has
        no interval; then every tile is visited, the masks applied. Over row tiles (a program per
        key tile) only masks computed from indices alone are bounded: the interval printer reads
        ids one row tile at a time."""
        if not prog.skips:
            return None
        vp, over_keys = self.vp, prog.loop == "key"
        axis = COL if over_keys else ROW
        ranges = {ROW: ("m_lo", "m_hi"), COL: ("n_lo", "n_hi")}
        ranges.update({f"fb{i}": (f"fb{i}", f"fb{i}") for i in range(len(vp.frame_shape) - 2)})
        ip = IntervalPrinter(vp, ranges, KEY_TILES, axis)
        empty = []
        full = []
        for skip in prog.skips:
            node = self.nodes[skip.condition]
            if not over_keys and not _from_indices(node, vp.kinds):
                return None
            try:
                iv = ip.of(node, vp.idx_of(node, vp.frame_idx))
            except (NoInterval, Unprintable):
                return None
            if not iv.is_bool:
                return None
            empty.append(f"({iv.must})" if skip.masked_when else f"(~({iv.may}))")
            full.append(f"(~({iv.may}))" if skip.masked_when else f"({iv.must})")
        # over row tiles every line is computed per chunk: the interval printer takes the row
        # tile's bounds for constants of its own (a remainder's range, broadcast from ``m_lo``)
        once, varying = ip.split_lines() if over_keys else ([], ip.lines)
        own, (lo, hi, block, size) = ((["m_lo = mt * BLOCK_M", "m_hi = tl.minimum(m_lo + BLOCK_M, M) - 1"],
                                       ("n_lo", "n_hi", "BLOCK_N", "N")) if over_keys else
                                      (["n_lo = nt * BLOCK_N", "n_hi = tl.minimum(n_lo + BLOCK_N, N) - 1"],
                                       ("m_lo", "m_hi", "BLOCK_M", "M")))
        t, scan = KEY_TILES, 4 if self.vp.options.interpreter else 128   # small chunks: the tests' few tiles cross several
        chunk = [f"{t} = c0 + tl.arange(0, {scan})", f"{lo} = {t} * {block}",
                 f"{hi} = tl.minimum({lo} + {block}, {size}) - 1", *varying,
                 f"live = ({t} < n_tiles) & ~({' | '.join(empty)})",
                 f"lo_t = tl.minimum(lo_t, tl.min(tl.where(live, {t}, n_tiles), 0))",
                 f"hi_t = tl.maximum(hi_t, tl.max(tl.where(live, {t} + 1, 0), 0))"]
        # the whole tiles where every skip mask keeps every score: one run [f_lo, f_hi) visited
        # with the masks folded away (full_loop), found as the forward's
        chunk += full_run_chunk(t, f"{size} // {block}", " & ".join(full))
        return [*own, *once, f"n_tiles = tl.cdiv({size}, {block}).to(tl.int32)", "lo_t = n_tiles",
                "hi_t = n_tiles * 0", *FULL_RUN_INIT, f"for c0 in range(0, n_tiles, {scan}):",
                *("    " + line for line in chunk), "hi_t = tl.maximum(hi_t, lo_t)", *full_run_finish()]

    def full_loop(self, loop: list, over_keys: bool) -> list | None:
        """The loop body for a full tile: each skip mask's condition bound to the constant it is
        there (its line, recorded where the value printer placed it, printed again: Triton folds
        its ``where`` away, and the index arithmetic that fed it), and ``valid`` only the
        program's own tile's bound (the loop's tile is whole). None where a condition is not a
        line of the loop."""
        body = list(loop)
        for skip in self.program.skips:
            codes = self.vp.mask_conds.get(self.nodes[skip.condition], ())  # emit's mask_conds
            if not codes:
                return None
            for code in codes:
                section, at = self.vp.defined.get(code, (None, None))
                if section is not loop:
                    return None
                body[at] = f"{code} = {self.vp.constant_mask(0 if skip.masked_when else 1)}"
        body[self.valid_at] = f"valid = {ROW} < M" if over_keys else "valid = col_ok"
        return body

    def chain_op(self, op, out: list) -> None:
        """Record a score-chain op printed into ``out`` (held_block prints the chain again)."""
        self.chain_ops.append(op)
        self.chain_end = (out, len(out))

    def held_block(self) -> list[str]:
        """The score chain printed again as eager holds it (each 16-bit value rounded to its dtype,
        ``_Printer.held``, as the forward's repair kernel computes), then each chain value selected
        from it on the rows ``held_row`` marks: a row the forward's repair kernel computed so (its
        maximum past the multiply-add form's range, ``emit.SATURATION_LOG2``) takes P from eager's
        rounding, where ``65504 + b`` is 65504 and fp32 would keep the keys apart. Printed on the
        value printer with its state restored after, so that what it placed inside the block (run
        only for heads that hold such a row) is not read outside it. A value from outside the
        region (a bias, one the kernel computes) is read as the loop read it."""
        vp = self.vp
        saved = (dict(vp.vars), dict(vp.memo), {k: set(v) for k, v in vp.mask_conds.items()}, dict(vp.defined))
        lines: list = []
        vp.target, vp.two_pass = lines, True
        try:
            for op in self.chain_ops:
                if isinstance(op, ir.Dot):   # the scores, rounded to their dtype as eager's matmul leaves them
                    vp.vars[self.r.frame] = vp.place(vp.held(self.var(op.name), self.r.frame), True, "h")
                    continue
                node = self.nodes[op.name]
                if node.target in _VIEWS and node.args[0] in vp.vars:
                    vp.vars[node] = vp.vars[node.args[0]]
                else:
                    vp.vars[node] = vp.apply(node, [vp.arg(a, vp.node_idx(node)) for a in node.args])
            held = {node: vp.vars[node].code for node in saved[0]}
        finally:
            vp.two_pass = False
            vp.vars, vp.memo, vp.mask_conds, vp.defined = saved
        for op in self.chain_ops:
            node = self.nodes.get(op.name)
            code = vp.vars[node].code if node in vp.vars else None
            if code is not None and code.isidentifier() and held[node] != code:
                lines.append(f"{code} = tl.where(held_row, {held[node]}, {code})")
        return lines

    # -- the function --------------------------------------------------------------------
    def print(self, out_dtype) -> BackwardKernel:
        prog, vp = self.program, self.vp
        self.out_dtype = out_dtype
        fb = len(vp.frame_shape) - 2
        tiles, size, index = ("n_mt", "M", "mt") if prog.per == "row" else ("n_nt", "N", "nt")
        block = "BLOCK_M" if prog.per == "row" else "BLOCK_N"
        # the batch index ``lin`` of the program's scores; a grouped program (per key tile of a K/V
        # head, ``lin_kv``) visits the GROUP query heads of its head, G_INNER batch items apart
        group = prog.group
        head = ["pid = tl.program_id(0)", f"{tiles} = tl.cdiv({size}, {block})", f"{index} = pid % {tiles}",
                f"{'lin_kv' if group else 'lin'} = pid // {tiles}"]
        batch = ["rest = lin"]
        for i in reversed(range(fb)):
            batch += [f"fb{i} = rest % FB{i}", f"rest = rest // FB{i}"]
        if group:
            batch.insert(0, "lin = (lin_kv // G_INNER) * (GROUP * G_INNER) + qh * G_INNER + lin_kv % G_INNER")
        else:
            head += batch
        head += ["offs_d = tl.arange(0, DP)", "offs_dv = tl.arange(0, DVP)"]
        if prog.per == "row":
            head += ["offs_m = mt * BLOCK_M + tl.arange(0, BLOCK_M)", f"{ROW} = offs_m[:, None]"]
        else:
            head += ["offs_n = nt * BLOCK_N + tl.arange(0, BLOCK_N)", f"{COL} = offs_n[None, :]",
                     f"col_ok = {COL} < N"]
        pre: list = []
        # the statistics program: the one that stores m
        statistics = any(op.tile == "row values" and op.tensor == "m" for op in prog.stores)
        if statistics:
            # with REPAIRED_ONLY, only the row tiles holding a marked row compute theirs, the others
            # keep the forward's: a row the forward's repair kernel marked (m = +inf: emit's
            # statistics), or a row every key masks (1/l not finite: eager's P row is NaN at every
            # key, and so is every key's dV, which skipping the row's tiles would leave finite)
            head += ["if REPAIRED_ONLY:",
                     f"    marked = tl.load(m_ptr + lin.to(tl.int64) * M + {ROW}, mask={ROW} < M, other=0.0)",
                     f"    stored_inv_l = tl.load(inv_l_ptr + lin.to(tl.int64) * M + {ROW}, mask={ROW} < M, other=1.0)",
                     "    held_row = (marked == float('inf')) | ~(stored_inv_l < float('inf'))",
                     *([f"    tl.store(held_ptr + lin.to(tl.int64) * M + {ROW}, held_row.to(tl.int8), mask={ROW} < M)"]
                       if self.held else []),
                     "    if tl.max(held_row.to(tl.int32)) == 0:",
                     "        return",
                     *(["    tl.store(held_heads_ptr + lin, 1)"] if self.held else [])]
            self.own_param("m")
            self.own_param("inv_l")
            if self.held:
                self.own_param("held")
                self.own_param("held_heads")
        for op in prog.body:
            if isinstance(op, ir.RowReduce):
                pre.append(f"{self.var(op.name)} = tl.full([BLOCK_M, 1], float('-inf'), tl.float32)"
                           if op.combine == "max" else f"{self.var(op.name)} = tl.zeros([BLOCK_M, 1], tl.float32)")
            elif isinstance(op, ir.Accumulate):
                rows = "BLOCK_N" if op.transposed else "BLOCK_M"
                cols = "DVP" if op.v in ("do", "o") else "DP"
                rows, cols = (cols, rows) if _holds_transpose(op) else (rows, cols)
                pre.append(f"{self.var(op.acc)} = tl.zeros([{rows}, {cols}], tl.float32)")
        inits = pre if group else []   # a grouped program's accumulators sum over the whole group
        if group:
            pre = []
        for op in prog.prologue:
            self.op(op, pre)
        loop: list = []
        if prog.loop == "key":
            loop += ["offs_n = start_n + tl.arange(0, BLOCK_N)", f"{COL} = offs_n[None, :]", f"col_ok = {COL} < N"]
        elif prog.loop == "row":
            loop += ["offs_m = start_m + tl.arange(0, BLOCK_M)", f"{ROW} = offs_m[:, None]"]
        if prog.loop:
            self.valid_at = len(loop)   # the line full_loop prints again
            loop.append(f"valid = ({ROW} < M) & col_ok")
        self.chain_ops, self.chain_end = [], None   # the chain's ops in the loop (not the prologue's, the epilogue's)
        for op in prog.body:
            self.op(op, loop)
        held = self.held and prog.loop and self.chain_end is not None and self.chain_end[0] is loop
        if held:
            block, at = self.held_block(), self.chain_end[1]
        if held and not statistics:   # the heads and rows the statistics kernel marked (held_block)
            self.own_param("held")
            head += self.held_gate(group)
        post: list = []
        for op in prog.body:   # a transposed accumulator, transposed back once after the loop
            if isinstance(op, ir.Accumulate) and _holds_transpose(op):
                post.append(f"{self.var(op.acc)} = tl.trans({self.var(op.acc)})")
                self.values[op.acc] = (self.var(op.acc), None)
        self.redo_values = set(self.redo)
        for acc in sorted(self.redo):   # the REDO launch's sums, scaled back
            post += ["if REDO:", f"    {self.var(acc)} = {self.var(acc)} * {REDO_SCALE!r}"]
        for op in prog.epilogue:
            if any(isinstance(a, str) and a in self.redo_values for a in getattr(op, "args", ())):
                self.redo_values.add(op.name)
        if prog.loop == "key" and "m" in self.values:
            self.values["m"] = ("m", None)   # the finished maximum
        for op in (*prog.epilogue, *prog.stores):
            self.op(op, post)
        ranged = self.tile_range(prog) if prog.loop else None
        body = (batch if group else []) + vp.pre + pre + (ranged or [])
        full = None
        if prog.loop:
            start, stop, step = ("start_n", "N", "BLOCK_N") if prog.loop == "key" else ("start_m", "M", "BLOCK_M")
            full = self.full_loop(loop, prog.loop == "key") if ranged else None
            if full is None:   # [lo_t, hi_t), or every tile
                runs = [((f"lo_t * {step}", f"hi_t * {step}") if ranged else ("0", stop), loop)]
            else:              # masked, full (masks folded), masked
                runs = [((f"lo_t * {step}", f"f_lo * {step}"), loop), ((f"f_lo * {step}", f"f_hi * {step}"), full),
                        ((f"f_hi * {step}", f"hi_t * {step}"), loop)]

            def loops(block: list | None, runs=runs) -> list[str]:
                """The loops, ``block`` after the chain's last op in each copy of the body."""
                lines = []
                for (lo, hi), run in runs:
                    run = run if block is None else [*run[:at], *block, *run[at:]]
                    lines += [f"for {start} in range({lo}, {hi}, {step}):", *("    " + line for line in run)]
                return lines

            # the rows in eager's rounding (the REPAIRED_ONLY launch's statistics, a HELD launch's
            # gradients) visit every tile, as the forward's repair kernel does: a finite fill after
            # a -inf mask (masked_fill(~keep, finfo.min)) gives keys in tiles the mask's ranges skip
            # their share of such a row
            every = [(("0", stop), loop)]
            row_flags = f"held_row = tl.load(held_ptr + lin.to(tl.int64) * M + {ROW}, mask={ROW} < M, other=0) != 0"
            if held:   # the loops printed twice, one of them compiled per launch (held_gate)
                flag, copy = ("REPAIRED_ONLY", block) if statistics else ("HELD", [row_flags, *block])
                body += [f"if {flag}:", *("    " + line for line in loops(copy, every)),
                         "else:", *("    " + line for line in loops(None))]
            else:
                body += loops(None)
        else:
            body += loop
        if self.redo:
            head += self.redo_check("lin_kv" if group else "lin")
        if group:   # every query head of the group, then the K/V head's own tiles stored
            body = [*head, *inits, "for qh in range(GROUP):", *("    " + line for line in body), "lin = lin_kv", *post]
        else:
            body = [*head, *body, *post]
        params = [*(f"{name}_ptr" for name in self.own), *vp.params, "BLOCK_M: tl.constexpr",
                  "BLOCK_N: tl.constexpr", "D: tl.constexpr", "DP: tl.constexpr", "DV: tl.constexpr",
                  "DVP: tl.constexpr", *(["STORE_DG: tl.constexpr"] if self.input_grads else []),
                  *(["ADD_DG: tl.constexpr"] if any(n.startswith("dga") for n in self.own) else []),
                  *(["REPAIRED_ONLY: tl.constexpr"] if statistics else []),
                  *(["HELD: tl.constexpr"] if held and not statistics else []),
                  *(["REDO: tl.constexpr"] if self.redo else []),
                  *(["GROUP: tl.constexpr", "G_INNER: tl.constexpr"] if group else [])]
        self.lines = ["@triton.jit", f"def {prog.name}({', '.join(params)}):", *("    " + line for line in body)]
        return BackwardKernel(prog.name, prog.per, tuple(self.own), list(vp.args), ranged=ranged is not None,
                              full_tiles=full is not None, input_grads=tuple(self.input_grads),
                              statistics=statistics, group=group, held=bool(held and not statistics),
                              redo=bool(self.redo))

    def held_gate(self, group: bool) -> list[str]:
        """The kernel is launched twice, once per value of the constexpr HELD, and each program
        returns at once unless its head holds a row in eager's rounding exactly when HELD does (a
        grouped program: any query head of its group). Each launch compiles one copy of the loops,
        so the heads with no such row, nearly all of them, run the loops as they were, in the
        registers those alone take: one kernel holding both copies spent 5–18 % of a training
        step (benchmarks/NOTES.md). In a head that holds such a row, the held loops select eager's
        rounding row by row, so its other rows, and its group's other heads, keep the fp32 chain."""
        flags = self.own_param("held_heads")
        if group:
            first = "(lin_kv // G_INNER) * (GROUP * G_INNER) + lin_kv % G_INNER"
            lines = [f"head_held = tl.load({flags} + {first})", "for qh in range(1, GROUP):",
                     f"    head_held += tl.load({flags} + {first} + qh * G_INNER)"]
        else:
            lines = [f"head_held = tl.load({flags} + lin)"]
        return [*lines, "if HELD:", "    if head_held == 0:", "        return", "elif head_held != 0:", "    return"]


def _holds_transpose(op: ir.Accumulate) -> bool:
    """Does the accumulator of ``acc += pᵀ · v`` hold its transpose, ``accᵀ += vᵀ · p``, transposed
    once after the loop? Triton 3.4–3.7.0 on Hopper miscompiles a dot whose operand is the
    transpose of a computed tile: dK = Σ dSᵀ·Q came out 20× eager's error (0.11 against 0.0054, bf16,
    M 130, N 520, head dim 128, an H100 with Triton 3.6), nondeterministically, while dV was right;
    the transposes of loaded tiles (Qᵀ, dOᵀ) are read from shared memory as they are."""
    return op.transposed and not op.fresh


def _from_indices(node: fx.Node, kinds: dict) -> bool:
    """Is ``node`` computed from tile indices alone (no tensor read)?"""
    return kinds.get(node) is OpKind.INDEX and all(
        _from_indices(a, kinds) for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor))


def emit_backward(region, kinds: dict, plan: KernelPlan, printable, name: str = "fxflash_region") -> BackwardPlan:
    """The backward kernels of ``region`` (whose forward kernel is ``plan``), printed from its
    statistics and backward tile programs. Raises BackwardRefused (or Unprintable) where they
    cannot be printed, or read a tensor or size the forward's op does not pass."""
    r = region
    if r.q.widened or r.k.widened:
        raise BackwardRefused("Q and K widened to fp32 before the contraction")
    # the statistics program first, for a softmax (runtime/backward.py skips it after a training forward)
    statistics = () if elementwise_form(r) is not None else (lower_statistics(r, kinds, printable, name),)
    deterministic, atomics, exact_delta = lower_backward(r, kinds, printable, name)
    programs = (*statistics, *deterministic)
    axis = group_axis(r)
    # grouped-query attention: the key programs again, one per key tile of a K/V head
    grouped = () if axis is None else tuple(dataclasses.replace(p, name=f"{p.name}_grouped", group=True)
                                            for p in (deterministic[-2], atomics))
    options = plan.options
    # 16-bit scores under a softmax: rows the forward computed in eager's rounding take it here
    # too; and in every dtype where the loops skip tiles, a row every key masks visits them all
    held = bool(statistics) and (r.q.math_dtype in SATURATION_LOG2 or any(p.skips for p in programs))
    kernels, lines, bound, slot_values, helpers = [], [], (0, 0), [], set()
    out_dtype = attention_output(r).meta["val"].dtype
    exact = () if exact_delta is None else (exact_delta,)
    for program in (*programs, atomics, *grouped, *exact):
        printer = _Kernel(r, kinds, options, program, held)
        kernel = printer.print(out_dtype)
        vp = printer.vp
        if not (all(n in plan.input_nodes for n in vp.inputs) and all(n in plan.sym_nodes for n in vp.sym_nodes)):
            raise BackwardRefused("the backward reads a tensor or size the forward's kernel does not")
        kernel.args = [reindexed(spec, plan.input_nodes, vp.inputs, list(plan.sym_nodes), vp.sym_nodes)
                       for spec in kernel.args]
        kernel.summaries = tuple((plan.input_nodes.index(vp.inputs[i]), axis) for i, axis in vp.summaries)
        # a value the kernels compute rather than load (emit's vector producers, ALiBi's bias from
        # its slopes) is not an input of the op (None): its gradient tile goes to the backward of
        # the ops that compute it (runtime/op.Subgraph, BackwardPlan.slot_values)
        nodes = {n.name: n for n in plan.input_nodes}
        if program in programs:   # the key programs' slots are the dQ kernel's, in the same order
            slot_values += kernel.input_grads
        kernel.input_grads = tuple(plan.input_nodes.index(nodes[name]) if name in nodes else None
                                   for name in kernel.input_grads)
        bound = (max(bound[0], vp.index_bound[0]), max(bound[1], vp.index_bound[1]))
        kernels.append(kernel)
        lines += printer.lines + [""]
        helpers |= vp.helpers
    source = module_source(lines, helpers, options.interpreter)

    def where(operand, holds_transpose: bool) -> tuple:
        return (plan.input_nodes.index(operand.node), holds_transpose, operand.batch_rank)

    # the key-side operand of the scores is Kᵀ: its ``transposed`` means its tensor holds K [*, N, D]
    q, k, v = where(r.q, r.q.transposed), where(r.k, not r.k.transposed), where(r.v, r.v.transposed)
    inputs = tuple(dict.fromkeys((q[0], k[0], v[0])))
    exact_kernel = kernels.pop() if exact else None
    kernels, (atomic_kernel, *grouped_kernels) = kernels[:len(programs)], kernels[len(programs):]
    input_grads = tuple(i for kernel in kernels for i in kernel.input_grads if i is not None)
    return BackwardPlan(source, tuple(kernels), q, k, v, inputs, r.D, r.Dv, bound, programs, input_grads,
                        o_dtype=out_dtype, ops_after_pv=bool(r.output_ops),
                        slot_values=tuple(slot_values), atomics=atomic_kernel,
                        grouped=tuple(grouped_kernels), grouped_programs=grouped, group_axis=axis,
                        exact_delta=exact_kernel, exact_delta_program=exact_delta, held=held)


def group_axis(r) -> int | None:
    """The batch axis along which K and V are read through a broadcast (grouped-query attention's
    ``k[:, :, None].expand(…)``: stride 0, more than one query head per K/V head), or None: one
    axis, the same for both, and neither stored transposed. Their gradients are then sums over
    that axis, which a grouped key program (TileProgram.group) makes in its accumulators."""
    axes = []
    for operand, holds_transpose in ((r.k, not r.k.transposed), (r.v, r.v.transposed)):
        val = operand.node.meta["val"]
        rank = operand.batch_rank
        broadcast = [a for a in range(rank)
                     if val.stride(a) == 0 and not (isinstance(val.shape[a], int) and val.shape[a] == 1)]
        if holds_transpose or len(broadcast) != 1:
            return None
        axes.append((broadcast[0], rank, val.shape[broadcast[0]]))
    return axes[0][0] if axes[0] == axes[1] else None


__all__ = ["emit_backward"]
