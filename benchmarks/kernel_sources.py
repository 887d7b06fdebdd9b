"""One line per generated kernel: a hash of each variant's Triton and Gluon sources and of its fused
backward's. Run it at two commits and diff the outputs: a refactor of code generation that prints
every kernel byte for byte as before cannot change its speed (no GPU needed).

    PYTHONPATH=. python benchmarks/kernel_sources.py > new.txt
    git worktree add /tmp/old <commit> && (cd /tmp/old && PYTHONPATH=. python benchmarks/kernel_sources.py) > old.txt
    diff old.txt new.txt

Without a GPU fxflash prints for Triton's interpreter; ``TRITON_INTERPRET=0`` prints the sources a
GPU runs (libdevice, the special-function unit's helpers), without compiling them. Each line:
variant, dtype, shape, then the sources' hashes, or the refusal. Shapes: one every kernel takes
(head dim 64, where the Gluon kernel is printed for 16-bit inputs), one that none of their sizes is
a power of two, and one of batch one and two heads, whose views have axes of one.
"""
from __future__ import annotations

import hashlib

import torch

from fxflash.analysis import analyse
from fxflash.capture import capture
from fxflash.codegen import Unprintable, emit_kernel, gluon
from fxflash.codegen.backward import emit_backward
from fxflash.codegen.printers import PRINTERS
from fxflash.patterns.chains import find_chains
from fxflash.patterns.region import FusionRefused, build_region
from fxflash.tile.backward import BackwardRefused
from fxflash.variants import VARIANTS, Shape

SHAPES = {"d64": Shape(B=2, H=4, Hkv=2, M=40, N=48, D=64, Dv=64),
          "odd": Shape(B=2, H=4, Hkv=2, M=19, N=37, D=24, Dv=8),
          "ones": Shape(B=1, H=2, Hkv=2, M=24, N=24, D=16, Dv=16)}  # batch one, one head pair: unit axes
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def lines():
    for shape_name, shape in SHAPES.items():
        for dtype in DTYPES:
            for name, variant in VARIANTS.items():
                analysis = analyse(capture(variant.fn, variant.inputs(shape, dtype)).graph_module)
                for i, chain in enumerate(find_chains(analysis)):
                    label = f"{name}[{i}] {str(dtype).removeprefix('torch.')} {shape_name}"
                    try:
                        region = build_region(analysis, chain)
                        plan = emit_kernel(region, analysis.kinds)
                        gluon.attach(plan, region, analysis.kinds)
                    except (FusionRefused, Unprintable) as exc:
                        yield f"{label} refused: {str(exc).splitlines()[0]}"
                        continue
                    gluon_part = _digest(plan.gluon.source) if plan.gluon else f"no Gluon kernel ({plan.gluon_refusal})"
                    try:
                        backward = _digest(emit_backward(region, analysis.kinds, plan, PRINTERS).source)
                    except (BackwardRefused, Unprintable) as exc:
                        backward = f"none ({str(exc).splitlines()[0]})"
                    yield f"{label} triton {_digest(plan.source)} gluon {gluon_part} backward {backward}"


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


if __name__ == "__main__":
    for line in lines():
        print(line)
