"""The host cost of an optimized call's signature (capture.signature_of and capture.Ambient), on CPU.

    PYTHONPATH=. python benchmarks/probes/probe_signature_cost.py

Times ``_Optimizer.signature`` for the vanilla variant's three tensors and for a 49-module model.
"""
import time

import torch

import fxflash
from fxflash.capture import module_params
from fxflash.variants import VARIANTS, Shape


class Layers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(48))
        self.scale = 0.5

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) * self.scale, -1) @ v


def per_call_us(optimizer, args, params, n):
    start = time.perf_counter()
    for _ in range(n):
        optimizer.signature(args, {}, params)
    return (time.perf_counter() - start) / n * 1e6


def main():
    variant = VARIANTS["vanilla"]
    args = variant.inputs(Shape(B=1, H=2, Hkv=2, M=16, N=16, D=16, Dv=16))
    function = fxflash.optimize(variant.fn)
    function(*args)
    print(f"function: {per_call_us(function._optimizer, args, {}, 20000):.1f} µs per signature")
    model = Layers()
    optimized = fxflash.optimize(model)
    optimized(*args)
    print(f"49-module model: {per_call_us(optimized._optimizer, args, module_params(model), 5000):.1f} µs per signature")


if __name__ == "__main__":
    main()
