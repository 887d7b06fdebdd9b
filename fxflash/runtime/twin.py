"""The backward of a region with several softmax streams (differential attention), through its twin.

A region whose streams are selected from one score frame (``Region.split``: the Diff Transformer's
``softmax(s).view(B, H, 2, M, N)``, then ``a₀ − λ·a₁``) multiplies the streams' combination into V.
Its twin moves ``P·V`` before the combination, which is linear: each stream's ``Oₛ = Pₛ·V`` is one
softmax attention over the score frame's own heads, V broadcast over the streams as grouped-query
attention broadcasts a K/V head, and ``O = O₀ − λ·O₁`` is then computed from the streams' outputs.

The twin is the region's own ops so rewritten (``twin_graph``), captured and fused like any graph:
its one region is a plain softmax attention, whose training forward and fused backward are the
generated kernels. The region's backward differentiates the twin with autograd (runtime/op.py):
the twin's forward runs again, then its fused backward, and autograd's own for the combination,
which gives λ its gradient. The combination is elementwise on ``[*, M, Dv]``; no ``[*, M, N]``
tensor is held. The gradients are the twin's, within its rounding of the same sums (the region's
forward, run as eager rounds ``a₀ − λ·a₁`` before ``P·V``, is not the twin).

``twin_refusal`` decides, from the region alone, whether the rewrite holds: every op between the
stream selects and P·V is linear in the streams (a sum, a difference, a negation, a product or
quotient by a value constant along the keys), and every size is static.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx
from torch.fx.passes.tools_common import legalize_graph

from ..analysis.ops import packet
from ..codegen.plan import pow2
from ..patterns.region import Region
from ..tile.backward import attention_output

aten = torch.ops.aten
_SUMS = {aten.add, aten.sub}       # a sum of two streams' values (or of one and a constant)
_SCALINGS = {aten.mul, aten.div}   # a stream's value times, or over, a factor constant along the keys
_VIEWS = {aten.view, aten._unsafe_view, aten.reshape, aten.expand}
# The widest head dim (D, or the streams' V, 2·D in the Diff Transformer) a twin is built for. On an
# H100 (bf16, B = 4, 4k, one forward plus backward, benchmarks/NOTES.md) the twin took differential
# attention from 39.9 to 30.1 ms at D = 64 (V 128 wide) and from 22.9 to 43.4 ms at D = 128 (V 256
# wide, whose backward kernels hold 32-row tiles): there the region's own ops are recomputed.
TWIN_MAX_WIDTH = 128


@dataclasses.dataclass(frozen=True)
class StreamTwin:
    """Where the rewrite acts, by the names the region's nodes have in its reference graph
    (runtime/rewrite.reference_subgraph keeps them): the view that splits the score frame and its
    shape, each select of a stream (name → (axis, stream)), the combined P, the P·V result, and the
    sizes M, N, Dv and the score frame's batch shape."""

    view: str
    view_shape: tuple
    selects: tuple        # ((name, axis, stream), …)
    p: str
    output: str
    frame_batch: tuple
    m: int
    n: int
    dv: int


def _static(shape) -> bool:
    return all(type(s) is int for s in shape)


def twin_refusal(r: Region) -> str | None:
    """Why the twin's rewrite does not hold for ``r`` (a region with streams), or None."""
    split = r.split
    if split is None:
        return "a region without streams"
    shapes = [tuple(n.meta["val"].shape) for n in (r.frame, split.view, attention_output(r))]
    if not all(_static(s) for s in shapes):
        return "sizes known only at run time"
    if pow2(max(r.D, r.Dv)) > TWIN_MAX_WIDTH:
        return (f"its twin's backward would hold {max(r.D, r.Dv)}-wide tiles, which run slower than the "
                f"recompute (at most {TWIN_MAX_WIDTH})")
    out_rank = len(attention_output(r).meta["val"].shape)
    for node in r.combined:
        if node in split.selects:
            continue
        p = packet(node.target)
        streams = [a for a in node.args if isinstance(a, fx.Node) and (a in r.combined or a in split.selects)]
        others = [a for a in node.args if a not in streams]
        if p in _SUMS and "alpha" not in node.kwargs and len(streams) in (1, 2):
            if len(streams) == 1 and any(not isinstance(a, (int, float)) or a != 0 for a in others):
                return f"{node.name} adds a constant to a stream's probabilities"
            continue
        if p is aten.neg:
            continue
        if p in _SCALINGS and len(streams) == 1 and (p is aten.mul or node.args[0] in streams):
            factor = others[0] if others else None
            value = factor.meta.get("val") if isinstance(factor, fx.Node) else factor
            if isinstance(value, torch.Tensor) and value.dim() and (value.dim() > out_rank or value.shape[-1] != 1):
                return f"{node.name} scales a stream by a value that varies along the keys"
            continue
        return f"{node.name} ({node.target}) is not linear in the streams"
    return None


def stream_twin(r: Region) -> StreamTwin:
    """The rewrite's places in ``r`` (twin_refusal holds)."""
    split, out = r.split, attention_output(r)
    frame = tuple(r.frame.meta["val"].shape)
    return StreamTwin(split.view.name, tuple(split.view.meta["val"].shape),
                      tuple((s.name, s.args[1], stream) for s, stream in split.selects.items()),
                      r.p_node.name, out.name, frame[:-2], frame[-2], frame[-1], int(out.meta["val"].shape[-1]))


def _v_operand(output: fx.Node) -> fx.Node:
    """V as P·V reads it in the output's frame, ``[*batch, N, Dv]``: the batched matmul's second
    operand, through the views the decomposition of ``matmul`` added."""
    node = output
    while packet(node.target) in _VIEWS:
        node = node.args[0]
    if packet(node.target) is not aten.bmm:
        raise ValueError(f"P·V is {node.target}, not a batched matmul")
    v, rank = node.args[1], output.meta["val"].dim()
    while v.meta["val"].dim() != rank and packet(v.target) in _VIEWS:
        v = v.args[0]
    if v.meta["val"].dim() != rank:
        raise ValueError("V's frame is not the output's")
    return v


def twin_graph(reference: fx.GraphModule, twin: StreamTwin) -> fx.GraphModule:
    """A copy of ``reference`` in which P·V is taken per stream and the combination is applied to
    the streams' outputs: ``Oₛ = select(reshape(S_frame_P · V_rep), axis, s)``, ``V_rep`` V broadcast
    over the streams' axis of the split view; every use of the P·V result then reads the combined
    value, which the selects now feed with ``[*, M, Dv]`` tensors."""
    gm = fx.GraphModule(reference, reference.graph.__deepcopy__())
    nodes = {n.name: n for n in gm.graph.nodes}
    view, output = nodes[twin.view], nodes[twin.output]
    (_, axis, _), *_ = twin.selects
    axis %= len(twin.view_shape)
    graph = gm.graph
    with graph.inserting_before(output):
        v = _v_operand(output)
        v_rep = graph.call_function(aten.reshape.default, (graph.call_function(aten.expand.default, (
            graph.call_function(aten.unsqueeze.default, (v, axis)), [*twin.view_shape[:-2], twin.n, twin.dv])),
            [*twin.frame_batch, twin.n, twin.dv]))
        o = graph.call_function(aten.matmul.default, (view.args[0], v_rep))
        o = graph.call_function(aten.reshape.default, (o, [*twin.view_shape[:-2], twin.m, twin.dv]))
        for name, a, stream in twin.selects:
            nodes[name].replace_all_uses_with(graph.call_function(aten.select.int, (o, a, stream)))
    output.replace_all_uses_with(nodes[twin.p])
    # the combination now follows P·V, which reads V (placed after it in the reference): sorted again
    gm = legalize_graph(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


@dataclasses.dataclass
class Twin:
    """The twin, fused: ``module(*tensors)`` returns the reference's outputs, for the extras
    (sizes, floats) it was captured with; ``report``: its region's (its backward's programs)."""

    module: fx.GraphModule
    extras: tuple
    report: object


# Twins built in this process, by the reference's code, the inputs' layouts and the extras: the
# identical layers of a model share one (at most TWINS of them kept).
TWINS = 64
_built: dict = {}


def build_twin(r: Region, reference: fx.GraphModule, inputs: list, extras: list) -> Twin:
    """The twin of ``r`` (twin_refusal holds) captured on ``inputs`` (tensors of the region's input
    layouts) with ``extras`` baked in, and fused; one built before for the same ops and layouts is
    reused. Raises ValueError where its region did not fuse with a fused backward."""
    spec = stream_twin(r)
    key = (reference.code, spec, tuple(extras),
           tuple((tuple(t.shape), t.stride(), t.dtype, t.device) for t in inputs))
    if key not in _built:
        if len(_built) >= TWINS:
            _built.clear()
        _built[key] = _fused_twin(twin_graph(reference, spec), inputs, extras)
    return _built[key]


def _fused_twin(module: fx.GraphModule, inputs: list, extras: list) -> Twin:
    from torch._guards import tracing

    from ..capture.trace import capture
    from ..pipeline import optimize_graph


    def run(*tensors):
        return module(*tensors, *extras)

    # traced apart from the compiler's own tracing (the backend builds twins inside Dynamo's), as
    # the backend traces its graphs: no guard of this trace reaches Dynamo's shape environment
    with tracing(None):
        captured = capture(run, tuple(inputs))
    fused, report = optimize_graph(captured.graph_module)
    regions = [region for region in report.regions if region.fused]
    if len(regions) != 1 or regions[0].backward != "fused":
        why = "; ".join(f"{region.rule}: {region.reason}" if not region.fused else region.backward
                        for region in report.regions) or "no attention found"
        raise ValueError(f"its twin did not fuse with a fused backward ({why})")
    return Twin(fused, tuple(extras), regions[0])
