"""Fused kernels (Triton interpreter on CPU): one kernel per attention, eager's accuracy."""
import dataclasses
import math
import os
import re
import subprocess
import sys

import pytest
import torch

import fxflash
from fxflash.codegen import emit
from fxflash.patterns.rules import LN2, LOG2E
from fxflash.variants import VARIANTS, Shape
from fxflash.backend import recent_reports
from helpers import assert_accurate, assert_fused

SOFTMAX_FAMILY = [
    "vanilla", "scale_q_first", "manual_softmax", "bshd", "einsum", "einsum_bshd", "gqa_repeat_interleave", "gqa_expand",
    "alibi", "softcap", "causal", "sliding_window", "prefix_lm", "block_causal", "dilated_window",
    "neighbourhood_2d", "document_mask", "key_padding", "key_lengths", "additive_mask", "sdpa_key_lengths",
]
BEYOND_TEMPLATE = [
    "diff_attention", "diff_attention_causal", "diff_transformer", "evoformer_row", "evoformer_col", "sigmoid_attention", "relu_attention",
    "softmax_one", "retention_norm", "invariant_point_attention",
]
FUSED_VARIANTS = SOFTMAX_FAMILY + BEYOND_TEMPLATE
SHAPES = {
    "tiled": Shape(B=1, H=2, Hkv=2, M=32, N=32, D=16, Dv=16),      # multiples of the 16×16 tile
    "odd": Shape(B=2, H=4, Hkv=2, M=19, N=37, D=24, Dv=8),          # none are; M ≠ N, D ≠ Dv
    "mqa": Shape(B=1, H=4, Hkv=1, M=5, N=33, D=8, Dv=12),
}


def _fused_once(fn, args, expected):
    report = fxflash.explain(fn, *args)
    assert len(report.regions) == expected
    assert all(r.fused for r in report.regions), [r.reason for r in report.regions]
    rewritten = report.rewritten.graph
    calls = [n for n in rewritten.nodes if n.op == "call_function" and "fxflash.region" in str(n.target)]
    assert len(calls) == expected
    assert not [n for n in rewritten.nodes if n.op == "call_function" and "bmm" in str(n.target)]
    return report


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", FUSED_VARIANTS, ids=str)
def test_variant_fuses_and_matches_float64(name, shape, dtype):
    variant = VARIANTS[name]
    if name == "document_mask" and shape == "mqa":
        pytest.skip("document ids need M == N")
    args = variant.inputs(SHAPES[shape], dtype)
    _fused_once(variant.fn, args, variant.chains)
    assert_accurate(variant.fn, args, fxflash.optimize(variant.fn)(*args))


def test_head_dim_256_and_non_contiguous_inputs():
    shape = Shape(B=1, H=2, Hkv=2, M=18, N=21, D=256, Dv=200)
    q, k, v = VARIANTS["vanilla"].inputs(shape)
    big = torch.randn(1, 2, 40, 300)
    q = big[:, :, 3:21, 7:263]                       # a strided slice
    k = k.transpose(-1, -2).contiguous().transpose(-1, -2)  # column-major storage
    v = torch.randn(1, 21, 2, 200).transpose(1, 2)   # [B, S, H, D] storage
    fn = VARIANTS["vanilla"].fn
    _fused_once(fn, (q, k, v), 1)
    assert_accurate(fn, (q, k, v), fxflash.optimize(fn)(q, k, v))


def test_head_dim_over_256_is_refused_and_runs_eagerly():
    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=1, H=1, M=4, N=5, D=300, Dv=4))
    report = fxflash.explain(VARIANTS["vanilla"].fn, q, k, v)
    assert not report.regions[0].fused and "dimension elimination" in report.regions[0].reason
    torch.testing.assert_close(fxflash.optimize(VARIANTS["vanilla"].fn)(q, k, v), VARIANTS["vanilla"].fn(q, k, v))


def test_broadcast_bias_and_mask_are_read_with_stride_zero():
    def fn(q, k, v, head_bias, row_bias, col_mask):
        s = q @ k.transpose(-2, -1) + head_bias + row_bias
        s = s.masked_fill(col_mask, float("-inf"))
        return torch.softmax(s, -1) @ v

    q, k, v = VARIANTS["vanilla"].inputs(SHAPES["odd"])
    head_bias = torch.randn(4, 1, 1)            # per head
    row_bias = torch.randn(19, 1).expand(19, 37)  # expanded in memory: stride 0
    col_mask = torch.rand(2, 1, 1, 37) < 0.2
    args = (q, k, v, head_bias, row_bias, col_mask)
    report = _fused_once(fn, args, 1)
    assert "expand" not in report.rewritten.code.split("region")[1]
    assert_accurate(fn, args, fxflash.optimize(fn)(*args))


def test_fully_masked_rows_are_nan_as_in_eager():
    q, k, v = VARIANTS["vanilla"].inputs(SHAPES["odd"])
    mask = torch.ones(2, 1, 19, 37, dtype=torch.bool)
    mask[:, :, 3] = False              # row 3 sees no key: eager gives NaN
    mask[:, :, 5, :16] = False         # row 5 loses its whole first key tile only
    fn = VARIANTS["vanilla"].fn
    fast = fxflash.optimize(fn)
    out = fast(q, k, v, mask)
    assert_fused(fast.report(q, k, v, mask))
    ref = fn(q, k, v, mask)
    assert torch.isnan(out[:, :, 3]).all() and torch.isnan(ref[:, :, 3]).all()
    assert not torch.isnan(out[:, :, 5]).any()
    assert_accurate(fn, (q, k, v, mask), out)


def test_large_negative_bias_after_an_empty_tile():
    def fn(q, k, v, bias):
        return torch.softmax(q @ k.transpose(-2, -1) + bias, -1) @ v

    q, k, v = VARIANTS["vanilla"].inputs(SHAPES["odd"])
    bias = torch.full((37,), -1e9)
    bias[:16] = float("-inf")        # first tile empty, the rest hugely negative
    fast = fxflash.optimize(fn)
    out = fast(q, k, v, bias)
    assert_fused(fast.report(q, k, v, bias))
    assert not torch.isnan(out).any()
    assert_accurate(fn, (q, k, v, bias), out)


def test_training_through_a_fused_region_matches_eager_gradients():
    fn = VARIANTS["alibi"].fn
    args = VARIANTS["alibi"].inputs(SHAPES["odd"])
    leaves = [a.clone().requires_grad_() for a in args]
    ref_leaves = [a.clone().requires_grad_() for a in args]
    fast = fxflash.optimize(fn)
    out = fast(*leaves)
    assert_fused(fast.report(*leaves))
    ref = fn(*ref_leaves)
    grad = torch.randn_like(ref)
    out.backward(grad)
    ref.backward(grad)
    for a, b in zip(leaves, ref_leaves):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4)


def test_generated_source_is_reported_and_printed_op_by_op():
    variant = VARIANTS["softcap"]
    report = fxflash.explain(variant.fn, *variant.inputs(SHAPES["odd"]))
    (region,) = report.regions
    assert "@triton.jit" in region.source and "_fx_tanh" in region.source
    assert "range((lo_t) * BLOCK_N, (n_split) * BLOCK_N, BLOCK_N)" in region.source  # full key tiles
    assert "range((n_split) * BLOCK_N, (hi_t) * BLOCK_N, BLOCK_N)" in region.source  # the partial one
    assert any("homomorphism exp" in step for step in region.steps)
    assert any("deferred" in step for step in region.steps)
    assert "fused" in str(report)


def test_cpu_tensors_without_interpreter_run_eagerly(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    variant = VARIANTS["vanilla"]
    args = variant.inputs(SHAPES["odd"])
    report = fxflash.explain(variant.fn, *args)
    if torch.cuda.is_available():
        pytest.skip("CPU tensors on a GPU machine")
    assert not report.regions[0].fused and "device" in report.regions[0].reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's rule (CPU machines)")
def test_interpreter_that_breaks_on_this_numpy_runs_eagerly(monkeypatch):
    """Triton < 3.7's interpreter beside NumPy >= 2.4: refused by its rule, which says what to
    install; the program runs as eager; a NumPy before 2.4 fuses."""
    import numpy
    import triton

    variant = VARIANTS["vanilla"]
    args = variant.inputs(SHAPES["odd"])
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(numpy, "__version__", "2.4.0")
    (region,) = fxflash.explain(variant.fn, *args).regions
    assert not region.fused and region.rule == "interpreter", region.reason
    assert "numpy<2.4 or triton>=3.7" in region.reason
    torch.testing.assert_close(fxflash.optimize(variant.fn)(*args), variant.fn(*args), rtol=0, atol=0)
    monkeypatch.setattr(numpy, "__version__", "2.3.5")
    assert fxflash.explain(variant.fn, *args).regions[0].fused


@pytest.mark.parametrize("inner", ["eager", "inductor"])
def test_torch_compile_runs_the_fused_kernel(inner):
    torch._dynamo.reset()
    variant = VARIANTS["causal"]
    args = variant.inputs(SHAPES["odd"])
    compiled = torch.compile(variant.fn, backend="fxflash", options={"inner": inner})
    assert_accurate(variant.fn, args, compiled(*args))
    assert_fused(recent_reports[-1])


def test_torch_compile_s_mode_is_the_inner_inductor_s(monkeypatch):
    """``mode="reduce-overhead"`` reaches Inductor as its CUDA graphs setting (stubbed here: no C++
    build on the CPU); with ``inner="eager"`` nothing would compile it, which is an error."""
    import torch._inductor.compile_fx as compile_fx

    patches = []
    monkeypatch.setattr(compile_fx, "compile_fx", lambda gm, inputs, config_patches=None: patches.append(config_patches) or gm)
    torch._dynamo.reset()
    variant = VARIANTS["causal"]
    args = variant.inputs(SHAPES["odd"])
    compiled = torch.compile(variant.fn, backend="fxflash", mode="reduce-overhead")
    assert_accurate(variant.fn, args, compiled(*args))
    assert_fused(recent_reports[-1])
    (patch,) = patches
    assert patch["triton.cudagraphs"] is True
    # fxflash's graph is ATen: Inductor's pre-grad passes, which rewrite torch-level calls, are left out
    assert patch.get("use_pre_grad_passes", False) is False
    with pytest.raises(ValueError, match="inner Inductor"):
        fxflash.backend(inner="eager", mode="reduce-overhead")


def test_one_kernel_source_serves_every_sequence_length():
    variant = VARIANTS["sliding_window"]
    sources = set()
    for m, n in ((17, 17), (40, 40), (33, 50)):
        shape = dataclasses.replace(SHAPES["odd"], M=m, N=n)
        args = variant.inputs(shape)
        (region,) = assert_fused(fxflash.explain(variant.fn, *args))
        sources.add(region.source)
        assert_accurate(variant.fn, args, fxflash.optimize(variant.fn)(*args))
    assert len(sources) == 1 and sources != {""}


@pytest.mark.parametrize("name", ["sliding_window", "gqa_expand", "document_mask", "evoformer_row", "einsum_bshd"])
def test_torch_compile_dynamic_compiles_once_for_every_length(name):
    from fxflash.backend import recent_reports

    torch._dynamo.reset()
    recent_reports.clear()
    variant = VARIANTS[name]
    compiled = torch.compile(variant.fn, backend="fxflash", dynamic=True, options={"inner": "eager"})
    for n in (20, 37, 50):
        args = variant.inputs(dataclasses.replace(SHAPES["odd"], M=n, N=n))
        assert_accurate(variant.fn, args, compiled(*args))
    assert len(recent_reports) == 1
    assert all(r.fused for r in recent_reports[0].regions)


def test_a_symbolic_offset_is_read_at_run_time_so_one_compile_serves_every_length():
    """A causal mask aligned to the end of the keys, as a cache writes it (query i sees the keys up to
    i + N − M), reads N − M: under dynamic shapes the kernel takes it as a run-time parameter, where
    specializing it would guard on its value and compile again at every length."""
    from fxflash.backend import recent_reports

    def cached(q, k, v):
        m, n = q.size(-2), k.size(-2)
        keep = torch.arange(n)[None, :] <= torch.arange(m)[:, None] + (n - m)
        s = (q @ k.transpose(-1, -2) * q.size(-1) ** -0.5).masked_fill(~keep, float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    torch._dynamo.reset()
    recent_reports.clear()
    compiled = torch.compile(cached, backend="fxflash", dynamic=True, options={"inner": "eager"})
    for n in (20, 29, 37):
        args = VARIANTS["vanilla"].inputs(dataclasses.replace(SHAPES["odd"], M=7, N=n))
        assert_accurate(cached, args, compiled(*args))
    assert len(recent_reports) == 1 and all(r.fused for r in recent_reports[0].regions)
    assert "sym0" in recent_reports[0].regions[0].source


def test_index_arithmetic_is_int32_only_while_it_cannot_overflow():
    variant = VARIANTS["alibi"]
    args = variant.inputs(SHAPES["odd"])
    (region,) = fxflash.explain(variant.fn, *args).regions
    assert ".to(tl.int32)" in region.source and "tl.int64) * -8.0" not in region.source
    from fxflash.runtime.op import _REGISTRY

    fast = fxflash.optimize(variant.fn)
    out = fast(*args)
    plan = list(_REGISTRY.values())[-1].plan
    assert plan.index_bound[0] >= 1
    assert plan.int32_index_ok([2, 4, 19, 37]) and not plan.int32_index_ok([1, 1, 2**31, 2**31])
    assert_accurate(variant.fn, args, out)


def test_products_of_indices_are_computed_in_int64():
    def fn(q, k, v):
        i = torch.arange(q.size(-2))[:, None]
        j = torch.arange(k.size(-2))[None, :]
        keep = (i * j) % 3 != 1
        s = (q @ k.transpose(-2, -1)).masked_fill(~keep, float("-inf"))
        return torch.softmax(s, -1) @ v

    args = VARIANTS["vanilla"].inputs(SHAPES["odd"])
    report = fxflash.explain(fn, *args)
    if report.regions[0].fused:
        assert "tl.int64" in report.regions[0].source
        assert_accurate(fn, args, fxflash.optimize(fn)(*args))
    else:
        assert "remainder" in report.regions[0].reason or "printer" in report.regions[0].reason


def test_document_ids_are_compared_per_tile_not_materialized():
    variant = VARIANTS["document_mask"]
    args = variant.inputs(SHAPES["odd"])
    report = fxflash.explain(variant.fn, *args)
    (call,) = [n for n in report.rewritten.graph.nodes if "fxflash.region" in str(n.target)]
    loaded = [n.meta["val"].numel() for n in call.args[1][3:]]
    assert loaded and max(loaded) <= args[3].numel()  # the ids, never an [N, N] mask
    assert_accurate(variant.fn, args, fxflash.optimize(variant.fn)(*args))


@pytest.mark.fusion_independent
def test_tile_configs_fit_shared_memory():
    from fxflash.codegen.emit import tile_configs

    assert all(bm * 128 * 4 < 220 * 1024 for bm, *_ in tile_configs(80, 48, 4))
    assert tile_configs(64, 64, 2)[0] == (128, 64, 4, 3)
    # two streams of head dim 128 with Dv 128: 128×64/8 warps/3 stages needs 208 KB, beyond the
    # default tile's margin, within the tight one: a later candidate, never the default
    split = tile_configs(128, 128, 2, streams=2, accumulators=2)
    assert split[0] != (128, 64, 8, 3) and (128, 64, 8, 3) in split
    assert (128, 64, 8, 3) not in tile_configs(128, 256, 2, streams=2, accumulators=2)  # 256 KB


def test_expanded_gqa_keys_are_read_in_place_not_copied():
    variant = VARIANTS["gqa_expand"]
    args = variant.inputs(SHAPES["odd"])
    report = fxflash.explain(variant.fn, *args)
    assert "clone" not in report.rewritten.code  # neither K nor V is copied before the kernel
    assert_accurate(variant.fn, args, fxflash.optimize(variant.fn)(*args))


def test_attention_weights_shared_by_more_value_heads_are_refused():
    """P ``[B, 1, M, N]`` broadcast against V ``[B, 3, N, Dv]``: the kernel's grid would cover one
    head, the output has three. Refused (this once fused and returned garbage)."""
    def fn(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v

    q, k, v = torch.randn(2, 1, 19, 8), torch.randn(2, 1, 37, 8), torch.randn(2, 3, 37, 8)
    (region,) = fxflash.explain(fn, q, k, v).regions
    assert not region.fused and "dimension demotion" in region.reason
    torch.testing.assert_close(fxflash.optimize(fn)(q, k, v), fn(q, k, v))


def test_differential_attention_is_one_kernel_with_two_streams():
    variant = VARIANTS["diff_attention"]
    args = variant.inputs(SHAPES["odd"])
    report = _fused_once(variant.fn, args, 1)
    (region,) = report.regions
    assert any(step.startswith("streams: 2") for step in region.steps)
    source = region.source
    assert "acc_amax_0" in source and "acc_amax_1" in source and "acc1 = tl.dot" in source


def test_diff_transformers_rmsnorm_runs_in_the_epilogue():
    variant = VARIANTS["diff_transformer"]
    args = variant.inputs(SHAPES["odd"])
    report = _fused_once(variant.fn, args, 1)
    assert "rsqrt" not in report.rewritten.code and "mean" not in report.rewritten.code
    assert "tl.sum(tl.where(dvc < DV" in report.regions[0].source  # the RMS over Dv, in one tile
    assert_accurate(variant.fn, args, fxflash.optimize(variant.fn)(*args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_wide_output_is_split_between_programs(dtype):
    """Two P·V accumulators 256 columns wide (differential attention, V 200 wide) exceed
    ``DV_SPLIT_COLUMNS``: each row tile runs as two programs, each recomputing the scores for its
    half of Dv (the second half's columns past 200 masked). The Diff Transformer's per-head
    RMSNorm needs a whole row of the output in one program: not split."""
    shape = dataclasses.replace(SHAPES["odd"], Dv=100)  # V holds pairs of heads: 200 wide
    for name, split in (("diff_attention", True), ("diff_transformer", False)):
        variant = VARIANTS[name]
        args = variant.inputs(shape, dtype)
        (region,) = fxflash.explain(variant.fn, *args).regions
        assert region.fused and ("dvb = pid % 2" in region.source) == split
        assert_accurate(variant.fn, args, fxflash.optimize(variant.fn)(*args))


def test_differential_attention_with_lambda_computed_from_parameters():
    def diff(q, k, v, lq1, lk1, lq2, lk2, lambda_init=0.8):
        lam = torch.exp(torch.sum(lq1 * lk1, -1)) - torch.exp(torch.sum(lq2 * lk2, -1)) + lambda_init
        b, h2, m, _ = q.shape
        attn = torch.softmax(q @ k.transpose(-1, -2) * q.size(-1) ** -0.5, dim=-1)
        attn = attn.view(b, h2 // 2, 2, m, k.size(-2))
        return (attn[:, :, 0] - lam * attn[:, :, 1]) @ v

    g = torch.Generator().manual_seed(7)
    lambdas = tuple(0.1 * torch.randn(24, generator=g) for _ in range(4))
    args = VARIANTS["diff_attention"].inputs(SHAPES["odd"]) + lambdas
    _fused_once(diff, args, 1)
    assert_accurate(diff, args, fxflash.optimize(diff)(*args))


@pytest.mark.parametrize("name", ["evoformer_row", "evoformer_col"])
def test_evoformer_gate_and_transposes_run_in_the_epilogue(name):
    variant = VARIANTS[name]
    args = variant.inputs(SHAPES["odd"])
    report = _fused_once(variant.fn, args, 1)
    code = report.rewritten.code
    assert "sigmoid" not in code and "mul" not in code.split("region")[1]  # gate fused, never written
    out = fxflash.optimize(variant.fn)(*args)
    assert out.stride() == variant.fn(*args).stride()  # eager's layout of o * sigmoid(gate)
    assert_accurate(variant.fn, args, out)


@pytest.mark.parametrize("name", ["evoformer_row", "evoformer_col"])
@pytest.mark.parametrize("setting, limit", [(True, emit.VECTOR_PRODUCER_MAX_SCORES), (False, emit.VECTOR_PRODUCER_MAX_SCORES),
                                            (True, 100)])
def test_the_mask_bias_is_computed_in_the_kernel_from_the_mask(name, setting, limit, monkeypatch):
    """The Evoformer's mask bias ``INF·(mask − 1)`` ([B, N_seq, 1, 1, S]), elementwise ops whose
    value each tile reads as a vector of keys (emit's vector_producer), is computed by the kernel
    from the mask: eager's kernels for it leave the rewritten graph. With
    config.vector_producers off, or on a frame of more than VECTOR_PRODUCER_MAX_SCORES scores
    (here 100, below both frames), eager computes it and the kernel loads it. Accurate either way."""
    monkeypatch.setattr(fxflash.config, "vector_producers", setting)
    monkeypatch.setattr(emit, "VECTOR_PRODUCER_MAX_SCORES", limit)
    producers = setting and limit > 100
    variant = VARIANTS[name]
    args = variant.inputs(SHAPES["odd"])
    report = _fused_once(variant.fn, args, 1)
    eager_ops = {n.target for n in report.rewritten.graph.nodes if n.op == "call_function"}
    aten = torch.ops.aten
    assert ({aten.sub.Tensor, aten.mul.Tensor} & eager_ops == set()) == producers, eager_ops
    assert_accurate(variant.fn, args, fxflash.optimize(variant.fn)(*args))


def test_a_mask_expanded_from_a_padding_is_computed_in_the_kernel_from_it():
    """``~am.bool()[:, None, None, :].expand(B, H, M, N)``: the ``~`` of a broadcast [B, N] mask is
    computed per tile from the padding, not materialized by eager as a [B, H, M, N] tensor."""
    def padded(q, k, v, am):
        b, h, m, _ = q.shape
        keep = am.bool()[:, None, None, :].expand(b, h, m, k.size(-2))
        s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v

    q, k, v = VARIANTS["vanilla"].inputs(SHAPES["odd"])
    am = torch.ones(q.size(0), k.size(-2), dtype=torch.long)
    am[1, :5] = 0
    args = (q, k, v, am)
    report = _fused_once(padded, args, 1)
    eager_ops = {n.target for n in report.rewritten.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.bitwise_not.default not in eager_ops, eager_ops
    assert_accurate(padded, args, fxflash.optimize(padded)(*args))


def test_an_additive_mask_built_through_an_expand_is_computed_in_the_kernel():
    """transformers' eager attention adds ``where(keep.expand(B, -1, M, N), 0, finfo.min)``, keep
    being a causal mask and a [B, N] padding mask broadcast up: the kernel computes it per tile
    through the expand from the padding, eager's [B, 1, M, N] mask leaves the rewritten graph, and
    its finite fill skips the tiles it masks (tests/test_sparsity.py)."""
    def masked(q, k, v, padding):
        b, _, m, d = q.shape
        n = k.size(-2)
        causal = torch.arange(n)[None, :] <= torch.arange(m)[:, None]
        keep = causal[None, None] & padding[:, None, None, :]
        low = torch.scalar_tensor(torch.finfo(q.dtype).min, dtype=q.dtype)
        bias = torch.where(keep.expand(b, -1, m, n), torch.zeros((), dtype=q.dtype), low)
        return torch.softmax(q @ k.transpose(-1, -2) * d ** -0.5 + bias, dim=-1) @ v

    q, k, v = VARIANTS["vanilla"].inputs(SHAPES["odd"])
    q = q[..., :k.size(-2), :]  # square: every query sees the key at its own position
    padding = torch.ones(q.size(0), k.size(-2), dtype=torch.bool)
    padding[1, :5] = False  # left padding: row 1's first queries see no key (eager averages them all)
    args = (q, k, v, padding)
    report = _fused_once(masked, args, 1)
    eager_ops = {n.target for n in report.rewritten.graph.nodes if n.op == "call_function"}
    assert {torch.ops.aten.where.self, torch.ops.aten.expand.default} & eager_ops == set(), eager_ops
    assert any("block sparsity" in step for step in report.regions[0].steps), report.regions[0].steps
    assert_accurate(masked, args, fxflash.optimize(masked)(*args))


@pytest.mark.fusion_independent
def test_the_vector_producer_limit_reads_symbolic_sizes_without_a_guard():
    """torch.compile with dynamic shapes hands emit symbolic frame sizes: the limit on vector
    producers reads a size by its example value, or as over the limit where it has none, and
    adds no guard (which would recompile the region at every other size)."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    backed = env.create_symintnode(env.create_symbol(300, ConstantSource("n")), hint=300)
    assert emit._size_hint(backed, 0) == 300 and emit._size_hint(7, 0) == 7
    assert emit._frame_scores([env.create_unbacked_symint()]) > emit.VECTOR_PRODUCER_MAX_SCORES
    assert not env.guards


def test_quiet_softmax_of_a_fully_masked_row_is_zero_as_in_eager():
    def softmax_one(q, k, v, keep):
        s = (q @ k.transpose(-2, -1)).masked_fill(~keep, float("-inf"))
        m = s.amax(-1, keepdim=True).clamp(min=0)
        e = torch.exp(s - m)
        return (e / (torch.exp(-m) + e.sum(-1, keepdim=True))) @ v

    q, k, v = VARIANTS["vanilla"].inputs(SHAPES["odd"])
    keep = torch.rand(2, 1, 19, 37, generator=torch.Generator().manual_seed(8)) > 0.3
    keep[:, :, 3] = False
    out = fxflash.optimize(softmax_one)(q, k, v, keep)
    assert fxflash.explain(softmax_one, q, k, v, keep).regions[0].fused
    assert torch.equal(out[:, :, 3], torch.zeros_like(out[:, :, 3]))
    assert_accurate(softmax_one, (q, k, v, keep), out)


@pytest.mark.fusion_independent
def test_plain_mm_chains_and_softmax_over_queries_stay_eager():
    for name in ("mlp", "softmax_over_queries"):
        variant = VARIANTS[name]
        args = variant.inputs(SHAPES["odd"])
        assert all(not r.fused for r in fxflash.explain(variant.fn, *args).regions)
        torch.testing.assert_close(fxflash.optimize(variant.fn)(*args), variant.fn(*args))


def test_a_scalar_scale_of_q_is_applied_to_the_loaded_tile_not_copied():
    variant = VARIANTS["scale_q_first"]
    for dtype in (torch.float32, torch.float16):
        args = variant.inputs(SHAPES["odd"], dtype)
        report = _fused_once(variant.fn, args, 1)
        before = report.rewritten.code.split("region")[0]
        assert "mul" not in before  # q * d**-0.5 is no longer an eager pass over q
        assert "q = (q.to(tl.float32) * " in report.regions[0].source
        assert_accurate(variant.fn, args, fxflash.optimize(variant.fn)(*args))


def _lse_in_the_exponent(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    return torch.exp(s - lse) @ v, lse


def _lse_beside_softmax(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    return torch.softmax(s, -1) @ v, s.logsumexp(-1)


def _lse_by_hand(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    return (e / total) @ v, (m + total.log()).squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("fn", [_lse_in_the_exponent, _lse_beside_softmax, _lse_by_hand], ids=lambda f: f.__name__)
def test_the_row_logsumexp_is_returned_beside_the_output(fn, dtype):
    args = VARIANTS["vanilla"].inputs(SHAPES["odd"], dtype)
    report = _fused_once(fn, args, 1)
    assert "side0_ptr" in report.regions[0].source
    out, lse = fxflash.optimize(fn)(*args)
    assert_accurate(lambda *a: fn(*a)[0], args, out)
    assert_accurate(lambda *a: fn(*a)[1], args, lse)


def test_a_second_score_contraction_is_computed_per_tile():
    variant = VARIANTS["invariant_point_attention"]
    args = variant.inputs(SHAPES["odd"])
    report = _fused_once(variant.fn, args, 1)
    assert "sx0 = tl.dot(qx0, kx0" in report.regions[0].source  # q'·k'ᵀ beside q·kᵀ, never materialized
    assert "(tl.float32) * 2.0).to(" in report.regions[0].source  # the 2· of 2·qp folded into its tile
    assert_accurate(variant.fn, args, fxflash.optimize(variant.fn)(*args))


def test_a_shifted_exp2_is_rescaled_by_exp2():
    """The running maximum's rescale is the homomorphism of the values it scales, found by the
    rules (it once defaulted to exp when the shift was max(amax, 0) under exp2)."""
    def softmax_one_exp2(q, k, v):
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        m = s.amax(-1, keepdim=True).clamp(min=0)
        e = torch.exp2(s - m)
        return (e / (torch.exp2(-m) + e.sum(-1, keepdim=True))) @ v

    args = VARIANTS["vanilla"].inputs(SHAPES["odd"])
    report = _fused_once(softmax_one_exp2, args, 1)
    assert "alpha_amax = tl.exp2(" in report.regions[0].source
    assert_accurate(softmax_one_exp2, args, fxflash.optimize(softmax_one_exp2)(*args))


def test_one_maximum_under_two_homomorphisms_is_refused():
    def mixed(q, k, v):
        s = q @ k.transpose(-2, -1)
        m = s.amax(-1, keepdim=True)
        e = torch.exp(s - m) + torch.exp2(s - m)
        return (e / e.sum(-1, keepdim=True)) @ v

    args = VARIANTS["vanilla"].inputs(SHAPES["odd"])
    (region,) = fxflash.explain(mixed, *args).regions
    assert not region.fused and "two different homomorphisms" in region.reason
    torch.testing.assert_close(fxflash.optimize(mixed)(*args), mixed(*args))


def _tile_max_factors(source: str) -> set:
    """The constants that each key tile's row maximum is multiplied by."""
    return set(re.findall(r"tile_amax\w* = (?:tl\.max\(.*keep_dims=True\)|raw_amax\w*) \* ([-\d.e]+)", source))


def _fast_body(source: str) -> str:
    """A kernel's source without its repair kernel (eager's form, for the rows it flags)."""
    return source.split("@triton.jit\ndef fxflash_region_repair(")[0]


@pytest.mark.parametrize("log2_max", [True, False])
@pytest.mark.parametrize("dtype, fma", [(torch.float16, True), (torch.float32, False)])
def test_exp_is_printed_as_exp2_with_a_fused_multiply_add_for_16_bit_inputs_only(dtype, fma, log2_max, monkeypatch):
    """exp(x - m) = 2^(x·log₂e - m·log₂e): one FMA per score for 16-bit inputs; fp32 keeps
    tl.exp. With log2_max the running maximum is held as m·log₂e: the exponent subtracts it as
    it is, the rescale is 2^(m₂_old - m₂_new), and the epilogue turns it back (· ln 2) once."""
    monkeypatch.setattr(fxflash.config, "log2_max", log2_max)
    variant = VARIANTS["vanilla"]
    args = variant.inputs(SHAPES["odd"], dtype)
    full = fxflash.explain(variant.fn, *args).regions[0].source
    source = _fast_body(full)
    in_log2 = fma and log2_max
    assert source != full  # the repair kernel (eager's form) follows for the rows it flags
    assert ("tl.exp2(" in source) == fma
    assert ("= tl.exp(t" in source) != fma
    assert (f"- mu_amax * {LOG2E!r})" in source) == (fma and not log2_max)
    assert ("alpha_amax = tl.exp2(acc_amax - mu_amax)" in source) == in_log2
    assert (f"acc_amax = acc_amax * {LN2!r}" in source) == in_log2
    assert_accurate(variant.fn, args, fxflash.optimize(variant.fn)(*args))


@pytest.mark.parametrize("name", ["vanilla", "causal", "softcap"])
@pytest.mark.parametrize("fold, log2_max", [(True, True), (True, False), (False, True)])
def test_a_positive_score_scale_is_folded_past_max_and_into_exp2(name, fold, log2_max, monkeypatch):
    """max(c·s) = c·max(s) and exp(c·s - m) = 2^(s·(c·log₂e) - m·log₂e) for c > 0: the max is
    taken over the raw scores (through a -inf mask too) and c·log₂e is the FMA's constant;
    softcap's tanh between the scale and the max keeps the multiply (its cap folds instead). A
    maximum kept in exp2
    units (log2_max) multiplies each tile's maximum by c·log₂e (log₂e alone when nothing is
    folded) instead of c. Same accuracy either way."""
    monkeypatch.setattr(fxflash.config, "fold_scale", fold)
    monkeypatch.setattr(fxflash.config, "log2_max", log2_max)
    variant = VARIANTS[name]
    args = variant.inputs(SHAPES["odd"], torch.float16)
    source = fxflash.explain(variant.fn, *args).regions[0].source
    c = 1 / math.sqrt(args[0].size(-1))
    folded = f"* {c * LOG2E!r} - mu_amax" in source
    assert folded == (fold and name != "softcap")
    outer = 20.0 if name == "softcap" else c  # softcap's max reads cap·tanh(·): the cap folds
    factor = (outer if fold else 1.0) * (LOG2E if log2_max else 1.0)
    assert _tile_max_factors(source) == ({repr(factor)} if factor != 1.0 else set())
    assert_accurate(variant.fn, args, fxflash.optimize(variant.fn)(*args))


def _row_bias(q, k, v):
    """A per-query bias subtracted from the scaled scores (constant along the keys)."""
    r = torch.arange(q.size(-2), device=q.device, dtype=q.dtype)[:, None] / 64
    return torch.softmax((q @ k.transpose(-2, -1)) * 0.125 - r, dim=-1) @ v


def _key_bias(q, k, v):
    """A bias that varies along the keys with no factor constant along them: not folded."""
    b = torch.arange(k.size(-2), device=q.device, dtype=q.dtype) / 64
    return torch.softmax((q @ k.transpose(-2, -1)) * 0.125 + b, dim=-1) @ v


def _tiny_scale_alibi(q, k, v):
    """ALiBi under a scale below BIAS_FOLD_RANGE: ``bias / c`` could overflow, not folded."""
    dist = torch.arange(k.size(-2), device=q.device)[None, :] - torch.arange(q.size(-2), device=q.device)[:, None]
    return torch.softmax((q @ k.transpose(-2, -1)) * 2.0 ** -30 + (0.5 * dist).to(q.dtype), dim=-1) @ v


@pytest.mark.parametrize("fold_add", [True, False])
@pytest.mark.parametrize("fn, c, folds", [(VARIANTS["alibi"].fn, None, True), (_row_bias, 0.125, True),
                                          (_key_bias, 0.125, False), (_tiny_scale_alibi, 2.0 ** -30, False)],
                         ids=["alibi", "row_bias", "key_bias", "tiny_scale"])
def test_a_positive_score_scale_is_folded_past_a_bias_constant_along_the_keys(fn, c, folds, fold_add, monkeypatch):
    """``c·s ± f·b = c·(s ± (f/c)·b)`` with ``f`` constant along the keys (ALiBi's per-head
    slope, a per-query bias): the scale goes into the exponent's multiply-add and each score
    takes one multiply-add for the bias (config.fold_scale_add). A bias varying along the keys
    without such a factor, or a scale outside BIAS_FOLD_RANGE, keeps the multiply. Same
    accuracy either way."""
    monkeypatch.setattr(fxflash.config, "fold_scale_add", fold_add)
    args = VARIANTS["vanilla"].inputs(SHAPES["odd"], torch.float16)
    c = c or 1 / math.sqrt(args[0].size(-1))
    (region,) = assert_fused(fxflash.explain(fn, *args))
    assert (f"* {c * LOG2E!r} - mu_amax" in region.source) == (fold_add and folds)
    assert_accurate(fn, args, fxflash.optimize(fn)(*args))


def test_a_negative_or_tensor_scale_is_not_folded():
    """max(c·x) = c·max(x) needs c > 0: a negative literal, or a scale held in a tensor, keeps
    the multiply per score (and the result stays eager's); each tile's maximum is multiplied by
    log₂e alone (the exp2 units of config.log2_max)."""
    def negative(q, k, v):
        return torch.softmax((q @ k.transpose(-2, -1)) * -0.25, dim=-1) @ v

    def tensor_scale(q, k, v, c):
        return torch.softmax((q @ k.transpose(-2, -1)) * c, dim=-1) @ v

    args = VARIANTS["vanilla"].inputs(SHAPES["odd"], torch.float16)
    for fn, call_args in ((negative, args), (tensor_scale, args + (torch.tensor(0.25, dtype=torch.float16),))):
        source = fxflash.explain(fn, *call_args).regions[0].source
        assert "* 0.3606737602222409 - mu_amax" not in source
        assert _tile_max_factors(source) == {repr(LOG2E)}
        assert_accurate(fn, call_args, fxflash.optimize(fn)(*call_args))


@pytest.mark.parametrize("name, dtype, deferred", [
    ("diff_attention", torch.float32, "0.5"), ("diff_attention", torch.float16, None),
    ("relu_attention", torch.float32, "N"), ("relu_attention", torch.bfloat16, "N")])
def test_a_constant_factor_of_a_term_multiplies_its_finished_accumulator(name, dtype, deferred):
    """``Σ (c·p)·V = c·Σ p·V``: the λ of differential attention and ReLU attention's ``1/N`` go
    after the loop instead of multiplying every score; not for fp16 with ``c < 1`` (the
    unscaled ``p`` cast to fp16 for the dot could overflow where ``c·p`` would not)."""
    variant = VARIANTS[name]
    args = variant.inputs(SHAPES["odd"], dtype)
    source = fxflash.explain(variant.fn, *args).regions[0].source
    c = {"0.5": 0.5, "N": 1 / args[1].size(-2), None: None}[deferred]
    out_line = next(line for line in source.splitlines() if line.strip().startswith("out = "))
    assert out_line.endswith(f" * {c!r}") == (c is not None)
    assert_accurate(variant.fn, args, fxflash.optimize(variant.fn)(*args))


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_epilogues_inputs_are_loaded_before_the_key_loop(prefetch, monkeypatch):
    """The Evoformer's gate (read only after the loop) is loaded before it with
    ``config.prefetch_epilogue``, after it without; the result is eager's either way."""
    monkeypatch.setattr(fxflash.config, "prefetch_epilogue", prefetch)
    variant = VARIANTS["evoformer_row"]
    args = variant.inputs(SHAPES["odd"], torch.float16)
    source = _fast_body(fxflash.explain(variant.fn, *args).regions[0].source)
    loop = source.index("for start_n in range(")
    gate_loads = [i for i in range(len(source)) if source.startswith("tl.load(in5_ptr", i)]
    assert gate_loads and all((i < loop) == prefetch for i in gate_loads)
    assert_accurate(variant.fn, args, fxflash.optimize(variant.fn)(*args))


def _weighted_softmax(q, k, v, w):
    """``e·w / Σ e·w`` with a positive weight per key: the sum's largest term need not be 1."""
    s = q @ k.transpose(-2, -1)
    e = (s - s.amax(-1, keepdim=True)).exp() * w
    return (e / e.sum(-1, keepdim=True)) @ v


@pytest.mark.parametrize("reciprocal", [True, False])
def test_a_softmax_denominator_is_applied_as_one_reciprocal_per_row(reciprocal, monkeypatch):
    """``O / l`` with ``l = Σ E(x − m)`` against the running maximum of x itself (l ≥ 1,
    Region.unit_bounded_sums) is printed ``O·(1/l)``: one reciprocal per row, one multiply per
    element, and no NaN select of its own (l is NaN on a row whose every score is -inf); a sum
    whose terms are weighted keeps its division and select (config.row_reciprocal off: every
    sum does). Rows eager computes as NaN stay NaN; differential attention's two streams each
    take their own reciprocal."""
    monkeypatch.setattr(fxflash.config, "row_reciprocal", reciprocal)
    q, k, v = VARIANTS["vanilla"].inputs(SHAPES["odd"])
    mask = torch.ones(2, 1, 19, 37, dtype=torch.bool)
    mask[:, :, 3] = False
    weight = torch.rand(37) + 0.5
    diff = VARIANTS["diff_attention"]
    diff_args = diff.inputs(SHAPES["odd"], torch.float32)
    cases = [(VARIANTS["vanilla"].fn, (q, k, v, mask), 1), (diff.fn, diff_args, 2),
             (_weighted_softmax, (q, k, v, weight), 0)]
    for fn, args, reciprocals in cases:
        region = fxflash.explain(fn, *args).regions[0]
        assert region.fused
        source = _fast_body(region.source)
        assert source.count("* (1.0 / ") == (reciprocals if reciprocal else 0)
        selects_on_acc = len(re.findall(r"tl\.where\(nanrow_\w+, float\('nan'\), acc\d", source))
        assert selects_on_acc == (0 if reciprocal and reciprocals else max(reciprocals, 1))
        out = fxflash.optimize(fn)(*args)
        ref = fn(*args)
        assert torch.equal(torch.isnan(out), torch.isnan(ref))
        assert_accurate(fn, args, out)


@pytest.mark.parametrize("name,helper,ptx", [("sigmoid_attention", "_fx_sigmoid", "rcp.approx.ftz.f32"),
                                             ("evoformer_row", "_fx_sigmoid", "rcp.approx.ftz.f32"),
                                             ("softcap", "_fx_tanh", "ex2.approx.ftz.f32")])
@pytest.mark.fusion_independent
def test_kernels_with_gpu_helpers_compile_for_hopper(name, helper, ptx):
    """The kernel as printed for a GPU (printers.GPU_HELPERS: libdevice's tanh, a sigmoid from the
    special-function unit's approximate exp2 and reciprocal in inline PTX — what the interpreter
    never runs) compiles for sm_90 with Triton's ptxas, no GPU needed (tests/triton_compile.py)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    here = os.path.dirname(__file__)
    done = subprocess.run([sys.executable, os.path.join(here, "triton_compile.py"), name, "float16"],
                          cwd=here, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"compiled {name}" in done.stdout and helper in done.stdout and ptx in done.stdout, done.stdout
