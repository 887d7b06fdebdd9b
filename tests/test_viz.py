"""fxflash.viz: drawings of a captured graph with its regions coloured."""
import pytest
import torch

import fxflash
import fxflash.viz as viz
from fxflash.analysis.sketch import dim_name
from fxflash.viz.dot import have_dot
from fxflash.viz.scene import DEMOTED_MARK, ELIMINATED_MARK, REFUSED_COLOUR, REFUSED_EDGE, build_scene
from fxflash.variants import VARIANTS, Shape

pytest.importorskip("matplotlib")

SHAPE = Shape(B=1, H=2, Hkv=2, M=24, N=24, D=8, Dv=8)


def _report(name="vanilla"):
    variant = VARIANTS[name]
    return fxflash.explain(variant.fn, *variant.inputs(SHAPE))


def two_attentions(q, k, v):
    first = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
    return torch.softmax(first @ k.transpose(-1, -2), dim=-1) @ v


def _rgb(hex_colour):
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def _has_pixel(png_path, hex_colour) -> bool:
    import matplotlib.image
    import numpy as np

    pixels = (matplotlib.image.imread(png_path)[..., :3] * 255).round().astype(int)
    return bool(np.all(np.abs(pixels - np.array(_rgb(hex_colour))) <= 1, axis=-1).any())


ENGINES = ["matplotlib", pytest.param("graphviz", marks=pytest.mark.skipif(not have_dot(), reason="no `dot`"))]


@pytest.mark.parametrize("engine", ENGINES)
def test_png_and_svg_show_the_fused_region_in_its_colour(tmp_path, engine):
    report = _report("sliding_window")
    colour = viz.REGION_COLOURS[0]
    svg, png = tmp_path / "g.svg", tmp_path / "g.png"
    assert viz.render(report, str(svg), engine=engine) == engine
    assert viz.render(report, str(png), engine=engine) == engine
    assert svg.stat().st_size > 0 and png.stat().st_size > 0
    assert colour in svg.read_text().lower()
    assert _has_pixel(str(png), colour)


@pytest.mark.fusion_independent
def test_the_graph_before_fusion_has_no_region_colour(tmp_path):
    path = tmp_path / "before.svg"
    viz.render(_report(), str(path), engine="matplotlib", highlight=False)
    assert not any(c in path.read_text().lower() for c in viz.REGION_COLOURS)


def test_each_fused_region_has_its_own_colour_and_refused_ones_are_grey(tmp_path):
    q = torch.randn(1, 2, 16, 8)
    scene = build_scene(fxflash.explain(two_attentions, q, q, q))
    assert [r.colour for r in scene.regions.values()] == list(viz.REGION_COLOURS[:2])
    refused = _report("softmax_over_queries")
    path = tmp_path / "refused.svg"
    viz.render(refused, str(path), engine="matplotlib")
    text = path.read_text().lower()
    assert REFUSED_COLOUR in text and REFUSED_EDGE in text and viz.REGION_COLOURS[0] not in text
    assert "not fused" in build_scene(refused).regions[0].title


def test_region_sketches_mark_the_demoted_and_eliminated_dimensions():
    report = _report()
    region = report.regions[0]
    scene = build_scene(report)
    producer = scene.graph.nodes[region.chain.first.name]["label"]
    eliminated = [dim_name(d) for d in region.dims.eliminated]
    assert producer.count(DEMOTED_MARK) == 1 and f"{region.demoted}{DEMOTED_MARK}" in producer
    assert all(f"{d}{ELIMINATED_MARK}" in scene.regions[0].title for d in eliminated)
    assert any(f"{d}{ELIMINATED_MARK}" in producer for d in eliminated)  # D of QKᵀ


def test_self_attention_marks_the_key_axis_not_the_row_axis():
    """q and k from one projection: rows and keys share a dimension id."""
    x = torch.randn(2, 16, 8)

    def self_attention(x):
        return torch.softmax(x @ x.transpose(-1, -2), dim=-1) @ x

    report = fxflash.explain(self_attention, x)
    region = report.regions[0]
    n = region.demoted
    label = build_scene(report).graph.nodes[region.chain.first.name]["label"]
    assert f"{n}, {n}{DEMOTED_MARK}" in label  # [(B, M, N↓), (D∅)] with M and N one id


@pytest.mark.fusion_independent
def test_collapse_folds_the_ops_outside_the_regions():
    report = _report("evoformer_row")
    full, folded = build_scene(report, collapse=False), build_scene(report)
    assert folded.graph.number_of_nodes() < full.graph.number_of_nodes()
    region_boxes = {b for b, a in full.graph.nodes(data=True) if a["region"] is not None}
    assert region_boxes <= set(folded.graph.nodes)  # regions are never folded
    assert any(a["kind"] == "collapsed" for _, a in folded.graph.nodes(data=True))


def test_dot_text_has_one_cluster_per_region():
    dot = viz.to_dot(_report())
    assert dot.count("subgraph cluster_") == 1 and viz.REGION_COLOURS[0] in dot


@pytest.mark.fusion_independent
@pytest.mark.parametrize("kwargs, error", [(dict(path="g.pdf"), ValueError), (dict(path="g.svg", engine="tikz"), ValueError)])
def test_bad_arguments_say_what_to_do(tmp_path, kwargs, error):
    kwargs["path"] = str(tmp_path / kwargs["path"])
    with pytest.raises(error, match="svg|engine"):
        viz.render(_report(), **kwargs)
