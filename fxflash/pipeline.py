"""The pipeline for one captured graph: analyse → find chains → fuse → generate → rewrite.

Each stage reads the plain structure the previous one produced, so each can be tested and
printed alone. A chain that a rule refuses stays in the graph as it was; its report says why.
"""
from __future__ import annotations

import contextlib
import logging
import time

import torch.fx as fx

from . import internal
from .analysis import analyse
from .analysis.traffic import region_traffic
from .config import config, interpreting, kernel_options
from .patterns import find_chains
from .patterns.region import FusionRefused, build_region
from .patterns.transformations import region_dims, transformations
from .report import RegionReport, Report

log = logging.getLogger("fxflash")


def _region_report(analysis, chain, reason="", rule="", stopped_at=None, region=None, plan=None, program=None):
    """A fused region's report (``region`` and its kernel's ``plan`` given) or a refused
    candidate's (``rule``)."""
    report = RegionReport(
        nodes=[n.name for n in chain.nodes],
        sketches={n.name: str(analysis.sketch(n)) for n in chain.nodes if analysis.sketch(n)},
        fused=region is not None,
        reason=reason,
        rule=rule,
        stopped_at=stopped_at.name if stopped_at is not None else "",
        chain=chain,
        source=plan.source if plan is not None else "",
        gluon_source=plan.gluon.source if plan is not None and plan.gluon is not None else "",
        configs=plan.configs if plan is not None else (),
        tile_program=program,
    )
    if region is not None:
        from .runtime.gluon_launch import GLUON_MIN_KEYS

        if plan.gluon is None:
            gluon_line = f"Gluon kernel (Hopper): none, {plan.gluon_refusal}"
        elif plan.gluon.streams > 1:
            gluon_line = ("Gluon kernel (Hopper): printed, one consumer warp group per softmax stream; the tuner "
                          "times it beside the Triton kernel"
                          + ("" if plan.gluon.dense else ", one CTA per item (its masks skip tiles)"))
        else:
            gluon_line = ("Gluon kernel (Hopper): printed; the tuner times it beside the Triton kernel, one CTA "
                          f"per item on rows of at least {GLUON_MIN_KEYS} keys"
                          + (", on a persistent grid on shorter rows" if plan.gluon.dense else ""))
        twin = ["backward: through the twin of its streams (runtime/twin.py): each stream's P·V over the score "
                "frame's own heads, one softmax attention with its own fused kernels, then the streams' "
                "combination applied to their outputs"] if plan.twin is not None else []
        report.steps = [step.text for step in region.steps] + [
            f"block sparsity: {why}" for why in plan.unclassified] + [*twin, *_own_ops_line(plan), gluon_line]
        report.backward = plan.backward_note
        report.backward_programs = ((*plan.backward.programs, *plan.backward.grouped_programs,
                                     *filter(None, (plan.backward.exact_delta_program,)))
                                    if plan.backward is not None else
                                    plan.twin.report.backward_programs if plan.twin is not None else ())
        report.transformations = transformations(analysis, region)
        report.dims = region_dims(analysis, region)
        outputs = [region.output, *region.side_outputs]
        report.traffic = region_traffic(region.nodes, chain.inputs, plan.input_nodes, outputs, analysis.kinds)
    return report


def _backward(region, kinds, plan):
    """The region's fused backward (codegen/backward.py), or None and why not. An error here is
    reported by explain() and never stops the forward: the backward then recomputes the region."""
    from .codegen import Unprintable
    from .codegen.backward import emit_backward
    from .codegen.printers import PRINTERS
    from .tile.backward import BackwardRefused

    try:
        if region.split is not None:
            return None, _twin(region, plan)
        return emit_backward(region, kinds, plan, PRINTERS), "fused"
    except (BackwardRefused, Unprintable) as exc:
        return None, f"eager recompute: {exc}"
    except Exception as exc:  # noqa: BLE001 - see the docstring
        return None, f"eager recompute: internal error ({type(exc).__name__}: {exc})"


def _twin(region, plan) -> str:
    """A region with softmax streams: its twin (runtime/twin.py) built and fused on tensors of the
    region's input layouts, kept as ``plan.twin``; the backward note says which way it runs."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from .runtime.rewrite import reference_subgraph
    from .runtime.twin import build_twin, twin_refusal

    why = twin_refusal(region)
    if why is not None:
        return f"eager recompute: several softmax streams, {why}"
    reference, extra = reference_subgraph([region.output, *region.side_outputs], plan.input_nodes)
    values = [n.meta["val"] for n in plan.input_nodes]
    extras = [n.meta["val"] for n in extra]
    if not all(type(x) in (int, float) for x in extras):
        return "eager recompute: several softmax streams, sizes known only at run time"
    with unset_fake_temporarily():
        inputs = [torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device) for v in values]
        try:
            plan.twin = build_twin(region, reference, inputs, extras)
        except ValueError as exc:
            return f"eager recompute: several softmax streams, {exc}"
    return "fused"


def _training_forward(region, kinds, plan):
    """The region's forward printed again to store what its fused backward reads
    (``KernelPlan.training``): a softmax's row statistics ``m`` and ``1/l``, and where ops follow
    P·V the output before them; reading the same inputs as ``plan``. None where there is nothing
    to store (an elementwise P with no ops after P·V) or it cannot be printed: a softmax's
    backward then computes its statistics itself, a region with ops after P·V recomputes eagerly."""
    from .codegen import emit_kernel, gluon
    from .tile.backward import elementwise_form, statistics_nodes

    try:
        if elementwise_form(region) is not None:
            if not region.output_ops:
                return None
            statistics = ()
        else:
            statistics = statistics_nodes(region)
        training = emit_kernel(region, kinds, plan.name, plan.options, statistics=statistics)
        if training.input_nodes != plan.input_nodes or training.sym_nodes != plan.sym_nodes:
            return None
        gluon.attach(training, region, kinds, statistics=True)
        return training
    except Exception:  # noqa: BLE001 - see the docstring
        return None


def _own_ops_line(plan) -> list[str]:
    """What the tuner does with the region's own ops (runtime/tuning.py, EAGER, COMPILED), and where
    it kept them: sizes at which every kernel was slower, from this process's or tuning.json's choices."""
    from .runtime import tuning

    if not config.time_eager:
        return []
    sources = [plan.source] + ([plan.source + plan.gluon.source] if plan.gluon is not None else [])
    kept = tuning.own_ops_kept(sources)
    where = f"; kept so at sizes {', '.join(kept)} (batch×M×N, rounded up)" if kept else ""
    return ["tuning: on a GPU the region's own ops (run by PyTorch, or compiled by Inductor where it compiles "
            "the rest of the graph) are timed beside its kernels and run where every kernel is slower" + where]


# Triton interpreters that cannot run a kernel beside a NumPy release, as
# (first Triton whose interpreter can, first NumPy that breaks it, what breaks): Triton 3.6's
# interpreter takes int() of a one-element array where a kernel uses a scalar as an index
# (3.7 squeezes it first), which NumPy 2.4 made an error after its deprecation in 1.25.
INTERPRETER_CONFLICTS = [
    ((3, 7), (2, 4), "Triton's interpreter before 3.7 fails on NumPy 2.4 and later ('only 0-dimensional "
                     "arrays can be converted to Python scalars')"),
]


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '3.6.0' or '2.4.0rc1'."""
    major, minor = version.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def interpreter_conflict() -> str:
    """Why Triton's interpreter cannot run kernels beside the installed NumPy, or ''."""
    import numpy
    import triton

    triton_release, numpy_release = _release(triton.__version__), _release(numpy.__version__)
    for fixed_in, broken_from, why in INTERPRETER_CONFLICTS:
        if triton_release < fixed_in and numpy_release >= broken_from:
            return (f"{why}: Triton {triton.__version__}, NumPy {numpy.__version__}; install "
                    f"numpy<{'.'.join(map(str, broken_from))} or triton>={'.'.join(map(str, fixed_in))}")
    return ""


def _check_device(region) -> None:
    device = region.output.meta["val"].device
    if device.type not in ("cuda", "cpu"):
        raise FusionRefused("device", region.output, f"tensors on {device.type} run eagerly: fused kernels read "
                                                     "CUDA tensors, or CPU tensors in Triton's interpreter")
    if device.type != "cuda" and not interpreting():
        raise FusionRefused(
            "device", region.output,
            f"tensors on {device.type} run eagerly: fused kernels need a CUDA GPU, or Triton's interpreter "
            "(TRITON_INTERPRET=1, which import fxflash sets where no CUDA GPU is found)",
        )
    conflict = interpreter_conflict() if interpreting() else ""
    if conflict:
        raise FusionRefused("interpreter", region.output, f"runs eagerly: {conflict}")


def _attention_calls(gm: fx.GraphModule) -> list[str]:
    """The graph's calls of PyTorch's own fused attention (``scaled_dot_product_attention`` in any of
    its backends' ops): already one kernel, so no chain to find; kept as they are."""
    return [f"{n.name}: a call of scaled_dot_product_attention ({n.target}), already one fused kernel"
            for n in gm.graph.nodes if n.op == "call_function" and "scaled_dot_product" in str(n.target)]


@contextlib.contextmanager
def timed(seconds: dict, stage: str):
    """Add the wall time of the block to ``seconds[stage]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - start


def optimize_graph(gm: fx.GraphModule, fuse: bool | None = None,
                   seconds: dict | None = None) -> tuple[fx.GraphModule, Report]:
    """Analyse ``gm``, fuse what the rules allow, and return the rewritten graph and a report.

    ``gm`` itself is left unchanged; the rewrite is a new GraphModule. ``seconds`` holds the
    times of stages run before (capture); the report adds its own stages to it.
    """
    from .codegen import Unprintable, emit_kernel
    from .runtime import load_kernel, placement, replace_region
    from .codegen import gluon
    from .codegen.printers import PRINTERS
    from .runtime.rewrite import copy_graph
    from .tile import lower

    fuse = config.fuse if fuse is None else fuse
    options = kernel_options()  # every region of the graph printed with the same settings
    seconds = {} if seconds is None else seconds
    rewritten, node_map = copy_graph(gm)
    try:
        with timed(seconds, "analysis"), internal.stage("analysis"):
            analysis = analyse(gm)
            near_misses: list = []
            chains = find_chains(analysis, near_misses)
    except internal.InternalError as exc:
        internal.warn(exc, "the graph runs as eager PyTorch", stacklevel=3)
        return rewritten, Report(regions=[], graph=gm, analysis=None, rewritten=rewritten, seconds=seconds,
                                 capture_note=f"{exc} (the graph runs as eager PyTorch)")
    regions = [_region_report(analysis, miss.chain, miss.reason, "chain discovery", miss.node)
               for miss in near_misses]
    for chain in chains:
        if not fuse:
            regions.append(_region_report(analysis, chain, "fusion is turned off (config.fuse)", "config"))
            continue
        try:
            with timed(seconds, "fusion"), internal.stage("fusion rules", FusionRefused):
                region = build_region(analysis, chain, options)
                _check_device(region)
            with timed(seconds, "code generation"):
                with internal.stage("code generation", FusionRefused, Unprintable):
                    program = lower(region, analysis.kinds, PRINTERS)
                    plan = emit_kernel(region, analysis.kinds, options=options, program=program)
                    gluon.attach(plan, region, analysis.kinds)
                    plan.backward, plan.backward_note = _backward(region, analysis.kinds, plan)
                    if plan.backward is not None:
                        plan.training = _training_forward(region, analysis.kinds, plan)
                with internal.stage("rewrite", FusionRefused):  # refused, if at all, before compiling
                    at = placement(rewritten, region, plan, node_map)
                with internal.stage("kernel compilation"):
                    kernel = load_kernel(plan.source, plan.name)
                with internal.stage("rewrite"):
                    replace_region(rewritten, region, plan, kernel, node_map, at)
        except FusionRefused as exc:
            regions.append(_region_report(analysis, chain, str(exc), exc.rule, exc.node))
            continue
        except Unprintable as exc:
            regions.append(_region_report(analysis, chain, f"code generation: {exc}", "code generation"))
            continue
        except internal.InternalError as exc:
            internal.warn(exc, stacklevel=3)
            regions.append(_region_report(analysis, chain, f"{exc} (the region runs as eager PyTorch)",
                                          internal.RULE))
            continue
        regions.append(_region_report(analysis, chain, region=region, plan=plan, program=program))
    rewritten.graph.eliminate_dead_code()
    rewritten.recompile()
    report = Report(regions=regions, graph=gm, analysis=analysis, rewritten=rewritten, seconds=seconds,
                    left_alone=_attention_calls(gm))
    for r in regions:
        log.debug("%s", r)
        if r.source:
            log.debug("generated source:\n%s", r.source)
        if r.gluon_source:
            log.debug("generated Gluon source (Hopper):\n%s", r.gluon_source)
    return rewritten, report


__all__ = ["optimize_graph", "timed"]
