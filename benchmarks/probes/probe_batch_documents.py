"""The per-batch document mask of issue 44, ``(ids[:, :, None] == ids[:, None, :]) & causal`` with
``masked_fill(~m[:, None], -inf)``, through ``fxflash.optimize`` against FlexAttention (its block
mask built once, outside the timing) and SDPA with the boolean mask: time per call (triton's
``do_bench``, median ms), bf16, H = 16, D = 64, 16k tokens as B × L, 12 documents per sequence.

    PYTHONPATH=. python benchmarks/probes/probe_batch_documents.py    (a CUDA GPU)
"""
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from triton.testing import do_bench

import fxflash

H, D, DOCS = 16, 64, 12


def per_batch_documents(q, k, v, ids):
    L = q.size(-2)
    causal = torch.arange(L, device=q.device)[:, None] >= torch.arange(L, device=q.device)[None, :]
    m = (ids[:, :, None] == ids[:, None, :]) & causal
    s = (q @ k.transpose(-1, -2)) * q.size(-1) ** -0.5
    return torch.softmax(s.masked_fill(~m[:, None], float("-inf")), -1) @ v


def ids_of(B, L, device):
    g = torch.Generator().manual_seed(0)
    cuts = [torch.sort(torch.randperm(L - 1, generator=g)[:DOCS - 1] + 1).values for _ in range(B)]
    ids = torch.zeros(B, L, dtype=torch.int32)
    for b, c in enumerate(cuts):
        ids[b, c] = 1
    return ids.cumsum(-1).to(torch.int32).to(device)


def main() -> None:
    flex = torch.compile(flex_attention)
    for B, L in ((1, 16384), (4, 4096)):
        q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        ids = ids_of(B, L, "cuda")
        fused = fxflash.optimize(per_batch_documents)
        out = fused(q, k, v, ids)
        report = fxflash.explain(per_batch_documents, q, k, v, ids)
        block = create_block_mask(lambda b, h, qi, ki: (ids[b, qi] == ids[b, ki]) & (qi >= ki), B, None, L, L)
        ref = flex(q, k, v, block_mask=block)
        mask = ((ids[:, :, None] == ids[:, None, :]) & torch.ones(L, L, dtype=torch.bool, device="cuda").tril())[:, None]
        err = (out.float() - ref.float()).abs().max().item()
        ms = {name: do_bench(fn, warmup=50, rep=300) for name, fn in (
            ("fxflash", lambda: fused(q, k, v, ids)),
            ("flex", lambda: flex(q, k, v, block_mask=block)),
            ("sdpa_bool", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))}
        print(f"B={B} L={L}: fused regions {len(report.regions)}; max |fxflash - flex| {err:.3g}; "
              + ", ".join(f"{n} {t:.3f} ms" for n, t in ms.items())
              + f"; flex time / fxflash time {ms['flex'] / ms['fxflash']:.2f}")


if __name__ == "__main__":
    main()
