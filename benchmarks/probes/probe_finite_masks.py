"""Causal attention with left padding, masked the ways models write it: with ``-inf`` (``arange``
comparisons), GPT-2's ``where(keep, s, finfo.min)`` and transformers' eager additive ``s +
where(keep.expand(B, -1, M, N), 0, finfo.min)``. Each is timed with finite-fill masks skipping
tiles (after) and without (before: ``sparsity.FINITE_FILL_MIN`` set beyond every fill), beside
SDPA with the same boolean mask. Prints time per call and the largest difference from eager.

    PYTHONPATH=. python benchmarks/probes/probe_finite_masks.py    (a CUDA GPU)
"""
import math

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import fxflash
from fxflash.patterns import sparsity

B, H, L, D = 4, 16, 4096, 64


def _keep(q, padding):
    i = torch.arange(L, device=q.device)
    return (i[None, :] <= i[:, None])[None, None] & padding[:, None, None, :]


def neg_inf(q, k, v, padding):
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    return torch.softmax(s.masked_fill(~_keep(q, padding), float("-inf")), -1) @ v


def gpt2_where(q, k, v, padding):
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    s = torch.where(_keep(q, padding), s, torch.finfo(s.dtype).min)
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


def additive(q, k, v, padding):
    keep = _keep(q, padding).expand(B, -1, L, L)
    bias = torch.where(keep, torch.zeros((), dtype=q.dtype, device=q.device),
                       torch.scalar_tensor(torch.finfo(q.dtype).min, dtype=q.dtype, device=q.device))
    s = q @ k.transpose(-1, -2) / math.sqrt(D) + bias
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    for padded in (False, True):
        padding = torch.ones(B, L, dtype=torch.bool, device="cuda")
        if padded:  # left padding, row i loses i·L/8 tokens (benchmarks/hf_llama.py's batch)
            for i in range(B):
                padding[i, :i * L // 8] = False
        args = (q, k, v, padding)
        keep = _keep(q, padding)
        ms = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=keep), warmup=50, rep=300)
        print(f"padded={padded} sdpa (boolean mask) {ms:.3f} ms")
        for fn in (neg_inf, gpt2_where, additive):
            eager = fn(*args).float()
            for label, least in (("before", math.inf), ("after", 256.0)):
                sparsity.FINITE_FILL_MIN = least
                torch._dynamo.reset()
                fast = fxflash.optimize(fn, inner="eager")
                out = fast(*args)
                ms = do_bench(lambda: fast(*args), warmup=50, rep=300)
                ok = torch.isfinite(eager)
                err = (out.float() - eager)[ok].abs().max().item()
                print(f"padded={padded} {fn.__name__:10} {label:6} {ms:.3f} ms, max |diff| vs eager {err:.3g}")
    sparsity.FINITE_FILL_MIN = 256.0


if __name__ == "__main__":
    main()
