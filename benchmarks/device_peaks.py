"""What this GPU sustains, measured: the ceilings roofline.py holds the attention kernels to.

    PYTHONPATH=. python benchmarks/device_peaks.py [--out benchmarks/results/device_peaks_<gpu>.csv]

Three rates, each a settled ``do_bench`` median (bench_attention.settled_ms) of a call that
does nothing but the one kind of work, so that its rate is that unit's ceiling:

* ``matmul_tflops``: bf16 ``torch.matmul`` of two 8192×8192 matrices (cuBLAS), 2·8192³ FLOPs;
* ``hbm_tb_s``: a copy of a 4 GiB tensor into another (``Tensor.copy_``), bytes read plus
  bytes written;
* ``exp2_per_s``: ``tl.exp2`` on fp32 in independent chains (``exp2(x) − 1``, one MUFU and one
  FMA-pipe op each), every SM busy — the special-function unit's rate, the one the softmax's
  exponentials run on;
* ``attention_tflops``: not a unit's ceiling but what the best hand-written attention kernels
  reach: the fastest of SDPA's backends (cuDNN, FlashAttention-2, memory-efficient) on plain
  non-causal attention, 1 × 16 heads × 16k tokens, head dim 128 or 256 (the faster),
  ``4·N²·D`` FLOPs per head; roofline.py holds the tensor-bound targets to it too.

Writes one row per rate: ``quantity,value,unit,device,torch,triton``.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
from bench_attention import settled_ms  # noqa: E402

MATMUL_N = 8192
COPY_BYTES = 4 * 2**30
EXP_BLOCK, EXP_ITERS, EXP_CHAINS = 1024, 4096, 4
ATTENTION_HEADS, ATTENTION_N, ATTENTION_HEAD_DIMS = 16, 16384, (128, 256)


@triton.jit
def _exp2_chains(out_ptr, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    """Four independent chains ``x ← exp2(x) − 1`` per element (a fixed point at 0 the unit
    does not shortcut), summed and stored so that nothing is dead code."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x0 = offs.to(tl.float32) * 1e-9
    x1 = x0 + 1e-3
    x2 = x0 + 2e-3
    x3 = x0 + 3e-3
    for _ in range(ITERS):
        x0 = tl.exp2(x0) - 1.0
        x1 = tl.exp2(x1) - 1.0
        x2 = tl.exp2(x2) - 1.0
        x3 = tl.exp2(x3) - 1.0
    tl.store(out_ptr + offs, x0 + x1 + x2 + x3)


def matmul_tflops() -> float:
    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    ms = settled_ms(lambda: torch.matmul(a, b))
    return 2 * MATMUL_N ** 3 / (ms * 1e-3) / 1e12


def hbm_tb_s() -> float:
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = settled_ms(lambda: dst.copy_(src))
    return 2 * COPY_BYTES / (ms * 1e-3) / 1e12


def exp2_per_s() -> float:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    programs = sms * 16
    out = torch.empty(programs * EXP_BLOCK, device="cuda")
    ms = settled_ms(lambda: _exp2_chains[(programs,)](out, EXP_ITERS, EXP_BLOCK, num_warps=8))
    return programs * EXP_BLOCK * EXP_ITERS * EXP_CHAINS / (ms * 1e-3)


def attention_tflops() -> float:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    best = 0.0
    for d in ATTENTION_HEAD_DIMS:
        q, k, v = (torch.randn(1, ATTENTION_HEADS, ATTENTION_N, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
            try:
                with sdpa_kernel(backend):
                    scaled_dot_product_attention(q, k, v)
                    ms = settled_ms(lambda: scaled_dot_product_attention(q, k, v))
            except RuntimeError as e:  # a backend this build or head dim lacks
                print(f"  SDPA {backend.name} d{d}: unavailable ({str(e).splitlines()[0][:80]})", flush=True)
                continue
            rate = 4 * ATTENTION_HEADS * ATTENTION_N ** 2 * d / (ms * 1e-3) / 1e12
            print(f"  SDPA {backend.name} d{d}: {ms:.3f} ms, {rate:.1f} TFLOP/s", flush=True)
            best = max(best, rate)
    return best


QUANTITIES = (("matmul_tflops", matmul_tflops, "TFLOP/s"), ("hbm_tb_s", hbm_tb_s, "TB/s"),
              ("exp2_per_s", exp2_per_s, "1/s"), ("attention_tflops", attention_tflops, "TFLOP/s"))


def main():
    device = torch.cuda.get_device_name(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      f"device_peaks_{device.replace(' ', '_')}.csv"))
    opts = parser.parse_args()
    rows = []
    for name, measure, unit in QUANTITIES:
        value = measure()
        print(f"{name}: {value:.4g} {unit}", flush=True)
        rows.append({"quantity": name, "value": f"{value:.6g}", "unit": unit, "device": device,
                     "torch": torch.__version__, "triton": triton.__version__})
    with open(opts.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
