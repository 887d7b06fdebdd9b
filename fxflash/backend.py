"""``torch.compile(model, backend="fxflash")``, and the capture path of ``fxflash.optimize``.

Dynamo follows the user's Python (objects, caches, control flow; a graph break where it reads a
tensor's value), guards what it read, and hands the backend each torch-level FX graph with
example inputs. The backend traces it to the ATen graph the pipeline reads, rewrites the chains
it can fuse, and hands the result to an inner compiler:

* ``inner="inductor"`` (default): TorchInductor compiles the rest of the graph; fused regions
  are opaque custom ops to it.
* ``inner="eager"``: the rewritten graph runs as it is.
* ``inner="auto"`` (``fxflash.optimize``'s default): Inductor where the graph's tensors are on a
  GPU, eager elsewhere.

A graph with nothing fused is compiled as Dynamo captured it, as if fxflash were not there.

What the backend makes of a graph is remembered across processes (runtime/graph_cache.py,
``config.remember_graphs``): a later compilation of the same graph on inputs of the same layouts
loads it instead of tracing, analysing and printing again, and hands the inner compiler the same
graph, which Inductor's caches then find too.

Choose with ``torch.compile(model, backend="fxflash", options={"inner": "eager"})`` or
``torch.compile(model, backend=fxflash.backend(inner="eager"))``. ``torch.compile``'s ``mode``
(``"reduce-overhead"``: CUDA graphs; ``"max-autotune"``) is the inner Inductor's, as without
fxflash: the fused regions' launches are recorded in its CUDA graphs. The backend is registered
through the ``torch_dynamo_backends`` entry point, so it works without ``import fxflash``.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import time
import warnings

import torch

from . import internal
from .capture import CaptureError, capture, sdpa
from .config import config
from .runtime import graph_cache
from .runtime.op import compile_ahead, owned
from .runtime.rewrite import with_direct_calls, with_training_calls
from .pipeline import optimize_graph, timed
from .report import Report

log = logging.getLogger("fxflash")

INNER_COMPILERS = ("auto", "inductor", "eager")

# The reports of the graphs torch.compile(backend="fxflash") compiled most recently (newest last),
# for inspection (optimize() and explain() record theirs themselves: ``recording()``).
recent_reports: collections.deque = collections.deque(maxlen=32)


def _resolved(inner: str, example_inputs) -> str:
    """``"auto"`` → ``"inductor"`` where a tensor input is on a GPU, ``"eager"`` otherwise. On a GPU
    the rest of a real model's graph, run eagerly as decomposed ATen ops, costs more than the fused
    attention saves (a Llama 1B-class prefill: 126 ms eager against 79 ms with Inductor, see
    benchmarks/NOTES.md); on a CPU the generated kernels run in Triton's interpreter, and Inductor
    would add a C++ build to every first call."""
    if inner != "auto":
        return inner
    on_gpu = any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)
    return "inductor" if on_gpu else "eager"


def _inner_compile(inner: str, gm: torch.fx.GraphModule, example_inputs, mode: str | None = None,
                   aten: bool = False):
    """``gm`` compiled by ``inner``. ``aten``: ``gm`` is fxflash's rewritten ATen graph, not Dynamo's,
    and Inductor's pre-grad passes are left out: they rewrite torch-level calls (``torch.cat``,
    ``F.linear``), which an ATen graph has none of, and took 0.16 s of a Llama 1B-class model's warm
    first call on fxflash's graph (0.03–0.07 s on Dynamo's own; benchmarks/NOTES.md)."""
    if inner == "eager":
        return gm
    from torch._inductor import config as inductor_config, list_mode_options
    from torch._inductor.compile_fx import compile_fx

    patches = dict(list_mode_options(mode)) if mode else {}
    if aten and hasattr(inductor_config, "use_pre_grad_passes"):
        patches["use_pre_grad_passes"] = False
    return compile_fx(gm, example_inputs, config_patches=patches or None)


def _retrace(gm: torch.fx.GraphModule, example_inputs, keep_origins: bool = False):
    """Trace Dynamo's graph to the decomposed, functional ATen graph (flat outputs).
    ``keep_origins``: each ATen node keeps the source name of the torch call it came from
    (``capture.sdpa.origin``).

    With ``dynamic=True`` the example inputs are fake tensors with symbolic sizes (and SymInt
    inputs): the graph is traced inside Dynamo's own fake mode, so the sizes stay symbolic, and
    with PyTorch's Python dispatcher on, so that composite ops run their Python forms, which keep
    sizes symbolic (torch 2.11's C++ ``matmul`` reads every size of its operands as an integer, a
    guard on each, and each sequence length compiled anew)."""
    from torch._subclasses.fake_tensor import FakeTensor

    run = gm
    if keep_origins:
        def run(*xs):
            with torch.fx.traceback.preserve_node_meta():
                return torch.fx.Interpreter(gm).run(*xs)

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fakes = [n.meta.get("example_value", n.meta.get("val")) for n in placeholders]
    modes = [f.fake_mode for f in fakes if isinstance(f, FakeTensor)]
    if not modes or not any(isinstance(x, torch.SymInt) for x in example_inputs):
        # static shapes: trace with a fake mode of our own, not Dynamo's (whose shape env would
        # make the sizes symbolic and collect guards it never asked for)
        from torch._guards import tracing

        with tracing(None):
            return capture(run, tuple(example_inputs))
    from torch._dispatch.python import enable_python_dispatcher

    fake_mode = modes[0]
    with fake_mode, enable_python_dispatcher():
        return capture(run, tuple(fakes), modes=("real",))


def _mark_parameters(gm: torch.fx.GraphModule, example_inputs) -> None:
    """``meta["is_parameter"]`` on each placeholder of the traced graph (Dynamo's inputs, in order)
    that holds a module's parameter: chain discovery tells a weight's axes from keys by it."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) == len(example_inputs):
        for node, value in zip(placeholders, example_inputs):
            node.meta["is_parameter"] = isinstance(value, torch.nn.Parameter)


class _Recorded:
    """One compiled graph as Dynamo calls it: ``run`` on the call's inputs, and the graph's report
    added to the reports being recorded (``recording()``), if any. ``regions``: the fused regions,
    which live as long as Dynamo keeps this."""

    def __init__(self, run, report: Report, regions: list):
        self.run, self.report, self.regions = run, report, regions

    def __call__(self, *args):
        reports = _RECORDING.get()
        if reports is not None:
            reports.append(self.report)
        return self.run(*args)


_RECORDING: contextvars.ContextVar = contextvars.ContextVar("fxflash_recording", default=None)


@contextlib.contextmanager
def recording():
    """Collect, in a list, the report of every graph compiled by an fxflash backend that runs in
    the block (in the order they run; a graph that runs twice is there twice)."""
    reports: list = []
    token = _RECORDING.set(reports)
    try:
        yield reports
    finally:
        _RECORDING.reset(token)


def _rewrite(gm: torch.fx.GraphModule, example_inputs, inner: str, explaining: bool, seconds: dict):
    """Trace and rewrite Dynamo's graph, its SDPA calls read as their math form (capture.sdpa); a
    call whose math form did not fuse is kept and the graph traced again, so that it runs PyTorch's
    kernel. Returns (captured, rewritten, report, regions, direct)."""
    kept: dict = {}  # SDPA call → why it keeps PyTorch's kernel; grows each pass, so the loop ends
    while True:
        expanded_gm, expanded = sdpa.expand(gm, kept)
        try:
            with timed(seconds, "capture"):
                captured = _retrace(expanded_gm, example_inputs, keep_origins=bool(expanded))
                _mark_parameters(captured.graph_module, example_inputs)
            rewritten, report = optimize_graph(captured.graph_module, seconds=seconds)
        except (CaptureError, internal.InternalError) as exc:
            if not expanded:
                raise
            kept.update({name: f"its math form failed: {exc}" for name in expanded})
            continue
        missing = sdpa.unfused(captured.graph_module, report.regions, expanded)
        if not missing:
            break
        kept.update(missing)
    sdpa.mark_origins(captured.graph_module, report.regions, expanded)
    report.left_alone = [f"{name}: PyTorch's kernel kept, {why}"
                         for name, why in kept.items()] or report.left_alone
    regions = owned.get(rewritten, [])
    with internal.stage("rewrite"):
        direct = with_direct_calls(rewritten) if regions and inner == "eager" and not explaining else None
    return captured, rewritten, report, regions, direct


def _compile(gm: torch.fx.GraphModule, example_inputs, inner: str, explaining: bool, keep: bool,
             mode: str | None = None) -> _Recorded:
    seconds: dict = {}
    inner = _resolved(inner, example_inputs)
    key = _graph_key(gm, example_inputs, inner, mode) if config.remember_graphs and not explaining else None
    if key is not None:
        recorded = _remembered(key, gm, example_inputs, inner, keep, mode)
        if recorded is not None:
            return recorded
    try:
        captured, rewritten, report, regions, direct = _rewrite(gm, example_inputs, inner, explaining, seconds)
    except (CaptureError, internal.InternalError) as exc:
        # Dynamo's graph holds only torch ops: tracing it to ATen should not fail; where it does,
        # the graph runs as Dynamo captured it
        if isinstance(exc, CaptureError):
            warnings.warn(f"fxflash: running eagerly, {exc}", RuntimeWarning, stacklevel=2)
        else:
            internal.warn(exc, "the graph runs as eager PyTorch", stacklevel=2)
        report = Report(regions=[], graph=gm, analysis=None, seconds=seconds, capture_note=str(exc), inner=inner)
        return _Recorded(_inner_compile(inner, gm, example_inputs, mode), report, [])
    report.inner = "" if explaining else inner
    if keep:
        recent_reports.append(report)
    log.debug("fxflash backend: %r", report)
    if explaining or not regions:
        # nothing fused (or explain(), which runs no kernel): Dynamo's own graph, as it would be
        # compiled without fxflash; with inner="eager" that is the user's ops, bit for bit
        recorded = _Recorded(_inner_compile(inner, gm, example_inputs, mode), report, [])
        if key is not None:
            graph_cache.remember(key, captured, None, report)
        return recorded
    for entry in regions:  # a kernel that loses runs the region's ops as the inner compiler would have
        entry.replaced = inner
    if direct is not None:
        compiled = report.rewritten = direct  # the graph that runs, its regions called directly
    else:
        # the tuner's kernels compile in worker processes while Inductor compiles the graph
        with timed(seconds, "compile ahead"):
            compile_ahead(rewritten.graph)
        compiled = _inner_compile(inner, with_training_calls(rewritten), example_inputs, mode, aten=True)
    if key is not None:
        graph_cache.remember(key, captured, rewritten, report)
    return _Recorded(lambda *args: captured.run(compiled, args, {}), report, regions)


def _graph_key(gm, example_inputs, inner: str, mode: str | None) -> str | None:
    try:
        return graph_cache.graph_key(gm, example_inputs, inner, mode)
    except Exception as exc:  # noqa: BLE001 - a graph that cannot be keyed is compiled as if new
        log.debug("fxflash: graph not keyed for the graph cache: %s", exc)
        return None


def _remembered(key: str, gm, example_inputs, inner: str, keep: bool, mode: str | None) -> _Recorded | None:
    """The graph stored under ``key`` by an earlier compilation (this process's or another's), its
    regions registered again, compiled by ``inner``; None where there is none or it cannot be read."""
    start = time.perf_counter()
    recalled = graph_cache.recall(key)
    if recalled is None:
        return None
    graph, regions, captured, report = recalled
    report.inner = inner
    report.seconds = {"remembered graph": time.perf_counter() - start}
    report.capture_note = "loaded from fxflash's graph cache (config.remember_graphs)"
    if graph is None:
        compiled = _inner_compile(inner, gm, example_inputs, mode)
    else:
        for entry in regions:
            entry.replaced = inner
        try:
            if inner == "eager":
                compiled = report.rewritten = with_direct_calls(graph)
            else:
                report.rewritten = with_training_calls(graph, copy=False)  # the graph Inductor compiles
                compiled = _inner_compile(inner, graph, example_inputs, mode, aten=True)
        except Exception as exc:  # noqa: BLE001 - compiled afresh, as if nothing were stored
            log.debug("fxflash: remembered graph %s not compiled: %s", key[:12], exc)
            return None
    if keep:
        recent_reports.append(report)
    if graph is None:
        return _Recorded(compiled, report, [])
    return _Recorded(lambda *args: captured.run(compiled, args, {}), report, regions)


def backend(inner: str = "inductor", explaining: bool = False, keep_reports: bool = True, mode: str | None = None):
    """A Dynamo backend callable that rewrites with fxflash, then compiles with ``inner``.
    ``explaining``: report only; each graph runs as Dynamo captured it (``fxflash.explain``).
    ``keep_reports``: add each graph's report to ``recent_reports``. ``mode``: torch.compile's mode
    for the inner Inductor (``"reduce-overhead"``: CUDA graphs); not with ``inner="eager"``."""
    if inner not in INNER_COMPILERS:
        raise ValueError(f"fxflash backend: inner must be one of {INNER_COMPILERS}, got {inner!r}")
    if mode not in (None, "default"):
        from torch._inductor import list_mode_options

        list_mode_options(mode)   # raises for a mode torch does not know
        if inner == "eager":
            raise ValueError(f"fxflash backend: mode {mode!r} is the inner Inductor's; inner='eager' compiles nothing")

    def fxflash_compile(gm: torch.fx.GraphModule, example_inputs, **kwargs):
        return _compile(gm, example_inputs, inner, explaining, keep_reports, mode)

    return fxflash_compile


def fxflash_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, mode: str | None = None,
                    **kwargs):
    """The registered backend: ``options={"inner": "inductor" | "eager" | "auto"}``, or
    torch.compile's ``mode`` for the inner Inductor (torch takes one of the two)."""
    options = dict(options or {})
    inner = options.pop("inner", "inductor")
    if options:
        raise ValueError(f"fxflash backend: unknown options {sorted(options)}; known: ['inner']")
    return backend(inner, mode=mode)(gm, example_inputs)


def register() -> None:
    """Register ``"fxflash"`` with Dynamo when no installed entry point declares it.

    With the package installed, Dynamo loads the entry point itself the first time the name is
    used (registering here too would make that load fail as a duplicate). Used from a source
    tree (``PYTHONPATH=.``), there is no entry point and ``import fxflash`` registers it.
    """
    import importlib.metadata

    from torch._dynamo.backends import registry

    if "fxflash" in importlib.metadata.entry_points(group="torch_dynamo_backends").names:
        return
    if "fxflash" not in registry._COMPILER_FNS:
        registry.register_backend(fxflash_backend, name="fxflash")
