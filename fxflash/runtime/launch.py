"""Launching a generated kernel: run-time arguments from the op's inputs, tile sizes, grid."""
from __future__ import annotations

import contextlib
import functools
import math
import threading

import torch
import triton

from ..config import config, interpreting
from ..internal import stage
from . import gluon_launch, tuning
from .cache import load_kernel
from .interpreted import interpreted_language
from ..codegen.plan import INTERPRETER_TILE, KernelPlan, block_dims_of
from ..codegen.gluon_plan import gluon_tile, is_gluon_tile

# Triton's interpreter patches global state while it runs a kernel: launches from several
# threads take turns (compiled GPU kernels launch concurrently).
_INTERPRETER_LOCK = threading.Lock()


def _launching():
    """Around a kernel launch: in the interpreter, its lock and triton.language as the interpreter
    runs it (interpreted.interpreted_language)."""
    return _interpreted_launch() if interpreting() else contextlib.nullcontext()


@contextlib.contextmanager
def _interpreted_launch():
    with _INTERPRETER_LOCK, interpreted_language():
        yield




@functools.lru_cache(maxsize=None)
def _device_label(index) -> str:
    """The GPU's name and compute capability: part of the tuning key."""
    major, minor = torch.cuda.get_device_capability(index)
    return f"{torch.cuda.get_device_name(index)} sm{major}{minor}"


def tile_for(plan: KernelPlan, inputs: list, frame: list, run, own: tuple | None = None) -> tuple:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for this launch, or a Gluon configuration
    (gluon_plan.GLUON_CONFIGS), or ``own``: a tile pinned by ``tuning.pinned``; else 16×16
    tiles in the interpreter; on a GPU the tuned choice for this size bucket among the ``tl``
    kernel's tiles, the Gluon configurations this launch can use and ``own`` (``tuning.EAGER``
    or ``COMPILED``: the caller can run the region's own ops so), those ops themselves
    (tuning.choose)."""
    device = inputs[0].device
    pinned = tuning.pinned_tile()
    if pinned is not None:
        return pinned
    if interpreting() or device.type != "cuda":
        return INTERPRETER_TILE
    source, kernels = tile_candidates(plan, inputs, frame)
    own_ops = [own] if own is not None and _times_own_ops(frame, device) else []
    return tuning.choose(plan.name, source, [*kernels, *own_ops], [t.dtype for t in inputs],
                         _device_label(device.index),
                         frame, run, capturing=torch.cuda.is_current_stream_capturing(),
                         device_index=device.index)


def tile_candidates(plan: KernelPlan, inputs: list, frame: list) -> tuple[str, list]:
    """(the source a tuning choice is keyed by, the kernel configurations the tuner times for this
    launch): the ``tl`` kernel's tiles and the Gluon configurations the launch can use."""
    gluon = gluon_launch.candidates(plan.gluon, inputs, frame)
    return plan.source + (plan.gluon.source if gluon else ""), [*plan.configs, *gluon]


EAGER_BYTES_PER_SCORE = 16  # the region's own ops hold about four fp32 score-sized tensors at once


def _times_own_ops(frame, device) -> bool:
    """Does the tuner time the region's own ops beside its kernels for a launch of ``frame``?"""
    return config.time_eager and _eager_fits(frame, device)


def _eager_fits(frame, device) -> bool:
    """Is there GPU memory for timing the region's own ops (their score-sized intermediates),
    with half of what is free to spare? Where there is not, the kernel is kept untimed against
    them: the user's code could not have run here either."""
    free, _ = torch.cuda.mem_get_info(device)
    return math.prod(int(s) for s in frame) * EAGER_BYTES_PER_SCORE <= free // 2


def empty_results(plan: KernelPlan, shapes: list, like: torch.Tensor) -> list:
    """``[result, *row values]`` of the given shapes, uninitialized: the result contiguous, or
    laid out in ``plan.out_order`` (eager's layout of the region's last op); the row values
    (a logsumexp) contiguous. One allocation each, at its strides (``dense_strides``: 40 % of
    the host time of allocating in that order and permuting)."""
    sides = [like.new_empty(shape, dtype=dtype) for shape, dtype in zip(shapes[1:], plan.side_dtypes)]
    if plan.out_order is None:
        return [like.new_empty(shapes[0], dtype=plan.out_dtype), *sides]
    return [like.new_empty_strided(shapes[0], dense_strides(shapes[0], plan.out_order), dtype=plan.out_dtype), *sides]


def dense_strides(shape, order) -> list:
    """The strides of a dense tensor of ``shape`` whose axes lie in memory in ``order``
    (outermost first): a contiguous tensor of the shape ``[shape[a] for a in order]``,
    permuted back. A size 0 strides as a size 1, as PyTorch's contiguous strides do."""
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(order):
        strides[axis] = step
        step *= max(shape[axis], 1)
    return strides


def min_max_per_tile(t: torch.Tensor, axis: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The minimum and maximum of ``t`` over each run of ``block`` entries along ``axis`` (the
    last run may be shorter): two tensors of ``t``'s shape with that axis ``cdiv(n, block)``
    long. The last run is padded with copies of its last entry, which change neither."""
    n = t.shape[axis]
    short = (-n) % block
    if short:
        pad = t.narrow(axis, n - 1, 1).expand(*(short if a == axis else s for a, s in enumerate(t.shape)))
        t = torch.cat([t, pad], axis)
    return t.unflatten(axis, (-1, block)).aminmax(dim=axis + 1)


def _stored(t: torch.Tensor) -> torch.Tensor:
    """``t`` with each broadcast (stride-0) axis narrowed to one entry: its stored elements once."""
    for axis in range(t.dim()):
        if t.stride(axis) == 0 and t.shape[axis] > 1:
            t = t.narrow(axis, 0, 1)
    return t


def largest_magnitude(t: torch.Tensor) -> tuple[torch.Tensor]:
    """``max |t|`` as a scalar tensor of ``t``'s dtype (exact: one of its values)."""
    return (torch.linalg.vector_norm(_stored(t), math.inf),)


def column_sums(t: torch.Tensor) -> tuple[torch.Tensor]:
    """The sums over N of ``t`` (``[*batch, N, Dv]``, V as the kernel receives it: its batch the
    frame's, broadcast axes included) in fp32, as a dense ``[batch, Dv]`` tensor whose rows follow
    the kernel's flat batch index ``lin``. Dense: where the only batch axis of more than one item is
    a broadcast one (one K/V head shared by every query head) the reshape is a view with stride 0,
    and the kernel, reading row ``lin`` at ``lin · Dv``, would read past the one row it holds."""
    return (_stored(t).sum(-2, dtype=torch.float32).expand(*t.shape[:-2], t.shape[-1])
            .reshape(-1, t.shape[-1]).contiguous(),)


# The summaries a launch computes (KernelPlan.summaries' second entries other than an axis).
SUMMARIES = {"absmax": largest_magnitude, "colsum": column_sums}


def tile_summaries(plan: KernelPlan, inputs: list, block_n: int) -> list:
    """Each summary of ``plan.summaries`` for this launch: ``(min, max)`` per key tile along an
    axis for this launch's tiles, or one of SUMMARIES."""
    return [SUMMARIES[kind](inputs[i]) if isinstance(kind, str) else min_max_per_tile(inputs[i], kind, block_n)
            for i, kind in plan.summaries]


# View ops that ``rewrite.with_direct_calls`` folds into a region's call (they keep the storage
# offset, so a view's data pointer is its base's), by the name the call records: the op replays
# itself on the base.
FOLDED_VIEWS = {
    "unsqueeze": torch.ops.aten.unsqueeze.default,
    "expand": torch.ops.aten.expand.default,
    "transpose": torch.ops.aten.transpose.int,
    "permute": torch.ops.aten.permute.default,
}


def replay_views(inputs: list, views) -> list:
    """``inputs`` with each one's folded view chain ``((name, args), …)`` applied (None: none)."""
    if not views:
        return inputs
    out = []
    for t, chain in zip(inputs, views):
        for name, args in chain or ():
            t = FOLDED_VIEWS[name](t, *args)
        out.append(t)
    return out


class LaunchValues:
    """What the run-time parameters of one launch are read from (strides and shapes read once,
    when a parameter first needs them)."""

    def __init__(self, inputs, frame, out, sides, summaries, symints=()):
        self.inputs, self.frame, self.out, self.sides, self.summaries = inputs, frame, out, sides, summaries
        self.symints = symints  # the values of the plan's sym_nodes, this call's

    @functools.cached_property
    def strides(self):
        return [t.stride() for t in self.inputs]

    @functools.cached_property
    def shapes(self):
        return [t.shape for t in self.inputs]

    @functools.cached_property
    def out_strides(self):
        return self.out.stride()


# Where each run-time parameter's value comes from (KernelPlan.args entries, by kind).
ARG_SOURCES = {
    "stride": lambda spec, v: v.strides[spec[1]][spec[2]],
    "ptr": lambda spec, v: v.inputs[spec[1]],
    "size": lambda spec, v: v.shapes[spec[1]][spec[2]],
    "frame": lambda spec, v: v.frame[spec[1]],
    "out_stride": lambda spec, v: v.out_strides[spec[1]],
    "side": lambda spec, v: v.sides[spec[1]],
    "summary": lambda spec, v: v.summaries[spec[1]][spec[2]],
    "summary_stride": lambda spec, v: v.summaries[spec[1]][0].stride(spec[2]),
    "symint": lambda spec, v: v.symints[spec[1]],
    # the stride of a dense tensor of the input's shape (a backward's gradient of it, fp32)
    "dense_stride": lambda spec, v: math.prod(v.shapes[spec[1]][spec[2] + 1:]),
}
TENSOR_KINDS = ("ptr", "side", "summary")  # the parameters a bound launch fills in at each call


def _kernel_args(specs, values: LaunchValues) -> list:
    """The run-time parameters named by ``plan.args`` (see KernelPlan), in order."""
    return [ARG_SOURCES[spec[0]](spec, values) for spec in specs]


def _filled(template: list, slots: list, values: LaunchValues) -> list:
    """``template`` (a bound launch's arguments, tensors left as None) with the tensor of each
    ``(position, spec)`` slot read from ``values``."""
    args = list(template)
    for position, spec in slots:
        args[position] = ARG_SOURCES[spec[0]](spec, values)
    return args


def _gluon_args(gplan, tile, inputs, frame, out, sides, symints) -> list:
    """The values of ``gplan.args`` for a Gluon launch with configuration ``tile`` (tile summaries
    per key tile of that configuration)."""
    summaries = tile_summaries(gplan, inputs, gluon_tile(tile).block_n)
    return _kernel_args(gplan.args, LaunchValues(inputs, frame, out, sides, summaries, symints))


class BoundLaunch:
    """One compiled kernel with its grid and every argument that does not change between calls
    of one layout; ``launch`` computes the tile summaries, fills in the tensors and calls
    Triton's launcher directly."""

    def __init__(self, runner, template: list, slots: list, plan: KernelPlan, block_n: int):
        self.runner = runner        # the compiled kernel indexed by its grid
        self.template = template    # all kernel arguments in order, tensors left as None
        self.slots = slots          # (position, spec) of each tensor argument
        self.plan, self.block_n = plan, block_n
        self.summarizes = any(spec[0] == "summary" for _, spec in slots)

    def launch(self, out, inputs, sides, flags=None) -> None:
        """``flags``: the repair kernel's (repair_flags), its second argument."""
        summaries = tile_summaries(self.plan, inputs, self.block_n) if self.summarizes else ()
        args = _filled(self.template, self.slots, LaunchValues(inputs, None, out, sides, summaries))
        args[0] = out
        if flags is not None:
            args[1] = flags
        self.runner(*args)


# The repair kernel's launch (emit's ``{name}_repair``): its tile, its programs per multiprocessor,
# and the row tiles whose flags one program reads at once (emit._Printer.repair_body).
REPAIR_TILE = (64, 64, 4, 2)
REPAIR_PROGRAMS = 4
REPAIR_SCAN = 16


def _multiprocessors(device: torch.device) -> int:
    return gluon_launch._multiprocessors(device.index) if device.type == "cuda" else 1


def repair_flags(frame, out: torch.Tensor, streams: int = 1) -> torch.Tensor:
    """One int8 per output row (and softmax stream, for a Gluon kernel's), each written by the
    kernel: set where the repair kernel is to compute the row again."""
    return torch.empty(math.prod(frame[:-1]) * streams, dtype=torch.int8, device=out.device)


def _gluon_streams(plan: KernelPlan) -> int:
    return 2 if plan.gluon.streams > 1 else 1


class BoundRepaired:
    """A bound launch of a kernel that flags rows (KernelPlan.flags), then the repair kernel's."""

    def __init__(self, main: BoundLaunch, repair: BoundLaunch, frame):
        self.main, self.repair, self.frame = main, repair, frame

    def launch(self, out, inputs, sides) -> None:
        flags = repair_flags(self.frame, out)
        self.main.launch(out, inputs, sides, flags)
        self.repair.launch(out, inputs, sides, flags)


class BoundGluonLaunch:
    """A Gluon launch remembered for one layout key (``Launcher``): the configuration the tuner
    kept, checked by ``launch_refusal`` at the layout's first launch (everything the checks read
    is in the key), and the compiled kernel Gluon's JIT returned then, called directly with new
    TMA descriptors (Triton's launcher turns them into tensor maps), as ``BoundLaunch`` does:
    the first call's descriptors pointed at each call's inputs (``gluon_launch.rebased``).

    As ``BoundLaunch``, it keeps the arguments that the key fixes (sizes, strides) from its first
    launch and fills in the tensors at each call, the inputs before their folded views (a view
    of FOLDED_VIEWS has its base's data pointer, and the descriptors and strides were taken from
    the views once), and the summaries computed at each call (along the views' axes)."""

    def __init__(self, plan: KernelPlan, tile, frame, views, runner, tail: list, descs: tuple, repair, symints):
        self.plan, self.tile, self.frame, self.views, self.symints = plan, tile, frame, views, symints
        self.repair = repair    # the repair kernel's BoundLaunch
        self.runner = runner    # the compiled kernel indexed by its grid
        self.tail = tail        # the compile-time arguments, in the kernel's order
        self.descs = descs      # the TMA descriptors (gluon_launch.tma_inputs) built for the first call, detached
        self.template = None    # plan.gluon.args with tensors left as None, from the first bound launch
        self.slots = [(j, spec) for j, spec in enumerate(plan.gluon.args) if spec[0] in TENSOR_KINDS]

    @classmethod
    def of(cls, launcher, tile, frame, views, inputs, out, launched, symints) -> BoundGluonLaunch | None:
        """The launch just made (Gluon's compiled kernel, and the repair launch's (compiled, grid,
        args)), or None where Triton's objects do not have the expected form."""
        compiled, repair = launched
        names = getattr(launcher.gluon_kernel, "arg_names", None)
        gplan = launcher.plan.gluon
        consts = gluon_launch.constexprs(tile, gluon_launch.stores_by_tma(gplan, tile, frame))
        runtime = (2 + len(gluon_launch.tma_inputs(gplan)) + (gplan.store is not None)  # the TMA descriptors,
                   + len(gplan.args))                                      # out_ptr, sat_ptr, plan.args
        repair = launcher.bind(*repair, launcher.repair_constexprs(_gluon_streams(launcher.plan)), launcher.repair_kernel,
                               launcher.plan.repair_args)
        if not hasattr(compiled, "__getitem__") or names is None or list(names[runtime:]) != list(consts) or not repair:
            return None
        grid = gluon_launch.grid(tile, frame, inputs[0].device)
        descs = gluon_launch.descriptors(launcher.plan.gluon, tile, inputs, out)
        return cls(launcher.plan, tile, frame, views, compiled[(*grid, 1, 1)[:3]], list(consts.values()),
                   tuple(gluon_launch.rebased(d, None) for d in descs), repair, symints)

    def launch(self, out, inputs, sides) -> None:
        gplan = self.plan.gluon
        if self.template is None:
            args = _gluon_args(gplan, self.tile, replay_views(inputs, self.views), self.frame, out, sides, self.symints)
            self.template = [None if spec[0] in TENSOR_KINDS else a for a, spec in zip(args, gplan.args)]
        else:
            summaries = (tile_summaries(gplan, replay_views(inputs, self.views), gluon_tile(self.tile).block_n)
                         if gplan.summaries else ())
            args = _filled(self.template, self.slots, LaunchValues(inputs, None, out, sides, summaries))
        tensors = [inputs[i] for i in gluon_launch.tma_inputs(gplan)] + [out] * (gplan.store is not None)
        descs = [gluon_launch.rebased(desc, t) for desc, t in zip(self.descs, tensors)]
        flags = repair_flags(self.frame, out, _gluon_streams(self.plan))
        self.runner(*descs, out, flags, *args, *self.tail)
        self.repair.launch(out, inputs, sides, flags)


class PinRefused(ValueError):
    """A tile pinned by the caller (tuning.pinned) that cannot run this launch: the caller's to fix."""


class Launcher:
    """Launches one generated kernel.

    The first launch of a layout goes through Triton's JIT entry point, which specializes the
    arguments (integers equal to 1 or divisible by 16, pointers aligned to 16 bytes), compiles
    if needed, and returns the compiled kernel; the tile comes from ``tile_for``. What those
    steps read is the layout key: the region's sizes, each input's shape, strides, dtype and
    device, every pointer's 16-byte alignment, the current CUDA device and ``tuning.state()``
    (tile summaries, computed at each launch, come from PyTorch's caching allocator: aligned).
    The launch is remembered under it (``BoundLaunch``; ``BoundGluonLaunch`` for the Gluon
    kernel, with ``config.bind_gluon_launches``), and later calls with the same key skip the
    JIT's per-call work. Nothing is bound with ``config.bind_launches`` off, in the
    interpreter, while a tile is pinned, or while a CUDA graph is captured with the tile not
    yet chosen."""

    CAPACITY = 64  # layouts remembered per kernel (dynamic sizes make new ones); then start over

    def __init__(self, plan: KernelPlan, kernel):
        self.plan = plan
        self.kernel = kernel
        self.bound: dict = {}

    @functools.cached_property
    def gluon_kernel(self):
        """The plan's Gluon kernel, loaded at its first launch (Gluon is imported on GPUs only)."""
        return load_kernel(self.plan.gluon.source, self.plan.gluon.name)

    @functools.cached_property
    def repair_kernel(self):
        """The kernel that recomputes the rows a Gluon launch flagged (emit's ``{name}_repair``)."""
        return load_kernel(self.plan.source, f"{self.plan.name}_repair")

    def repair_constexprs(self, streams: int = 1) -> dict:
        return {**block_dims_of(self.plan), "BLOCK_M": REPAIR_TILE[0], "BLOCK_N": REPAIR_TILE[1],
                "SAT_STREAMS": streams, "REPAIR_SCAN": REPAIR_SCAN}

    def run_gluon(self, tile, inputs, frame, out, sides, symints):
        """Launch the Gluon kernel with configuration ``tile`` (one the tuner offered, or pinned),
        then the repair kernel over the rows it flagged; returns (Triton's compiled Gluon kernel,
        the repair launch's (compiled kernel, grid, arguments))."""
        gplan = self.plan.gluon
        why = self.plan.gluon_refusal if gplan is None else gluon_launch.launch_refusal(gplan, inputs, frame, tile)
        if why:
            raise PinRefused(f"fxflash: the Gluon configuration {tile} cannot run this launch: {why}")
        flags = repair_flags(frame, out, _gluon_streams(self.plan))
        with _launching():
            compiled = gluon_launch.launch(gplan, self.gluon_kernel, tile, inputs, frame, out, flags,
                                           _gluon_args(gplan, tile, inputs, frame, out, sides, symints))
            return compiled, self.run_repair(inputs, frame, out, sides, flags, symints, _gluon_streams(self.plan))

    def run_repair(self, inputs, frame, out, sides, flags, symints, streams: int = 1) -> tuple:
        """Launch the repair kernel: programs whose rows are flagged recompute them in eager's own
        form (the others return at once), without fp contraction (a multiply fused into a
        subtraction would round differently from the maximum it is compared with). Returns
        (compiled kernel, grid, arguments)."""
        bm, _, warps, stages = REPAIR_TILE
        tiles = triton.cdiv(frame[-2], bm) * math.prod(frame[:-2]) * self.plan.dv_split
        grid = (max(1, min(triton.cdiv(tiles, REPAIR_SCAN), REPAIR_PROGRAMS * _multiprocessors(out.device))),)
        args = _kernel_args(self.plan.repair_args, LaunchValues(inputs, frame, out, sides, (), symints))
        compiled = self.repair_kernel[grid](out, flags, *args, **self.repair_constexprs(streams), num_warps=warps,
                                            num_stages=stages, enable_fp_fusion=False)
        return compiled, grid, args

    def __call__(self, inputs: list, sizes: list, frame: list, out_shapes: list, views=None,
                 own_ops: tuple | None = None) -> list:
        """Run the kernel; ``sizes`` are the op's integer sizes (frame, result shapes, extras),
        ``frame`` = [*batch, M, N], ``out_shapes`` the shapes of the result and of the row
        values stored beside it; ``views``: for each input, the view chain folded into the call
        (``replay_views``; a bound launch reads the bases, which share the views' pointers).
        ``own_ops``: ``(tuning.EAGER or COMPILED, run)``, ``run()`` the region's own ops on these
        inputs run so, timed beside the kernel's tiles and run instead of it where the tuner found
        them faster. Returns [result, *row values]."""
        out, *sides = empty_results(self.plan, out_shapes, inputs[0])
        # the op's last sizes are the symbolic integers the kernel reads (KernelPlan.sym_nodes)
        symints = self.plan.symints(sizes)
        key = self.layout_key(inputs, sizes, out, sides, views)
        bound = self.bound.get(key) if key is not None else None
        if bound is not None:
            bound.launch(out, inputs, sides)
        elif self.first_launch(key, replay_views(inputs, views), frame, out, sides, views, symints,
                               own_ops) in tuning.OWN_OPS:
            # in the layout the op's fake results promised (a compiler downstream relies on it)
            return [r if r.stride() == a.stride() else a.copy_(r) for r, a in zip(own_ops[1](), [out, *sides])]
        return [out, *sides]

    @staticmethod
    def binds(like: torch.Tensor) -> bool:
        """Are launches on ``like``'s device remembered now?"""
        return (config.bind_launches and tuning.pinned_tile() is None and not interpreting()
                and like.device.type == "cuda")

    def layout_key(self, inputs, sizes, out, sides, views=None):
        if not self.binds(inputs[0]):
            return None
        return (tuning.state(), torch.cuda.current_device(), tuple(sizes), views,
                tuple((t.shape, t.stride(), t.dtype, t.get_device()) for t in inputs),
                tuple(t.data_ptr() % 16 == 0 for t in (out, *inputs, *sides)))

    def launch_tile(self, tile, inputs, frame, out, sides, symints) -> tuple:
        """Launch ``tile`` through the JIT (compiling it where Triton's caches lack it); returns
        what ``bound_for`` binds: the Gluon launch's, or (compiled kernel, grid, arguments, the
        repair launch or None)."""
        if is_gluon_tile(tile):
            return self.run_gluon(tile, inputs, frame, out, sides, symints)
        plan = self.plan
        bm, bn, warps, stages = tile
        grid = (triton.cdiv(frame[-2], bm) * math.prod(frame[:-2]) * plan.dv_split,)
        args = _kernel_args(plan.args, LaunchValues(inputs, frame, out, sides, tile_summaries(plan, inputs, bn), symints))
        flags = [repair_flags(frame, out)] if plan.flags else []
        with _launching():
            # a kernel in eager's own form runs without fp contraction, as the repair kernel
            compiled = self.kernel[grid](out, *flags, *args, **block_dims_of(plan), BLOCK_M=bm, BLOCK_N=bn,
                                         num_warps=warps, num_stages=stages, enable_fp_fusion=plan.fp_fusion)
            repair = self.run_repair(inputs, frame, out, sides, flags[0], symints) if flags else None
        return compiled, grid, args, repair

    def compile_ahead(self, inputs, sizes, frame, out_shapes, views=None, own_ops=None) -> None:
        """Start compiling the candidates the tuner will time for a launch of this layout
        (``inputs``: tensors of the call's layout, their values never read as data), in worker
        processes, and return (``tuning.compile_ahead``); nothing where the choice is known.
        ``own_ops(inputs)``: the compile job of the region's own ops on these inputs (after
        ``views``), where the tuner would time them compiled (``tile_for``'s condition)."""
        if tuning.pinned_tile() is not None or interpreting() or inputs[0].device.type != "cuda":
            return
        out, *sides = empty_results(self.plan, out_shapes, inputs[0])
        symints, inputs = self.plan.symints(sizes), replay_views(inputs, views)
        source, candidates = tile_candidates(self.plan, inputs, frame)
        timed = own_ops is not None and _times_own_ops(frame, inputs[0].device)
        tuning.compile_ahead(source, candidates, [t.dtype for t in inputs], _device_label(inputs[0].device.index),
                             frame, lambda tile: self.launch_tile(tile, inputs, frame, out, sides, symints),
                             functools.partial(own_ops, inputs) if timed else None)

    def first_launch(self, key, inputs, frame, out, sides, views=None, symints=(), own_ops=None):
        """Choose the tile (tuning), launch it and remember the launch for ``key``; returns the
        tile, ``own_ops``' own (tuning.EAGER or COMPILED) without launching anything where the
        region's own ops won."""
        plan = self.plan
        launched = {}
        timed = {}  # tile → its bound launch: the tuner's later launches of a tile (key given)

        def run(tile):
            if tile in tuning.OWN_OPS:
                own_ops[1]()
                return
            if tile in timed:
                timed[tile].launch(out, inputs, sides)
                return
            launched[tile] = self.launch_tile(tile, inputs, frame, out, sides, symints)
            bound = self.bound_for(tile, launched[tile], inputs, out, frame, symints=symints) if key is not None else None
            if bound is not None:
                timed[tile] = bound

        with stage("tuning"):
            tile = tile_for(plan, inputs, frame, run, own=own_ops[0] if own_ops is not None else None)
        if tile in tuning.OWN_OPS:
            return tile
        run(tile)
        if key is None or torch.cuda.is_current_stream_capturing():
            return tile
        bound = self.bound_for(tile, launched[tile], inputs, out, frame, views, symints)
        if bound is not None:
            if len(self.bound) >= self.CAPACITY:
                self.bound.clear()
            self.bound[key] = bound
        return tile

    def bound_for(self, tile, launched, inputs, out, frame, views=None,
                  symints=()) -> BoundLaunch | BoundRepaired | BoundGluonLaunch | None:
        """The launch of ``tile`` just made (``launched``: what the Triton or Gluon JIT launch
        returned) as a bound launch, or None. Bound launches of the tiles the tuner times are
        what it times after each tile's first launch: a layout's later calls run bound, and the
        JIT's host time (~0.3 ms for a Gluon launch) would otherwise outlast a short kernel and
        be timed with it. With ``views``, the bound launch reads the inputs before them."""
        if is_gluon_tile(tile):
            return (BoundGluonLaunch.of(self, tile, frame, views, inputs, out, launched, symints)
                    if config.bind_gluon_launches else None)
        compiled, grid, args, repair = launched
        main = self.bind(compiled, grid, args, {**block_dims_of(self.plan), "BLOCK_M": tile[0], "BLOCK_N": tile[1]})
        if repair is None or main is None:
            return main
        repair = self.bind(*repair, self.repair_constexprs(), self.repair_kernel, self.plan.repair_args)
        return BoundRepaired(main, repair, frame) if repair is not None else None

    def bind(self, compiled, grid, args: list, constexprs: dict, kernel=None, specs=None) -> BoundLaunch | None:
        """The launch just made of ``kernel`` (the plan's by default; the repair kernel, whose
        ``specs`` are plan.repair_args and whose ``sat_ptr`` follows ``out_ptr``), as a
        BoundLaunch; None where Triton's objects do not have the expected form (then every launch
        goes through the JIT)."""
        kernel, specs = kernel or self.kernel, self.plan.args if specs is None else specs
        lead = 2 if kernel is not self.kernel or self.plan.flags else 1  # out_ptr (sat_ptr), the specs' arguments
        names = getattr(kernel, "arg_names", None)
        runtime = lead + len(args)
        if (not hasattr(compiled, "__getitem__") or names is None
                or sorted(names[runtime:]) != sorted(constexprs)):
            return None
        slots = [(lead + j, spec) for j, spec in enumerate(specs) if spec[0] in TENSOR_KINDS]
        template = [None] * lead + [*args, *(constexprs[name] for name in names[runtime:])]
        for position, _ in slots:
            template[position] = None  # hold no tensor of this call
        # Triton's launcher reads three grid axes
        return BoundLaunch(compiled[(*grid, 1, 1)[:3]], template, slots, self.plan, constexprs["BLOCK_N"])
