"""The pipeline for one captured graph: analyse → find chains → fuse → rewrite.

Each stage reads the plain structure the previous one produced, so each can be tested and
printed alone. A chain that a rule refuses stays in the graph as it was; its report says why.
"""
from __future__ import annotations

import logging

import torch.fx as fx

from .analysis import analyse
from .config import config
from .patterns import find_chains
from .report import RegionReport, Report

log = logging.getLogger("fxflash")


def _region_report(analysis, chain, fused, reason, source="", steps=()):
    return RegionReport(
        nodes=[n.name for n in chain.nodes],
        sketches={n.name: str(analysis.sketch(n)) for n in chain.nodes if analysis.sketch(n)},
        fused=fused,
        reason=reason,
        chain=chain,
        source=source,
        steps=list(steps),
    )


def optimize_graph(gm: fx.GraphModule, fuse: bool | None = None) -> tuple[fx.GraphModule, Report]:
    """Analyse ``gm``, fuse what the rules allow, and return the rewritten graph and a report.

    ``gm`` itself is left unchanged; the rewrite is a new GraphModule.
    """
    fuse = config.fuse if fuse is None else fuse
    analysis = analyse(gm)
    chains = find_chains(analysis)
    regions = []
    for chain in chains:
        if not fuse:
            regions.append(_region_report(analysis, chain, False, "fusion is turned off (config.fuse)"))
            continue
        regions.append(_region_report(analysis, chain, False, "no fusion rule is implemented yet"))
    for r in regions:
        log.debug("%s", r)
    return gm, Report(regions=regions, graph=gm, analysis=analysis)
