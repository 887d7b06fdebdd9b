"""The fused backward (codegen/backward.py, runtime/backward.py): every variant whose region has a
softmax of the scores computes dQ, dK and dV with generated kernels, run here in Triton's
interpreter, as accurate as eager autograd against float64; the rest recompute eagerly and say
why (RegionReport.backward)."""
import os
import subprocess
import sys

import pytest
import torch

import fxflash
from fxflash.runtime import op
from fxflash.variants import VARIANTS, Shape
from helpers import assert_fused, assert_gradients_accurate

SHAPE = Shape(B=2, H=4, Hkv=2, M=29, N=37, D=24, Dv=12)   # odd sizes, GQA, M ≠ N, D ≠ Dv
# the variants whose every region's backward is fused; the others, with the reason they give
FUSED = ["vanilla", "scale_q_first", "manual_softmax", "bshd", "einsum", "einsum_bshd", "gqa_repeat_interleave",
         "gqa_expand", "alibi", "softcap", "causal", "sliding_window", "prefix_lm", "block_causal",
         "dilated_window", "neighbourhood_2d", "document_mask", "key_padding", "key_lengths", "additive_mask",
         "sigmoid_attention", "relu_attention",   # P an elementwise function of the scores
         "evoformer_row", "evoformer_col",        # a gate and a transpose after P·V
         "sdpa_key_lengths",                      # SDPA's safe softmax: a row every key masks is 0
         "softmax_one",                           # the quiet softmax: exp(x) / (1 + Σ exp(x))
         "retention_norm"]                        # x / max(Σ|x|, 1)
EAGER = {"invariant_point_attention": "several score contractions"}


def _fused_backward(name, args):
    regions = assert_fused(fxflash.explain(VARIANTS[name].fn, *args), VARIANTS[name].chains)
    return [r.backward for r in regions]


# every variant in fp32; the 16-bit dtypes on one of each layout, mask and bias kind (bf16: the
# interpreter's bf16 dots are the ones that need care, codegen/backward.py); the GPU suite runs
# every variant in bf16
SIXTEEN_BIT = ("vanilla", "bshd", "gqa_expand", "alibi", "softcap", "causal", "document_mask", "key_padding",
               "key_lengths", "additive_mask")
# (the Evoformer's fp32 gradients, its gate's and pair bias's too: test_ops_after_p_v_…)
CASES = ([(name, torch.float32) for name in FUSED if name != "evoformer_row"]
         + [(name, torch.float16) for name in SIXTEEN_BIT]
         + [(name, torch.bfloat16) for name in ("vanilla", "gqa_expand", "softcap", "causal", "document_mask",
                                                "sigmoid_attention")])


@pytest.mark.parametrize("name,dtype", CASES, ids=str)
def test_gradients_of_q_k_v_from_the_fused_backward(name, dtype):
    variant = VARIANTS[name]
    args = variant.inputs(SHAPE, dtype)
    assert _fused_backward(name, args) == ["fused"]
    assert_gradients_accurate(variant.fn, fxflash.optimize(variant.fn), args, wrt=(0, 1, 2))


@pytest.mark.parametrize("name,why", EAGER.items())
def test_regions_outside_the_form_recompute_eagerly_and_say_why(name, why):
    variant = VARIANTS[name]
    args = variant.inputs(SHAPE)
    notes = _fused_backward(name, args)
    assert all(note.startswith("eager recompute: ") for note in notes) and why in notes[0]
    assert_gradients_accurate(variant.fn, fxflash.optimize(variant.fn), args, wrt=(0, 1, 2))


STREAMS = [("diff_attention", torch.float32), ("diff_attention", torch.float16), ("diff_attention_causal", torch.float32),
           ("diff_transformer", torch.float32), ("diff_transformer", torch.bfloat16)]


@pytest.mark.parametrize("name,dtype", STREAMS, ids=str)
def test_softmax_streams_train_through_their_twins_fused_backward(name, dtype, monkeypatch):
    """Differential attention's streams are differentiated through their twin (runtime/twin.py):
    each stream's P·V over the score frame's heads, whose region's fused backward runs; λ, the
    Diff Transformer's λ vectors and its RMSNorm weight get autograd's through the combination."""
    import fxflash.runtime.backward as backward

    ran = []
    run_backward = backward.run_backward
    monkeypatch.setattr(backward, "run_backward", lambda *a, **k: ran.append(a[0]) or run_backward(*a, **k))
    variant = VARIANTS[name]
    args = variant.inputs(SHAPE, dtype)
    (region,) = assert_fused(fxflash.explain(variant.fn, *args))
    assert region.backward == "fused" and any(step.startswith("backward: through the twin") for step in region.steps)
    assert {"dkdv", "dq"} <= {p.name.rsplit("_", 1)[-1] for p in region.backward_programs}
    wrt = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point())
    assert_gradients_accurate(variant.fn, fxflash.optimize(variant.fn), args, wrt)
    assert ran, "the twin's fused backward did not run"


def test_the_safe_softmax_of_a_row_every_key_masks_gives_it_no_gradient():
    """SDPA's math form divides by ``where(Σ == 0, 1, Σ)``: a batch item of length 0 has P = 0 on
    every row, and so are its dQ, dK and dV, as eager's; the other items train as a softmax."""
    variant = VARIANTS["sdpa_key_lengths"]
    q, k, v, lengths = variant.inputs(SHAPE)
    args = (q, k, v, torch.tensor([SHAPE.N, 0]))
    assert _fused_backward("sdpa_key_lengths", args) == ["fused"]
    assert_gradients_accurate(variant.fn, fxflash.optimize(variant.fn), args, wrt=(0, 1, 2))


def test_two_attention_calls_of_differential_attention_each_train_fused():
    variant = VARIANTS["diff_attention_chunked"]
    args = variant.inputs(SHAPE)
    assert _fused_backward("diff_attention_chunked", args) == ["fused", "fused"]
    assert_gradients_accurate(variant.fn, fxflash.optimize(variant.fn), args, wrt=(0, 1, 2))


def test_softmax_streams_wider_than_the_twins_tiles_recompute_and_say_why():
    """Past TWIN_MAX_WIDTH (here V 256 wide) the twin's backward runs slower than the recompute."""
    variant = VARIANTS["diff_attention"]
    (region,) = assert_fused(fxflash.explain(variant.fn, *variant.inputs(Shape(B=1, H=1, M=8, N=8, D=128, Dv=128))))
    assert region.backward.startswith("eager recompute: ") and "256-wide" in region.backward


def _biased(q, k, v, bias):
    return torch.softmax(q @ k.transpose(-1, -2) * 0.2 + bias, -1) @ v


def _tempered(q, k, v, tau):
    return torch.softmax((q @ k.transpose(-1, -2)) / tau, -1) @ v


def _causal_biased(q, k, v, bias):
    i = torch.arange(q.size(-2))
    s = (q @ k.transpose(-1, -2) + bias).masked_fill(i[None, :] > i[:, None], float("-inf"))
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("fn,shape", [
    (_biased, (SHAPE.H, SHAPE.M, SHAPE.N)),        # a learned relative-position bias, per head
    (_biased, (SHAPE.B, 1, SHAPE.M, SHAPE.N)),     # per batch row, broadcast over the heads
    (_tempered, (SHAPE.H, 1, 1)),                  # a temperature per head: s / τ
    (_causal_biased, (SHAPE.M, SHAPE.M)),          # under a causal mask (skipped tiles: zero gradient)
], ids=["head_bias", "batch_bias", "temperature", "causal_bias"])
def test_a_tensor_the_scores_read_gets_its_gradient_from_the_fused_backward(fn, shape, monkeypatch):
    """A bias or temperature the score chain reads as it is: its gradient is dS through the chain,
    stored per tile by the dQ kernel and summed over the axes it broadcasts along."""
    import fxflash.runtime.backward as backward

    calls = []
    run = backward.run_backward
    monkeypatch.setattr(backward, "run_backward", lambda *a, **k: calls.append((a[7], len(a[8]))) or run(*a, **k))
    q, k, v = VARIANTS["vanilla"].inputs(SHAPE)
    if fn is _causal_biased:
        k, v = k[..., :SHAPE.M, :], v[..., :SHAPE.M, :]
    g = torch.Generator().manual_seed(0)
    extra = torch.rand(shape, generator=g) + 0.5 if fn is _tempered else torch.randn(shape, generator=g)
    args = (q, k, v, extra)
    assert _fused_backward_of(fn, *args) == ["fused"]
    assert_gradients_accurate(fn, fxflash.optimize(fn), args, wrt=(0, 1, 2, 3))
    # the fused backward, asked for the input's gradient, reading the statistics the forward stored
    assert calls == [(True, 2)]


@pytest.mark.parametrize("name,extra", [("causal", None), ("sigmoid_attention", None), ("head_bias", (SHAPE.H, SHAPE.M, SHAPE.N)),
                                        ("key_bias", (SHAPE.B, 1, 1, SHAPE.N)),   # summed over each tile's rows too
                                        ("temperature", (SHAPE.H, 1, 1))])       # … and its keys: one value per head
def test_dq_added_by_atomics_from_the_key_kernel(name, extra, monkeypatch):
    """``dq_atomics="1"``: dK·dV's kernel adds each key tile's dS·K to dQ (and a bias's gradient
    tiles into the bias's own gradient, summed over the batch it broadcasts along), no dQ kernel
    runs; under deterministic algorithms the dQ kernel runs."""
    import fxflash.runtime.backward as backward

    launched, added = [], []
    runner, adding = backward._runner, backward._added_gradients
    monkeypatch.setattr(backward, "_runner", lambda plan, kernel, *a, **k: launched.append(kernel.name.rsplit("_", 1)[-1])
                        or runner(plan, kernel, *a, **k))
    monkeypatch.setattr(backward, "_added_gradients", lambda *a: added.append(adding(*a)) or added[-1])
    monkeypatch.setattr(fxflash.config, "dq_atomics", "1")
    fn, args = (VARIANTS[name].fn, VARIANTS[name].inputs(SHAPE)) if extra is None else (
        _tempered if name == "temperature" else _biased,
        (*VARIANTS["vanilla"].inputs(SHAPE), torch.rand(extra, generator=torch.Generator().manual_seed(0)) + 0.5
         if name == "temperature" else torch.randn(extra, generator=torch.Generator().manual_seed(0))))
    assert _fused_backward_of(fn, *args) == ["fused"]
    assert_gradients_accurate(fn, fxflash.optimize(fn), args, wrt=tuple(range(len(args))))
    assert "dkdvdq" in launched and "dq" not in launched and "dkdv" not in launched
    assert added == ([{0}] if extra is not None else [])
    if name == "causal":
        launched.clear()
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            assert_gradients_accurate(fn, fxflash.optimize(fn), args, wrt=(0, 1, 2))
        finally:
            torch.use_deterministic_algorithms(False)
        assert "dkdvdq" not in launched and {"dkdv", "dq"} <= set(launched)


def _gated(q, k, v, gate):
    return (torch.softmax(q @ k.transpose(-1, -2) * 0.2, -1) @ v) * torch.sigmoid(gate)


@pytest.mark.parametrize("name", ["evoformer_row", "gated", "gated_sigmoid_attention"])
def test_ops_after_p_v_take_their_gradients_at_the_output_the_forward_kept(name, monkeypatch):
    """A gate (and the Evoformer's transpose) after P·V: the training forward also stores O = P·V
    before them, their backward is autograd's at it, and the kernels take dO from there; the gate
    and the Evoformer's pair bias get their gradients too (the mask is computed in the kernel)."""
    import fxflash.runtime.backward as backward

    calls = []
    run = backward.run_backward
    monkeypatch.setattr(backward, "run_backward", lambda *a, **k: calls.append(len(a[8])) or run(*a, **k))
    if name == "evoformer_row":
        fn, args, wrt, stored = VARIANTS[name].fn, VARIANTS[name].inputs(SHAPE), (0, 1, 2, 4, 5), 3
    else:
        q, k, v = VARIANTS["vanilla"].inputs(SHAPE)
        gate = torch.randn(*q.shape[:-1], v.shape[-1], generator=torch.Generator().manual_seed(1))
        fn = _gated if name == "gated" else (lambda q, k, v, g: VARIANTS["sigmoid_attention"].fn(q, k, v)
                                             * torch.sigmoid(g))
        args, wrt, stored = (q, k, v, gate), (0, 1, 2, 3), 3 if name == "gated" else 1   # elementwise P: O only
    assert _fused_backward_of(fn, *args) == ["fused"]
    assert_gradients_accurate(fn, fxflash.optimize(fn), args, wrt=wrt)
    assert calls == [stored]


def test_ops_after_p_v_recompute_eagerly_without_the_training_forward(monkeypatch):
    """With ``forward_statistics`` off the forward keeps no O before the gate: eager recomputation."""
    import fxflash.runtime.backward as backward

    calls = []
    run = backward.run_backward
    monkeypatch.setattr(backward, "run_backward", lambda *a, **k: calls.append(1) or run(*a, **k))
    monkeypatch.setattr(fxflash.config, "forward_statistics", False)
    q, k, v = VARIANTS["vanilla"].inputs(SHAPE)
    gate = torch.randn(*q.shape[:-1], v.shape[-1], generator=torch.Generator().manual_seed(1))
    assert _fused_backward_of(_gated, q, k, v, gate) == ["fused"]
    assert_gradients_accurate(_gated, fxflash.optimize(_gated), (q, k, v, gate), wrt=(0, 1, 2, 3))
    assert not calls


def test_a_tensor_the_kernel_computes_a_bias_from_gets_its_gradient(monkeypatch):
    """ALiBi's slopes as a parameter: the kernel computes the bias from them (a value from outside
    the region); the dQ kernel stores the bias's gradient tile, and the vjp of the ops that compute
    the bias takes it to the slopes."""
    import fxflash.runtime.backward as backward

    def alibi(q, k, v, slopes):
        i = torch.arange(q.size(-2))
        return torch.softmax(q @ k.transpose(-1, -2) + slopes[:, None, None] * (i[None, :] - i[:, None]), -1) @ v

    calls = []
    run = backward.run_backward
    monkeypatch.setattr(backward, "run_backward", lambda *a, **k: calls.append(a[7]) or run(*a, **k))
    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=2, H=4, Hkv=4, M=29, N=29, D=24, Dv=12))
    slopes = torch.rand(4, generator=torch.Generator().manual_seed(0))
    assert _fused_backward_of(alibi, q, k, v, slopes) == ["fused"]
    assert_gradients_accurate(alibi, fxflash.optimize(alibi), (q, k, v, slopes), wrt=(0, 1, 2, 3))
    assert_gradients_accurate(alibi, fxflash.optimize(alibi), (q, k, v, slopes), wrt=(0, 2))
    assert calls == [True, False]   # fused both times, the bias's tile stored only when asked for


def _fused_backward_of(fn, *args):
    return [r.backward for r in assert_fused(fxflash.explain(fn, *args))]


def _unscaled(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


def _peaked(seed, d=64, n=16):
    """bf16 Q, K, V whose unscaled scores (std ≈ 9·√d) leave a few keys each row's weight."""
    g = torch.Generator().manual_seed(seed)
    q, k = ((torch.randn(1, 2, m, d, generator=g) * 3).bfloat16() for m in (5, n))
    return q, k, torch.randn(1, 2, n, d, generator=g).bfloat16()


# programs the random programs found wrong (tests/test_random_programs.make_program's specs)
FOUND = {
    # bf16 scores times 10⁴: each row's P is one key's, and the gradients of Q and K are 0. The
    # recomputed P is that key's times exp of the ulp by which the recomputed score and the
    # forward's maximum round apart (scores near 2·10⁴): Δ = Σ P·dP / Σ P cancels that scale,
    # where Σ P·dP alone left dS = P·(1 − P)·dP, 29 in dQ
    "one_key_takes_all": dict(B=1, Hkv=1, group=2, M=5, N=5, D=1, Dv=1, gqa="repeat_interleave",
                              ops=[("scale", 10000.0)], norm="softmax"),
    # the quiet softmax's temperatures in bf16: 2× eager's error with Δ from O; its exact Δ is
    # scaled to the sum its P has, 1 − exp(−c)/d
    "quiet_softmax_temperatures": dict(B=2, Hkv=2, group=1, M=1, N=17, D=1, Dv=1, gqa="repeat_interleave",
                                       ops=[("temperature", 0.7), ("temperature", 0.7), ("scale", 2.0)],
                                       norm="softmax_one", dtype=torch.bfloat16),
    # fp16 scores under the quiet softmax with a (1 − m)·65504 mask: the rows the statistics kernel
    # marks take the loop's chain in eager's rounding, not the epilogue's row values (held_block)
    "quiet_softmax_over_an_extreme_mask": dict(B=1, Hkv=1, group=2, M=1, N=17, D=1, Dv=1, gqa="repeat_interleave",
                                               ops=[("extreme_mask", [False, False, False, True], 1e30)],
                                               norm="softmax_one", dtype=torch.float16),
    # fp32 scores that a distance bias makes large: the temperature's gradient 4× eager's error
    # with Δ from O (its fp32 rounding weighted by each row's mean score), within it summed over
    # the keys
    "temperature_over_a_distance_bias": dict(B=1, Hkv=2, group=2, M=17, N=17, D=16, Dv=8, seed=64636,
                                             gqa="repeat_interleave", norm="softmax", dtype=torch.float32,
                                             ops=[("scale", 0.5), ("distance_bias", -0.5), ("temperature", 0.7)]),
    # fp16, a band of width 0 then masked_fill(~keep, finfo.min) per key: the fill reopens the
    # filled keys on every row, so the rows whose own key is filled spread over them (rows in eager's
    # rounding); the backward took those rows over the band's tile ranges only (dV 0.56 off)
    "a_fill_over_a_band": dict(B=1, Hkv=1, group=1, M=17, N=16, D=24, Dv=24, gqa="expand", strided_q=True,
                               ops=[("index_mask", "band", 0), ("extreme_fill", [False, False, False, True], "min")],
                               norm="softmax", dtype=torch.float16),
    # a band of width 0 and causal over 17 rows and 16 keys: row 16 has no key, so eager's P row is
    # NaN and so is every key's dV; the loops skipped that row's tiles and left dV finite
    **{f"a_row_every_key_masks_{dtype}": dict(B=1, Hkv=1, group=1, M=17, N=16, D=1, Dv=1, gqa="repeat_interleave",
                                              strided_q=True, ops=[("index_mask", "band", 0), ("index_mask", "causal", 0)],
                                              norm="softmax", dtype=getattr(torch, dtype))
       for dtype in ("float32", "float16")},
    # every score shifted by finfo.min, then divided by a temperature: autograd's (a/τ)/τ overflows and
    # the temperature's gradient is NaN in eager and float64; the kernels' −g·(a/τ)/τ stayed finite
    "a_temperature_over_finfo_min": dict(B=1, Hkv=1, group=1, M=1, N=33, D=8, Dv=16, gqa="repeat_interleave", seed=70,
                                         norm="softmax", dtype=torch.float32,
                                         ops=[("extreme_mask", [False] * 4, "min"), ("scale", 0.5),
                                              ("temperature", 0.7)]),
    # ReLU attention over (1 − m)·finfo.max: P reaches 6.8·10³⁷, and a key's dV sums 16 such terms of
    # both signs to 2.085·10³⁸, finite in eager's order; the kernel's order overflowed (REDO)
    "relu_over_finfo_max": dict(B=2, Hkv=2, group=2, M=16, N=5, D=8, Dv=8, gqa="repeat_interleave", seed=6,
                                epilogue="transpose_gate", norm="relu", dtype=torch.float32,
                                ops=[("extreme_mask", [False, True, False, True], "min"),
                                     ("extreme_mask", [False, True, False, True], "max"), ("distance_bias", 0.25)]),
}


@pytest.mark.parametrize("found", FOUND)
def test_gradients_the_random_programs_found_wrong(found):
    from test_random_programs import make_program

    program, args = make_program({"layout": "bhsd", "strided_q": False, "writes_k": False, "dtype": torch.bfloat16,
                                  "epilogue": None, "seed": 0, **FOUND[found]})
    assert _fused_backward_of(program, *args) == ["fused"]
    assert_gradients_accurate(program, fxflash.optimize(program), args,
                              wrt=tuple(i for i, a in enumerate(args) if a.is_floating_point()))


@pytest.mark.parametrize("statistics,fp32_o,exact", [(True, True, True), (True, False, True), (False, True, True),
                                                     (False, True, False)],
                         ids=["o_in_fp32", "no_fp32_o", "exact_delta", "flash_delta"])
def test_16_bit_rows_a_few_keys_dominate_take_delta_from_o_in_fp32(statistics, fp32_o, exact, monkeypatch):
    """Δ = rowsum(dO ⊙ O) from the bf16 O is off by O's rounding, which such rows weigh into dQ and
    dK (0.09 against eager's 7·10⁻⁶ here) and into a temperature's gradient by its rows' mean
    scores. The training forward stores O in fp32, and Δ from it is within eager's error. Without
    it (``fp32_o`` or ``forward_statistics`` off), Δ is summed as Σ P·dP over the keys
    (config.exact_delta), every dS row summing to 0; with that setting off too, Q, K and V take
    FlashAttention's Δ. A score input's gradient (the temperature's) takes the summed Δ always."""
    import fxflash.runtime.backward as backward

    launched = []
    runner = backward._runner
    monkeypatch.setattr(backward, "_runner", lambda plan, kernel, *a, **k: launched.append(kernel.name.split("_bwd_")[1])
                        or runner(plan, kernel, *a, **k))
    monkeypatch.setattr(fxflash.config, "forward_statistics", statistics)
    monkeypatch.setattr(fxflash.config, "fp32_o", fp32_o)
    monkeypatch.setattr(fxflash.config, "exact_delta", exact)
    stored = statistics and fp32_o
    for seed in (2, 3, 6):   # each outside the bound with Δ from the bf16 O
        args = _peaked(seed)
        assert _fused_backward_of(_unscaled, *args) == ["fused"]
        if exact:
            assert_gradients_accurate(_unscaled, fxflash.optimize(_unscaled), args, wrt=(0, 1, 2))
        else:
            fxflash.optimize(_unscaled)(*(a.requires_grad_() for a in args)).sum().backward()
        assert launched[-3:] == ["exact_delta" if exact and not stored else "delta", "dkdv", "dq"]
    q, k, v = _peaked(1)   # its temperature's gradient 34× eager's error with Δ from the bf16 O
    args = (q / 8, k, v, torch.tensor(0.7, dtype=torch.bfloat16))
    assert_gradients_accurate(_tempered, fxflash.optimize(_tempered), args, wrt=(0, 1, 2, 3))
    assert launched[-3:] == ["exact_delta", "dkdv", "dq"]


@pytest.mark.parametrize("dtype,fp32_o,stored", [(torch.bfloat16, True, ("m", "inv_l", "o")),
                                                 (torch.bfloat16, False, ("m", "inv_l")),
                                                 (torch.float32, True, ("m", "inv_l"))], ids=str)
def test_a_16_bit_training_forward_stores_o_in_fp32(dtype, fp32_o, stored, monkeypatch):
    """What a region's training forward stores after its output, all in fp32: m and 1/l, and O
    where the output is 16-bit (and ``fp32_o`` on)."""
    monkeypatch.setattr(fxflash.config, "fp32_o", fp32_o)
    before = set(op._REGISTRY)
    args = [t.requires_grad_() for t in VARIANTS["causal"].inputs(SHAPE, dtype)]
    fast = fxflash.optimize(VARIANTS["causal"].fn)   # held: its regions leave the registry with it
    fast(*args).sum().backward()
    (entry,) = [op._REGISTRY[key] for key in set(op._REGISTRY) - before]
    training = entry.plan.training
    assert training.training_outputs == stored and training.side_dtypes == (torch.float32,) * len(stored)


def test_a_16_bit_region_keeps_o_in_fp32_for_its_backward_in_place_of_its_output():
    """What autograd holds between the forward and the backward: the fp32 O the backward reads,
    not the bf16 output besides it."""
    variant = VARIANTS["causal"]
    args = [t.requires_grad_() for t in variant.inputs(SHAPE, torch.bfloat16)]
    fast = fxflash.optimize(variant.fn)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = fast(*args)
    assert any(t.dtype == torch.float32 and t.shape == out.shape for t in saved)
    assert not any(t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr() for t in saved)
    assert_gradients_accurate(variant.fn, fast, args, wrt=(0, 1, 2))


def test_one_tensor_read_as_q_and_k_gets_both_gradients():
    def self_attention(x, v):
        return torch.softmax(x @ x.transpose(-1, -2) * 0.3, -1) @ v

    g = torch.Generator().manual_seed(0)
    x, v = (torch.randn(2, 3, 21, 16, generator=g) for _ in range(2))
    assert _fused_backward_of(self_attention, x, v) == ["fused"]
    assert_gradients_accurate(self_attention, fxflash.optimize(self_attention), (x, v), wrt=(0, 1))


def _multi_query(q, k, v):
    """Multi-query attention: one K/V head, expanded over the query heads."""
    b, h, m, d = q.shape
    k, v = k.expand(b, h, *k.shape[2:]), v.expand(b, h, *v.shape[2:])
    return torch.softmax(q @ k.transpose(-1, -2) * d ** -0.5, -1) @ v


@pytest.mark.parametrize("fn,kv_heads", [(VARIANTS["gqa_expand"].fn, 2), (_multi_query, 1)], ids=["gqa", "mqa"])
def test_k_and_v_broadcast_over_query_heads_get_their_heads_gradients_from_grouped_programs(fn, kv_heads,
                                                                                           monkeypatch):
    """The op is given K and V before their broadcast, and the grouped key programs sum each K/V
    head's gradients over its query heads: no gradient per query head is made and summed."""
    import fxflash.runtime.backward as backward

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 29, 16, generator=g)
    k, v = (torch.randn(2, kv_heads, 37, 16, generator=g) for _ in range(2))
    (region,) = assert_fused(fxflash.explain(fn, q, k, v))
    assert region.backward == "fused" and [p.group for p in region.backward_programs].count(True) == 2
    launched = []
    runner = backward._runner
    monkeypatch.setattr(backward, "_runner", lambda plan, kernel, *a, **kw: launched.append(kernel.name)
                        or runner(plan, kernel, *a, **kw))
    assert_gradients_accurate(fn, fxflash.optimize(fn), (q, k, v), wrt=(0, 1, 2))
    assert any(name.endswith("_bwd_dkdv_grouped") for name in launched)


def test_training_through_the_backend_uses_the_fused_backward(monkeypatch):
    """torch.compile's AOTAutograd traces the region's autograd formula: the compiled backward
    calls fxflash::region_backward, whose kernels give the gradients."""
    import fxflash.runtime.backward as backward

    calls = []
    run = backward.run_backward
    monkeypatch.setattr(backward, "run_backward", lambda *a, **k: calls.append(1) or run(*a, **k))
    variant = VARIANTS["causal"]
    compiled = torch.compile(variant.fn, backend=fxflash.backend(inner="eager"), fullgraph=True)
    assert_gradients_accurate(variant.fn, compiled, variant.inputs(SHAPE), wrt=(0, 1, 2))
    assert calls


@pytest.mark.fusion_independent  # prints the region's backward itself, as the pipeline would
@pytest.mark.parametrize("name,ranged", [
    ("causal", {"stats": (True, True), "dkdv": (True, True), "dq": (True, True)}),
    ("sliding_window", {"stats": (True, True), "dkdv": (True, True), "dq": (True, True)}),
    # ids: bounded along the keys only
    ("document_mask", {"stats": (True, True), "dkdv": (False, False), "dq": (True, True)}),
    ("vanilla", {"stats": (False, False), "dkdv": (False, False), "dq": (False, False)}),
])
def test_the_masks_bound_the_backward_loops(name, ranged):
    """Each loop visits only the tiles a -inf mask leaves, by the masks' intervals (as the
    forward's): over the keys for the statistics and dQ, over the rows for dK and dV where the mask is
    computed from indices alone; the whole tiles every mask keeps run with the masks folded away."""
    from fxflash.codegen import emit_kernel
    from fxflash.codegen.backward import emit_backward
    from fxflash.codegen.printers import PRINTERS
    from helpers import region_and_kinds

    variant = VARIANTS[name]
    region, kinds = region_and_kinds(variant.fn, *variant.inputs(SHAPE))
    plan = emit_backward(region, kinds, emit_kernel(region, kinds), PRINTERS)
    got = {k.name.rsplit("_", 1)[-1]: (k.ranged, k.full_tiles) for k in plan.kernels
           if k.name.rsplit("_", 1)[-1] in ranged}
    assert got == ranged


@pytest.mark.fusion_independent  # prints from a region directly
@pytest.mark.parametrize("name", FUSED)
def test_no_dot_reads_the_transpose_of_a_computed_tile(name):
    """Triton 3.4–3.7.0 miscompiles, on Hopper, a dot whose operand is the transpose of a tile
    computed in registers (dK = Σ dSᵀ·Q came out 20× eager's error on an H100): the GPU's kernels
    accumulate dKᵀ += Qᵀ·dS and dVᵀ += dOᵀ·P, and every transpose a dot reads is of a loaded tile."""
    import dataclasses
    import re

    from fxflash.codegen import emit_kernel
    from fxflash.codegen.backward import emit_backward
    from fxflash.codegen.printers import PRINTERS
    from fxflash.config import kernel_options
    from helpers import region_and_kinds

    variant = VARIANTS[name]
    region, kinds = region_and_kinds(variant.fn, *variant.inputs(SHAPE, torch.bfloat16))
    plan = emit_kernel(region, kinds, options=dataclasses.replace(kernel_options(), interpreter=False))
    source = emit_backward(region, kinds, plan, PRINTERS).source
    loaded = set(re.findall(r"^\s*(\w+) = tl\.load\(", source, re.M))
    transposed = {tile for line in source.splitlines() if "tl.dot(" in line
                  for tile in re.findall(r"tl\.trans\((\w+)\)", line)}
    assert "dk_acc = tl.trans(dk_acc)" in source and transposed and transposed <= loaded, transposed - loaded


def test_dynamic_shapes_train_through_the_fused_backward():
    """Under dynamic=True the sizes are symbolic (P reaches P·V through an expand to its own sizes;
    the causal mask's diagonal ``N − M`` is a symbolic size, which the forward's tile ranges read
    too): the backward is fused for each length, one graph for all."""
    from fxflash.backend import recording

    variant = VARIANTS["causal"]
    compiled = torch.compile(variant.fn, backend=fxflash.backend(inner="eager"), dynamic=True)
    for m, n in ((29, 37), (21, 45)):
        args = variant.inputs(Shape(B=2, H=4, Hkv=2, M=m, N=n, D=24, Dv=12))
        with recording() as reports:
            assert_gradients_accurate(variant.fn, compiled, args, wrt=(0, 1, 2))
        assert [r.backward for report in reports for r in report.regions if r.fused] == ["fused"]


def test_inductor_compiles_the_training_forward_and_the_fused_backward(monkeypatch):
    """The backend's inner Inductor traces the joint graph through ``training_call``: the forward
    that stores the statistics, then the fused backward reading them, whose gradients have the
    layout its fake implementation promised (Inductor checks it; K is read transposed). The graph
    is one AOTAutogradCache keeps (``fxflash::region_call``, an operator), so a warm process loads
    it rather than tracing it again."""
    import fxflash.runtime.backward as backward
    from torch._dynamo.utils import counters

    calls = []
    run = backward.run_backward
    monkeypatch.setattr(backward, "run_backward", lambda *a, **k: calls.append(len(a[8])) or run(*a, **k))
    variant = VARIANTS["vanilla"]
    compiled = torch.compile(variant.fn, backend=fxflash.backend(inner="inductor"), dynamic=True)
    counters.clear()
    with torch._functorch.config.patch(enable_autograd_cache=True), torch._inductor.config.patch(fx_graph_cache=True):
        assert_gradients_accurate(variant.fn, compiled, variant.inputs(SHAPE), wrt=(0, 1, 2))
    assert calls == [2]
    cache = counters["aot_autograd"]
    assert cache["autograd_cache_miss"] + cache["autograd_cache_hit"] == 1 and not cache["autograd_cache_bypass"]


def test_activation_checkpointing_recomputes_the_fused_forward():
    """Under torch.utils.checkpoint the region runs again in the backward, then its fused backward;
    the first call compiles inside the checkpoint (the capture's own saved tensors are not the
    call's)."""
    from torch.utils.checkpoint import checkpoint

    variant = VARIANTS["alibi"]
    fast = fxflash.optimize(variant.fn)
    args = variant.inputs(SHAPE)
    assert _fused_backward("alibi", args) == ["fused"]
    assert_gradients_accurate(variant.fn, lambda *a: checkpoint(fast, *a, use_reentrant=False), args, wrt=(0, 1, 2))


def test_the_fused_backward_can_be_turned_off(monkeypatch):
    """config.fused_backward = False: the region's own ops are recomputed with eager autograd."""
    import fxflash.runtime.backward as backward

    monkeypatch.setattr(backward, "run_backward", lambda *a, **k: pytest.fail("the fused backward ran"))
    variant = VARIANTS["softcap"]
    args = variant.inputs(SHAPE)
    assert _fused_backward("softcap", args) == ["fused"]   # the region is fused; its backward is not used
    with fxflash.config.overridden(fused_backward=False):
        assert_gradients_accurate(variant.fn, fxflash.optimize(variant.fn), args, wrt=(0, 1, 2))


def test_the_quiet_softmax_s_statistics_from_the_backward_s_own_kernel(monkeypatch):
    """With ``forward_statistics`` off the statistics kernel gives the quiet softmax's row
    values, ``c = max(m, 0)`` and ``1/(Σ exp(x − c) + exp(−c))``, from its own max and sum."""
    import fxflash.runtime.backward as backward

    launched = []
    runner = backward._runner
    monkeypatch.setattr(backward, "_runner", lambda plan, kernel, *a, **k: launched.append(kernel.name.rsplit("_", 1)[-1])
                        or runner(plan, kernel, *a, **k))
    monkeypatch.setattr(fxflash.config, "forward_statistics", False)
    variant = VARIANTS["softmax_one"]
    args = variant.inputs(SHAPE)
    assert _fused_backward("softmax_one", args) == ["fused"]
    assert_gradients_accurate(variant.fn, fxflash.optimize(variant.fn), args, wrt=(0, 1, 2))
    assert launched[0] == "stats"


def test_retention_rows_below_the_floor_take_no_gradient_through_the_sum():
    """Retention's n = max(Σ|x|, 1): where the sum is below 1 (half the rows here), n is the
    constant 1 and dx = dP; elsewhere dx = (dP − sign(x)·Δ) / n (tile.backward.abs_sum_form)."""
    variant = VARIANTS["retention_norm"]
    q, k, v = variant.inputs(SHAPE)
    q = q.clone()
    q[..., ::2, :] *= 0.002
    assert ((q @ k.transpose(-1, -2)).abs().sum(-1) < 1).any()
    assert _fused_backward("retention_norm", (q, k, v)) == ["fused"]
    assert_gradients_accurate(variant.fn, fxflash.optimize(variant.fn), (q, k, v), wrt=(0, 1, 2))


def padded(q, k, v, keep):
    s = q @ k.transpose(-1, -2) * 0.2
    return torch.softmax(torch.where(keep, s, torch.finfo(s.dtype).min), -1) @ v


def padded_keep(m: int, n: int, device="cpu") -> torch.Tensor:
    """Causal, the first 5 rows keeping no key (left padding)."""
    i = torch.arange(m, device=device)[:, None]
    return (torch.arange(n, device=device)[None, :] <= i) & (i >= 5)


def _shifted(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) + 1e38, -1) @ v


def test_rows_the_forward_repaired_take_the_backward_s_own_statistics():
    """bf16 scores of 10³⁸ leave the forward's multiply-add range: its repair kernel computes those
    rows with x rounded to bf16, as eager holds it, and marks their statistics; the backward's x
    is not rounded, so it computes theirs again (REPAIRED_ONLY) rather than read a maximum a
    rounding away from its own (exp of 10³⁴ otherwise)."""
    q, k, v = VARIANTS["vanilla"].inputs(SHAPE, torch.bfloat16)
    assert _fused_backward_of(_shifted, q, k, v) == ["fused"]
    assert_gradients_accurate(_shifted, fxflash.optimize(_shifted), (q, k, v), wrt=(0, 1, 2))


def test_rows_every_key_masks_with_a_finite_fill_get_eagers_gradients():
    """transformers' masks fill with ``finfo.min``: a row every key masks (left padding) has the
    uniform P = 1/N in eager, which the backward's statistics must keep (``m + log l`` would lose
    ``log l`` beside ``m ≈ −3.4·10³⁸``)."""
    q, k, v = VARIANTS["vanilla"].inputs(SHAPE)
    keep = padded_keep(SHAPE.M, SHAPE.N)
    assert _fused_backward_of(padded, q, k, v, keep) == ["fused"]
    assert_gradients_accurate(padded, fxflash.optimize(padded), (q, k, v, keep), wrt=(0, 1, 2))


@pytest.mark.fusion_independent
@pytest.mark.parametrize("name,dtype", [("causal", "float16"), ("gqa_expand", "bfloat16")])
def test_the_backward_kernels_compile_for_hopper(name, dtype):
    """Every backward kernel as printed for a GPU, the statistics kernel with and without
    REPAIRED_ONLY, and the loops printed twice for the rows held in eager's rounding (held_block),
    compiles for sm_90 with Triton's ptxas, no GPU needed (tests/triton_compile.py --backward)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    here = os.path.dirname(__file__)
    done = subprocess.run([sys.executable, os.path.join(here, "triton_compile.py"), name, dtype, "--backward"],
                          cwd=here, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for kernel in ("stats", "dkdv", "dq", "dkdvdq", *(("dkdv_grouped",) if name == "gqa_expand" else ())):
        assert f"compiled fxflash_region_bwd_{kernel} (rows held)" in done.stdout, done.stdout


def _filled_then_biased(q, k, v, keep, bias):
    s = (q @ k.transpose(-1, -2) * 0.5).masked_fill(~keep, torch.finfo(q.dtype).max) + bias
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("statistics", [True, False], ids=["forward_statistics", "backward_statistics"])
def test_16_bit_rows_the_forward_repaired_take_eagers_rounding_in_the_backward(statistics, monkeypatch):
    """fp16 keys filled with 65504, then a bias: eager rounds each ``65504 + b`` to 65504, so those
    keys share the row equally; fp32 keeps them apart (dV 1.3 off float64's, eager 4·10⁻⁴). The
    forward's repair kernel computes such rows (maximum past 2¹⁴) in eager's rounding and marks
    them; without forward statistics the backward's statistics kernel marks them by the same
    bound. The backward then takes their score chain in eager's rounding (codegen/backward.py,
    held_block), and a second backward of the same forward reads the marks again."""
    monkeypatch.setattr(fxflash.config, "forward_statistics", statistics)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g).half() for n in (24, 40, 40))
    keep = torch.rand(1, 1, 24, 40, generator=g) > 0.4
    bias = torch.randn(1, 1, 1, 40, generator=g).half()
    args = (q, k, v, keep, bias)
    assert _fused_backward_of(_filled_then_biased, *args) == ["fused"]
    fast = fxflash.optimize(_filled_then_biased)
    assert_gradients_accurate(_filled_then_biased, fast, args, wrt=(0, 1, 2, 4))
    leaves = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    out = fast(*leaves)
    first = torch.autograd.grad(out, leaves[2], torch.ones_like(out), retain_graph=True)[0]
    second = torch.autograd.grad(out, leaves[2], torch.ones_like(out))[0]
    assert torch.equal(first, second)


@pytest.mark.parametrize("name", ["biased", "gqa_expand"])
def test_sizes_past_the_kernels_int32_indices_recompute_inside_the_backward_op(name, monkeypatch):
    """Where the kernels' int32 index arithmetic could overflow, fxflash::region_backward gives the
    same gradients from the region's own ops (here with the limit lowered to these sizes); for
    GQA, whose op is given K and V before their broadcast, summed back through it."""
    import fxflash.runtime.backward as backward

    monkeypatch.setattr(backward, "INT32_LIMIT", 64)
    monkeypatch.setattr(backward, "load_kernel", lambda *a: pytest.fail("a kernel was launched"))
    q, k, v = VARIANTS["vanilla" if name == "biased" else name].inputs(SHAPE)
    bias = torch.randn(SHAPE.H, SHAPE.M, SHAPE.N, generator=torch.Generator().manual_seed(0))
    fn, args = (_biased, (q, k, v, bias)) if name == "biased" else (VARIANTS[name].fn, (q, k, v))
    assert _fused_backward_of(fn, *args) == ["fused"]
    assert_gradients_accurate(fn, fxflash.optimize(fn), args, wrt=tuple(range(len(args))))
