"""The pipeline for one captured graph: analyse → find chains → fuse → generate → rewrite.

Each stage reads the plain structure the previous one produced, so each can be tested and
printed alone. A chain that a rule refuses stays in the graph as it was; its report says why.
"""
from __future__ import annotations

import logging

import torch.fx as fx

from .analysis import analyse
from .config import config, interpreting
from .patterns import find_chains
from .patterns.region import FusionRefused, build_region
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


def _check_device(region) -> None:
    device = region.output.meta["val"].device
    if device.type == "cuda" or interpreting():
        return
    raise FusionRefused(
        "device", region.output,
        f"tensors on {device.type} run eagerly: fused kernels need a CUDA GPU, or Triton's interpreter "
        "(TRITON_INTERPRET=1 set before triton is imported)",
    )


def _autotune(region) -> bool:
    """Autotune tile sizes for real GPU kernels (never in the interpreter)."""
    return config.autotune and not interpreting() and region.output.meta["val"].device.type == "cuda"


def _copy_graph(gm: fx.GraphModule) -> tuple[fx.GraphModule, dict]:
    graph = fx.Graph()
    node_map: dict = {}
    out = graph.graph_copy(gm.graph, node_map, return_output_node=True)
    graph.output(out[0] if isinstance(out, tuple) else out)
    return fx.GraphModule(gm, graph), node_map


def optimize_graph(gm: fx.GraphModule, fuse: bool | None = None) -> tuple[fx.GraphModule, Report]:
    """Analyse ``gm``, fuse what the rules allow, and return the rewritten graph and a report.

    ``gm`` itself is left unchanged; the rewrite is a new GraphModule.
    """
    from .codegen import Unprintable, emit_kernel, load_kernel, replace_region

    fuse = config.fuse if fuse is None else fuse
    analysis = analyse(gm)
    near_misses: list = []
    chains = find_chains(analysis, near_misses)
    rewritten, node_map = _copy_graph(gm)
    regions = [_region_report(analysis, miss.chain, False, miss.reason) for miss in near_misses]
    for chain in chains:
        if not fuse:
            regions.append(_region_report(analysis, chain, False, "fusion is turned off (config.fuse)"))
            continue
        try:
            region = build_region(analysis, chain)
            _check_device(region)
            plan = emit_kernel(region, analysis.kinds, autotune=_autotune(region))
            kernel = load_kernel(plan.source, plan.name)
            replace_region(rewritten, region, plan, kernel, node_map)
        except (FusionRefused, Unprintable) as exc:
            regions.append(_region_report(analysis, chain, False, str(exc)))
            continue
        regions.append(_region_report(analysis, chain, True, "", plan.source, region.steps))
    rewritten.graph.eliminate_dead_code()
    rewritten.recompile()
    report = Report(regions=regions, graph=gm, analysis=analysis, rewritten=rewritten)
    for r in regions:
        log.debug("%s", r)
        if r.source:
            log.debug("generated source:\n%s", r.source)
    return rewritten, report


__all__ = ["optimize_graph"]
