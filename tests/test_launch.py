"""Bound launches (launch.Launcher): the second launch of a layout calls the compiled kernel
directly with exactly the arguments Triton's JIT entry point got, and anything the JIT
specializes on sends the launch back through it.

Triton's interpreter returns no compiled kernel, so these tests stand a recording stub in for
the JIT function and its compiled kernel, and treat the CPU as a device whose launches are
bound; tests/test_gpu.py checks bound launches on real kernels.
"""
import itertools
import math
import types

import pytest
import torch

import fxflash
from fxflash.runtime import launch, op, tuning
from fxflash.variants import VARIANTS, Shape
from helpers import assert_accurate


class RecordingKernel:
    """Stands in for a ``@triton.jit`` function: ``kernel[grid](*args, **kw)`` records a JIT
    launch and returns a compiled kernel whose ``[grid](*args)`` records a bound launch."""

    def __init__(self, arg_names):
        self.arg_names = arg_names
        self.calls = []

    def __getitem__(self, grid):
        def jit_launch(*args, **kwargs):
            self.calls.append(("jit", grid, args, kwargs))
            return self.Compiled(self.calls)
        return jit_launch

    class Compiled:
        def __init__(self, calls):
            self.calls = calls

        def __getitem__(self, grid):
            x, y, z = grid  # Triton's launcher reads three grid axes
            return lambda *args: self.calls.append(("bound", grid[:1], args, {}))


def record_launches() -> RecordingKernel:
    """Stand a recording kernel in for the newest fused region's kernel (and another for its
    repair kernel, where it has one: its launches are not the ones recorded)."""
    entry = list(op._REGISTRY.values())[-1]
    kernel = RecordingKernel(entry.kernel.arg_names)
    entry.launcher = launch.Launcher(entry.plan, kernel)
    if entry.plan.flags:
        real = launch.Launcher(entry.plan, entry.kernel).repair_kernel
        entry.launcher.repair_kernel = RecordingKernel(real.arg_names)
    return kernel


@pytest.fixture
def binding_on_cpu(monkeypatch):
    """Launches on the CPU are bound as on a GPU (device 0, no graph capture)."""
    monkeypatch.setattr(launch.Launcher, "binds", staticmethod(lambda like: tuning.pinned_tile() is None))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


@pytest.fixture
def recorded(binding_on_cpu):
    """(optimized vanilla, its inputs, the recording kernel) with launches bound on the CPU."""
    variant = VARIANTS["vanilla"]
    args = variant.inputs(Shape(B=1, H=2, Hkv=2, M=20, N=24, D=16, Dv=16), torch.float32, "cpu")
    fast = fxflash.optimize(variant.fn)
    fast(*args)  # capture, compile and run it once for real
    return fast, args, record_launches()


def kinds(kernel):
    return [call[0] for call in kernel.calls]


def test_second_launch_of_a_layout_is_bound_with_the_jits_arguments(recorded):
    fast, args, kernel = recorded
    out1, out2 = fast(*args), fast(*args)
    assert kinds(kernel) == ["jit", "bound"]
    (_, grid1, jit_args, jit_kwargs), (_, grid2, bound_args, _) = kernel.calls
    assert grid1 == grid2
    constexprs = {k: v for k, v in jit_kwargs.items() if k not in ("num_warps", "num_stages", "enable_fp_fusion")}
    names = kernel.arg_names
    assert len(bound_args) == len(names) == len(jit_args) + len(constexprs)
    assert bound_args[0] is out2 and jit_args[0] is out1
    for name, jit_value, bound_value in zip(names[1:], jit_args[1:], bound_args[1:]):
        if name == "sat_ptr":  # the row flags: a buffer of each call's own
            assert isinstance(bound_value, torch.Tensor) and bound_value.shape == jit_value.shape
        elif isinstance(jit_value, torch.Tensor):
            # the bound launch reads this call's tensor, the one at the same place in the call
            assert isinstance(bound_value, torch.Tensor) and bound_value.shape == jit_value.shape, name
            assert any(bound_value is a for a in args), name
        else:
            assert bound_value == jit_value, name
    assert [bound_args[names.index(k)] for k in constexprs] == list(constexprs.values())


def test_what_the_jit_specializes_on_is_launched_through_it(recorded):
    fast, (q, k, v), kernel = recorded
    fast(q, k, v)
    # a pointer not aligned to 16 bytes: one float past an aligned start
    shifted = torch.empty(q.numel() + 1).as_strided(q.shape, q.stride(), 1).copy_(q)
    assert shifted.data_ptr() % 16 != 0
    fast(shifted, k, v)
    fast(shifted, k, v)
    assert kinds(kernel) == ["jit", "jit", "bound"]


def test_bound_launches_summarize_the_document_ids_of_each_call(binding_on_cpu):
    """Per-key-tile id summaries are computed at every launch, bound ones included, from that
    call's ids."""
    variant = VARIANTS["document_mask"]
    q, k, v, ids = variant.inputs(Shape(B=1, H=2, Hkv=2, M=40, N=40, D=16, Dv=16), torch.float32, "cpu")
    fast = fxflash.optimize(variant.fn)
    fast(q, k, v, ids)
    kernel = record_launches()
    other = ids.flip(0)
    fast(q, k, v, ids)
    fast(q, k, v, other)
    assert kinds(kernel) == ["jit", "bound"]
    names = kernel.arg_names
    block_n = kernel.calls[0][3]["BLOCK_N"]
    for (_, _, args, _), doc in zip(kernel.calls, (ids, other)):
        lo, hi = launch.min_max_per_tile(doc, 0, block_n)
        args = dict(zip(names, args))
        assert torch.equal(args["sum0_lo"], lo) and torch.equal(args["sum0_hi"], hi)


def test_other_strides_of_one_stride_class_launch_through_the_jit(recorded):
    fast, (q, k, v), _ = recorded

    def padded(t, pad):  # the same stride class (row-major, not contiguous), other strides
        return torch.zeros(*t.shape[:-1], t.shape[-1] + pad)[..., :t.shape[-1]].copy_(t)

    fast(padded(q, 4), k, v)  # a new signature: captured, then recorded
    kernel = record_launches()
    for pad in (4, 4, 8, 8, 4):
        fast(padded(q, pad), k, v)
    assert kinds(kernel) == ["jit", "bound", "jit", "bound", "bound"]


def test_pinned_tiles_and_forgotten_choices_launch_through_the_jit(recorded):
    fast, args, kernel = recorded
    fast(*args)
    with tuning.pinned((32, 16, 4, 1)):
        fast(*args)
        fast(*args)
    fast(*args)
    tuning.forget()
    fast(*args)
    fast(*args)
    assert kinds(kernel) == ["jit", "jit", "jit", "bound", "jit", "bound"]
    assert kernel.calls[1][3]["BLOCK_M"] == 32


def test_the_tuner_times_bound_launches_after_each_tiles_first(recorded, monkeypatch):
    """Each tile the tuner times is launched through the JIT once, then bound, as a layout's
    later calls run (the JIT's host time would be timed with a short kernel); the kept tile's
    final launch and the next call are bound launches of that tile."""
    fast, args, kernel = recorded
    first, second = (16, 16, 4, 1), (32, 16, 4, 1)

    def tuner(plan, inputs, frame, run, own=None):
        for tile in (first, second, first, second, first):
            run(tile)
        return second

    monkeypatch.setattr(launch, "tile_for", tuner)
    fast(*args)
    fast(*args)
    assert kinds(kernel) == ["jit", "jit", "bound", "bound", "bound", "bound", "bound"]
    grids = [call[1] for call in kernel.calls]
    blocks = {tile: (triton_grid(args[0], tile[0]),) for tile in (first, second)}
    assert grids == [blocks[first], blocks[second], blocks[first], blocks[second], blocks[first],
                     blocks[second], blocks[second]]


def test_a_region_whose_own_ops_beat_every_tile_runs_them(recorded, monkeypatch):
    """Where the tuner finds the region's own ops (tuning.EAGER) faster than every tile, that
    call and the later ones return what those ops compute and launch no kernel: a region is
    never slower than the code it replaced. The tuner is offered them (``eager``) and times
    them as it times a tile (``optimize()`` on a CPU compiles the rest of the graph with nothing:
    the ops run by PyTorch)."""
    fast, args, kernel = recorded
    offered = []

    def tuner(plan, inputs, frame, run, own=None):
        offered.append(own)
        if len(offered) == 1:  # timed at the first call, remembered after it
            run((16, 16, 4, 1))
            run(own)
        return own

    monkeypatch.setattr(launch, "tile_for", tuner)
    tuning.forget()
    outs = [fast(*args), fast(*args)]
    assert offered == [tuning.EAGER] * 2 and kinds(kernel) == ["jit"]   # the tile timed, then no launch
    for out in outs:  # no kernel wrote them: the region's own ops did
        assert_accurate(VARIANTS["vanilla"].fn, args, out)


def test_under_the_inner_inductor_a_region_times_its_own_ops_as_inductor_compiles_them(monkeypatch):
    """The code a region replaces under ``inner="inductor"`` is Inductor's: the tuner is offered the
    region's ops compiled by Inductor (tuning.COMPILED), and where they win, they run."""
    variant = VARIANTS["vanilla"]
    args = variant.inputs(Shape(B=1, H=2, Hkv=2, M=20, N=24, D=16, Dv=16), torch.float32, "cpu")
    offered, compiled = [], []

    def tuner(plan, inputs, frame, run, own=None):
        offered.append(own)
        run(own)
        return own

    inductor_compile = op._inductor_compile
    run = torch.compile(variant.fn, backend=fxflash.backend(inner="inductor"))
    monkeypatch.setattr(launch, "tile_for", tuner)
    monkeypatch.setattr(op, "_inductor_compile", lambda gm, inputs: compiled.append(gm) or inductor_compile(gm, inputs))
    assert_accurate(variant.fn, args, run(*args))
    assert offered == [tuning.COMPILED] and len(compiled) == 1


def triton_grid(q, block_m):
    """The vanilla kernel's grid for ``q`` [B, H, M, D]: row blocks × batch × heads."""
    return math.ceil(q.shape[-2] / block_m) * q.shape[0] * q.shape[1]


def test_view_ops_on_inputs_are_folded_into_the_call_and_bound_launches_read_their_bases(binding_on_cpu):
    """GQA's unsqueeze and expand of k and v leave the graph (into the region, rewrite.grouped_views,
    where its backward is fused; else into the call, rewrite.with_direct_calls): the first launch
    replays them, a bound launch passes k and v themselves (the same pointers)."""
    variant = VARIANTS["gqa_expand"]
    q, k, v = variant.inputs(Shape(B=1, H=4, Hkv=2, M=20, N=24, D=16, Dv=16), torch.float32, "cpu")
    fast = fxflash.optimize(variant.fn)
    assert_accurate(variant.fn, (q, k, v), fast(q, k, v))  # replayed views, for real
    code = fast.report(q, k, v).rewritten.code
    assert "expand" not in code and "unsqueeze" not in code
    kernel = record_launches()
    fast(q, k, v)
    fast(q, k, v)
    assert kinds(kernel) == ["jit", "bound"]
    jit_args, bound_args = kernel.calls[0][2], kernel.calls[1][2]
    for base in (k, v):
        (jit_view,) = [a for a in jit_args if isinstance(a, torch.Tensor) and a.dim() == 5 and a._base is base]
        assert jit_view.data_ptr() == base.data_ptr() and jit_view.stride()[2] == 0
        assert any(a is base for a in bound_args)


@pytest.mark.fusion_independent
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 3, 1, 5), (2, 0, 4, 1)])
def test_results_are_allocated_in_eager_layout_at_once(shape):
    """empty_results allocates the result at the strides of a dense tensor in ``out_order``
    (eager's layout of the region's last op): those of one allocated in that order and permuted
    back, sizes 0 and 1 included."""
    like = torch.empty(1)
    for order in itertools.permutations(range(len(shape))):
        plan = types.SimpleNamespace(out_order=order, out_dtype=torch.float16, side_dtypes=())
        out, = launch.empty_results(plan, [list(shape)], like)
        inverse = sorted(range(len(order)), key=order.__getitem__)
        expected = torch.empty([shape[a] for a in order]).permute(inverse)
        assert (out.shape, out.stride(), out.dtype) == (expected.shape, expected.stride(), torch.float16), order


@pytest.mark.fusion_independent
def test_a_call_compiled_ahead_is_launched_dry_on_tensors_of_its_layout():
    """The tensors a region call is compiled ahead on (op._empty_of) have the call's shape, strides
    and storage offset (so the pointer alignment Triton specializes on), in storage that holds
    every element they reach."""
    base = torch.randn(10, 12)
    for v in (base, base[2:, 1::2].t(), base[:, None, :4].expand(10, 3, 4), base[3:3]):
        e = op._empty_of(v)
        assert (e.shape, e.stride(), e.storage_offset(), e.dtype) == (v.shape, v.stride(), v.storage_offset(), v.dtype)
        reach = e.storage_offset() + sum((n - 1) * s for n, s in zip(e.shape, e.stride())) if e.numel() else -1
        assert e.untyped_storage().nbytes() >= (reach + 1) * e.element_size()
