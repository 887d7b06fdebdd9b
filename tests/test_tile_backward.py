"""fxflash.tile.backward: a region's backward as tile programs (Δ; dK and dV per key tile; dQ per
row tile), lowered from the same region as the forward. Run here by helpers.evaluate_tile_program,
in which one tile holds every row and every key: the gradients it computes are autograd's, so the
programs say the right thing (how they are tiled is the forward's)."""
import pytest
import torch

import fxflash
from fxflash.codegen.printers import PRINTERS
from fxflash.tile import ir, lower
from fxflash.tile.backward import BackwardRefused, lower_backward, lower_statistics, with_statistics
from fxflash.variants import VARIANTS, Shape
from helpers import analysed, assert_fused, evaluate_tile_program, graph_values, region_and_kinds

aten = torch.ops.aten
SHAPE = Shape(B=2, H=3, Hkv=3, M=9, N=13, D=8, Dv=8)


@pytest.mark.fusion_independent  # lowers the region itself, as the pipeline would
@pytest.mark.parametrize("name", ["vanilla", "softcap", "alibi", "scale_q_first", "causal", "key_padding", "additive_mask",
                                  "sigmoid_attention", "relu_attention", "softmax_one", "retention_norm"])
def test_the_backward_programs_compute_autograds_gradients(name):
    variant = VARIANTS[name]
    inputs = variant.inputs(SHAPE)
    region, kinds = region_and_kinds(variant.fn, *inputs)   # fp32: the dtypes fxflash fuses
    captured, _ = analysed(variant.fn, *inputs)
    args = tuple(a.double() if a.is_floating_point() else a for a in inputs)   # evaluated in fp64
    names = [n.name for n in captured.graph_module.graph.nodes if n.op == "placeholder"]
    tensors = dict(zip(names, args))
    graph = graph_values(captured.graph_module, inputs)
    leaves = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
    out = variant.fn(*leaves)
    if name == "softmax_one":
        # its forward shifts the exponent by a row value computed after the loop, which this
        # evaluator cannot defer: the statistics from the backward's own program, O from eager
        evaluate_tile_program(lower_statistics(region, kinds, PRINTERS), tensors, graph)
        tensors[region.output.name] = out.detach().reshape(graph[region.output.name].shape)
    else:
        evaluate_tile_program(with_statistics(lower(region, kinds, PRINTERS), region), tensors, graph)
    torch.testing.assert_close(tensors[region.output.name].reshape(out.shape), out.detach())
    grad = torch.randn_like(out)
    tensors[f"d{region.output.name}"] = grad.reshape(tensors[region.output.name].shape)
    programs, atomics, exact_delta = lower_backward(region, kinds, PRINTERS)
    expected = torch.autograd.grad(out, [leaves[names.index(o.node.name)] for o in (region.q, region.k, region.v)],
                                   grad)
    # the deterministic programs (an elementwise P reads no statistics), then the key program
    # that adds each key tile's share of dQ (here one tile: dQ from nothing), then Δ summed as
    # P·dP over the keys (scaled to the sum P has) in place of rowsum(dO ⊙ O)
    runs = [programs, programs[:-2] + (atomics,)]
    assert (exact_delta is None) == (name in ("sigmoid_attention", "relu_attention"))
    if exact_delta is not None:
        runs.append((exact_delta, *programs[1:]))
    for run in runs:
        for gradient in (region.q, region.k, region.v):
            tensors.pop(f"d{gradient.node.name}", None)
        for program in run:
            evaluate_tile_program(program, tensors, graph)
        for operand, want in zip((region.q, region.k, region.v), expected):
            got = tensors[f"d{operand.node.name}"]
            got = got.transpose(-1, -2) if operand.transposed != (operand is region.k) else got
            torch.testing.assert_close(got.reshape(want.shape), want)


def test_explain_shows_each_region_s_backward_or_why_not():
    """Three programs for a softmax region (dK and dV loop over the row tiles, skipping those the
    forward's tile masks skip), two for an elementwise P; a refusal naming the reason for one
    outside those forms."""
    variant = VARIANTS["causal"]
    (region,) = assert_fused(fxflash.explain(variant.fn, *variant.inputs(SHAPE)))
    delta, dkdv, dq, exact_delta = region.backward_programs[1:]
    assert (delta.loop, dkdv.per, dkdv.loop, dq.per, dq.loop) == ("", "key", "row", "row", "key")
    assert (exact_delta.per, exact_delta.loop) == ("row", "key") and exact_delta.skips == dq.skips
    assert [op.unit for op in dkdv.skips] == ["row"] and [op.unit for op in dq.skips] == ["key"]
    assert [op.transposed for op in dkdv.body if isinstance(op, ir.Accumulate)] == [True, True]
    assert "backward: fused, 4 kernels" in str(region) and exact_delta.name in str(region)
    variant = VARIANTS["sigmoid_attention"]
    (region,) = assert_fused(fxflash.explain(variant.fn, *variant.inputs(SHAPE)))
    assert [p.name.rsplit("_", 1)[-1] for p in region.backward_programs] == ["dkdv", "dq"]
    variant = VARIANTS["invariant_point_attention"]
    (region,) = assert_fused(fxflash.explain(variant.fn, *variant.inputs(SHAPE)))
    assert not region.backward_programs and "score contractions" in region.backward
    assert "backward: eager recompute" in str(region)


@pytest.mark.fusion_independent
def test_an_op_without_a_derivative_rule_is_named():
    def floor_scores(q, k, v):
        s = torch.floor(q @ k.transpose(-1, -2))
        return torch.softmax(s, -1) @ v

    args = VARIANTS["vanilla"].inputs(SHAPE)
    region, kinds = region_and_kinds(floor_scores, *args)
    with pytest.raises(BackwardRefused, match="floor"):
        lower_backward(region, kinds, PRINTERS)
