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
