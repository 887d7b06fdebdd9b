"""Region → a Gluon kernel with FlashAttention-3's structure, for softmax regions on Hopper.

Triton's ``tl`` level cannot overlap the exponentials of one key tile with the tensor-core
work of another inside a program (benchmarks/NOTES.md, 2026-11-22 and 2026-11-23); Gluon
(``triton.experimental.gluon``), Triton's layout-explicit level, can. This module prints the
same region the ``tl`` emitter prints (emit.py) as a warp-specialized kernel:

* one *loader* warp copies the CTA's Q tiles and each K and V tile by TMA into a ring of
  ``NBUF`` shared-memory buffers (mbarrier ready/empty pairs);
* ``CONSUMERS`` (1–3) warp groups of 4 warps own 64 query rows each (or 128, two wgmma row
  blocks: ``GluonTile.consumer_rows``) and share every K/V tile (one consumer leaves registers
  and shared memory for a second CTA on the SM);
  inside each, the next tile's ``S = Q·Kᵀ`` (asynchronous wgmma) is issued before the current
  ``P·V``, and the softmax of one tile runs while the tensor cores work on the other; with
  ping-pong the consumers' matrix products take turns;
* the region's score DAG is printed op by op into ``_score`` by emit's printer in Gluon's names
  (``GL``: the printers' ops map one to one onto Gluon's), index expressions from the tile's row
  and key indices, tensor inputs loaded at their strides;
* a [rows, keys] tile of a 16-bit score input (a pair bias, an additive mask) comes with each
  K tile by TMA (the same barrier and ring slot; ``GluonPlan.tiles``, options.gluon_tma_tiles),
  each consumer reading its rows back from shared memory instead of loading them per element;
  a [1, keys] vector (the Evoformer's mask bias: ``GluonPlan.vectors``) comes the same way, one
  row for all the item's rows; an output gate in Q's dtype (``GluonPlan.gates``) is read by a
  second loader warp into the item's Q buffers once the item's last ``Q·Kᵀ`` has completed, for
  the epilogue, and the consumers then store the output through those buffers by TMA
  (``GluonPlan.store``, ``_tma_store_lines``), each waiting for its copy at its next item
  (``STORE_DRAIN``);
* the key tiles a mask empties are never loaded: the tile range ``[lo_t, hi_t)`` comes from
  the same interval tests as emit's (``tile_range``), computed once per CTA before the
  warps split (``_work``), and every visited tile evaluates the masks;
* on a persistent grid (``PERSISTENT_CONFIGS``, regions without tile masks) fewer CTAs walk the
  work items: the loader and each consumer compute every item's ``_work`` themselves, Q has two
  buffers (``q_empty`` releases one once its item's last ``Q·Kᵀ`` has completed), and the K/V
  ring index and ping-pong turn count over the CTA's items. A consumer whose 64 rows all lie
  past M (the last row block of 1024 rows with 3 consumers) only takes its share of the item's
  barriers (``_pass``); the grid is then coprime with the row blocks so that every CTA gets
  its share of such light items;
* a buffer the consumers read with ordinary shared-memory loads (a score tile, the gate in the
  Q buffers) is released to the loader after a proxy fence (``_release``): TMA writes through
  the async proxy, and an mbarrier alone does not order the generic proxy's reads before them.
  Without it, gated regions on persistent grids of two or three consumers were wrong in 3–10 of
  10 calls on the H200 (benchmarks/NOTES.md, 2026-11-24).

The online softmax is the region's own rewrite (rules.HOMOMORPHISMS): with ``x = c·x'`` the
score the maximum reads (``c > 0`` folded, Value.scaled) and ``E`` = exp or exp2,
``m₂ = max(x')·k``, ``p = 2^(x'·k − m₂)`` with ``k = c·log₂e`` (exp) or ``c`` (exp2),
``l = Σ p`` and ``O = Σ p·V`` rescaled by ``2^(m₂_old − m₂_new)``, then ``O·(1/l)`` (``l ≥ 1``:
the row maximum's term is 1; options.row_reciprocal). A row whose
every score is -inf gives 0·(1/0) = NaN, as eager's ``exp(-inf − (−inf))`` does. The
region's output ops (a gate, a transpose) are emit's printer's lines on the consumer's rows
and columns, stored at the output's strides.

Differential attention's two softmax streams (``Region.split``: ``w₀·softmax(x₀)·V +
w₁·softmax(x₁)·V``, each ``wₛ`` a Python number, as ``1`` and ``−λ``) get one consumer warp group
each over the same 64 rows (``STREAM_CONFIGS``, ``_StreamLines``): stream s's Q and K tiles from
its own heads, the V tile read once for both, and at the end stream 1 hands its normalized
output to stream 0 in shared memory; one warp group per stream keeps one [64, Dv] accumulator
each, so Dv = 256 fits where the ``tl`` kernel splits it between two programs that each
recompute both streams' scores (benchmarks/NOTES.md, 2026-11-24).

Only regions of exactly that shape qualify (``refusal`` says why another does not): one
softmax or two such streams, no further contractions, no row ops after ``O / l``; bf16 or fp16
Q, K, V with head dims ``D`` (Q, K) and ``Dv`` (V) ∈ {64, 128} (Dv also 256 with two streams),
with two streams tile masks whose key tiles do not depend on the stream, read as stored: a scale on K only by
positive powers of two, which the scores carry exactly, as Q's (``score_scale``); any other scale on Q applied to each
consumer's Q tile in shared memory, rounded as eager rounds it (``q_tile_scale``). Whether a
launch can use it (TMA reads each operand as a
``[R, sr]`` matrix, its batch axes whole rows apart or inside one row, rows 16-byte aligned,
and ``N`` a multiple of the key tile) is decided per launch (``launch_refusal``); the tuner
then times its configurations beside the
``tl`` kernel's and keeps the faster (tuning.py). The interpreter cannot run Gluon: CPU tests
print the kernel and compile it for sm_90.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import warnings

import torch
import torch.fx as fx

from ..analysis.ops import packet
from ..config import KernelOptions, kernel_options
from ..patterns.region import Region
from ..patterns.rules import HOMOMORPHISMS, LN2, LOG2E
from ..tile.backward import statistics_nodes
from ..tile.ir import Map, RowReduce
from ..tile.lower import lower
from .emit import FLT_MAX as FLT_MAX_F32
from .emit import (COL, DVC, ROW, SATURATION_LOG2, Value, _memory_order, _Printer, _scaled, compute_dtype,
                   row_guard)
from .gluon_plan import LOADER_REGS, STREAM_DV_DIMS, GluonPlan
from .printers import PRINTERS, Namespace, Unprintable, gpu_helpers, refusal as printer_refusal

aten = torch.ops.aten

HEAD_DIMS = (64, 128)
DTYPES = {torch.bfloat16: "gl.bfloat16", torch.float16: "gl.float16"}
FLT_MAX = repr(FLT_MAX_F32)
# -- the Gluon API, whose spelling moved between Triton versions ----------------------------
@functools.lru_cache(maxsize=None)
def gluon_api() -> dict | None:
    """The names this Triton's Gluon gives the calls the kernel makes, or None without Gluon's
    Hopper API (Triton < 3.6). ``tma_load``: ``async_copy_global_to_shared`` (3.6) was removed in
    favour of ``async_load`` (3.9), ``tma_store``: ``async_copy_shared_to_global`` of ``async_store``."""
    try:
        importlib.import_module("triton.experimental.gluon.nvidia.hopper")  # TensorDescriptor
        from triton.experimental.gluon.language.nvidia.hopper import tma
    except ImportError:
        return None
    load = "async_load" if hasattr(tma, "async_load") else "async_copy_global_to_shared"
    store = "async_store" if hasattr(tma, "async_store") else "async_copy_shared_to_global"
    return {"tma_load": f"tma.{load}", "tma_store": f"tma.{store}"}


# -- which regions qualify -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Softmax:
    """The parts of a region that is ``softmax(x)·V``, or with two streams ``Σₛ wₛ·softmax(xₛ)·V``:
    the maximum and sum reductions, the shift ``x − max``, the exponential ``E``, the normalized
    ``P = E / Σ E`` and each stream's weight ``wₛ`` (a sign times a constant, as ``1`` and ``−λ``)."""

    maximum: fx.Node
    total: fx.Node
    shift: fx.Node
    exp: fx.Node
    p: fx.Node
    weights: tuple = (1.0,)
    zero_empty_rows: bool = False  # the safe softmax (_safe_guards): a fully masked row gives 0, not NaN


NOT_EXP_OF_SHIFT = "its sum is not over exp/exp2 of the scores minus their maximum"
NOT_SOFTMAX_TIMES_V = "the value multiplied into V is not exp(scores − max) / sum"


def _safe_guards(r: Region) -> tuple:
    """``(guard of the maximum, guard of the sum)`` where the region is the safe softmax of SDPA's
    math form (emit.row_guard: ``m' = where(m = -inf, 0, m)``, ``l' = where(l = 0, 1, l)``), else
    ``()``. Every row with a finite maximum has ``l ≥ 1``, so both guards change only a row whose
    every score is -inf: the kernel's clamped offset gives it ``acc = 0, l = 0``, and its output is
    0 (``zero_empty_rows``) instead of the plain softmax's 0/0."""
    reds = {red.combine: red.node for red in r.reductions}
    if len(r.reductions) != 2 or set(reds) != {"max", "sum"} or r.split is not None:
        return ()
    guards = row_guard(reds["max"], float("-inf")), row_guard(reds["sum"], 0.0)
    return guards if None not in guards else ()


def _guard_nodes(guards: tuple) -> set:
    """The guards and their tests (the row ops after the loop that the Gluon kernel prints itself)."""
    return {node for guard in guards for node in (guard, guard.args[0])}


def softmax_of(r: Region) -> Softmax | str:
    """The region's softmax, or why the region is not one softmax followed by ``·V``."""
    reds = {red.combine: red for red in r.reductions}
    if len(r.reductions) != 2 or set(reds) != {"max", "sum"}:
        return "its reductions are not one maximum and one sum (a softmax)"
    mx, sm = reds["max"], reds["sum"]
    guards = _safe_guards(r)
    offset = guards[0] if guards else mx.node  # what the shift subtracts, and the sum's rescale reads
    e = sm.source
    hom = HOMOMORPHISMS.get(packet(e.target)) if _is_call(e) else None
    if hom is None or r.rescales.get(mx.node) is not hom:
        return NOT_EXP_OF_SHIFT
    shift = e.args[0]
    sum_factors = [(f.op, f.row) for f in sm.factors]
    if (mx.factors or sum_factors != ([("shift", offset)] if guards else []) or sm.scale is not mx.node
            or not _is_call(shift) or packet(shift.target) is not aten.sub
            or shift.args[0] is not mx.source or shift.args[1] is not offset):
        return NOT_EXP_OF_SHIFT
    normalized = [("shift", offset), ("div", guards[1])] if guards else [("div", sm.node)]
    streams = r.split.count if r.split is not None else 1
    terms = sorted(r.terms, key=lambda term: term[2].stream or 0)
    if [term[2].stream for term in terms] != ([None] if r.split is None else list(range(streams))):
        return "the value multiplied into V is not one softmax per stream"
    weights, ps, walked = [], set(), set()
    for sign, p, form in terms:
        weight, p, through = _stream_weight(r, p)
        factors = [(f.op, f.row) for f in form.factors]
        if (weight is None or form.scale is not mx.node or factors != normalized
                or r.passthrough.get(p) is not e or (streams == 1 and sign * weight != 1)):
            return NOT_SOFTMAX_TIMES_V + (" times a number" if streams > 1 else "")
        weights.append(sign * weight)
        ps.add(p)
        walked |= through
    combined = set(r.combined) | ({r.split.view} if r.split is not None else set())
    if len(ps) != 1 or set(r.dag[r.dag.index(mx.node):]) != {mx.node, shift, e, sm.node, *ps, *walked, *combined}:
        return "the scores are used again after their maximum"
    return Softmax(mx.node, sm.node, shift, e, ps.pop(), tuple(weights), zero_empty_rows=bool(guards))


def _stream_weight(r: Region, node: fx.Node) -> tuple:
    """``(w, P, nodes)`` for a term of the contraction that is ``w·P`` for the region's
    normalized softmax ``P`` (``w``: a product of Python numbers, each by ``mul`` or ``div``),
    read through float casts and the stream split's view and selects; ``nodes``: those walked
    through. ``w`` None where another op or a tensor factor comes first."""
    weight, walked, split = 1.0, set(), r.split
    while node not in r.passthrough:
        walked.add(node)
        if split is not None and node in split.selects:
            node = split.view
        elif (split is not None and node is split.view) or _is_float_cast(node):
            node = node.args[0]
        elif _is_call(node) and packet(node.target) in (aten.mul, aten.div) and len(node.args) == 2:
            a, b = node.args
            number, tensor = (a, b) if isinstance(a, (int, float)) else (b, a)
            if not isinstance(number, (int, float)) or not isinstance(tensor, fx.Node) or (
                    packet(node.target) is aten.div and (tensor is not a or number == 0)):
                return None, node, walked
            weight = weight * number if packet(node.target) is aten.mul else weight / number
            node = tensor
        else:
            return None, node, walked
    return weight, node, walked


FLOAT_CASTS = {aten._to_copy, aten.clone, aten.alias}


def _is_call(node) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function"


def _is_float_cast(node: fx.Node) -> bool:
    """A copy of one value that keeps it a float (``.to(bf16)``, ``.float()``, ``clone``)."""
    if not _is_call(node) or packet(node.target) not in FLOAT_CASTS:
        return False
    dtype = node.kwargs.get("dtype")
    return dtype is None or dtype.is_floating_point


def _dtype_refusal(r: Region) -> str | None:
    dtypes = {op.node.meta["val"].dtype for op in (r.q, r.k, r.v)}
    if len(dtypes) != 1 or not dtypes <= set(DTYPES):
        return "Q, K and V are not all bf16 or all fp16"
    if r.output.meta["val"].dtype not in dtypes:
        return "the output's dtype differs from V's"
    return None


# Conditions for the Gluon kernel, each a rule of the refusal that explain() reports.
REGION_RULES = (
    (lambda r: r.split is not None and r.split.count != 2, "more than two softmax streams"),
    (lambda r: bool(r.partners), "more than one score contraction"),
    (lambda r: bool(r.side_outputs), "row values returned beside the output"),
    (lambda r: bool(set(r.epilogue) - _guard_nodes(_safe_guards(r))), "row ops after the loop"),
    (lambda r: r.D not in HEAD_DIMS or r.Dv not in (HEAD_DIMS if r.split is None else STREAM_DV_DIMS),
     f"head dims D or Dv outside {HEAD_DIMS} (Dv {STREAM_DV_DIMS} with two streams)"),
    (lambda r: r.q.transposed or not r.k.transposed or r.v.transposed,
     "an operand stored transposed (TMA reads Q, K and V as [rows, head dim])"),
    (lambda r: bool(r.v.scale), "V scaled before the matmul"),
    (lambda r: score_scale(r) is None, "K scaled before the matmul by a factor other than a positive power of two"),
    (_dtype_refusal, None),
    # both streams' consumers visit one tile range (the tile range the masks give a row tile)
    (lambda r: r.split is not None and any(r.split.axis in _varying_axes(m.condition, len(r.out_frame_shape))
                                           for m in r.tile_masks),
     "two softmax streams with masks whose key tiles depend on the stream's heads"),
)


def _varying_axes(node, rank: int) -> set:
    """The axes of a frame of ``rank`` axes along which ``node``'s value (broadcast into it) varies."""
    shape = tuple(node.meta["val"].shape)
    return {rank - len(shape) + i for i, size in enumerate(shape) if size != 1}


def _exact(scale) -> bool:
    """Does eager compute each of an operand's scalar scale ops ``(("mul" | "div", c), …)``
    exactly? Only by a positive power of two (the significand unchanged; only the rare value
    pushed below the dtype's normal range would round)."""
    return all(c > 0 and math.frexp(c)[0] == 0.5 for _, c in scale)


def q_tile_scale(r: Region) -> tuple:
    """Q's scalar scale ops that each consumer applies to its Q tile in shared memory, in fp32
    and rounded to Q's dtype after each, as eager's ``q * c`` rounds (the Evoformer's
    ``q / √128``): all of them where one rounds (not a positive power of two); none otherwise
    (score_scale then folds them into the scores)."""
    return () if _exact(r.q.scale) else tuple(r.q.scale)


def score_scale(r: Region) -> float | None:
    """The factor ``c`` that the scales on Q and K not applied to Q's tile (q_tile_scale) put on
    ``S = Q·Kᵀ``, or None where K's scale rounds (K's tiles are shared by the consumers and read
    as stored: the Triton kernel rounds it). Q and K arrive by TMA as stored, so the kernel
    applies ``c`` to the scores, a positive power of two as every op it folds (_exact)."""
    if not _exact(r.k.scale):
        return None
    c = 1.0
    for op, factor in (*r.k.scale, *(() if q_tile_scale(r) else r.q.scale)):
        c = c * factor if op == "mul" else c / factor
    return c


def refusal(r: Region, statistics: bool = False) -> str | None:
    """Why the Gluon kernel cannot compute ``r`` (with ``statistics``: its training forward, which
    also stores each row's ``m`` and ``1/l``), or None when it can. Decided before anything is printed."""
    if gluon_api() is None:
        return "this Triton has no Gluon Hopper API"
    for test, reason in REGION_RULES:
        verdict = test(r)
        if verdict:
            return reason if reason is not None else verdict
    found = softmax_of(r)
    if isinstance(found, str):
        return found
    # the score function's ops and the output ops, as the Gluon kernel names the tile language
    printed = [n for n in (*r.dag[:r.dag.index(found.maximum)], *r.output_ops) if packet(n.target) in PRINTERS]
    why = printer_refusal(printed, GL)
    if why is not None:
        return why
    return _statistics_refusal(r, found) if statistics else None


def _statistics_refusal(r: Region, sm) -> str | None:
    """Why the Gluon kernel cannot store ``r``'s row statistics (STATISTICS_STORE: the running max
    and sum of one softmax ``exp(x − max) / sum``, whose output it stores last), or None."""
    if r.side_outputs or len(sm.weights) > 1 or HOMOMORPHISMS[packet(sm.exp.target)].name != "exp":
        return "row statistics beside row values, of softmax streams or of an exp2"
    if r.output_ops:   # its output before them is stored by the Triton kernel only
        return "the training forward of a region with ops after P·V"
    total = next(red.node for red in r.reductions if red.combine == "sum")
    if statistics_nodes(r) != (sm.maximum, total):
        # the quiet softmax's shifted exponent and divisor are the Triton kernel's
        return "row statistics of a softmax other than exp(x − max) / sum"
    return None


# -- printing ------------------------------------------------------------------------------
L1D = "L1D"  # the module's one-dimensional layout (vectors over key tiles or rows)
# How the Gluon printer names the tile language: the functions Gluon has under Triton's names;
# erf is Gluon's own; the NaN-propagation enum Gluon's maximum and minimum take is Triton's. Any
# other name is refused while the kernel is printed (printers.Namespace).
GL = Namespace("gl", allowed={"where", "maximum", "minimum", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs",
                              "sin", "cos", "floor", "ceil", "load", "store", "cdiv", "min", "max", "sum", "float32",
                              "float16", "bfloat16", "int1", "int8", "int16", "int32", "int64", "uint8"},
               renamed={"erf": "gl.erf", "PropagateNan": "tl.PropagateNan"}, backend="Gluon")
# The helper functions the printed lines may call: printers.GPU_HELPERS (libdevice's tanh, the
# special-function unit's sigmoid) printed for Gluon — the same calls on gl's tensors.
HELPERS = gpu_helpers("gl", "gluon.jit")


def _batch_axes(idx: tuple, batch: tuple) -> bool:
    """Are these index expressions the frame's batch indices ``batch`` (``fb0``, …) or broadcasts
    (None) only?"""
    return all(e is None or e in batch for e in idx)


class _GluonPrinter(_Printer):
    """emit's printer with one change for the Gluon kernel (options.gluon_tma_tiles): a [rows,
    keys] tile of a 16-bit tensor input of the score (the Evoformer's pair bias) is not loaded
    per element but read from the shared memory that the loader's TMA filled beside K and V, and
    the epilogue's first [rows, Dv] input in Q's dtype (the Evoformer's gate) from the Q buffer a
    second loader warp filled: their L2 latency then hides behind the loads like K's and V's."""

    L = GL

    def __init__(self, region: Region, name: str, options: KernelOptions):
        super().__init__(region, name, options)
        self.tiles: list = []  # per tile: (input index, its row stride's parameter, its batch offset, a key vector?)
        self.gates: list = []  # at most one: (input index, its row axis, row stride's parameter, batch offset)

    def call(self, helper: str) -> None:
        """A helper function the Gluon module defines (HELPERS); any other is refused here."""
        if helper not in HELPERS:
            raise Unprintable(f"no Gluon form of {helper} yet")
        super().call(helper)

    def arange(self, size: str) -> str:
        """In the module's one-dimensional layout; a consumer's rows run to ROWS_P2 (rows past
        ``m_hi`` are masked)."""
        return f"gl.arange(0, {'ROWS_P2' if size == 'BLOCK_M' else size}, layout={L1D})"

    def constant_mask(self, value: int) -> str:
        """As a score tile ``s`` of the score function (emit's full_tile_loop)."""
        return f"gl.full(s.shape, {value}, gl.int1, layout=s.type.layout)"

    def load(self, node: fx.Node, idx: tuple) -> Value:
        if self.is_tma_gate(node, idx):
            i, axis = self.tensor_input(node), idx.index(ROW)
            _, batch = self.input_address(node, tuple(e if e not in (ROW, DVC) else None for e in idx))
            self.gates.append((i, axis, f"in{i}_s{axis}", batch))
            return self.place(f"gate0.to({compute_dtype(node.meta['val'].dtype, GL)})", False, "x")
        if not self.is_tma_tile(node, idx):
            return super().load(node, idx)
        i, vector = self.tensor_input(node), idx[-2] != ROW
        # the batch item's offset (int64): of its row of keys, or of its [rows, keys] block
        _, batch = self.input_address(node, idx[:-1] + (None,) if vector else idx[:-2] + (None, None))
        self.tiles.append((i, f"in{i}_s{len(idx) - 2}", batch, vector))
        return self.place(f"tile{len(self.tiles) - 1}.to({compute_dtype(node.meta['val'].dtype, GL)})", True, "x")

    def is_tma_tile(self, node: fx.Node, idx: tuple) -> bool:
        """Is ``node`` at ``idx`` a [rows, keys] tile TMA can read: not in a two-stream region (whose
        loader fills each stream's K buffers), the score's (not the epilogue's),
        its last two axes the rows and the keys, every other axis a batch index or broadcast,
        16-bit, traced with contiguous keys and rows apart (not a row broadcast by ``expand``);
        or with options.gluon_tma_key_vectors a vector of keys of the same kind, one row for all
        the item's rows, every axis but the keys a batch index or broadcast (the Evoformer's mask
        bias, [B, N_seq, 1, 1, S], or its mask [B, N_seq, S] where the kernel computes the bias:
        emit's vector_producer); launch_refusal checks each launch's layout (TMA: the rows 16-byte
        aligned)."""
        val = node.meta["val"]
        batch = self.batch_idx
        if len(idx) < 2:   # a 0-d tensor (a temperature) or a vector: loaded as it is
            return False
        rows = idx[-2:] == (ROW, COL) and _batch_axes(idx[:-2], batch)
        vector = self.options.gluon_tma_key_vectors and idx[-1] == COL and _batch_axes(idx[:-1], batch)
        return (self.options.gluon_tma_tiles and self.r.split is None and not self.in_epilogue
                and (rows or vector) and val.element_size() == 2 and val.stride(-1) == 1 and val.stride(-2) > 0)

    def is_tma_gate(self, node: fx.Node, idx: tuple) -> bool:
        """Is ``node`` at ``idx`` an output gate TMA can read into the item's Q buffers (not with
        two streams: they hold both streams' Q tiles; the
        epilogue's first load of a [rows, Dv] block: one axis the rows, the last the head dim,
        every other a batch index or broadcast, Q's dtype, traced with a contiguous head dim)?"""
        val = node.meta["val"]
        rows = [a for a, e in enumerate(idx) if e == ROW]
        return (self.options.gluon_tma_tiles and self.r.split is None
                and self.in_epilogue and not self.gates and len(idx) >= 2 and idx[-1] == DVC
                and self.r.D == self.r.Dv  # the Q buffers it arrives in are [64, D]
                and len(rows) == 1 and _batch_axes([e for e in idx[:-1] if e != ROW], self.batch_idx)
                and val.dtype == self.r.q.node.meta["val"].dtype and val.shape[-1] == self.r.Dv
                and val.stride(-1) == 1 and val.stride(rows[0]) > 0)

    def tma_store(self) -> tuple | None:
        """``(row axis, its stride's parameter, batch offset, value)`` of the output when each
        consumer stores its finished rows by TMA through its Q buffer (options.gluon_tma_store), or
        None: where an output gate arrives in that buffer (``self.gates``, so it is the
        consumer's until the epilogue's end; the gate needs D = Dv, so the buffer holds the rows),
        the stored tile's axes (after the output ops' transposes) are the batch indices, one row
        axis and the head dim, in Q's dtype, and the head dim is innermost in the output's layout
        (launch.empty_results allocates it densely in eager's order, so every other axis is then
        whole rows apart or inside one row, as TMA reads a [R, sr] matrix)."""
        index, val = self.output_index, self.r.output.meta["val"]
        if not (self.options.gluon_tma_store and self.gates and index and index.count(ROW) == 1 and index[-1] == DVC
                and _batch_axes([e for e in index[:-1] if e != ROW], self.batch_idx)
                and val.dtype == self.r.q.node.meta["val"].dtype and _memory_order(val)[-1] == len(index) - 1):
            return None
        axis = index.index(ROW)
        batch = " + ".join(f"{e}.to(gl.int64) * out_s{a}" for a, e in enumerate(index) if e.startswith("fb")) or "0"
        return axis, f"out_s{axis}", batch, self.output_value


def emit_gluon(r: Region, kinds: dict, name: str = "fxflash_gluon",
               options: KernelOptions | None = None, statistics: bool = False) -> GluonPlan:
    """Print the Gluon kernel of region ``r`` (``refusal(r, statistics)`` must be None), reusing emit's
    printer for the score DAG and the tile range, with the kernel settings ``options``
    (``config``'s now where None); with ``statistics``, each consumer also stores its rows'
    ``m`` and ``1/l`` (STATISTICS_STORE). Raises Unprintable for an op without a Gluon form."""
    sm = softmax_of(r)
    options = options or kernel_options()
    pr = _GluonPrinter(r, name, options)
    fb = pr.begin(kinds)
    operands = tuple(pr.tensor_input(op.node) for op in (r.q, r.k, r.v))
    rows = []  # _item's lines: each operand's first row in its [rows, D] view, for batch ``lin``
    for label, op, i in zip("qkv", (r.q, r.k, r.v), operands):
        rank = op.batch_rank
        for axis in range(rank):
            pr.param(f"{label}_nb{axis}", ("size", i, axis))
            pr.param(f"{label}_sb{axis}", ("stride", i, axis))
        pr.param(f"{label}_sr", ("stride", i, rank))  # the tensor's rows: M for Q, N for K and V
        # Q and K of each stream at its own batch index (emit's stream_lin); V at the output's
        for x, lin in (_stream_lins(pr) if label != "v" else [("", "lin")]):
            rows += [f"{label}{x}_off = {lin}.to(gl.int64) * 0", f"rest = {lin}"]
            for axis in reversed(range(rank)):
                rows += [f"{label}{x}_off += (rest % {label}_nb{axis}).to(gl.int64) * {label}_sb{axis}",
                         f"rest = rest // {label}_nb{axis}"]
            rows += [f"{label}_row{x} = ({label}{x}_off // {label}_sr).to(gl.int32)",
                     f"{label}_col{x} = ({label}{x}_off % {label}_sr).to(gl.int32)"]
    # the score DAG up to the value the maximum reads, as emit prints it for one key tile, for
    # each stream at its own batch indices
    c = score_scale(r)
    # the score chain's values up to the maximum, walked in the region's tile program (the loads,
    # contractions and reductions around them are the template's)
    body = lower(r, kinds, PRINTERS, name).body
    cut = next(i for i, op in enumerate(body) if isinstance(op, RowReduce) and op.name == sm.maximum.name)
    chain = [pr.nodes[op.name] for op in body[:cut] if isinstance(op, (Map, RowReduce)) and pr.nodes.get(op.name) in r.dag]
    printed = []
    for st in pr.streams:
        pr.pre, pr.loop = [], []
        pr.enter_stream(st)
        pr.vars[r.frame] = Value("s", True) if c == 1.0 else Value(f"(s * {c!r})", True, scaled=("s", c))
        for node in chain:
            pr.dag_node(node, {})
        x = pr.vars[next(red.source for red in r.reductions if red.node is sm.maximum)]
        printed.append((pr.pre, pr.loop, x.scaled or (x.code, 1.0)))
    pr.enter_stream(None)
    (pre, loop, (base, c)), *others = printed
    if any(scale != c for _, _, (_, scale) in others):
        raise Unprintable("the streams' scores carry different scales")
    unit = LOG2E if HOMOMORPHISMS[packet(sm.exp.target)].name == "exp" else 1.0
    k = c * unit
    store = _output_store(pr)
    if statistics:  # refusal(r, statistics) decided what STATISTICS_STORE can store
        pr.param("side0_ptr", ("side", 0))
        pr.param("side1_ptr", ("side", 1))
        pr.param("side2_ptr", ("side", 2))
        store = STATISTICS_STORE + store  # the store of ``out`` stays last (_tma_store_lines)
    out_tma = pr.tma_store()
    score_params = list(pr.params)  # the consumers' run-time parameters (the tile range's come after)
    pr.pre, pr.loop = [], []
    tile_range = pr.tile_range()
    # on the run of tiles where every mask keeps every score, each mask's condition is a
    # constant (emit's full_tile_loop): a second score function with the masks folded away
    # (not with streams: each stream's score lines are its own)
    pr.loop = loop
    full = pr.full_tile_loop() if pr.full_proved and options.gluon_full_tiles and not others else None
    scores = {"_score": (pre + loop, base), **({"_score_full": (pre + full, base)} if full else {})}
    # a second stream's own score function where its lines differ (its own batch indices), after
    # stream 0's, whose values it may share (a mask the printer computed once; the rest is dead code)
    scores.update({f"_score_{j}": (pre + loop + p + lp, b) for j, (p, lp, (b, _)) in enumerate(others, 1)
                   if (p + lp, b) != (pre + loop, base)})
    # every tile mask skips tiles here as in emit's kernel (an additive one under the bound in the
    # tile range both print, emit's bounded_skips); the rows whose maximum is not above a finite
    # fill's -T are flagged for the repair kernel: ``m`` is the softmax input's maximum in exp2's
    # units (times ``unit``)
    finite = [mask.threshold for mask in r.tile_masks if mask.threshold is not None]
    fill_threshold = -min(finite) * unit if finite and pr.skips_tiles else None
    source = _module(name, fb, list(pr.params), score_params, scores, k, rows, tile_range, store,
                     DTYPES[r.q.node.meta["val"].dtype], pr.tiles, pr.gates,
                     _scaled("q_in", r.q, GL) if q_tile_scale(r) else [], sm.weights,
                     out_tma, check_acc=r.v.node.meta["val"].dtype is not torch.float16,
                     saturation=SATURATION_LOG2[r.q.node.meta["val"].dtype], zero_empty_rows=sm.zero_empty_rows,
                     fill_threshold=fill_threshold, options=options, helpers=pr.helpers)
    return GluonPlan(name, source, list(pr.args), list(pr.inputs), operands, tuple(pr.summaries), r.D, r.Dv,
                     dense=not pr.skips_tiles, tiles=tuple(i for i, *_ in pr.tiles),
                     vectors=tuple(i for i, _, _, vector in pr.tiles if vector),
                     gates=tuple((i, axis) for i, axis, _, _ in pr.gates), streams=len(sm.weights),
                     store=out_tma[0] if out_tma else None, options=options, sym_nodes=tuple(pr.sym_nodes))


def _stream_lins(pr: _Printer) -> list:
    """``(suffix, line of its flat batch index)`` per stream, for Q's and K's rows: ``("", "lin")``
    alone without streams; with two, stream 0's names plain and stream 1's suffixed ``_1``, each
    stream's index (emit's ``stream_lin``) printed inline."""
    if pr.r.split is None:
        return [("", "lin")]
    return [("_1" if st else "", f"({pr.stream_lin_code(st)})") for st in pr.streams]


# The consumer's store of its rows ``out`` (fp32, [64, Dv] in the wgmma layout) into a contiguous
# [*batch, M, Dv] output, when the region has no output ops.
PLAIN_STORE = [
    "offs = gl.expand_dims(lin.to(gl.int64) * M + out_rows, 1) * DV + gl.expand_dims(out_cols, 0)",
    "gl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=gl.expand_dims(out_rows < M, 1))",
]


# The training forward's results after the output (emit_kernel's ``statistics``; the training
# plan's ``training_outputs`` must be these), stored by each consumer for its rows: the maximum the
# exponent was taken against, ``mu`` (exp2 units), in natural units, the reciprocal of the row
# sum, as the backward reads them, and O in fp32, from which the backward takes Δ.
TRAINING_OUTPUTS = ("m", "inv_l", "o")
STATISTICS_STORE = [
    "stat_at = lin.to(gl.int64) * M + out_rows",
    f"gl.store(side0_ptr + stat_at, gl.convert_layout(mu, o_rows) * {LN2!r}, mask=out_rows < M)",
    "gl.store(side1_ptr + stat_at, 1.0 / gl.convert_layout(l_sum, o_rows), mask=out_rows < M)",
    "gl.store(side2_ptr + gl.expand_dims(stat_at, 1) * DV + gl.expand_dims(out_cols, 0), out,"
    " mask=gl.expand_dims(out_rows < M, 1))",
]


def _output_store(pr: _Printer) -> list:
    """The epilogue's lines after ``out`` is normalized: the region's output ops (a gate, a
    transpose) printed by emit's printer onto the consumer's row and column indices, then the
    store at the output's own strides; PLAIN_STORE without output ops."""
    r = pr.r
    if not r.output_ops:
        return PLAIN_STORE
    pr.in_epilogue, pr.prefetch_epilogue, pr.post = True, False, []
    pr.store_through_output_ops()
    pr.in_epilogue = False
    return [f"{ROW} = gl.expand_dims(out_rows, 1)", f"{DVC} = gl.expand_dims(out_cols, 0)", *pr.post]


def attach(plan, region: Region, kinds: dict, statistics: bool = False) -> None:
    """Give ``plan`` (emit's KernelPlan of ``region``; with ``statistics``, the training forward's)
    its Gluon kernel, or the reason it has none.
    The Gluon kernel is an optional second form of a region the Triton kernel already computes:
    a failure to print it (a bug) is reported in a warning and the reason, never raised."""
    why = refusal(region, statistics)
    if why is None and statistics and plan.training_outputs != TRAINING_OUTPUTS:
        why = f"the training forward stores {', '.join(plan.training_outputs)}; STATISTICS_STORE stores m, inv_l, o"
    if why is None and plan.repair_args is None:
        why = "its rows could not be repaired where they leave the multiply-add form's range (no repair kernel)"
    if why is None:
        try:
            plan.gluon = emit_gluon(region, kinds, plan.name + "_gluon", plan.options, statistics).reindexed(
                plan.input_nodes, plan.sym_nodes)
        except Unprintable as exc:
            why = str(exc)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            why = f"{PRINTER_FAILED} ({type(exc).__name__}: {exc})"
            warnings.warn(f"fxflash: {why}; the region runs its Triton kernel", RuntimeWarning, stacklevel=2)
    plan.gluon_refusal = why or ""


PRINTER_FAILED = "printing it failed, a bug in fxflash's Gluon printer"


@dataclasses.dataclass(frozen=True)
class _StreamLines:
    """SKELETON's text that differs with two softmax streams (differential attention): the two
    consumers share each item's 64 rows, consumer s runs stream s with its own Q tile and K
    tiles (K buffer ``2·slot + s``; Q and K rows from the stream's batch index, ``q_row_1``…)
    and the shared V tile; at the end stream 1 hands its normalized ``O₁`` (fp32) to stream 0 in
    shared memory (``c_buf``, barriers ``o_bars``: 0 ready, 1 free again), and stream 0 stores
    ``w₀·O₀ + w₁·O₁``. Without streams the consumers own successive 64-row blocks."""

    count: int
    work: str = ""           # _work's extra values
    buffers: str = ""        # the extra shared memory every role is passed
    row_blocks: str = "CONSUMERS"  # 64-row blocks per item
    row0: str = "mt * (CONSUMERS * BM) + WG * BM"  # the consumer's first row
    stream_rows: str = ""    # _work: stream 1's Q rows at the item's row block
    q_loads: str = ""
    k_loads: str = ""
    k_slots: str = "NBUF"      # K buffers: one per ring slot and stream
    k_bytes: str = "k_desc.block_type.nbytes"  # what a ring slot's K tiles bring
    k_first: str = "t % NBUF"  # the consumer's K buffer of the item's first key tile
    k_loop: str = "idx"        # … and of key tile j (ring slot ``idx``)
    alloc: str = ""

    @classmethod
    def of(cls, count: int, tma_load: str) -> "_StreamLines":
        """The text for ``count`` streams (1 or 2), with this Triton's TMA load (gluon_api)."""
        if count == 1:
            return cls(1, q_loads=(f"\n    for c in gl.static_range(CONSUMERS):\n        {tma_load}(q_desc, "
                                   "[q_row + c * BM, q_col], q_ready.index(qb), q_bufs.index(qb * CONSUMERS + c))"),
                       k_loads=(f"\n        {tma_load}(k_desc, [k_row + key, k_col], k_ready.index(idx), "
                                "k_bufs.index(idx))"))
        names = ("", "_1")
        return cls(
            2, work=", q_row_1, k_row_1, q_col_1, k_col_1", buffers="c_buf, o_bars, ", row_blocks="1", row0="mt * BM",
            stream_rows="\n    q_row_1 = q_row_1 + mt * BLOCK_M",
            q_loads="".join(f"\n    {tma_load}(q_desc, [q_row{x}, q_col{x}], q_ready.index(qb), "
                            f"q_bufs.index(qb * CONSUMERS + {s}))" for s, x in enumerate(names)),
            k_loads="".join(f"\n        {tma_load}(k_desc, [k_row{x} + key, k_col{x}], k_ready.index(idx), "
                            f"k_bufs.index(idx * 2 + {s}))" for s, x in enumerate(names)),
            k_slots="NBUF * 2", k_bytes="2 * k_desc.block_type.nbytes", k_first="(t % NBUF) * 2 + WG",
            k_loop="idx * 2 + WG",
            alloc=("\n    c_buf = gl.allocate_shared_memory(gl.float32, [BM, DV], "
                   "gl.SwizzledSharedLayout(4, 1, 8, order=[1, 0]))"
                   "\n    o_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())"
                   "\n    mbarrier.init(o_bars.index(0), count=1)\n    mbarrier.init(o_bars.index(1), count=1)"))

    def epilogue(self, store: list, weights: tuple) -> list:
        """_attend's lines after ``out`` (this consumer's normalized rows): with one stream (weight
        1: softmax_of) ``store``; with two, the exchange, the weighted sum and stream 0's ``store``."""
        if self.count == 1:
            return list(store)
        w0, w1 = weights
        total = (("out" if w0 == 1.0 else f"out * {w0!r}")
                 + (f" - other * {-w1!r}" if w1 < 0 else f" + other * {w1!r}"))
        return ["if WG == 1:",
                "    mbarrier.wait(o_bars.index(1), (it & 1) ^ 1)  # stream 0 has read the previous item's",
                "    c_buf.store(out)",
                "    mbarrier.arrive(o_bars.index(0), count=1)",
                "else:",
                "    mbarrier.wait(o_bars.index(0), it & 1)",
                "    other = c_buf.load(o_layout)",
                "    mbarrier.arrive(o_bars.index(1), count=1)",
                f"    out = {total}",
                *("    " + line for line in store)]


def _module(name, fb, params, score_params, scores, k, rows, tile_range, store, dtype, tiles=(), gates=(),
            q_scale=(), weights=(1.0,), out_tma=None, check_acc=True, saturation=SATURATION_LOG2[torch.bfloat16],
            zero_empty_rows=False, fill_threshold=None, *, options: KernelOptions, helpers: set = frozenset()) -> str:
    """The kernel module's source (see the module docstring for its structure); ``scores``:
    score function name → (lines, returned value), ``_score_1`` stream 1's where it differs;
    ``store``: the epilogue's lines after ``out`` (_output_store); ``tiles`` and ``gates``: the
    inputs read by TMA (_GluonPrinter); ``q_scale``: emit's lines that scale the loaded Q tile
    ``q_in`` (q_tile_scale); ``weights``: each softmax stream's weight (Softmax.weights);
    ``out_tma``: the output stored by TMA (_GluonPrinter.tma_store); ``check_acc``: rows whose
    accumulator overflowed are flagged too (emit._Printer.bounded_accumulation); ``saturation``:
    the bound on a row's maximum in exp2 units beyond which it is flagged (emit.SATURATION_LOG2);
    ``zero_empty_rows``: a row whose every score is -inf is 0 (Softmax.zero_empty_rows), not NaN;
    ``helpers``: the helper functions the printed lines call (_Printer.helpers)."""
    api = gluon_api()
    streams = _StreamLines.of(len(weights), api["tma_load"])
    fbs = "".join(f"fb{i}, " for i in range(fb))
    sp = ", ".join(score_params)
    full = "_score_full" in scores
    names = [f"tile{j}" for j in range(len(tiles))]
    # a work item's values (_work): what the loader and the consumers need of it
    located = [*zip(names, ((sr, batch) for _, sr, batch, _ in tiles)), *(("gate0", (sr, batch)) for _, _, sr, batch in gates),
               *([("out", out_tma[1:3])] if out_tma else [])]
    work = (f"lin, {fbs}mt, q_row, k_row, v_row, q_col, k_col, v_col, lo_t, n_t{', f_lo, f_hi' if full else ''}"
            + streams.work + "".join(f", {t}_row, {t}_col" for t, _ in located))
    descs = "".join(f"{t}_desc, " for t, _ in located)
    common = (f"q_desc, k_desc, v_desc, {descs}q_bufs, k_bufs, v_bufs, {''.join(f'{t}_bufs, ' for t in names)}ones, "
              f"{streams.buffers}{'o_bufs, ' if out_tma else ''}"
              f"q_ready, q_empty, {'g_ready, q_free, ' if gates else ''}k_ready, v_ready, kv_empty, turns, out_ptr, sat_ptr, {work}, "
              f"{', '.join(params)}")
    # each TMA-read input's first row and column in its [R, sr] matrix, as Q's
    vectors = {f"tile{j}" for j, (*_, vector) in enumerate(tiles) if vector}  # one row for all the item's rows
    tile_work = [line for t, (sr, batch) in located for line in (
        f"{t}_off = lin.to(gl.int64) * 0 + {batch}",
        f"{t}_row = ({t}_off // {sr}).to(gl.int32)" + ("" if t in vectors else " + mt * BLOCK_M"),
        f"{t}_col = ({t}_off % {sr}).to(gl.int32)")]
    tile_loads = "".join(f"\n        {api['tma_load']}({t}_desc, [{t}_row, {t}_col + key], k_ready.index(idx), {t}_bufs.index(idx))"
                         for t in names)
    gate = _gate_lines(gates, api["tma_load"], common, out_tma is not None)
    if out_tma:
        store = _tma_store_lines(store, out_tma[3], api["tma_store"])
    unravel = []
    for i in reversed(range(fb)):
        unravel += [f"fb{i} = rest % FB{i}", f"rest = rest // FB{i}"]
    mt = "n_mt - 1 - item % n_mt" if options.heavy_rows_first else "item % n_mt"
    body = "\n".join
    helpers = [src for helper, src in HELPERS.items() if helper in helpers]   # those the printer's lines call
    score_fns = "\n\n\n".join(SCORE_FN.format(fn=fn, tiles="".join(t + ", " for t in names), fbs=fbs, sp=sp, x=x,
                                                 lines=body("    " + line for line in code))
                             for fn, (code, x) in scores.items())
    def score_call(key_tile: str, buf: str, indent: str) -> str:
        """``x`` for key tile ``key_tile`` (K/V ring buffer ``buf``): through ``_score_full`` on the run
        of full tiles; the consumer's rows of each TMA-read tile first."""
        reads = "".join(f"{t} = {t}_bufs.index({buf}){'' if t in vectors else '.slice(WG * BM, BM)'}.load(s_layout)\n{indent}"
                        for t in names)
        call = f"(s, rm, gl.expand_dims({key_tile} * BLOCK_N + cols, 0), {''.join(t + ', ' for t in names)}{fbs}{sp})"
        if "_score_1" in scores:  # stream 1's own scores (a compile-time branch: WG is constexpr)
            return f"if WG == 0:\n{indent}    x = _score{call}\n{indent}else:\n{indent}    x = _score_1{call}"
        if not full:
            return f"{reads}x = _score{call}"
        return (f"{reads}if ({key_tile} >= f_lo) & ({key_tile} < f_hi):\n{indent}    x = _score_full{call}\n"
                f"{indent}else:\n{indent}    x = _score{call}")
    consumers = "\n".join(
        f"@gluon.jit\ndef _consumer{wg}({common}, n_items, PINGPONG: gl.constexpr, ROWS_P2: gl.constexpr):\n"
        f"    _walk({common}, n_items, _consume_item, {wg}, PINGPONG, ROWS_P2)\n"
        + ("    tma.store_wait(0)  # the last item's copy out (STORE_DRAIN)\n" if out_tma else "") for wg in range(3))
    return SKELETON.format(
        name=name, tma_load=api["tma_load"], helpers="\n".join(helpers), fbs=fbs, common=common, sp=sp,
        params=", ".join(params), work=work, score_fns=score_fns, first_score=score_call("lo_t", "t % NBUF", "    "),
        loop_score=score_call("(lo_t + j)", "idx", "        "), k=repr(k), descs=descs, streams=streams,
        tile_work="".join("\n    " + line for line in tile_work), tile_loads=tile_loads, **gate,
        tile_bytes="".join(f" + {t}_desc.block_type.nbytes" for t in names),
        tile_alloc="".join(f"\n    {t}_bufs = gl.allocate_shared_memory({t}_desc.dtype, [NBUF, {1 if t in vectors else 'BLOCK_M'}, "
                           f"BLOCK_N], {t}_desc.layout)" for t in names),
        item=body("    " + line for line in ["n_mt = gl.cdiv(M, BLOCK_M)", f"mt = {mt}", "lin = item // n_mt",
                                               "rest = lin", *unravel, *rows]),
        items=" * ".join(["gl.cdiv(M, BLOCK_M)", *(f"FB{i}" for i in range(fb))]),
        tile_range=body("    " + line for line in tile_range), dtype=dtype, consumers=consumers,
        flt_max=FLT_MAX, saturation=repr(saturation), flag_streams=streams.count, check_acc=check_acc,
        fill_check="" if fill_threshold is None else f" | ~(m > {fill_threshold!r})",
        flag_stream="WG" if streams.count > 1 else "0", mma_row_sum=options.gluon_mma_row_sum and streams.count == 1, loader_regs=LOADER_REGS,
        tile_loads_read=bool(tiles), store_drain=STORE_DRAIN if out_tma else "", store_alloc=(
            "\n    if TMA_STORE:\n        o_bufs = q_bufs  # each consumer's rows leave through its Q buffer"
            "\n    else:\n        o_bufs = turns  # never read: the rows are stored per element" if out_tma else ""),
        store=body("    " + line for line in streams.epilogue(store, weights)), q_scale=_q_scale_lines(q_scale),
        normalize=_normalize(zero_empty_rows, options.row_reciprocal))


def _normalize(zero_empty_rows: bool, reciprocal: bool) -> str:
    """``out = acc {normalize}``: by ``1/l`` (``reciprocal``, options.row_reciprocal) or ``l``; with
    ``zero_empty_rows`` a row with ``l = 0`` (every score -inf, ``acc = 0``) gives 0, not 0/0."""
    if reciprocal:
        inverse = "gl.where(l_sum == 0, 0.0, 1.0 / l_sum)" if zero_empty_rows else "1.0 / l_sum"
        return f"* gl.expand_dims(gl.convert_layout({inverse}, o_rows), 1)"
    total = "gl.where(l_sum == 0, 1.0, l_sum)" if zero_empty_rows else "l_sum"
    return f"/ gl.expand_dims(gl.convert_layout({total}, o_rows), 1)"


def _tma_store_lines(store: list, value: str, tma_store: str) -> list:
    """The epilogue's ``store`` (its last line the per-element store of ``value``) for an output
    that may be stored by TMA (_GluonPrinter.tma_store). Where the launch's M is a multiple of the
    CTA's rows (``O_TMA``, a compile-time constant: ``o_bufs`` are then the Q buffers; a run-time
    test per item cost the whole gain, benchmarks/NOTES.md), every consumer's rows are whole and
    the item's own: they are written into the consumer's Q buffer, whose gate it has read, and
    copied out by TMA, and the buffer goes back to the loader once the copy has read it (the
    fence before the copy ordered the gate's loads and these writes, the generic proxy's, before
    TMA's). Otherwise they are stored per element (TMA would write past M into the next item's
    rows of the output's [R, sr] matrix) and the buffer was released after the gate's read.
    The consumer does not wait for the copy here: see ``STORE_DRAIN``."""
    *lines, per_element = store
    return [*lines,
            "if O_TMA:  # the rows by TMA through the Q buffer (_tma_store_lines)",
            "    o_buf = o_bufs.index(qb * CONSUMERS + WG)",
            f"    o_buf.store(({value}).to(out_desc.dtype))",
            "    fence_async_shared()",
            f"    {tma_store}(out_desc, [out_row + WG * BM, out_col], o_buf)",
            "else:",
            f"    {per_element}"]


# _attend's lines after the item's first Q·Kᵀ is issued, where the output may leave by TMA
# (_tma_store_lines): the previous item's copy has read its Q buffer (``cp.async.bulk.wait_group.read``),
# which then goes back to the loader. Waiting right after the copy, before the next item, cost
# 1.5 % at B=8 and 2.6 % at B=32 on the Evoformer (benchmarks/NOTES.md, 2026-11-24). Every
# item of this consumer stored by TMA (O_TMA: M is a multiple of the CTA's rows, so no consumer
# only passes an item), so the item before it left one copy; the consumer's last copy is waited
# for after its walk (``_consumer{wg}``), before the CTA's shared memory can be reused.
STORE_DRAIN = """
    O_TMA: gl.constexpr = len(o_bufs.type.shape) == 3  # the rows leave by TMA (_tma_store_lines)
    if O_TMA:  # the previous item's rows left by TMA
        if QB > 1:
            if it > 0:
                tma.store_wait(0)
                mbarrier.arrive(q_empty.index((it + QB - 1) % QB), count=1)"""


# The layout in which a consumer's 4 warps read and rewrite their [64, D] Q tile: 16 bytes a thread.
Q_TILE_LAYOUT = "gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])"


def _q_scale_lines(scale: list) -> str:
    """SKELETON's lines that read the consumer's Q tile ``q`` from shared memory, apply ``scale``
    (emit's ``_scaled`` lines for ``q_in``: each op in fp32, rounded to Q's dtype as eager rounds)
    and write it back, fenced for the wgmma that reads it; none without a scale."""
    if not scale:
        return ""
    return "".join(f"\n    {line}" for line in [f"q_in = q.load({Q_TILE_LAYOUT})  # Q's scale (q_tile_scale)", *scale,
                                                   "q.store(q_in)", "fence_async_shared()"])


def _gate_lines(gates, tma_load: str, common: str, kept_for_store: bool = False) -> dict:
    """SKELETON's placeholders for an output gate read by TMA (``gates``: at most one): a second
    loader warp (``_gate_loader``) walks the CTA's items and puts each item's gate rows into its
    Q buffers once every consumer's last ``Q·Kᵀ`` of it has completed (``q_free``); the epilogue
    waits for them (``g_ready``) and then releases the buffers (``q_empty``). The K/V loader never
    waits for them (as its one warp, measured 7 % slower: benchmarks/NOTES.md). Without a gate
    the Q buffers are released at the last ``Q·Kᵀ``; with ``kept_for_store`` the epilogue keeps them
    for the output's TMA store (STORE_DRAIN releases them)."""
    if not gates:
        return dict(gate_fns="", extra_worker="", extra_warps="", extra_regs="", pass_release="q_empty", pass_end="",
                    gate_read="", gate_alloc="", attend_release="    if QB > 1:\n        mbarrier.arrive(q_empty.index(qb), "
                    "count=1)  # every Q·Kᵀ of this item has completed")
    return dict(
        gate_fns=(f"\n\n\n@gluon.jit\ndef _load_gate_item({common}, t, it, WG: gl.constexpr, PINGPONG: gl.constexpr):"
                   "\n    \"\"\"The CTA's it-th item's gate rows into its Q buffers once every consumer's last Q·Kᵀ of"
                   "\n    the item has completed (the second loader warp: _gate_loader).\"\"\""
                   "\n    CONSUMERS: gl.constexpr = turns.type.shape[0]"
                   "\n    QB: gl.constexpr = q_bufs.type.shape[0] // CONSUMERS"
                   "\n    BM: gl.constexpr = q_desc.block_type.shape[0]"
                   "\n    qb = it % QB"
                   "\n    mbarrier.wait(q_free.index(qb), (it // QB) & 1)"
                   "\n    mbarrier.expect(g_ready.index(qb), CONSUMERS * gate0_desc.block_type.nbytes)"
                   "\n    for c in gl.static_range(CONSUMERS):"
                   f"\n        {tma_load}(gate0_desc, [gate0_row + c * BM, gate0_col], g_ready.index(qb), "
                   "q_bufs.index(qb * CONSUMERS + c))"
                   f"\n\n\n@gluon.jit\ndef _gate_loader({common}, n_items, PINGPONG: gl.constexpr, ROWS_P2: gl.constexpr):"
                   "\n    \"\"\"One warp: the gates (_load_gate_item).\"\"\""
                   f"\n    _walk({common}, n_items, _load_gate_item, 0, PINGPONG, ROWS_P2)"),
        extra_worker=", (_gate_loader, args)", extra_warps=", 1", extra_regs=f", {LOADER_REGS}",
        pass_release="q_free",
        pass_end="\n    mbarrier.wait(g_ready.index(qb), (it // QB) & 1)\n    mbarrier.arrive(q_empty.index(qb), count=1)",
        attend_release="    mbarrier.arrive(q_free.index(qb), count=1)  # every Q·Kᵀ of this item has completed: the gate may come",
        gate_read=("\n    mbarrier.wait(g_ready.index(qb), (it // QB) & 1)"
                   "\n    gate0 = q_bufs.index(qb * CONSUMERS + WG).load(o_layout)"
                   + ("\n    if not O_TMA:\n        if QB > 1:\n            _release(q_empty.index(qb), True)"
                      if kept_for_store else "\n    if QB > 1:\n        _release(q_empty.index(qb), True)")),
        gate_alloc=("\n    g_ready = gl.allocate_shared_memory(gl.int64, [QB, 1], mbarrier.MBarrierLayout())"
                    "\n    q_free = gl.allocate_shared_memory(gl.int64, [QB, 1], mbarrier.MBarrierLayout())"
                    "\n    for i in gl.static_range(QB):"
                    "\n        mbarrier.init(g_ready.index(i), count=1)\n        mbarrier.init(q_free.index(i), count=CONSUMERS)"))


# A score function (``_score``, and ``_score_full`` with the masks folded).
SCORE_FN = '''@gluon.jit
def {fn}(s, rm, cn, {tiles}{fbs}{sp}):
    """The region's scores for one key tile (``s`` = Q·Kᵀ, rows ``rm``, keys ``cn``, the consumer's
    rows of each TMA-read tile), as the maximum reads them (without their folded positive factor)."""
    col_ok = cn < N
{lines}
    return {x}'''

# The kernel module. Placeholders: the region's score lines and parameters, the item's
# unravelling and rows, the tile range, Gluon's TMA load spelling and the operands' dtype.
SKELETON = '''import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.language.extra import libdevice

L1D: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
MMA_ROW_SUM = gl.constexpr({mma_row_sum})  # config.gluon_mma_row_sum (gluon_plan.row_sums_by_mma)
CHECK_ACC = gl.constexpr({check_acc})  # V is not fp16: Σ E(x − m)·V can overflow where eager's Σ p·V does not
TILE_LOADS = gl.constexpr({tile_loads_read})  # the consumers read score tiles from the K/V ring (_release)
{helpers}

{score_fns}


@gluon.jit
def _take_turn(turns, k, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: wait until the previous consumer has issued its k-th wgmmas (consumer 0's
    first wait passes: a fresh mbarrier has completed phase -1)."""
    if PINGPONG:
        if WG == 0:
            mbarrier.wait(turns.index(0), (k & 1) ^ 1)
        else:
            mbarrier.wait(turns.index(WG), k & 1)


@gluon.jit
def _pass_turn(turns, WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turns.index((WG + 1) % turns.type.shape[0]), count=1)


@gluon.jit
def _release(bar, READ_BY_LOADS: gl.constexpr):
    """Hand a buffer back to the loader, whose TMA (the async proxy) overwrites it next; where
    the consumer read it with ordinary shared-memory loads (a score tile, the gate), a proxy
    fence first orders those reads before TMA's writes (the module docstring: wrong results
    measured without it)."""
    if READ_BY_LOADS:
        fence_async_shared()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _work(item, {params}, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, ROWS_P2: gl.constexpr):
    """Work item ``item`` (a batch index and a block of BLOCK_M rows) → its batch indices, each
    operand's first row and column in its [R, sr] matrix, and its key tiles [lo_t, lo_t + n_t)."""
{item}
    q_row = q_row + mt * BLOCK_M{streams.stream_rows}{tile_work}
{tile_range}
    lo_t = gl.minimum(lo_t, gl.cdiv(N, BLOCK_N) - 1)
    n_t = gl.maximum(hi_t - lo_t, 1)
    return {work}


@gluon.jit
def _walk({common}, n_items, STEP: gl.constexpr, WG: gl.constexpr, PINGPONG: gl.constexpr,
          ROWS_P2: gl.constexpr):
    """One role's part (STEP: _load_item or _consume_item) of the CTA's item, or on a persistent
    grid (two Q buffers) of items pid, pid + grid, … in turn, each item's work computed here."""
    CONSUMERS: gl.constexpr = turns.type.shape[0]
    if q_bufs.type.shape[0] == CONSUMERS:
        STEP({common}, 0, 0, WG, PINGPONG)
    else:
        BLOCK_M: gl.constexpr = {streams.row_blocks} * q_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
        t = 0
        it = 0
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            {work} = _work(item, {params}, BLOCK_M, BLOCK_N, ROWS_P2)
            STEP({common}, t, it, WG, PINGPONG)
            t += n_t
            it += 1


@gluon.jit
def _loader({common}, n_items, PINGPONG: gl.constexpr, ROWS_P2: gl.constexpr):
    """One warp: the loads (_load_item)."""
    _walk({common}, n_items, _load_item, 0, PINGPONG, ROWS_P2)


@gluon.jit
def _load_item({common}, t, it, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """The CTA's it-th item: its Q tiles into Q buffer it mod QB once every consumer is done with
    that buffer's previous item, then K_j and V_j into ring buffer (t + j) mod NBUF once every
    consumer has released it (t: the key tiles of the CTA's earlier items)."""
    CONSUMERS: gl.constexpr = turns.type.shape[0]
    QB: gl.constexpr = q_bufs.type.shape[0] // CONSUMERS
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    NBUF: gl.constexpr = v_bufs.type.shape[0]
    qb = it % QB
    if QB > 1:
        mbarrier.wait(q_empty.index(qb), ((it // QB) & 1) ^ 1)
    mbarrier.expect(q_ready.index(qb), CONSUMERS * q_desc.block_type.nbytes){streams.q_loads}
    for j in range(n_t):
        idx = (t + j) % NBUF
        mbarrier.wait(kv_empty.index(idx), (((t + j) // NBUF) & 1) ^ 1)
        key = (lo_t + j) * BLOCK_N
        mbarrier.expect(k_ready.index(idx), {streams.k_bytes}{tile_bytes}){streams.k_loads}{tile_loads}
        mbarrier.expect(v_ready.index(idx), v_desc.block_type.nbytes)
        {tma_load}(v_desc, [v_row + key, v_col], v_ready.index(idx), v_bufs.index(idx)){gate_fns}


@gluon.jit
def _consume_item({common}, t, it, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Consumer WG's part of the CTA's it-th item (_attend), or on a persistent grid where none
    of its 64 rows is below M, only its share of the item's barriers (_pass; gluon_launch.grid
    spreads such items over the CTAs)."""
    CONSUMERS: gl.constexpr = turns.type.shape[0]
    BM: gl.constexpr = q_desc.block_type.shape[0]
    if ({streams.row_blocks} > 1) and (q_bufs.type.shape[0] > CONSUMERS):
        if mt * (CONSUMERS * BM) + WG * BM < M:
            _attend({common}, t, it, WG, PINGPONG)
        else:
            _pass({common}, t, it, WG, PINGPONG)
    else:
        _attend({common}, t, it, WG, PINGPONG)


@gluon.jit
def _pass({common}, t, it, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """A consumer without rows in the item: waits for each of its buffers to be loaded (so that
    no release runs ahead of a load), releases it and takes its ping-pong turns."""
    QB: gl.constexpr = q_bufs.type.shape[0] // turns.type.shape[0]
    NBUF: gl.constexpr = v_bufs.type.shape[0]
    qb = it % QB
    mbarrier.wait(q_ready.index(qb), (it // QB) & 1)
    mbarrier.arrive({pass_release}.index(qb), count=1)
    for j in range(n_t):
        idx = (t + j) % NBUF
        mbarrier.wait(k_ready.index(idx), ((t + j) // NBUF) & 1)
        mbarrier.wait(v_ready.index(idx), ((t + j) // NBUF) & 1)
        _take_turn(turns, t + it + j, WG, PINGPONG)
        _pass_turn(turns, WG, PINGPONG)
        mbarrier.arrive(kv_empty.index(idx), count=1)
    _take_turn(turns, t + it + n_t, WG, PINGPONG)
    _pass_turn(turns, WG, PINGPONG){pass_end}


@gluon.jit
def _attend({common}, t, it, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """One warp group (consumer WG), 64 query rows of the CTA's it-th item: S_(j+1) = Q·K_(j+1)ᵀ
    issued before O += P_j·V_j, the online softmax of S_(j+1) under that product, O rescaled once
    it has landed. Ring buffer (t + j) mod NBUF and ping-pong turn t + it + j count over the
    CTA's items."""
    CONSUMERS: gl.constexpr = turns.type.shape[0]
    QB: gl.constexpr = q_bufs.type.shape[0] // CONSUMERS
    BM: gl.constexpr = q_desc.block_type.shape[0]
    DV: gl.constexpr = v_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    NBUF: gl.constexpr = v_bufs.type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DV, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    l_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 16])
    lp_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=l_layout, k_width=2)
    l_rows: gl.constexpr = gl.SliceLayout(1, l_layout)
    ROW_SUM: gl.constexpr = len(ones.type.shape) == 2  # Σ p as P·1 (the kernel allocated the ones)
    zero_s = gl.zeros([BM, BLOCK_N], gl.float32, s_layout)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    row0 = {streams.row0}
    rm = gl.expand_dims(row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout)), 1)
    qb = it % QB
    q = q_bufs.index(qb * CONSUMERS + WG)
    mbarrier.wait(q_ready.index(qb), (it // QB) & 1){q_scale}
    acc = gl.zeros([BM, DV], gl.float32, o_layout)

    mbarrier.wait(k_ready.index(t % NBUF), (t // NBUF) & 1)
    _take_turn(turns, t + it, WG, PINGPONG)
    s = warpgroup_mma(q, k_bufs.index({streams.k_first}).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    _pass_turn(turns, WG, PINGPONG){store_drain}
    s = warpgroup_mma_wait(0, deps=(s, ))
    {first_score}
    mx = gl.max(x, axis=1)
    m = mx * {k}
    seen = mx != float('-inf')  # a score above -inf (m·k may overflow to -inf where it is finite)
    mu = gl.maximum(m, -{flt_max})
    p = gl.exp2(x * {k} - gl.expand_dims(mu, 1))
    if ROW_SUM:
        l_acc = gl.zeros([BM, 8], gl.float32, l_layout)
    else:
        l_sum = gl.sum(p, axis=1)
    p = p.to({dtype})
    for j in range(1, n_t):
        idx = (t + j) % NBUF
        prev = (t + j - 1) % NBUF
        mbarrier.wait(k_ready.index(idx), ((t + j) // NBUF) & 1)
        mbarrier.wait(v_ready.index(prev), ((t + j - 1) // NBUF) & 1)
        p_op = gl.convert_layout(p, p_layout)
        _take_turn(turns, t + it + j, WG, PINGPONG)
        if ROW_SUM:  # issued first: it completes with S_(j+1), before the wait below
            l_acc = warpgroup_mma(gl.convert_layout(p_op, lp_layout), ones.permute((1, 0)), l_acc, is_async=True)
        s_next = warpgroup_mma(q, k_bufs.index({streams.k_loop}).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        acc = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=True)
        _pass_turn(turns, WG, PINGPONG)
        if ROW_SUM:
            s, l_acc = warpgroup_mma_wait(1, deps=(s_next, l_acc))
        else:
            s = warpgroup_mma_wait(1, deps=(s_next, ))
        {loop_score}
        mx = gl.max(x, axis=1)
        m = gl.maximum(m, mx * {k}, propagate_nan=tl.PropagateNan.ALL)
        seen = seen | (mx != float('-inf'))
        mu_new = gl.maximum(m, -{flt_max})
        alpha = gl.exp2(mu - mu_new)
        p = gl.exp2(x * {k} - gl.expand_dims(mu_new, 1))
        if not ROW_SUM:
            l_sum = l_sum * alpha + gl.sum(p, axis=1)
        p = p.to({dtype})
        mu = mu_new
        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
        _release(kv_empty.index(prev), TILE_LOADS)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
        if ROW_SUM:
            l_acc = l_acc * gl.expand_dims(gl.convert_layout(alpha, l_rows), 1)
{attend_release}
    last = (t + n_t - 1) % NBUF
    mbarrier.wait(v_ready.index(last), ((t + n_t - 1) // NBUF) & 1)
    p_op = gl.convert_layout(p, p_layout)
    _take_turn(turns, t + it + n_t, WG, PINGPONG)
    acc = warpgroup_mma(p_op, v_bufs.index(last), acc, is_async=True)
    if ROW_SUM:
        l_acc = warpgroup_mma(gl.convert_layout(p_op, lp_layout), ones.permute((1, 0)), l_acc, is_async=True)
    _pass_turn(turns, WG, PINGPONG)
    if ROW_SUM:
        acc, l_acc, p_op = warpgroup_mma_wait(0, deps=(acc, l_acc, p_op))
        l_sum = gl.max(l_acc, axis=1)  # its 8 columns are equal
    else:
        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    _release(kv_empty.index(last), TILE_LOADS)

    # rows whose running maximum reached emit.SATURATION_LOG2 (the multiply-add form's exact range,
    # or in fp16 where eager's own rounding decides) and that saw a score above -inf (a row of
    # -inf scores is 0 with zero_empty_rows, else 0/0 = NaN throughout, as eager's softmax),
    # and over bf16 V rows whose unnormalized accumulator overflowed (emit's bounded_accumulation):
    # flagged for the launch's repair kernel, which computes them again in eager's own form
    sat_rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    saturated = ~(gl.abs(m) < {saturation}) & seen{fill_check}
    if CHECK_ACC:
        overflowed = gl.max((~(gl.abs(acc) < float('inf'))).to(gl.int32), axis=1) > 0
        saturated = saturated | gl.convert_layout(overflowed, gl.SliceLayout(1, s_layout))
    gl.store(sat_ptr + (lin.to(gl.int64) * M + sat_rows) * {flag_streams} + {flag_stream},
             saturated.to(gl.int8), mask=sat_rows < M)
    out = acc {normalize}
    out_rows = row0 + gl.arange(0, BM, layout=o_rows)
    out_cols = gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout)){gate_read}
{store}


# One wrapper per consumer: warp_specialize passes its workers run-time values only, and a
# consumer's index must be a compile-time constant.
{consumers}

@gluon.jit
def {name}(q_desc, k_desc, v_desc, {descs}out_ptr, sat_ptr, {params}, CONSUMERS: gl.constexpr, NBUF: gl.constexpr,
           CONSUMER_REGS: gl.constexpr, PINGPONG: gl.constexpr, ROWS_P2: gl.constexpr, PERSISTENT: gl.constexpr,
           CTAS: gl.constexpr, TMA_STORE: gl.constexpr):
    """One CTA per work item (a batch index and a block of 64·CONSUMERS rows; 64 with streams), or with
    PERSISTENT fewer CTAs that walk the items (Q in two buffers: the next item's loads under this
    one's epilogue); a loader warp and CONSUMERS warp groups. ROWS_P2: 64·CONSUMERS rounded up
    to a power of two. TMA_STORE: the output's rows are stored by TMA (a region that can, at a
    launch whose M is a multiple of the CTA's rows: gluon_launch.stores_by_tma)."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    DV: gl.constexpr = v_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = {streams.row_blocks} * BM
    QB: gl.constexpr = 1 + PERSISTENT
    {work} = _work(gl.program_id(0), {params}, BLOCK_M, BLOCK_N, ROWS_P2)
    n_items = {items}
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [QB * CONSUMERS, BM, D], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [{streams.k_slots}, BLOCK_N, D], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [NBUF, BLOCK_N, DV], v_desc.layout){tile_alloc}{streams.alloc}
    if MMA_ROW_SUM and CTAS == 1:  # gluon_plan.row_sums_by_mma: the ones of P·1, keys along rows like K's
        fill: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
        ones = gl.allocate_shared_memory(k_desc.dtype, [8, BLOCK_N], k_desc.layout,
                                         gl.full([8, BLOCK_N], 1.0, k_desc.dtype, fill))
        fence_async_shared()
    else:
        ones = k_bufs  # never read: each row's sum is added up by the consumer
    q_ready = gl.allocate_shared_memory(gl.int64, [QB, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(QB):
        mbarrier.init(q_ready.index(i), count=1)
    if PERSISTENT:
        q_empty = gl.allocate_shared_memory(gl.int64, [QB, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(QB):
            mbarrier.init(q_empty.index(i), count=CONSUMERS)
    else:
        q_empty = q_ready  # never waited on with one Q buffer{gate_alloc}{store_alloc}
    for i in gl.static_range(NBUF):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=CONSUMERS)
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(turns.index(i), count=1)
    args = ({common}, n_items, PINGPONG, ROWS_P2)
    if CONSUMERS == 1:
        gl.warp_specialize([(_consumer0, args), (_loader, args){extra_worker}], [1{extra_warps}], [{loader_regs}{extra_regs}])
    elif CONSUMERS == 2:
        gl.warp_specialize([(_consumer0, args), (_consumer1, args), (_loader, args){extra_worker}], [4, 1{extra_warps}],
                           [CONSUMER_REGS, {loader_regs}{extra_regs}])
    else:
        gl.warp_specialize([(_consumer0, args), (_consumer1, args), (_consumer2, args), (_loader, args){extra_worker}],
                           [4, 4, 1{extra_warps}], [CONSUMER_REGS, CONSUMER_REGS, {loader_regs}{extra_regs}])
'''
