"""Probe: differential attention as a two-stream Gluon kernel, one consumer warp group per stream.

    PYTHONPATH=. python benchmarks/probes/probe_diff_gluon.py [--seqlens 512 1024 16384] [--head-dim 64]
        [--configs 128x2 128x2p 128x2P 64x2p ...]

Differential attention (``fxflash.variants.diff_attention``; q, k ``[B, 2H, S, D]``, v ``[B, H,
S, 2D]``) is ``O = softmax(q₀k₀ᵀ·s)·v − λ·softmax(q₁k₁ᵀ·s)·v`` per head pair. fxflash fuses it into
one Triton kernel carrying both streams (two running max/sum pairs, two accumulators), which
executes 1.5× eager's matrix work; issue 4 asks for 3× ``torch.compile`` at 512 to 16k keys, and
the Triton kernel's best tiles leave 16 % (512), 9 % (1k) and nothing at 16k (3.06×) to find
(benchmarks/NOTES.md, 2026-11-24). This probe times, before any code generation is
built on it, the FlashAttention-3 structure the vanilla Gluon kernel has, with the streams split
between the warp groups:

- one *loader* warp copies each item's two Q tiles (rows of heads 2h and 2h+1) and, per key tile,
  both streams' K tiles and the shared V tile by TMA into a ring of ``NBUF`` buffers;
- consumer warp group ``s`` (0 or 1) runs stream s's online softmax over 64 rows (its Q, its K,
  the shared V; S issued before the previous tile's P·V), so V is read once for both streams and
  each warp group holds one [64, Dv] accumulator — the register budget of vanilla attention at
  head dim Dv;
- at the end, consumer 1 puts ``O₁/l₁`` (fp32) into shared memory, consumer 0 reads it and
  stores ``O₀/l₀ − λ·O₁/l₁`` (with ``P``: a persistent grid, two Q buffers, the exchange buffer
  handed back each item);
- with ``p`` (ping-pong) the two warp groups take turns issuing their matrix products.

Configs are ``BLOCK_N x NBUF[p][P]``. Prints each system's median (``settled_ms``), CUDA-graph
replay, relative difference to fxflash's output, and the ratio to ``torch.compile``. Needs a
Hopper GPU and Triton 3.6's Gluon API; the kernel compiles without a GPU (``--compile-only``:
``triton.compile`` for sm_90, registers and spills), which is how configs are checked first.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path[:0] = [os.path.dirname(__file__), os.path.join(os.path.dirname(__file__), "..")]
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from fxflash.codegen.gluon_plan import ROWS_PER_CONSUMER, register_budget  # noqa: E402
from fxflash.patterns.rules import LOG2E  # noqa: E402
from probe_gluon import _pass_turn, _take_turn  # noqa: E402

CONFIGS = ("128x2", "128x2p", "128x2P", "128x2pP", "64x2p", "64x3p")
STREAMS = 2


@gluon.jit
def _item(item, S_q, S_kv, num_m_blocks, BM: gl.constexpr):
    """Work item → (head pair bh = b·H + h, first row, the two Q tiles' first row in q's
    [B·2H·S, D] view (head 2h; head 2h+1 is S_q rows on), K's first row likewise, V's first row
    in v's [B·H·S, Dv] view)."""
    bh = item // num_m_blocks
    m_start = (item % num_m_blocks) * BM
    return bh, m_start, 2 * bh * S_q + m_start, 2 * bh * S_kv, bh * S_kv


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, c_buf, q_ready, q_empty, k_ready, v_ready, kv_empty,
            turns, o_ready, o_free, o_ptr, lam, qk_scale, S_q, S_kv, num_m_blocks, n_items, PINGPONG: gl.constexpr):
    """One warp: each of the CTA's items' loads (_load_item)."""
    QB: gl.constexpr = q_bufs.type.shape[0] // 2
    t = 0
    it = 0
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        t += _load_item(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
                        S_q, S_kv, num_m_blocks, item, t, it, QB)
        it += 1


@gluon.jit
def _load_item(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
               S_q, S_kv, num_m_blocks, item, t, it, QB: gl.constexpr):
    """The it-th item: both streams' Q tiles into Q buffer pair it mod QB once both consumers
    are done with it, then per key tile both K tiles and the V tile into ring slot (t + j) mod
    NBUF once both consumers have released it. Returns the item's key tiles."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    NBUF: gl.constexpr = v_bufs.type.shape[0]
    bh, m_start, q_row, k_row, v_row = _item(item, S_q, S_kv, num_m_blocks, q_desc.block_type.shape[0])
    n_tiles = S_kv // BLOCK_N
    qb = it % QB
    if QB > 1:
        mbarrier.wait(q_empty.index(qb), ((it // QB) & 1) ^ 1)
    mbarrier.expect(q_ready.index(qb), 2 * q_desc.block_type.nbytes)
    for s in gl.static_range(2):
        tma.async_copy_global_to_shared(q_desc, [q_row + s * S_q, 0], q_ready.index(qb), q_bufs.index(qb * 2 + s))
    for j in range(n_tiles):
        idx = (t + j) % NBUF
        mbarrier.wait(kv_empty.index(idx), (((t + j) // NBUF) & 1) ^ 1)
        mbarrier.expect(k_ready.index(idx), 2 * k_desc.block_type.nbytes)
        for s in gl.static_range(2):
            tma.async_copy_global_to_shared(k_desc, [k_row + s * S_kv + j * BLOCK_N, 0], k_ready.index(idx),
                                            k_bufs.index(idx * 2 + s))
        mbarrier.expect(v_ready.index(idx), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [v_row + j * BLOCK_N, 0], v_ready.index(idx), v_bufs.index(idx))
    return n_tiles


@gluon.jit
def _consumer(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, c_buf, q_ready, q_empty, k_ready, v_ready, kv_empty,
              turns, o_ready, o_free, o_ptr, lam, qk_scale, S_q, S_kv, num_m_blocks, n_items,
              WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Stream WG's warp group: each of the CTA's items (_consume_item)."""
    t = 0
    it = 0
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        t += _consume_item(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, c_buf, q_ready, q_empty, k_ready, v_ready,
                           kv_empty, turns, o_ready, o_free, o_ptr, lam, qk_scale, S_q, S_kv, num_m_blocks, item,
                           t, it, WG, PINGPONG)
        it += 1


@gluon.jit
def _consume_item(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, c_buf, q_ready, q_empty, k_ready, v_ready,
                  kv_empty, turns, o_ready, o_free, o_ptr, lam, qk_scale, S_q, S_kv, num_m_blocks, item, t, it,
                  WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Stream WG of the it-th item: O_WG = softmax(Q_WG·K_WGᵀ·s)·V over its 64 rows (the vanilla
    consumer's loop, exp2 with s·log₂e folded), then the exchange: stream 1 hands O₁/l₁ over in
    shared memory, stream 0 stores O₀/l₀ − λ·O₁/l₁. Returns the item's key tiles."""
    QB: gl.constexpr = q_bufs.type.shape[0] // 2
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    DV: gl.constexpr = v_desc.block_type.shape[1]
    NBUF: gl.constexpr = v_bufs.type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DV, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    zero_s = gl.zeros([BM, BLOCK_N], gl.float32, s_layout)
    bh, m_start, q_row, k_row, v_row = _item(item, S_q, S_kv, num_m_blocks, BM)
    n_tiles = S_kv // BLOCK_N
    qb = it % QB
    q = q_bufs.index(qb * 2 + WG)
    mbarrier.wait(q_ready.index(qb), (it // QB) & 1)
    acc = gl.zeros([BM, DV], gl.float32, o_layout)

    mbarrier.wait(k_ready.index(t % NBUF), (t // NBUF) & 1)
    _take_turn(turns, t + it, WG, PINGPONG)
    s = warpgroup_mma(q, k_bufs.index((t % NBUF) * 2 + WG).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    _pass_turn(turns, WG, PINGPONG)
    s = warpgroup_mma_wait(0, deps=(s, ))
    m = gl.max(s, axis=1) * qk_scale
    p = gl.exp2(s * qk_scale - gl.expand_dims(m, 1))
    l_sum = gl.sum(p, axis=1)
    p = p.to(gl.bfloat16)
    for j in range(1, n_tiles):
        idx = (t + j) % NBUF
        prev = (t + j - 1) % NBUF
        mbarrier.wait(k_ready.index(idx), ((t + j) // NBUF) & 1)
        mbarrier.wait(v_ready.index(prev), ((t + j - 1) // NBUF) & 1)
        p_op = gl.convert_layout(p, p_layout)
        _take_turn(turns, t + it + j, WG, PINGPONG)
        s_next = warpgroup_mma(q, k_bufs.index(idx * 2 + WG).permute((1, 0)), zero_s, use_acc=False, is_async=True)
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
    if QB > 1:
        mbarrier.arrive(q_empty.index(qb), count=1)  # every Q·Kᵀ of this item has completed
    last = (t + n_tiles - 1) % NBUF
    mbarrier.wait(v_ready.index(last), ((t + n_tiles - 1) // NBUF) & 1)
    p_op = gl.convert_layout(p, p_layout)
    _take_turn(turns, t + it + n_tiles, WG, PINGPONG)
    acc = warpgroup_mma(p_op, v_bufs.index(last), acc, is_async=True)
    _pass_turn(turns, WG, PINGPONG)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    mbarrier.arrive(kv_empty.index(last), count=1)

    out = acc * gl.expand_dims(gl.convert_layout(1.0 / l_sum, o_rows), 1)
    if WG == 1:
        mbarrier.wait(o_free.index(0), (it & 1) ^ 1)  # stream 0 has read the previous item's
        c_buf.store(out)
        mbarrier.arrive(o_ready.index(0), count=1)
    else:
        mbarrier.wait(o_ready.index(0), it & 1)
        other = c_buf.load(o_layout)
        mbarrier.arrive(o_free.index(0), count=1)
        out = out - lam * other
        out_rows = m_start + gl.arange(0, BM, layout=o_rows)
        out_cols = gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))
        offs = gl.expand_dims((bh * S_q + out_rows).to(gl.int64), 1) * DV + gl.expand_dims(out_cols, 0)
        gl.store(o_ptr + offs, out.to(o_ptr.dtype.element_ty), mask=gl.expand_dims(out_rows < S_q, 1))
    return n_tiles


@gluon.jit
def _consumer0(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, c_buf, q_ready, q_empty, k_ready, v_ready, kv_empty,
               turns, o_ready, o_free, o_ptr, lam, qk_scale, S_q, S_kv, num_m_blocks, n_items,
               PINGPONG: gl.constexpr):
    _consumer(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, c_buf, q_ready, q_empty, k_ready, v_ready, kv_empty,
              turns, o_ready, o_free, o_ptr, lam, qk_scale, S_q, S_kv, num_m_blocks, n_items, 0, PINGPONG)


@gluon.jit
def _consumer1(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, c_buf, q_ready, q_empty, k_ready, v_ready, kv_empty,
               turns, o_ready, o_free, o_ptr, lam, qk_scale, S_q, S_kv, num_m_blocks, n_items,
               PINGPONG: gl.constexpr):
    _consumer(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, c_buf, q_ready, q_empty, k_ready, v_ready, kv_empty,
              turns, o_ready, o_free, o_ptr, lam, qk_scale, S_q, S_kv, num_m_blocks, n_items, 1, PINGPONG)


@gluon.jit
def _diff_attention_ws(q_desc, k_desc, v_desc, o_ptr, lam, qk_scale, S_q, S_kv, num_m_blocks, n_items,
                       NBUF: gl.constexpr, QB: gl.constexpr, CONSUMER_REGS: gl.constexpr, PINGPONG: gl.constexpr):
    """Each CTA walks items (head pair, 64 rows) from its program id by the grid's size."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    DV: gl.constexpr = v_desc.block_type.shape[1]
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [QB * 2, BM, D], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [NBUF * 2, BLOCK_N, D], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [NBUF, BLOCK_N, DV], v_desc.layout)
    c_buf = gl.allocate_shared_memory(gl.float32, [BM, DV], gl.SwizzledSharedLayout(4, 1, 8, order=[1, 0]))
    q_ready = gl.allocate_shared_memory(gl.int64, [QB, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [QB, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    o_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    o_free = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(QB):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=2)
    for i in gl.static_range(NBUF):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(turns.index(i), count=1)
    mbarrier.init(o_ready.index(0), count=1)
    mbarrier.init(o_free.index(0), count=1)
    args = (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, c_buf, q_ready, q_empty, k_ready, v_ready, kv_empty,
            turns, o_ready, o_free, o_ptr, lam, qk_scale, S_q, S_kv, num_m_blocks, n_items, PINGPONG)
    gl.warp_specialize([(_consumer0, args), (_consumer1, args), (_loader, args)], [4, 1], [CONSUMER_REGS, 24])


def _descriptors(q, k, v, block_n):
    D, DV = q.shape[-1], v.shape[-1]
    get = gl.NVMMASharedLayout.get_default_for
    return (TensorDescriptor.from_tensor(q.reshape(-1, D), [ROWS_PER_CONSUMER, D], get([ROWS_PER_CONSUMER, D], gl.bfloat16)),
            TensorDescriptor.from_tensor(k.reshape(-1, D), [block_n, D], get([block_n, D], gl.bfloat16)),
            TensorDescriptor.from_tensor(v.reshape(-1, DV), [block_n, DV], get([block_n, DV], gl.bfloat16)))


def diff_attention_gluon(q, k, v, lam: float, out, block_n: int, nbuf: int, pingpong=False, persistent=False,
                         max_ctas: int | None = None):
    """``out`` = differential attention of contiguous bf16 q, k ``[B, 2H, S, D]`` and v ``[B, H, N, Dv]``
    (S a multiple of 64, N of ``block_n``), as ``fxflash.variants.diff_attention`` computes it;
    ``persistent``: one CTA per SM (at most ``max_ctas``) walks the items."""
    B, H2, S, D = q.shape
    N = k.shape[2]
    if not all(t.is_contiguous() and t.dtype == torch.bfloat16 for t in (q, k, v, out)):
        raise ValueError("probe needs contiguous bf16 tensors")
    if S % ROWS_PER_CONSUMER or N % block_n:
        raise ValueError(f"probe needs S % {ROWS_PER_CONSUMER} == 0 and N % {block_n} == 0")
    maxnreg, regs = register_budget(STREAMS)
    num_m_blocks = S // ROWS_PER_CONSUMER
    n_items = num_m_blocks * B * (H2 // 2)
    sms = max_ctas or torch.cuda.get_device_properties(q.device).multi_processor_count
    grid = (min(n_items, sms) if persistent else n_items, )
    _diff_attention_ws[grid](*_descriptors(q, k, v, block_n), out, lam, LOG2E / D ** 0.5, S, N, num_m_blocks, n_items,
                             NBUF=nbuf, QB=2 if persistent else 1, CONSUMER_REGS=regs, PINGPONG=pingpong,
                             num_warps=4, maxnreg=maxnreg)
    return out


def parse_config(text: str) -> tuple:
    """``BLOCK_N x NBUF`` then ``p`` (ping-pong) and/or ``P`` (persistent): ``128x2pP``."""
    flags = text[len(text.rstrip("pP")):]
    block_n, nbuf = (int(x) for x in text.rstrip("pP").split("x"))
    return block_n, nbuf, "p" in flags, "P" in flags


def compile_only(d: int, configs) -> None:
    """Compile each config for sm_90 without a GPU; print its shared memory and ptxas's spills."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
    from gluon_compile import spills

    get = gl.NVMMASharedLayout.get_default_for
    desc = lambda rows, cols: f"tensordesc<bf16[{rows}, {cols}],{get([rows, cols], gl.bfloat16)!r}>"
    maxnreg, regs = register_budget(STREAMS)
    for block_n, nbuf, pingpong, persistent in configs:
        signature = {"q_desc": desc(ROWS_PER_CONSUMER, d), "k_desc": desc(block_n, d), "v_desc": desc(block_n, 2 * d),
                     "o_ptr": "*bf16", "lam": "fp32", "qk_scale": "fp32", "S_q": "i32", "S_kv": "i32",
                     "num_m_blocks": "i32", "n_items": "i32"}
        constexprs = dict(NBUF=nbuf, QB=2 if persistent else 1, CONSUMER_REGS=regs, PINGPONG=pingpong)
        signature.update({name: "constexpr" for name in constexprs})
        compiled = triton.compile(GluonASTSource(_diff_attention_ws, signature, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": maxnreg})
        print(f"d{d} {block_n}x{nbuf}{'p' if pingpong else ''}{'P' if persistent else ''}: shared "
              f"{compiled.metadata.shared} bytes, {regs} registers per consumer thread; {spills(compiled.asm['ptx'])}",
              flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", nargs="*", type=int, default=[512, 1024, 16384])
    parser.add_argument("--head-dim", type=int, default=64, choices=[64, 128])
    parser.add_argument("--configs", nargs="*", type=parse_config, default=[parse_config(c) for c in CONFIGS])
    parser.add_argument("--compile-only", action="store_true", help="compile each config for sm_90 (no GPU)")
    opts = parser.parse_args()
    if opts.compile_only:
        return compile_only(opts.head_dim, opts.configs)

    import fxflash
    from bench_attention import medians
    from tile_sweep import case_of

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}", flush=True)
    for S in opts.seqlens:
        fields, fn, (q, k, v), flops = case_of(argparse.Namespace(variant="diff_attention", batch=max(1, 16384 // S),
                                                                   head_dim=opts.head_dim, seqlen=S, gqa=False))
        print("diff_attention", fields, flush=True)
        fast = fxflash.optimize(fn)
        torch._dynamo.reset()  # a fresh compilation per shape, static as the suite's (not recompiled dynamic)
        compiled = torch.compile(fn, dynamic=False)
        reference = fast(q, k, v).float()
        times = {}

        def report(label, call, result=None):
            out = call()
            out = out if result is None else result
            diff = ((out.float() - reference).norm() / reference.norm()).item()
            ms, graph = medians(call)
            times[label] = ms
            ratio = f"  {times['torch_compile'] / ms:.2f}x torch.compile" if "torch_compile" in times else ""
            print(f"S={S} {label:<16} {ms:.4f} ms (graph {graph:.4f}) {flops / ms / 1e9:.0f} TFLOP/s "
                  f"rel diff to fxflash {diff:.1e}{ratio}", flush=True)

        report("torch_compile", lambda: compiled(q, k, v))
        report("fxflash", lambda: fast(q, k, v))
        for block_n, nbuf, pingpong, persistent in opts.configs:
            label = f"gluon {block_n}x{nbuf}{'p' if pingpong else ''}{'P' if persistent else ''}"
            out = torch.full((*v.shape[:2], q.shape[2], v.shape[-1]), float("nan"), dtype=v.dtype, device=v.device)
            try:
                report(label, lambda: diff_attention_gluon(q, k, v, 0.5, out, block_n, nbuf, pingpong, persistent), out)
            except Exception as exc:  # noqa: BLE001 - a config the compiler refuses is a result
                print(f"S={S} {label:<16} {type(exc).__name__}: {str(exc)[:400]}", flush=True)


if __name__ == "__main__":
    main()
