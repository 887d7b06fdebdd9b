"""Where the Evoformer row attention's time goes: the suite's call with parts left out.

    PYTHONPATH=. python benchmarks/probes/probe_evoformer.py [--batch 8] [--head-dim 64]

bf16, N_seq = S = 256, 4 heads (the suite's config, B·N_seq attention problems of 256 keys).
Times, with fxflash's tuned tile, ``do_bench`` medians and CUDA-graph replay medians of:
the whole program; without the gate; without the pair bias; without the mask bias; plain
softmax attention on the same [B, N_seq, S, H, D] layout; plain attention on a contiguous
[B·N_seq, H, S, D] layout; SDPA (FlashAttention) on that layout; torch.compile of the whole
program. Differences between rows place the time (METHOD.md: leave one stage out).
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import fxflash  # noqa: E402
from fxflash import variants as V  # noqa: E402

sys.path[:0] = [os.path.dirname(__file__), os.path.join(os.path.dirname(__file__), "..")]
from bench_attention import medians  # noqa: E402

INF = V.INF


def no_gate(q, k, v, mask, pair_bias, gate):
    mask_bias = (INF * (mask - 1))[..., :, None, None, :]
    q = q.transpose(-2, -3) / math.sqrt(q.size(-1))
    k, v = k.transpose(-2, -3), v.transpose(-2, -3)
    a = torch.softmax(q @ k.transpose(-1, -2) + mask_bias + pair_bias, dim=-1)
    return (a @ v).transpose(-2, -3)


def no_pair_bias(q, k, v, mask, pair_bias, gate):
    mask_bias = (INF * (mask - 1))[..., :, None, None, :]
    q = q.transpose(-2, -3) / math.sqrt(q.size(-1))
    k, v = k.transpose(-2, -3), v.transpose(-2, -3)
    a = torch.softmax(q @ k.transpose(-1, -2) + mask_bias, dim=-1)
    return (a @ v).transpose(-2, -3) * torch.sigmoid(gate)


def no_mask_bias(q, k, v, mask, pair_bias, gate):
    q = q.transpose(-2, -3) / math.sqrt(q.size(-1))
    k, v = k.transpose(-2, -3), v.transpose(-2, -3)
    a = torch.softmax(q @ k.transpose(-1, -2) + pair_bias, dim=-1)
    return (a @ v).transpose(-2, -3) * torch.sigmoid(gate)


def plain_strided(q, k, v, mask, pair_bias, gate):
    q, k, v = q.transpose(-2, -3), k.transpose(-2, -3), v.transpose(-2, -3)
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)), dim=-1)
    return (a @ v).transpose(-2, -3)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    opts = parser.parse_args()
    B, N_seq, S, H, D = opts.batch, 256, 256, 4, opts.head_dim
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to("cuda", torch.bfloat16)

    q, k, v, gate = (rnd(B, N_seq, S, H, D) for _ in range(4))
    mask = (torch.rand(B, N_seq, S, generator=g) > 0.2).to("cuda", torch.bfloat16)
    args = (q, k, v, mask, rnd(B, 1, H, S, S), gate)
    flat = [t.transpose(-2, -3).reshape(B * N_seq, H, S, D).contiguous() for t in (q, k, v)]
    gbytes = 5 * q.numel() * 2 / 1e9
    flops = 4 * B * N_seq * H * S * S * D
    print(f"Evoformer row B={B} N_seq={N_seq} S={S} H={H} D={D} bf16 on {torch.cuda.get_device_name()}: "
          f"{gbytes:.2f} GB of q, k, v, gate, out; {flops / 1e9:.0f} GFLOP", flush=True)
    rows = [("whole program", V.evoformer_row, args), ("without the gate", no_gate, args),
            ("without the pair bias", no_pair_bias, args), ("without the mask bias", no_mask_bias, args),
            ("plain attention, same layout", plain_strided, args),
            ("plain attention, [B·N_seq, H, S, D]", V.vanilla, tuple(flat))]
    for label, fn, fn_args in rows:
        fast = fxflash.optimize(fn)
        ms, graph = medians(lambda: fast(*fn_args))
        print(f"{label:<38} fxflash {ms:.3f} ms (graph {graph:.3f}; {flops / graph / 1e9:.0f} TFLOP/s, "
              f"{gbytes / graph:.2f} TB/s)", flush=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    ms, graph = medians(lambda: sdpa(*flat))
    print(f"{'SDPA, [B·N_seq, H, S, D]':<38} {ms:.3f} ms (graph {graph:.3f})", flush=True)
    compiled = torch.compile(V.evoformer_row, dynamic=False)
    ms, graph = medians(lambda: compiled(*args))
    print(f"{'torch.compile, whole program':<38} {ms:.3f} ms (graph {graph:.3f})", flush=True)


if __name__ == "__main__":
    main()
