"""Capture: a graph of torch calls (Dynamo's, or a test's function) → a functional,
shape-annotated ATen FX graph.

``capture`` traces one call with ``make_fx`` over ``torch.func.functionalize`` (in-place ops
become out-of-place, views stay views) and the decomposition table of
:mod:`fxflash.capture.decompositions`. Every node carries ``meta["val"]``, a fake (or real)
tensor with the node's shape, dtype, device and strides.

The graph's placeholders are the tensor (and SymInt) leaves of ``(args, kwargs)`` in pytree
order; other leaves are specialized into the graph (Dynamo guards them, for the graphs it hands
the backend).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from ..internal import stage
from .decompositions import decomposition_table
from .batch_views import hoist_batch_views
from .constant_triangles import triangles_of_constants
from .iota_index import index_by_iotas
from .layout_chains import collapse_layout_chains
from .scalar_constants import scalars_from_constants
from .snapshot import Snapshot, real_copies

log = logging.getLogger("fxflash")


class CaptureError(RuntimeError):
    """The code could not be traced to an FX graph; it runs eagerly instead. ``data_dependent``:
    its Python control flow reads tensor values (no trace of one call would hold for the next)."""

    data_dependent = False


class SideEffect(Exception):
    """The traced code changed Python objects it was given, which a graph cannot replay."""


def _data_dependent(exc: Exception) -> bool:
    """Did tracing stop where Python read a tensor's value (``if s.max() > 0``, ``.item()``)?"""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    kinds = (GuardOnDataDependentSymNode, DataDependentOutputException, DynamicOutputShapeException)
    while exc is not None and not isinstance(exc, kinds):
        exc = exc.__cause__
    return exc is not None


@dataclasses.dataclass
class CapturedGraph:
    """One traced call: the graph and how to feed it.

    graph_module:  the ATen graph; placeholders = parameters, then tensor leaves of the call.
    param_names:   names of the module's parameters and buffers, in placeholder order.
    in_spec:       pytree spec of ``(args, kwargs)``; ``tensor_positions`` are its tensor leaves.
    out_spec:      pytree spec of the user's return value; the graph returns its flat leaves.
    tracing_mode:  "fake" (no computation at capture) or "real" (data-dependent code).
    """

    graph_module: torch.fx.GraphModule
    in_spec: Any
    tensor_positions: list
    out_spec: Any
    tracing_mode: str

    def flat_inputs(self, args: tuple, kwargs: dict) -> list:
        # (args, kwargs) flattens to args then kwargs' values: a flat call needs no pytree walk
        leaves = args if _is_flat_call(args, kwargs) else pytree.tree_flatten((args, kwargs))[0]
        return [leaves[i] for i in self.tensor_positions]

    def run(self, module: Callable, args: tuple, kwargs: dict) -> Any:
        """Run ``module`` (this graph, a rewrite of it or its compiled form: a function of the
        flat inputs) on a call's inputs; rebuild the output."""
        flat_out = module(*self.flat_inputs(args, kwargs))
        return pytree.tree_unflatten(list(flat_out), self.out_spec)


def _is_flat_call(args: tuple, kwargs: dict) -> bool:
    """No kwargs and every argument a tensor, a SymInt or a plain number: the leaves are ``args``."""
    return not kwargs and all(isinstance(x, (torch.Tensor, torch.SymInt, int, float, bool, type(None))) for x in args)


def _flat_function(fn: Callable, leaves, in_spec, tensor_positions, out_box):
    def flat_fn(*flat_tensors):
        full = list(leaves)
        for pos, t in zip(tensor_positions, flat_tensors):
            full[pos] = t
        args, kwargs = pytree.tree_unflatten(full, in_spec)
        out = fn(*args, **kwargs)
        after, spec = pytree.tree_flatten((args, kwargs))
        if spec != in_spec or any(a is not b for a, b in zip(after, full)):
            # the code put other items into the lists or dicts it was given (rebuilt here)
            raise SideEffect("a list or dict")
        flat_out, out_spec = pytree.tree_flatten(out)
        out_box[:] = [out_spec]
        return flat_out

    return flat_fn


def _same(t):
    return t


def capture(
    fn: Callable,
    args: tuple,
    kwargs: dict | None = None,
    modes: tuple = ("fake", "real"),
) -> CapturedGraph:
    """Trace ``fn(*args, **kwargs)`` to a functional ATen graph.

    Tries fake tracing first (no computation), then real tracing (ops without a fake kernel) —
    except for code whose Python control flow reads tensor values, which no trace of one call
    holds for the next. Raises :class:`CaptureError` when no mode traces it. The call's arguments
    are left as they were found (snapshot.Snapshot); code that changes the Python objects it is
    given does not trace (a graph cannot replay that).
    Tensor and SymInt leaves become graph inputs; other leaves are specialized.
    """
    kwargs = kwargs or {}
    leaves, in_spec = pytree.tree_flatten((args, kwargs))
    tensor_positions = [i for i, x in enumerate(leaves) if isinstance(x, (torch.Tensor, torch.SymInt))]
    inputs = [leaves[i] for i in tensor_positions]
    errors = []
    with stage("capture"):
        snapshot = Snapshot([args, kwargs])
    for mode in modes:
        out_box: list = []
        flat_fn = _flat_function(fn, leaves, in_spec, tensor_positions, out_box)
        traced_inputs = inputs
        if mode == "real":
            traced_inputs = real_copies(inputs)
            snapshot.keep_contents(inputs)
        side_effects: list = []
        try:
            # tensors autograd saves while tracing are the trace's own, not the call's: kept by
            # identity hooks, so that hooks around the call (activation checkpointing) never see them
            with _quiet_fake_tensors(), torch.autograd.graph.saved_tensors_hooks(_same, _same):
                gm = make_fx(
                    torch.func.functionalize(flat_fn, remove="mutations"),
                    decomposition_table=decomposition_table(),
                    tracing_mode=mode,
                )(*traced_inputs)
        except SideEffect as exc:
            side_effects.append(str(exc))
        except Exception as exc:  # noqa: BLE001 - any tracing failure falls back
            errors.append(f"{mode} tracing: {type(exc).__name__}: {exc}")
            log.debug("capture with tracing_mode=%s failed: %s", mode, exc)
            if _data_dependent(exc):
                error = CaptureError("could not trace the code to an FX graph: its Python control flow reads "
                                     f"tensor values ({type(exc).__name__})")
                error.data_dependent = True
                raise error from None
            continue
        finally:
            with stage("capture"):
                changed = snapshot.restore() + side_effects
        if changed:  # a graph replays tensor writes, not Python's: such code runs as written
            errors.append(f"{mode} tracing: the code changes {', '.join(dict.fromkeys(changed))} that it was "
                          "given; a graph cannot replay that")
            continue
        with stage("capture"):
            gm.graph.eliminate_dead_code()
            scalars_from_constants(gm)
            triangles_of_constants(gm)
            collapse_layout_chains(gm)
            index_by_iotas(gm)
            hoist_batch_views(gm)
            gm.graph.eliminate_dead_code()
            gm.recompile()
        return CapturedGraph(gm, in_spec, tensor_positions, out_box[0], mode)
    raise CaptureError("could not trace the code to an FX graph:\n  " + "\n  ".join(errors))


@contextlib.contextmanager
def _quiet_fake_tensors():
    """Tracing tries ops on fake tensors; PyTorch logs each failure at ERROR with a traceback. The
    failure is capture's to report (CaptureError), or the user's code's own error, raised by eager."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
