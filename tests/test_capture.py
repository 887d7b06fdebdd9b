"""Capture: functional ATen graphs with metadata, signatures, live parameters."""
import math
import threading

import pytest
import torch

import fxflash
from helpers import assert_fused
from fxflash.capture import capture, signature_of
from fxflash.variants import VARIANTS, Shape, vanilla
from helpers import aten, nodes_with


def _qkv(m=6, n=6, d=8):
    return torch.randn(1, 2, m, d), torch.randn(1, 2, n, d), torch.randn(1, 2, n, d)


@pytest.mark.fusion_independent
def test_graph_is_functional_decomposed_and_annotated():
    q, k, v = _qkv()
    mask = torch.ones(6, 6).tril()
    gm = capture(vanilla, (q, k, v, mask)).graph_module
    for node in gm.graph.nodes:
        if node.op == "call_function":
            schema = getattr(node.target, "_schema", None)
            assert schema is None or not schema.is_mutable, node.format_node()
            assert isinstance(node.meta["val"], (torch.Tensor, list, tuple)), node.name
            assert "softmax" not in str(node.target)
    for op in (aten.amax, aten.sub, aten.exp, aten.sum, aten.div, aten.where):
        assert nodes_with(gm, op), op


@pytest.mark.fusion_independent
def test_log_softmax_is_decomposed():
    gm = capture(lambda x: torch.log_softmax(x, -1), (torch.randn(3, 4),)).graph_module
    assert nodes_with(gm, aten.amax) and nodes_with(gm, aten.log)


@pytest.mark.fusion_independent
def test_shape_control_flow_and_optional_arguments():
    def f(q, k, v, mask=None, scale=None):
        scale = scale if scale is not None else 1 / math.sqrt(q.size(-1))
        s = q @ k.transpose(-2, -1) * scale
        if mask is not None:
            s = s + mask
        return torch.softmax(s, -1) @ v

    q, k, v = _qkv()
    fast = fxflash.optimize(f)
    torch.testing.assert_close(fast(q, k, v), f(q, k, v))
    mask = torch.randn(6, 6)
    torch.testing.assert_close(fast(q, k, v, mask=mask), f(q, k, v, mask=mask))
    torch.testing.assert_close(fast(q, k, v, mask, 0.5), f(q, k, v, mask, 0.5))


@pytest.mark.fusion_independent
def test_data_dependent_control_flow_runs_eagerly():
    """A trace takes one branch; the next call's values may take the other: such code runs as
    written, each call's branch its own."""
    def f(x):
        if x.sum() > 0:
            return x * 2
        return x - 1

    fast = fxflash.optimize(f)
    with pytest.warns(RuntimeWarning, match="control flow reads tensor values"):
        torch.testing.assert_close(fast(torch.ones(3)), f(torch.ones(3)))
    torch.testing.assert_close(fast(-torch.ones(3)), f(-torch.ones(3)))


@pytest.mark.fusion_independent
def test_untraceable_code_runs_eagerly_with_a_warning():
    def f(x):
        return torch.tensor(x.tolist()[::-1]) + x.numpy().sum()  # leaves the tensor world

    fast = fxflash.optimize(f)
    x = torch.arange(3.0)
    with pytest.warns(RuntimeWarning, match="running eagerly"):
        out = fast(x)
    torch.testing.assert_close(out, f(x))


class Attention(torch.nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.register_buffer("temperature", torch.tensor(1.0))

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(-2, -1) / self.temperature, -1) @ v


def test_module_parameters_stay_live():
    model = Attention()
    fast = fxflash.optimize(model)
    assert isinstance(fast, torch.nn.Module)
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(fast(x), model(x))
    with torch.no_grad():
        model.qkv.weight.mul_(3.0)
        model.temperature.fill_(2.0)
    torch.testing.assert_close(fast(x), model(x))
    assert len(fast._optimizer.cache) == 1
    assert_fused(fast.report(x))  # the parameters are read live by the fused graph, not by eager


def test_training_step_through_optimized_module_matches_eager():
    torch.manual_seed(0)
    model = Attention()
    ref = Attention()
    ref.load_state_dict(model.state_dict())
    fast = fxflash.optimize(model)
    x = torch.randn(2, 5, 8)
    fast(x).square().sum().backward()
    assert_fused(fast.report(x))
    ref(x).square().sum().backward()
    for p, r in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, r.grad)


@pytest.mark.fusion_independent
def test_signature_changes_respecialize_and_cache_is_bounded():
    fast = fxflash.optimize(lambda x: torch.softmax(x, -1), cache_size=2)
    for n in (3, 4, 5):
        x = torch.randn(2, n)
        torch.testing.assert_close(fast(x), torch.softmax(x, -1))
    assert len(fast._optimizer.cache) == 2
    x = torch.randn(2, 5)
    keys = {signature_of((x,), {}), signature_of((x.double(),), {}), signature_of((x.t().contiguous().t(),), {})}
    with torch.no_grad():
        keys.add(signature_of((x,), {}))
    keys.add(signature_of((x.requires_grad_(),), {}))
    assert len(keys) == 5


def test_concurrent_first_calls_build_once():
    built = []

    def f(q, k, v):  # fuses, so calls run the captured graph and f runs only when traced
        built.append(1)
        return VARIANTS["vanilla"].fn(q, k, v)

    fast = fxflash.optimize(f)
    args = VARIANTS["vanilla"].inputs(Shape(B=1, H=2, Hkv=2, M=8, N=8, D=8, Dv=8))
    outs = []
    threads = [threading.Thread(target=lambda: outs.append(fast(*args))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fast._optimizer.cache) == 1
    assert len(built) == 1  # traced once (fake tracing calls the function once)
    ref = VARIANTS["vanilla"].fn(*args)
    assert len(outs) == 4 and all(torch.allclose(o, ref, atol=1e-5) for o in outs)


@pytest.mark.fusion_independent
def test_bad_argument_to_optimize():
    with pytest.raises(TypeError, match="nn.Module or a function"):
        fxflash.optimize(42)
