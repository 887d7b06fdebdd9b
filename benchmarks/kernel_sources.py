"""One line per generated kernel: a hash of each variant's Triton and Gluon sources. Run it at two
commits and diff the outputs: a refactor of code generation that prints every kernel byte for byte
as before cannot change its speed (no GPU needed).

    PYTHONPATH=. python benchmarks/kernel_sources.py > new.txt
    git worktree add /tmp/old <commit> && (cd /tmp/old && PYTHONPATH=. python benchmarks/kernel_sources.py) > old.txt
    diff old.txt new.txt

Each line: variant, dtype, shape, then the source's hash, or the refusal. Shapes: one every kernel
takes (head dim 64, where the Gluon kernel is printed for 16-bit inputs), one that none of their
sizes is a power of two, and one of batch one and two heads, whose views have axes of one.
"""
from __future__ import annotations

import hashlib

import torch

from fxflash.analysis import analyse
from fxflash.capture import capture
from fxflash.codegen import Unprintable, emit_kernel, gluon
from fxflash.patterns.chains import find_chains
from fxflash.patterns.region import FusionRefused, build_region
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
                    digest = hashlib.sha256(plan.source.encode()).hexdigest()[:16]
                    gluon_part = (hashlib.sha256(plan.gluon.source.encode()).hexdigest()[:16] if plan.gluon
                                  else f"no Gluon kernel ({plan.gluon_refusal})")
                    yield f"{label} triton {digest} gluon {gluon_part}"


if __name__ == "__main__":
    for line in lines():
        print(line)
