"""Never wrong at the edges: extreme constants, bf16 without a GPU, internal errors, the user's
own objects, warning-free kernels, the user's own errors.

Every fused answer is checked against float64 within eager's own error (helpers.assert_accurate)
and every test that claims a fused path checks fxflash's report (helpers.assert_fused).
"""
import contextlib
import dataclasses
import logging
import math
import sys

import pytest
import torch

import fxflash
from fxflash import internal
from helpers import assert_accurate, assert_fused

SHAPE = (2, 2, 16, 32)


def _qkv(dtype, m=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(SHAPE[0], SHAPE[1], m, SHAPE[3], generator=g).to(dtype)
    k, v = (torch.randn(*SHAPE, generator=g).to(dtype) for _ in range(2))
    return q, k, v


def _padding(n=16):
    """Batch 0 keeps its first 10 keys; batch 1 keeps none (every row fully masked, where eager's
    ``finfo.min`` masks give the mean of V and ``-inf`` masks give NaN)."""
    mask = torch.ones(2, n)
    mask[0, 10:] = 0
    mask[1, :] = 0
    return mask


def additive_mask(value):
    def program(q, k, v, mask):  # transformers' extended attention mask
        ext = (1.0 - mask[:, None, None, :].to(q.dtype)) * value
        return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + ext, dim=-1) @ v
    return program


def bias_tensor(value):
    def program(q, k, v, mask):
        bias = torch.where(mask[:, None, None, :] > 0, 0.0, value).to(q.dtype)
        return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + bias, dim=-1) @ v
    return program


def filled(value):
    def program(q, k, v, mask):
        s = (q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))).masked_fill(mask[:, None, None, :] == 0, value)
        return torch.softmax(s, dim=-1) @ v
    return program


def saturated(factor):
    def program(q, k, v, mask):
        return torch.softmax((q @ k.transpose(-1, -2)) * factor, dim=-1) @ v
    return program


def _extremes(dtype):
    """Finite constants that dtype holds: its extremes, and ±1e38 and ±1e30 where it holds them."""
    fi = torch.finfo(dtype)
    return [v for v in (fi.min, fi.max, -1e38, 1e38, -1e30, 1e30, -1e4) if abs(v) <= fi.max]


CASES = [(dtype, form, value) for dtype in (torch.float32, torch.float16, torch.bfloat16)
         for form in (additive_mask, bias_tensor, filled) for value in _extremes(dtype)]
# scores × 1e4 (fp16 holds scores × 1e2 of unit inputs), and far past the multiply-add form's range
CASES += [(dtype, saturated, f) for dtype, fs in ((torch.float32, (1e4, -1e4, 1e9)), (torch.bfloat16, (1e4, 1e9)),
                                                    (torch.float16, (1e2, -1e2))) for f in fs]


@pytest.mark.parametrize("dtype,form,value", CASES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_extreme_finite_values_stay_what_eager_computes(dtype, form, value, device):
    """No rewrite (a folded scale, the bias fold, exp2 units, the max guard) turns a value eager
    keeps finite into inf or NaN: masks, biases and fills at the dtype's extremes (fully masked
    rows included) and saturated logits, fused, within eager's error of float64."""
    program = form(value)
    q, k, v = _qkv(dtype)
    args = (q.to(device), k.to(device), v.to(device), _padding().to(device))
    optimized = fxflash.optimize(program)
    out = optimized(*args)
    assert_fused(optimized.report(*args))
    if form is saturated and abs(value) > 1e6:
        assert_weighted_means(out, args[2], program(*args))
    else:
        assert_accurate(program, args, out)


def dtype_min_mask(q, k, v, mask):
    """transformers' mask with its constant taken from the dtype: in fp16, ``s − 65504`` rounds to
    steps of 32, and a row masked entirely is eager's few-valued row (float64's is uniform)."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    return torch.softmax(s + (1.0 - mask[:, None, None, :].to(s.dtype)) * torch.finfo(s.dtype).min, dim=-1) @ v


def l1_normalized(q, k, v, mask):
    """``s / Σ|s|`` over scores filled at ``finfo.min``: the division deferred past ``P·V`` sums
    terms of ±3·10³⁸ where eager's ``s / Σ|s|`` is 0 first (its sum is inf)."""
    s = (q @ k.transpose(-1, -2)).masked_fill(mask[:, None, None, :] == 0, torch.finfo(q.dtype).min)
    return (s / s.abs().sum(-1, keepdim=True)) @ v


def big_values(q, k, v, mask):
    """A softmax over V near the dtype's largest value: ``Σ E(x − m)·V`` before the division by
    the row sum overflows where eager's ``Σ p·V`` does not."""
    return torch.softmax(q @ k.transpose(-1, -2) * 0.0, dim=-1) @ (v.abs() * 3e37)


@pytest.mark.parametrize("program", [dtype_min_mask, l1_normalized, big_values], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_deferred_values_and_16_bit_roundings_at_the_extremes(program, dtype, device):
    """Where a deferred division or eager's own 16-bit rounding decides the answer, the flagged
    rows are computed again in eager's form (rounded as eager rounds): fused, within eager's
    error of float64 (the float64 program takes its own ``finfo`` constants)."""
    if program is big_values and dtype is torch.float16:
        pytest.skip("fp16 holds no value near 3e37")
    q, k, v = (t.to(device) for t in _qkv(dtype))
    args = (q, k, v, _padding().to(device))
    optimized = fxflash.optimize(program)
    out = optimized(*args)
    assert_fused(optimized.report(*args))
    assert_accurate(program, args, out)


def relu_over_finfo_max(q, k, v, mask):
    """ReLU attention over scores that fp32's largest value reaches on the masked keys: each such
    key's P is ``finfo.max/N``, and ``P·V`` sums terms near fp32's limit of both signs."""
    s = q @ k.transpose(-2, -1) / 8.0
    s = s + (1.0 - mask.to(s.dtype)) * torch.finfo(torch.float32).max
    return (torch.relu(s) / s.size(-1)) @ v


def test_an_unbounded_p_summed_near_the_dtypes_limit_stays_finite_where_eagers_is(device):
    """A sum of such terms overflows in one order and not in another: in the kernel's, its positive
    terms first, it overflowed where eager's matmul stayed finite. The row is flagged and the
    repair kernel sums it with P scaled by 2⁻⁶⁴ (exact), then scales it back."""
    g = torch.Generator().manual_seed(30)   # a draw whose fused row overflowed before the repair
    q, k = torch.randn(1, 1, 4, 8, generator=g), torch.randn(1, 1, 8, 8, generator=g)
    v = torch.randn(1, 1, 8, 8, generator=g) * 2.5
    mask = torch.rand(1, 1, 1, 8, generator=g) > 0.8
    args = tuple(t.to(device) for t in (q, k, v, mask))
    optimized = fxflash.optimize(relu_over_finfo_max)
    out = optimized(*args)
    assert_fused(optimized.report(*args))
    assert_accurate(relu_over_finfo_max, args, out)


def narrow_values(dv):
    """Attention over V narrower than its power-of-two tile (bshd layout, GQA by ``expand``)."""
    def program(q, k, v):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        b, hkv, n, d = k.shape
        k = k[:, :, None].expand(b, hkv, 2, n, d).reshape(b, 2 * hkv, n, d)
        v = v[:, :, None].expand(b, hkv, 2, n, dv).reshape(b, 2 * hkv, n, dv)
        return (torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1) @ v).transpose(1, 2)
    return program


@pytest.mark.parametrize("dv", [1, 8, 24])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_values_narrower_than_their_tile_are_right_at_every_tile(dv, dtype, device):
    """V's padded Dv columns re-read its last column rather than being masked: a 16-bit V tile
    masked along Dv gave wrong rows and illegal addresses on an H100 at 64-wide tiles (Triton
    3.6). Every candidate tile is run, fused, within eager's error."""
    from fxflash.runtime import tuning

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, n, h, w, generator=g).to(dtype).to(device)
               for n, h, w in ((16, 4, 24), (130, 2, 24), (130, 2, dv)))
    program = narrow_values(dv)
    (region,) = fxflash.explain(program, q, k, v).regions
    v_loads = [line for line in region.source.splitlines() if "tl.load(v_ptr" in line]
    assert v_loads and all("tl.minimum(offs_dv, DV - 1)" in line and "< DV" not in line for line in v_loads)
    optimized = fxflash.optimize(program)
    for tile in region.configs if device == "cuda" else [None]:
        with tuning.pinned(tile) if tile else contextlib.nullcontext():
            out = optimized(q, k, v)
        assert_fused(optimized.report(q, k, v))
        assert_accurate(program, (q, k, v), out)


def assert_weighted_means(out, v, eager):
    """Logits so large that a one-ulp difference in a score moves the whole weight from one key to
    another (eager's matmul and the kernel's sum in other orders): each output row is still a
    weighted mean of V's rows, finite wherever eager's is."""
    assert not (~torch.isfinite(out) & torch.isfinite(eager)).any()
    lo, hi = v.float().amin(-2, keepdim=True), v.float().amax(-2, keepdim=True)
    slack = 1e-2 * (hi - lo) + 1e-3
    assert ((out.float() >= lo - slack) & (out.float() <= hi + slack)).all()


OVERFLOWED_OUTPUT = "tl.abs(out) < float('inf')"  # the flag of rows whose output overflowed


def _kernels(program, *args):
    """The region's kernel and its repair kernel (sources)."""
    (region,) = fxflash.explain(program, *args).regions
    return region.source.split("def fxflash_region_repair(")


def test_kernels_flag_rows_for_the_repair_kernel(device):
    """A 16-bit kernel prints the multiply-add form and flags the rows it leaves (``sat_ptr``); the
    repair kernel computes them in eager's form: ``tl.exp``, two passes over the keys (four loops:
    whole tiles, then the partial one), each value rounded to eager's bf16. Over bf16 V the
    kernel also flags rows whose output overflowed; a softmax over fp16 V cannot overflow and
    is not checked. An fp32 kernel prints eager's form, and flags overflowed outputs only."""
    q, k, v = (t.to(device) for t in _qkv(torch.bfloat16))
    mask = _padding().to(device)
    fast, repair = _kernels(additive_mask(-1e30), q, k, v, mask)
    assert "out_ptr, sat_ptr" in fast and "tl.exp2(" in fast and "tl.store(sat_ptr" in fast
    assert OVERFLOWED_OUTPUT in fast
    assert "tl.exp(" in repair and "tl.exp2(" not in repair and "tl.load(sat_ptr" in repair
    assert repair.count("for start_n in range(") == 4 and "tl.store(sat_ptr" not in repair
    assert "_fx_round_bf16(" in repair or ".to(tl.bfloat16).to(tl.float32)" in repair
    fast, _ = _kernels(additive_mask(-1e30), q.half(), k.half(), v.half(), mask)
    assert "tl.store(sat_ptr" in fast and OVERFLOWED_OUTPUT not in fast
    fast, _ = _kernels(additive_mask(-1e30), q.float(), k.float(), v.float(), mask)
    assert "tl.exp2(" not in fast and OVERFLOWED_OUTPUT in fast and "tl.abs(acc_amax" not in fast


def test_bf16_without_a_gpu_is_right(device):
    """Triton's interpreter multiplies bf16 tiles wrongly; the kernel widens them there."""
    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)), dim=-1) @ v
    g = torch.Generator().manual_seed(3)
    args = tuple(torch.randn(2, 4, 64, 32, generator=g).to(torch.bfloat16).to(device) for _ in range(3))
    optimized = fxflash.optimize(attention)
    out = optimized(*args)
    assert_fused(optimized.report(*args))
    assert_accurate(attention, args, out)


# -- programs that once crashed the code generator -----------------------------------------------

class LearnedLambda(torch.nn.Module):
    """Differential attention with a learned λ: two softmaxes, the second weighted by a parameter."""

    def __init__(self):
        super().__init__()
        self.lam = torch.nn.Parameter(torch.tensor(0.3))

    def forward(self, q1, k1, q2, k2, v):
        a0 = torch.softmax(q1 @ k1.transpose(-1, -2) / 8, -1)
        a1 = torch.softmax(q2 @ k2.transpose(-1, -2) / 8, -1)
        return (a0 - self.lam * a1) @ v


def bitwise_and_interval(q, k, v):
    i = torch.arange(q.size(-2), device=q.device)[:, None]
    j = torch.arange(k.size(-2), device=q.device)[None, :]
    keep = ((i & 1) == (j & 1)) & (j <= i)
    return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf")), -1) @ v


def float_index_mask(q, k, v):
    i = torch.arange(q.size(-2), device=q.device)[:, None]
    j = torch.arange(k.size(-2), device=q.device)[None, :]
    keep = (j.float() / 7).floor() <= (i.float() / 7).floor()
    return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf")), -1) @ v


def triu_mask(q, k, v):
    masked = torch.triu(torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device), diagonal=1)
    return torch.softmax(torch.where(masked, float("-inf"), q @ k.transpose(-1, -2)), -1) @ v


def tril_float_mask(q, k, v):
    keep = torch.tril(torch.ones(q.size(-2), k.size(-2), device=q.device))
    return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(keep == 0, float("-inf")), -1) @ v


@pytest.mark.parametrize("program,m", [(LearnedLambda, 16), (bitwise_and_interval, 16), (float_index_mask, 1),
                                       (triu_mask, 16), (tril_float_mask, 16)],
                         ids=["learned_lambda", "bitwise_and", "float_index_mask_one_query", "triu_bool", "tril_float"])
def test_programs_that_crashed_fuse_and_are_right(program, m, device):
    """They fuse, run warning-free (the suite turns Triton's warnings into errors) and are right."""
    fn = program().to(device) if isinstance(program, type) else program
    g = torch.Generator().manual_seed(5)
    count = 5 if isinstance(fn, LearnedLambda) else 3
    args = [torch.randn(2, 2, m, 32, generator=g) for _ in range(count)]
    args[1:] = [torch.randn(2, 2, 16, 32, generator=g) for _ in range(count - 1)]
    if count == 5:  # q1, k1, q2, k2, v: the second query has the first's length
        args[2] = torch.randn(2, 2, m, 32, generator=g)
    args = tuple(a.to(device) for a in args)
    optimized = fxflash.optimize(fn)
    out = optimized(*args)
    assert_fused(optimized.report(*args))
    assert_accurate(fn, args, out)


@pytest.mark.parametrize("share", ["expand", "repeat_interleave"])
def test_rows_every_key_masks_with_a_finite_fill_under_grouped_heads(share, device):
    """A row whose every key a ``finfo.min`` fill masks is V's average over the keys, read from V's
    column sums (the kernel visits none of its tiles). With one K/V head shared by the query heads
    (batch one) the sums were a view with a broadcast row, and every head but the first read past
    it (a random program)."""
    def program(q, k, v, keep):
        k, v = ((t[:, :, None].expand(1, 1, 4, 16, t.size(-1)).reshape(1, 4, 16, -1) if share == "expand"
                 else t.repeat_interleave(4, dim=1)) for t in (k, v))
        s = (q @ k.transpose(-1, -2)).masked_fill(~keep, torch.finfo(q.dtype).min)
        return torch.softmax(s, -1) @ v

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 4, 5, 8, generator=g), torch.randn(1, 1, 16, 8, generator=g), torch.randn(1, 1, 16, 8, generator=g)
    keep = torch.rand(1, 1, 5, 1, generator=g) > 0.5   # whole rows kept or masked
    keep[..., 0, :] = False
    _fused_and_accurate(program, (q, k, v, keep), device)


def test_rows_every_key_masks_with_a_finite_fill_over_a_transposed_v(device):
    """V read through a transpose (stored ``[*, Dv, N]``): its column sums would be taken over the
    wrong axis, so such rows are computed again by the repair kernel instead."""
    def program(q, k, vt, keep):
        s = (q @ k.transpose(-1, -2)).masked_fill(~keep, torch.finfo(q.dtype).min)
        return torch.softmax(s, -1) @ vt.transpose(-1, -2)

    g = torch.Generator().manual_seed(0)
    args = (torch.randn(1, 2, 5, 8, generator=g), torch.randn(1, 2, 16, 8, generator=g),
            torch.randn(1, 2, 6, 16, generator=g), torch.rand(1, 1, 5, 1, generator=g) > 0.5)
    args[3][..., 0, :] = False
    _fused_and_accurate(program, args, device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_a_bias_near_the_dtypes_limit_folded_under_the_score_scale_stays_finite(dtype, device):
    """``s/√d + b`` with ``b = (1 − m)·finfo.min`` computed at run time: the kernel folds the scale,
    ``(s + b·√d)/√d``, and ``b·√d`` overflowed to -inf where eager's sum is finite, so a row every
    key masks came out NaN instead of V's average (a random program)."""
    def program(q, k, v, m):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
        return torch.softmax(s + (1.0 - m.to(s.dtype)) * torch.finfo(s.dtype).min, -1) @ v

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g).to(dtype) for _ in range(3))
    for keep in (False, True):
        _fused_and_accurate(program, (q, k, v, torch.full((1, 1, 1, 1), keep)), device)


def test_a_16_bit_row_whose_maximum_nears_the_exact_range_in_exp2_units_is_repaired(device):
    """fp16 scores of ``(s + (1 − m)·finfo.min)·0.25`` reach a maximum of about -16376, -23626 in
    exp2 units: past fp16's 2¹⁴, where eager's own rounding decides the row (every score the same),
    so the row is computed again. The kernel compared the maximum in natural units, which it had
    converted back to after the loop, and kept its own answer (a random program)."""
    def program(q, k, v, m):
        s = q @ k.transpose(-1, -2)
        return torch.softmax((s + (1.0 - m.to(s.dtype)) * torch.finfo(s.dtype).min) * 0.5 * 0.5, -1) @ v

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 1, generator=g).to(torch.float16) for n in (1, 16, 16))
    _fused_and_accurate(program, (q, k, v, torch.zeros(1, 1, 1, 1, dtype=torch.bool)), device)


def _fused_and_accurate(program, args, device):
    """``program`` optimized on ``args`` (moved to ``device``) fuses and is right."""
    args = tuple(a.to(device) for a in args)
    optimized = fxflash.optimize(program)
    out = optimized(*args)
    assert_fused(optimized.report(*args))
    assert_accurate(program, args, out)


def test_meta_tensors_run_eagerly():
    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v
    args = tuple(torch.empty(*SHAPE, device="meta") for _ in range(3))
    out = fxflash.optimize(attention)(*args)
    assert out.device.type == "meta" and out.shape == SHAPE
    (region,) = fxflash.explain(attention, *args).regions
    assert not region.fused and region.rule == "device"


# -- internal errors ------------------------------------------------------------------------------

def _fail(*args, **kwargs):
    raise ZeroDivisionError("injected")


# (stage, what to break): every one of fxflash's stages, by the name it is looked up under
INJECTIONS = [
    ("capture", "fxflash.capture.trace.collapse_layout_chains"),  # before fusion: independent of it
    ("analysis", "fxflash.pipeline.analyse"),
    ("fusion rules", "fxflash.pipeline.build_region"),
    ("code generation", "fxflash.codegen.emit_kernel"),
    ("kernel compilation", "fxflash.runtime.load_kernel"),
    ("rewrite", "fxflash.runtime.replace_region"),
    ("tuning", "fxflash.runtime.launch.tile_for"),
    ("launch", "fxflash.runtime.launch.Launcher.__call__"),
    ("backward", "fxflash.runtime.backward._fused_gradients"),
]


@pytest.mark.fusion_independent
def test_every_stage_is_covered():
    assert [stage for stage, _ in INJECTIONS] == list(internal.STAGES)


@pytest.mark.parametrize("stage,target", [
    pytest.param(*injection, marks=[pytest.mark.fusion_independent] if injection[0] in ("capture", "analysis") else [])
    for injection in INJECTIONS], ids=[s for s, _ in INJECTIONS])
def test_an_internal_error_is_a_refusal_not_a_crash(stage, target, monkeypatch, device):
    """An exception inside any stage reaches the user as one warning that names the stage and asks
    for a report; the program runs as eager; explain() shows rule ``internal error``."""
    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 8, -1) @ v
    args = tuple(t.to(device) for t in _qkv(torch.float32))
    monkeypatch.setattr(target, _fail)
    backward = stage == "backward"   # the gradients of a fused forward, recomputed eagerly
    leaves = [t.clone().requires_grad_(backward) for t in args]
    with pytest.warns(RuntimeWarning, match=f"internal error in {stage}: ZeroDivisionError: injected") as record:
        fast = fxflash.optimize(attention)
        for _ in range(2 if backward else 1):   # warned once: the second call's backward is eager's at once
            out = fast(*leaves)
            if backward:
                out.sum().backward()
    assert len([w for w in record if "internal error" in str(w.message)]) == 1
    assert "please report" in str(record[0].message)
    torch.testing.assert_close(out, attention(*args))
    if backward:
        eager = [t.clone().requires_grad_() for t in args]
        attention(*eager).sum().backward()
        for got, want in zip(leaves, eager):
            torch.testing.assert_close(got.grad / 2, want.grad)   # two backward calls accumulated
        assert [r.backward for r in fxflash.explain(attention, *args).regions] == ["fused"]
    if stage in ("tuning", "launch", "backward"):
        return  # they run at the first call; explain() runs no kernel
    with pytest.warns(RuntimeWarning, match="internal error"):
        report = fxflash.explain(attention, *args)
    if stage in ("capture", "analysis"):
        assert not report.regions and f"internal error in {stage}" in report.capture_note
        assert f"internal error in {stage}" in str(report)
    else:
        (region,) = report.regions
        assert not region.fused and region.rule == "internal error" and stage in region.reason


# -- the user's own objects -----------------------------------------------------------------------

class Cache:
    """A key cache as transformers' DynamicCache keeps one: lists of tensors, updated in place."""

    def __init__(self):
        self.keys: list = []
        self.seen = 0

    def update(self, k):
        self.keys.append(k)
        self.seen += 1
        return torch.cat(self.keys, dim=-2)


class Mutating(torch.nn.Module):
    """A module whose forward writes a buffer in place (which a graph replays)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, q, k, v):
        self.calls += 1
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


def appends_to_list(q, k, v, log):
    log.append(q.sum())
    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


def updates_dict(q, k, v, state):
    state["steps"] = state.get("steps", 0) + 1
    state["last"] = k
    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


def updates_cache(q, k, v, cache):
    keys = cache.update(k)
    return torch.softmax(q @ keys.transpose(-1, -2), -1) @ keys


def writes_input(q, k, v):
    k.mul_(0.5)
    return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


def _state(x, ids: bool = True):
    """A deep picture of ``x``: containers by their items, objects by their attributes, tensors by
    value; with ``ids``, each by its identity too."""
    tag = id(x) if ids else None
    if isinstance(x, torch.Tensor):
        return ("tensor", tag, x.detach().clone())
    if isinstance(x, (list, tuple)):
        return (type(x), tag, [_state(i, ids) for i in x])
    if isinstance(x, dict):
        return ("dict", tag, {k: _state(v, ids) for k, v in x.items()})
    if isinstance(x, torch.nn.Module):
        return ("module", tag, {k: _state(v, ids) for k, v in x.state_dict(keep_vars=True).items()})
    if hasattr(x, "__dict__"):
        return (type(x), tag, {k: _state(v, ids) for k, v in vars(x).items()})
    return x


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("program,extra", [(appends_to_list, lambda: [[]]), (updates_dict, lambda: [{}]),
                                           (updates_cache, lambda: [Cache()]), (writes_input, list),
                                           (Mutating, list)],
                         ids=["list", "dict", "cache_object", "input_tensor", "module_buffer"])
def test_side_effects_happen_as_in_eager_once_per_call(program, extra, device):
    """Lists, dicts, cache objects, input tensors and buffers changed by the code change as eager
    changes them, once per call, through explain() (which runs the call once), optimize() and its
    report() (which runs the call again); and the attention fuses."""
    def fresh():
        torch.manual_seed(0)
        fn = program().to(device) if isinstance(program, type) else program
        return fn, tuple(t.to(device) for t in _qkv(torch.float32)) + tuple(extra())

    eager_fn, eager_args = fresh()
    outs = [eager_fn(*eager_args) for _ in range(3)]
    fn, args = fresh()
    report = fxflash.explain(fn, *args)
    optimized = fxflash.optimize(fn)
    got = optimized(*args)
    assert_fused(optimized.report(*args))
    assert_fused(report)
    torch.testing.assert_close(got, outs[1])
    assert _same(_state(args, ids=False), _state(eager_args, ids=False))
    assert _same(_state(fn, ids=False), _state(eager_fn, ids=False))


# -- the user's own errors ------------------------------------------------------------------------

@pytest.mark.fusion_independent
def test_the_users_error_is_eagers_own_and_the_code_runs_at_most_twice(capfd, caplog):
    runs = []

    def wrong(q, k, v):
        runs.append(1)
        return torch.softmax(q @ k, -1) @ v  # K not transposed: a shape error

    q, k, v = _qkv(torch.float32)
    with pytest.raises(RuntimeError) as eager_error:
        wrong(q, k, v)
    runs.clear()
    with caplog.at_level(logging.DEBUG, logger="torch"), pytest.raises(RuntimeError) as error:
        fxflash.optimize(wrong)(q, k, v)
    assert str(error.value) == str(eager_error.value)
    assert len(runs) <= 2
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "fake_tensor" not in capfd.readouterr().err


@pytest.mark.fusion_independent  # the graph break splits the chain: fused or not, the same
def test_data_dependent_code_runs_as_written_once_per_call():
    """Python control flow that reads tensor values is a graph break (Dynamo's): each call takes
    its own branch, its Python runs once per call, and no warning is given."""
    runs = []

    def branchy(q, k, v):
        runs.append(1)
        s = q @ k.transpose(-1, -2)
        if s.max() > 10:
            s = s / 2
        return torch.softmax(s, -1) @ v

    q, k, v = _qkv(torch.float32)
    optimized = fxflash.optimize(branchy)
    for inputs in ((q, k, v), (q / 100, k, v)):  # each branch
        expected = branchy(*inputs)
        runs.clear()
        torch.testing.assert_close(optimized(*inputs), expected)
        assert len(runs) == 1


class DropoutAttention(torch.nn.Module):
    """Attention whose output projection has dropout: what it computes depends on train()/eval()."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, q, k, v):
        o = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)), dim=-1) @ v
        return self.drop(self.proj(o))


@pytest.mark.parametrize("first", ["eval", "train"])
def test_train_and_eval_are_part_of_the_signature(first, device):
    """A module captured in one mode and called in the other gets a graph of its own: dropout
    applies in training only (about half the outputs zero), never in eval."""
    model = DropoutAttention().to(device)
    q, k, v = (t.to(device) for t in _qkv(torch.float32))
    optimized = fxflash.optimize(model)
    for mode in (first, "eval" if first == "train" else "train"):
        getattr(model, mode)()
        out = optimized(q, k, v)
        assert_fused(optimized.report(q, k, v))
        zeros = (out == 0).float().mean().item()
        if mode == "eval":
            torch.testing.assert_close(out, model(q, k, v))
        else:
            assert 0.35 < zeros < 0.65, zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_float_argument_that_changes_between_calls_is_read_at_run_time(dtype, device):
    """Dynamo passes a float argument that changes between calls as a 0-d tensor: the kernel reads
    it at run time (Python arithmetic on it in fp64, as Python computes it) and stays fused, with
    eager's answers, through torch.compile and optimize()."""
    def attention(q, k, v, scale):
        return torch.softmax(q @ k.transpose(-1, -2) * (scale * 2.0), dim=-1) @ v

    torch._dynamo.reset()
    q, k, v = (t.to(device, dtype) for t in _qkv(torch.float32))
    compiled = torch.compile(attention, backend="fxflash")
    optimized = fxflash.optimize(attention)
    for scale in (0.125, 0.15, 0.35):
        for fast in (compiled, optimized):
            assert_accurate(lambda *a: attention(*a, scale), (q, k, v), fast(q, k, v, scale))
        assert_fused(optimized.report(q, k, v, scale))
    torch._dynamo.reset()


@dataclasses.dataclass
class AttentionConfig:
    scale: float
    causal: bool


def _configured(q, k, v, cfg):
    s = q @ k.transpose(-1, -2) * cfg.scale
    if cfg.causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def test_object_arguments_are_keyed_by_their_contents(device):
    """A config object passed as an argument is keyed by its attributes, not its address: new
    configs made and freed one after another (an address reused) and a config whose attribute
    changes between calls each get a graph of their own, with eager's answers."""
    q, k, v = (t.to(device) for t in _qkv(torch.float32))
    optimized = fxflash.optimize(_configured)
    for scale, causal in ((0.1, False), (0.7, True), (0.3, False), (0.7, False)):
        torch.testing.assert_close(optimized(q, k, v, AttentionConfig(scale, causal)),
                                   _configured(q, k, v, AttentionConfig(scale, causal)))
    cfg = AttentionConfig(0.2, False)
    for scale, causal in ((0.2, False), (0.9, False), (0.9, True)):
        cfg.scale, cfg.causal = scale, causal
        out = optimized(q, k, v, cfg)
        assert_fused(optimized.report(q, k, v, cfg))
        torch.testing.assert_close(out, _configured(q, k, v, cfg))


SCALE = 0.125  # a global the program below reads


class ScaledAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 0.5

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) * self.scale * (SCALE * 8), dim=-1) @ v


def test_attributes_globals_and_closures_read_by_the_trace_are_part_of_the_signature(device, monkeypatch):
    """A module attribute, a global and a closure flag that change between calls each get a
    graph of their own, with eager's answers (each was once reused stale)."""
    q, k, v = (t.to(device) for t in _qkv(torch.float32))
    model = ScaledAttention()
    optimized = fxflash.optimize(model)
    for scale, global_scale in ((0.5, 0.125), (0.9, 0.125), (0.9, 0.3)):
        model.scale = scale
        monkeypatch.setattr(sys.modules[__name__], "SCALE", global_scale)
        out = optimized(q, k, v)
        assert_fused(optimized.report(q, k, v))
        torch.testing.assert_close(out, model(q, k, v))

    causal = False

    def program(q, k, v):
        s = q @ k.transpose(-1, -2)
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    optimized = fxflash.optimize(program)
    for causal in (False, True, False):
        torch.testing.assert_close(optimized(q, k, v), program(q, k, v))


class ItemScaled(torch.nn.Module):
    """A temperature read with ``.item()``: Python control leaves the graph (a graph break), and the
    attention after it reads the float."""

    def __init__(self):
        super().__init__()
        self.register_buffer("temperature", torch.tensor(2.0))

    def forward(self, q, k, v):
        scale = 1.0 / self.temperature.item()
        return torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1) @ v


def test_a_scale_read_with_item_follows_its_tensor(device):
    model = ItemScaled().to(device)
    q, k, v = (t.to(device) for t in _qkv(torch.float32))
    optimized = fxflash.optimize(model)
    for temperature in (2.0, 3.0, 0.5):
        model.temperature.fill_(temperature)
        out = optimized(q, k, v)
        assert_fused(optimized.report(q, k, v))
        torch.testing.assert_close(out, model(q, k, v))
