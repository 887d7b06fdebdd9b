"""What ``fxflash.explain`` returns: the regions found, their sketches, what was fused, why not."""
from __future__ import annotations

import dataclasses

import torch.fx as fx

from .analysis import GraphAnalysis
from .patterns import Chain


@dataclasses.dataclass
class RegionReport:
    """One candidate region.

    nodes:     names of its FX nodes in graph order.
    sketches:  node name → its sketch, printed ``[(P…), (R…)]``.
    fused:     True when the region runs as one generated kernel.
    reason:    why it was not fused (the rule that refused it), or "" when fused.
    source:    the generated Triton source when fused.
    chain:     the Chain found by the pattern stage.
    """

    nodes: list
    sketches: dict
    fused: bool
    reason: str
    chain: Chain
    source: str = ""
    steps: list = dataclasses.field(default_factory=list)

    @property
    def status(self) -> str:
        return "fused" if self.fused else "not fused"

    def __str__(self) -> str:
        lines = [f"region {self.chain.describe()}: {self.status}"]
        if self.reason:
            lines.append(f"  reason: {self.reason}")
        for step in self.steps:
            lines.append(f"  {step}")
        for name in self.nodes:
            lines.append(f"    {name:<24} {self.sketches.get(name, '')}")
        return "\n".join(lines)


@dataclasses.dataclass
class Report:
    """``explain()``'s answer: ``.regions`` (one RegionReport per candidate), ``.graph`` (the
    captured graph) and ``.rewritten`` (the graph with fused regions replaced)."""

    regions: list
    graph: fx.GraphModule
    analysis: GraphAnalysis
    rewritten: fx.GraphModule | None = None
    capture_note: str = ""

    def __str__(self) -> str:
        head = f"fxflash: {len(self.regions)} candidate region(s), " + (
            f"{sum(r.fused for r in self.regions)} fused"
        )
        parts = [head]
        if self.capture_note:
            parts.append(self.capture_note)
        parts.extend(str(r) for r in self.regions)
        parts.append("graph (node: kind sketch):")
        for node in self.graph.graph.nodes:
            sk = self.analysis.sketch(node)
            parts.append(f"  {node.name:<24} {self.analysis.kinds[node].value:<17} {sk or ''}")
        return "\n".join(parts)

    def __repr__(self) -> str:
        return f"<fxflash.Report: {len(self.regions)} region(s), {sum(r.fused for r in self.regions)} fused>"
