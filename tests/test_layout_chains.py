"""capture.layout_chains: chains of layout ops that move size-one axes become plain views and
transposes, computing the same tensors."""
import random

import pytest
import torch

from fxflash.capture import capture
from fxflash.capture.layout_chains import collapse_layout_chains
from fxflash.variants import VARIANTS, Shape

pytestmark = pytest.mark.fusion_independent  # analysis and capture, no kernel

aten = torch.ops.aten


def _targets(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("name", ["einsum", "einsum_bshd"])
def test_einsum_traces_as_the_plain_program(name):
    """einsum's permutes of size-one axes are gone: what is left is the views, the one
    transpose of K (and of the [B, S, H, D] inputs' heads) a user writes, and the two bmm."""
    variant = VARIANTS[name]
    gm = capture(variant.fn, variant.inputs(Shape())).graph_module
    targets = _targets(gm)
    assert aten.unsqueeze.default not in targets and targets.count(aten.bmm.default) == 2
    if name == "einsum":
        assert aten.permute.default not in targets and targets.count(aten.transpose.int) == 1
    else:  # q, v and the output: their heads moved; K's [B, N, H, D] → [B, H, D, N]: two transposes
        assert aten.permute.default not in targets and targets.count(aten.transpose.int) == 5


def _real_strides(t: torch.Tensor) -> list:
    return [st for size, st in zip(t.shape, t.stride()) if size != 1]


def _random_chain(rng: random.Random):
    """A function of one tensor: unsqueeze, squeeze, permute, views that add or drop ones and
    reshapes that merge two axes, the permutes sometimes reordering the axes above one too,
    ended by a reshape that merges the first two axes; and its input (sizes 1–4, some ones)."""
    shape = [rng.choice([1, 2, 3, 4]) for _ in range(rng.randint(2, 4))]
    ops = []
    rank = len(shape)
    for _ in range(rng.randint(2, 6)):
        kind = rng.choice(["unsqueeze", "permute", "permute", "squeeze", "view", "merge"])
        if kind == "merge" and rank > 2:  # a reshape that merges axes (a copy after some permutes)
            ops.append(lambda t: t.reshape(-1, *t.shape[2:]))
            rank -= 1
        elif kind == "unsqueeze" or rank < 2:
            dim = rng.randint(0, rank)
            ops.append(lambda t, dim=dim: t.unsqueeze(dim))
            rank += 1
        elif kind == "permute":
            perm = list(range(rank))
            rng.shuffle(perm)
            ops.append(lambda t, perm=perm: t.permute(*perm))
        elif kind == "squeeze":
            ops.append(lambda t: t.squeeze(next((i for i, s in enumerate(t.shape) if s == 1), -1)))
            rank = None
        else:
            ops.append(lambda t: t.view(*t.shape, 1))
            rank += 1
        if rank is None:
            break

    def fn(x):
        for op in ops:
            x = op(x)
        return x.reshape(-1, *x.shape[2:]) if x.dim() > 2 else x.reshape(-1)
    return fn, torch.randn(*shape)


def test_collapsed_chains_compute_the_same_tensors():
    """Random chains, traced (real, fake or symbolic sizes) and then collapsed, give eager's
    tensors exactly (values, shape, the strides of axes above size one); many of them are
    rewritten, none into more ops."""
    from torch.fx.experimental.proxy_tensor import make_fx

    rng = random.Random(0)
    rewritten = 0
    for _ in range(200):
        fn, x = _random_chain(rng)
        gm = make_fx(fn, tracing_mode=rng.choice(["real", "fake", "symbolic"]))(x)
        before = len(_targets(gm))
        if collapse_layout_chains(gm):
            rewritten += 1
            assert len(_targets(gm)) <= before
        out, expected = gm(x), fn(x)
        assert out.shape == expected.shape and torch.equal(out, expected)
        assert _real_strides(out) == _real_strides(expected)
    assert rewritten >= 60  # 100 of these 200 (seed 0)


def test_the_pass_shortens_a_traced_einsum_and_keeps_its_value():
    """Run by hand on a graph captured without it: fewer ops, the same result."""
    from torch.fx.experimental.proxy_tensor import make_fx

    q, k = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 7, 4)
    fn = lambda q, k: torch.einsum("bhmd,bhnd->bhmn", q, k)  # noqa: E731
    gm = make_fx(fn, tracing_mode="fake")(q, k)
    before = _targets(gm)
    assert collapse_layout_chains(gm) >= 2
    after = _targets(gm)
    assert len(after) < len(before) and aten.permute.default not in after
    assert torch.equal(gm(q, k), fn(q, k))


def test_a_reorder_of_axes_above_one_keeps_its_order():
    """A chain whose net order of real axes is no swap, nor a swap and then the last two's, is
    rewritten with that permute; one that is becomes transposes. Both compute the same tensor."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(2, 3, 5, 7)
    cases = [(lambda x: x.unsqueeze(0).permute(2, 3, 4, 0, 1).reshape(15, 14), aten.permute.default),  # a 4-cycle
             (lambda x: x.unsqueeze(1).permute(0, 3, 1, 4, 2).unsqueeze(0).reshape(10, 21),      # a swap, then
              aten.transpose.int)]                                                                    # the last two
    for fn, kept in cases:
        gm = make_fx(fn, tracing_mode="real")(x)
        assert collapse_layout_chains(gm) == 1
        targets = _targets(gm)
        assert kept in targets and aten.unsqueeze.default not in targets
        assert torch.equal(gm(x), fn(x))
