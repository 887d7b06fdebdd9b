"""``torch.compile(model, backend="fxflash")``.

Dynamo hands the backend a torch-level FX graph and example inputs. The backend traces it to
the ATen graph the pipeline reads (the same capture as ``optimize``), rewrites the chains it
can fuse, and hands the result to an inner compiler:

* ``inner="inductor"`` (default): TorchInductor compiles the rest of the graph; fused regions
  are opaque custom ops to it.
* ``inner="eager"``: the rewritten graph runs as it is.

Choose with ``torch.compile(model, backend="fxflash", options={"inner": "eager"})`` or
``torch.compile(model, backend=fxflash.backend(inner="eager"))``. The backend is registered
through the ``torch_dynamo_backends`` entry point, so it works without ``import fxflash``.
"""
from __future__ import annotations

import collections
import logging

import torch

from .capture import capture
from .codegen.op import owned
from .pipeline import optimize_graph, timed

log = logging.getLogger("fxflash")

INNER_COMPILERS = ("inductor", "eager")

# The reports of the graphs this process compiled most recently (newest last), for inspection.
recent_reports: collections.deque = collections.deque(maxlen=32)


def _inner_compile(inner: str, gm: torch.fx.GraphModule, example_inputs):
    if inner == "eager":
        return gm
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs)


def _retrace(gm: torch.fx.GraphModule, example_inputs):
    """Trace Dynamo's graph to the decomposed, functional ATen graph (flat outputs).

    With ``dynamic=True`` the example inputs are fake tensors with symbolic sizes (and SymInt
    inputs): the graph is traced inside Dynamo's own fake mode, so the sizes stay symbolic, and
    with PyTorch's Python dispatcher on, so that composite ops run their Python forms, which keep
    sizes symbolic (torch 2.11's C++ ``matmul`` reads every size of its operands as an integer, a
    guard on each, and each sequence length compiled anew)."""
    from torch._subclasses.fake_tensor import FakeTensor

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fakes = [n.meta.get("example_value", n.meta.get("val")) for n in placeholders]
    modes = [f.fake_mode for f in fakes if isinstance(f, FakeTensor)]
    if not modes or not any(isinstance(x, torch.SymInt) for x in example_inputs):
        # static shapes: trace with a fake mode of our own, not Dynamo's (whose shape env would
        # make the sizes symbolic and collect guards it never asked for)
        from torch._guards import tracing

        with tracing(None):
            return capture(lambda *xs: gm(*xs), tuple(example_inputs))
    from torch._dispatch.python import enable_python_dispatcher

    fake_mode = modes[0]
    with fake_mode, enable_python_dispatcher():
        return capture(lambda *xs: gm(*xs), tuple(fakes), modes=("real",))


def backend(inner: str = "inductor"):
    """A Dynamo backend callable that rewrites with fxflash, then compiles with ``inner``."""
    if inner not in INNER_COMPILERS:
        raise ValueError(f"fxflash backend: inner must be one of {INNER_COMPILERS}, got {inner!r}")

    def fxflash_compile(gm: torch.fx.GraphModule, example_inputs, **kwargs):
        seconds: dict = {}
        with timed(seconds, "capture"):
            captured = _retrace(gm, example_inputs)
        rewritten, report = optimize_graph(captured.graph_module, seconds=seconds)
        recent_reports.append(report)
        log.debug("fxflash backend: %r", report)
        compiled = _inner_compile(inner, rewritten, example_inputs)

        def run(*args):
            return captured.run(compiled, {}, args, {})

        run.regions = owned.get(rewritten, [])  # the fused regions live as long as Dynamo keeps run
        return run

    return fxflash_compile


def fxflash_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **kwargs):
    """The registered backend: ``options={"inner": "inductor" | "eager"}``."""
    options = dict(options or {})
    inner = options.pop("inner", "inductor")
    if options:
        raise ValueError(f"fxflash backend: unknown options {sorted(options)}; known: ['inner']")
    return backend(inner)(gm, example_inputs)


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
