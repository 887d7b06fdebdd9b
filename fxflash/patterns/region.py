"""From a chain to a Region: the three transformations applied and checked.

``build_region`` either returns a :class:`Region` — the tile program of one fused kernel —
or raises :class:`FusionRefused` naming the rule and the node that stopped it. It proves, op
by op, that the online program computes what the chain computes (in real arithmetic):

* every value between the producer contraction and the consumer is given a *form*:
  ``plain`` (computable from the current tile), ``scaled`` (``E(x - m)`` against the running
  maximum ``m``, times values linear in it), ``deferred`` (a scaled or plain value times row
  factors known only after the loop) or ``row`` (a function of finished reductions);
* reductions over ``N`` become online accumulators; sums of scaled values carry the rescale;
* the consumer contraction's operand must be ``plain``, ``scaled`` or ``deferred``.
"""
from __future__ import annotations

import dataclasses
import math

import networkx as nx
import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..analysis import GraphAnalysis, OpKind
from ..analysis.dims import reduction_dims
from ..analysis.ops import RANDOM, constant_value, packet
from ..analysis.sketch import dim_name
from ..config import KernelOptions, kernel_options
from .chains import Chain
from .sparsity import skippable_masks
from .rules import (
    DEFERRABLE,
    HOMOMORPHISMS,
    LINEAR_COMBINE,
    LINEAR_IN,
    MAX_HEAD_DIM,
    ONLINE_REDUCTIONS,
    ZERO_PRESERVING_WHERE,
)

aten = torch.ops.aten

# Layout ops that only regroup the batch axes of an operand [*batch, rows, cols].
# The transformation each rule line of a region belongs to (explain()'s grouping).
DEMOTION = "dimension demotion"
ALGEBRAIC = "algebraic rewriting"
ELIMINATION = "dimension elimination"
TILE_PROGRAM = "tile program"


@dataclasses.dataclass(frozen=True)
class Step:
    """One rule line of a region, for explain(): the transformation it belongs to, and its text."""

    group: str
    text: str

    def __str__(self) -> str:
        return self.text


BATCH_REGROUP = {aten.view, aten._unsafe_view, aten.reshape, aten.clone, aten.alias, aten.expand}
FLOAT_DTYPES = {torch.float32, torch.float16, torch.bfloat16}
# Scalars computed from symbolic sizes (``q.size(-1) ** -0.5`` under dynamic=True); the kernel
# specializes on their value, which guards the compiled graph.
SYMBOLIC_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool)


class FusionRefused(Exception):
    """A rule could not prove the chain fusable; the chain stays as it was."""

    def __init__(self, rule: str, node: fx.Node | None, message: str):
        self.rule, self.node, self.message = rule, node, message
        where = f" at {node.name} ({node.target})" if node is not None else ""
        super().__init__(f"{rule}{where}: {message}")


@dataclasses.dataclass(frozen=True)
class Factor:
    """A row factor applied after the loop: ``x·r`` ("mul"), ``x / r`` ("div"), or the
    homomorphism's shift ``E(m - r)`` ("shift") that turns ``E(x - m)``, computed against the
    running maximum ``m`` of ``x``, into the user's ``E(x - r)``."""

    op: str
    row: fx.Node
    hom: object = None          # "shift": the Homomorphism
    max: fx.Node | None = None  # "shift": the online maximum m


@dataclasses.dataclass(frozen=True)
class Form:
    """How a value between the two contractions is computed in the tile program.

    kind:     "plain" (computable from the current tile) | "row" (a function of finished
              reductions) | "scaled" (``E(x - m)`` against the running maximum ``m``, times
              values linear in it) | "deferred" (a tile value times row Factors known only
              after the loop) | "sum" (a signed sum of such values that need accumulators of
              their own).
    scale:    for scaled / deferred values, the max reduction whose running value they are
              computed against (None: no rescale).
    factors:  for deferred values, the Factors applied after the loop, in order.
    terms:    for sums, ((sign, node), …) with each node of form plain/scaled/deferred.
    stream:   for values picked out of one stream of a StreamSplit, its index.
    """

    kind: str
    scale: fx.Node | None = None
    factors: tuple = ()
    terms: tuple = ()
    stream: int | None = None

    @property
    def is_term(self) -> bool:
        return self.kind in ("scaled", "deferred")


PLAIN = Form("plain")
ROW = Form("row")


@dataclasses.dataclass
class Operand:
    """A contraction operand read by the kernel: ``node``'s runtime tensor, shaped
    ``[*batch, rows, cols]`` (or its transpose); ``batch`` leading axes are indexed by unravelling the flat batch
    index of the contraction (row-major)."""

    node: fx.Node
    batch_rank: int
    transposed: bool = False  # the tensor holds [*batch, cols, rows]
    scale: tuple = ()         # (("mul" | "div", constant), …) applied to each loaded tile, in order
    # 16-bit values eager widens to fp32 before the contraction (torch's baddbmm decomposition):
    # the kernel dots the 16-bit tiles with fp32 accumulation, the same exact products (a product
    # of two 16-bit values fits fp32's mantissa) and fp32 sums
    widened: bool = False

    @property
    def math_dtype(self) -> torch.dtype:
        """The dtype eager's contraction computes in (fp32 where the operand was widened)."""
        return torch.float32 if self.widened else self.node.meta["val"].dtype


@dataclasses.dataclass
class OnlineReduction:
    node: fx.Node
    combine: str          # "max" | "min" | "sum"
    source: fx.Node
    scale: fx.Node | None  # the max reduction whose rescale it carries (sum of scaled values)
    factors: tuple = ()    # row Factors of the summed value, applied to the finished sum


@dataclasses.dataclass
class Region:
    """The tile program of one fused kernel.

    frame:       the score node ``S[*batch, M, N]`` (the producer's output in the user's frame);
                 every value of the score DAG broadcasts to it, right-aligned.
    q, k, v:     operands: ``Q[*, M, D]``, ``Kᵀ[*, D, N]``, ``V[*, N, Dv]``.
    dag:         nodes of the score DAG in graph order, with their forms.
    reductions:  online reductions over N.
    p_node:      the value multiplied into V (in the frame), with its form.
    epilogue:    row nodes computed after the loop, in graph order.
    output:      the node the kernel's result replaces: ``[*, M, Dv]``, contiguous, or with
                 ``output_ops`` (transposes, a gate) the last of them, in eager's layout.
    nodes:       every node the kernel replaces.
    steps:       the rule lines applied (Step: its transformation and text), for explain().
    split:       with several streams (differential attention), how they are selected; the
                 DAG nodes in ``combined`` are in the output frame, the others are computed
                 once per stream in the score frame.
    """

    chain: Chain
    frame: fx.Node
    q: Operand
    k: Operand
    v: Operand
    forms: dict
    dag: list
    reductions: list
    p_node: fx.Node
    epilogue: list
    output: fx.Node
    nodes: list
    steps: list
    M: int
    N: int
    D: int
    Dv: int
    passthrough: dict = dataclasses.field(default_factory=dict)
    output_ops: list = dataclasses.field(default_factory=list)  # applied to the output tile
    side_outputs: list = dataclasses.field(default_factory=list)  # row values returned too (lse)
    squeezed: set = dataclasses.field(default_factory=set)  # row values shaped [*batch, M]
    partners: list = dataclasses.field(default_factory=list)  # further score contractions
    rescales: dict = dataclasses.field(default_factory=dict)  # online max → Homomorphism
    split: StreamSplit | None = None   # several streams selected from the score frame
    combined: set = dataclasses.field(default_factory=set)  # DAG nodes in the output frame
    tile_masks: list = dataclasses.field(default_factory=list)

    @property
    def out_frame_shape(self) -> tuple:
        """``[*batch, M, N]`` of the value multiplied into V: the frame of the kernel's grid."""
        return _shape(self.p_node)

    @property
    def unit_bounded_sums(self) -> set:
        """Online sums proved ≥ 1 on every row that is not NaN: ``Σ E(x − m)`` of a homomorphism
        taken against the running maximum ``m`` of its own ``x`` (form scaled by ``m``, no row
        factor), whose largest term is ``E(0) = 1`` and whose others are positive — a softmax's
        denominator. Dividing by one is multiplying by its reciprocal (codegen's epilogue): ``1/s``
        cannot overflow, and a row whose sum is NaN stays NaN."""
        def of_its_own_max(red) -> bool:
            form = self.forms.get(red.source, PLAIN)
            return (_is(red.source, *HOMOMORPHISMS) and form.kind == "scaled" and form.scale is red.scale
                    and not form.factors)
        return {red.node for red in self.reductions
                if red.combine == "sum" and red.scale is not None and not red.factors and of_its_own_max(red)}

    @property
    def terms(self) -> list:
        """The accumulators of ``P·V``: ``[(sign, tile node, form)]``, one per term of P."""
        form = self.forms.get(self.p_node, PLAIN)
        if form.kind == "sum":
            return [(sign, node, self.forms.get(node, PLAIN)) for sign, node in form.terms]
        return [(1, self.p_node, form)]


def _shape(node) -> tuple:
    return tuple(node.meta["val"].shape)


def _same(a: tuple, b: tuple) -> bool:
    """Are the shapes ``a`` and ``b`` equal for every value of their symbolic sizes? Compared without a
    guard: a guard on a length (``s + 1 != 16``) would compile the graph again at that length."""
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b))


def _is(node, *packets) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and packet(node.target) in packets


def _swaps_last_two(node: fx.Node) -> bool:
    if not _is(node, aten.transpose):
        return False
    rank = len(_shape(node))
    return {node.args[1] % rank, node.args[2] % rank} == {rank - 2, rank - 1}


SCALAR_SCALES = {aten.mul: "mul", aten.div: "div"}


def _scalar_scale(node: fx.Node):
    """``("mul" | "div", c)`` when ``node`` is ``x * c`` or ``x / c`` with ``c`` a Python number."""
    if not _is(node, *SCALAR_SCALES) or len(node.args) != 2 or node.kwargs:
        return None
    x, c = node.args
    if not isinstance(x, fx.Node) or isinstance(c, bool) or not isinstance(c, (int, float)):
        return None
    if _shape(x) != _shape(node) or x.meta["val"].dtype != node.meta["val"].dtype:
        return None
    return SCALAR_SCALES[packet(node.target)], c


def _keeps_tile(node: fx.Node, src: fx.Node, want: tuple, batch: int) -> bool:
    """Whether the layout op ``node`` only regroups the batch axes of ``src``, a
    ``[*batch', *want]`` tensor with the same batch size: not an expand that broadcasts (then
    the value is not computed per batch)."""
    s = _shape(src)
    if len(s) < 2 or s[-2:] != want or math.prod(s[:-2]) != batch:
        return False
    return not (_is(node, aten.expand) and tuple(node.args[1]) != s)


def _widens(node: fx.Node, src: fx.Node) -> bool:
    """Is ``node`` ``src`` (fp16 or bf16) cast to fp32 and nothing else?"""
    return (_is(node, aten._to_copy) and node.kwargs == {"dtype": torch.float32}
            and src.meta["val"].dtype in (torch.float16, torch.bfloat16))


def _walk_operand(node: fx.Node, rows: int, cols: int, region_nodes: set, widen: bool = False) -> Operand:
    """Follow batch-only regroupings (views, copies, identity expands), transposes of the
    last two axes and multiplications by a Python number back to the earliest tensor that still
    holds ``[*batch, rows, cols]`` (or its transpose) with the same batch size, so the kernel
    reads the user's tensor with its real strides instead of a copy (a GQA key expanded,
    copied, then transposed; a query scaled by ``1/√d``, the scale then applied to the loaded
    tile in the input dtype, rounded as eager rounds it). With ``widen``, also back through one
    cast of 16-bit values to fp32 met before any scale (``Operand.widened``)."""
    batch = math.prod(_shape(node)[:-2])
    current, transposed, scale, widened = node, False, [], False
    while current not in region_nodes:
        src = current.args[0] if current.args else None
        if not isinstance(src, fx.Node) or not isinstance(src.meta.get("val"), torch.Tensor):
            break
        if widen and not widened and not scale and _widens(current, src):
            current, widened = src, True
            continue
        factor = _scalar_scale(current)
        if factor is not None:
            scale.insert(0, factor)
            current = src
            continue
        if not (_is(current, *BATCH_REGROUP) or _swaps_last_two(current)):
            break
        swap = _swaps_last_two(current)
        if not _keeps_tile(current, src, (cols, rows) if swap != transposed else (rows, cols), batch):
            break
        current, transposed = src, transposed != swap
    return Operand(current, len(_shape(current)) - 2, transposed, tuple(scale), widened)


def _score_operands(mm: fx.Node, M: int, D: int, N: int, region_nodes: set) -> tuple:
    """Q and K of the score contraction ``mm``: widened together or not at all (one dot dtype)."""
    q, k = _walk_operand(mm.args[0], M, D, region_nodes, True), _walk_operand(mm.args[1], D, N, region_nodes, True)
    if q.widened and k.widened and q.node.meta["val"].dtype == k.node.meta["val"].dtype:
        return q, k
    return _walk_operand(mm.args[0], M, D, region_nodes), _walk_operand(mm.args[1], D, N, region_nodes)


def _frame_of(first: fx.Node, region_nodes: set) -> fx.Node:
    """The producer's output as the user sees it: the view that splits its batch axis."""
    users = [u for u in first.users if u in region_nodes]
    if len(users) == 1 and _is(users[0], aten.view, aten._unsafe_view, aten.reshape):
        view = users[0]
        if _shape(view)[-2:] == _shape(first)[-2:] and math.prod(_shape(view)[:-2]) == math.prod(_shape(first)[:-2]):
            return view
    return first


def _p_in_frame(second: fx.Node, region_nodes: set) -> tuple[fx.Node, list]:
    """Walk the consumer's left operand back through the views that flatten its batch axes and
    the identity expands/copies before them; returns the value multiplied into V, in the frame
    the user computed it in (the kernel's output frame), and the layout nodes walked."""
    node, walked = second.args[0], []
    rows, cols = _shape(node)[-2:]
    batch = math.prod(_shape(node)[:-2])
    while node in region_nodes and _is(node, *BATCH_REGROUP) and _keeps_tile(node, node.args[0], (rows, cols), batch):
        walked.append(node)
        node = node.args[0]
    return node, walked


@dataclasses.dataclass(frozen=True)
class ScorePartner:
    """A further contraction added to the scores: ``view`` (its value in the score frame) is
    ``Q'·K'ᵀ`` with head dim ``d``, computed per key tile beside ``Q·Kᵀ``."""

    view: fx.Node
    q: "Operand"
    k: "Operand"
    d: int


@dataclasses.dataclass(frozen=True)
class StreamSplit:
    """Several streams over the same keys (differential attention): the score frame
    ``[*, X·S, M, N]`` is viewed as ``[*, X, S, M, N]`` (or ``[*, S, X, M, N]``) and each of the
    ``S`` streams is picked by a ``select`` on the new axis. One program computes every stream
    of its output row tile: score axis ``axis`` of stream ``s`` is ``x·S + s`` (inner) or
    ``s·X + x`` (outer), with ``x`` the output frame's index on that axis.

    view:     the view that splits the axis; selects: select node → stream index.
    """

    view: fx.Node
    axis: int
    count: int
    inner: bool
    selects: dict


MAX_STREAMS = 4  # streams are unrolled in the kernel: each holds its own Q tile and accumulator


def _stream_split(frame_shape: tuple, out_shape: tuple, region_nodes: set) -> StreamSplit:
    for view in region_nodes:
        if not _is(view, aten.view, aten._unsafe_view, aten.reshape) or not _same(_shape(view.args[0]), frame_shape):
            continue
        vs = _shape(view)
        users = list(view.users)
        if len(vs) != len(frame_shape) + 1 or not users or not all(
                _is(u, aten.select) and u in region_nodes and isinstance(u.args[2], int) for u in users):
            continue
        a = {u.args[1] % len(vs) for u in users}
        if len(a) != 1:
            continue
        (a,) = a
        if a >= len(vs) - 2 or not _same(vs[:a] + vs[a + 1:], out_shape):
            continue
        count = int(vs[a])
        inner = a >= 1 and vs[a - 1] * vs[a] == frame_shape[a - 1] and vs[:a - 1] == frame_shape[:a - 1] \
            and vs[a + 1:] == frame_shape[a:]
        outer = vs[a] * vs[a + 1] == frame_shape[a] and vs[:a] == frame_shape[:a] and vs[a + 2:] == frame_shape[a + 1:]
        if not (inner or outer) or count > MAX_STREAMS:
            continue
        selects = {u: u.args[2] % count for u in users}
        return StreamSplit(view, a - 1 if inner else a, count, inner, selects)
    raise FusionRefused("dimension demotion", None, f"the consumer's operand (frame {list(out_shape)}) is not "
                        f"the score tile's frame {list(frame_shape)} nor a selection of streams from it")



class _FormInference:
    """Assigns a Form to every node of the score DAG, in graph order (the algebraic rules)."""

    def __init__(self, frame: fx.Node, n_size: int, split: StreamSplit | None = None):
        self.frame = frame
        self.n_size = n_size
        self.split = split
        self.forms: dict = {frame: PLAIN}
        self.reductions: list = []
        self.steps: list = []
        self.absorbed: set = set()
        self.passthrough: dict = {}  # node → the argument whose tile value it is (row factor deferred)
        self.squeezed: set = set()   # row values without the reduced axis: [*batch, M]
        self.rescales: dict = {}     # online max → the Homomorphism whose values it rescales

    def form(self, arg) -> Form:
        if isinstance(arg, fx.Node) and arg in self.forms:
            return self.forms[arg]
        return PLAIN  # outside inputs, index expressions, Python scalars

    def infer(self, node: fx.Node) -> Form:
        args = list(node.args)
        forms = [self.form(a) for a in args]
        p = packet(node.target)
        if self.split is not None and node is self.split.view:
            return forms[0]
        if self.split is not None and node in self.split.selects:
            if forms[0].kind == "sum":
                raise FusionRefused("algebraic transformation", node, "a stream of a sum of terms")
            return dataclasses.replace(forms[0], stream=self.split.selects[node])
        if p in ONLINE_REDUCTIONS:
            return self._reduction(node, forms[0])
        if self._is_row_shift(node) and all(packet(u.target) in HOMOMORPHISMS for u in node.users):
            self.absorbed.add(node)
            return ROW  # x - r, printed inside its homomorphism E(x - r)
        if p in HOMOMORPHISMS and self._is_row_shift(args[0]):
            return self._homomorphism(node, args[0])
        kinds = {f.kind for f in forms}
        varying = [i for i, (a, f) in enumerate(zip(args, forms)) if f.kind == "plain" and self._varies_along_n(a)]
        if kinds <= {"plain"}:
            return PLAIN
        if kinds <= {"plain", "row"} and not varying:
            return ROW
        moving = [i for i, f in enumerate(forms) if f.is_term or f.kind == "sum"]
        if p in LINEAR_COMBINE and len(args) == 2 and node.kwargs.get("alpha", 1) == 1 \
                and sorted(moving + varying) == [0, 1]:
            return self._combine(node, p, args, forms)
        if not moving and len(varying) == 1:
            moving = varying  # a tile value that meets a row value
        if len(moving) == 1 and forms[moving[0]].kind != "sum":
            return self._through(node, p, args, forms, moving[0])
        raise FusionRefused("algebraic transformation", node, "this op combines a value of an unfinished reduction "
                            "in a way no rule makes online (not linear, no homomorphism)")

    # -- rules --------------------------------------------------------------------------
    def _varies_along_n(self, node) -> bool:
        if not isinstance(node, fx.Node):
            return False
        shape = _shape(node) if isinstance(node.meta.get("val"), torch.Tensor) else ()
        return self.n_size != 1 and len(shape) >= 1 and shape[-1] == self.n_size

    def _reduction(self, node: fx.Node, src: Form) -> Form:
        combine, _ = ONLINE_REDUCTIONS[packet(node.target)]
        dims, keepdim = reduction_dims(node)
        if dims != [len(_shape(node.args[0])) - 1]:
            raise FusionRefused("online reduction", node, "only reductions over the last axis are fused")
        if not keepdim:
            self.squeezed.add(node)
        if node.kwargs.get("dtype") is not None:
            raise FusionRefused("online reduction", node, "reductions with a dtype argument are not fused")
        if src.kind == "plain":
            self.reductions.append(OnlineReduction(node, combine, node.args[0], None))
            self.steps.append(Step(ALGEBRAIC, f"online {combine}: {node.name} accumulates over the demoted axis"))
            return ROW
        if src.is_term and combine == "sum":
            self.reductions.append(OnlineReduction(node, combine, node.args[0], src.scale, src.factors))
            rescale = f" rescaled when {src.scale.name} grows" if src.scale is not None else ""
            deferred = ", its row factors applied to the finished sum" if src.factors else ""
            self.steps.append(Step(ALGEBRAIC, f"algebraic: {node.name} = Σ {node.args[0].name}{rescale}{deferred}"))
            return ROW
        raise FusionRefused("online reduction", node, f"a {combine} over a value of form {src.kind} has no online form")

    def _is_row_shift(self, arg) -> bool:
        """``x - r``: a tile value minus a row value (a finished reduction or a function of one)."""
        return (_is(arg, aten.sub) and isinstance(arg.args[1], fx.Node) and self.form(arg.args[1]).kind == "row"
                and self.form(arg.args[0]).kind == "plain" and self._varies_along_n(arg.args[0])
                and arg.kwargs.get("alpha", 1) == 1)

    def _online_max_of(self, x: fx.Node) -> fx.Node | None:
        """The online maximum of ``x``, or of ``x`` through float casts (``E(x - m)·E(m - r)``
        holds for any ``m``; the maximum keeps the exponent at most about zero)."""
        base = uncast(x)
        return next((r.node for r in self.reductions if r.combine == "max" and uncast(r.source) is base), None)

    def _homomorphism(self, node: fx.Node, shifted: fx.Node) -> Form:
        """``E(x - r)``: computed as ``E(x - m)`` against the running maximum ``m`` of ``x`` and
        rescaled when it grows; when ``r`` is not ``m`` itself, the row factor ``E(m - r)``
        (``E(x - r) = E(x - m)·E(m - r)``) is deferred to the epilogue."""
        x, r = shifted.args[0], shifted.args[1]
        m = self._online_max_of(x)
        if m is None:
            raise FusionRefused("algebraic transformation", node,
                                f"E(x - r) is made online against the row maximum of x; {x.name} has no amax in the region")
        hom = HOMOMORPHISMS[packet(node.target)]
        if self.rescales.setdefault(m, hom) is not hom:
            raise FusionRefused("algebraic transformation", node, f"{m.name} is the running maximum of two "
                                "different homomorphisms; one rescale cannot serve both")
        self.steps.append(Step(
            ALGEBRAIC,
            f"algebraic: {node.name} = {hom.name}({x.name} - {r.name}) via the homomorphism {hom.name}: (+) → (×); "
            f"computed against the running {m.name}, rescaled by {hom.rescale.format(old='m_old', new='m_new')}"
        ))
        if r is m:
            return Form("scaled", scale=m)
        self.steps.append(Step(ALGEBRAIC, f"distributivity: the row factor {hom.rescale.format(old=m.name, new=r.name)} "
                               "is deferred past the consumer contraction"))
        return Form("deferred", scale=m, factors=(Factor("shift", r, hom, m),))

    def _terms(self, arg, sign: int) -> tuple:
        form = self.form(arg)
        if form.kind == "sum":
            return tuple((sign * s, n) for s, n in form.terms)
        return ((sign, arg),)

    def _combine(self, node, p, args, forms) -> Form:
        """``a ± b`` of two tile values: one accumulator when both carry the same rescale and
        row factors (linearity), otherwise a sum whose terms keep accumulators of their own."""
        a, b = forms
        if a.kind != "sum" and (a.kind, a.scale, a.factors, a.stream) == (b.kind, b.scale, b.factors, b.stream):
            return a
        terms = self._terms(args[0], 1) + self._terms(args[1], -1 if p is aten.sub else 1)
        self.steps.append(Step(ALGEBRAIC, f"linearity: {node.name} = " + " ".join(
            f"{'+' if s > 0 else '-'} {n.name}" for s, n in terms) + "; each term accumulates P·V on its own"))
        return Form("sum", terms=terms)

    def _through(self, node, p, args, forms, i) -> Form:
        moving = forms[i]
        others = [f for j, f in enumerate(forms) if j != i]
        others_vary = any(self._varies_along_n(a) for j, a in enumerate(args) if j != i and forms[j].kind == "plain")
        if all(f.kind == "plain" for f in others):
            if p in LINEAR_IN and i in LINEAR_IN[p]:
                if p is aten._to_copy and node.kwargs.get("dtype", torch.float32) not in FLOAT_DTYPES:
                    raise FusionRefused("algebraic transformation", node, "a cast to a non-float type is not linear")
                return moving
            if p is ZERO_PRESERVING_WHERE and i in (1, 2) and _is_zero(args[3 - i]):
                return moving
            if _is(node, aten.expand, aten.clone, aten.view, aten._unsafe_view) and _shape(node) == _shape(args[0]):
                return moving
        if p in DEFERRABLE and i in DEFERRABLE[p] and all(f.kind in ("row", "plain") for f in others) and not others_vary:
            row_args = [a for j, (a, f) in enumerate(zip(args, forms)) if j != i and f.kind == "row"]
            if len(row_args) == 1:
                (r,) = row_args
                op = "div" if p is aten.div else "mul"
                self.passthrough[node] = args[i]
                self.steps.append(Step(ALGEBRAIC, f"distributivity: {node.name} = {op} by row value {r.name}, "
                                       "deferred past the consumer contraction"))
                return Form("deferred", scale=moving.scale, factors=moving.factors + (Factor(op, r),))
        raise FusionRefused("algebraic transformation", node, f"op is not linear in the {moving.kind} value "
                            f"{args[i].name if isinstance(args[i], fx.Node) else args[i]}")


def uncast(node):
    while _is(node, aten._to_copy) and node.kwargs.get("dtype") in FLOAT_DTYPES and len(node.kwargs) == 1:
        node = node.args[0]
    return node


def _is_zero(arg) -> bool:
    return constant_value(arg, None) == 0


def build_region(analysis: GraphAnalysis, chain: Chain, options: KernelOptions | None = None) -> Region:
    """Apply the three transformations to ``chain``; raise FusionRefused where a rule fails.
    ``options``: the kernel settings (``config``'s now where None)."""
    options = options or kernel_options()
    first, second = chain.first, chain.second
    region_nodes = set(chain.nodes)
    for node in chain.inputs:
        if node in analysis.random_downstream:  # rarely: the draw itself is looked for only then
            drawn = [a for a in (node, *nx.ancestors(analysis.dataflow, node)) if _is(a, *RANDOM)]
            raise FusionRefused("randomness", drawn[0], "the region reads values drawn from the random number "
                                "generator (dropout); it runs as written so that the draws stay the user's")
    for c in (first, second):
        if not _is(c, aten.bmm, aten.mm):
            raise FusionRefused("contraction", c, "only mm/bmm contractions are fused")
    dtype = first.meta["val"].dtype
    if dtype not in FLOAT_DTYPES or second.meta["val"].dtype not in FLOAT_DTYPES:
        raise FusionRefused("dtype", first, f"{dtype} regions stay eager (fused kernels take fp32, fp16, bf16)")
    a_shape, b_shape = _shape(first.args[0]), _shape(first.args[1])
    M, N = a_shape[-2], b_shape[-1]
    # head dims are compile-time constants of the kernel: specialize (and guard) on them
    D, Dv = int(a_shape[-1]), int(_shape(second.args[1])[-1])
    if D > MAX_HEAD_DIM or Dv > MAX_HEAD_DIM:
        raise FusionRefused("dimension elimination", first if D > MAX_HEAD_DIM else second,
                            f"head dims D={D}, Dv={Dv} must fit one tile (≤ {MAX_HEAD_DIM})")
    frame = _frame_of(first, region_nodes)
    frame_shape = _shape(frame)
    p_node, p_walk = _p_in_frame(second, region_nodes)
    out_shape = _shape(p_node)
    split = None if _same(out_shape, frame_shape) else _stream_split(frame_shape, out_shape, region_nodes)
    after = nx.descendants(analysis.dataflow, second)
    tail = [n for n in chain.nodes if n is second or n in after]  # the consumer and its output ops
    infer = _FormInference(frame, N, split)
    dag = []
    partners = []
    for path in chain.partners:
        mm, view = path[-1], path[-2]
        if _shape(view) != frame_shape or not _is(mm, aten.bmm):
            raise FusionRefused("score DAG", mm, "a further contraction in the scores that is not in their frame")
        dx = int(_shape(mm.args[0])[-1])
        if dx > MAX_HEAD_DIM:
            raise FusionRefused("dimension elimination", mm, f"head dim {dx} must fit one tile (≤ {MAX_HEAD_DIM})")
        partners.append(ScorePartner(view, _walk_operand(mm.args[0], M, dx, region_nodes),
                                     _walk_operand(mm.args[1], dx, N, region_nodes), dx))
        infer.forms[view] = PLAIN
    if partners and split is not None:
        raise FusionRefused("score DAG", chain.partners[0][-1], "further score contractions with streams")
    skip = {first, frame, *p_walk, *tail, *(n for path in chain.partners for n in path[-2:])}
    combined = set()  # nodes after a stream's select: in the output frame
    for node in chain.nodes:
        if node in skip:
            continue
        if node.op != "call_function" or analysis.kinds[node] not in (OpKind.ELEMENTWISE, OpKind.REDUCTION, OpKind.LAYOUT, OpKind.INDEX):
            raise FusionRefused("score DAG", node, "op kind cannot be printed in a kernel")
        selecting = split is not None and (node is split.view or node in split.selects)
        row_layout = _row_unit_axis(node, infer, frame_shape)
        if analysis.kinds[node] is OpKind.LAYOUT and not selecting and row_layout is None \
                and not _is_frame_identity(node):
            raise FusionRefused("score DAG", node, "a layout op that moves the score tile's axes")
        if row_layout or (row_layout is None and any(a in infer.squeezed for a in node.all_input_nodes)):
            infer.squeezed.add(node)
        if any(not isinstance(a.meta.get("val"), (torch.Tensor, *SYMBOLIC_SCALARS)) for a in node.all_input_nodes):
            raise FusionRefused("score DAG", node, "an input without a tensor value")
        if split is not None and (node in split.selects or any(a in combined for a in node.all_input_nodes)):
            combined.add(node)
        infer.forms[node] = infer.infer(node)
        if node in infer.squeezed:
            for a in [node, *node.all_input_nodes]:
                if a in region_nodes and a not in infer.squeezed and a in infer.forms and row_layout is None \
                        and analysis.kinds[node] is not OpKind.REDUCTION:
                    raise FusionRefused("score DAG", node, "mixes a row value with and without its reduced axis")
                if a not in region_nodes and isinstance(a.meta.get("val"), torch.Tensor):
                    _check_broadcasts(a, frame_shape[:-1])
        elif node is not (split.view if split else None):
            _check_broadcasts(node, out_shape if node in combined else frame_shape)
        dag.append(node)
    p_form = infer.forms.get(p_node, PLAIN)
    if p_form.kind == "row":
        raise FusionRefused("dimension demotion", p_node, "the consumer's operand does not vary along the demoted axis")
    if split is not None and p_node not in combined:
        raise FusionRefused("dimension demotion", p_node, "the consumer's operand is not computed from the streams")
    if chain.output_ops:
        out_view = chain.output_ops[0].args[0]
        if _shape(out_view) != out_shape[:-1] + (Dv,):
            raise FusionRefused("epilogue", chain.output_ops[0], f"the output {list(_shape(out_view))} is not the "
                                f"kernel's output frame {list(out_shape[:-1]) + [Dv]}")
        for op in chain.output_ops:
            if op.meta["val"].dtype not in FLOAT_DTYPES:
                raise FusionRefused("epilogue", op, "output ops must keep a float dtype")
    for node in chain.escapes:
        if infer.forms.get(node) != ROW or node in infer.absorbed or split is not None or node in combined:
            raise FusionRefused("convexity", node, "an intermediate value is also used outside the region (only "
                                "per-row values, such as the logsumexp of the scores, may leave it)")
    epilogue = [n for n in dag if infer.forms[n].kind == "row" and packet(n.target) not in ONLINE_REDUCTIONS
                and n not in infer.absorbed]
    loop_nodes = [n for n in dag if n not in epilogue]
    q, k = _score_operands(first, M, D, N, region_nodes)
    v = _walk_operand(second.args[1], N, Dv, region_nodes)  # never widened: P stays fp32 as eager's
    steps = [
        Step(DEMOTION, f"dimension demotion: {dim_name(chain.demoted)} (N={N}), parallel in {first.name}, becomes "
                       f"the reduction axis of the region; one program per row tile loops over it"),
        *infer.steps,
        *([Step(TILE_PROGRAM, f"streams: {split.count} score maps over the same keys ({split.view.name} splits axis "
                              f"{split.axis} of the score frame); one program computes all of them for its rows, "
                              f"one Q tile and one set of running values each")] if split is not None else []),
        Step(ELIMINATION, f"dimension elimination: D={D} and Dv={Dv} fit one tile (≤ {MAX_HEAD_DIM}); "
                          f"{first.name} and {second.name} chain inside the loop"),
        *([Step(ELIMINATION, f"scores: {', '.join(p.view.name for p in partners)} (further contractions of the "
                             f"scores) computed per key tile beside {first.name}")] if partners else []),
        *([Step(TILE_PROGRAM, f"epilogue: {', '.join(op.name for op in chain.output_ops)} applied to the output "
                              f"tile before it is stored")] if chain.output_ops else []),
    ]
    region = Region(
        chain=chain, frame=frame, q=q, k=k, v=v, forms=infer.forms, dag=loop_nodes,
        reductions=infer.reductions, p_node=p_node, epilogue=epilogue, output=chain.output,
        nodes=list(chain.nodes), steps=steps, M=M, N=N, D=D, Dv=Dv, passthrough=infer.passthrough,
        split=split, combined=combined, output_ops=list(chain.output_ops),
        side_outputs=list(chain.escapes), squeezed=infer.squeezed, partners=partners, rescales=infer.rescales,
    )
    region.tile_masks = skippable_masks(region, analysis.kinds) if options.block_sparsity else []
    for mask in region.tile_masks:
        scores = "-inf" if mask.threshold is None else (
            f"{mask.fill:g}: a row whose maximum is not above {-mask.threshold:g} is computed again over every key")
        if mask.addend is not None:
            scores += (f", added to scores bounded per program: where the bound reaches {mask.addend_below:g}, "
                       "every key")
        steps.append(Step(TILE_PROGRAM, f"block sparsity: a key tile may be skipped when {mask.condition.name} is "
                                        f"{mask.masked_when} on all of it (scores {scores}; every accumulator "
                                        f"scaled by exp)"))
    return region


ROW_LAYOUTS = {aten.squeeze, aten.unsqueeze, aten.view, aten._unsafe_view, aten.reshape}


def _row_unit_axis(node: fx.Node, infer: "_FormInference", frame_shape: tuple):
    """For a layout op on a row value that only drops (True) or restores (False) its size-one
    reduced axis: whether the result is squeezed; None for any other op."""
    if not _is(node, *ROW_LAYOUTS) or not isinstance(node.args[0], fx.Node):
        return None
    src = node.args[0]
    if infer.forms.get(src) != ROW:
        return None
    if src not in infer.squeezed and _shape(src)[-1:] == (1,) and _shape(node) == _shape(src)[:-1]:
        return True
    if src in infer.squeezed and _shape(node) == _shape(src) + (1,):
        return False
    return None


def _is_frame_identity(node: fx.Node) -> bool:
    src = node.args[0]
    return isinstance(src, fx.Node) and _shape(node) == _shape(src) and (
        _is(node, aten.clone, aten.alias, aten.expand, aten.view, aten._unsafe_view, aten.reshape, aten.contiguous)
    )


def _check_broadcasts(node: fx.Node, frame_shape: tuple) -> None:
    shape = _shape(node)
    if len(shape) > len(frame_shape) or any(
        s not in (1, f) for s, f in zip(reversed(shape), reversed(frame_shape))
    ):
        raise FusionRefused("score DAG", node, f"shape {list(shape)} does not broadcast to the score frame {list(frame_shape)}")


__all__ = ["FusionRefused", "Form", "OnlineReduction", "Operand", "Region", "build_region"]
