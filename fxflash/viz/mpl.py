"""Matplotlib output: a Scene drawn as a layered graph (no Graphviz needed).

Boxes are placed by topological generation (one row per generation, top to bottom), each
row ordered by the mean position of its boxes' inputs; a region is a translucent rounded
rectangle behind its boxes, titled with its status and dimensions.
"""
from __future__ import annotations

import networkx as nx

from .scene import DEMOTED_MARK, ELIMINATED_MARK, REFUSED_EDGE, Scene

BOX_W, BOX_H = 2.3, 0.6    # inches
STEP_X, STEP_Y = 2.6, 0.9
FONT = 6.5
LEGEND = f"{DEMOTED_MARK} demoted: parallel → reduction      {ELIMINATED_MARK} eliminated: one tile"


def layered_positions(graph: nx.DiGraph) -> dict:
    """Box → (x, y) in inches: rows by topological generation, ordered by their inputs' x."""
    pos: dict = {}
    for depth, generation in enumerate(nx.topological_generations(graph)):
        def mean_input_x(box):
            xs = [pos[p][0] for p in graph.predecessors(box) if p in pos]
            return sum(xs) / len(xs) if xs else 0.0

        row = sorted(generation, key=lambda b: (mean_input_x(b), str(b)))
        for i, box in enumerate(row):
            pos[box] = ((i - (len(row) - 1) / 2) * STEP_X, -depth * STEP_Y)
    return pos


def draw(scene: Scene):
    """A matplotlib Figure of ``scene`` (created without pyplot, so no GUI backend is needed)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    pos = layered_positions(scene.graph)
    xs = [x for x, _ in pos.values()] or [0.0]
    ys = [y for _, y in pos.values()] or [0.0]
    left, right = min(xs) - BOX_W, max(xs) + BOX_W
    bottom, top = min(ys) - 1.2, max(ys) + 1.0
    fig = Figure(figsize=(right - left, top - bottom))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(left, right)
    ax.set_ylim(bottom, top)
    ax.axis("off")
    for index, region in scene.regions.items():
        members = [pos[b] for b, a in scene.graph.nodes(data=True) if a["region"] == index]
        if not members:
            continue
        x0, x1 = min(x for x, _ in members) - BOX_W / 2 - 0.15, max(x for x, _ in members) + BOX_W / 2 + 0.15
        y0, y1 = min(y for _, y in members) - BOX_H / 2 - 0.15, max(y for _, y in members) + BOX_H / 2 + 0.3
        ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0.05", zorder=0,
                                    facecolor=region.colour, alpha=0.35,
                                    edgecolor=region.colour if region.fused else REFUSED_EDGE, linewidth=2))
        ax.text(x0 + 0.1, y1 - 0.05, region.title, fontsize=FONT + 1, va="top", ha="left", weight="bold")
    for a, b in scene.graph.edges:
        (xa, ya), (xb, yb) = pos[a], pos[b]
        ax.add_patch(FancyArrowPatch((xa, ya - BOX_H / 2), (xb, yb + BOX_H / 2), arrowstyle="-|>",
                                     mutation_scale=8, color="#555555", linewidth=0.7, zorder=1))
    for box, attrs in scene.graph.nodes(data=True):
        x, y = pos[box]
        ax.add_patch(FancyBboxPatch((x - BOX_W / 2, y - BOX_H / 2), BOX_W, BOX_H, boxstyle="round,pad=0.02",
                                    facecolor=scene.fill(box), edgecolor="#333333", zorder=2,
                                    linestyle="--" if attrs["kind"] == "collapsed" else "-", linewidth=0.8))
        ax.text(x, y, attrs["label"], fontsize=FONT, ha="center", va="center", zorder=3, family="DejaVu Sans")
    ax.text(left + 0.2, bottom + 0.3, LEGEND, fontsize=FONT + 1, ha="left", va="bottom")
    return fig


__all__ = ["draw", "layered_positions"]
