"""Probe: does FlashAttention-3's warp-specialized structure, written in Gluon, beat cuDNN?

    PYTHONPATH=. python benchmarks/probe_gluon.py [--seqlens 1024 4096 16384] [--configs 3x128x3 ...]

The tenth session's profile put vanilla attention's remaining gap to cuDNN (torch.compile and
SDPA call it) on the overlap of the exponentials with the tensor cores, which cuDNN gets from
FlashAttention-3's producer/consumer warp groups and which Triton's ``tl`` level cannot
express (benchmarks/NOTES.md, fifth and tenth sessions). This probe writes that structure by
hand in Gluon (``triton.experimental.gluon``, Triton's layout-explicit level, shipped with
Triton 3.6) for the vanilla forward pass (bf16, [B, H, S, D], S a multiple of the tiles) and
times it beside SDPA, fxflash's printed kernel and the best hand-written ``tl`` kernel in one
process, before any code generation is built on it:

- one *loader* warp issues TMA copies of the CTA's Q tiles and of each K and V tile into a ring
  of ``NBUF`` shared-memory buffers (``mbarrier`` ready/empty pairs; a K/V buffer is free once
  every consumer has finished its P·V);
- ``CONSUMERS`` warp groups of 4 warps each own a 64-row Q tile (the CTA covers
  64·CONSUMERS rows) and share every K/V tile; registers are moved from the loader to them
  (``setmaxnreg`` through ``warp_specialize``'s register counts);
- inside each consumer, the scores of key tile j+1 (``wgmma``, asynchronous) are issued before
  the P·V of tile j, and the softmax of tile j+1 runs while that P·V does (FA3's
  intra-warpgroup overlap): ``S_{j+1} = Q·K_{j+1}ᵀ``; ``O += P_j·V_j``; wait for S; online
  softmax of S (running maximum in exp2 units, ``m₂ = max(s)·c·log₂e``); wait for O; rescale O.

Configs are ``CONSUMERS x BLOCK_N x NBUF``. Prints each config's relative error against SDPA
(fp32 reference of the same inputs) and its ``settled_ms`` and CUDA-graph replay medians.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

ROWS_PER_CONSUMER = 64  # one wgmma M extent: 4 warps × 16 rows
LOG2E = 1.4426950408889634
CONFIGS = ("2x128x3", "3x64x3", "3x128x2", "3x128x3", "3x128x4", "3x128x3p")


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty,
            q_row, kv_row, n_tiles):
    """One warp: the Q tiles once, then K_j and V_j into buffer j mod NBUF when it is free."""
    CONSUMERS: gl.constexpr = q_smem.type.shape[0]
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    NBUF: gl.constexpr = k_bufs.type.shape[0]
    mbarrier.expect(q_bar, CONSUMERS * q_desc.block_type.nbytes)
    for c in gl.static_range(CONSUMERS):
        tma.async_copy_global_to_shared(q_desc, [q_row + c * BM, 0], q_bar, q_smem.index(c))
    for j in range(n_tiles):
        idx = j % NBUF
        phase = (j // NBUF) & 1
        # A fresh mbarrier counts as having completed the phase before 0: the first NBUF waits pass.
        mbarrier.wait(kv_empty.index(idx), phase ^ 1)
        mbarrier.expect(k_ready.index(idx), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, 0], k_ready.index(idx), k_bufs.index(idx))
        mbarrier.expect(v_ready.index(idx), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, 0], v_ready.index(idx), v_bufs.index(idx))


@gluon.jit
def _consumer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty,
              q_row, kv_row, n_tiles, o_ptr, qk_scale, turns, q_end, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """One warp group: softmax(Q_WG·Kᵀ·c)·V for its 64 rows, written to ``o_ptr`` (rows before
    ``q_end`` only: the CTA's last consumers may hold rows of the next head)."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    NBUF: gl.constexpr = k_bufs.type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    q = q_smem.index(WG)
    mbarrier.wait(q_bar, 0)
    zero_s = gl.zeros([BM, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([BM, D], gl.float32, o_layout)

    mbarrier.wait(k_ready.index(0), 0)
    _take_turn(turns, 0, WG, PINGPONG)
    s = warpgroup_mma(q, k_bufs.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    _pass_turn(turns, WG, PINGPONG)
    s = warpgroup_mma_wait(0, deps=(s, ))
    m = gl.max(s, axis=1) * qk_scale
    p = gl.exp2(s * qk_scale - gl.expand_dims(m, 1))
    l_sum = gl.sum(p, axis=1)
    p = p.to(gl.bfloat16)  # P lives in 16 bits between tiles: fewer registers under the overlap
    for j in range(1, n_tiles):
        idx = j % NBUF
        prev = (j - 1) % NBUF
        mbarrier.wait(k_ready.index(idx), (j // NBUF) & 1)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // NBUF) & 1)
        p_op = gl.convert_layout(p, p_layout)
        _take_turn(turns, j, WG, PINGPONG)
        s_next = warpgroup_mma(q, k_bufs.index(idx).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        acc = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=True)
        _pass_turn(turns, WG, PINGPONG)
        s = warpgroup_mma_wait(1, deps=(s_next, ))
        m_new = gl.maximum(m, gl.max(s, axis=1) * qk_scale)
        alpha = gl.exp2(m - m_new)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        l_sum = l_sum * alpha + gl.sum(p, axis=1)
        p = p.to(gl.bfloat16)
        m = m_new
        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
        mbarrier.arrive(kv_empty.index(prev), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
    last = (n_tiles - 1) % NBUF
    mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // NBUF) & 1)
    p_op = gl.convert_layout(p, p_layout)
    _take_turn(turns, n_tiles, WG, PINGPONG)
    acc = warpgroup_mma(p_op, v_bufs.index(last), acc, is_async=True)
    _pass_turn(turns, WG, PINGPONG)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    mbarrier.arrive(kv_empty.index(last), count=1)

    out = acc / gl.expand_dims(gl.convert_layout(l_sum, o_rows), 1)
    rows = q_row + WG * BM + gl.arange(0, BM, layout=o_rows)
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    offs = gl.expand_dims(rows.to(gl.int64), 1) * D + gl.expand_dims(cols, 0)
    gl.store(o_ptr + offs, out.to(o_ptr.dtype.element_ty), mask=gl.expand_dims(rows < q_end, 1))


@gluon.jit
def _take_turn(turns, k, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong (FA3): wait until the previous consumer has issued its k-th batch of wgmmas,
    so the consumers' matrix products alternate and each one's softmax runs under another's
    products. Consumer 0's first wait passes (a fresh mbarrier has completed phase "-1")."""
    if PINGPONG:
        if WG == 0:
            mbarrier.wait(turns.index(0), (k & 1) ^ 1)
        else:
            mbarrier.wait(turns.index(WG), k & 1)


@gluon.jit
def _pass_turn(turns, WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turns.index((WG + 1) % turns.type.shape[0]), count=1)


@gluon.jit
def _consumer0(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty,
               q_row, kv_row, n_tiles, o_ptr, qk_scale, turns, q_end, PINGPONG: gl.constexpr):
    _consumer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty,
              q_row, kv_row, n_tiles, o_ptr, qk_scale, turns, q_end, 0, PINGPONG)


@gluon.jit
def _consumer1(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty,
               q_row, kv_row, n_tiles, o_ptr, qk_scale, turns, q_end, PINGPONG: gl.constexpr):
    _consumer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty,
              q_row, kv_row, n_tiles, o_ptr, qk_scale, turns, q_end, 1, PINGPONG)


@gluon.jit
def _consumer2(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty,
               q_row, kv_row, n_tiles, o_ptr, qk_scale, turns, q_end, PINGPONG: gl.constexpr):
    _consumer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty,
              q_row, kv_row, n_tiles, o_ptr, qk_scale, turns, q_end, 2, PINGPONG)


@gluon.jit
def _loader_partition(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty,
                      q_row, kv_row, n_tiles, o_ptr, qk_scale, turns, q_end, PINGPONG: gl.constexpr):
    _loader(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty,
            q_row, kv_row, n_tiles)


@gluon.jit
def _attention_ws(q_desc, k_desc, v_desc, o_ptr, S_q, S_kv, qk_scale,
                  CONSUMERS: gl.constexpr, NBUF: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                  PINGPONG: gl.constexpr):
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    bh = gl.program_id(1)
    q_row = bh * S_q + gl.program_id(0) * (CONSUMERS * BM)
    kv_row = bh * S_kv
    n_tiles = S_kv // BLOCK_N

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, BM, D], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [NBUF, BLOCK_N, D], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [NBUF, BLOCK_N, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NBUF):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=CONSUMERS)
    turns = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(turns.index(i), count=1)

    args = (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, v_ready, kv_empty,
            q_row, kv_row, n_tiles, o_ptr, qk_scale, turns, (bh + 1) * S_q, PINGPONG)
    if CONSUMERS == 2:
        gl.warp_specialize([(_consumer0, args), (_consumer1, args), (_loader_partition, args)],
                           [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([(_consumer0, args), (_consumer1, args), (_consumer2, args),
                            (_loader_partition, args)],
                           [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])


def descriptors(q, k, v, block_n):
    """TMA descriptors over [B·H·S, D] views (S a multiple of the tiles: no tile crosses a head)."""
    D = q.shape[-1]
    layout = gl.NVMMASharedLayout.get_default_for([ROWS_PER_CONSUMER, D], gl.bfloat16)
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, D], gl.bfloat16)
    flat = [t.reshape(-1, D) for t in (q, k, v)]
    return (TensorDescriptor.from_tensor(flat[0], [ROWS_PER_CONSUMER, D], layout),
            TensorDescriptor.from_tensor(flat[1], [block_n, D], kv_layout),
            TensorDescriptor.from_tensor(flat[2], [block_n, D], kv_layout))


def register_budget(consumers: int) -> tuple[int, int]:
    """(maxnreg for the kernel, registers per consumer thread): the loader's warp group keeps
    24, the consumers share the rest of the 64 K registers of one CTA per SM (multiples of 8)."""
    warps = 4 * consumers + 4
    maxnreg = (65536 // (warps * 32)) // 8 * 8
    per_consumer = (maxnreg * warps * 32 - 24 * 128) // (consumers * 128) // 8 * 8
    return maxnreg, min(per_consumer, 256)


def gluon_attention(q, k, v, out, consumers: int, block_n: int, nbuf: int, pingpong: bool):
    B, H, S, D = q.shape
    if not all(t.is_contiguous() for t in (q, k, v, out)):
        raise ValueError("probe needs contiguous [B, H, S, D] tensors")
    if S % ROWS_PER_CONSUMER or k.shape[2] % block_n:
        raise ValueError(f"probe needs S % {ROWS_PER_CONSUMER} == 0 and N % {block_n} == 0")
    q_desc, k_desc, v_desc = descriptors(q, k, v, block_n)
    maxnreg, regs = register_budget(consumers)
    grid = (triton.cdiv(S, consumers * ROWS_PER_CONSUMER), B * H)
    _attention_ws[grid](q_desc, k_desc, v_desc, out, S, k.shape[2], LOG2E / math.sqrt(D),
                        CONSUMERS=consumers, NBUF=nbuf, CONSUMER_REGS=regs, PINGPONG=pingpong,
                        num_warps=4, maxnreg=maxnreg)
    return out


def parse_config(text: str) -> tuple[int, int, int, bool]:
    """``CONSUMERS x BLOCK_N x NBUF``, with a trailing ``p`` for ping-pong: ``2x128x3p``."""
    pingpong = text.endswith("p")
    consumers, block_n, nbuf = (int(x) for x in text.rstrip("p").split("x"))
    if consumers not in (2, 3):
        raise argparse.ArgumentTypeError("CONSUMERS must be 2 or 3")
    return consumers, block_n, nbuf, pingpong


def main():
    import fxflash
    from bench_attention import medians
    from fxflash import variants
    from probe_core_loop import _probe_attention

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", nargs="*", type=int, default=[1024, 4096, 16384])
    parser.add_argument("--configs", nargs="*", type=parse_config,
                        default=[parse_config(c) for c in CONFIGS])
    opts = parser.parse_args()
    H, D = 16, 64
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}", flush=True)
    for S in opts.seqlens:
        B = max(1, 16384 // S)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
        flops = 4 * B * H * S * S * D

        def report(label, call, result):
            call()
            err = ((result.float() - ref).norm() / ref.norm()).item()
            ms, graph = medians(call)
            print(f"S={S} {label:<28} {ms:.3f} ms (graph {graph:.3f}) {flops / ms / 1e9:.0f} TFLOP/s "
                  f"rel err {err:.1e}", flush=True)

        sdpa_out = [None]

        def sdpa():
            sdpa_out[0] = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        sdpa()
        report("sdpa", sdpa, sdpa_out[0])
        fast = fxflash.optimize(variants.vanilla)
        fx_out = [fast(q, k, v)]
        report("fxflash", lambda: fx_out.__setitem__(0, fast(q, k, v)), fx_out[0])
        o = torch.empty_like(q)
        report("tl hand kernel 128x64 w8 s3",
               lambda: _probe_attention[(S // 128, B * H)](q, k, v, o, B * H, S, LOG2E / math.sqrt(D), D=D,
                                                           BLOCK_M=128, BLOCK_N=64, DESC=False, WS=False,
                                                           LAZY=False, AHEAD=False, EMU=False,
                                                           num_warps=8, num_stages=3), o)
        for consumers, block_n, nbuf, pingpong in opts.configs:
            label = f"gluon {consumers}x{block_n}x{nbuf}{'p' if pingpong else ''}"
            g = torch.full_like(q, float("nan"))
            try:
                report(label, lambda: gluon_attention(q, k, v, g, consumers, block_n, nbuf, pingpong), g)
            except Exception as exc:  # noqa: BLE001 - a config the compiler refuses is a result
                print(f"S={S} {label:<28} {type(exc).__name__}: {str(exc)[:400]}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    main()
