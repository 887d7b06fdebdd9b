"""The Gluon kernel (codegen/gluon.py) without a GPU: which regions get one and why others do
not, what it prints, that it compiles for sm_90, and the launch-time checks. The kernels run
in test_gpu.py (Hopper only: Triton's interpreter cannot run Gluon)."""
import itertools
import math
import re
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fxflash
from fxflash.codegen import gluon
from fxflash.runtime import gluon_launch, tuning
from fxflash.codegen.gluon import GL, STORE_DRAIN, emit_gluon
from fxflash.codegen.gluon_plan import (BARRIER_BYTES, GLUON_CONFIGS, LOADER_REGS, PERSISTENT_CONFIGS, STREAM_CONFIGS,
                                        fits_shared_memory, gluon_tile, register_budget, row_sums_by_mma, shared_bytes)
from fxflash.runtime.gluon_launch import GLUON_MIN_KEYS, _rows_total, _rows_view_refusal, candidates, launch_refusal
from fxflash.codegen.printers import Unprintable
from fxflash.config import config
from fxflash.patterns.rules import LOG2E
from fxflash.variants import VARIANTS, Shape
from helpers import compile_for_hopper, needs_gluon, region_and_kinds

SHAPE = Shape(B=2, H=4, Hkv=2, M=40, N=48, D=64, Dv=64)


def region_of(name, dtype=torch.bfloat16, shape=SHAPE):
    variant = VARIANTS[name]
    (region,) = fxflash.explain(variant.fn, *variant.inputs(shape, dtype)).regions
    assert region.fused
    return region


@needs_gluon
@pytest.mark.parametrize("name,printed", [
    ("vanilla", []),
    ("softcap", ["_fx_tanh("]),
    ("alibi", ["gl.exp2("]),                       # the slopes 2^(-8h/H), computed in the kernel
    ("causal", ["float('-inf')"]),
    ("document_mask", ["gl.load(in", "sum0_lo"]),  # ids loaded per tile, summarized per key tile
    ("gqa_expand", ["k_nb2", "k_sb2"]),             # K's broadcast head axis, unravelled for its rows
    ("scale_q_first", ["(s * 0.125)"]),              # q·2⁻³ folded into the scores: exact
    ("bshd", ["q_col", "k_col"]),                    # heads inside a row: read at a column of it
    ("evoformer_row", ["(s * 0.125)", "_fx_sigmoid(", "out_s4", "gate0 = q_bufs.index("]),  # the gate in the epilogue
    ("sdpa_key_lengths", ["gl.where(l_sum == 0, 0.0, 1.0 / l_sum)"]),  # safe softmax
])
def test_softmax_regions_get_a_gluon_kernel_printed_from_their_ops(name, printed):
    region = region_of(name)
    source = region.gluon_source
    assert "gl.warp_specialize(" in source and "warpgroup_mma(" in source
    assert all(text in source for text in printed), [t for t in printed if t not in source]
    assert "tl." not in source.replace("tl.PropagateNan", "").replace("import triton.language as tl", "")
    assert region.steps[-1].startswith("Gluon kernel (Hopper): printed")
    assert f"on rows of at least {GLUON_MIN_KEYS} keys" in region.steps[-1]
    dense = name not in ("causal", "document_mask", "sdpa_key_lengths")  # no tile masks
    assert region.steps[-1].endswith("on a persistent grid on shorter rows") == dense


@needs_gluon
def test_a_score_divided_by_a_0_d_tensor_gets_a_gluon_kernel():
    """A temperature held in a 0-d tensor is loaded as it is: a value with no rows or keys is not a
    TMA tile (the printer once indexed its missing axes and failed)."""
    def tempered(q, k, v, t):
        return torch.softmax(q @ k.transpose(-1, -2) / t, -1) @ v

    q, k, v = VARIANTS["vanilla"].inputs(SHAPE, torch.bfloat16)
    (region,) = fxflash.explain(tempered, q, k, v, torch.tensor(0.7, dtype=torch.bfloat16)).regions
    assert region.steps[-1].startswith("Gluon kernel (Hopper): printed"), region.steps[-1]


@needs_gluon
@pytest.mark.parametrize("name,dtype,reason", [
    ("sigmoid_attention", torch.bfloat16, "not one maximum and one sum"),
    ("softmax_one", torch.bfloat16, "row ops after the loop"),
    ("vanilla", torch.float32, "not all bf16 or all fp16"),
])
def test_other_regions_say_why_they_have_no_gluon_kernel(name, dtype, reason):
    variant = VARIANTS[name]
    region = fxflash.explain(variant.fn, *variant.inputs(SHAPE, dtype)).regions[0]
    assert region.fused and not region.gluon_source
    assert region.steps[-1].startswith("Gluon kernel (Hopper): none") and reason in region.steps[-1]


@pytest.mark.fusion_independent  # reads a region directly
@needs_gluon
@pytest.mark.parametrize("name,reason", [
    ("causal", None),
    ("evoformer_row", "the training forward of a region with ops after P·V"),
    ("diff_attention", "row statistics beside row values, of softmax streams or of an exp2"),
])
def test_what_the_training_forward_cannot_store_is_refused_before_printing(name, reason):
    """The Gluon training forward stores one softmax's running max and sum (STATISTICS_STORE):
    ``refusal(r, statistics=True)`` says which regions it cannot serve, before any printing, for
    regions whose inference kernel it prints."""
    variant = VARIANTS[name]
    region, _ = region_and_kinds(variant.fn, *variant.inputs(SHAPE, torch.bfloat16))
    assert gluon.refusal(region) is None
    assert gluon.refusal(region, statistics=True) == reason


@pytest.mark.fusion_independent  # reads a region directly
@needs_gluon
def test_the_training_forward_stores_m_1_over_l_and_o_in_fp32():
    """The Gluon training forward stores what the Triton one does (KernelPlan.training_outputs):
    each row's m and 1/l, and O in fp32, from which the backward takes Δ."""
    from fxflash.codegen import emit_kernel
    from fxflash.tile.backward import statistics_nodes

    variant = VARIANTS["causal"]
    region, kinds = region_and_kinds(variant.fn, *variant.inputs(SHAPE, torch.bfloat16))
    training = emit_kernel(region, kinds, statistics=statistics_nodes(region))
    gluon.attach(training, region, kinds, statistics=True)
    assert training.training_outputs == gluon.TRAINING_OUTPUTS and training.gluon is not None
    assert all(line in training.gluon.source for line in gluon.STATISTICS_STORE)
    assert "side2_ptr + gl.expand_dims(stat_at, 1) * DV" in training.gluon.source


@pytest.mark.fusion_independent
@needs_gluon
@pytest.mark.parametrize("lam,combined", [(0.5, "out = out - other * 0.5"), (-0.25, "out = out + other * 0.25")])
def test_two_softmax_streams_get_one_consumer_each(lam, combined):
    """Differential attention: consumer s runs stream s over the item's 64 rows (its Q tile and
    K tiles from head 2h + s, the shared V tile), stream 1 hands its normalized output to stream
    0 in shared memory and stream 0 stores ``O₀ − λ·O₁``; two-stream configurations only."""
    variant = VARIANTS["diff_attention"]
    args = variant.inputs(Shape(B=2, H=4, Hkv=4, M=40, N=48, D=64, Dv=64), torch.bfloat16)
    region, kinds = region_and_kinds(variant.fn, *args, lam)
    plan = emit_gluon(region, kinds)
    assert (plan.streams, plan.d, plan.dv) == (2, 64, 128)
    src = plan.source
    assert "k_bufs.index(idx * 2 + 1)" in src and "[k_row_1 + key, k_col_1]" in src
    assert "q_bufs.index(qb * CONSUMERS + 1)" in src and "k_bufs.index(idx * 2 + WG)" in src
    assert "c_buf.store(out)" in src and combined in src
    assert "((fb0) * FB1 + fb1) * 2 + 1" in src  # stream 1's batch index: head 2h + 1
    assert "NBUF: gl.constexpr = v_bufs.type.shape[0]" in src  # K's buffers: one per stream and slot
    frame = [2, 4, 200, 256]
    assert "softmax stream" in launch_refusal(plan, list(args), frame, GLUON_CONFIGS[64][0])
    two = STREAM_CONFIGS[128][2]  # one CTA per item: 64 rows of both streams
    assert gluon_launch.grid(two, frame) == (2 * 4 * 4,)                       # 4 blocks of 64 rows
    assert gluon_launch.grid(("gluon", 2, 128, 2, 0, 1), frame) == (2 * 4 * 2,)  # without streams: 128


@needs_gluon
def test_causal_streams_share_one_tile_range():
    """Causal differential attention: the key tiles past the CTA's rows are skipped for both
    streams (one tile range per item, from the masks' interval tests), so only one-CTA-per-item
    configurations run it; each stream evaluates the mask in its own score function."""
    variant = VARIANTS["diff_attention_causal"]
    args = variant.inputs(Shape(B=2, H=4, Hkv=4, M=200, N=256, D=64, Dv=64), torch.bfloat16)
    plan = emit_gluon(*region_and_kinds(variant.fn, *args))
    assert plan.streams == 2 and not plan.dense and "_score_full" not in plan.source
    assert "def _score_1(" in plan.source and plan.source.count("float('-inf')") >= 2
    assert "live = (t < n_tiles)" in plan.source
    steps = fxflash.explain(variant.fn, *args).regions[0].steps
    assert steps[-1].endswith("one consumer warp group per softmax stream; the tuner times it beside the Triton "
                              "kernel, one CTA per item (its masks skip tiles)"), steps[-1]
    assert "every item to visit every key tile" in launch_refusal(plan, list(args), [2, 4, 200, 256],
                                                                  STREAM_CONFIGS[128][0])


@pytest.mark.fusion_independent  # reads a region directly
@needs_gluon
def test_streams_whose_masks_differ_by_head_are_refused_before_printing():
    """Both streams' consumers visit one tile range: a window whose width differs between a pair's
    heads (a per-head tensor) would skip different key tiles per stream, so the region has no Gluon
    kernel, decided from the region (REGION_RULES), and keeps its Triton kernel."""
    def diff_window(q, k, v, w):
        b, h2, m, _ = q.shape
        i = torch.arange(m)[:, None]
        j = torch.arange(k.size(-2))[None, :]
        s = (q @ k.transpose(-1, -2) * q.size(-1) ** -0.5).masked_fill(~((j <= i) & (i - j < w)), float("-inf"))
        attn = torch.softmax(s, dim=-1).view(b, h2 // 2, 2, m, k.size(-2))
        return (attn[:, :, 0] - 0.5 * attn[:, :, 1]) @ v

    q = torch.randn(2, 8, 64, 64, dtype=torch.bfloat16)
    v = torch.randn(2, 4, 64, 128, dtype=torch.bfloat16)
    widths = torch.tensor([16, 32] * 4).view(8, 1, 1)
    region, _ = region_and_kinds(diff_window, q, q, v, widths)
    assert region.split is not None and region.tile_masks
    assert gluon.refusal(region) == "two softmax streams with masks whose key tiles depend on the stream's heads"
    same = torch.full((8, 1, 1), 16)
    assert gluon.refusal(region_and_kinds(diff_window, q, q, v, same[:1])[0]) is None  # one width for all heads


@needs_gluon
def test_one_softmax_times_a_number_keeps_its_triton_kernel():
    """A single softmax stream weighted by a number other than 1 is refused (only differential
    attention's weighted streams were run through the Gluon kernel on a GPU)."""
    def half_softmax(q, k, v):
        return (torch.softmax(q @ k.transpose(-1, -2) * 0.125, dim=-1) * 0.5) @ v

    region = fxflash.explain(half_softmax, *VARIANTS["vanilla"].inputs(SHAPE, torch.bfloat16)).regions[0]
    assert region.fused and not region.gluon_source
    assert region.steps[-1].endswith("not exp(scores − max) / sum"), region.steps[-1]


@needs_gluon
def test_a_stream_weight_that_is_a_tensor_is_named():
    """λ as a 0-d tensor (the Diff Transformer computes it from parameters): the Gluon kernel
    weighs the streams by numbers only, so the region keeps its Triton kernel and says why."""
    variant = VARIANTS["diff_attention"]
    region = fxflash.explain(variant.fn, *variant.inputs(SHAPE, torch.bfloat16), torch.tensor(0.3)).regions[0]
    assert region.fused and not region.gluon_source
    assert region.steps[-1].endswith("not exp(scores − max) / sum times a number"), region.steps[-1]


@needs_gluon
@pytest.mark.parametrize("name,d,tile_ops", [
    ("scale_q_first", 128, f"* {128 ** -0.5!r}"),
    ("evoformer_row", 128, f"/ {math.sqrt(128)!r}"),
    ("scale_q_first", 64, None),   # 1/8, a power of two: folded into the scores
    ("evoformer_row", 64, None),
])
def test_a_q_scale_other_than_a_power_of_two_is_applied_to_the_q_tile(name, d, tile_ops):
    """``q / √128`` rounds in eager; each consumer applies it to its Q tile in shared memory and
    rounds it to Q's dtype the same way, and the scores carry no factor (gluon.q_tile_scale).
    A power of two rounds nothing and is folded into the scores instead (gluon.score_scale)."""
    source = region_of(name, shape=Shape(B=1, H=2, M=40, N=40, D=d, Dv=d)).gluon_source
    assert ("q.store(" in source) == (tile_ops is not None)
    if tile_ops:
        assert f"q_in = (q_in.to(gl.float32) {tile_ops}).to(q_in.dtype)\n    q.store(q_in)\n    fence_async_shared()\n" \
            in source
        assert "(s * " not in source
    else:
        assert "(s * 0.125)" in source


@needs_gluon
def test_q_scale_ops_that_round_are_each_applied_to_the_q_tile():
    """``q * 3 / 12`` is a power of two as a product, but eager rounds after each op: both are
    applied to the Q tile, in order, each rounded; none is folded into the scores."""
    def scaled_twice(q, k, v):
        return torch.softmax((q * 3 / 12) @ k.transpose(-2, -1), dim=-1) @ v

    (region,) = fxflash.explain(scaled_twice, *VARIANTS["vanilla"].inputs(SHAPE, torch.bfloat16)).regions
    assert ("q_in = (q_in.to(gl.float32) * 3.0).to(q_in.dtype)\n    q_in = (q_in.to(gl.float32) / 12.0).to(q_in.dtype)\n"
            "    q.store(q_in)") in region.gluon_source
    assert "(s * " not in region.gluon_source


def test_a_k_scale_other_than_a_power_of_two_is_refused():
    """Eager rounds ``k / 3`` to K's dtype; K's tiles are shared by every consumer and read as
    stored, so the Gluon kernel is refused and the Triton kernel (which rounds it) runs."""
    def k_scaled(q, k, v):
        return torch.softmax(q @ (k / 3).transpose(-2, -1), dim=-1) @ v

    args = VARIANTS["vanilla"].inputs(SHAPE, torch.bfloat16)
    (region,) = fxflash.explain(k_scaled, *args).regions
    assert region.fused and not region.gluon_source
    assert "K scaled before the matmul by a factor other than a positive power of two" in region.steps[-1]


@pytest.mark.fusion_independent
def test_a_sum_not_over_the_shifted_exponential_is_named():
    """Quiet softmax sums exp(x − m) plus exp(−m): softmax_of names why that is no softmax (its
    rule is checked after the region rules, which refuse this region first for its row ops)."""
    from fxflash.codegen.gluon import NOT_EXP_OF_SHIFT, softmax_of

    variant = VARIANTS["softmax_one"]
    region, _ = region_and_kinds(variant.fn, *variant.inputs(SHAPE, torch.bfloat16))
    assert softmax_of(region) == NOT_EXP_OF_SHIFT


def test_head_dims_outside_64_and_128_get_none():
    region = region_of("vanilla", shape=Shape(D=80, Dv=80))
    assert not region.gluon_source and "head dims" in region.steps[-1]


@pytest.mark.fusion_independent
@needs_gluon
@pytest.mark.parametrize("d,dv", [(64, 128), (128, 64)])
def test_v_may_have_a_head_dim_other_than_q_and_k(d, dv):
    """Q and K ``[.., D]``, V ``[.., Dv]`` (differential attention written as two attention calls:
    D = 64, Dv = 128): V's TMA block and buffers are Dv wide and so is the accumulator
    (``DV`` from V's descriptor); the configurations are those of the wider head dim, whose
    accumulator or Q and K tiles they were sized for, and its shared memory counts V at Dv."""

    variant = VARIANTS["vanilla"]
    shape = Shape(B=2, H=4, Hkv=2, M=40, N=256, D=d, Dv=dv)
    plan = emit_gluon(*region_and_kinds(variant.fn, *variant.inputs(shape, torch.bfloat16)))
    assert (plan.d, plan.dv, plan.configs_dim) == (d, dv, 128)
    assert "DV: gl.constexpr = v_desc.block_type.shape[1]" in plan.source and "gl.zeros([BM, DV]" in plan.source
    tile = PERSISTENT_CONFIGS[128][0]
    assert gluon_launch._blocks(plan, tile)[:3] == ([64, d], [tile[2], d], [tile[2], dv])
    assert (shared_bytes(tile, d, 2, 0, dv, mma_row_sum=True) - shared_bytes(tile, d, mma_row_sum=True)
            == tile[3] * tile[2] * (dv - d) * 2)


@pytest.mark.fusion_independent
def test_the_printers_spell_gluon_s_names_and_refuse_a_function_gluon_lacks():
    """The same printers print both kernels, each with its backend's names (printers.Namespace):
    no line is translated after it is printed."""
    from fxflash.codegen.printers import PRINTERS, TL

    node = types.SimpleNamespace(kwargs={}, args=(None, None))
    maximum = PRINTERS[torch.ops.aten.maximum]
    assert maximum(["a", "b"], node, TL) == "tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)"
    assert maximum(["a", "b"], node, GL) == "gl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)"
    assert PRINTERS[torch.ops.aten.erf](["x"], node, GL) == "gl.erf(x)"
    assert PRINTERS[torch.ops.aten.sigmoid](["x"], node, GL) == "_fx_sigmoid(x)"   # a helper Gluon defines (HELPERS)
    with pytest.raises(Unprintable, match="tl.cumsum"):
        GL.cumsum


@needs_gluon
@pytest.mark.parametrize("name,dtype,d,tile,full_tiles", [
    ("vanilla", "bfloat16", 64, (3, 128, 3, 0, 1), "0"),
    ("causal", "bfloat16", 64, (3, 128, 3, 1, 1), "1"),
    ("document_mask", "float16", 64, (2, 128, 3, 0, 1), "1"),
    ("alibi", "bfloat16", 64, (1, 128, 3, 0, 2), "1"),
    ("softcap", "bfloat16", 128, (2, 128, 3, 0, 1), "0"),
    ("gqa_expand", "bfloat16", 128, (1, 64, 3, 0, 2), "0"),
    ("bshd", "float16", 128, (2, 128, 3, 0, 1), "0"),
    ("evoformer_row", "bfloat16", 64, (2, 128, 3, 0, 1), "0"),
    ("evoformer_row", "bfloat16", 64, (1, 128, 3, 0, 2), "0"),
    ("vanilla", "bfloat16", 64, (3, 128, 3, 1, 1, 1), "0"),     # persistent grids
    ("evoformer_row", "float16", 64, (1, 128, 2, 0, 2, 1), "0"),
    ("evoformer_row", "bfloat16", 64, (1, 128, 2, 0, 2, 1), "0"),  # the pair bias by TMA: fits two CTAs
    ("evoformer_row", "bfloat16", 64, (2, 128, 3, 0, 1, 1), "0"),  # a gate on two consumers' persistent grid
    ("additive_mask", "bfloat16", 128, (2, 128, 2, 0, 1), "0"),
    ("softcap", "bfloat16", 128, (2, 128, 2, 0, 1, 1), "0"),
    ("evoformer_row", "bfloat16", 128, (2, 128, 2, 0, 1), "0"),  # q / √128 applied to the Q tile
    ("evoformer_row", "bfloat16", 128, (1, 64, 2, 0, 2, 1), "0"),
    ("scale_q_first", "float16", 128, (1, 64, 3, 0, 2), "0"),
    ("vanilla", "bfloat16", (64, 128), (2, 128, 3, 0, 1), "0"),    # V wider than Q and K
    ("additive_mask", "bfloat16", (64, 128), (1, 64, 2, 0, 2, 1), "0"),
    ("vanilla", "bfloat16", (128, 64), (2, 128, 2, 0, 1, 1), "0"),
    ("diff_attention", "bfloat16", 64, (2, 128, 2, 0, 1, 1, 2), "0"),   # two streams, V 128 wide
    ("diff_attention", "float16", 64, (2, 128, 2, 1, 1, 0, 2), "0"),
    ("diff_attention", "bfloat16", 128, (2, 64, 2, 0, 1, 0, 2), "0"),   # V 256 wide
    ("diff_attention_causal", "bfloat16", 64, (2, 128, 2, 0, 1, 0, 2), "0"),  # streams, tiles skipped
    ("evoformer_row", "bfloat16", 64, (1, 64, 2, 0, 2, 1, 1, 128), "0"),  # 128 rows per consumer
    ("vanilla", "float16", 64, (1, 64, 2, 0, 2, 1, 1, 128), "0"),
    ("sdpa_key_lengths", "bfloat16", 64, (3, 128, 3, 1, 1), "1"),  # the safe softmax's empty rows
])
@pytest.mark.fusion_independent
def test_gluon_kernel_compiles_for_hopper(name, dtype, d, tile, full_tiles):
    """Each configuration the tuner may time compiles for sm_90 (layouts, shared memory,
    register budget), with Triton's ptxas and no GPU; its shared memory is the buffers that
    shared_bytes counts (plus at most 1 KB of barriers), and it sums rows by ``P·1`` on the
    tensor cores where row_sums_by_mma says so (one CTA per SM). ``d``: a head dim, or
    (Q and K's, V's)."""
    d, dv = d if isinstance(d, tuple) else (d, None)
    compiled = compile_for_hopper(name, dtype, d, tile, dv=dv, FXFLASH_GLUON_FULL_TILES=full_tiles)
    shared, buffers = map(int, re.search(r"shared (\d+) bytes \(buffers (\d+)\)", compiled).groups())
    assert buffers <= shared <= buffers + BARRIER_BYTES, compiled
    assert ("by P·1 on the tensor cores" in compiled) == row_sums_by_mma(("gluon", *tile), True), compiled
    assert ("output stored by TMA" in compiled) == (name == "evoformer_row"), compiled  # its gate in the Q buffers


@needs_gluon
@pytest.mark.parametrize("name,d,tile", [("causal", 64, (2, 128, 2, 0, 1)), ("vanilla", 128, (2, 64, 2, 1, 1, 1))])
@pytest.mark.fusion_independent
def test_the_training_forward_compiles_for_hopper(name, d, tile):
    """The training forward's kernel, which also stores m, 1/l and O in fp32 (STATISTICS_STORE),
    compiles for sm_90 within the register budget: no spills."""
    compiled = compile_for_hopper(name, "bfloat16", d, tile, training=True)
    assert "compiled " + name + " (training)" in compiled and "spills 0/0" in compiled, compiled


@needs_gluon
@pytest.mark.parametrize("tma, vectors, producers", [(True, True, True), (True, True, False), (True, False, True),
                                                     (False, True, True)])
@pytest.mark.fusion_independent
def test_score_tiles_and_the_gate_arrive_by_tma(tma, vectors, producers, monkeypatch):
    """The Evoformer's pair bias ([B, 1, H, S, S]: a [rows, keys] tile per key tile) is read by the
    loader's TMA into a ring beside K and V (GluonPlan.tiles, config.gluon_tma_tiles), with
    config.gluon_tma_key_vectors its mask bias too (one [1, keys] row per key tile for all the
    item's rows, GluonPlan.vectors: the mask [B, N_seq, S], from which the kernel computes the
    bias, config.vector_producers; with that off the bias [B, N_seq, S] that eager computed, read
    through its view [B, N_seq, 1, 1, S]), and its gate ([B, N_seq, S, H, D], rows on axis
    2) by a second loader warp into the item's Q buffers once its last Q·Kᵀ is done
    (GluonPlan.gates), each located as Q's block is; with a setting off, those inputs are loaded per
    element. The consumers read the tiles and the gate with ordinary loads, so they release those
    buffers to the loader's TMA after a proxy fence (gluon._release; without it, wrong results
    measured on the H200)."""
    monkeypatch.setattr(config, "gluon_tma_tiles", tma)
    monkeypatch.setattr(config, "gluon_tma_key_vectors", vectors)
    monkeypatch.setattr(config, "vector_producers", producers)
    variant = VARIANTS["evoformer_row"]
    args = variant.inputs(Shape(B=2, H=4, M=256, N=256, D=64, Dv=64), torch.bfloat16)
    plan = emit_gluon(*region_and_kinds(variant.fn, *args))
    shape = lambda i: tuple(plan.input_nodes[i].meta["val"].shape)  # noqa: E731
    vector = tuple(args[3].shape)   # the mask, or the bias eager computed from it
    assert [shape(i) for i in plan.tiles] == [vector] * (tma and vectors) + [tuple(args[4].shape)] * tma
    assert [shape(i) for i in plan.vectors] == [vector] * (tma and vectors)
    assert ("(x1 - 1)" in plan.source) == producers  # INF·(mask − 1) computed by the kernel
    assert ("tile0_bufs = gl.allocate_shared_memory(tile0_desc.dtype, [NBUF, 1, BLOCK_N]" in plan.source) == (tma and vectors)
    gates = [(shape(i), axis) for i, axis in plan.gates]
    assert gates == ([(tuple(args[5].shape), 2)] if tma else [])
    loads = re.findall(r"gl\.load\((in\d+)_ptr", plan.source)
    assert len(loads) == (3 - 2 * tma - (tma and vectors)), loads
    assert ("tile0_bufs.index(idx)" in plan.source) == tma
    assert ("mbarrier.wait(q_free.index(qb)" in plan.source) == tma  # the loader waits for the last Q·Kᵀ
    assert f"TILE_LOADS = gl.constexpr({tma})" in plan.source
    assert plan.source.count("_release(kv_empty.index(") == 2
    assert ("_release(q_empty.index(qb), True)" in plan.source) == tma
    assert fits_shared_memory(("gluon", 1, 64, 2, 0, 2, 1, 1, 128), shared_bytes(("gluon", 1, 64, 2, 0, 2, 1, 1, 128), 64, 2,
                              len(plan.tiles) - len(plan.vectors), None, len(plan.vectors),
                                                                                   mma_row_sum=plan.options.gluon_mma_row_sum))


@pytest.mark.fusion_independent
@pytest.mark.parametrize("setting", [True, False])
def test_a_gated_output_is_stored_by_tma_through_the_q_buffers(setting, monkeypatch):
    """The Evoformer's output ([B, N_seq, S, H, D]: its rows on axis 2 after the code's transposes,
    the head dim innermost) is stored by TMA (GluonPlan.store, config.gluon_tma_store): each
    consumer writes its rows into its Q buffer once it has read the gate from there, copies them
    out and, at its next item's first Q·Kᵀ, waits for the copy to have read the buffer and gives
    it back (gluon.STORE_DRAIN; the last copy waited for after its walk); at a launch whose M is not a multiple
    of the CTA's rows they are stored per element (gluon_launch.stores_by_tma: a compile-time
    switch). Vanilla attention, without a gate in its Q buffers, stores per element."""
    monkeypatch.setattr(config, "gluon_tma_store", setting)
    variant = VARIANTS["evoformer_row"]
    plan = emit_gluon(*region_and_kinds(variant.fn, *variant.inputs(Shape(B=2, H=4, M=256, N=256, D=64, Dv=64),
                                                                     torch.bfloat16)))
    assert plan.store == (2 if setting else None)
    assert len(re.findall(r"tma\.\w+\(out_desc, \[out_row \+ WG \* BM, out_col\], o_buf\)", plan.source)) == setting
    assert ("if not O_TMA:\n        if QB > 1:\n            _release(q_empty.index(qb), True)" in plan.source) == setting
    copy = plan.source.find("o_buf)\n") if setting else -1
    assert (STORE_DRAIN in plan.source[:copy]) == setting  # waited for at the next item, not after the copy
    assert plan.source.count("tma.store_wait(0)") == 4 * setting  # the drain and the end of each consumer's walk
    vanilla = emit_gluon(*region_and_kinds(VARIANTS["vanilla"].fn, *VARIANTS["vanilla"].inputs(SHAPE, torch.bfloat16)))
    assert vanilla.store is None and "out_desc" not in vanilla.source
    tiles = (("gluon", 1, 128, 2, 0, 2, 1), ("gluon", 1, 64, 2, 0, 2, 1, 1, 128), ("gluon", 3, 128, 3, 0, 1))
    assert [gluon_launch.stores_by_tma(plan, tile, [2, 4, 256, 256]) for tile in tiles] == [setting, setting, False]
    assert not gluon_launch.stores_by_tma(plan, tiles[0], [2, 4, 200, 256])


@pytest.mark.fusion_independent
@needs_gluon
def test_the_output_stored_by_tma_is_one_row_matrix_with_a_consumer_s_rows_per_block():
    """The output's TMA descriptor (the last) reads it as [rows, H·D] with one consumer's rows per
    block; an output in a layout the printer's rule excludes (its head dim not innermost) is a
    bug that is said, never a store to the wrong place."""
    variant = VARIANTS["evoformer_row"]
    plan = emit_gluon(*region_and_kinds(variant.fn, *variant.inputs(Shape(B=2, H=4, M=256, N=256, D=64, Dv=64),
                                                                     torch.bfloat16)))
    inputs = [torch.empty_strided(n.meta["val"].shape, n.meta["val"].stride(), dtype=n.meta["val"].dtype)
              for n in plan.input_nodes]
    out = torch.empty(*plan.input_nodes[plan.gates[0][0]].meta["val"].shape, dtype=torch.bfloat16)  # the gate's shape
    for tile, rows in ((("gluon", 1, 128, 2, 0, 2, 1), 64), (("gluon", 1, 64, 2, 0, 2, 1, 1, 128), 128)):
        desc = gluon_launch.descriptors(plan, tile, inputs, out)[-1]
        assert list(desc.shape) == [math.prod(out.shape[:3]), math.prod(out.shape[3:])] and desc.block_shape == [rows, 64]
    with pytest.raises(RuntimeError, match="bug"):
        gluon_launch.descriptors(plan, ("gluon", 1, 128, 2, 0, 2, 1), inputs, out.transpose(-1, -2).contiguous().mT)
    assert gluon_launch.grid(("gluon", 1, 64, 2, 0, 2, 0, 1, 128), [2, 4, 200, 256]) == (2 * 4 * 2,)  # 128-row items


@pytest.mark.fusion_independent
@needs_gluon
def test_row_sums_are_added_up_with_the_setting_off():
    compiled = compile_for_hopper("vanilla", "bfloat16", 64, (3, 128, 3, 0, 1), FXFLASH_GLUON_MMA_ROW_SUM="0")
    assert "row sums added up" in compiled, compiled


@pytest.mark.fusion_independent
def test_rows_view_follows_tma_rules():
    q = torch.empty(2, 4, 100, 64, dtype=torch.bfloat16)
    assert _rows_view_refusal(q, 64) is None and _rows_total(q) == 800
    k = torch.empty(2, 2, 1, 96, 64, dtype=torch.bfloat16).expand(2, 2, 3, 96, 64)  # GQA: a broadcast head
    assert _rows_view_refusal(k, 64) is None and _rows_total(k) == 4 * 96
    bshd = torch.empty(2, 100, 4, 64, dtype=torch.bfloat16).transpose(1, 2)  # heads 64 apart, rows 256
    assert _rows_view_refusal(bshd, 64) is None and _rows_total(bshd) == 200  # a [200, 256] matrix
    evo = torch.empty(2, 3, 100, 4, 64, dtype=torch.bfloat16)
    col = evo.permute(0, 2, 3, 1, 4)  # Evoformer's column attention: rows are N_seq, 25 600 wide
    assert _rows_view_refusal(col, 64) is None and _rows_total(col) == 2 * 3
    halves = torch.empty(2 * 12800 + 64, dtype=torch.bfloat16).as_strided((2, 4, 100, 64), (12800, 32, 128, 1))
    assert "inside one row" in _rows_view_refusal(halves, 64)  # heads 32 apart: 3·32 + 64 > 128
    odd = torch.empty(4000, dtype=torch.bfloat16).as_strided((2, 10, 64), (136, 128, 1))
    assert "neither whole rows apart nor inside one row" in _rows_view_refusal(odd, 64)
    tail = torch.empty(2, 100, 4, 64, dtype=torch.bfloat16)[:, :, :2].transpose(1, 2)  # the last row's end
    assert _rows_view_refusal(tail, 64) is None                                        # is inside
    short = torch.empty(2 * 100 * 256 - 128, dtype=torch.bfloat16).as_strided((2, 2, 100, 64), (25600, 64, 256, 1))
    assert "outside its storage" in _rows_view_refusal(short, 64)
    assert "not contiguous" in _rows_view_refusal(q.transpose(-1, -2), 100)
    assert "16-byte aligned" in _rows_view_refusal(torch.empty(2, 4, 100, 68, dtype=torch.bfloat16)[..., :64], 64)


def _permuted(data, d):
    """A contiguous storage of 2–4 axes (sizes 1–4, the head dim last), its axes permuted with
    D kept last, optionally sliced along one axis and given a broadcast (stride-0) axis."""
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=2, max_size=4))
    base = torch.arange(math.prod(sizes) * d, dtype=torch.float32).view(*sizes, d).to(torch.bfloat16)
    t = base.permute(*data.draw(st.permutations(range(len(sizes)))), len(sizes))
    if data.draw(st.booleans()):
        axis = data.draw(st.integers(0, len(sizes) - 1))
        if t.shape[axis] > 1:
            t = t.narrow(axis, data.draw(st.integers(0, t.shape[axis] - 1)), 1)
    return t.unsqueeze(0).expand(2, *t.shape) if data.draw(st.booleans()) else t


def _strided(data, d):
    """Any strides: rows ``sr`` apart (a multiple of 8 elements, 16 bytes), batch axes at
    multiples of sr or of 8 elements (inside a row, across rows, overlapping), over a storage
    that ends at the view's last element or a little after it."""
    sr = 8 * data.draw(st.integers(d // 8, 4 * d // 8))
    batch = data.draw(st.lists(st.tuples(st.integers(1, 4), st.one_of(
        st.integers(0, 4).map(lambda k: k * sr), st.integers(1, 3 * sr // 8).map(lambda k: 8 * k))),
        min_size=1, max_size=2))
    shape = [n for n, _ in batch] + [data.draw(st.integers(1, 3)), d]
    strides = [st_ for _, st_ in batch] + [sr, 1]
    last = sum((n - 1) * s for n, s in zip(shape, strides))
    storage = torch.arange(last + 1 + data.draw(st.sampled_from([0, sr])), dtype=torch.float32).to(torch.bfloat16)
    return storage.as_strided(shape, strides)


@pytest.mark.fusion_independent
@settings(max_examples=300, deadline=None)
@given(st.data())
def test_every_batch_item_is_a_block_of_the_rows_matrix(data):
    """Where _rows_view_refusal accepts a strided operand, the [R, sr] matrix that TMA reads
    holds each batch item's [rows, D] block at row ``off // sr`` and column ``off % sr`` (off:
    the item's element offset), as the kernel computes them; the layouts users write
    (_permuted) are accepted unless their rows matrix would end past the storage."""
    d = data.draw(st.sampled_from([8, 16]))
    users = data.draw(st.booleans())
    t = (_permuted if users else _strided)(data, d)
    why = _rows_view_refusal(t, d)
    if why is not None:  # a permuted layout only where a one-row axis has the largest stride
        assert not users or "outside its storage" in why, (t.shape, t.stride(), why)
        return
    sr = t.stride(-2)
    rows = t.as_strided((_rows_total(t), sr), (sr, 1), t.storage_offset())
    for index in itertools.product(*(range(n) for n in t.shape[:-2])):
        off = sum(i * st_ for i, st_ in zip(index, t.stride()))
        block = rows[off // sr: off // sr + t.shape[-2], off % sr: off % sr + d]
        assert torch.equal(block, t[index]), (t.shape, t.stride(), index)


@pytest.mark.fusion_independent
def test_heads_inside_a_row_are_accepted_in_the_layouts_users_write():
    """[B, S, H, D] transposed to [B, H, S, D], GQA's expanded K of that layout, and the
    Evoformer's row and column views: no refusal (the property test above checks the blocks)."""
    bshd = torch.empty(2, 40, 4, 16, dtype=torch.bfloat16)
    gqa_k = torch.empty(2, 40, 2, 16, dtype=torch.bfloat16).transpose(1, 2)[:, :, None].expand(2, 2, 2, 40, 16)
    evo = torch.empty(1, 3, 40, 4, 16, dtype=torch.bfloat16)
    for t in (bshd.transpose(1, 2), gqa_k, evo.transpose(-2, -3), evo.permute(0, 2, 3, 1, 4)):
        assert _rows_view_refusal(t, 16) is None, (t.shape, t.stride())


@needs_gluon
def test_gluon_configurations_are_offered_on_hopper_only():
    from fxflash.runtime.op import _REGISTRY

    args = VARIANTS["vanilla"].inputs(SHAPE, torch.bfloat16)
    fxflash.optimize(VARIANTS["vanilla"].fn)(*args)
    gplan = list(_REGISTRY.values())[-1].plan.gluon  # the op just registered
    assert gplan is not None and gplan.operands == (0, 1, 2)
    assert candidates(gplan, list(args), [2, 4, 40, 2048]) == []  # CPU tensors
    assert tuning.describe(GLUON_CONFIGS[64][1]) == \
        "Gluon: 3 consumer warp groups × 64 rows, 128-key tiles, 3 K/V buffers, ping-pong"
    assert tuning.describe(("gluon", 1, 64, 3, 0, 2)) == \
        "Gluon: 1 consumer warp group × 64 rows, 64-key tiles, 3 K/V buffers, 2 CTAs per SM"


@needs_gluon
def test_the_tuner_times_one_cta_per_item_on_long_rows_and_persistent_grids_on_short_ones(monkeypatch):
    """One-CTA-per-item configurations are offered from GLUON_MIN_KEYS keys up, persistent ones
    below (a Hopper launch stubbed), none with ``config.gluon`` off."""
    from fxflash.runtime.op import _REGISTRY

    args = VARIANTS["vanilla"].inputs(SHAPE, torch.bfloat16)
    fxflash.optimize(VARIANTS["vanilla"].fn)(*args)
    gplan = list(_REGISTRY.values())[-1].plan.gluon
    monkeypatch.setattr(gluon_launch, "launch_refusal", lambda *a: None)
    assert candidates(gplan, list(args), [2, 4, 40, GLUON_MIN_KEYS]) == list(GLUON_CONFIGS[64])
    assert candidates(gplan, list(args), [2, 4, 40, GLUON_MIN_KEYS - 128]) == list(PERSISTENT_CONFIGS[64])
    monkeypatch.setattr(config, "gluon", False)
    assert candidates(gplan, list(args), [2, 4, 40, GLUON_MIN_KEYS]) == []


@needs_gluon
def test_a_persistent_grid_serves_regions_without_tile_masks(monkeypatch):
    """A persistent configuration is refused where items differ in their key tiles (tile masks:
    each CTA's walk would follow its own items' ranges, and the loader warp cannot classify
    tiles); its grid is at most ``ctas`` CTAs per multiprocessor, coprime with the row blocks
    where the last one leaves a consumer idle."""
    from fxflash.runtime.op import _REGISTRY

    tile = ("gluon", 1, 128, 2, 0, 2, 1)
    plans = {}
    for name in ("vanilla", "evoformer_row", "causal", "document_mask"):
        args = VARIANTS[name].inputs(SHAPE, torch.bfloat16)
        fxflash.optimize(VARIANTS[name].fn)(*args)
        plans[name] = (list(_REGISTRY.values())[-1].plan.gluon, list(args))
    assert {name: gplan.dense for name, (gplan, _) in plans.items()} == \
        {"vanilla": True, "evoformer_row": True, "causal": False, "document_mask": False}
    for name in ("causal", "document_mask"):
        assert "persistent grid" in gluon_launch.launch_refusal(*plans[name], [2, 4, 40, 256], tile)
    assert "Hopper" in gluon_launch.launch_refusal(*plans["vanilla"], [2, 4, 40, 256], tile)
    # a region with an output gate: persistent grids of any number of consumers (gluon._release)
    frame = [2, 4, 40, 256]
    assert "Hopper" in gluon_launch.launch_refusal(*plans["evoformer_row"], frame, ("gluon", 2, 128, 2, 0, 1, 1))
    assert "Hopper" in gluon_launch.launch_refusal(*plans["evoformer_row"], frame, tile)
    assert "Hopper" in gluon_launch.launch_refusal(*plans["evoformer_row"], frame, ("gluon", 2, 128, 2, 0, 1))
    assert "Hopper" in gluon_launch.launch_refusal(*plans["vanilla"], frame, ("gluon", 2, 128, 2, 0, 1, 1))
    monkeypatch.setattr(gluon_launch, "_multiprocessors", lambda index: 3)
    assert gluon_launch.grid(tile, [2, 4, 1000, 256]) == (6,)           # 128 items, 2 CTAs on each of 3 SMs
    assert gluon_launch.grid(tile, [1, 1, 100, 256]) == (2,)            # fewer items than CTAs
    assert gluon_launch.grid(tile[:-1], [2, 4, 1000, 256]) == (128,)   # one CTA per item
    # three consumers (192 rows): 1024 rows end in a block of 64 where two consumers idle, so
    # the grid is coprime with the 6 row blocks (5 CTAs, not 6); 960 rows end in a full block
    three = ("gluon", 3, 128, 3, 0, 2, 1)
    assert gluon_launch.grid(three, [4, 1024, 256]) == (5,)
    assert gluon_launch.grid(three, [4, 960, 256]) == (6,)
    assert gluon_launch.grid(three, [4, 1100, 256]) == (6,)             # the last block's 140 rows: none idles
    assert gluon_launch.constexprs(tile)["PERSISTENT"] == 1 and gluon_launch.constexprs(tile[:-1])["PERSISTENT"] == 0
    assert tuning.describe(tile).endswith("2 CTAs per SM, persistent")


@needs_gluon
def test_a_pinned_gluon_configuration_that_cannot_run_says_why():
    fast = fxflash.optimize(VARIANTS["vanilla"].fn)
    args = VARIANTS["vanilla"].inputs(SHAPE, torch.bfloat16)
    with tuning.pinned(GLUON_CONFIGS[64][0]), pytest.raises(ValueError, match="needs a Hopper GPU"):
        fast(*args)


@pytest.mark.fusion_independent
def test_every_configuration_fits_its_share_of_an_sm():
    """Each configuration's CTAs per SM fit Hopper's registers and shared memory together, and
    the consumers keep at least the three-consumer kernel's 160 registers (no spills at 160,
    tests/gluon_compile.py)."""
    for d in GLUON_CONFIGS:
        for tile in GLUON_CONFIGS[d] + PERSISTENT_CONFIGS[d]:
            t = gluon_tile(tile)
            maxnreg, regs = register_budget(t.consumers, t.ctas)
            assert t.ctas * maxnreg * (4 * t.consumers + 4) * 32 <= 65536, tile
            assert 160 <= regs <= 256 and regs * t.consumers * 128 + LOADER_REGS * 128 <= maxnreg * (4 * t.consumers + 4) * 32
            assert fits_shared_memory(tile, shared_bytes(tile, d, mma_row_sum=True)), tile
    for dv, tiles in STREAM_CONFIGS.items():  # differential attention: D = Dv / 2, or D = Dv = 128
        for tile in tiles:
            assert register_budget(2)[1] == 240, tile
            assert fits_shared_memory(tile, shared_bytes(tile, max(64, dv // 2), 2, 0, dv, mma_row_sum=True)), tile
    assert any(fits_shared_memory(tile, shared_bytes(tile, 128, mma_row_sum=True)) for tile in STREAM_CONFIGS[128])


@needs_gluon
def test_tma_descriptors_read_each_operand_as_one_row_matrix():
    """Q, K and V as [rows, D] matrices with a consumer's rows (Q) or a key tile (K, V) per TMA
    block; a remembered launch's descriptors pointed at new inputs of the same layout are the
    descriptors those inputs get."""
    from fxflash.runtime.op import _REGISTRY

    args = VARIANTS["gqa_expand"].inputs(SHAPE, torch.bfloat16)
    fxflash.optimize(VARIANTS["gqa_expand"].fn)(*args)
    gplan = list(_REGISTRY.values())[-1].plan.gluon
    tile = ("gluon", 1, 64, 3, 0, 2)
    inputs = list(args)
    fresh = gluon_launch.descriptors(gplan, tile, inputs)
    assert [list(d.shape) for d in fresh] == [[2 * 4 * 40, 64], [2 * 2 * 48, 64], [2 * 2 * 48, 64]]  # K, V: Hkv heads
    assert [d.block_shape for d in fresh] == [[64, 64], [64, 64], [64, 64]]
    others = [t.clone() for t in inputs]
    expected = gluon_launch.descriptors(gplan, tile, others)
    rebased = [gluon_launch.rebased(d, others[i]) for d, i in zip(fresh, gplan.operands)]
    for new, want, old in zip(rebased, expected, fresh):
        assert new.base.data_ptr() == want.base.data_ptr() != old.base.data_ptr()
        assert (list(new.shape), list(new.strides), new.block_shape, new.layout, new.padding) == \
               (list(want.shape), list(want.strides), want.block_shape, want.layout, want.padding)
        assert new.base.dtype == want.base.dtype
    detached = gluon_launch.rebased(fresh[0], None)  # what a bound launch keeps: no input
    assert detached.base is None and fresh[0].base is not None and detached.shape == fresh[0].shape
    assert gluon_launch.grid(tile, [2, 4, 40, 64]) == (8,)
    assert gluon_launch.constexprs(tile)["CONSUMERS"] == 1


@needs_gluon
@pytest.mark.fusion_independent
@pytest.mark.parametrize("spelling", ["causal", "where", "additive", "additive_minus_inf"])
def test_every_tile_mask_skips_tiles_in_the_gluon_kernel(spelling):
    """Every tile mask skips tiles in the Gluon kernel as in the Triton one: an additive one under
    the launch's bound on the scores added to (the tile range both share), a ``finfo.min`` one with
    its rows whose maximum is not above ``-T`` flagged for the repair kernel (``m`` is in log2
    units: the threshold times log2 e)."""
    from test_sparsity import _additive_minus_inf, _finite_fill

    fn = {"causal": VARIANTS["causal"].fn, "additive_minus_inf": _additive_minus_inf}.get(spelling)
    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=1, H=2, Hkv=2, M=48, N=48, D=64, Dv=64), torch.bfloat16)
    args = (q, k, v)
    if fn is None:
        fn, args = _finite_fill(spelling), (q, k, v, torch.ones(1, 48, dtype=torch.bool))
    region, kinds = region_and_kinds(fn, *args)
    assert region.tile_masks
    gplan = emit_gluon(region, kinds)
    assert not gplan.dense
    threshold = min(m.threshold for m in region.tile_masks) if spelling in ("where", "additive") else None
    assert (f"~(m > {-threshold * LOG2E!r})" in gplan.source) if threshold else "~(m > " not in gplan.source
