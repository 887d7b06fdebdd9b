"""Drawings of a captured graph with its fused regions: Graphviz when ``dot`` is installed,
matplotlib otherwise; SVG or PNG.

    report = fxflash.explain(fn, q, k, v)
    fxflash.viz.render(report, "attention.svg")          # regions coloured, the rest collapsed
    fig = fxflash.viz.figure(report, highlight=False)    # the captured graph before fusion
    print(fxflash.viz.to_dot(report))                    # DOT text

Each box shows a node's name, op and sketch; in a region's sketches the demoted dimension is
marked ``↓`` and the dimensions eliminated by tiling ``∅``. Refused candidates are grey with a
red outline and titled with the rule that stopped them.
"""
from __future__ import annotations

import os

from ..report import Report
from .dot import have_dot, render_dot
from .dot import to_dot as _scene_dot
from .mpl import draw
from .scene import REGION_COLOURS, Scene, build_scene

ENGINES = ("auto", "graphviz", "matplotlib")
FORMATS = ("svg", "png")


def to_dot(report: Report, highlight: bool = True, collapse: bool = True) -> str:
    """The DOT text of ``report``'s graph."""
    return _scene_dot(build_scene(report, highlight, collapse))


def figure(report: Report, highlight: bool = True, collapse: bool = True):
    """A matplotlib Figure of ``report``'s graph (needs matplotlib)."""
    return draw(build_scene(report, highlight, collapse))


def render(report: Report, path: str, engine: str = "auto", highlight: bool = True, collapse: bool = True) -> str:
    """Write the drawing to ``path`` (``.svg`` or ``.png``) and return the engine used.

    ``engine``: "graphviz" (needs the ``dot`` program), "matplotlib", or "auto" (Graphviz when
    ``dot`` is on PATH). ``highlight=False`` draws the graph before fusion; ``collapse``
    draws each connected group of ops outside the regions as one box."""
    fmt = os.path.splitext(path)[1].lstrip(".").lower()
    if fmt not in FORMATS:
        raise ValueError(f"fxflash.viz.render: cannot write {path!r}; use a .svg or .png file name")
    if engine not in ENGINES:
        raise ValueError(f"fxflash.viz.render: engine must be one of {ENGINES}, not {engine!r}")
    if engine == "graphviz" and not have_dot():
        raise RuntimeError("fxflash.viz.render: engine='graphviz' needs the Graphviz `dot` program on PATH "
                           "(e.g. apt install graphviz); engine='matplotlib' needs none")
    scene = build_scene(report, highlight, collapse)
    if engine == "graphviz" or (engine == "auto" and have_dot()):
        render_dot(scene, path, fmt)
        return "graphviz"
    draw(scene).savefig(path, format=fmt, dpi=110)
    return "matplotlib"


__all__ = ["REGION_COLOURS", "Scene", "build_scene", "figure", "render", "to_dot"]
