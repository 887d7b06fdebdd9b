"""fxflash.tile.backward: a region's backward as tile programs (Δ; dK and dV per key tile; dQ per
row tile), lowered from the same region as the forward. Run here by a small evaluator of tile
programs in which one tile holds every row and every key: the gradients it computes are
autograd's, so the programs say the right thing (how they are tiled is the forward's)."""
import pytest
import torch

import fxflash
from fxflash.codegen.printers import PRINTERS
from fxflash.tile import ir, lower
from fxflash.tile.backward import BackwardRefused, lower_backward, with_statistics
from fxflash.variants import VARIANTS, Shape
from helpers import analysed, assert_fused, region_and_kinds

aten = torch.ops.aten
SHAPE = Shape(B=2, H=3, Hkv=3, M=9, N=13, D=8, Dv=8)


def _graph_values(gm, args) -> dict:
    """Every node's value in the captured graph run on ``args``: what an Index op computes from the
    tile's indices, here for the whole frame."""
    values = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            values[n.name] = super().run_node(n)
            return values[n.name]

    Recorder(gm).run(*args)
    return values


def _evaluate(program: ir.TileProgram, tensors: dict, graph: dict) -> dict:
    """Run ``program`` with one tile spanning every row and key (``tensors``: name → value, the
    batch axes leading; ``graph``: the captured graph's values, for Index ops); returns every
    value it named. Deferred row factors are left to Finish, as the kernel leaves them."""
    env = dict(tensors)

    def arg(a):
        return env[a] if isinstance(a, str) and a in env else a

    for op in program.ops():
        if isinstance(op, ir.Index):
            env[op.name] = graph[op.name]
        elif isinstance(op, ir.Load):
            t = tensors[op.tensor] if op.tensor in tensors else graph[op.tensor]
            t = t.transpose(-1, -2) if op.transposed else t
            for kind, c in op.scale:
                t = t * c if kind == "mul" else t / c
            env[op.name] = t.unsqueeze(-1) if op.tile == "row values" else t
        elif isinstance(op, ir.Dot):
            env[op.name] = env[op.a] @ env[op.b].transpose(-1, -2)
        elif isinstance(op, ir.Map):
            if op.form.startswith("row factors deferred"):
                env[op.name] = env[op.args[0]]
            elif op.op == "sum":
                env[op.name] = env[op.args[0]].sum(op.args[1], keepdim=True)
            else:
                env[op.name] = getattr(aten, op.op)(*map(arg, op.args))
        elif isinstance(op, ir.RowReduce):
            env[op.name] = getattr(torch, "amax" if op.combine == "max" else op.combine)(env[op.source], -1, keepdim=True)
        elif isinstance(op, ir.Accumulate):
            p = env[op.p].transpose(-1, -2) if op.transposed else env[op.p]
            env[op.acc] = env.get(op.acc, 0) + op.sign * (p @ env[op.v])
        elif isinstance(op, ir.Finish):
            value = env[op.acc]
            for kind, row in op.factors:
                value = value * env[row] if kind == "mul" else value / env[row]
            env[op.name] = value
        elif isinstance(op, ir.Store):
            tensors[op.tensor] = env[op.value].squeeze(-1) if op.tile == "row values" else env[op.value]
    return env


@pytest.mark.fusion_independent  # lowers the region itself, as the pipeline would
@pytest.mark.parametrize("name", ["vanilla", "softcap", "alibi", "scale_q_first", "causal", "key_padding", "additive_mask"])
def test_the_backward_programs_compute_autograds_gradients(name):
    variant = VARIANTS[name]
    inputs = variant.inputs(SHAPE)
    region, kinds = region_and_kinds(variant.fn, *inputs)   # fp32: the dtypes fxflash fuses
    captured, _ = analysed(variant.fn, *inputs)
    args = tuple(a.double() if a.is_floating_point() else a for a in inputs)   # evaluated in fp64
    names = [n.name for n in captured.graph_module.graph.nodes if n.op == "placeholder"]
    tensors = dict(zip(names, args))
    graph = _graph_values(captured.graph_module, inputs)
    forward = with_statistics(lower(region, kinds, PRINTERS), region)
    _evaluate(forward, tensors, graph)
    leaves = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
    out = variant.fn(*leaves)
    torch.testing.assert_close(tensors[region.output.name].reshape(out.shape), out.detach())
    grad = torch.randn_like(out)
    tensors[f"d{region.output.name}"] = grad.reshape(tensors[region.output.name].shape)
    for program in lower_backward(region, kinds, PRINTERS):
        _evaluate(program, tensors, graph)
    expected = torch.autograd.grad(out, [leaves[names.index(o.node.name)] for o in (region.q, region.k, region.v)],
                                   grad)
    for operand, want in zip((region.q, region.k, region.v), expected):
        got = tensors[f"d{operand.node.name}"]
        got = got.transpose(-1, -2) if operand.transposed != (operand is region.k) else got
        torch.testing.assert_close(got.reshape(want.shape), want)


def test_explain_shows_each_region_s_backward_or_why_not():
    """Three programs for a softmax region (dK and dV loop over the row tiles, skipping those the
    forward's tile masks skip); a refusal naming the reason for one outside that form."""
    variant = VARIANTS["causal"]
    (region,) = assert_fused(fxflash.explain(variant.fn, *variant.inputs(SHAPE)))
    delta, dkdv, dq = region.backward
    assert (delta.loop, dkdv.per, dkdv.loop, dq.per, dq.loop) == ("", "key", "row", "row", "key")
    assert [op.unit for op in dkdv.skips] == ["row"] and [op.unit for op in dq.skips] == ["key"]
    assert [op.transposed for op in dkdv.body if isinstance(op, ir.Accumulate)] == [True, True]
    assert "backward: 3 tile programs" in str(region)
    variant = VARIANTS["sigmoid_attention"]
    (region,) = assert_fused(fxflash.explain(variant.fn, *variant.inputs(SHAPE)))
    assert not region.backward and "softmax" in region.backward_refusal
    assert "backward: not expressed as tile programs" in str(region)


@pytest.mark.fusion_independent
def test_an_op_without_a_derivative_rule_is_named():
    def floor_scores(q, k, v):
        s = torch.floor(q @ k.transpose(-1, -2))
        return torch.softmax(s, -1) @ v

    args = VARIANTS["vanilla"].inputs(SHAPE)
    region, kinds = region_and_kinds(floor_scores, *args)
    with pytest.raises(BackwardRefused, match="floor"):
        lower_backward(region, kinds, PRINTERS)
