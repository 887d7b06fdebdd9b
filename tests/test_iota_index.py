"""capture/iota_index.py: indexing a tensor by its own axes' iotas is read as a view of it."""
import pytest
import torch

from fxflash.capture import capture

aten = torch.ops.aten


def _targets(fn, *args):
    captured = capture(fn, args)
    return [n.target for n in captured.graph_module.graph.nodes if n.op == "call_function"], captured


def padding_gather(padding):
    """transformers' ``padding_mask[batch_idx, kv_idx]`` with broadcast iotas: ``padding[b, n]``."""
    b = torch.arange(padding.size(0))[:, None, None, None]
    n = torch.arange(padding.size(1))[None, None, None, :]
    return padding[b, n]


def shifted_gather(padding):
    """Keys from position 2 on (an iota plus an offset, as a cache position): other elements."""
    b = torch.arange(padding.size(0))[:, None, None, None]
    n = (torch.arange(padding.size(1) - 2) + 2)[None, None, None, :]
    return padding[b, n]


def transposed_gather(padding):
    """The first axis' iota along the last axis of the result: ``padding`` transposed."""
    b = torch.arange(padding.size(0))[None, None, None, :]
    n = torch.arange(padding.size(1))[:, None, None, None]
    return padding[b, n]


@pytest.mark.fusion_independent
def test_an_index_by_the_iotas_of_the_axes_is_a_view():
    padding = torch.rand(3, 7) > 0.5
    targets, captured = _targets(padding_gather, padding)
    assert aten.index.Tensor not in targets and aten.view.default in targets
    assert torch.equal(captured.run(captured.graph_module, (padding,), {}), padding_gather(padding))


@pytest.mark.fusion_independent
@pytest.mark.parametrize("gather", [shifted_gather, transposed_gather], ids=lambda f: f.__name__)
def test_other_indices_stay_gathers(gather):
    padding = torch.rand(3, 7) > 0.5
    targets, captured = _targets(gather, padding)
    assert aten.index.Tensor in targets
    assert torch.equal(captured.run(captured.graph_module, (padding,), {}), gather(padding))
