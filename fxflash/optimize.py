"""``fxflash.optimize``: capture lazily per input signature, rewrite, run.

The returned callable keeps a bounded LRU cache of compiled graphs keyed by the input
signature (shapes, dtypes, devices, stride class, ``requires_grad``, grad mode, non-tensor
argument values). Code that cannot be traced runs eagerly, with one warning.
"""
from __future__ import annotations

import functools
import logging
import warnings
from typing import Any, Callable

import torch

from .capture import Ambient, CaptureError, SignatureCache, capture, exact_key, module_params, signature_of
from . import internal
from .config import config
from .codegen.rewrite import with_direct_calls
from .pipeline import optimize_graph, timed
from .internal import InternalError
from .report import Report

log = logging.getLogger("fxflash")


class _Compiled:
    """One signature's compiled graph, or the eager fallback when capture failed."""

    def __init__(self, captured, runner, report: Report | None, error: str = ""):
        self.captured = captured
        self.runner = runner
        self.report = report
        self.error = error


NO_RESULT = object()  # _capture ran no eager call


def _capture(fn, module, params, args, kwargs, run_eagerly: bool = True):
    """(captured program, ``NO_RESULT`` or the call's eager result). Code that fake tracing cannot
    follow runs eagerly once before it is traced with real tensors (``run_eagerly``; explain()
    runs none): code that fails raises its own error there, once (it has run at most twice), and
    code that works gives this call's result. Raises CaptureError (with ``.result``) when real
    tracing fails too."""
    if not run_eagerly:
        return capture(fn, args, kwargs, module=module, params=params), NO_RESULT
    try:
        return capture(fn, args, kwargs, module=module, params=params, modes=("fake",)), NO_RESULT
    except CaptureError as fake_error:
        result = fn(*args, **kwargs)
        if fake_error.data_dependent:
            fake_error.result = result
            raise
        try:
            return capture(fn, args, kwargs, module=module, params=params, modes=("real",)), result
        except CaptureError as real_error:
            error = CaptureError(f"{fake_error}\n  {str(real_error).split(chr(10), 1)[-1].strip()}")
            error.result = result
            raise error from None


def _captured_and_optimized(fn, module, params, args, kwargs, run_eagerly: bool = True):
    """(captured program, rewritten graph, report, eager result or NO_RESULT); the report's
    ``seconds`` include capture."""
    seconds: dict = {}
    with timed(seconds, "capture"):
        captured, result = _capture(fn, module, params, args, kwargs, run_eagerly)
    runner, report = optimize_graph(captured.graph_module, seconds=seconds)
    return captured, runner, report, result


def _compile(fn, module, params, args, kwargs) -> tuple[_Compiled, Any]:
    """(this signature's compiled entry, this call's eager result or NO_RESULT)."""
    try:
        captured, runner, report, result = _captured_and_optimized(fn, module, params, args, kwargs)
    except CaptureError as exc:
        warnings.warn(f"fxflash: running eagerly, {exc}", RuntimeWarning, stacklevel=5)
        return _Compiled(None, None, None, str(exc)), getattr(exc, "result", NO_RESULT)
    except InternalError as exc:
        internal.warn(exc, "the call runs as eager PyTorch", stacklevel=4)
        return _Compiled(None, None, None, str(exc)), NO_RESULT
    if not any(region.fused for region in report.regions):
        runner = None  # nothing fused: the user's own code runs, bit for bit as eager
    else:
        runner = with_direct_calls(runner)
    return _Compiled(captured, runner, report), result


class _Optimizer:
    """The shared machinery of OptimizedFunction and OptimizedModule."""

    def __init__(self, fn: Callable, module: torch.nn.Module | None, cache_size: int | None):
        self._fn = fn
        self._module = module
        self._cache_size = cache_size
        self.cache = SignatureCache(lambda: self._cache_size or config.cache_size)
        self._signatures: dict = {}  # exact_key → signature_of, for flat calls (a memo)
        self._ambient = Ambient(fn, module)

    def signature(self, args: tuple, kwargs: dict, params: dict):
        ambient = self._ambient.key()  # what the trace read besides the arguments
        exact = exact_key(args, kwargs, params)
        if exact is not None:
            exact = (exact, ambient)
        key = self._signatures.get(exact) if exact is not None else None
        if key is None:
            key = (signature_of(args, kwargs, params), ambient)
            if exact is not None:
                if len(self._signatures) >= 4 * max(1, len(self.cache)) + 16:
                    self._signatures.clear()
                self._signatures[exact] = key
        return key

    def compiled_for(self, args: tuple, kwargs: dict) -> tuple[_Compiled, dict, Any]:
        """(the entry for this call's signature, the live parameters, the eager result of this call
        if compiling it ran one, else NO_RESULT)."""
        params = module_params(self._module)
        key = self.signature(args, kwargs, params)
        results = []

        def build():
            entry, result = _compile(self._fn, self._module, params, args, kwargs)
            results.append(result)
            return entry

        entry = self.cache.get_or_build(key, build)
        return entry, params, results[0] if results else NO_RESULT

    def __call__(self, *args, **kwargs) -> Any:
        entry, params, result = self.compiled_for(args, kwargs)
        if result is not NO_RESULT:
            return result  # compiling ran this call eagerly already
        if entry.runner is None:
            return self._fn(*args, **kwargs)
        # the graph's own code, without nn.Module's call machinery (no hooks on it): ~7 µs per call
        return entry.captured.run(entry.runner.forward, params, args, kwargs)


class OptimizedFunction:
    """What ``optimize(fn)`` returns for a plain function."""

    def __init__(self, fn: Callable, cache_size: int | None = None):
        functools.update_wrapper(self, fn)
        self._optimizer = _Optimizer(fn, None, cache_size)

    def __call__(self, *args, **kwargs):
        return self._optimizer(*args, **kwargs)

    def report(self, *args, **kwargs) -> Report | None:
        """The report of the graph compiled for these inputs (compiling it if needed)."""
        return self._optimizer.compiled_for(args, kwargs)[0].report


class OptimizedModule(torch.nn.Module):
    """What ``optimize(module)`` returns: an ``nn.Module`` whose forward is optimized.

    The original module is ``_orig_mod``; its parameters and buffers are read live at each call.
    """

    def __init__(self, module: torch.nn.Module, cache_size: int | None = None):
        super().__init__()
        self._orig_mod = module
        self._optimizer = _Optimizer(module.forward, module, cache_size)

    def forward(self, *args, **kwargs):
        return self._optimizer(*args, **kwargs)

    def report(self, *args, **kwargs) -> Report | None:
        return self._optimizer.compiled_for(args, kwargs)[0].report


def optimize(fn_or_module, *, cache_size: int | None = None):
    """Return a version of ``fn_or_module`` whose attention chains run as fused kernels.

    ``fn_or_module``: an ``nn.Module`` (an ``nn.Module`` is returned) or a function of tensors.
    ``cache_size``:   input signatures kept compiled (LRU); default ``fxflash.config.cache_size``.

    The first call for each input signature captures and compiles; later calls with the same
    signature reuse it. Outputs match eager PyTorch; regions the rules cannot prove equivalent
    run unchanged (see ``fxflash.explain``).
    """
    if isinstance(fn_or_module, torch.nn.Module):
        return OptimizedModule(fn_or_module, cache_size)
    if not callable(fn_or_module):
        raise TypeError(
            f"fxflash.optimize expects an nn.Module or a function, got {type(fn_or_module).__name__}"
        )
    return OptimizedFunction(fn_or_module, cache_size)


def explain(fn_or_module, *args, **kwargs) -> Report:
    """Capture ``fn_or_module(*args, **kwargs)`` and report the candidate regions: their nodes
    and sketches, whether each is fused, and the rule that refused it if not. Runs no kernel."""
    module = fn_or_module if isinstance(fn_or_module, torch.nn.Module) else None
    if isinstance(fn_or_module, (OptimizedModule, OptimizedFunction)):
        raise TypeError("pass the original function or module to fxflash.explain, not the optimized one")
    fn = module.forward if module is not None else fn_or_module
    try:
        return _captured_and_optimized(fn, module, module_params(module), args, kwargs, run_eagerly=False)[2]
    except InternalError as exc:
        internal.warn(exc, "explain() reports no region", stacklevel=2)
        return Report(regions=[], graph=None, analysis=None, capture_note=str(exc))
