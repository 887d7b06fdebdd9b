"""Probe: which Hopper features would speed up the attention key loop that fxflash prints?

    PYTHONPATH=. python benchmarks/probes/probe_core_loop.py

A hand-written forward attention kernel (vanilla softmax, bf16, [B, H, S, D]) with switches
for the features issue 6 lists, timed beside fxflash's generated kernel and SDPA in one
process (each call timed from the same state, ``bench_attention.settled_ms``; the 2026-11-22 log used plain ``do_bench``), so each switch's effect is measured before the code
generator learns it:

- ``DESC``: Q, K, V and O through tensor descriptors (TMA bulk copies) instead of pointer
  tiles;
- ``WS``: the key loop warp-specialized by Triton (``tl.range(..., warp_specialize=True)``);
- ``LAZY``: the running maximum moves, and the accumulator is rescaled, only when some row's
  tile maximum exceeds it by more than ``2**8`` (in exp2 units); otherwise the stale maximum
  stays (every ``p = exp2(x - m) <= 2**8``, exact after the final division by the sum);
- ``EMU``: every second key tile's exponentials computed on the FMA and integer pipes (a
  degree-3 polynomial for ``2^f``, ``f`` in [-1/2, 1/2], scaled by ``2^round(x)`` through the
  exponent bits; relative error 1.4e-4, below bf16's rounding of P) instead of the MUFU unit
  (FlashAttention-4's offload: the profile shows MUFU and the tensor cores equally busy);
- ``AHEAD``: the next key tile's scores ``Q·K_{j+1}ᵀ`` issued before the softmax of tile j
  (FlashAttention-3's intra-warpgroup overlap: the asynchronous wgmma runs while the
  exponentials of the current tile do; the last iteration recomputes its own tile).

Prints one line per (switches, tile) and the best of each switch set.
"""
from __future__ import annotations

import itertools
import math
import sys
import os

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))


@triton.jit
def _key_tile(k_ptr, k_desc, base, bh, start_n, offs_d, D: tl.constexpr, BLOCK_N: tl.constexpr, DESC: tl.constexpr):
    """Kᵀ of the key tile at ``start_n``: [D, BLOCK_N]."""
    if DESC:
        return k_desc.load([bh, start_n, 0]).reshape(BLOCK_N, D).T
    offs_n = start_n + tl.arange(0, BLOCK_N)
    return tl.load(k_ptr + base + offs_n[None, :] * D + offs_d[:, None])


@triton.jit
def _exp2_fma(x):
    """``2^x`` for ``x <= 0`` without the MUFU unit: round-to-nearest by the 1.5·2^23 trick,
    a polynomial for the fraction, the integer part added to the exponent bits."""
    x = tl.maximum(x, -126.0)
    t = x + 12582912.0
    f = x - (t - 12582912.0)
    p = 0.99995134 + f * (0.69325305 + f * (0.24225698 + f * 0.05502927))
    n = t.to(tl.int32, bitcast=True) - 0x4B400000
    return (p.to(tl.int32, bitcast=True) + n * 8388608).to(tl.float32, bitcast=True)


@triton.jit
def _probe_attention(q_ptr, k_ptr, v_ptr, o_ptr, BH, N, qk_scale,
                     D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     DESC: tl.constexpr, WS: tl.constexpr, LAZY: tl.constexpr, AHEAD: tl.constexpr,
                     EMU: tl.constexpr):
    mt = tl.program_id(0)
    bh = tl.program_id(1)
    offs_m = mt * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    base = bh.to(tl.int64) * N * D
    if DESC:
        q_desc = tl.make_tensor_descriptor(q_ptr, [BH, N, D], [N * D, D, 1], [1, BLOCK_M, D])
        k_desc = tl.make_tensor_descriptor(k_ptr, [BH, N, D], [N * D, D, 1], [1, BLOCK_N, D])
        v_desc = tl.make_tensor_descriptor(v_ptr, [BH, N, D], [N * D, D, 1], [1, BLOCK_N, D])
        o_desc = tl.make_tensor_descriptor(o_ptr, [BH, N, D], [N * D, D, 1], [1, BLOCK_M, D])
        q = q_desc.load([bh, mt * BLOCK_M, 0]).reshape(BLOCK_M, D)
    else:
        k_desc = None
        q = tl.load(q_ptr + base + offs_m[:, None] * D + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if AHEAD:
        s_next = tl.dot(q, _key_tile(k_ptr, k_desc, base, bh, 0, offs_d, D, BLOCK_N, DESC))
    for start_n in tl.range(0, N, BLOCK_N, warp_specialize=WS):
        if AHEAD:
            s = s_next
            ahead = tl.minimum(start_n + BLOCK_N, N - BLOCK_N)
            s_next = tl.dot(q, _key_tile(k_ptr, k_desc, base, bh, ahead, offs_d, D, BLOCK_N, DESC))
        else:
            s = tl.dot(q, _key_tile(k_ptr, k_desc, base, bh, start_n, offs_d, D, BLOCK_N, DESC))
        m_tile = tl.max(s, 1) * qk_scale
        if LAZY:
            grow = tl.max(m_tile - m_i, 0)
            if grow > 8.0:
                m_new = tl.maximum(m_i, m_tile)
                alpha = tl.math.exp2(m_i - m_new)
                l_i = l_i * alpha
                acc = acc * alpha[:, None]
                m_i = m_new
            p = tl.math.exp2(s * qk_scale - m_i[:, None])
            l_i += tl.sum(p, 1)
        else:
            m_new = tl.maximum(m_i, m_tile)
            alpha = tl.math.exp2(m_i - m_new)
            if EMU and (start_n // BLOCK_N) % 2 == 1:
                p = _exp2_fma(s * qk_scale - m_new[:, None])
            else:
                p = tl.math.exp2(s * qk_scale - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            m_i = m_new
        if DESC:
            v = v_desc.load([bh, start_n, 0]).reshape(BLOCK_N, D)
        else:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            v = tl.load(v_ptr + base + offs_n[:, None] * D + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
    out = (acc / l_i[:, None]).to(o_ptr.dtype.element_ty)
    if DESC:
        o_desc.store([bh, mt * BLOCK_M, 0], out.reshape(1, BLOCK_M, D))
    else:
        tl.store(o_ptr + base + offs_m[:, None] * D + offs_d[None, :], out)


def _alloc(size, alignment, stream):
    return torch.empty(size, device="cuda", dtype=torch.int8)


TILES = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 4, 4)]
SWITCHES = [dict(DESC=d, WS=w, LAZY=lz, AHEAD=a, EMU=e)
            for d, w, lz, a, e in itertools.product(*[(False, True)] * 5)
            if not (w and not d) and not (a and (w or lz)) and not (e and (w or lz))]


def main():
    import argparse

    import fxflash
    from bench_attention import settled_ms
    from fxflash import variants

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--switches", nargs="*", default=None,
                        help="switch sets to time, e.g. plain DESC DESC+LAZY (default: all)")
    opts = parser.parse_args()

    triton.set_allocator(_alloc)
    rows = []
    for B, S in ((1, 16384), (4, 4096)):
        H, D = 16, 64
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        flops = 4 * B * H * S * S * D
        tf = lambda ms: flops / ms / 1e9  # noqa: E731
        bench = settled_ms
        ms = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
        print(f"S={S} sdpa {ms:.3f} ms {tf(ms):.0f} TFLOP/s", flush=True)
        rows.append((S, "sdpa", "", ms))
        fast = fxflash.optimize(variants.vanilla)
        fast(q, k, v)
        ms = bench(lambda: fast(q, k, v))
        print(f"S={S} fxflash {ms:.3f} ms {tf(ms):.0f} TFLOP/s", flush=True)
        rows.append((S, "fxflash", "", ms))
        o = torch.empty_like(q)
        scale = 1.0 / math.sqrt(D) * 1.4426950408889634
        for sw in SWITCHES:
            label = "+".join(k for k, on in sw.items() if on) or "plain"
            if opts.switches is not None and label not in opts.switches:
                continue
            for bm, bn, w, st in TILES:
                grid = (S // bm, B * H)
                call = lambda: _probe_attention[grid](q, k, v, o, B * H, S, scale, D=D, BLOCK_M=bm, BLOCK_N=bn,  # noqa: E731
                                                       num_warps=w, num_stages=st, **sw)
                try:
                    o.fill_(float("nan"))
                    call()
                    err = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
                    ms = bench(call)
                except Exception as exc:  # noqa: BLE001 - a switch the compiler refuses is a result
                    print(f"S={S} {label:16s} {bm}x{bn} w{w} s{st}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                    continue
                print(f"S={S} {label:16s} {bm}x{bn} w{w} s{st}: {ms:.3f} ms {tf(ms):.0f} TFLOP/s err {err:.1e}", flush=True)
                rows.append((S, label, f"{bm}x{bn} w{w} s{st}", ms))
    print("\nbest per switch set:")
    for S in sorted({r[0] for r in rows}):
        best = {}
        for s, label, tile, ms in rows:
            if s == S and (label not in best or ms < best[label][1]):
                best[label] = (tile, ms)
        for label, (tile, ms) in sorted(best.items(), key=lambda kv: kv[1][1]):
            print(f"  S={S} {label:16s} {ms:.3f} ms  {tile}")


if __name__ == "__main__":
    main()
