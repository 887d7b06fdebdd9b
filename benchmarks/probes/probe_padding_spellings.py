"""A key-padding mask in two spellings, additive (``(1 − am)·finfo.min``) and expanded
(``~am.bool()[:, None, None, :].expand(B, H, M, N)`` with ``masked_fill``), with an elementwise op on
a broadcast view computed in the kernel from the view's source (after) and computed by eager on the
view (before, ``outside.broadcast_source`` bypassed): time per call and memory beyond the inputs.

    PYTHONPATH=. python benchmarks/probes/probe_padding_spellings.py    (a CUDA GPU)
"""
import math

import torch
from triton.testing import do_bench

import fxflash
from fxflash.tile import outside

B, H, L, D = 4, 16, 4096, 64


def additive(q, k, v, am):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    s = s + (1 - am[:, None, None, :].to(s.dtype)) * torch.finfo(s.dtype).min
    return torch.softmax(s, -1) @ v


def expanded(q, k, v, am):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    m = am.bool()[:, None, None, :].expand(B, H, L, L)
    return torch.softmax(s.masked_fill(~m, float("-inf")), -1) @ v


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    am = torch.ones(B, L, dtype=torch.long, device="cuda")
    am[1, :L // 4] = 0
    am[3, :L // 2] = 0
    original = outside.broadcast_source
    for fn in (additive, expanded):
        for label, source in (("before", lambda n: n), ("after", original)):
            outside.broadcast_source = source
            fast = fxflash.optimize(fn, inner="eager")
            fast(q, k, v, am)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fast(q, k, v, am)
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            ms = do_bench(lambda: fast(q, k, v, am), warmup=50, rep=300)
            err = (fast(q, k, v, am).float() - fn(q, k, v, am).float()).abs().max().item()
            print(f"{fn.__name__:9} {label:6} {ms:.3f} ms, peak {peak:.0f} MiB beyond the inputs, "
                  f"max |diff| vs eager {err:.3g}")
    outside.broadcast_source = original


if __name__ == "__main__":
    main()
