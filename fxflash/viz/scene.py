"""What a drawing of a captured graph shows, independent of the drawing engine.

A :class:`Scene` is a networkx DiGraph of boxes: one per FX node (labelled with its name, op
and sketch) or, with ``collapse``, one per connected group of ops outside every region
("5 ops: transpose, expand, …"). Nodes of a candidate region carry its index; in their
sketches the demoted dimension is marked ``↓`` and the dimensions eliminated by tiling ``∅``.
"""
from __future__ import annotations

import dataclasses

import networkx as nx

from ..analysis.sketch import dim_name
from ..report import Report

DEMOTED_MARK = "↓"
ELIMINATED_MARK = "∅"
# Fill colours of fused regions, in order (a colour-blind-safe qualitative palette).
REGION_COLOURS = ("#8dd3c7", "#fdb462", "#bebada", "#80b1d3", "#b3de69", "#fccde5", "#ffed6f", "#bc80bd")
REFUSED_COLOUR = "#e0e0e0"
REFUSED_EDGE = "#d62728"
PLAIN_COLOUR = "#ffffff"
IO_COLOUR = "#f4f4f4"
COLLAPSED_COLOUR = "#fafafa"
COLLAPSED_NAMES = 3  # op names listed in a collapsed box


@dataclasses.dataclass(frozen=True)
class SceneRegion:
    """One candidate region as drawn: its colour and title."""

    index: int
    fused: bool
    colour: str
    title: str


@dataclasses.dataclass
class Scene:
    """``graph``: box id → attributes ``label``, ``region`` (index or None), ``kind``
    ("op" | "io" | "collapsed"); edges follow the dataflow. ``regions``: SceneRegion by index."""

    graph: nx.DiGraph
    regions: dict

    def fill(self, box) -> str:
        attrs = self.graph.nodes[box]
        if attrs["region"] is not None:
            return self.regions[attrs["region"]].colour
        return {"io": IO_COLOUR, "collapsed": COLLAPSED_COLOUR}.get(attrs["kind"], PLAIN_COLOUR)


def _marked_sketch(sketch, dims) -> str:
    """The sketch with the demoted dimension marked ``↓`` (in a score-frame value: the last
    occurrence of N, as rows and keys may share an id) and the eliminated ones ``∅``."""
    par, red = sketch.parallel, sketch.reduced
    key_at = len(par) - 1 - par[::-1].index(dims.N) if dims.has_key_axis(sketch) else None

    def mark(ds, key_index):
        return ", ".join(dim_name(d) + (DEMOTED_MARK if i == key_index else
                                        ELIMINATED_MARK if d in dims.eliminated else "") for i, d in enumerate(ds))

    return f"[({mark(par, key_at)}), ({mark(red, red.index(dims.N) if dims.N in red else None)})]"


def _title(index: int, region) -> str:
    dims = f"demoted {region.demoted}{DEMOTED_MARK}"
    if region.fused:
        gone = ", ".join(f"{dim_name(d)}{ELIMINATED_MARK}" for d in region.dims.eliminated)
        return f"region {index}: fused · {dims} · eliminated {gone}"
    at = f" at {region.stopped_at}" if region.stopped_at else ""
    return f"region {index}: not fused · {region.rule}{at}"


def _op_label(node) -> str:
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target)).split(".")[0]
    return node.op


def build_scene(report: Report, highlight: bool = True, collapse: bool = True) -> Scene:
    """The scene of ``report.graph``: regions coloured when ``highlight``; with ``collapse``
    (and ``highlight``), each connected group of ops outside every region is one box."""
    if report.graph is None:
        raise ValueError(f"this call ran {len(report.parts)} graphs (TorchDynamo broke it where Python reads "
                         "tensor values); draw each of report.parts" if report.parts else
                         "the report has no graph to draw: " + report.capture_note)
    analysis = report.analysis
    owner, regions = {}, {}
    if highlight:
        fused_seen = 0
        for index, region in enumerate(report.regions):
            colour = REGION_COLOURS[fused_seen % len(REGION_COLOURS)] if region.fused else REFUSED_COLOUR
            fused_seen += region.fused
            regions[index] = SceneRegion(index, region.fused, colour, _title(index, region))
            for name in region.nodes:
                owner.setdefault(name, index)
    nodes = list(report.graph.graph.nodes)
    io = {n for n in nodes if n.op in ("placeholder", "get_attr", "output")}
    outside = [n for n in nodes if n.name not in owner and n not in io]
    box_of = {n: n.name for n in nodes}
    graph = nx.DiGraph()
    if collapse and highlight:
        sub = nx.DiGraph()
        sub.add_nodes_from(outside)
        sub.add_edges_from((a, n) for n in outside for a in n.all_input_nodes if a in sub)
        for group in nx.weakly_connected_components(sub):
            if len(group) > 1:
                members = [n for n in nodes if n in group]
                box = f"group_{members[0].name}"
                shown = ", ".join(_op_label(n) for n in members[:COLLAPSED_NAMES])
                more = ", …" if len(members) > COLLAPSED_NAMES else ""
                graph.add_node(box, label=f"{len(members)} ops\n{shown}{more}", region=None, kind="collapsed")
                box_of.update({n: box for n in members})
    for n in nodes:
        if box_of[n] != n.name:
            continue
        index = owner.get(n.name)
        sketch = analysis.sketch(n)
        dims = report.regions[index].dims if index is not None else None
        sketch = _marked_sketch(sketch, dims) if sketch is not None and dims is not None else str(sketch or "")
        op = _op_label(n) if n.op == "call_function" and not n.name.startswith(_op_label(n)) else ""
        label = "\n".join(x for x in (n.name, op, sketch) if x)
        graph.add_node(n.name, label=label, region=index, kind="io" if n in io else "op")
    for n in nodes:
        for a in n.all_input_nodes:
            if box_of[a] != box_of[n]:
                graph.add_edge(box_of[a], box_of[n])
    return Scene(graph, regions)


__all__ = ["REGION_COLOURS", "Scene", "SceneRegion", "build_scene"]
