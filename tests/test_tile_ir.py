"""fxflash.tile: every fused region lowered to its tile program, shown by explain()."""
import dataclasses
import textwrap

import pytest
import torch

import fxflash
from fxflash.tile import ir
from fxflash.variants import VARIANTS, Shape

SHAPE = Shape(B=2, H=4, Hkv=2, M=9, N=13, D=8, Dv=8)
FUSED = [name for name, v in VARIANTS.items() if v.chains]


def _programs(name):
    variant = VARIANTS[name]
    report = fxflash.explain(variant.fn, *variant.inputs(SHAPE))
    fused = [r for r in report.regions if r.fused]
    assert len(fused) == variant.chains, [r.reason for r in report.regions]
    return report, [r.tile_program for r in fused]


@pytest.mark.parametrize("name", FUSED)
def test_every_fused_region_has_a_tile_program_in_explain(name):
    report, programs = _programs(name)
    for program in programs:
        assert isinstance(program, ir.TileProgram)
        kinds = [type(op) for op in program.body]
        assert kinds.count(ir.Dot) >= 1 and ir.Accumulate in kinds
        assert isinstance(program.stores[0], ir.Store) and program.stores[0].tile == "output"
        assert textwrap.indent(str(program), "  ") in str(report)


def test_a_softmax_is_an_online_max_and_a_rescaled_sum_divided_after_the_loop():
    (program,) = _programs("vanilla")[1]
    reductions = [op for op in program.body if isinstance(op, ir.RowReduce)]
    assert [(r.combine, r.rescaled_by) for r in reductions] == [("max", None), ("sum", reductions[0].name)]
    (acc,) = [op for op in program.body if isinstance(op, ir.Accumulate)]
    assert acc.rescaled_by == reductions[0].name
    m, l, finish = program.epilogue  # the running values final, then the output with its row factor
    assert (m, l) == tuple(ir.Finish(r.name, r.name, ()) for r in reductions)
    assert finish == ir.Finish(finish.name, acc.acc, (("div", reductions[1].name),))
    assert not program.skips


def test_masks_become_tile_skips_and_streams_their_own_accumulators():
    (causal,) = _programs("causal")[1]
    assert [type(s) for s in causal.skips] == [ir.SkipIf] and causal.skips[0].masked_when is True
    (diff,) = _programs("diff_attention")[1]
    assert diff.streams == 2
    assert len([op for op in diff.body if isinstance(op, ir.Accumulate)]) == 2
    combine = diff.epilogue[-1]
    assert combine.op == "sum" and [a[0] for a in combine.args] == ["+", "-"]


def test_output_ops_run_after_the_loop_and_row_factors_follow_the_homomorphism():
    (evoformer,) = _programs("evoformer_row")[1]
    assert [op.op for op in evoformer.epilogue if isinstance(op, ir.Map)][-1] == "mul"  # the gate
    (quiet,) = _programs("softmax_one")[1]
    (finish,) = [op for op in quiet.epilogue if isinstance(op, ir.Finish) and op.name != op.acc]
    assert [f[0] for f in finish.factors] == ["shift", "div"]


def test_a_tile_program_is_plain_frozen_data():
    (a,) = _programs("causal")[1]
    (b,) = _programs("causal")[1]
    assert a == b and str(a) == str(b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.name = "other"


def test_a_mask_the_kernel_computes_is_lowered_as_its_ops_over_the_ids():
    """A per-batch document mask ``(ids[:, :, None] == ids[:, None, :]) & causal``: the kernel computes
    it per tile from the ids (tile.outside, the Triton printer's decision too), so the program loads
    the ids as row values and along the keys and holds the comparison, never a [rows, keys] load."""
    def documents(q, k, v, ids):
        causal = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril()
        keep = (ids[:, :, None] == ids[:, None, :]) & causal
        s = q @ k.transpose(-1, -2) / q.size(-1) ** 0.5
        return torch.softmax(s.masked_fill(~keep[:, None], float("-inf")), -1) @ v

    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=2, H=2, Hkv=2, M=13, N=13, D=8, Dv=8))
    ids = torch.arange(13).repeat(2, 1) // 5
    (region,) = fxflash.explain(documents, q, k, v, ids).regions
    loads = [op for op in region.tile_program.body if isinstance(op, ir.Load)]
    assert {op.tile for op in loads} == {"keys", "row values"}, loads  # K, V and the ids
    assert any(isinstance(op, ir.Map) and op.op == "eq" for op in region.tile_program.body)


# Variants whose programs helpers.evaluate_tile_program runs: it reads each tensor by its own shape,
# not through the operands' batch unravelling (GQA, [B, S, H, D] layouts), per-row id loads or streams.
EVALUATED = ["vanilla", "scale_q_first", "manual_softmax", "einsum", "alibi", "softcap", "causal", "sliding_window",
             "prefix_lm", "block_causal", "dilated_window", "neighbourhood_2d", "key_padding", "additive_mask",
             "evoformer_col", "sigmoid_attention", "relu_attention", "retention_norm"]


@pytest.mark.fusion_independent  # lowers the region itself, as the pipeline would
@pytest.mark.parametrize("name", EVALUATED)
def test_the_tile_program_computes_the_variant(name):
    """Run with one tile spanning every row and key, a region's tile program gives the variant's
    output: the program says what the kernel computes, online reductions and deferred factors
    included."""
    from fxflash.codegen.printers import PRINTERS
    from fxflash.tile import lower
    from helpers import analysed, evaluate_tile_program, graph_values, region_and_kinds

    variant = VARIANTS[name]
    inputs = variant.inputs(SHAPE)
    region, kinds = region_and_kinds(variant.fn, *inputs)
    captured, _ = analysed(variant.fn, *inputs)
    names = [n.name for n in captured.graph_module.graph.nodes if n.op == "placeholder"]
    tensors = dict(zip(names, (a.double() if a.is_floating_point() else a for a in inputs)))
    evaluate_tile_program(lower(region, kinds, PRINTERS), tensors, graph_values(captured.graph_module, inputs))
    expected = variant.fn(*(a.double() if a.is_floating_point() else a for a in inputs))
    # fp64, but for values the graph computes outside the program (Index ops, a bias), taken from its fp32 run
    torch.testing.assert_close(tensors[region.output.name].reshape(expected.shape), expected, equal_nan=True,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", FUSED)
def test_the_triton_kernel_is_printed_from_its_tile_program(name, monkeypatch):
    """The printer walks the program explain() shows: every operation before the epilogue has an op
    printer, and an operation removed from the program is missing from the kernel."""
    from fxflash.codegen import emit

    _, programs = _programs(name)
    for program in programs:
        assert {type(op) for op in (*program.prologue, *program.body)} <= set(emit.OP_PRINTERS)
    printed = []
    monkeypatch.setattr(emit._Printer, "print_op", lambda self, op, walk=emit._Printer.print_op: (
        printed.append(op), walk(self, op))[1])
    _programs(name)
    assert set(printed) == {op for program in programs for op in (*program.prologue, *program.body)}


@pytest.mark.fusion_independent  # prints the kernel directly, without the pipeline's fusion switch
def test_removing_an_accumulation_from_the_program_removes_it_from_the_kernel():
    from fxflash.analysis import analyse
    from fxflash.capture import capture
    from fxflash.codegen import emit
    from fxflash.codegen.printers import PRINTERS
    from fxflash.patterns.chains import find_chains
    from fxflash.patterns.region import build_region
    from fxflash.tile.lower import lower

    variant = VARIANTS["vanilla"]
    analysis = analyse(capture(variant.fn, variant.inputs(SHAPE)).graph_module)
    region = build_region(analysis, find_chains(analysis)[0])
    program = lower(region, analysis.kinds, PRINTERS)

    def kernel(program):  # the kernel's own function, without a repair kernel's after it
        return emit.emit_kernel(region, analysis.kinds, program=program).source.split("def fxflash_region_repair")[0]

    assert "acc0 = tl.dot(" in kernel(program)
    without = dataclasses.replace(program, body=tuple(op for op in program.body if not isinstance(op, ir.Accumulate)))
    assert "acc0 = tl.dot(" not in kernel(without)


def test_an_op_its_printer_refuses_is_refused_before_the_kernel_is_printed(monkeypatch):
    from fxflash.codegen import emit

    def scores(q, k, v):
        s = (q @ k.transpose(-1, -2)).div(2.0, rounding_mode="trunc")
        return torch.softmax(s, -1) @ v

    monkeypatch.setattr(emit._Printer, "build", lambda *args: pytest.fail("the kernel was printed"))
    (region,) = fxflash.explain(scores, *(torch.randn(1, 2, 16, 8) for _ in range(3))).regions
    assert not region.fused and region.reason == "code generation: div with rounding mode 'trunc'"


def test_a_value_from_outside_the_region_whose_printer_refuses_is_loaded_not_refused():
    """The refusal before printing covers the region's own ops; a value it reads from outside that
    no printer takes (a rounded division) is computed by eager and loaded, as it was before."""
    from helpers import assert_fused

    def scores(q, k, v, pos):
        bias = (pos[:, None] - pos[None, :]).div(3.0, rounding_mode="trunc")
        return torch.softmax(q @ k.transpose(-1, -2) + bias, -1) @ v

    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    pos = torch.arange(16, dtype=torch.float32) * 1.5
    report = fxflash.explain(scores, q, k, v, pos)
    assert_fused(report, 1)
    torch.testing.assert_close(fxflash.optimize(scores)(q, k, v, pos), scores(q, k, v, pos))
