"""capture/batch_views.py: a view that splits the batch axis moves up through elementwise ops."""
import pytest
import torch

import fxflash
from fxflash.capture import capture
from fxflash.variants import VARIANTS, Shape
from helpers import assert_accurate, assert_fused

aten = torch.ops.aten


def bloom_attention(q, k, v, alibi, mask):
    """BLOOM's spelling: scores in the contraction's [B·H, M, N] frame (ALiBi added there by
    baddbmm), viewed [B, H, M, N] for the mask and the softmax, viewed back for P·V."""
    b, h, m, d = q.shape
    n = k.size(-2)
    scores = alibi.baddbmm(q.reshape(b * h, m, d), k.reshape(b * h, n, d).transpose(1, 2), beta=1.0, alpha=d ** -0.5)
    weights = torch.softmax(scores.view(b, h, m, n) + mask, dim=-1)
    return torch.bmm(weights.view(b * h, m, n), v.reshape(b * h, n, -1)).view(b, h, m, -1)


def _inputs():
    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=2, H=3, Hkv=3, M=9, N=9, D=8, Dv=8))
    alibi = torch.randn(2 * 3, 1, 9)
    mask = torch.zeros(2, 1, 9, 9).masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
    return q, k, v, alibi, mask


def test_scores_viewed_after_their_bias_fuse_as_one_frame():
    args = _inputs()
    fast = fxflash.optimize(bloom_attention)
    assert_fused(fast.report(*args))
    assert_accurate(bloom_attention, args, fast(*args))


@pytest.mark.fusion_independent
def test_the_view_moves_to_the_contraction_and_the_values_stay():
    args = _inputs()
    captured = capture(bloom_attention, args)
    graph = captured.graph_module.graph
    (bmm,) = [n for n in graph.nodes if n.target is aten.bmm.default and len(n.meta["val"].shape) == 3
              and n.meta["val"].shape[-1] == 9]
    (user,) = bmm.users
    assert user.target in (aten.view.default, aten._unsafe_view.default) and list(user.meta["val"].shape) == [2, 3, 9, 9]
    torch.testing.assert_close(captured.run(captured.graph_module, args, {}), bloom_attention(*args))


def test_a_view_not_on_the_way_from_a_contraction_stays():
    """Differential attention with one head pair and batch one: ``attn.view(1, 1, 2, M, N)`` of the
    softmax also splits the first axis (1 → 1 × 1), but no contraction lies behind the division
    through elementwise ops alone: the view stays where the stream rules read it, and it fuses."""
    from fxflash import variants

    args = (torch.randn(1, 2, 24, 16), torch.randn(1, 2, 24, 16), torch.randn(1, 1, 24, 32))
    fast = fxflash.optimize(variants.diff_attention)
    assert_fused(fast.report(*args))
    assert_accurate(variants.diff_attention, args, fast(*args))


def test_bloom_in_bf16_fuses_and_its_kernel_reads_the_16_bit_q_and_k():
    """In bf16, torch's baddbmm decomposition widens q and k to fp32 and casts the scores back to
    bf16 before BLOOM's view: the view moves up through that cast too, and the kernel reads q and
    k as they are (Operand.widened: a bf16 dot with fp32 sums is eager's fp32 dot of the widened
    values), so the fp32 copies of q and k leave the graph."""
    from helpers import region_and_kinds

    args = tuple(a.to(torch.bfloat16) for a in _inputs())
    fast = fxflash.optimize(bloom_attention)
    report = fast.report(*args)
    assert_fused(report)
    assert_accurate(bloom_attention, args, fast(*args))
    region, _ = region_and_kinds(bloom_attention, *args)
    for operand in (region.q, region.k):
        assert operand.widened and operand.node.meta["val"].dtype is torch.bfloat16
        assert operand.math_dtype is torch.float32
    assert not region.v.widened
    casts = [n for n in report.rewritten.graph.nodes
             if n.target is aten._to_copy.default and n.meta["val"].dtype is torch.float32 and n.meta["val"].dim() == 3
             and n.meta["val"].shape[-1] == 8]
    assert not casts, casts
