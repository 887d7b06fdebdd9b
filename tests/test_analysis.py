"""Dimension ids, op kinds and sketches on decomposed graphs (the paper's examples)."""
import math

import pytest
import torch

from fxflash.analysis import OpKind
from fxflash.patterns import find_chains
from helpers import aten, analysed, nodes_with

pytestmark = pytest.mark.fusion_independent  # analysis and capture, no kernel


def test_elementwise_add_sketch_has_two_parallel_dims_and_no_reduction():
    _, a = analysed(lambda x, y: x + y, torch.randn(3, 5), torch.randn(3, 5))
    (add,) = nodes_with(a.graph, aten.add)
    sketch = a.sketch(add)
    assert len(sketch.parallel) == 2 and sketch.reduced == ()
    assert a.kinds[add] is OpKind.ELEMENTWISE


def test_gemm_sketch_is_m_n_over_k_and_k_is_shared():
    _, a = analysed(lambda x, y: x @ y, torch.randn(3, 5), torch.randn(5, 7))
    (mm,) = nodes_with(a.graph, aten.mm)
    x, y = [n for n in a.graph.graph.nodes if n.op == "placeholder"]
    sketch = a.sketch(mm)
    xm, xk = a.dims.dims(x)
    yk, yn = a.dims.dims(y)
    assert sketch.parallel == (xm, yn)
    assert sketch.reduced == (xk,) and xk == yk
    assert a.kinds[mm] is OpKind.CONTRACTION


def test_softmax_decomposes_into_reductions_over_the_last_axis():
    _, a = analysed(lambda s: torch.softmax(s, dim=-1), torch.randn(2, 3, 5))
    (amax,) = nodes_with(a.graph, aten.amax)
    (total,) = nodes_with(a.graph, aten.sum)
    (x,) = [n for n in a.graph.graph.nodes if n.op == "placeholder"]
    b, m, n = a.dims.dims(x)
    for red in (amax, total):
        assert a.sketch(red).parallel == (b, m)
        assert a.sketch(red).reduced == (n,)
        assert a.kinds[red] is OpKind.REDUCTION


def _attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ v


def test_key_axis_of_scores_is_the_axis_contracted_by_pv():
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    _, a = analysed(_attention, q, k, v)
    first, second = nodes_with(a.graph, aten.bmm)
    qn, kn, vn = [n for n in a.graph.graph.nodes if n.op == "placeholder"]
    key_axis = a.dims.dims(kn)[2]
    assert a.sketch(first).parallel[-1] == key_axis
    assert a.sketch(second).reduced == (key_axis,)
    assert a.dims.dims(vn)[2] == key_axis
    # the batch axes merged for bmm and split back carry the ids of q's batch axes
    (out_view,) = [n for n in a.graph.graph.nodes if n.op == "output"][0].all_input_nodes
    assert a.dims.dims(out_view)[:3] == a.dims.dims(qn)[:3]
    assert a.dims.dims(out_view)[3] == a.dims.dims(vn)[3]
    (chain,) = find_chains(a)
    assert chain.demoted == key_axis


def test_dims_follow_reshape_split_and_merge():
    def f(x):
        return x.reshape(6, 5).reshape(2, 3, 5).permute(2, 0, 1)

    _, a = analysed(f, torch.randn(2, 3, 5))
    (x,) = [n for n in a.graph.graph.nodes if n.op == "placeholder"]
    out = [n for n in a.graph.graph.nodes if n.op == "output"][0].all_input_nodes[0]
    b, h, d = a.dims.dims(x)
    assert a.dims.dims(out) == [d, b, h]


def test_dims_follow_expand_unsqueeze_squeeze_and_chunk():
    def f(x):
        y = x.unsqueeze(1).expand(2, 4, 5).squeeze(0) if x.size(0) == 1 else x[:, None].expand(2, 4, 5)
        a, b = y.chunk(2, dim=1)
        return a * 2, b.sum(-1)

    _, a = analysed(f, torch.randn(2, 5))
    (x,) = [n for n in a.graph.graph.nodes if n.op == "placeholder"]
    out0, out1 = [n for n in a.graph.graph.nodes if n.op == "output"][0].all_input_nodes
    bx, dx = a.dims.dims(x)
    b0, half0, d0 = a.dims.dims(out0)
    assert (b0, d0) == (bx, dx)
    assert half0 != bx and half0 != dx
    assert a.dims.dims(out1)[0] == bx


def test_einsum_contraction_shares_the_contracted_dim():
    def f(q, k):
        return torch.einsum("bhmd,bhnd->bhmn", q, k)

    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8)
    _, a = analysed(f, q, k)
    (bmm,) = nodes_with(a.graph, aten.bmm)
    qn, kn = [n for n in a.graph.graph.nodes if n.op == "placeholder"]
    assert a.sketch(bmm).reduced == (a.dims.dims(qn)[3],)
    assert a.dims.dims(qn)[3] == a.dims.dims(kn)[3]


def test_masks_from_arange_are_index_expressions():
    def f(s):
        i = torch.arange(s.size(-2))[:, None]
        j = torch.arange(s.size(-1))[None, :]
        return s.masked_fill(j > i, float("-inf"))

    _, a = analysed(f, torch.randn(4, 4))
    (gt,) = nodes_with(a.graph, aten.gt)
    (where,) = nodes_with(a.graph, aten.where)
    assert a.kinds[gt] is OpKind.INDEX
    assert a.kinds[where] is OpKind.ELEMENTWISE
    for node in a.graph.graph.nodes:
        if node.op == "call_function" and node.target in (aten.arange.default, aten.arange.start):
            assert a.kinds[node] is OpKind.INDEX
