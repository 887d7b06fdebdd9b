"""Where the document-mask kernel's time goes: the same call with other document layouts.

    PYTHONPATH=. python benchmarks/probes/probe_document.py [--seqlen 16384] [--tile 128 64 8 3]

bf16, 16 heads, head dim 64, batch × seqlen = 16k tokens (the suite's config). For each id
layout — the suite's 12 random documents, 12 equal documents, one document — it prints the
fraction of key tiles a row tile visits, fxflash's ``do_bench`` median and CUDA-graph replay
median, the same for FlexAttention's kernel (block mask cached), and fxflash's time per
visited tile against the vanilla kernel's (``one document`` visits every tile: the difference
to vanilla is the cost of classifying tiles and of evaluating the mask).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import fxflash  # noqa: E402
from fxflash import variants as V  # noqa: E402
from fxflash.codegen import tuning  # noqa: E402

sys.path[:0] = [os.path.dirname(__file__), os.path.join(os.path.dirname(__file__), "..")]
from bench_attention import DOCS, document_ids, flex_api, medians  # noqa: E402


def visited_fraction(ids: torch.Tensor, bm: int, bn: int) -> float:
    """Key tiles in [first, last] overlapping each row tile's documents, over all tiles."""
    n = ids.numel()
    pad = lambda t, b: torch.cat([t, t[-1:].expand((-n) % b)])  # noqa: E731 (min/max-neutral)
    q, k = pad(ids, bm).view(-1, bm), pad(ids, bn).view(-1, bn)
    live = (q.amin(1)[:, None] <= k.amax(1)[None, :]) & (k.amin(1)[None, :] <= q.amax(1)[:, None])
    first = live.float().argmax(1)
    last = live.shape[1] - live.flip(1).float().argmax(1)
    return float((last - first).sum()) / live.numel()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--tile", type=int, nargs=4, default=None, help="BLOCK_M BLOCK_N warps stages")
    opts = parser.parse_args()
    S, H, D = opts.seqlen, 16, 64
    B = max(1, 16384 // S)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, S, D, generator=g).to("cuda", torch.bfloat16) for _ in range(3))
    flex, create_block_mask = flex_api()
    layouts = {
        f"{DOCS} random documents (suite)": document_ids(S, DOCS, "cuda"),
        f"{DOCS} equal documents": (torch.arange(S, device="cuda") * DOCS) // S,
        "one document": torch.zeros(S, dtype=torch.int64, device="cuda"),
    }
    pin = tuning.pinned(tuple(opts.tile)) if opts.tile else contextlib.nullcontext()
    print(f"B={B} H={H} S={S} D={D} bf16 on {torch.cuda.get_device_name()}; tile {opts.tile or 'tuned'}",
          flush=True)
    with pin:
        vanilla = fxflash.optimize(V.vanilla)
        dense_ms, dense_graph = medians(lambda: vanilla(q, k, v))
        print(f"vanilla (every tile, no mask): {dense_ms:.3f} ms (graph {dense_graph:.3f})", flush=True)
        for label, ids in layouts.items():
            fast = fxflash.optimize(V.document_mask)
            ms, graph_ms = medians(lambda: fast(q, k, v, ids))
            bm, bn = opts.tile[:2] if opts.tile else (128, 64)
            frac = visited_fraction(ids.cpu(), bm, bn)

            def same_doc(b, h, qi, ki, ids=ids):
                return ids[qi] == ids[ki]

            block_mask = create_block_mask(same_doc, None, None, S, S, device="cuda")
            flex_ms, flex_graph = medians(lambda: flex(q, k, v, block_mask=block_mask))
            print(f"{label:<28} visits {frac:6.1%} of tiles: fxflash {ms:.3f} ms (graph {graph_ms:.3f}), "
                  f"flex {flex_ms:.3f} (graph {flex_graph:.3f}); fxflash per visited tile vs vanilla "
                  f"{graph_ms / (frac * dense_graph):.2f}x", flush=True)


if __name__ == "__main__":
    main()
