"""Close but unsupported programs fall back and match eager exactly; bad input behaves as eager."""
import math

import pytest
import torch

import fxflash
from fxflash.variants import VARIANTS, Shape
from helpers import assert_accurate

SHAPE = Shape(B=2, H=2, Hkv=2, M=19, N=37, D=8, Dv=8)


def _scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))


def softmax_over_queries(q, k, v):
    return torch.softmax(_scores(q, k), dim=-2) @ v


def weights_returned_too(q, k, v):
    p = torch.softmax(_scores(q, k), dim=-1)
    return p @ v, p


def dropout_on_weights(q, k, v):
    p = torch.nn.functional.dropout(torch.softmax(_scores(q, k), dim=-1), p=0.3, training=True)
    return p @ v


def top_k_scores(q, k, v):
    s = _scores(q, k)
    kth = s.topk(4, dim=-1).values[..., -1:]
    return torch.softmax(s.masked_fill(s < kth, float("-inf")), dim=-1) @ v


def cumulative_over_keys(q, k, v):
    return torch.softmax(_scores(q, k), dim=-1).cumsum(-1) @ v


def intermediate_used_outside(q, k, v):
    s = _scores(q, k)
    return torch.softmax(s, dim=-1) @ v + s.mean()


# each program → the rule that refuses it and the op of the node it stops at
REFUSED = {
    softmax_over_queries: ("chain discovery", torch.ops.aten.amax),
    weights_returned_too: ("convexity", torch.ops.aten.div),
    dropout_on_weights: ("randomness", torch.ops.aten.bernoulli),
    top_k_scores: ("chain discovery", torch.ops.aten.topk),
    cumulative_over_keys: ("chain discovery", torch.ops.aten.cumsum),
    intermediate_used_outside: ("convexity", torch.ops.aten.div),
}


@pytest.mark.parametrize("fn", [  # no chain to fuse: with fusion off, the same report
    pytest.param(fn, marks=[pytest.mark.fusion_independent] if rule == "chain discovery" else [])
    for fn, (rule, _) in REFUSED.items()], ids=lambda f: f.__name__)
def test_unsupported_program_falls_back_bit_for_bit(fn):
    args = VARIANTS["vanilla"].inputs(SHAPE)
    report = fxflash.explain(fn, *args)
    assert report.regions and not any(r.fused for r in report.regions)
    nodes = {n.name: n for n in report.graph.graph.nodes}
    rule, op = REFUSED[fn]
    for region in report.regions:  # explain() names the rule and the node that refused it
        assert (region.rule, nodes[region.stopped_at].target.overloadpacket) == (rule, op)
        assert region.reason.startswith(rule) and f"refused: {region.reason}" in str(report)
    torch.manual_seed(0)
    out = fxflash.optimize(fn)(*args)
    torch.manual_seed(0)
    ref = fn(*args)
    for a, b in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_and_inf_propagate_as_in_eager(where, value):
    variant = VARIANTS["vanilla"]
    q, k, v = variant.inputs(SHAPE)
    tensors = dict(q=q, k=k, v=v)
    tensors[where] = tensors[where].clone()
    tensors[where][1, 0, 3, 2] = value
    args = (tensors["q"], tensors["k"], tensors["v"])
    out = fxflash.optimize(variant.fn)(*args)
    ref = variant.fn(*args)
    assert fxflash.explain(variant.fn, *args).regions[0].fused
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    assert torch.equal(torch.isinf(out), torch.isinf(ref))


@pytest.mark.parametrize("sizes", [dict(M=0), dict(N=0), dict(B=0), dict(M=1), dict(N=1), dict(M=1, N=1)],
                         ids=str)
@pytest.mark.fusion_independent
def test_empty_and_length_one_inputs_match_eager(sizes):
    import dataclasses

    variant = VARIANTS["causal" if "N" not in sizes else "vanilla"]
    args = variant.inputs(dataclasses.replace(SHAPE, **sizes))
    out = fxflash.optimize(variant.fn)(*args)
    ref = variant.fn(*args)
    assert out.shape == ref.shape
    if out.numel():
        assert_accurate(variant.fn, args, out)
