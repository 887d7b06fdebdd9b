"""The ``fxflash::region`` custom op: one fused region, opaque to Dynamo, AOTAutograd, Inductor.

``region(key, inputs, sizes, scalars, statistics)`` runs the generated kernel registered under ``key`` on
``inputs`` (the tensors the kernel reads). ``sizes`` holds the frame sizes ``[*batch, M, N]``,
then the shapes of the results, then the integer sizes the region's own ops read (symbolic
under ``dynamic=True``), then those the kernel reads at run time (``KernelPlan.sym_nodes``); ``scalars`` the float values they read (``size(-1) ** -0.5``). It
returns ``[result, *row values]``: the result is a new tensor, contiguous or in eager's
layout of the region's last op; the row values (a logsumexp returned by the user's code)
are contiguous; with ``statistics`` (the training forward, ``training_call``) what the fused
backward reads follows (``KernelPlan.training_outputs``: each row's softmax maximum and ``1/sum``,
the output before ops after P·V). Its fake implementation gives the shape and
dtype without running anything. Its autograd formula runs the region's fused backward
(``fxflash::region_backward``, runtime/backward.py) where it has one and the inputs asking for
gradients are ones it gives (Q, K, V, a bias the scores read); otherwise it recomputes the
region's own subgraph with eager autograd.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import logging
import threading
import weakref

import torch
import torch.fx as fx

from ..internal import InternalError, stage, warn
from ..codegen.plan import KernelPlan
from . import precompile, tuning
from .launch import Launcher, PinRefused, empty_results, replay_views

log = logging.getLogger("fxflash")


@dataclasses.dataclass
class Subgraph:
    """Ops of the replaced graph as a GraphModule of their own, for their backward (its vjp, in
    runtime/backward.py): a region's ops after P·V, ``module(O, *the op's inputs, *extras) →
    (output,)``, or the ops that compute a value the kernel computes rather than loads (ALiBi's
    bias from its slopes), ``module(*the op's inputs, *extras) → (value,)``."""

    module: fx.GraphModule
    extras: tuple   # the places among the region's extras (RegisteredRegion.extras) of those it reads
    inputs: tuple   # the op's floating inputs it reads: their gradients come from its vjp


COMPILED_LAYOUTS = 8  # layouts a region's own ops are compiled by Inductor for (RegisteredRegion.own_ops)


@dataclasses.dataclass
class RegisteredRegion:
    plan: KernelPlan
    kernel: object
    reference: fx.GraphModule  # (inputs, extras) → the region's outputs: the replaced ops
    out_ranks: tuple           # ranks of the result and of each row value returned beside it
    extra_is_float: tuple      # for each extra input of the reference: float (else int)
    epilogue: Subgraph | None = None  # the ops after P·V, where the region has them and a fused backward
    computed: dict = dataclasses.field(default_factory=dict)  # gradient tile j → the Subgraph computing its value
    # per input, the view chain (launch.replay_views) from the tensor the op is given to the one the
    # kernel reads, or None: GQA's K and V are given before their broadcast, so that their gradients
    # are the K/V heads' own (rewrite.grouped_views; the grouped key programs sum them)
    views: tuple | None = None
    # how the code the region replaced ran: "eager", or "inductor" (the backend's inner compiler);
    # the tuner times the region's own ops so beside its kernels (tuning.EAGER, COMPILED)
    replaced: str = "eager"
    compiled: dict = dataclasses.field(init=False, default_factory=dict)  # layout → the ops compiled by Inductor
    launcher: Launcher = dataclasses.field(init=False)
    failed: InternalError | None = dataclasses.field(init=False, default=None)  # then it runs eagerly
    # then its backward recomputes the region's own ops with eager autograd (runtime/backward.py)
    backward_failed: InternalError | None = dataclasses.field(init=False, default=None)
    # the backward's launches per layout (runtime/backward._layout_key → its _Bound steps)
    bound_backward: dict = dataclasses.field(init=False, default_factory=dict)

    def __post_init__(self):
        self.launcher = Launcher(self.plan, self.kernel)

    @functools.cached_property
    def training_launcher(self) -> Launcher:
        """The launcher of the forward that also stores what the backward reads (``plan.training``)."""
        from .cache import load_kernel

        return Launcher(self.plan.training, load_kernel(self.plan.training.source, self.plan.training.name))

    def training_shapes(self, frame) -> list:
        """The shapes of the training forward's results after the region's own (``training_outputs``)."""
        *rows, _ = frame
        return [[*rows, self.plan.dv] if name == "o" else rows for name in self.plan.training.training_outputs]

    def own_ops(self, own: tuple, args: list) -> list:
        """The region's own ops on ``args`` (inputs, then extras), run as ``own`` says: by PyTorch,
        or compiled by Inductor as the graph would have compiled them, once per layout of ``args``
        (``COMPILED_LAYOUTS`` of them, as Dynamo's recompile limit; run by PyTorch beyond those,
        and while a CUDA graph is captured, where a first compilation could not run Inductor's
        own tuning)."""
        if own != tuning.COMPILED or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
            return self.reference(*args)
        key = tuple((a.shape, a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args)
        compiled = self.compiled.get(key)
        if compiled is None and len(self.compiled) >= COMPILED_LAYOUTS:
            return self.reference(*args)
        if compiled is None:
            compiled = self.compiled[key] = _inductor_compile(self.reference, list(args))
        with torch.no_grad():
            return compiled(*args)

    def split(self, sizes):
        """(frame sizes, [shape of each output], extra integer sizes) from ``sizes``."""
        nf = self.plan.frame_rank + 2
        shapes, at = [], nf
        for rank in self.out_ranks:
            shapes.append(list(sizes[at:at + rank]))
            at += rank
        return sizes[:nf], shapes, sizes[at:]

    def extras(self, sizes, scalars) -> list:
        ints, floats = iter(self.split(sizes)[2]), iter(scalars)
        return [next(floats) if f else next(ints) for f in self.extra_is_float]

    def launches(self, frame, shapes) -> bool:
        """Does a call of these sizes launch the kernel? Not where there is nothing to tile, where
        the kernel's int32 index arithmetic could overflow, or after the kernel failed."""
        return self.failed is None and not (0 in frame or 0 in shapes[0] or not self.plan.int32_index_ok(frame))

    def compile_ahead(self, inputs, sizes, scalars, statistics: bool) -> None:
        """``Launcher.compile_ahead`` for a call of ``run`` on tensors of ``inputs``' layouts: the
        same launcher (the training forward's with ``statistics``) and results, where it launches;
        with the region's own ops where ``run`` would have Inductor compile them (COMPILED)."""
        frame, shapes, _ = self.split(sizes)
        if not self.launches(frame, shapes):
            return
        if statistics:
            self.training_launcher.compile_ahead(inputs, sizes, frame, [*shapes, *self.training_shapes(frame)],
                                                 self.views)
            return
        compiled = self.replaced == "inductor" and all(type(s) in (int, float) for s in scalars)
        self.launcher.compile_ahead(inputs, sizes, frame, shapes, self.views,
                                    functools.partial(self._own_ops_job, sizes, scalars) if compiled else None)

    def _own_ops_job(self, sizes, scalars, inputs) -> dict | None:
        """The compile job of ``own_ops(COMPILED, …)`` on ``inputs`` (``precompile.graph_job``)."""
        return precompile.graph_job(self.reference, [*inputs, *self.extras(sizes, scalars)])

    def run(self, inputs, sizes, scalars, views=None, statistics: bool = False) -> list:
        """``views``: the view chains folded into a direct call (``launch.replay_views``), before the
        region's own (``self.views``); ``statistics``: run the training forward (``plan.training``),
        whose results end with what the fused backward reads (``training_outputs``, shaped by
        ``training_shapes``)."""
        frame, shapes, _ = self.split(sizes)
        views = then_views(views, self.views)
        if self.launches(frame, shapes):
            try:
                with stage("launch", PinRefused):
                    if statistics:  # no eager candidate: the region's own ops give no statistics
                        return self.training_launcher(inputs, sizes, frame, [*shapes, *self.training_shapes(frame)],
                                                      views)
                    own = tuning.COMPILED if self.replaced == "inductor" else tuning.EAGER
                    return self.launcher(inputs, sizes, frame, shapes, views, own_ops=(own, lambda: self.own_ops(
                        own, [*replay_views(inputs, views), *self.extras(sizes, scalars)])))
            except InternalError as exc:  # this region runs as eager from now on
                self.failed = exc
                warn(exc, "this region runs as eager PyTorch from now on")
        # nothing to tile (eager's semantics for empty sums), sizes so large that the kernel's
        # int32 index arithmetic could overflow, or a kernel that failed: the replaced ops as they were
        results = list(self.reference(*replay_views(inputs, views), *self.extras(sizes, scalars)))
        if statistics:  # the statistics from the backward's own kernel (runtime/backward.py); O
            # left unset: the backward reads it only where the forward's kernel launched
            from .backward import row_statistics

            outputs = self.plan.training.training_outputs
            if "m" in outputs:
                results += row_statistics(self, replay_views(inputs, views), frame, self.extras(sizes, scalars),
                                          self.plan.symints(sizes))
            if "o" in outputs:
                results.append(inputs[0].new_empty([*frame[:-1], self.plan.dv], dtype=self.plan.training.side_dtypes[-1]))
        return results


def _inductor_compile(module: fx.GraphModule, args: list):
    """``module`` compiled by Inductor for ``args``' layouts, through ``standalone_compile``, whose
    compilations Inductor caches on disk (a compile worker's, ``precompile.graph_job``, among them;
    ``torch._inductor.compile`` bypasses the cache). Without gradients, as the worker compiles it
    (grad mode is part of the cache key): the region's backward never runs through these ops."""
    import torch._inductor

    with torch.no_grad():
        return torch._inductor.standalone_compile(module, args, dynamic_shapes="from_example_inputs")


def then_views(first, then) -> tuple | None:
    """Per input, the view chain ``first`` followed by ``then`` (either None: none)."""
    if not first or not then:
        return first or then
    return tuple((*(a or ()), *(b or ())) for a, b in zip(first, then))


# A region lives as long as a graph that calls it: ``owned`` maps each graph (weakly) to the
# entries of its regions, the registry holds them weakly, so an optimized callable's evicted or
# deleted graphs free their kernels' entries too. (Not an attribute of the graph: Inductor pickles
# the graph for its cache.)
_REGISTRY: weakref.WeakValueDictionary[str, RegisteredRegion] = weakref.WeakValueDictionary()
owned: weakref.WeakKeyDictionary[fx.GraphModule, list] = weakref.WeakKeyDictionary()
_counts: collections.Counter = collections.Counter()  # registrations per content digest
_lock = threading.Lock()


def content_key(entry: RegisteredRegion) -> str:
    """A digest of everything a region's behaviour depends on: its kernels' sources, the ops it
    replaces, its results' ranks, its inputs' views, and the settings read when a compiler traces
    its call."""
    from ..config import config, interpreting

    plan = entry.plan
    parts = [plan.source, plan.training.source if plan.training else "",
             plan.backward.source if plan.backward else "", plan.gluon.source if plan.gluon else "",
             entry.reference.code, *(sub.module.code + repr((sub.extras, sub.inputs))
                                     for sub in [entry.epilogue, *entry.computed.values()] if sub is not None),
             repr((sorted(entry.computed), entry.out_ranks, entry.extra_is_float, entry.views, plan.args,
                   plan.out_dtype, plan.side_dtypes, plan.training_outputs, plan.configs, plan.index_bound,
                   plan.summaries, plan.dv_split, plan.flags, plan.repair_args,
                   config.forward_statistics, config.fused_backward, interpreting()))]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def register(entry: RegisteredRegion, owner: fx.GraphModule | None) -> str:
    """Register ``entry`` for the graph ``owner`` that calls it (None: the caller records the graph
    that will, in ``owned``); the key its call names: the
    region's ``content_key`` and how many regions with that digest this process registered before.
    So a process that compiles the same graphs in the same order names their regions as another
    did, and a graph that Inductor's caches reload from that process calls the regions it was
    compiled with (AOTAutogradCache keys the graph, key strings included); regions that differ
    never share a key."""
    digest = content_key(entry)
    with _lock:
        key = f"{entry.plan.name}-{digest}#{_counts[digest]}"
        _counts[digest] += 1
        _REGISTRY[key] = entry
        if owner is not None:
            owned.setdefault(owner, []).append(entry)
    return key


def registered(key: str) -> RegisteredRegion:
    try:
        return _REGISTRY[key]
    except KeyError:
        raise RuntimeError(
            f"fxflash: fused region {key!r} is not registered in this process; graphs holding fused "
            "regions cannot be saved and reloaded elsewhere — optimize the model again"
        ) from None


@torch.library.custom_op("fxflash::region", mutates_args=())
def region(key: str, inputs: list[torch.Tensor], sizes: list[int], scalars: list[float],
           statistics: bool) -> list[torch.Tensor]:
    return registered(key).run(inputs, sizes, scalars, statistics=statistics)


@region.register_fake
def _region_fake(key, inputs, sizes, scalars, statistics):
    entry = registered(key)
    frame, shapes, _ = entry.split(sizes)
    if statistics:
        return empty_results(entry.plan.training, [*shapes, *entry.training_shapes(frame)], inputs[0])
    return empty_results(entry.plan, shapes, inputs[0])


def compile_ahead(graph: fx.Graph) -> None:
    """Start compiling, in worker processes, the kernels the tuner will time at each region call's
    first run (``RegisteredRegion.compile_ahead``), on empty tensors of the call's layouts: the backend calls
    it before its inner compiler compiles ``graph``, which then compiles beside them. A call with
    symbolic sizes or off the GPU, or one whose start fails, is left to its first run, as is every
    call while a CUDA graph is captured (a dry launch's own ops would be recorded)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return
    started = set()
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.fxflash.region.default:
            continue
        key, inputs, sizes, scalars = node.args[:4]
        values = [n.meta.get("val") for n in inputs]
        if not (all(isinstance(v, torch.Tensor) and v.device.type == "cuda" for v in values)
                and all(type(s) is int for s in sizes)):
            continue
        entry = registered(key)
        statistics = _keeps_statistics(key, values)
        layout = (entry.plan.source, statistics, tuple(sizes), tuple(_layout(v) for v in values))
        if layout in started:
            continue
        started.add(layout)
        try:
            with unset_fake_temporarily():
                entry.compile_ahead([_empty_of(v) for v in values], sizes, scalars, statistics)
        except Exception as exc:  # noqa: BLE001 - the first run compiles what it needs
            log.debug("fxflash: kernels of %s not compiled ahead: %s", key, exc)


def _layout(v: torch.Tensor) -> tuple:
    return tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, v.device


def _empty_of(v: torch.Tensor) -> torch.Tensor:
    """An uninitialized tensor of ``v``'s layout (shape, strides and storage offset, so the same
    pointer alignment), on ``v``'s device."""
    extent = v.storage_offset() + 1 + sum((n - 1) * s for n, s in zip(v.shape, v.stride())) if v.numel() else 0
    return torch.empty(extent, dtype=v.dtype, device=v.device).as_strided(v.shape, v.stride(), v.storage_offset())


def _keeps_statistics(key: str, inputs: list) -> bool:
    """Will autograd record this call, and its backward take the fused kernels, which read the row
    statistics that the training forward stores (decided from the inputs' devices and which need
    gradients, also while a compiler traces the call)?"""
    from ..config import config
    from .backward import fused_backward_applies

    if not (config.forward_statistics and torch.is_grad_enabled() and any(t.requires_grad for t in inputs)):
        return False
    entry = registered(key)
    return entry.plan.training is not None and fused_backward_applies(entry, inputs, [t.requires_grad for t in inputs])


def training_call(key: str, inputs: list, sizes: list, scalars: list) -> list:
    """A fused region called from a graph that a compiler traces with autograd (the backend's
    inner Inductor): the training forward where the fused backward will read its statistics,
    which the call's results then leave out."""
    statistics = _keeps_statistics(key, inputs)
    results = region(key, inputs, sizes, scalars, statistics)
    return results[:len(results) - len(registered(key).plan.training.training_outputs)] if statistics else results


# ``training_call`` as an op of its own (``fxflash::region_call``), for the graphs handed to
# Inductor: composite, so that AOTAutograd's trace runs the function above, and an operator, which
# AOTAutogradCache accepts (it refuses a graph calling a Python function). What the function decides
# while traced is in the region's key (``content_key``), so a graph reloaded from that cache decided
# as a new trace would.
_library = torch.library.Library("fxflash", "FRAGMENT")
_library.define("region_call(str key, Tensor[] inputs, SymInt[] sizes, float[] scalars) -> Tensor[]")
_library.impl("region_call", training_call, "CompositeImplicitAutograd")


def call_region(key: str, inputs: list, sizes: list, scalars: list, views=None) -> list:
    """A fused region called from ``optimize()``'s own graph: straight to the kernel when the
    dispatcher has nothing to do (no gradient to record, plain tensors, no mode or compiler
    tracing the call), which saves its per-call cost; through the custom op otherwise.
    ``views``: the view ops on the inputs that ``rewrite.with_direct_calls`` folded into the
    call, per input (``launch.replay_views``); applied here only when the launch needs them."""
    if ((torch.is_grad_enabled() and any(t.requires_grad for t in inputs))
            or any(type(t) is not torch.Tensor for t in inputs)
            or torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack() > 0
            or torch.compiler.is_compiling()):
        return training_call(key, replay_views(inputs, views), sizes, scalars)
    return registered(key).run(inputs, sizes, scalars, views)


@torch.library.custom_op("fxflash::region_backward", mutates_args=())
def region_backward(key: str, inputs: list[torch.Tensor], out: torch.Tensor, grad: torch.Tensor,
                    sizes: list[int], scalars: list[float], input_grads: bool,
                    statistics: list[torch.Tensor]) -> list[torch.Tensor]:
    """The fused backward of region ``key`` (runtime/backward.py): the gradients of the inputs it
    reads as Q, K and V (``BackwardPlan.inputs``), then with ``input_grads`` those of the inputs
    its score chain reads as they are (``BackwardPlan.input_grads``), then those of the inputs the
    ops after P·V read (``RegisteredRegion.epilogue``'s inputs), shaped as those inputs. ``statistics``: the training
    forward's ``training_outputs`` (``m``, ``1/l``, the output before the ops after P·V), or empty."""
    from .backward import run_backward

    entry = registered(key)
    return run_backward(entry, inputs, out, grad, entry.split(sizes)[0], entry.extras(sizes, scalars),
                        entry.plan.symints(sizes), input_grads, statistics)


@region_backward.register_fake
def _region_backward_fake(key, inputs, out, grad, sizes, scalars, input_grads, statistics):
    from .backward import given_inputs

    return [inputs[i].new_empty(inputs[i].shape) for i in given_inputs(registered(key), input_grads)]


def _setup_context(ctx, inputs, output):
    key, tensors, sizes, scalars, statistics = inputs
    ctx.key = key
    ctx.sizes, ctx.scalars = sizes, scalars
    ctx.extra = registered(key).extras(sizes, scalars)
    # the gradient of ``scalars`` must have its structure: an empty list stays a list
    ctx.no_scalars = [] if not scalars else None
    ctx.needs = [t.requires_grad for t in tensors]
    # the training forward's last results (training_outputs: m, 1/l, O before the ops after P·V)
    outputs = registered(key).plan.training.training_outputs if statistics else ()
    ctx.statistics = len(outputs)
    stored = output[len(output) - ctx.statistics:]
    if statistics:
        ctx.mark_non_differentiable(*stored)
    # where the forward stores O (``o``), the backward reads it and never the output: the output is
    # not kept for it (the fp32 O held in its place)
    ctx.save_for_backward(*tensors, stored[outputs.index("o")] if "o" in outputs else output[0], *stored)


def _backward(ctx, grads_out):
    from .backward import fused_backward_applies, given_inputs, score_inputs

    saved = ctx.saved_tensors
    tensors, out, statistics = saved[:len(ctx.needs)], saved[len(ctx.needs)], saved[len(ctx.needs) + 1:]
    grads_out = grads_out[:len(grads_out) - ctx.statistics]
    entry = registered(ctx.key)
    # the ops after P·V differentiate at the output before them, which only the training forward keeps
    if grads_out[0] is not None and all(g is None for g in grads_out[1:]) \
            and fused_backward_applies(entry, tensors, ctx.needs) and (entry.epilogue is None or statistics):
        grads = [None] * len(tensors)
        input_grads = any(ctx.needs[i] for i in score_inputs(entry))
        results = region_backward(ctx.key, tensors, out, grads_out[0], ctx.sizes, ctx.scalars, input_grads,
                                  list(statistics))
        for i, g in zip(given_inputs(entry, input_grads), results):
            if ctx.needs[i]:
                grads[i] = g if grads[i] is None else grads[i] + g   # a bias that is also V, say
        return None, grads, None, ctx.no_scalars, None
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(need) for t, need in zip(tensors, ctx.needs)]
        twin = entry.plan.twin   # a region with softmax streams: its twin's kernels (runtime/twin.py)
        if twin is not None and tuple(ctx.extra) == twin.extras:
            outs = twin.module(*replay_views(leaves, entry.views))
        else:
            outs = entry.reference(*replay_views(leaves, entry.views), *ctx.extra)
        pairs = [(o, g) for o, g in zip(outs, grads_out) if g is not None and o.requires_grad]
        wanted = [leaf for leaf, need in zip(leaves, ctx.needs) if need]
        grads = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
                     if pairs else [None] * len(wanted))
    return None, [next(grads) if need else None for need in ctx.needs], None, ctx.no_scalars, None


region.register_autograd(_backward, setup_context=_setup_context)
