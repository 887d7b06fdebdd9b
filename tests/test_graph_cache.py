"""Compiled graphs remembered across processes (runtime/graph_cache.py): what the backend made of a
graph is stored, and a later compilation of the same graph on inputs of the same layouts loads it
instead of capturing, analysing and generating again."""
import glob
import os
import pickle

import pytest
import torch

import fxflash
from fxflash import config
from fxflash.backend import recording
from fxflash.capture import capture
from fxflash.report import RememberedChain
from fxflash.runtime import graph_cache
from fxflash.variants import VARIANTS, Shape
from helpers import assert_accurate, assert_fused, assert_gradients_accurate

SHAPE = Shape(B=2, H=4, Hkv=2, M=9, N=13, D=8, Dv=8)


@pytest.fixture
def remembering(tmp_path):
    with config.overridden(remember_graphs=True, kernel_cache_dir=str(tmp_path)):
        yield tmp_path


def _compiled_reports(fn, args, inner="eager"):
    """A fresh compilation of ``fn`` (Dynamo's caches cleared): its output and its graphs' reports."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=fxflash.backend(inner=inner, keep_reports=False))
    with recording() as reports:
        out = compiled(*args)
    return out, reports


@pytest.mark.parametrize("name", ["causal", "gqa_expand", "alibi", "diff_transformer"])
def test_a_graph_compiled_again_is_loaded_with_its_regions(remembering, name):
    variant = VARIANTS[name]
    args = variant.inputs(SHAPE)
    _, (first,) = _compiled_reports(variant.fn, args)
    assert "capture" in first.seconds and glob.glob(str(remembering / "graphs" / "*" / "*"))
    out, (second,) = _compiled_reports(variant.fn, args)
    assert set(second.seconds) == {"remembered graph"}, second.seconds
    fused = assert_fused(second, variant.chains)
    assert [r.source for r in fused] == [r.source for r in first.regions if r.fused]
    assert isinstance(fused[0].chain, RememberedChain) and fused[0].verdict() == first.regions[0].verdict()
    assert "loaded from fxflash's graph cache" in str(second) and str(fused[0].tile_program).splitlines()[0] in str(second)
    assert_accurate(variant.fn, args, out)
    # explain() analyses afresh: its report has the chains themselves
    assert not isinstance(fxflash.explain(variant.fn, *args).regions[0].chain, RememberedChain)


def test_a_region_with_a_gluon_kernel_and_a_training_forward_is_remembered(remembering):
    # fp16 at head dim 64: the region also gets a Gluon kernel for Hopper, and inputs that ask for
    # gradients a training forward; both plans are stored without the FX nodes they were printed from
    variant = VARIANTS["causal"]
    args = [a.half().requires_grad_() for a in variant.inputs(Shape(B=1, H=2, Hkv=2, M=64, N=64, D=64, Dv=64))]
    _, (first,) = _compiled_reports(variant.fn, args)
    out, (second,) = _compiled_reports(variant.fn, args)
    assert set(second.seconds) == {"remembered graph"}
    (region,) = assert_fused(second)
    assert region.gluon_source and region.gluon_source == first.regions[0].gluon_source
    assert_accurate(variant.fn, [a.detach() for a in args], out.detach())


@pytest.mark.parametrize("name", ["causal", "diff_attention"])
def test_a_remembered_graph_trains_with_its_fused_backward(remembering, name, monkeypatch):
    """Differential attention's twin (runtime/twin.py) is stored with its region and rebuilt with
    its own regions: its fused backward runs in the process that loads the graph."""
    import fxflash.runtime.backward as backward

    ran = []
    run_backward = backward.run_backward
    monkeypatch.setattr(backward, "run_backward", lambda *a, **k: ran.append(a[0]) or run_backward(*a, **k))
    variant = VARIANTS[name]
    args = variant.inputs(SHAPE)
    for run in range(2):
        ran.clear()
        torch._dynamo.reset()
        compiled = torch.compile(variant.fn, backend=fxflash.backend(inner="eager", keep_reports=False))
        with recording() as reports:
            assert_gradients_accurate(variant.fn, compiled, args, wrt=(0, 1, 2))
    assert set(reports[0].seconds) == {"remembered graph"} and ran
    assert assert_fused(reports[0])[0].backward == "fused"


def test_a_remembered_graph_is_compiled_by_the_inner_inductor(remembering):
    variant = VARIANTS["sliding_window"]
    args = variant.inputs(SHAPE)
    _compiled_reports(variant.fn, args, inner="inductor")
    out, (report,) = _compiled_reports(variant.fn, args, inner="inductor")
    assert set(report.seconds) == {"remembered graph"} and report.inner == "inductor"
    assert_fused(report)
    assert_accurate(variant.fn, args, out)


def attention_after_an_empty_past(q, k, v):
    """Keys after an empty past, as a cache's first step writes them: the empty tensor is a constant of
    the traced graph, on the inputs' device."""
    past = torch.tensor([], device=q.device, dtype=q.dtype).view(1, 1, 0, 1).expand(*k.shape[:2], 0, k.shape[-1])
    k = torch.cat([past, k], dim=2)
    return torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, -1) @ v


@pytest.mark.parametrize("inner, device", [
    ("eager", "cpu"),
    pytest.param("inductor", "cuda", marks=[pytest.mark.gpu,
                                           pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")]),
])
def test_a_graphs_constants_come_back_on_their_device(remembering, inner, device):
    dtype, shape = (torch.float16, (2, 4, 128, 64)) if device == "cuda" else (torch.float32, (2, 4, 16, 8))
    args = [torch.randn(shape, device=device, dtype=dtype) for _ in range(3)]
    _compiled_reports(attention_after_an_empty_past, args, inner=inner)
    out, (report,) = _compiled_reports(attention_after_an_empty_past, args, inner=inner)
    assert set(report.seconds) == {"remembered graph"}
    assert_fused(report)
    assert_accurate(attention_after_an_empty_past, args, out)


def test_optimize_loads_remembered_graphs_too(remembering):
    variant = VARIANTS["vanilla"]
    args = variant.inputs(SHAPE)
    fxflash.optimize(variant.fn).report(*args)
    torch._dynamo.reset()
    fast = fxflash.optimize(variant.fn)
    report = fast.report(*args)
    assert set(report.seconds) == {"remembered graph"}
    assert_fused(report)
    assert_accurate(variant.fn, args, fast(*args))


@pytest.mark.fusion_independent
def test_a_graph_with_nothing_fused_is_remembered_as_such(remembering):
    def mlp(x, w):
        return torch.relu(x @ w).sum(-1)

    args = (torch.randn(4, 8), torch.randn(8, 8))
    _compiled_reports(mlp, args)
    out, (second,) = _compiled_reports(mlp, args)
    assert set(second.seconds) == {"remembered graph"} and not second.regions
    torch.testing.assert_close(out, mlp(*args))


def test_an_unreadable_entry_is_compiled_afresh_and_replaced(remembering):
    variant = VARIANTS["vanilla"]
    args = variant.inputs(SHAPE)
    _compiled_reports(variant.fn, args)
    (path,) = glob.glob(str(remembering / "graphs" / "*" / "*"))
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        f.write(b"\0" * 64)
    out, (report,) = _compiled_reports(variant.fn, args)
    assert "capture" in report.seconds
    assert_fused(report)
    assert_accurate(variant.fn, args, out)
    assert set(_compiled_reports(variant.fn, args)[1][0].seconds) == {"remembered graph"}


@pytest.mark.fusion_independent  # a graph is remembered whether or not it fused
def test_the_least_recently_used_graphs_are_evicted_beyond_the_limit(remembering, monkeypatch):
    variant = VARIANTS["vanilla"]
    first, second = variant.inputs(SHAPE), variant.inputs(Shape(B=1, H=2, Hkv=2, M=5, N=7, D=8, Dv=8))
    _compiled_reports(variant.fn, first)
    (kept,) = glob.glob(str(remembering / "graphs" / "*" / "*"))
    monkeypatch.setattr(graph_cache, "MAX_BYTES", os.path.getsize(kept) * 3 // 2)
    _compiled_reports(variant.fn, second)
    (now,) = glob.glob(str(remembering / "graphs" / "*" / "*"))
    assert now != kept
    assert "capture" in _compiled_reports(variant.fn, first)[1][0].seconds


@pytest.mark.fusion_independent
def test_an_entry_resolves_only_fxflash_and_torch_data_and_known_targets():
    class Payload:
        def __reduce__(self):
            return (os.system, ("true",))

    with pytest.raises(pickle.UnpicklingError, match="os.system|posix.system"):
        graph_cache._Unpickler(__import__("io").BytesIO(pickle.dumps(Payload()))).load()
    data = pickle.dumps([torch.bfloat16, torch.device("cpu"), torch.strided, torch.channels_last, {1, 2}])
    # a graph names its targets, found again only among PyTorch's operators and a few functions
    nodes = [("placeholder", "x", ("attr", "x"), (), {}), ("call_function", "y", ("function", "builtins", "exec"),
                                                           ("print(1)",), {})]
    with pytest.raises(graph_cache.Unrememberable):
        graph_cache.graph_of(graph_cache.GraphData(nodes, {}))
    assert graph_cache._Unpickler(__import__("io").BytesIO(data)).load()[0] is torch.bfloat16


@pytest.mark.fusion_independent
def test_the_key_follows_layouts_settings_and_modes():
    variant = VARIANTS["vanilla"]
    args = variant.inputs(SHAPE)
    gm = capture(variant.fn, args).graph_module

    def key(*xs, inner="eager"):
        return graph_cache.graph_key(gm, list(xs), inner, None)

    base = key(*args)
    assert base == key(*[a.clone() for a in args])
    assert base != key(*[a.double() for a in args])
    assert base != key(args[0].transpose(-1, -2).contiguous().transpose(-1, -2), *args[1:])
    assert base != key(args[0], args[0], *args[2:])   # two inputs that share memory
    assert base != key(*args, inner="inductor")
    with config.overridden(block_sparsity=False):
        assert base != key(*args)
    with config.overridden(progress=not config.progress):
        assert base == key(*args)
    with torch.no_grad():
        assert base != key(*args)
    sym = torch.fx.experimental.symbolic_shapes.ShapeEnv().create_unbacked_symint()
    assert key(*args, sym) is None


@pytest.mark.fusion_independent
def test_the_key_reads_a_constants_values():
    def scaled(x, c):
        return x * torch.tensor([c, 2.0, 3.0])

    x = torch.randn(3)
    half, third = (capture(scaled, (x, c)).graph_module for c in (0.5, 1 / 3))
    assert half.code == third.code   # the value is an attribute of the graph, not in its code
    assert None is not graph_cache.graph_key(half, [x], "eager", None) != graph_cache.graph_key(third, [x], "eager", None)


@pytest.mark.fusion_independent
def test_graphs_are_stored_as_data_and_rebuilt_alike():
    def fn(x, i):
        y = torch.cat([x[:, 1:3], torch.tensor([[1.5, 2.5]]).expand(x.shape[0], 2)], dim=1)
        return y.to(torch.float64, memory_format=torch.contiguous_format)[i], y.max(dim=1)

    args = (torch.randn(4, 5), torch.tensor([0, 2]))
    gm = capture(fn, args).graph_module
    rebuilt = graph_cache.graph_of(graph_cache.graph_data(gm))
    assert rebuilt.code == gm.code
    for a, b in zip(rebuilt(*args), gm(*args)):
        torch.testing.assert_close(a, b)
