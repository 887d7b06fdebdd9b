"""Capture: functional ATen graphs with metadata; optimize() through TorchDynamo: graph breaks, guards,
live parameters."""
import math
import threading

import pytest
import torch

import fxflash
from helpers import assert_fused
from fxflash.capture import capture
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


def test_data_dependent_control_flow_breaks_the_graph_and_the_attention_still_fuses():
    """Python that reads a tensor's value (``if mask.all()``, transformers' padding check) is a
    graph break: each call takes its own branch, and the attention after it fuses."""
    def f(q, k, v, mask):
        if mask.all():  # nothing masked: no mask (transformers' own check)
            mask = None
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return torch.softmax(s, -1) @ v

    q, k, v = _qkv()
    full, causal = torch.ones(6, 6, dtype=torch.bool), torch.ones(6, 6, dtype=torch.bool).tril()
    fast = fxflash.optimize(f)
    for mask in (full, causal):
        torch.testing.assert_close(fast(q, k, v, mask), f(q, k, v, mask))
        assert_fused(fast.report(q, k, v, mask))


def test_code_that_leaves_the_tensor_world_still_fuses_its_attention():
    def f(q, k, v):
        scale = 1 / math.sqrt(len(q.tolist()[0][0][0]))  # Python lists of values: a graph break
        return torch.softmax(q @ k.transpose(-2, -1) * scale, -1) @ v + float(q.numpy().sum() * 0)

    q, k, v = _qkv()
    fast = fxflash.optimize(f)
    torch.testing.assert_close(fast(q, k, v), f(q, k, v))
    assert_fused(fast.report(q, k, v))


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


def test_other_shapes_dtypes_strides_and_grad_modes_compile_again():
    fast = fxflash.optimize(VARIANTS["vanilla"].fn)
    q, k, v = _qkv()
    calls = [(q, k, v), _qkv(m=9, n=11), tuple(t.half() for t in (q, k, v)),
             (q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v), (q.clone().requires_grad_(), k, v)]
    for args in calls:
        torch.testing.assert_close(fast(*args), VARIANTS["vanilla"].fn(*args), atol=2e-3, rtol=2e-3)
        assert_fused(fast.report(*args))
    with torch.no_grad():
        assert_fused(fast.report(*calls[-1]))


def test_concurrent_first_calls():
    fast = fxflash.optimize(VARIANTS["vanilla"].fn)
    args = VARIANTS["vanilla"].inputs(Shape(B=1, H=2, Hkv=2, M=8, N=8, D=8, Dv=8))
    outs = []
    threads = [threading.Thread(target=lambda: outs.append(fast(*args))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ref = VARIANTS["vanilla"].fn(*args)
    assert len(outs) == 4 and all(torch.allclose(o, ref, atol=1e-5) for o in outs)
    assert_fused(fast.report(*args))


@pytest.mark.fusion_independent
def test_bad_argument_to_optimize():
    with pytest.raises(TypeError, match="nn.Module or a function"):
        fxflash.optimize(42)
    with pytest.raises(ValueError, match="inner must be one of"):
        fxflash.optimize(torch.nn.Linear(2, 2), inner="tvm")


@pytest.mark.fusion_independent
def test_a_copied_zero_dimensional_constant_is_a_scalar():
    """``torch.tensor(0.0, device="cuda")`` traces to ``detach(lift_fresh_copy(c))`` of a constant the
    module holds: the capture makes it ``scalar_tensor(0.0)``, the constant the fusion rules read
    (transformers' eager mask ``where(keep, torch.tensor(0.0, …), finfo.min)``), with the same result."""
    from fxflash.analysis.ops import constant_value
    from fxflash.capture.scalar_constants import scalars_from_constants

    aten = torch.ops.aten
    gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    gm.register_buffer("_tensor_constant0", torch.tensor(0.5, dtype=torch.bfloat16))
    g = gm.graph
    x = g.placeholder("x")
    copy = g.call_function(aten.lift_fresh_copy.default, (g.get_attr("_tensor_constant0"),))
    add = g.call_function(aten.add.Tensor, (x, g.call_function(aten.detach.default, (copy,))))
    g.output(add)
    gm.recompile()
    x = torch.randn(3, dtype=torch.bfloat16)
    expected = gm(x)
    assert scalars_from_constants(gm) > 0
    gm.graph.eliminate_dead_code()
    gm.recompile()
    ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert ops == {aten.scalar_tensor.default, aten.add.Tensor}, ops
    assert constant_value(add.args[1]) == 0.5 and add.args[1].kwargs["dtype"] is torch.bfloat16
    assert torch.equal(gm(x), expected)
