"""What ``fxflash.explain`` returns: the regions found, their sketches, what was fused, why not."""
from __future__ import annotations

import dataclasses
import textwrap

import torch.fx as fx

from .analysis import GraphAnalysis
from .analysis.sketch import dim_name
from .analysis.traffic import Traffic
from .patterns import Chain
from .patterns.transformations import RegionDims
from .tile import TileProgram


@dataclasses.dataclass(frozen=True)
class RememberedChain:
    """A chain as the report of a graph loaded from fxflash's graph cache keeps it
    (runtime/graph_cache.py): its description and its demoted dimension; ``explain()`` analyses
    the graph afresh and gives the Chain itself."""

    text: str
    demoted: tuple

    def describe(self) -> str:
        return self.text


@dataclasses.dataclass
class RegionReport:
    """One candidate region.

    nodes:     names of its FX nodes in graph order.
    sketches:  node name → its sketch, printed ``[(P…), (R…)]``.
    fused:     True when the region runs as one generated kernel.
    reason:    why it was not fused (the rule that refused it), or "" when fused.
    rule:      the name of the rule that refused it ("" when fused).
    stopped_at: the name of the node that rule stopped at ("" when fused or not one node).
    source:    the generated Triton source when fused.
    gluon_source: when fused and the region qualifies (codegen/gluon.py), the Gluon kernel's
               source, whose configurations the tuner times beside the Triton kernel's on Hopper.
    configs:   when fused, the candidate tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) that
               the tuner times on a GPU, the default first.
    chain:     the Chain found by the pattern stage (a RememberedChain in the report of a graph
               loaded from the graph cache).
    steps:     the rule lines applied, in order.
    transformations: when fused, the Transformations (demotion, algebraic rewriting,
               elimination, tile program), each with the sketches it changed.
    traffic:   when fused, the estimated bytes of GPU memory traffic, eager vs fused.
    dims:      when fused, the RegionDims: ids of the row, demoted and eliminated dimensions.
    origin:    when fused from a call of ``scaled_dot_product_attention``, that call's name.
    tile_program: when fused, the kernel as tile operations (fxflash.tile.TileProgram).
    backward:  when fused, how its backward runs: ``"fused"`` (generated kernels, from the tile
               programs in ``backward_programs``: row statistics; Δ; dK and dV; dQ, fxflash.tile.backward;
               for grouped-query attention also dK and dV per K/V head, ``TileProgram.group``; and Δ
               summed over the keys, ``…_exact_delta``, which replaces Δ's program in 16 bits
               where the forward stored no fp32 O: config.exact_delta; for softmax streams, those of
               their twin's region, runtime/twin.py) or
               ``"eager recompute: <why>"`` (the region's own ops recomputed with autograd).
    """

    nodes: list
    sketches: dict
    fused: bool
    reason: str
    chain: Chain
    rule: str = ""
    stopped_at: str = ""
    source: str = ""
    gluon_source: str = ""
    configs: tuple = ()
    steps: list = dataclasses.field(default_factory=list)
    transformations: list = dataclasses.field(default_factory=list)
    traffic: Traffic | None = None
    dims: RegionDims | None = None
    origin: str = ""
    tile_program: TileProgram | None = None
    backward: str = ""
    backward_programs: tuple = ()

    @property
    def demoted(self) -> str:
        """The name of the demoted dimension (the key axis N)."""
        return dim_name(self.chain.demoted)

    @property
    def status(self) -> str:
        return "fused" if self.fused else "not fused"

    def verdict(self) -> str:
        """One line: the region's ops, fused or not, and the rule that refused it."""
        if self.fused:
            source = f" (read from {self.origin})" if self.origin else ""
            return f"{self.chain.describe()}{source}: fused, one kernel"
        why = self.reason.splitlines()[0] if self.reason else ""
        return f"{self.chain.describe()}: not fused ({why if why.startswith(self.rule) else f'{self.rule}: {why}'})"

    def __str__(self) -> str:
        lines = [f"region {self.chain.describe()}: {self.status}"]
        if self.origin:
            lines.append(f"  read from {self.origin}, a call of scaled_dot_product_attention, as its math form")
        if self.reason:
            lines.append(f"  refused: {self.reason}")
        if self.traffic is not None:
            lines.append(f"  {self.traffic}")
        for i, step in enumerate(self.transformations, 1):
            lines.append(textwrap.indent(f"{i}. {step}", "  "))
        if self.tile_program is not None:
            lines.append(textwrap.indent(str(self.tile_program), "  "))
        if self.backward_programs:
            exact = [p.name for p in self.backward_programs if p.name.endswith("_exact_delta")]
            own = [p.name for p in self.backward_programs if not p.group and p.name not in exact]
            grouped = [p.name for p in self.backward_programs if p.group]
            lines.append(f"  backward: fused, {len(own)} kernels from tile programs "
                         "(.backward_programs: " + ", ".join(own)
                         + "; on a GPU, dK·dV's kernel may add dQ by atomics instead: config.dq_atomics"
                         + ("; in 16 bits Δ is taken from O in fp32, which the training forward stores, "
                            "else Σ P·dP over the keys, from " + exact[0] if exact else "")
                         + ("; K and V broadcast over query heads: dK and dV summed per K/V head in the kernel by "
                            + ", ".join(grouped) if grouped else "") + ")")
        elif self.backward:
            lines.append(f"  backward: {self.backward}")
        lines.append("  nodes:")
        for name in self.nodes:
            lines.append(f"    {name:<24} {self.sketches.get(name, '')}")
        return "\n".join(lines)


@dataclasses.dataclass
class Report:
    """``explain()``'s answer: ``.regions`` (one RegionReport per candidate), ``.graph`` (the
    captured graph), ``.rewritten`` (the graph with fused regions replaced) and ``.seconds``
    (wall time of each compile stage: capture, analysis, fusion, code generation; the tile
    tuning of a GPU kernel happens at its first launch and is in ``runtime.tuning.history``)."""

    regions: list
    graph: fx.GraphModule | None  # None for a call of several graphs (``parts``)
    analysis: GraphAnalysis | None  # None where the analysis itself failed (capture_note says why)
    rewritten: fx.GraphModule | None = None
    capture_note: str = ""
    seconds: dict = dataclasses.field(default_factory=dict)
    left_alone: list = dataclasses.field(default_factory=list)  # attention ops kept as they are, one line each
    parts: list = dataclasses.field(default_factory=list)  # a call of several graphs: each one's report, as run
    inner: str = ""  # what ran the rest of the graph: "inductor" or "eager" ("" for explain(), which runs none)

    @classmethod
    def of_graphs(cls, reports: list, note: str = "") -> "Report":
        """The report of a call that ran ``reports``' graphs in this order (Dynamo captures a call as
        several graphs where it breaks the graph; a graph run twice counts twice). One graph: its
        own report. Several: ``regions`` of them all, each graph's report in ``parts``."""
        if len(reports) == 1 and not note:
            return reports[0]
        seconds: dict = {}
        for report in _distinct(reports):  # each graph compiled once, however often it ran
            for stage, s in report.seconds.items():
                seconds[stage] = seconds.get(stage, 0.0) + s
        note = note or ("" if reports else "TorchDynamo captured no graph in this call: it ran as Python")
        return cls(regions=[r for report in reports for r in report.regions], graph=None, analysis=None,
                   capture_note=note, seconds=seconds,
                   left_alone=[line for report in reports for line in report.left_alone], parts=list(reports))

    def __str__(self) -> str:
        head = f"fxflash: {len(self.regions)} candidate region(s), " + (
            f"{sum(r.fused for r in self.regions)} fused"
        )
        if self.parts:
            head += f", in {len(self.parts)} graph runs of {len(set(map(id, self.parts)))} graphs"
        parts = [head, *(f"  {i}. {r.verdict()}" for i, r in enumerate(self.regions, 1)),
                 *(f"  left alone: {line}" for line in self.left_alone)]
        if self.capture_note:
            parts.append(self.capture_note)
        if self.inner:
            rest = {"inductor": "compiled by Inductor", "eager": "eager PyTorch"}[self.inner]
            parts.append(f"the rest of the graph: {rest}")
        if self.seconds:
            parts.append("compile time: " + ", ".join(f"{stage} {s * 1e3:.0f} ms" for stage, s in self.seconds.items()))
        if self.parts:
            for i, part in enumerate(_distinct(self.parts), 1):
                parts.append(f"--- graph {i} ---\n{part}")
            return "\n".join(parts)
        parts.extend(str(r) for r in self.regions)
        if self.analysis is None:
            return "\n".join(parts)
        parts.append("graph (node: kind sketch):")
        for node in self.graph.graph.nodes:
            sk = self.analysis.sketch(node)
            parts.append(f"  {node.name:<24} {self.analysis.kinds[node].value:<17} {sk or ''}")
        return "\n".join(parts)

    def __repr__(self) -> str:
        return f"<fxflash.Report: {len(self.regions)} region(s), {sum(r.fused for r in self.regions)} fused>"


def _distinct(reports: list) -> list:
    """``reports`` without repeats (by identity), in order."""
    return list({id(r): r for r in reports}.values())
