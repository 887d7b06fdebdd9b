"""A small GPT trained with its attention written as plain PyTorch, through fxflash's backend.

    python examples/train_gpt.py                                 # 300 steps, each of eager, torch.compile, fxflash
    python examples/train_gpt.py --paths fxflash --steps 50 --out curve.png
    python examples/train_gpt.py --paths inductor-graphs fxflash-graphs   # mode="reduce-overhead": CUDA graphs
    python examples/train_gpt.py --tiny --device cpu --steps 3   # a check that runs anywhere (interpreter)
    python examples/train_gpt.py --plot-only losses.csv --out curve.png   # redraw a --csv file

The model: 6 layers, width 512, 8 heads, 1024 tokens of context, causal attention written as
matmul, ``masked_fill`` and softmax (what fxflash fuses, forward and backward). bf16 autocast,
AdamW. The data is made here, with no download: sequences from a fixed random Markov chain
(each token has 4 likely successors) whose second half repeats the first, so that the loss
falls towards the chain's entropy in the first half and towards 0 in the second once
attention learns to copy. Every path starts from the same weights and sees the same batches.

Prints, per path, the loss every 25 steps, the median step time after the first 10 steps
(compilation and tuning happen in the first), and how many attention regions fxflash fused,
forward and backward (its own report). ``--out`` writes the loss curves (matplotlib) and
``--csv`` the losses per step.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        i = torch.arange(t, device=x.device)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))
        s = s.masked_fill(i[None, :] > i[:, None], float("-inf"))
        y = torch.softmax(s, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int, context: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        x = self.tokens(idx) + self.positions(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def markov_batches(steps: int, batch: int, context: int, vocab: int, seed: int = 0):
    """``steps`` batches of ``[batch, context + 1]`` tokens: a Markov chain's walk of
    ``(context + 1) // 2`` tokens, then the same walk again."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(vocab, (vocab, 4), generator=g)
    half = (context + 2) // 2
    out = []
    for _ in range(steps):
        walk = torch.empty(batch, half, dtype=torch.long)
        walk[:, 0] = torch.randint(vocab, (batch,), generator=g)
        choice = torch.randint(4, (batch, half), generator=g)
        for t in range(1, half):
            walk[:, t] = successors[walk[:, t - 1], choice[:, t]]
        out.append(torch.cat([walk, walk], 1)[:, : context + 1])
    return out


# path → (torch.compile's backend, its mode): "-graphs" paths record each step's graphs as CUDA
# graphs (mode="reduce-overhead"), which takes the host's launch work out of the step
PATHS = {"eager": (None, None), "inductor": ("inductor", None), "fxflash": ("fxflash", None),
         "inductor-graphs": ("inductor", "reduce-overhead"), "fxflash-graphs": ("fxflash", "reduce-overhead")}


def train(model, batches, device, compile_with: str | None, lr: float, mode: str | None = None):
    """Losses per step, step times (s) and the fxflash reports of the graphs compiled."""
    from fxflash.backend import recording

    step_model = model if compile_with is None else torch.compile(model, backend=compile_with, mode=mode)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda"
                else contextlib.nullcontext())
    losses, times = [], []
    with recording() as reports:
        for step, tokens in enumerate(batches):
            tokens = tokens.to(device)
            start = time.perf_counter()
            with autocast:
                logits = step_model(tokens[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())   # synchronizes: the step's time is its own
            times.append(time.perf_counter() - start)
            if step % 25 == 0 or step == len(batches) - 1:
                print(f"  step {step:4d}  loss {losses[-1]:.4f}  {times[-1] * 1e3:8.1f} ms", flush=True)
    return losses, times, reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", nargs="*", default=["eager", "inductor", "fxflash"], choices=list(PATHS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="2 layers, width 64, 2 heads, 64 tokens")
    parser.add_argument("--out", default=None, help="a plot of the loss curves (PNG)")
    parser.add_argument("--csv", default=None, help="the losses per step")
    parser.add_argument("--plot-only", default=None, help="draw --out from a --csv file, train nothing")
    opts = parser.parse_args()
    layers, width, heads, context, vocab = (2, 64, 2, 64, 128) if opts.tiny else (6, 512, 8, 1024, 512)
    title = f"GPT {layers}×{width}, {heads} heads, {context} tokens, bf16 autocast"
    if opts.plot_only:
        with open(opts.plot_only, newline="") as f:
            rows = list(csv.DictReader(f))
        plot({path: [float(row[path]) for row in rows] for path in rows[0] if path != "step"}, title, opts.out)
        return
    device = torch.device(opts.device)
    torch.manual_seed(0)
    initial = GPT(vocab, width, layers, heads, context)
    batches = markov_batches(opts.steps, opts.batch, context, vocab)
    curves = {}
    for path in opts.paths:
        print(f"{path}:", flush=True)
        model = copy.deepcopy(initial).to(device)
        compile_with, mode = PATHS[path]
        torch._dynamo.reset()
        losses, times, reports = train(model, batches, device, compile_with, opts.lr, mode)
        steady = times[10:] or times
        curves[path] = losses
        line = f"  median step {statistics.median(steady) * 1e3:.1f} ms, first step {times[0]:.1f} s"
        if compile_with == "fxflash":
            graphs = {id(report): report for report in reports}.values()   # each compiled graph once
            regions = [r for report in graphs for r in report.regions]
            fused = [r for r in regions if r.fused]
            backward = sum(r.backward == "fused" for r in fused)
            line += (f"; {len(fused)} of {len(regions)} attention regions fused, "
                     f"{backward} with a fused backward")
        print(line, flush=True)
    if opts.csv:
        with open(opts.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["step", *curves])
            writer.writerows([step, *(f"{curves[p][step]:.5f}" for p in curves)] for step in range(opts.steps))
    if opts.out:
        plot(curves, title, opts.out)


def plot(curves: dict, title: str, out: str) -> None:
    """The loss curves, one per path, as a PNG (matplotlib)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for path, losses in curves.items():
        ax.plot(losses, label=path, linewidth=1)
    ax.set(xlabel="step", ylabel="training loss", yscale="log", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
