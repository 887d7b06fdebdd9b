"""Block sparsity from the mask's own expression: skipping never changes a result.

The property tests draw new examples on every run (not derandomized), a few per run in CI;
``FXFLASH_LONG=1`` draws ten times as many."""
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fxflash
from fxflash.runtime import launch
from fxflash.variants import VARIANTS, Shape
from helpers import assert_accurate

LONG = 10 if os.environ.get("FXFLASH_LONG") else 1   # examples drawn: the CI count times this
SCAN = "for c0 in range(0, n_tiles, "                      # key tiles classified a chunk at a time
FULL_LOOP = "range((f_lo) * BLOCK_N, (f_hi) * BLOCK_N, BLOCK_N)"  # tiles no mask touches

LINEAR = st.tuples(st.integers(-2, 2), st.integers(-2, 2), st.integers(-40, 40))
COMPARE = st.sampled_from(["<=", "<", ">=", ">", "==", "!="])
# an optional floor division or remainder by a positive literal: block ids, canvas positions,
# dilations (operands of any sign)
DIVIDE = st.tuples(st.sampled_from(["", "//", "%"]), st.integers(1, 9))
AFFINE = st.tuples(st.integers(-2, 2), st.integers(-30, 30), DIVIDE)  # (a·x + c) [// or % d]


def _atom():
    linear = st.tuples(LINEAR, DIVIDE, COMPARE, st.integers(-20, 20)).map(lambda t: ("cmp",) + t)
    # f(i) - g(j) compared: i // b <= j // b (block-causal), |i % w - j % w| (a 2-D canvas)
    split = st.tuples(AFFINE, AFFINE, COMPARE, st.integers(-10, 10)).map(lambda t: ("cmp2",) + t)
    # no interval rule (a product of two indices): unknown as an operand of & and |
    opaque = st.tuples(st.integers(-5, 5), st.integers(2, 4)).map(lambda t: ("opaque",) + t)
    return st.one_of(linear, split, opaque)


def _divide(x, divide):
    op, d = divide
    return x // d if op == "//" else x % d if op == "%" else x


def _compare(x, op, rhs):
    return {"<=": x <= rhs, "<": x < rhs, ">=": x >= rhs, ">": x > rhs, "==": x == rhs, "!=": x != rhs}[op]


MASKS = st.recursive(
    _atom(),
    lambda inner: st.one_of(
        st.tuples(st.just("and"), inner, inner),
        st.tuples(st.just("or"), inner, inner),
        st.tuples(st.just("not"), inner),
    ),
    max_leaves=4,
)


def _build(tree, i, j):
    kind = tree[0]
    if kind == "cmp":
        (a, b, c), divide, op, rhs = tree[1:]
        return _compare(_divide(a * i + b * j + c, divide), op, rhs)
    if kind == "cmp2":
        (a1, c1, div1), (a2, c2, div2), op, rhs = tree[1:]
        return _compare(_divide(a1 * i + c1, div1) - _divide(a2 * j + c2, div2), op, rhs)
    if kind == "opaque":
        c, d = tree[1:]
        return (i * j + c) % d != 0
    if kind == "not":
        return ~_build(tree[1], i, j)
    left, right = _build(tree[1], i, j), _build(tree[2], i, j)
    return left & right if kind == "and" else left | right


def _program(tree):
    def masked_attention(q, k, v):
        i = torch.arange(q.size(-2), device=q.device)[:, None]
        j = torch.arange(k.size(-2), device=q.device)[None, :]
        keep = _build(tree, i, j)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        s = s.masked_fill(~keep, float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    return masked_attention


def _padding_expanded_in_the_graph(q, k, v, am):
    """transformers' spelling: a ``[B, N]`` attention mask as bool, indexed to ``[B, 1, 1, N]`` and
    expanded over the heads and rows."""
    keep = am.bool()[:, None, None, :].expand(q.size(0), q.size(1), q.size(2), k.size(2))
    s = q @ k.transpose(-1, -2) * q.size(-1) ** -0.5
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


def test_a_mask_expanded_in_the_graph_is_read_as_the_vector_it_broadcasts():
    """The expanded axes of ``am.bool()[:, None, None, :].expand(B, H, M, N)`` are stride 0: the
    kernel loads one value per key from the ``[B, N]`` tensor (no row index in the load), not a
    ``[BLOCK_M, BLOCK_N]`` tile of the view, and skips the padding's tiles from the same tensor."""
    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=3, H=2, Hkv=2, M=40, N=70, D=8, Dv=8))
    am = torch.ones(3, 70, dtype=torch.long)
    am[1:, 9:] = 0
    args = (q, k, v, am)
    report, skipped = _skipping_changes_nothing(_padding_expanded_in_the_graph, args)
    (region,) = report.regions
    mask_loads = [line for line in region.source.splitlines() if "tl.load(in" in line and "tl.int1" in line]
    assert mask_loads and all("rm" not in line and "_s2" not in line for line in mask_loads), mask_loads
    assert SCAN in region.source
    assert_accurate(_padding_expanded_in_the_graph, args, skipped)


def _run(fn, args, sparsity: bool):
    """(report, output) with tile skipping on or off; untuned, so that both kernels launch with
    the first tile configuration (tuned separately, they may differ in tile and in rounding)."""
    with fxflash.config.overridden(block_sparsity=sparsity, autotune=False):
        return fxflash.explain(fn, *args), fxflash.optimize(fn)(*args)


def _skipping_changes_nothing(fn, args):
    """``(explain() report, output)`` with tiles skipped, after checking that the output is bit
    for bit the one of the kernel that visits every tile."""
    report, skipped = _run(fn, args, True)
    _, visited = _run(fn, args, False)
    torch.testing.assert_close(skipped, visited, rtol=0, atol=0, equal_nan=True)
    return report, skipped


@settings(max_examples=16 * LONG, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=MASKS, m=st.integers(2, 50), n=st.integers(2, 70))
def test_skipping_never_changes_the_output(tree, m, n):
    fn = _program(tree)
    args = VARIANTS["vanilla"].inputs(Shape(B=1, H=2, Hkv=2, M=m, N=n, D=8, Dv=8))
    report, skipped = _skipping_changes_nothing(fn, args)
    assert report.regions and report.regions[0].fused, report.regions
    assert_accurate(fn, args, skipped)


@pytest.mark.parametrize("name", ["causal", "sliding_window", "prefix_lm", "block_causal", "dilated_window",
                                  "neighbourhood_2d"])
def test_index_masks_skip_tiles(name):
    variant = VARIANTS[name]
    args = variant.inputs(Shape(B=1, H=2, Hkv=2, M=64, N=64, D=16, Dv=16))
    report, out = _run(variant.fn, args, True)
    (region,) = report.regions
    assert SCAN in region.source
    # whole tiles the masks keep are visited with each mask's condition a constant
    assert FULL_LOOP in region.source and "tl.full([1, 1], " in region.source
    assert any("block sparsity" in step for step in region.steps)
    assert not any("unknown" in step or "no per-tile test" in step for step in region.steps), region.steps
    assert_accurate(variant.fn, args, out)


def _triu_of_floats(q, k, v):
    """``torch.triu(torch.ones(L, L), 1).bool()``: a causal mask spelled with a float tensor."""
    masked = torch.triu(torch.ones(q.size(-2), k.size(-2), device=q.device), 1).bool()
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    return torch.softmax(s.masked_fill(masked, float("-inf")), dim=-1) @ v


def _tril_of_floats_equal_zero(q, k, v):
    """``tril(ones)[None, None] == 0``: the same mask, compared with zero."""
    kept = torch.tril(torch.ones(q.size(-2), k.size(-2), device=q.device))
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    return torch.softmax(s.masked_fill(kept[None, None] == 0, float("-inf")), dim=-1) @ v


@pytest.mark.parametrize("fn", [_triu_of_floats, _tril_of_floats_equal_zero], ids=lambda f: f.__name__)
def test_a_causal_mask_spelled_with_floats_skips_tiles(fn):
    """The interval of a float constant, of ``tril``/``triu`` of a number (the number where kept, 0
    elsewhere) and of a cast between numbers and booleans: these spellings skip tiles as the
    integer one does, and skipping changes no bit of the output."""
    args = VARIANTS["vanilla"].inputs(Shape(B=1, H=2, Hkv=2, M=64, N=64, D=16, Dv=16))
    report, out = _skipping_changes_nothing(fn, args)
    (region,) = report.regions
    assert any("block sparsity" in step for step in region.steps)
    assert not any("unknown" in step or "no per-tile test" in step for step in region.steps), region.steps
    assert_accurate(fn, args, out)


def _causal_and_opaque(q, k, v):
    i = torch.arange(q.size(-2))[:, None]
    j = torch.arange(k.size(-2))[None, :]
    keep = (j <= i) & ((i * j) % 3 != 0)  # a product of two indices has no interval rule
    s = (q @ k.transpose(-2, -1)).masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _causal_and_allowed(q, k, v, allowed):
    keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril() & allowed  # read along both tile axes
    s = (q @ k.transpose(-2, -1)).masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


@pytest.mark.parametrize("fn, part", [(_causal_and_opaque, "ne"), (_causal_and_allowed, "more than one tile axis")],
                         ids=["product_of_indices", "boolean_matrix"])
def test_a_conjunct_without_interval_leaves_the_rest_to_skip_tiles(fn, part):
    """``causal & x`` with no interval for ``x``: the causal part still empties the tiles
    above the diagonal, explain() names ``x`` as unknown, and the result is the unskipped one."""
    args = VARIANTS["vanilla"].inputs(Shape(B=2, H=2, Hkv=2, M=40, N=40, D=8, Dv=8))
    if fn is _causal_and_allowed:
        args += (torch.rand(40, 40, generator=torch.Generator().manual_seed(0)) > 0.2,)
    report, skipped = _skipping_changes_nothing(fn, args)
    (region,) = report.regions
    assert region.fused and SCAN in region.source
    assert any("as unknown" in step and part in step for step in region.steps), region.steps
    assert_accurate(fn, args, skipped)


@pytest.mark.parametrize("name", ["key_padding", "key_lengths"])
def test_padding_masks_skip_tiles(name):
    """A boolean key-padding mask ``[B, 1, 1, N]`` is summarized per key tile like document ids
    (False throughout: empty; True throughout: full), per-batch lengths are read once per
    program: trailing padding is never visited, and the result is the unskipped one."""
    variant = VARIANTS[name]
    args = variant.inputs(Shape(B=3, H=2, Hkv=2, M=40, N=70, D=8, Dv=8))
    if name == "key_padding":
        args[3][1:, ..., 9:] = False  # trailing padding of batches 1 and 2
    report, skipped = _skipping_changes_nothing(variant.fn, args)
    (region,) = report.regions
    assert SCAN in region.source and FULL_LOOP in region.source
    assert not any("unknown" in step or "no per-tile test" in step for step in region.steps), region.steps
    assert_accurate(variant.fn, args, skipped)


def _softmax_of(x: torch.Tensor) -> torch.Tensor:
    """Softmax in fp32 (fp64 for the float64 reference), cast back: as transformers computes it."""
    return torch.softmax(x.to(torch.promote_types(x.dtype, torch.float32)), dim=-1).to(x.dtype)


def _recording(run_repair, flagged: list):
    """``Launcher.run_repair`` that appends a copy of the row flags it is given to ``flagged``."""
    def run(self, inputs, frame, out, sides, flags, *args, **kwargs):
        flagged.append(flags.clone())
        return run_repair(self, inputs, frame, out, sides, flags, *args, **kwargs)
    return run


def _finite_fill(spelling: str):
    """Causal and left-padded attention, masked with ``finfo.min`` the ways transformers' models
    write it: GPT-2's ``where(keep, s, min)``, ``masked_fill(~keep, min)``, and the eager
    attention's additive ``s + where(keep.expand(B, -1, M, N), 0, min)``."""
    def masked(q, k, v, padding):
        b, _, m, d = q.shape
        n = k.size(-2)
        i = torch.arange(max(m, n), device=q.device)
        keep = (i[None, :n] <= i[:m, None])[None, None] & padding[:, None, None, :]
        s = q @ k.transpose(-1, -2) * d ** -0.5
        low = torch.finfo(q.dtype).min
        if spelling == "where":
            s = torch.where(keep, s, low)
        elif spelling == "masked_fill":
            s = s.masked_fill(~keep, low)
        else:
            s = s + torch.where(keep.expand(b, -1, m, n), torch.zeros((), dtype=q.dtype, device=q.device),
                                torch.scalar_tensor(low, dtype=q.dtype, device=q.device))
        return _softmax_of(s) @ v

    return masked


@pytest.mark.parametrize("spelling, dtype", [("where", torch.float32), ("masked_fill", torch.bfloat16),
                                             ("additive", torch.float32), ("additive", torch.bfloat16),
                                             ("additive", torch.float16)])
def test_finite_fill_masks_skip_tiles(spelling, dtype, monkeypatch):
    """A ``finfo.min`` mask is finite: a row every key masks (left padding) averages all of them in
    eager. Its tiles are skipped all the same, and such rows are flagged and computed again
    over every key; the additive spelling skips only under its bound on the scores (the tile
    range's)."""
    fn = _finite_fill(spelling)
    # the interpreter's 16×16 tiles: batch row 1's row tile 4 visits key tile 4 alone, where its
    # rows 64–69 see no key (the repair kernel's 64-row tile 1 has no other flagged row)
    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=2, H=2, Hkv=2, M=100, N=100, D=16, Dv=16), dtype)
    padding = torch.ones(2, 100, dtype=torch.bool)
    padding[1, :70] = False
    args = (q, k, v, padding)
    (region,) = fxflash.explain(fn, *args).regions
    assert region.fused and SCAN in region.source
    assert any("block sparsity" in step and "computed again over every key" in step for step in region.steps)
    assert ("skip_bound" in region.source) == (spelling == "additive")
    # rows every key masks are V's average where every masked score is F exactly (not flagged); in
    # fp16, s − 65504 rounds to steps of 32 for these scores, so those rows are computed again
    assert "uniform" in region.source
    flagged = []
    monkeypatch.setattr(launch.Launcher, "run_repair", _recording(launch.Launcher.run_repair, flagged))
    out = fxflash.optimize(fn)(*args)
    assert bool(flagged) and all((f.view(2, 2, 100)[1, :, :70] == 0).all() for f in flagged) == (dtype is not torch.float16)
    assert_accurate(fn, args, out)
    # the fully masked rows are eager's average over every key, not over the tiles visited
    torch.testing.assert_close(out[1, :, :70].float(), v[1].float().mean(-2, keepdim=True).expand(-1, 70, -1),
                               atol=2e-2, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_every_key_masks_with_minus_inf_are_not_repaired(dtype, monkeypatch):
    """With ``-inf``, a row every key masks is NaN in eager and 0/0 = NaN in the kernel: it is not
    flagged for the repair kernel (which would compute the same NaN again), and the output is
    eager's, NaN pattern included."""
    def masked(q, k, v, padding):
        i = torch.arange(q.size(-2))
        keep = (i[None, :] <= i[:, None])[None, None] & padding[:, None, None, :]
        return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf")), dim=-1) @ v

    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=2, H=2, Hkv=2, M=100, N=100, D=16, Dv=16), dtype)
    padding = torch.ones(2, 100, dtype=torch.bool)
    padding[1, :70] = False
    flagged = []
    monkeypatch.setattr(launch.Launcher, "run_repair", _recording(launch.Launcher.run_repair, flagged))
    out = fxflash.optimize(masked)(q, k, v, padding)
    assert flagged and all((f.view(2, 2, 100)[1, :, :70] == 0).all() for f in flagged)
    assert out[1, :, :70].isnan().all() and not out[0].isnan().any()
    assert_accurate(masked, (q, k, v, padding), out)


@pytest.mark.parametrize("cast_after", [False, True])
def test_a_fill_is_read_as_the_scores_hold_it(cast_after):
    """fp32's ``finfo.min`` is beyond bf16's range: in a bf16 ``where`` (or cast to bf16 after an fp32
    one) it is ``-inf``, so a row every key masks is NaN in eager, not V's average, and so it is here.
    The ``where`` holding it is a ``-inf`` mask; a cast after it changes the fill, and its mask skips
    nothing."""
    def masked(q, k, v, padding):
        i = torch.arange(q.size(-2))
        keep = (i[None, :] <= i[:, None])[None, None] & padding[:, None, None, :]
        s = q @ k.transpose(-1, -2)
        if cast_after:
            return torch.softmax(torch.where(keep, s.float(), torch.finfo(torch.float32).min).to(q.dtype), -1) @ v
        return torch.softmax(torch.where(keep, s, torch.finfo(torch.float32).min).float(), dim=-1).to(q.dtype) @ v

    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=2, H=2, Hkv=2, M=100, N=100, D=16, Dv=16), torch.bfloat16)
    padding = torch.ones(2, 100, dtype=torch.bool)
    padding[1, :70] = False
    (region,) = fxflash.explain(masked, q, k, v, padding).regions
    skips = [step for step in region.steps if "block sparsity" in step]
    assert region.fused and ((skips == []) if cast_after else ("(scores -inf" in skips[0])), region.steps
    out = fxflash.optimize(masked)(q, k, v, padding)
    assert out[1, :, :70].isnan().all() and torch.equal(out.isnan(), masked(q, k, v, padding).isnan())


def test_a_masked_score_beyond_the_bound_is_not_skipped():
    """fp16, ``finfo.min = -65504``: a masked score of 65440 adds up to ``-64``, which outweighs the
    visible scores of ``-120``, so eager's rows are that masked key's value. The bound
    ``D·max|Q|·max|K|`` reaches the mask's threshold, so every tile is visited, masked, and the
    rows give eager's answer."""
    def masked(q, k, v):
        n = k.size(-2)
        keep = torch.arange(n)[None, :] <= torch.arange(q.size(-2))[:, None]
        bias = torch.where(keep, torch.zeros((), dtype=q.dtype), torch.scalar_tensor(-65504.0, dtype=q.dtype))
        return _softmax_of(q @ k.transpose(-1, -2) + bias) @ v

    # the bound (16 · 1 · 65440 · 1.02) is beyond T = 16376: every program visits every key tile
    n, d = 128, 16
    q = torch.zeros(1, 1, n, d, dtype=torch.float16)
    q[..., 0] = 1.0  # the scores are k[:, 0]
    k = torch.zeros(1, 1, n, d, dtype=torch.float16)
    k[..., 0] = -120.0
    k[..., 100, 0] = 65440.0  # masked for the rows before it
    v = torch.randn(1, 1, n, d, generator=torch.Generator().manual_seed(0)).half()
    args = (q, k, v)
    (region,) = fxflash.explain(masked, *args).regions
    assert region.fused and SCAN in region.source and "skip_bound" in region.source
    out = fxflash.optimize(masked)(*args)
    eager = masked(*args)
    torch.testing.assert_close(eager[0, 0], v[0, 0, 100:101].expand(n, -1), atol=1e-3, rtol=0)  # key 100 wins
    torch.testing.assert_close(out, eager, atol=1e-3, rtol=0)


def test_a_row_whose_visible_scores_are_below_the_threshold_is_not_averaged():
    """fp32, ``where(causal, s, finfo.min)``: row 0 sees key 0 alone, at ``-1e38`` (below ``-T``),
    which still outweighs the masked keys' ``-3.4e38``, so eager's row 0 is V's row 0, not the
    average of V. The bound on the scores rules out the average there: the row is computed again."""
    def masked(q, k, v):
        keep = torch.arange(k.size(-2))[None, :] <= torch.arange(q.size(-2))[:, None]
        return torch.softmax(torch.where(keep, q @ k.transpose(-1, -2), torch.finfo(q.dtype).min), dim=-1) @ v

    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=1, H=1, Hkv=1, M=40, N=40, D=16, Dv=16))
    q[..., 0] = 0.0
    q[0, 0, 0, 0], k[0, 0, 0, 0] = 1e19, -1e19
    args = (q, k, v)
    (region,) = fxflash.explain(masked, *args).regions
    assert "uniform" in region.source
    out = fxflash.optimize(masked)(*args)
    eager = masked(*args)
    torch.testing.assert_close(eager[0, 0, 0], v[0, 0, 0])
    torch.testing.assert_close(out, eager)


def _additive_minus_inf(q, k, v):
    """``s + torch.full((L, L), -inf).triu(1)``: an additive causal mask, a triangle of a constant."""
    n = k.size(-2)
    mask = torch.full((q.size(-2), n), float("-inf"), dtype=q.dtype, device=q.device).triu(1)
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + mask, dim=-1) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_additive_minus_inf_triangle_skips_tiles(dtype):
    """The triangle of a constant is a where over a boolean triangle (the capture's rewrite), and
    ``s + where(c, -inf, 0)`` skips the tiles it masks while the bound on ``s`` rules out ``+inf``:
    bit for bit the kernel that visits every tile."""
    args = VARIANTS["vanilla"].inputs(Shape(B=1, H=2, Hkv=2, M=64, N=64, D=16, Dv=16), dtype)
    report, skipped = _skipping_changes_nothing(_additive_minus_inf, args)
    (region,) = report.regions
    assert SCAN in region.source and "skip_bound" in region.source and "fill_bound" not in region.source
    assert any("block sparsity" in step and "triu" in step for step in region.steps), region.steps
    assert_accurate(_additive_minus_inf, args, skipped)


def _additive_minus_inf_window(q, k, v):
    """A sliding window as a sum of two ``-inf`` triangles: ``full.triu(1) + full.tril(-8)``."""
    full = torch.full((q.size(-2), k.size(-2)), float("-inf"), dtype=q.dtype, device=q.device)
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + (full.triu(1) + full.tril(-8)), dim=-1) @ v


def test_a_sum_of_additive_minus_inf_triangles_skips_the_tiles_each_masks():
    """``s + (A + B)``, A and B ``-inf`` wherever their triangles mask: ``-inf`` where either does,
    so a tile either masks everywhere is skipped (both triangles are tile masks), bit for bit the
    kernel that visits every tile; a score of ``+inf`` under the window is NaN, as in eager."""
    args = VARIANTS["vanilla"].inputs(Shape(B=1, H=2, Hkv=2, M=64, N=64, D=16, Dv=16))
    report, skipped = _skipping_changes_nothing(_additive_minus_inf_window, args)
    (region,) = report.regions
    masks = [step for step in region.steps if step.startswith("block sparsity")]
    assert len(masks) == 2 and "triu" in masks[0] and "tril" in masks[1], masks
    assert_accurate(_additive_minus_inf_window, args, skipped)
    q, k, v = args
    q[0, 0, :, 0], k[0, 0, -1, 0] = 1e20, 1e20   # key 63: in the window of the last rows alone
    out, eager = fxflash.optimize(_additive_minus_inf_window)(*args), _additive_minus_inf_window(*args)
    assert eager.isnan().any() and torch.equal(out.isnan(), eager.isnan())
    torch.testing.assert_close(out[~eager.isnan()], eager[~eager.isnan()])


def test_an_infinite_score_under_an_additive_minus_inf_mask_is_eagers_nan():
    """fp32 scores of ``1e40`` overflow to ``+inf``, and ``+inf + (-inf)`` is NaN in eager even where the
    mask masks: the bound on the scores is infinite, so every tile is visited, masked, and the NaN
    rows are eager's."""
    # the last key: masked for every row but the last
    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=1, H=1, Hkv=1, M=128, N=128, D=16, Dv=16))
    q[0, 0, :, 0], k[0, 0, -1, 0] = 1e20, 1e20
    args = (q, k, v)
    (region,) = fxflash.explain(_additive_minus_inf, *args).regions
    assert region.fused and "skip_bound" in region.source
    out, eager = fxflash.optimize(_additive_minus_inf)(*args), _additive_minus_inf(*args)
    assert eager.isnan().any() and torch.equal(out.isnan(), eager.isnan())
    torch.testing.assert_close(out[~eager.isnan()], eager[~eager.isnan()])


@pytest.mark.parametrize("divide", [lambda x: x // -4, lambda x: x % -4, lambda x: torch.div(x, 4, rounding_mode="trunc")],
                         ids=["floor_by_negative", "remainder_by_negative", "trunc"])
def test_divisions_without_a_rule_fuse_without_skipping(divide):
    """Integer divisions the interval rules do not cover (a negative divisor, truncation) are
    computed outside the kernel and loaded: the attention still fuses, nothing is skipped, and
    the result is eager's."""
    def masked(q, k, v):
        i = torch.arange(q.size(-2))[:, None]
        j = torch.arange(k.size(-2))[None, :]
        s = (q @ k.transpose(-2, -1)).masked_fill(divide(j) > divide(i), float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    args = VARIANTS["vanilla"].inputs(Shape(B=1, H=2, Hkv=2, M=40, N=40, D=8, Dv=8))
    (region,) = fxflash.explain(masked, *args).regions
    assert region.fused and SCAN not in region.source
    assert_accurate(masked, args, fxflash.optimize(masked)(*args))


def test_additive_biases_do_not_skip():
    """A float bias (even one of -inf) has no per-tile test: every tile is visited."""
    variant = VARIANTS["additive_mask"]
    (region,) = fxflash.explain(variant.fn, *variant.inputs(Shape(M=20, N=20))).regions
    assert region.fused and SCAN not in region.source and FULL_LOOP not in region.source


IDS = st.lists(st.integers(-3, 3), min_size=2, max_size=60)


@settings(max_examples=10 * LONG, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(q_ids=IDS, k_ids=IDS, sort=st.booleans(), negate=st.booleans())
def test_tensor_masks_skip_tiles_from_per_tile_min_and_max(q_ids, k_ids, sort, negate):
    """Document-id masks (sorted or not, query and key ids apart): skipping by the per-tile
    min/max summary never changes the output."""
    def documents(q, k, v, qd, kd):
        same = qd[:, None] == kd[None, :]
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        s = s.masked_fill(same if negate else ~same, float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    qd, kd = torch.tensor(q_ids), torch.tensor(k_ids)
    if sort:
        qd, kd = qd.sort()[0], kd.sort()[0]
    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=1, H=2, Hkv=2, M=len(q_ids), N=len(k_ids), D=8, Dv=8))
    args = (q, k, v, qd, kd)
    report, skipped = _skipping_changes_nothing(documents, args)
    assert report.regions[0].fused and SCAN in report.regions[0].source
    assert_accurate(documents, args, skipped)


def runs(longest: int):
    """Boolean masks as runs of (value, length), lengths 2 to ``longest``."""
    return st.lists(st.tuples(st.booleans(), st.integers(2, longest)), min_size=1, max_size=5)


COMBINE = st.sampled_from(["key", "query", "and", "or"])


def _padded_program(combine: str):
    """Attention under a key mask ``[1, N]``, a query mask ``[M, 1]``, or their & or |."""
    def padded(q, k, v, key_keep, query_keep):
        keep = {"key": key_keep, "query": query_keep, "and": key_keep & query_keep,
                "or": key_keep | query_keep}[combine]
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v

    return padded


def _padding_args(key_runs, query_runs, dtype=torch.float32, device="cpu") -> tuple:
    def mask(runs):
        return torch.tensor([value for value, n in runs for _ in range(n)], device=device)

    key_keep, query_keep = mask(key_runs)[None, :], mask(query_runs)[:, None]
    shape = Shape(B=1, H=2, Hkv=2, M=query_keep.size(0), N=key_keep.size(1), D=8, Dv=8)
    return (*VARIANTS["vanilla"].inputs(shape, dtype, device), key_keep, query_keep)


@settings(max_examples=8 * LONG, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key_runs=runs(30), query_runs=runs(30), combine=COMBINE)
def test_boolean_masks_skip_tiles_from_per_tile_min_and_max(key_runs, query_runs, combine):
    """Boolean padding masks along the keys and the queries (runs of True and False, alone or
    combined): skipping by their summaries never changes the output."""
    padded, args = _padded_program(combine), _padding_args(key_runs, query_runs)
    report, skipped = _skipping_changes_nothing(padded, args)
    assert report.regions[0].fused and SCAN in report.regions[0].source
    assert_accurate(padded, args, skipped)


def test_per_batch_document_ids_skip_tiles_from_their_own_summaries():
    """Ids ``[B, N]`` (one packing per batch row): each program classifies key tiles by the
    summaries of its own batch row."""
    def documents(q, k, v, ids):
        same = ids[:, None, :, None] == ids[:, None, None, :]
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        return torch.softmax(s.masked_fill(~same, float("-inf")), dim=-1) @ v

    g = torch.Generator().manual_seed(3)
    ids = torch.stack([torch.randint(0, 3, (45,), generator=g).sort()[0], torch.arange(45) // 20])
    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=2, H=2, Hkv=2, M=45, N=45, D=8, Dv=8))
    report, skipped = _skipping_changes_nothing(documents, (q, k, v, ids))
    assert report.regions[0].fused and SCAN in report.regions[0].source and "sum0_s1" in report.regions[0].source
    assert_accurate(documents, (q, k, v, ids), skipped)


@pytest.mark.fusion_independent
@pytest.mark.parametrize("shape,axis,block", [((45,), 0, 16), ((3, 32), 1, 16), ((5, 7, 2), 1, 4), ((1,), 0, 8)])
def test_min_max_per_tile(shape, axis, block):
    from fxflash.runtime.launch import min_max_per_tile

    t = torch.randint(-50, 50, shape, generator=torch.Generator().manual_seed(0))
    lo, hi = min_max_per_tile(t, axis, block)
    for tile, start in enumerate(range(0, shape[axis], block)):
        part = t.narrow(axis, start, min(block, shape[axis] - start))
        assert torch.equal(lo.select(axis, tile), part.amin(axis))
        assert torch.equal(hi.select(axis, tile), part.amax(axis))
    assert lo.shape[axis] == hi.shape[axis] == -(-shape[axis] // block)
    broadcast = t.unsqueeze(0).expand(3, *shape)  # stride 0: every copy summarized alike
    assert torch.equal(min_max_per_tile(broadcast, axis + 1, block)[0], lo.unsqueeze(0).expand(3, *lo.shape))
