"""Launching a region's fused backward (codegen/backward.py): Δ, dK and dV, dQ, and the row
statistics where the forward did not store them (``row_statistics``).

``run_backward`` takes the forward op's inputs, its result O and the incoming gradient dO, and
returns the gradients of the tensors the kernel reads as Q, K and V, shaped as those inputs.
The kernels read Q, K, V and the score chain's inputs at their strides, as the forward does;
O and dO are read as contiguous ``[B·H, M, Dv]`` tensors, and dQ, dK, dV are written in the
inputs' dtypes (accumulated in fp32), one per query head, then laid out as the inputs are shaped;
where the op is given K and V before a broadcast over the query heads (RegisteredRegion.views),
dK and dV one per K/V head, summed over its query heads by the grouped key kernels.

``fused_backward_applies`` says whether a call can take this path: the region has a printed
backward and only Q, K, V and the tensors the score chain reads as they are (a bias) ask for
gradients; otherwise the region's own ops are recomputed with eager autograd (runtime/op.py), as
they are for sizes the kernels cannot index.
"""
from __future__ import annotations

import functools
import math

import torch
import triton

from ..codegen.backward_plan import backward_tiles
from ..codegen.plan import INT32_LIMIT, INTERPRETER_TILE, pow2
from ..config import config, interpreting
from ..internal import InternalError, stage, warn
from .cache import load_kernel
from . import tuning
from .launch import (TENSOR_KINDS, Launcher, LaunchValues, _device_label, _filled, _kernel_args, _launching,
                     min_max_per_tile, replay_views)



def fused_backward_applies(entry, tensors, needs) -> bool:
    """Can this call's backward run the fused kernels (decided when autograd records the call,
    also while a compiler traces it: from the tensors' devices and which need gradients only)?
    A region with ops after P·V needs their graph (``RegisteredRegion.epilogue``) and a training forward."""
    plan = entry.plan.backward
    if plan is None or entry.failed is not None or not config.fused_backward:
        return False
    if plan.ops_after_pv and (entry.epilogue is None or entry.plan.training is None):
        return False
    given = set(given_inputs(entry, True))
    if any(need and i not in given for i, need in enumerate(needs)):
        return False
    return interpreting() or tensors[0].device.type == "cuda"


def score_inputs(entry) -> tuple:
    """The inputs the score chain reads whose gradients come from the stored gradient tiles: those
    it reads as they are (``plan.input_grads``), then those a value the kernels compute is computed
    from (``RegisteredRegion.computed``, by tile)."""
    return (*entry.plan.backward.input_grads, *(i for j in sorted(entry.computed) for i in entry.computed[j].inputs))


def given_inputs(entry, input_grads: bool) -> tuple:
    """The inputs whose gradients ``fxflash::region_backward`` returns, in order: Q, K and V
    (``plan.inputs``), with ``input_grads`` the score chain's (``score_inputs``), then those the
    ops after P·V read."""
    return (*entry.plan.backward.inputs, *(score_inputs(entry) if input_grads else ()),
            *(entry.epilogue.inputs if entry.epilogue is not None else ()))


def _kernels_fit(plan, frame) -> bool:
    """Non-empty sizes whose every index fits the kernels' int32 arithmetic."""
    if 0 in frame:
        return False
    a, b = plan.index_bound
    batch = math.prod(frame[:-2])
    largest = batch * max(frame[-2:]) * max(plan.d, plan.dv)
    return a * max(frame) + b < INT32_LIMIT and largest < INT32_LIMIT


def _rows_major(t: torch.Tensor, batch: int, rows: int, cols: int) -> torch.Tensor:
    return t.reshape(batch, rows, cols).contiguous()


def _as_input(grad: torch.Tensor, like: torch.Tensor, where: tuple) -> torch.Tensor:
    """The gradient computed as ``[B·H, rows, cols]``, in the shape of the input ``like`` the
    kernel reads as ``[*batch, rows, cols]`` (or its transpose)."""
    _, transposed, rank = where
    batch = like.shape[:rank]
    grad = grad.reshape(*batch, *grad.shape[-2:])
    if transposed:
        grad = grad.transpose(-1, -2)
    # contiguous, as the op's fake implementation promises: one copy that casts and lays out
    if grad.dtype != like.dtype or not grad.is_contiguous():
        grad = torch.empty(grad.shape, dtype=like.dtype, device=grad.device).copy_(grad)
    return grad.reshape(like.shape)


def run_backward(entry, inputs: list, out: torch.Tensor, grad: torch.Tensor, frame: list, extras: list,
                 symints=(), input_grads: bool = False, statistics=()) -> list:
    """The gradients of the op's ``inputs`` (``given_inputs``), from those of the tensors the kernel
    reads (``_gradients``): where the op is given K and V before their broadcast
    (RegisteredRegion.views), the grouped key programs give their K/V heads' gradients directly;
    otherwise a gradient per query head is summed back through the views."""
    if not entry.views:
        return _gradients(entry, inputs, inputs, out, grad, frame, extras, symints, input_grads, statistics)[0]
    grads, at_base = _gradients(entry, replay_views(inputs, entry.views), inputs, out, grad, frame, extras, symints,
                                input_grads, statistics)
    return [g if i in at_base or not entry.views[i] else _to_base(g, inputs[i], entry.views[i])
            for i, g in zip(given_inputs(entry, input_grads), grads)]


def _to_base(grad: torch.Tensor, base: torch.Tensor, chain: tuple) -> torch.Tensor:
    """The gradient of ``base`` from ``grad``, that of its view chain's result (a broadcast: summed)."""
    _, vjp = torch.func.vjp(lambda b: replay_views([b], (chain,))[0], base)
    return vjp(grad)[0]


def _group(entry, inputs: list) -> tuple | None:
    """(GROUP, G_INNER): the query heads per K/V head and the batch items between them, where the
    grouped key programs apply (BackwardPlan.grouped: K and V given before their broadcast, read
    with stride 0 along ``group_axis``), else None."""
    plan = entry.plan.backward
    if not plan.grouped or not entry.views or not all(entry.views[where[0]] for where in (plan.k, plan.v)):
        return None
    axis, k, v = plan.group_axis, inputs[plan.k[0]], inputs[plan.v[0]]
    rank = plan.k[2]
    if k.stride(axis) != 0 or v.stride(axis) != 0 or k.shape[:rank] != v.shape[:rank] or k.shape[axis] < 2:
        return None
    return int(k.shape[axis]), math.prod(int(s) for s in k.shape[axis + 1:rank])


def _gradients(entry, inputs: list, bases: list, out: torch.Tensor, grad: torch.Tensor, frame: list, extras: list,
               symints=(), input_grads: bool = False, statistics=()) -> tuple[list, set]:
    """The gradients of the inputs the kernel reads as Q, K and V (``plan.inputs``, in order;
    an input read as two of them gets the sum), then, with ``input_grads``, those of
    ``plan.input_grads`` (each summed from its [B·H, M, N] tiles over the axes it broadcasts
    along), then those of the inputs the ops after P·V read (``RegisteredRegion.epilogue``'s inputs). ``statistics``:
    the training forward's ``training_outputs`` (with ``m`` and ``1/l`` the statistics kernel does
    not run; with ``o``, the output before the ops after P·V, their backward is autograd's at it,
    and the kernels read O and dO there), or empty. Sizes the kernels cannot index, and a region
    whose kernel failed in the forward, recompute the region's own ops with eager autograd.
    ``inputs``: the tensors the kernel reads; ``bases``: the op's (RegisteredRegion.views). Returned
    with the inputs whose gradients are their bases' already (the grouped key programs' K and V).
    An exception in the fused backward is a bug in fxflash: warned once, and the region's backward
    recomputes eagerly from then on."""
    frame = [int(s) for s in frame]
    # O as the forward's kernel stored it (``o``: Δ and the ops after P·V read it) is unset where
    # that kernel did not launch
    stored_o = bool(statistics) and "o" in entry.plan.training.training_outputs
    if (_kernels_fit(entry.plan.backward, frame) and entry.failed is None and entry.backward_failed is None
            and (entry.plan.int32_index_ok(frame) or not stored_o)):
        try:
            with stage("backward"):
                return _fused_gradients(entry, inputs, bases, out, grad, frame, extras, symints, input_grads,
                                        statistics)
        except InternalError as exc:
            entry.backward_failed = exc
            warn(exc, "this region's backward recomputes its own ops with eager autograd from now on")
    return _eager_gradients(entry, inputs, grad, extras, input_grads), set()


def _fused_gradients(entry, inputs: list, bases: list, out: torch.Tensor, grad: torch.Tensor, frame: list,
                     extras: list, symints, input_grads: bool, statistics) -> tuple[list, set]:
    """``_gradients`` from the generated kernels."""
    plan = entry.plan.backward
    named = dict(zip(entry.plan.training.training_outputs, statistics)) if statistics else {}
    # O as the forward's kernel stored it (in fp32 where O is 16-bit: Δ = rowsum(dO ⊙ O) from it
    # leaves each dS row summing to 0 within fp32's rounding), else the region's output
    o = named.get("o", out)
    after_pv = []
    if plan.ops_after_pv:   # dO and the epilogue inputs' gradients at O, from the ops' own backward
        given = {t.untyped_storage().data_ptr() for t in (*inputs, grad, *statistics)}
        grad, *after_pv = _epilogue_gradients(entry, inputs, o.to(plan.o_dtype), grad, extras)
        # an op's result must not alias its arguments (an added tensor's gradient is dO itself)
        after_pv = [g.clone() if g.untyped_storage().data_ptr() in given else g for g in after_pv]
    *batch_sizes, m, n = frame
    batch = math.prod(batch_sizes)
    device = out.device
    f32 = dict(device=device, dtype=torch.float32)
    # dQ, dK and dV accumulate in fp32 and are stored once, in their input's dtype: each program
    # owns its tiles whole, so no pass casts them afterwards
    like = {name: dict(device=device, dtype=inputs[where[0]].dtype)
            for name, where in (("dq", plan.q), ("dk", plan.k), ("dv", plan.v))}
    group = _group(entry, inputs)
    heads = batch // group[0] if group else batch   # the programs' K/V heads
    own = {"delta": torch.empty(batch, m, **f32),
           "o": _rows_major(o, batch, m, plan.dv), "do": _rows_major(grad.to(plan.o_dtype), batch, m, plan.dv),
           "dq": torch.empty(batch, m, plan.d, **like["dq"]), "dk": torch.empty(heads, n, plan.d, **like["dk"]),
           "dv": torch.empty(heads, n, plan.dv, **like["dv"])}
    kernels, atomics = plan.kernels, plan.atomics
    if plan.exact_delta is not None and (input_grads or (o.dtype in (torch.float16, torch.bfloat16)
                                                         and config.exact_delta)):
        # Δ as Σ P·dP over the keys (config.exact_delta) where there is no fp32 O (a training
        # forward that ran the region's own ops, or none), and for a score input's gradient.
        # rowsum(dO ⊙ O) leaves each dS row's sum off by O's rounding (16-bit O), or by the fp32
        # rounding of the two sums, weighted into dQ by the row's mean key and into a score
        # input's gradient by its mean score: a temperature's 4× eager's error in fp32 where a
        # distance bias makes the scores large
        kernels = (*kernels[:-3], plan.exact_delta, *kernels[-2:])
    if group:   # dK·dV's kernel and the atomic one per key tile of a K/V head
        kernels, atomics = (*kernels[:-2], plan.grouped[0], kernels[-1]), plan.grouped[1]
    repaired = False
    if "m" in named:   # the first kernel prints lower_statistics' program
        own["m"], own["inv_l"] = named["m"], named["inv_l"]
        # rows a repair kernel (after the Triton or the Gluon kernel) may have marked
        kernels, repaired = kernels[1:], entry.plan.training.repair_args is not None
    else:
        own["m"], own["inv_l"] = torch.empty(batch, m, **f32), torch.empty(batch, m, **f32)
    if plan.held:
        # the marked rows (the forward's repair kernel's, or the statistics kernel's here) are found
        # and computed in eager's rounding by the REPAIRED_ONLY launch, after every forward; it
        # overwrites their marks, so a second backward of the same forward reads copies
        own.update(held=torch.empty(batch, m, device=device, dtype=torch.int8),
                   held_heads=torch.zeros(batch, device=device, dtype=torch.int32))
        if "m" in named:
            own["m"], own["inv_l"] = own["m"].clone(), own["inv_l"].clone()
        repaired = True
    # every tile the loops skip holds a zero gradient; a 1-element stand-in where none is asked for.
    # A loaded input's gradient is added into a zeroed fp32 tensor of its own shape where atomics are
    # allowed (``dga<j>``, _added_gradients), instead of a [B·H, M, N] tile per batch item summed after
    slots = [i for kernel in plan.kernels for i in kernel.input_grads]
    adding = _add_slots(plan)
    added = _added_gradients(plan, device) if input_grads else set()
    for j, i in enumerate(slots):
        own[f"dg{j}"] = torch.zeros(batch, m, n, **f32) if input_grads and j not in added else torch.zeros(1, **f32)
        if j in adding:
            own[f"dga{j}"] = torch.zeros(inputs[i].shape, **f32) if j in added else torch.zeros(1, **f32)
    key = _layout_key(inputs, own, frame, symints, input_grads, (repaired, *(k.name for k in kernels)), group)
    steps = entry.bound_backward.get(key) if key is not None else None
    with _on(device):
        if steps is not None:   # this layout's launches, remembered (_Bound)
            for step in steps:
                step(own, inputs, frame, symints)
        else:
            steps = []
            *first, dkdv, dq = kernels
            if first and first[0].statistics:   # every row's statistics, before the marked rows' again
                _launch(plan, first.pop(0), own, inputs, frame, symints, input_grads, record=steps)
            if repaired:
                _launch(plan, plan.kernels[0], own, inputs, frame, symints, repaired_only=True, record=steps)
            for kernel in first:
                _launch(plan, kernel, own, inputs, frame, symints, input_grads, record=steps)
            _launch_key_kernels(plan, dkdv, dq, atomics, own, inputs, frame, symints, input_grads, record=steps,
                                group=group)
            if key is not None and None not in steps and not torch.cuda.is_current_stream_capturing():
                if len(entry.bound_backward) >= BOUND_CAPACITY:
                    entry.bound_backward.clear()
                entry.bound_backward[key] = steps
    if "dq_sum" in own:   # dQ added by atomics, in fp32
        own["dq"] = own["dq_sum"]
    grads: dict = {}
    for name, where in (("dq", plan.q), ("dk", plan.k), ("dv", plan.v)):
        # a K/V head's gradient is laid out as its base's axes (rewrite.GROUP_VIEWS keep their order)
        g = (own[name].reshape(bases[where[0]].shape) if group and name != "dq"
             else _as_input(own[name], inputs[where[0]], where))
        grads[where[0]] = g if where[0] not in grads else grads[where[0]] + g
    result = [grads[i] for i in plan.inputs]
    if input_grads:
        def tile(j):
            return own[f"dg{j}"].view(*batch_sizes, m, n)

        result += [(own[f"dga{j}"] if j in added else tile(j).sum_to_size(inputs[i].shape)).to(inputs[i].dtype)
                   for j, i in enumerate(slots) if i is not None]
        for j in sorted(entry.computed):   # a computed value's tile, through the ops computing it
            result += _subgraph_gradients(entry.computed[j], [], inputs, extras, tile(j))
    return result + after_pv, {plan.k[0], plan.v[0]} if group else set()


def _add_slots(plan) -> set:
    """The gradient slots whose kernels can add each tile into the input's own gradient
    (``dga<j>``: those of inputs the kernels load)."""
    return {int(name[3:]) for kernel in plan.kernels for name in kernel.own if name.startswith("dga")}


def _added_gradients(plan, device) -> set:
    """The slots of ``_add_slots`` whose tiles are added (ADD_DG) rather than stored: all of them
    where atomics are allowed (``_atomics_allowed``: on a GPU, not under deterministic algorithms
    nor ``FXFLASH_DQ_ATOMICS=0``; the summation order varies from run to run), else none."""
    return _add_slots(plan) if _atomics_allowed(plan, device) is not None else set()


def _epilogue_gradients(entry, inputs: list, o: torch.Tensor, grad: torch.Tensor, extras: list) -> list:
    """``[dO, *gradients of the epilogue's inputs]``: the backward of the region's ops after P·V (a
    gate, a transpose; elementwise, cheap beside the kernels) at the output ``o`` before them."""
    return _subgraph_gradients(entry.epilogue, [o], inputs, extras, grad, lead_grads=True)


def _subgraph_gradients(sub, lead: list, inputs: list, extras: list, grad: torch.Tensor, lead_grads=False) -> list:
    """The gradients of ``sub.inputs`` (after those of ``lead`` with ``lead_grads``) from the vjp of
    the Subgraph at ``lead`` and the op's ``inputs``, ``grad`` summed to its result's shape (a
    gradient tile of a value broadcast over the score frame); ``torch.func.vjp``, since autograd's
    dispatch is off inside the op."""
    own_extras = [extras[j] for j in sub.extras]

    def result(*xs):
        given = dict(zip(sub.inputs, xs[len(lead):]))
        return sub.module(*xs[:len(lead)], *(given.get(i, t) for i, t in enumerate(inputs)), *own_extras)[0]

    value, vjp = torch.func.vjp(result, *lead, *(inputs[i] for i in sub.inputs))
    grads = vjp(grad.sum_to_size(value.shape).to(value.dtype))
    return list(grads if lead_grads else grads[len(lead):])


def row_statistics(entry, inputs: list, frame: list, extras: list, symints=()) -> list:
    """``[m, 1/l]`` (``[*batch, M]``, fp32) from the statistics kernel: the results of a training
    forward that ran the region's own ops (a kernel that failed, sizes it cannot index), for the
    fused backward that reads them. Left unset where the backward's kernels cannot index the sizes
    either: its eager gradients do not read them."""
    plan = entry.plan.backward
    frame = [int(s) for s in frame]
    f32 = dict(device=inputs[0].device, dtype=torch.float32)
    own = {"m": torch.empty(frame[:-1], **f32), "inv_l": torch.empty(frame[:-1], **f32)}
    if plan.held:   # written only by the REPAIRED_ONLY launch, which the backward makes
        own.update(held=torch.empty(1, device=inputs[0].device, dtype=torch.int8),
                   held_heads=torch.empty(1, device=inputs[0].device, dtype=torch.int32))
    if _kernels_fit(plan, frame):
        with _on(inputs[0].device):
            _launch(plan, plan.kernels[0], own, inputs, frame, symints)
    return [own["m"], own["inv_l"]]


def _on(device):
    return torch.cuda.device(device) if device.type == "cuda" else _launching()


def _atomics_allowed(plan, device) -> str | None:
    """Whether dQ may be added by atomics (config.dq_atomics): "always", "tuned" (the tuner
    chooses) or None."""
    if plan.atomics is None or config.dq_atomics == "0" or torch.are_deterministic_algorithms_enabled():
        return None
    if config.dq_atomics == "1":
        return "always"
    return None if interpreting() or device.type != "cuda" else "tuned"


def _zero_dq_sum(own: dict, inputs, frame, symints) -> None:
    """The fp32 dQ that the atomic kernel adds to (a step of a remembered launch)."""
    own["dq_sum"] = torch.zeros(own["dq"].shape, device=own["dq"].device, dtype=torch.float32)


def _launch_key_kernels(plan, dkdv, dq, atomics, own: dict, inputs: list, frame: list, symints, input_grads: bool,
                        record: list, group=None) -> None:
    """dK and dV, then dQ: by their own kernels, or by ``atomics`` alone (dK·dV's kernel adding
    each key tile's share of dQ to the zeroed fp32 ``dq_sum``), as ``_atomics_allowed`` says.
    Tuned, the choice is a candidate tile of the pair: ("kernels", tile) launches dK·dV at the
    tile and dQ at its own tuned tile, ("atomics", tile) the atomic kernel. The launches made are
    appended to ``record`` (``_launch``). ``group``: the grouped key kernels' (GROUP, G_INNER)."""
    allowed = _atomics_allowed(plan, inputs[0].device)
    if allowed is None:
        _launch(plan, dkdv, own, inputs, frame, symints, input_grads, record=record, group=group)
        _launch(plan, dq, own, inputs, frame, symints, input_grads, record=record)
        return
    atomic = _runner(plan, atomics, own, inputs, frame, symints, input_grads, group=group)

    def run_atomics(tile):
        _zero_dq_sum(own, inputs, frame, symints)
        return atomic(tile)

    if allowed == "always":
        record += [_zero_dq_sum, _bound(atomics, run_atomics(_tile(plan, atomics, run_atomics, inputs, frame)))]
        return
    pair = _runner(plan, dkdv, own, inputs, frame, symints, input_grads, group=group)
    dq_run = _runner(plan, dq, own, inputs, frame, symints, input_grads)
    dq_tile = _tile(plan, dq, dq_run, inputs, frame)

    def run(choice):   # the kernels launched and what each launch returned
        if choice[0] == "atomics":
            return [(atomics, run_atomics(choice[1:]))]
        return [(dkdv, pair(choice[1:])), (dq, dq_run(dq_tile))]

    tiles = backward_tiles(plan.d, plan.dv, "key")
    choice = tuning.choose(f"{dkdv.name}+dq", _tuning_source(plan.source, f"{dkdv.name}, dQ by atomics or not"),
                           [(way, *t) for way in ("kernels", "atomics") for t in tiles],
                           tuple(str(t.dtype) for t in inputs), _device_label(inputs[0].device.index), frame,
                           run, capturing=torch.cuda.is_current_stream_capturing(),
                           device_index=inputs[0].device.index)
    own.pop("dq_sum", None)   # the tuner's atomic runs made one
    record += [_zero_dq_sum] if choice[0] == "atomics" else []
    record += [_bound(kernel, launched) for kernel, launched in run(choice)]


def _launch(plan, kernel, own: dict, inputs: list, frame: list, symints, input_grads: bool = False,
            repaired_only: bool = False, record: list | None = None, group=None) -> None:
    """Launch one backward kernel on the tensors ``own`` (by the names the programs give them) and
    the forward's ``inputs``, at the tile the tuner chose for it; the statistics kernel with
    ``repaired_only`` (the row tiles the forward's repair kernel marked) at its first tile, untimed:
    most of its programs return at once. The launch, bound (``_Bound``; None where it cannot be),
    is appended to ``record``."""
    run = _runner(plan, kernel, own, inputs, frame, symints, input_grads, repaired_only, group)
    if repaired_only:
        launched = run(INTERPRETER_TILE if interpreting() or inputs[0].device.type != "cuda"
                       else backward_tiles(plan.d, plan.dv, kernel.per)[0])
    else:
        launched = run(_tile(plan, kernel, run, inputs, frame))
    if record is not None:
        record.append(_bound(kernel, launched))


# The layouts whose backward launches a region remembers (RegisteredRegion.bound_backward), at most.
BOUND_CAPACITY = 64


def _layout_key(inputs, own: dict, frame, symints, input_grads: bool, launches: tuple, group=None):
    """What fixes every argument of the backward's launches but the tensors (Triton specializes
    each pointer on its 16-byte alignment), and the kernels and tiles chosen: None where launches
    are not remembered (``Launcher.binds``). ``launches``: whether the repaired rows' statistics
    are computed, and the kernels to launch."""
    if not Launcher.binds(inputs[0]):
        return None
    return (tuning.state(), torch.cuda.current_device(), tuple(frame), tuple(symints), input_grads, launches, group,
            config.dq_atomics, torch.are_deterministic_algorithms_enabled(),
            tuple((t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() % 16 == 0) for t in inputs),
            tuple((name, t.data_ptr() % 16 == 0) for name, t in own.items()))


class _Bound:
    """One backward kernel's launches remembered for a layout (two for a ``held`` kernel): Triton's
    compiled kernels indexed by their grid, called directly (no JIT entry: its binding of about
    forty arguments costs more host time than a short kernel runs) with the arguments of the
    first launch, the tensors filled in."""

    def __init__(self, runners: list, slots: list, kernel, block: int, zeroed: list):
        self.runners, self.slots, self.kernel, self.block = runners, slots, kernel, block
        self.zeroed = zeroed   # the gradients it adds into (ADD_DG), zeroed before it runs

    def __call__(self, own: dict, inputs, frame, symints) -> None:
        summaries = [min_max_per_tile(inputs[i], axis, self.block) for i, axis in self.kernel.summaries]
        values = LaunchValues(inputs, frame, None, [], summaries, tuple(symints))
        for name in self.zeroed:
            own[name].zero_()
        for runner, template in self.runners:
            args = _filled(template, self.slots, values)
            args[:len(self.kernel.own)] = [own[name] for name in self.kernel.own]
            runner(*args)


def _bound(kernel, launched) -> _Bound | None:
    """``launched`` (``_runner``'s launches, each (function, compiled kernel, grid, arguments,
    compile-time arguments, block)) as a _Bound, or None where Triton's objects do not have the
    form it needs."""
    if launched is None:
        return None
    lead = len(kernel.own)
    slots = [(lead + j, spec) for j, spec in enumerate(kernel.args) if spec[0] in TENSOR_KINDS]
    runners = []
    for fn, compiled, grid, args, constexprs, block in launched:
        names = getattr(fn, "arg_names", None)
        runtime = len(args)
        if not hasattr(compiled, "__getitem__") or names is None or sorted(names[runtime:]) != sorted(constexprs):
            return None
        template = [*args, *(constexprs[name] for name in names[runtime:])]
        for position, _ in slots:
            template[position] = None   # hold no tensor of this call
        for position in range(lead):
            template[position] = None
        runners.append((compiled[(*grid, 1, 1)[:3]], template))
    adds = launched[0][4].get("ADD_DG")   # the same in every launch of the kernel
    zeroed = [name for name in kernel.own if name.startswith("dga")] if adds else []
    return _Bound(runners, slots, kernel, block, zeroed)


def _runner(plan, kernel, own: dict, inputs: list, frame: list, symints, input_grads: bool = False,
            repaired_only: bool = False, group=None):
    """``run(tile)``: the launches of ``kernel`` at ``tile`` (``_launch``; one, or one per value of
    HELD for a ``held`` kernel, then each again with REDO for a ``redo`` kernel), returning what
    ``_bound`` reads; a grouped kernel's programs per K/V head (``group``: its GROUP, G_INNER)."""
    *batch_sizes, m, n = frame
    batch = math.prod(batch_sizes)
    if kernel.group:
        batch //= group[0]
    dims = {"D": plan.d, "DP": pow2(plan.d), "DV": plan.dv, "DVP": pow2(plan.dv)}
    fn = load_kernel(plan.source, kernel.name)
    summaries = {}  # the per-tile summaries of ids its loop's range reads, along the axis it loops over

    def run(tile):
        bm, bn, warps, stages = tile
        block = bn if kernel.per == "row" else bm
        if block not in summaries:
            summaries[block] = [min_max_per_tile(inputs[i], axis, block) for i, axis in kernel.summaries]
        values = LaunchValues(inputs, frame, None, [], summaries[block], tuple(symints))
        grid = (triton.cdiv(m, bm) * batch if kernel.per == "row" else triton.cdiv(n, bn) * batch,)
        flags = {"STORE_DG": input_grads} if kernel.input_grads else {}
        adds = [name for name in kernel.own if name.startswith("dga")]
        if adds:   # every launch (the tuner's too) adds into zeroed gradients: the last one's stay
            flags["ADD_DG"] = bool(input_grads) and _atomics_allowed(plan, inputs[0].device) is not None
            for name in adds if flags["ADD_DG"] else ():
                own[name].zero_()
        if kernel.statistics:
            flags["REPAIRED_ONLY"] = repaired_only
        if kernel.group:
            flags["GROUP"], flags["G_INNER"] = group
        args = [*(own[name] for name in kernel.own), *_kernel_args(kernel.args, values)]
        launches = []
        for redo in (False, True) if kernel.redo else (None,):   # REDO reads what the first launches stored
            for held in (False, True) if kernel.held else (None,):
                constexprs = {**dims, "BLOCK_M": bm, "BLOCK_N": bn, **flags, **({} if held is None else {"HELD": held}),
                              **({} if redo is None else {"REDO": redo})}
                compiled = fn[grid](*args, **constexprs, num_warps=warps, num_stages=stages)
                launches.append((fn, compiled, grid, args, constexprs, block))
        return launches

    return run


def _tile(plan, kernel, run, inputs, frame) -> tuple:
    """The kernel's tile: the interpreter's, or the tuner's choice among its candidates (each kernel
    tuned on its own: Δ, dK and dV, dQ read what the kernels before them wrote)."""
    device = inputs[0].device
    if interpreting() or device.type != "cuda":
        return INTERPRETER_TILE
    return tuning.choose(kernel.name, _tuning_source(plan.source, kernel.name), backward_tiles(plan.d, plan.dv, kernel.per),
                         tuple(str(t.dtype) for t in inputs), _device_label(device.index), frame, run,
                         capturing=torch.cuda.is_current_stream_capturing(), device_index=device.index)


@functools.lru_cache(maxsize=128)
def _tuning_source(source: str, kernel: str) -> str:
    """What the tuner keys one kernel of the module by: its source and the kernel's name (one
    string per kernel, made once: its hash is computed on every call otherwise)."""
    return f"{source}\n# {kernel}"


def _eager_gradients(entry, inputs, grad, extras, input_grads: bool) -> list:
    """The gradients from the region's own ops: ``torch.func.vjp``, which differentiates inside a
    custom op's implementation, where autograd's dispatch is turned off."""
    wanted = list(given_inputs(entry, input_grads))

    def result(*xs):
        given = dict(zip(wanted, xs))
        return entry.reference(*(given.get(i, t) for i, t in enumerate(inputs)), *extras)[0]

    _, vjp = torch.func.vjp(result, *(inputs[i] for i in wanted))
    return list(vjp(grad))


__all__ = ["fused_backward_applies", "given_inputs", "row_statistics", "run_backward", "score_inputs"]
