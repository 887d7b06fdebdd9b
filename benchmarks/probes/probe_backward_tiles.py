"""The fused backward's tiles (codegen/backward.BACKWARD_TILES) timed on one GPU: each candidate for
the key-tile kernel (dK, dV) with the row-tile kernels' default, then each for the row-tile kernels
(L, Δ, dQ) with the key kernel's default; bf16, B = 4, H = 16, L = 4096, D = 64, no mask and causal.

    PYTHONPATH=. python benchmarks/probes/probe_backward_tiles.py

Prints the backward's time (``out.backward`` of a fused forward, triton's ``do_bench`` median).
"""
import math

import torch
from triton.testing import do_bench

import fxflash
from fxflash.codegen import backward as codegen_backward

B, H, L, D = 4, 16, 4096, 64
KEY = [(32, 128, 4, 2), (64, 128, 8, 2), (64, 64, 4, 2), (32, 64, 4, 3), (64, 128, 4, 2), (32, 128, 4, 3),
       (64, 64, 8, 2)]
ROW = [(128, 32, 4, 2), (128, 64, 8, 2), (64, 64, 4, 2), (128, 64, 4, 2), (64, 32, 4, 3), (128, 32, 4, 3),
       (128, 32, 8, 2)]


def attention(q, k, v, causal):
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    if causal:
        i = torch.arange(L, device=q.device)
        s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
    return torch.softmax(s, -1) @ v


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, grad = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    tiles = codegen_backward.BACKWARD_TILES[64]
    default = dict(tiles)
    for causal in (False, True):
        fast = fxflash.optimize(lambda q, k, v: attention(q, k, v, causal))
        out = fast(q, k, v)
        for per, candidates in (("key", KEY), ("row", ROW)):
            for tile in candidates:
                tiles.update(default, **{per: tile})
                try:
                    ms = do_bench(lambda: out.backward(grad, retain_graph=True), warmup=5, rep=50,
                                  grad_to_none=[q, k, v])
                except Exception as exc:  # noqa: BLE001 - a tile that does not compile
                    print(f"causal={causal} {per} {tile}: {type(exc).__name__}: {str(exc)[:80]}")
                    continue
                print(f"causal={causal} {per} {tile}: {ms:.3f} ms", flush=True)
        tiles.update(default)


if __name__ == "__main__":
    main()
