"""One attention's training step (forward plus backward) through fxflash, against SDPA and
FlexAttention: time per step and peak memory, bf16, the user's attention written as matmul,
softmax and matmul.

    PYTHONPATH=. python benchmarks/bench_training.py [--seq 4096 8192] [--masks none causal] [--out F]

B = 4, H = 16, D = 64. Time: triton's ``do_bench`` median of ``out = f(q, k, v); out.backward(dO)``
(gradients cleared between steps). Peak: the most memory allocated during one step beyond the
inputs. Each fxflash row also says how the region's backward ran (fxflash's report) and the
largest difference of its gradients from SDPA's.
"""
import argparse
import datetime
import math
import os

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import fxflash

import results_csv

B, H, D = 4, 16, 64


def attention(q, k, v):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    return torch.softmax(s, -1) @ v


def causal_attention(q, k, v):
    i = torch.arange(q.size(-2), device=q.device)
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))).masked_fill(i[None, :] > i[:, None], float("-inf"))
    return torch.softmax(s, -1) @ v


def _paths(mask: str, seq: int) -> dict:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    causal = mask == "causal"
    user = causal_attention if causal else attention
    block = create_block_mask(lambda b, h, i, j: j <= i, None, None, seq, seq) if causal else None
    flex = torch.compile(flex_attention)
    return {
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "flex": lambda q, k, v: flex(q, k, v, block_mask=block),
        "fxflash.optimize": fxflash.optimize(user),
        "backend": torch.compile(user, backend="fxflash"),
        # the inference forward, the row statistics computed again by the backward's own kernel
        # (config.forward_statistics off: what the training forward replaced)
        "fxflash.optimize, statistics pass": fxflash.optimize(user),
        # the region's own ops recomputed with eager autograd (what the fused backward replaced); at
        # 4k only, its [B, H, L, L] intermediates take tens of GB
        **({"fxflash.optimize, eager recompute": fxflash.optimize(user)} if seq <= 4096 else {}),
    }, user


def _step(fn, q, k, v, grad):
    fn(q, k, v).backward(grad)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, nargs="*", default=[4096, 8192])
    parser.add_argument("--masks", nargs="*", default=["none", "causal"])
    parser.add_argument("--out", default=None)
    opts = parser.parse_args()
    gpu = torch.cuda.get_device_name().replace(" ", "_")
    out = opts.out or os.path.join(os.path.dirname(__file__), "results", f"training_{gpu}.csv")
    rows = []
    for mask in opts.masks:
        for seq in opts.seq:
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, grad = (torch.randn(B, H, seq, D, device="cuda", dtype=torch.bfloat16, generator=g)
                             for _ in range(4))
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            paths, user = _paths(mask, seq)
            reference = None
            for name, fn in paths.items():
                fxflash.config.fused_backward = not name.endswith("eager recompute")
                fxflash.config.forward_statistics = not name.endswith("statistics pass")
                _step(fn, q, k, v, grad)   # compile and tune outside the timing
                grads = [t.grad.float() for t in (q, k, v)]
                reference = reference or grads
                diff = max((a - b).abs().max().item() for a, b in zip(grads, reference))
                for t in (q, k, v):
                    t.grad = None
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                _step(fn, q, k, v, grad)
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - base
                ms = do_bench(lambda: _step(fn, q, k, v, grad), warmup=10, rep=100, grad_to_none=[q, k, v])
                how = ""
                if name == "fxflash.optimize":
                    how = "; ".join(r.backward for r in fxflash.explain(user, q, k, v).regions if r.fused)
                rows.append(dict(date=datetime.date.today().isoformat(), gpu=gpu, mask=mask, seq=seq, path=name,
                                 ms=round(ms, 3), peak_mb=round(peak / 2 ** 20, 1), backward=how,
                                 max_grad_diff_vs_sdpa=f"{diff:.3g}"))
                print(f"{mask:6} L={seq:5} {name:34} {ms:8.3f} ms  peak {peak / 2 ** 20:9.1f} MB  "
                      f"|dgrad − sdpa| {diff:.3g}  {how}", flush=True)
                for t in (q, k, v):
                    t.grad = None
    results_csv.append(out, rows)


if __name__ == "__main__":
    main()
