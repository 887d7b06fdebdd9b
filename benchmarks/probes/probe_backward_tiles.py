"""The fused backward's tiles (codegen/backward.BACKWARD_TILES) timed on one GPU: each candidate for
the key-tile kernel (dK, dV) with the row-tile kernels' default, then each for the row-tile kernels
(L, Δ, dQ) with the key kernel's default; bf16, 4k tokens, batch 4, no mask and causal, dQ by its
own kernel (``FXFLASH_DQ_ATOMICS=0``).

    PYTHONPATH=. python benchmarks/probes/probe_backward_tiles.py             # 16 heads of 64
    PYTHONPATH=. python benchmarks/probes/probe_backward_tiles.py --gqa128    # GQA 32/8 heads of 128

Prints the backward's time (``out.backward`` of a fused forward, triton's ``do_bench`` median). Each
tile is the only candidate of a fresh ``optimize()``, so nothing tuned or bound before carries over.
"""
import argparse
import math
import os

os.environ["FXFLASH_DQ_ATOMICS"] = "0"

import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import fxflash  # noqa: E402
from fxflash.codegen import backward as codegen_backward  # noqa: E402
from fxflash.runtime import tuning  # noqa: E402

# (BLOCK_M, BLOCK_N, warps, stages) beyond BACKWARD_TILES' own: Triton's fused-attention tutorial
# holds 128 keys per dK·dV program and 128 rows per dQ program, 4 warps, deeper pipelines
EXTRA = {64: {"key": [(32, 128, 4, 3), (64, 128, 4, 3), (32, 64, 4, 4)],
              "row": [(128, 32, 4, 3), (128, 64, 4, 3), (128, 32, 8, 3)]},
         128: {"key": [(32, 128, 4, 3), (32, 128, 4, 4), (32, 128, 4, 5), (64, 128, 8, 3), (64, 64, 4, 3),
                       (32, 64, 4, 4)],
               "row": [(128, 32, 4, 3), (128, 32, 4, 4), (128, 32, 4, 5), (64, 64, 4, 3), (128, 64, 8, 3)]}}


def attention(q, k, v, causal):
    group = q.size(1) // k.size(1)
    if group > 1:   # GQA as Llama writes it
        b, hkv, n, d = k.shape
        k = k[:, :, None].expand(b, hkv, group, n, d).reshape(b, hkv * group, n, d)
        v = v[:, :, None].expand(b, hkv, group, n, d).reshape(b, hkv * group, n, d)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    if causal:
        i = torch.arange(q.size(-2), device=q.device)
        s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
    return torch.softmax(s, -1) @ v


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gqa128", action="store_true", help="32 query heads, 8 K/V heads, head dim 128")
    opts = parser.parse_args()
    B, L = 4, 4096
    H, Hkv, D = (32, 8, 128) if opts.gqa128 else (16, 16, 64)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k, v = (torch.randn(B, Hkv, L, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
            for _ in range(2))
    grad = torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
    tiles = codegen_backward.BACKWARD_TILES[D]
    default = {per: list(candidates) for per, candidates in tiles.items()}
    for causal in (False, True):
        for per in ("key", "row"):
            for tile in dict.fromkeys(default[per] + EXTRA[D][per]):
                tiles.update({p: [c[0]] for p, c in default.items()})
                tiles[per] = [tile]
                tuning._chosen.clear()
                fast = fxflash.optimize(lambda q, k, v: attention(q, k, v, causal))
                try:
                    out = fast(q, k, v)
                    ms = do_bench(lambda: out.backward(grad, retain_graph=True), warmup=5, rep=60,
                                  grad_to_none=[q, k, v])
                except Exception as exc:  # noqa: BLE001 - a tile that does not compile
                    print(f"causal={causal} {per} {tile}: {type(exc).__name__}: {str(exc)[:80]}", flush=True)
                    continue
                print(f"causal={causal} {per} {tile}: {ms:.3f} ms", flush=True)
    tiles.update(default)


if __name__ == "__main__":
    main()
