"""The demo: optimize every attention variant in ``fxflash.variants`` and report what fxflash
found and fused, with the error of the optimized call against eager and against float64.

Run with ``./dev.sh demo`` (or ``python -m fxflash.demo``). Without a CUDA GPU, kernels run
in Triton's interpreter on small shapes.
"""
from __future__ import annotations

import argparse
import os
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fxflash  # noqa: E402
from fxflash.variants import VARIANTS, Shape  # noqa: E402


def _to64(args):
    return tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def _err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float16" if torch.cuda.is_available() else "float32")
    parser.add_argument("--variants", nargs="*", default=None)
    opts = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, opts.dtype)
    shape = Shape(B=2, H=4, Hkv=2, M=37, N=53, D=32, Dv=32) if device == "cpu" else Shape(
        B=4, H=16, Hkv=4, M=1024, N=1024, D=64, Dv=64
    )
    print(f"fxflash {fxflash.__version__} on {device} ({'GPU' if device == 'cuda' else 'Triton interpreter'}), "
          f"dtype {opts.dtype}, shape {shape}")
    print(f"{'variant':<24}{'regions':>8}{'fused':>6}{'err vs f64':>12}{'eager err':>11}{'first call s':>13}  note")
    for name, variant in VARIANTS.items():
        if opts.variants and name not in opts.variants:
            continue
        if variant.chains == 0:
            continue
        args = variant.inputs(shape, dtype, device)
        fast = fxflash.optimize(variant.fn)
        t0 = time.perf_counter()
        out = fast(*args)
        first = time.perf_counter() - t0
        report = fast.report(*args)
        ref = variant.fn(*_to64(args))
        eager = variant.fn(*args)
        fused = sum(r.fused for r in report.regions)
        reasons = sorted({r.reason for r in report.regions if not r.fused})
        print(f"{name:<24}{len(report.regions):>8}{fused:>6}{_err(out, ref):>12.2e}{_err(eager, ref):>11.2e}"
              f"{first:>13.2f}  {'; '.join(reasons)}")


if __name__ == "__main__":
    main()
