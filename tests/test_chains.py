"""Chain discovery on the variants: exactly the attention chains, nothing else."""
import dataclasses

import pytest
import torch

from fxflash.variants import VARIANTS, Shape, vanilla
from helpers import chains_of

pytestmark = pytest.mark.fusion_independent  # analysis and capture, no kernel

REDUCTION_FREE = {"sigmoid_attention", "relu_attention"}  # P·V is the only reduction over N
SHAPES = {
    "mha": Shape(B=2, H=4, Hkv=4, M=9, N=9, D=8, Dv=8),
    "gqa": Shape(B=2, H=4, Hkv=2, M=9, N=9, D=8, Dv=8),
    "cross": Shape(B=1, H=2, Hkv=1, M=5, N=11, D=8, Dv=6),
}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", VARIANTS, ids=str)
def test_chain_count(name, shape):
    variant = VARIANTS[name]
    args = variant.inputs(SHAPES[shape])
    chains = chains_of(variant.fn, *args)
    assert len(chains) == variant.chains
    for chain in chains:
        assert not chain.escapes
        assert chain.reductions or name in REDUCTION_FREE


def test_listing1_with_mask_and_in_place_scale():
    q, k, v = VARIANTS["vanilla"].inputs(SHAPES["cross"])
    mask = torch.ones(5, 11, dtype=torch.int64).tril()
    (chain,) = chains_of(vanilla, q, k, v, mask)
    names = " ".join(n.name for n in chain.nodes)
    assert "where" in names and "amax" in names


def test_evoformer_is_five_dimensional():
    variant = VARIANTS["evoformer_row"]
    args = variant.inputs(SHAPES["mha"])
    assert args[0].dim() == 5
    (chain,) = chains_of(variant.fn, *args)
    assert chain.output.meta["val"].dim() == 5


def test_weights_returned_beside_the_output_escape_the_region():
    def f(q, k, v):
        p = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        return p @ v, p

    (chain,) = chains_of(f, *VARIANTS["vanilla"].inputs(SHAPES["mha"]))
    assert [n.name for n in chain.escapes]


def test_two_layers_give_two_chains_not_one_across_them():
    def two_layers(q, k, v):
        a = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
        return torch.softmax(a @ k.transpose(-2, -1), dim=-1) @ v

    shape = dataclasses.replace(SHAPES["mha"], Dv=8)
    chains = chains_of(two_layers, *VARIANTS["vanilla"].inputs(shape))
    assert len(chains) == 2
    assert not set(chains[0].nodes) & set(chains[1].nodes)


def test_an_mlp_is_not_an_attention_chain():
    """``relu(x·W1)·W2`` has the chain's shape but no reduction and no batch: left to Inductor."""
    (x, w1, w2) = VARIANTS["mlp"].inputs(SHAPES["mha"])
    assert chains_of(VARIANTS["mlp"].fn, x, w1, w2) == []
    batched = chains_of(VARIANTS["relu_attention"].fn, *VARIANTS["relu_attention"].inputs(SHAPES["mha"]))
    assert len(batched) == 1 and not batched[0].reductions


def _residual_layers(x, wq, wk, wv, wo, w1, w2):
    """Three layers of attention and an MLP on a residual stream, the weights shared: every
    layer's projections reach every later layer's through the residual adds."""
    for _ in range(3):
        q, k, v = (x @ w for w in (wq, wk, wv))
        x = x + (torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v) @ wo
        x = x + torch.relu(x @ w1) @ w2
    return x


def test_chain_discovery_finds_the_nodes_between_two_contractions_as_networkx_does():
    """Chain discovery searches between two contractions only inside what the first reaches with
    no contraction on the way, and skips a pair with a contraction between: for every pair it
    pairs, the nodes between and whether a contraction lies between are networkx's."""
    import networkx as nx

    from fxflash.patterns import chains as C
    from helpers import analysed

    g = torch.Generator().manual_seed(0)
    args = [torch.randn(2, 8, 16, generator=g)] + [torch.randn(16, 16, generator=g) for _ in range(6)]
    _, analysis = analysed(_residual_layers, *args)
    contractions = analysis.nodes_of_kind(C.OpKind.CONTRACTION)
    nexts, inside = {}, {}
    for c in contractions:
        nexts[c], inside[c] = C._next_contractions(analysis, c)
    reach = C._reaching(sorted(contractions, key=analysis.order.__getitem__), nexts)
    pairs = 0
    for first in contractions:
        for second in nexts[first]:
            full = (nx.descendants(analysis.dataflow, first) & nx.ancestors(analysis.dataflow, second)) - {first, second}
            crossed = C._contraction_between(first, second, nexts, reach)
            assert crossed == any(analysis.kinds[n] is C.OpKind.CONTRACTION for n in full)
            if not crossed:
                assert C._between(analysis, second, inside[first]) == full
            pairs += 1
    assert pairs > 3 * 7  # each layer's projections pair with later layers' through the residual stream
    assert len(C.find_chains(analysis)) == 3
