"""Each gradient's error against float64, fxflash's beside eager's, for one variant at one shape:
where a training step goes wrong, which of dQ, dK and dV, and whether a backward tile decides it.

    PYTHONPATH=. python benchmarks/gradient_errors.py vanilla --shape 130 520 128 [--tiles K R]

``--shape M N D`` (Dv = D; B 1, 4 query heads, 2 K/V heads for ``gqa_expand``); bf16 on the GPU
(fp32 and the interpreter where there is none). ``--tiles K R`` launches every key-tile kernel (dK
and dV) at the K-th tile of ``codegen/backward_plan.BACKWARD_TILES`` and every row-tile kernel at
the R-th, untimed. Prints ``out``, ``dq``, ``dk`` and ``dv`` as fxflash's error / eager's, the
largest absolute difference (tests/helpers.max_error's measure, here without its bound).
"""
import argparse
import sys
from pathlib import Path

import torch

import fxflash
from fxflash.codegen.backward_plan import backward_tiles
from fxflash.runtime import backward
from fxflash.variants import VARIANTS, Shape

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers import gradients, max_error, to_float64  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variant", choices=sorted(VARIANTS))
    parser.add_argument("--shape", type=int, nargs=3, metavar=("M", "N", "D"), default=(130, 520, 128))
    parser.add_argument("--tiles", type=int, nargs=2, metavar=("KEY", "ROW"))
    a = parser.parse_args()
    if a.tiles:
        def pinned(plan, kernel, run, inputs, frame):
            return backward_tiles(plan.d, plan.dv, kernel.per)[a.tiles[0] if kernel.per == "key" else a.tiles[1]]
        backward._tile = pinned
    m, n, d = a.shape
    cuda = torch.cuda.is_available()
    variant = VARIANTS[a.variant]
    shape = Shape(B=1, H=4, Hkv=2 if a.variant == "gqa_expand" else 4, M=m, N=n, D=d, Dv=d)
    args = variant.inputs(shape, torch.bfloat16 if cuda else torch.float32, "cuda" if cuda else "cpu")
    def results(fn, args, grad=None):   # the output, dQ, dK and dV; the incoming gradient
        out, grads, grad = gradients(fn, args, (0, 1, 2), grad)
        return [out, *grads], grad

    fused, grad = results(fxflash.optimize(variant.fn, inner="eager"), args)
    eager, _ = results(variant.fn, args, grad)
    exact, _ = results(variant.fn, to_float64(args), grad)
    print(f"{a.variant} {m}×{n}×{d}" + (f" tiles {a.tiles[0]},{a.tiles[1]}" if a.tiles else "") + ": " + "  ".join(
        f"{name} {max_error(f, x):.3g}/{max_error(e, x):.3g}"
        for name, f, e, x in zip(("out", "dq", "dk", "dv"), fused, eager, exact)))


if __name__ == "__main__":
    main()
