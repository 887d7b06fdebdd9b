"""Calls of ``scaled_dot_product_attention``: read as their math form and fused, or kept as PyTorch's
kernel with the reason in the report; either way the answer is SDPA's. Calls without a mask keep
PyTorch's kernel by default (config.sdpa_calls); the fusing tests read them too."""
import pytest
import torch
import torch.nn.functional as F

import fxflash
from helpers import assert_accurate, assert_fused

sdpa = F.scaled_dot_product_attention


def _rnd(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape).to(device=device, dtype=dtype)


def _bool_mask(device):
    """Random keep-mask over [B, 1, M, N] with row 3 of the first batch masked entirely (SDPA: zeros)."""
    g = torch.Generator().manual_seed(3)
    keep = torch.rand(2, 1, 19, 37, generator=g) > 0.4
    keep[0, 0, 3] = False
    return keep.to(device)


def _float_mask(device):
    """An additive mask with -inf entries, and one row -inf everywhere."""
    g = torch.Generator().manual_seed(4)
    bias = torch.randn(19, 37, generator=g)
    bias[torch.rand(19, 37, generator=g) > 0.7] = float("-inf")
    bias[5] = float("-inf")
    return bias.to(device)


CASES = {
    "plain": lambda q, k, v, d: sdpa(q, k[:, :1].expand(-1, 4, -1, -1), v[:, :1].expand(-1, 4, -1, -1)),
    "causal_gqa": lambda q, k, v, d: sdpa(q, k, v, is_causal=True, enable_gqa=True),
    "bool_mask_scale": lambda q, k, v, d: sdpa(q, k, v, attn_mask=_bool_mask(d), scale=0.3, enable_gqa=True),
    "float_mask": lambda q, k, v, d: sdpa(q, k, v, attn_mask=_float_mask(d), enable_gqa=True),
    "mask_built_in_graph": lambda q, k, v, d: sdpa(
        q, k, v, enable_gqa=True,
        attn_mask=torch.arange(37, device=q.device)[None, None, None, :] < torch.tensor([30, 11], device=q.device)[:, None, None, None]),
    "three_dims": lambda q, k, v, d: sdpa(q[0], k[0, :1].expand(4, -1, -1), v[0, :1].expand(4, -1, -1), is_causal=True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES)
def test_sdpa_calls_fuse_as_their_math_form(case, dtype, device):
    """Causal (aligned top-left where M ≠ N), boolean and additive masks with fully masked rows
    (SDPA gives 0 there), an explicit scale, GQA, 3-D operands: one fused region read from the call,
    SDPA's answer within its own error against float64."""
    q, k, v = _rnd(2, 4, 19, 16, dtype=dtype, device=device), _rnd(2, 2, 37, 16, dtype=dtype, device=device), \
        _rnd(2, 2, 37, 24, dtype=dtype, device=device)

    def fn(q, k, v):
        return CASES[case](q, k, v, q.device)

    fast = fxflash.optimize(fn)
    with fxflash.config.overridden(sdpa_calls="all"):  # the calls without a mask too
        out = fast(q, k, v)
        report = fast.report(q, k, v)
    assert [r.fused for r in report.regions] == [True] and report.regions[0].origin, str(report)
    assert not report.left_alone
    assert_accurate(fn, (q, k, v), out)


MASK = torch.ones(16, 16, dtype=torch.bool).tril()


@pytest.mark.fusion_independent
def test_calls_without_a_mask_keep_pytorchs_kernel_by_default():
    """There PyTorch's own kernel (FlashAttention, cuDNN) is as fast or faster (config.sdpa_calls)."""
    q = _rnd(1, 2, 16, 8)
    assert "no attn_mask" in _kept(lambda q: sdpa(q, q, q, is_causal=True), q)
    with fxflash.config.overridden(sdpa_calls="none"):  # and every call, where the user asks
        assert "'none'" in _kept(lambda q: sdpa(q, q, q, attn_mask=MASK), q)


def _kept(fn, *args):
    """fn's SDPA call runs PyTorch's kernel: nothing fused, the reason reported, SDPA's exact values."""
    report = fxflash.explain(fn, *args)
    assert not any(r.fused for r in report.regions)
    (line,) = report.left_alone
    assert torch.equal(fxflash.optimize(fn)(*args), fn(*args))
    return line


@pytest.mark.fusion_independent
def test_dropout_keeps_pytorchs_kernel():
    torch.manual_seed(0)
    q = _rnd(1, 2, 16, 8)
    line = _kept(lambda q: sdpa(q, q, q, attn_mask=MASK, dropout_p=0.25) * 0 + q, q)  # random values, a fixed result
    assert "dropout" in line and "left alone:" in str(fxflash.explain(lambda q: sdpa(q, q, q, dropout_p=0.25), q))


@pytest.mark.fusion_independent
def test_a_call_whose_operands_require_grad_keeps_pytorchs_kernel():
    """Training: SDPA has a fused backward; a fused region's backward is recomputed eagerly."""
    q = _rnd(1, 2, 16, 8).requires_grad_()
    line = _kept(lambda q: sdpa(q, q, q, attn_mask=MASK), q)
    assert "require grad" in line
    out = fxflash.optimize(lambda q: sdpa(q, q, q, attn_mask=MASK))(q)
    (grad,) = torch.autograd.grad(out.square().sum(), q)
    (expected,) = torch.autograd.grad(sdpa(q, q, q, attn_mask=MASK).square().sum(), q)
    torch.testing.assert_close(grad, expected)


def test_a_call_whose_math_form_is_refused_keeps_pytorchs_kernel():
    """Head dim 320 exceeds one tile: the math form is refused, the graph traced again with the
    call kept as PyTorch's kernel (never its slower math form), and the report says why."""
    q = _rnd(1, 2, 16, 320)
    line = _kept(lambda q, k: sdpa(q, k, k, attn_mask=MASK), q, q.flip(2))
    assert "math form did not fuse" in line and "dimension elimination" in line


def test_explain_names_the_call_a_region_was_read_from(device):
    q = _rnd(1, 2, 16, 8, device=device)
    text = str(fxflash.explain(lambda q, k, v: sdpa(q, k, v, attn_mask=MASK.to(q.device)), q, q, q))
    assert "(read from scaled_dot_product_attention): fused, one kernel" in text
    assert "a call of scaled_dot_product_attention, as its math form" in text


def test_fully_masked_rows_of_the_safe_softmax_are_not_repaired(device):
    """A 16-bit kernel leaves rows whose running maximum is infinite to the repair kernel; the math
    form's safe softmax replaces a -inf maximum by 0 before any use, so eager's row is exp(-inf) = 0
    everywhere, as the kernel's: such rows (a left-padded batch's padding queries: no score above
    -inf seen) are not flagged. A softmax that reads the -inf maximum itself leaves them where the
    kernel's row is NaN throughout, as eager's."""
    q, k = (_rnd(2, 4, n, 16, dtype=torch.bfloat16, device=device) for n in (19, 37))
    keep = _bool_mask(device)

    def plain_softmax(q, k, v):
        s = (q @ k.transpose(-2, -1)).float().masked_fill(~keep, float("-inf"))
        return torch.softmax(s, -1).to(v.dtype) @ v

    (safe,) = fxflash.explain(lambda q, k, v: sdpa(q, k, v, attn_mask=keep), q, k, k).regions
    (plain,) = fxflash.explain(plain_softmax, q, k, k).regions
    flag = [line for line in safe.source.splitlines() if "saturated = saturated |" in line and "acc_amax" in line]
    assert flag and all("& seen_amax" in line and "(out != out)" not in line for line in flag)
    flag = [line for line in plain.source.splitlines() if "saturated = saturated |" in line and "acc_amax" in line]
    assert flag and all("~seen_amax" in line and "(out != out)" in line for line in flag)


def test_a_row_of_finfo_min_scores_under_the_safe_softmax_is_eagers_average(device):
    """A float mask of bf16's ``finfo.min`` over every key of a row: its scores are finite, and
    eager's row is the average of V; the scaled maximum overflows to -inf in exp2 units, yet the
    row saw scores above -inf, so it is repaired, not taken for a row of -inf scores (0)."""
    q, k, v = (_rnd(2, 4, 37, 16, dtype=torch.bfloat16, device=device) for _ in range(3))
    mask = torch.zeros(2, 1, 37, 37, dtype=torch.bfloat16, device=device)
    mask[1, :, :5] = torch.finfo(torch.bfloat16).min  # batch 1's first five queries: every key masked

    def call(q, k, v, mask):
        return sdpa(q, k, v, attn_mask=mask)

    optimized = fxflash.optimize(call)
    out = optimized(q, k, v, mask)
    assert_fused(optimized.report(q, k, v, mask))
    torch.testing.assert_close(out[1, :, :5].float(), v[1].float().mean(-2, keepdim=True).expand(-1, 5, -1),
                               atol=2e-2, rtol=0)
    assert_accurate(call, (q, k, v, mask), out)


@pytest.mark.fusion_independent
def test_a_float64_call_keeps_float64():
    """The math form widens 16-bit scores to fp32 only: a float64 call is computed in float64
    (fused, or by PyTorch's kernel where fxflash refuses the dtype)."""
    q, k, v = (torch.randn(1, 2, 16, 8, dtype=torch.float64) for _ in range(3))

    def fn(q, k, v):
        return sdpa(q, k, v, attn_mask=MASK)

    torch.testing.assert_close(fxflash.optimize(fn)(q, k, v), fn(q, k, v), atol=1e-12, rtol=1e-12)


def transformers_style(q, k, v, padding):
    """The causal and padding mask as transformers' sdpa_mask builds it under Dynamo (and_masks from
    ``new_ones((), dtype=bool)``, the padding gathered at ``[batch_idx, kv_idx]``), then SDPA."""
    batch, keys = padding.shape
    b_idx = torch.arange(batch, device=q.device)[:, None, None, None]
    q_idx = (torch.arange(q.size(-2), device=q.device) + 0)[None, None, :, None]
    kv_idx = (torch.arange(keys, device=q.device) + 0)[None, None, None, :]
    mask = q_idx.new_ones((), dtype=torch.bool) & (kv_idx <= q_idx)
    mask = (mask & padding.bool()[b_idx, kv_idx]).expand(batch, -1, q.size(-2), keys)
    return sdpa(q, k, v, attn_mask=mask)


def test_transformers_masks_are_computed_in_the_kernel_and_skip_tiles(device):
    """Left padding (the padded queries' rows every key masks: SDPA's zeros); the mask is no tensor
    the kernel loads: its causal part skips key tiles, its padding is read per key tile."""
    q, k, v = (_rnd(2, 4, 40, 16, device=device) for _ in range(3))
    padding = torch.ones(2, 40, dtype=torch.long, device=device)
    padding[1, :6] = 0
    report = fxflash.explain(transformers_style, q, k, v, padding)
    (region,) = report.regions
    assert region.fused and region.origin
    assert any(step.startswith("block sparsity: a key tile may be skipped") for step in region.steps), region.steps
    assert torch.ops.aten.index.Tensor not in [n.target for n in report.graph.graph.nodes]
    out = fxflash.optimize(transformers_style)(q, k, v, padding)
    assert out[1, :, :6].eq(0).all()
    assert_accurate(transformers_style, (q, k, v, padding), out)
