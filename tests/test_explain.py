"""explain(): each transformation's sketches before and after, and the memory-traffic estimate."""
import re

import pytest
import torch

import fxflash
from fxflash.analysis.sketch import dim_name
from fxflash.variants import VARIANTS, Shape

SHAPE = Shape(B=2, H=3, Hkv=3, M=40, N=24, D=8, Dv=16)
GQA = Shape(B=2, H=4, Hkv=2, M=40, N=24, D=8, Dv=16)


def _parse(sketch: str) -> tuple[list, list]:
    """``"[(d1, d2/BM), (d6)] pass 2"`` → (["d1", "d2/BM"], ["d6"])."""
    par, red = re.match(r"\[\((.*?)\), \((.*?)\)\]", sketch).groups()
    return [d for d in par.split(", ") if d], [d for d in red.split(", ") if d]


def _fused_region(name, shape=SHAPE, dtype=torch.float32):
    variant = VARIANTS[name]
    args = variant.inputs(shape, dtype)
    report = fxflash.explain(variant.fn, *args)
    (region,) = report.regions
    assert region.fused, region.reason
    return region, args


@pytest.mark.parametrize("name", ["vanilla", "manual_softmax", "causal"])
def test_softmax_sketches_through_the_three_transformations(name):
    region, _ = _fused_region(name)
    steps = {t.name: t for t in region.transformations}
    assert list(steps)[:3] == ["dimension demotion", "algebraic rewriting", "dimension elimination"]
    n = dim_name(region.chain.demoted)
    producer, consumer = region.chain.first.name, region.chain.second.name
    d = _parse(region.sketches[producer])[1][0]
    dv = _parse(region.sketches[consumer])[0][-1]

    demotion = steps["dimension demotion"]
    before, after = _parse(demotion.before[producer]), _parse(demotion.after[producer])
    assert n in before[0] and n not in after[0] and after[1] == [n, d]
    assert consumer not in demotion.before  # the consumer already reduces N

    algebraic = steps["algebraic rewriting"]
    assert algebraic.summary == f"passes over {n}: 3 → 1"  # amax; Σ exp(x - amax); ÷ and P·V
    assert algebraic.before[consumer].endswith("pass 3") and algebraic.after[consumer].startswith("pass 1")
    assert all(v.startswith("pass 1") or v == "after the loop" for v in algebraic.after.values())

    elimination = steps["dimension elimination"]
    tiled = _parse(elimination.after[consumer])
    assert tiled[1] == [f"{n}/BN"] and tiled[0][-1].endswith("/BM") and dv not in tiled[0]
    assert d not in _parse(elimination.after[producer])[1]
    assert elimination.summary.startswith(f"region [({', '.join(tiled[0])}), ({n}/BN)]")


def test_row_sum_without_a_maximum_needs_two_passes_before_rewriting():
    region, _ = _fused_region("retention_norm")
    (algebraic,) = [t for t in region.transformations if t.name == "algebraic rewriting"]
    assert algebraic.summary.endswith(": 2 → 1")


def test_streams_and_sparsity_are_reported_as_the_tile_program():
    diff, _ = _fused_region("diff_attention", Shape(B=1, H=2, Hkv=2, M=16, N=16, D=8, Dv=8))
    sliding, _ = _fused_region("sliding_window")
    assert any(r.startswith("streams: 2") for r in diff.transformations[-1].rules)
    assert sliding.transformations[-1].name == "tile program"
    assert any(r.startswith("block sparsity") for r in sliding.transformations[-1].rules)


@pytest.mark.parametrize("name, shape", [("vanilla", SHAPE), ("gqa_expand", GQA)])
def test_fused_traffic_reads_each_input_once_and_writes_the_output(name, shape):
    region, (q, k, v) = _fused_region(name, shape, torch.float16)
    out = VARIANTS[name].fn(q, k, v)
    assert region.traffic.fused == sum(t.numel() * t.element_size() for t in (q, k, v, out))
    scores = shape.B * shape.H * shape.M * shape.N * 2  # one fp16 score matrix
    assert region.traffic.eager >= region.traffic.fused + 4 * scores  # S, exp(S), P written and read
    assert region.traffic.saved == region.traffic.eager - region.traffic.fused
    assert str(region.traffic) in str(region)


def test_index_expressions_count_as_eager_traffic_only():
    plain, _ = _fused_region("vanilla")
    masked, _ = _fused_region("causal")
    assert masked.traffic.fused == plain.traffic.fused
    assert masked.traffic.eager > plain.traffic.eager


def test_refused_candidates_have_no_transformations():
    def softmax_over_queries(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-2) @ v

    q = torch.randn(1, 2, 8, 4)
    (region,) = fxflash.explain(softmax_over_queries, q, q, q).regions
    assert not region.fused and region.transformations == [] and region.traffic is None
    assert region.rule == "online reduction" and region.stopped_at == "amax"


def test_the_report_opens_with_a_verdict_per_region():
    """str(report): the count, then one line per region — fused, or the rule that refused it —
    before the details."""
    from fxflash.variants import VARIANTS, Shape

    def over_queries(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-2) @ v

    args = VARIANTS["vanilla"].inputs(Shape(B=1, H=2, Hkv=2, M=8, N=8, D=8, Dv=8))
    head = str(fxflash.explain(VARIANTS["vanilla"].fn, *args)).splitlines()[:2]
    assert head[0].endswith("1 fused") and head[1].strip().startswith("1.") and head[1].endswith("fused, one kernel")
    line = str(fxflash.explain(over_queries, *args)).splitlines()[1]
    assert "not fused (chain discovery: amax reduces an axis" in line and "chain discovery: chain discovery" not in line


class _NormBetweenLinears(torch.nn.Module):
    """Attention, then RMSNorm between two linear layers: ``mm → mean → mm`` over the weight's
    output features, a chain of the same shape as attention's over keys."""

    def __init__(self, width=16):
        super().__init__()
        torch.manual_seed(0)
        self.up = torch.nn.Linear(width, 2 * width, bias=False)
        self.down = torch.nn.Linear(2 * width, width, bias=False)

    def forward(self, q, k, v):
        attn = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
        return _norm_between(attn, self.up.weight, self.down.weight)


def _norm_between(x, up, down):
    h = x @ up.t()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)) @ down.t()


@pytest.mark.fusion_independent
def test_a_chain_over_a_weights_features_is_not_an_attention_candidate():
    """Chain discovery takes a norm over the output features of a module's parameter (a linear
    layer's weight, transposed) as not attention: explain() lists the attention alone. The same ops
    on weights passed as plain tensors are a candidate (which the rules refuse)."""
    module = _NormBetweenLinears()
    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=2, H=2, Hkv=2, M=9, N=9, D=16, Dv=16))
    report = fxflash.explain(module, q, k, v)
    assert len(report.regions) == 1 and "amax" in report.regions[0].verdict()

    def as_tensors(q, k, v, up, down):
        return _norm_between(torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v, up, down)

    weights = (module.up.weight.detach().clone(), module.down.weight.detach().clone())
    assert len(fxflash.explain(as_tensors, q, k, v, *weights).regions) == 2


class _LearnedMemory(torch.nn.Module):
    """Attention over a learned key-value memory: the key side is a parameter, the normalization a
    softmax over its slots."""

    def __init__(self, slots=11, width=16):
        super().__init__()
        torch.manual_seed(0)
        self.keys = torch.nn.Parameter(torch.randn(slots, width))
        self.values = torch.nn.Parameter(torch.randn(slots, width))

    def forward(self, q):
        return torch.softmax(q @ self.keys.t(), dim=-1) @ self.values


@pytest.mark.fusion_independent
def test_a_softmax_over_a_learned_memory_is_an_attention_candidate():
    (q, _, _) = VARIANTS["vanilla"].inputs(Shape(B=2, H=2, Hkv=2, M=9, N=9, D=16, Dv=16))
    report = fxflash.explain(_LearnedMemory(), q)
    assert len(report.regions) == 1 and "amax" in report.regions[0].verdict()
