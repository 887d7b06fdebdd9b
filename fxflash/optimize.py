"""``fxflash.optimize`` and ``fxflash.explain``: TorchDynamo captures, fxflash's backend rewrites.

Both go through the same capture path as ``torch.compile(backend="fxflash")``: Dynamo follows the
user's Python (arguments and outputs of any type, caches updated in place, tied parameters,
control flow that reads tensor values: a graph break, not a fallback of the whole call) and
guards everything it read; each graph it captures is rewritten by :mod:`fxflash.backend`, and the
rest of the graph is compiled by Inductor on a GPU and runs as eager PyTorch on a CPU
(``inner="auto"``).

Dynamo keeps its compiled graphs on the code object it starts from. Each optimized callable and
each ``explain()`` starts from a code object of its own (``_entry``), so that none shares its
cache, or its recompile limit, with another or with the user's own ``torch.compile``.
"""
from __future__ import annotations

import contextvars
import functools
import itertools
import logging
import types
import warnings
import weakref
from typing import Any, Callable

import torch

from .backend import INNER_COMPILERS, backend, recording
from .report import Report

_BACKENDS = {inner: backend(inner=inner, keep_reports=False) for inner in INNER_COMPILERS}
_IN_CALL: contextvars.ContextVar = contextvars.ContextVar("fxflash_in_call", default=False)


class _FakeRunErrors(logging.Filter):
    """Dynamo runs the user's code on fake tensors first. Where that code is wrong (a shape error),
    PyTorch's fake-tensor logger reports it at ERROR, with a traceback, before eager raises the same
    error: inside an optimized call the report is dropped, and the user sees eager's exception alone."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or not _IN_CALL.get()


logging.getLogger("torch._subclasses.fake_tensor").addFilter(_FakeRunErrors())
_EXPLAIN = backend(inner="eager", explaining=True, keep_reports=False)


_entries = itertools.count()


def _entry(target: Callable) -> Callable:
    """``target(*args, **kwargs)`` as a function whose code object is new, with a name of its own:
    its own Dynamo cache, and its own record of what changed between calls (Dynamo's automatic
    dynamic shapes and floats, kept by the code's file, line and name)."""

    def call(*args, **kwargs):
        return target(*args, **kwargs)

    name = f"fxflash_entry_{next(_entries)}"
    names = {"co_name": name, **({"co_qualname": name} if hasattr(call.__code__, "co_qualname") else {})}
    # globals of its own too: Dynamo keeps the compiled graphs of a frame in its function's globals
    # (and its guards keep those globals while the objects they guard live): the owner of the entry
    # clears them when it is freed, and the graphs' kernels go with them
    scope = {"__name__": __name__, "__builtins__": __builtins__}
    return types.FunctionType(call.__code__.replace(**names), scope, name, None, call.__closure__)


def _release(scope: dict) -> None:
    """Drop what Dynamo installed in an entry's globals (its compiled graphs); the names stay, for
    Dynamo's own clean-up to delete."""
    for name in scope:
        if name not in ("__name__", "__builtins__"):
            scope[name] = None


def _call(compiled: Callable, args: tuple, kwargs: dict) -> tuple[Any, BaseException | None]:
    """(result, None), or (None, the exception) where Dynamo itself failed (an error of its tracing or
    of a backend); the user's code's own run-time errors propagate. The caller runs the code eagerly
    after a failure, outside this except block: where the user's code itself is wrong, eager's
    exception is the one the user sees, alone."""
    token = _IN_CALL.set(True)
    try:
        return compiled(*args, **kwargs), None
    except torch._dynamo.exc.TorchDynamoException as exc:
        return None, exc
    finally:
        _IN_CALL.reset(token)


def _first_line(exc: BaseException) -> str:
    """``Type: message``'s first line, of the exception a backend raised where Dynamo wraps one."""
    exc = getattr(exc, "inner_exception", None) or exc
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


class _Optimizer:
    """The shared machinery of OptimizedFunction and OptimizedModule."""

    def __init__(self, target: Callable, inner: str):
        if inner not in INNER_COMPILERS:
            raise ValueError(f"fxflash.optimize: inner must be one of {INNER_COMPILERS}, got {inner!r}")
        self._target = target
        entry = _entry(target)
        self._compiled = torch.compile(entry, backend=_BACKENDS[inner])
        weakref.finalize(self, _release, entry.__globals__)
        self.eager_because = ""  # set when Dynamo failed on code that eager runs: it runs eagerly since

    def __call__(self, *args, **kwargs) -> Any:
        if self.eager_because:
            return self._target(*args, **kwargs)
        result, failure = _call(self._compiled, args, kwargs)
        if failure is None:
            return result
        # where eager runs what Dynamo could not, the call (and every later one) runs eagerly
        result = self._target(*args, **kwargs)
        self.eager_because = f"TorchDynamo could not capture the code ({_first_line(failure)})"
        warnings.warn(f"fxflash: running eagerly, {self.eager_because}", RuntimeWarning, stacklevel=3)
        return result

    def report(self, args: tuple, kwargs: dict) -> Report:
        """Run the call (compiling what it needs) and report the graphs it ran."""
        with recording() as reports:
            self(*args, **kwargs)
        return Report.of_graphs(reports, self.eager_because)


class OptimizedFunction:
    """What ``optimize(fn)`` returns for a plain function."""

    def __init__(self, fn: Callable, inner: str = "auto"):
        functools.update_wrapper(self, fn)
        self._optimizer = _Optimizer(fn, inner)

    def __call__(self, *args, **kwargs):
        return self._optimizer(*args, **kwargs)

    def report(self, *args, **kwargs) -> Report:
        """Call ``fn(*args, **kwargs)`` and return the report of the graphs the call ran: the
        regions found in each, fused or not."""
        return self._optimizer.report(args, kwargs)


class OptimizedModule(torch.nn.Module):
    """What ``optimize(module)`` returns: an ``nn.Module`` whose calls are optimized.

    The original module is ``_orig_mod`` (the state dict's keys start with ``_orig_mod.``, as
    ``torch.compile``'s do); its parameters and buffers are read live at each call, and its hooks
    run as they would.
    """

    def __init__(self, module: torch.nn.Module, inner: str = "auto"):
        super().__init__()
        self._orig_mod = module
        self._optimizer = _Optimizer(module, inner)

    def forward(self, *args, **kwargs):
        return self._optimizer(*args, **kwargs)

    def report(self, *args, **kwargs) -> Report:
        """Call the module and return the report of the graphs the call ran."""
        return self._optimizer.report(args, kwargs)


def optimize(fn_or_module, *, inner: str = "auto"):
    """Return a version of ``fn_or_module`` whose attention chains run as fused kernels.

    ``fn_or_module``: an ``nn.Module`` (an ``nn.Module`` is returned) or a function.
    ``inner``: what runs the rest of each graph: ``"inductor"`` (TorchInductor compiles it, as
    ``torch.compile(backend="fxflash")`` does), ``"eager"`` (PyTorch's ops, as traced), or
    ``"auto"``: Inductor where the graph's tensors are on a GPU, eager on a CPU.

    The first call captures (through TorchDynamo) and compiles; later calls reuse what Dynamo's
    guards accept, and a call they refuse (other shapes, dtypes, flags, attribute values) compiles
    again, as ``torch.compile`` does. Outputs match eager PyTorch; regions the rules cannot prove
    equivalent, and everything around them, run as PyTorch ops (see ``fxflash.explain``).
    """
    if isinstance(fn_or_module, torch.nn.Module):
        return OptimizedModule(fn_or_module, inner)
    if not callable(fn_or_module):
        raise TypeError(
            f"fxflash.optimize expects an nn.Module or a function, got {type(fn_or_module).__name__}"
        )
    return OptimizedFunction(fn_or_module, inner)


def explain(fn_or_module, *args, **kwargs) -> Report:
    """Call ``fn_or_module(*args, **kwargs)`` once, as eager PyTorch, and report what fxflash would
    fuse in it: each captured graph's candidate regions, their nodes and sketches, whether each is
    fused, and the rule that refused it if not. Runs no generated kernel."""
    if isinstance(fn_or_module, (OptimizedModule, OptimizedFunction)):
        raise TypeError("pass the original function or module to fxflash.explain, not the optimized one")
    entry = _entry(fn_or_module)
    compiled = torch.compile(entry, backend=_EXPLAIN, dynamic=False)
    try:
        with recording() as reports:
            _, failure = _call(compiled, args, kwargs)
    finally:
        _release(entry.__globals__)
    if failure is None:
        return Report.of_graphs(reports)
    fn_or_module(*args, **kwargs)  # where the user's code itself fails, eager's exception, alone
    return Report.of_graphs([], f"TorchDynamo could not capture the code ({_first_line(failure)})")
