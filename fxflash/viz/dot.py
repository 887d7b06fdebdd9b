"""Graphviz output: a Scene as DOT text, rendered by the ``dot`` program when installed."""
from __future__ import annotations

import shutil
import subprocess

from .scene import REFUSED_EDGE, Scene


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _box(scene: Scene, box: str) -> str:
    attrs = scene.graph.nodes[box]
    style = "rounded,filled" + (",dashed" if attrs["kind"] == "collapsed" else "")
    return f"  {_quote(box)} [label={_quote(attrs['label'])}, fillcolor={_quote(scene.fill(box))}, style={_quote(style)}];"


def to_dot(scene: Scene) -> str:
    """DOT text: one cluster per region, filled with its colour (refused ones outlined red)."""
    lines = ["digraph fxflash {", "  rankdir=TB;",
             '  node [shape=box, fontname="Helvetica", fontsize=10];', '  edge [color="#555555"];']
    for index, region in scene.regions.items():
        members = [b for b, a in scene.graph.nodes(data=True) if a["region"] == index]
        if not members:
            continue
        border = region.colour if region.fused else REFUSED_EDGE
        lines += [f"  subgraph cluster_{index} {{", f"    label={_quote(region.title)};",
                  f'    style="rounded,filled"; fillcolor="{region.colour}40"; color="{border}"; penwidth=2;']
        lines += ["  " + _box(scene, b) for b in members]
        lines.append("  }")
    lines += [_box(scene, b) for b, a in scene.graph.nodes(data=True) if a["region"] is None]
    lines += [f"  {_quote(a)} -> {_quote(b)};" for a, b in scene.graph.edges]
    lines.append("}")
    return "\n".join(lines)


def have_dot() -> bool:
    return shutil.which("dot") is not None


def render_dot(scene: Scene, path: str, fmt: str) -> None:
    """Write ``path`` in ``fmt`` ("svg" | "png") with Graphviz's ``dot``."""
    result = subprocess.run(["dot", f"-T{fmt}", "-o", path], input=to_dot(scene), text=True,
                            capture_output=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"Graphviz dot failed ({result.returncode}): {result.stderr.strip()}")


__all__ = ["have_dot", "render_dot", "to_dot"]
