"""Attention written as plain PyTorch, with example inputs for the fxflash command line:

    python -m fxflash explain examples/attention_variants.py:vanilla
    python -m fxflash explain examples/attention_variants.py:sliding_window --render sliding.svg
    python -m fxflash explain examples/attention_variants.py:GatedAttention
    python -m fxflash explain examples/attention_variants.py:softmax_over_queries   # refused: why

Run directly (``python examples/attention_variants.py``) it optimizes each one and prints
the error against eager.
"""
import math

import torch

B, H, S, D = 2, 4, 128, 32


def vanilla(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    return torch.softmax(scores, dim=-1) @ v


def sliding_window(q, k, v, window: int = 32):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    i = torch.arange(q.size(-2), device=q.device)[:, None]
    j = torch.arange(k.size(-2), device=q.device)[None, :]
    scores = scores.masked_fill((j > i) | (i - j >= window), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def softmax_over_queries(q, k, v):
    """Not attention: the softmax normalizes over queries, so no online form exists."""
    return torch.softmax(q @ k.transpose(-2, -1), dim=-2) @ v


class GatedAttention(torch.nn.Module):
    """Attention whose output is gated by a projection of the input (AlphaFold style)."""

    def __init__(self, dim: int = H * D):
        super().__init__()
        self.qkvg = torch.nn.Linear(dim, 4 * dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v, g = self.qkvg(x).view(b, s, 4, H, D).permute(2, 0, 3, 1, 4).unbind(0)
        o = torch.softmax(q @ k.transpose(-2, -1) * D ** -0.5, dim=-1) @ v
        return o * torch.sigmoid(g)


def _qkv():
    torch.manual_seed(0)
    return tuple(torch.randn(B, H, S, D) for _ in range(3))


example_inputs = {
    "vanilla": _qkv,
    "sliding_window": _qkv,
    "softmax_over_queries": _qkv,
    "GatedAttention": lambda: (torch.randn(B, S, H * D),),
}


def main():
    import fxflash

    for name, make in example_inputs.items():
        fn = globals()[name]
        fn = fn() if isinstance(fn, type) else fn
        args = make()
        out, ref = fxflash.optimize(fn)(*args), fn(*args)
        fused = sum(r.fused for r in fxflash.explain(fn, *args).regions)
        print(f"{name:<22} fused regions: {fused}  max |fxflash - eager| = {(out - ref).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
