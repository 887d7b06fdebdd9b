"""Probe: does FlashAttention-3's warp-specialized structure, written in Gluon, beat cuDNN?

    PYTHONPATH=. python benchmarks/probes/probe_gluon.py [--variants vanilla causal alibi alibi_cols]
        [--seqlens 1024 4096 16384] [--head-dim 64] [--kv-heads 16] [--configs 3x128x3 3x128x3p ...]

The 2026-11-23 profile put vanilla attention's remaining gap to cuDNN (torch.compile and
SDPA call it) on the overlap of the exponentials with the tensor cores, which cuDNN gets from
FlashAttention-3's producer/consumer warp groups and which Triton's ``tl`` level cannot
express (benchmarks/NOTES.md, 2026-11-22 and 2026-11-23). This probe writes that structure by
hand in Gluon (``triton.experimental.gluon``, Triton's layout-explicit level, shipped with
Triton 3.6) for the forward pass (bf16, contiguous [B, H, S, D], head dim 64 or 128, MHA or
GQA (K and V [B, Hkv, N, D]), S a multiple of
64 and N of the key tile) and times it beside SDPA, FlexAttention's kernel (and its
``create_block_mask``) and fxflash in one process, before any code generation is built on it:

- one *loader* warp issues TMA copies of the CTA's Q tiles and of each K and V tile into a ring
  of ``NBUF`` shared-memory buffers (``mbarrier`` ready/empty pairs; a K/V buffer is free once
  every consumer has finished its P·V);
- ``CONSUMERS`` warp groups of 4 warps each own a 64-row Q tile (the CTA covers
  64·CONSUMERS rows) and share every K/V tile; registers are moved from the loader to them
  (``setmaxnreg`` through ``warp_specialize``'s register counts);
- inside each consumer, the scores of key tile j+1 (``wgmma``, asynchronous) are issued before
  the P·V of tile j, and the softmax of tile j+1 runs while that P·V does (FA3's
  intra-warpgroup overlap): ``S_{j+1} = Q·K_{j+1}ᵀ``; ``O += P_j·V_j``; wait for S; online
  softmax of S (running maximum in exp2 units); wait for O; rescale O;
- with ping-pong (``p``), consumer c issues its wgmmas only after consumer c−1 has issued its
  own (an mbarrier per consumer), so their matrix products take turns;
- with a persistent grid (``P``), one CTA per SM walks the work items (query head, row block);
  the loader fills a second Q buffer for the next item while the consumers finish one.

The score step (``_score``) is vanilla, causal (the diagonal tiles masked, heavy row blocks
first, keys up to the CTA's last row), ALiBi (``slope·(j − i)``, slopes ``2^(−8h/H)``) or ALiBi
without its row term. Configs are ``CONSUMERS x BLOCK_N x NBUF[p][P]``. Prints, per system, the
relative difference to Flex's output and the ``settled_ms`` and CUDA-graph replay medians.
Needs a Hopper GPU and Triton 3.6's Gluon API (the lent GPU machine's; Triton 3.9 renamed
``tma.async_copy_global_to_shared`` to ``async_load``, among others). The kernel compiles
without a GPU (``triton.compile(GluonASTSource(...), target=GPUTarget("cuda", 90, 32))``),
which is how configs were checked for spills before device runs;
``tests/test_gpu.py::test_gluon_probe_computes_attention`` checks its results on the GPU.
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

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
# the generated Gluon kernel's row block and register split are this probe's (fxflash/codegen/gluon.py)
from fxflash.codegen.gluon_plan import ROWS_PER_CONSUMER, register_budget  # noqa: E402
from fxflash.patterns.rules import LOG2E as _LOG2E  # noqa: E402

LOG2E: gl.constexpr = gl.constexpr(_LOG2E)
SCORES = {"vanilla": 0, "causal": 1, "alibi": 2, "alibi_cols": 3}  # what _score does to Q·Kᵀ
CAUSAL: gl.constexpr = gl.constexpr(SCORES["causal"])
ALIBI: gl.constexpr = gl.constexpr(SCORES["alibi"])
ALIBI_COLS: gl.constexpr = gl.constexpr(SCORES["alibi_cols"])
CONFIGS = ("2x128x3", "3x128x2", "3x128x3", "3x128x3p")


@gluon.jit
def _item(item, S_q, S_kv, heads, kv_heads, num_m_blocks, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
          SCORE: gl.constexpr):
    """Work item → (query head bh, first row m_start in the head, key tiles n_tiles, Q's first
    row and K/V's first row in the [B·H·S, D] views). Causal: heavy row blocks first, keys up to
    the block's last row."""
    bh = item // num_m_blocks
    if SCORE == CAUSAL:
        m_start = (num_m_blocks - 1 - item % num_m_blocks) * ROWS
        n_tiles = gl.cdiv(gl.minimum(m_start + ROWS, S_kv), BLOCK_N)
    else:
        m_start = (item % num_m_blocks) * ROWS
        n_tiles = S_kv // BLOCK_N
    kv_head = (bh // heads) * kv_heads + (bh % heads) // (heads // kv_heads)  # GQA: shared K/V head
    return bh, m_start, n_tiles, bh * S_q + m_start, kv_head * S_kv


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns,
            o_ptr, qk_scale, S_q, S_kv, heads, kv_heads, num_m_blocks, n_items,
            PINGPONG: gl.constexpr, SCORE: gl.constexpr):
    """One warp: the loads of each of the CTA's items (_load_item)."""
    CONSUMERS: gl.constexpr = turns.type.shape[0]
    QB: gl.constexpr = q_bufs.type.shape[0] // CONSUMERS
    if QB == 1:  # one item per CTA: no item loop, the single item's code as a plain kernel's
        _load_item(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
                   S_q, S_kv, heads, kv_heads, num_m_blocks, gl.program_id(0), 0, 0, CONSUMERS, SCORE)
    else:
        t = 0
        it = 0
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            t += _load_item(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready,
                            kv_empty, S_q, S_kv, heads, kv_heads, num_m_blocks, item, t, it, CONSUMERS, SCORE)
            it += 1


@gluon.jit
def _load_item(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
               S_q, S_kv, heads, kv_heads, num_m_blocks, item, t, it, CONSUMERS: gl.constexpr, SCORE: gl.constexpr):
    """The CTA's it-th item: its Q tiles into Q buffer it mod QB once the consumers are done
    with that buffer's previous item, then K_j and V_j into ring buffer (t + j) mod NBUF when
    it is free (t: the key tiles of the CTA's earlier items). Returns the item's key tiles."""
    QB: gl.constexpr = q_bufs.type.shape[0] // CONSUMERS  # items whose Q tiles fit at once
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    NBUF: gl.constexpr = k_bufs.type.shape[0]
    bh, m_start, n_tiles, q_row, kv_row = _item(item, S_q, S_kv, heads, kv_heads, num_m_blocks,
                                               CONSUMERS * BM, BLOCK_N, SCORE)
    qb = it % QB
    # A fresh mbarrier counts as having completed the phase before 0: the first waits pass.
    mbarrier.wait(q_empty.index(qb), ((it // QB) & 1) ^ 1)
    mbarrier.expect(q_ready.index(qb), CONSUMERS * q_desc.block_type.nbytes)
    for c in gl.static_range(CONSUMERS):
        tma.async_copy_global_to_shared(q_desc, [q_row + c * BM, 0], q_ready.index(qb),
                                        q_bufs.index(qb * CONSUMERS + c))
    for j in range(n_tiles):
        idx = (t + j) % NBUF
        mbarrier.wait(kv_empty.index(idx), (((t + j) // NBUF) & 1) ^ 1)
        mbarrier.expect(k_ready.index(idx), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, 0], k_ready.index(idx), k_bufs.index(idx))
        mbarrier.expect(v_ready.index(idx), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, 0], v_ready.index(idx), v_bufs.index(idx))
    return n_tiles


@gluon.jit
def _consumer(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns,
              o_ptr, qk_scale, S_q, S_kv, heads, kv_heads, num_m_blocks, n_items,
              WG: gl.constexpr, PINGPONG: gl.constexpr, SCORE: gl.constexpr):
    """One warp group: each of the CTA's items (_consume_item)."""
    CONSUMERS: gl.constexpr = turns.type.shape[0]
    QB: gl.constexpr = q_bufs.type.shape[0] // CONSUMERS
    if QB == 1:  # one item per CTA (see _loader)
        _consume_item(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
                      turns, o_ptr, qk_scale, S_q, S_kv, heads, kv_heads, num_m_blocks, gl.program_id(0), 0, 0,
                      WG, PINGPONG, SCORE)
    else:
        t = 0
        it = 0
        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
            t += _consume_item(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready,
                               kv_empty, turns, o_ptr, qk_scale, S_q, S_kv, heads, kv_heads, num_m_blocks, item, t,
                               it, WG, PINGPONG, SCORE)
            it += 1


@gluon.jit
def _consume_item(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns,
                  o_ptr, qk_scale, S_q, S_kv, heads, kv_heads, num_m_blocks, item, t, it,
                  WG: gl.constexpr, PINGPONG: gl.constexpr, SCORE: gl.constexpr):
    """The CTA's it-th item for one warp group: softmax(score(Q_WG·Kᵀ))·V for its 64 rows,
    written to ``o_ptr`` (rows before ``S_q`` only: the CTA's last consumers may hold rows of
    the next head). Ring buffer (t + j) mod NBUF and ping-pong turn t + it + j count over the
    CTA's items. Returns the item's key tiles."""
    CONSUMERS: gl.constexpr = turns.type.shape[0]
    QB: gl.constexpr = q_bufs.type.shape[0] // CONSUMERS  # items whose Q tiles fit at once
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    NBUF: gl.constexpr = k_bufs.type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    zero_s = gl.zeros([BM, BLOCK_N], gl.float32, s_layout)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    out_cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    bh, m_start, n_tiles, q_row, kv_row = _item(item, S_q, S_kv, heads, kv_heads, num_m_blocks,
                                               CONSUMERS * BM, BLOCK_N, SCORE)
    row0 = m_start + WG * BM  # first row of this warp group within its head
    rows = row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
    if SCORE == ALIBI or SCORE == ALIBI_COLS:
        c = 1.0  # the scale is applied with the bias, before the maximum
        slope2 = gl.exp2(-8.0 * ((bh % heads) + 1).to(gl.float32) / heads) * LOG2E
    else:
        c = qk_scale  # positive: folded past the maximum into the exponent's multiply-add
        slope2 = 0.0
    qb = it % QB
    q = q_bufs.index(qb * CONSUMERS + WG)
    mbarrier.wait(q_ready.index(qb), (it // QB) & 1)
    acc = gl.zeros([BM, D], gl.float32, o_layout)

    mbarrier.wait(k_ready.index(t % NBUF), (t // NBUF) & 1)
    _take_turn(turns, t + it, WG, PINGPONG)
    s = warpgroup_mma(q, k_bufs.index(t % NBUF).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    _pass_turn(turns, WG, PINGPONG)
    s = warpgroup_mma_wait(0, deps=(s, ))
    s = _score(s, 0, row0, rows, cols, qk_scale, slope2, SCORE)
    m = gl.max(s, axis=1) * c
    p = gl.exp2(s * c - gl.expand_dims(m, 1))
    l_sum = gl.sum(p, axis=1)
    p = p.to(gl.bfloat16)  # P lives in 16 bits between tiles: fewer registers under the overlap
    for j in range(1, n_tiles):
        idx = (t + j) % NBUF
        prev = (t + j - 1) % NBUF
        mbarrier.wait(k_ready.index(idx), ((t + j) // NBUF) & 1)
        mbarrier.wait(v_ready.index(prev), ((t + j - 1) // NBUF) & 1)
        p_op = gl.convert_layout(p, p_layout)
        _take_turn(turns, t + it + j, WG, PINGPONG)
        s_next = warpgroup_mma(q, k_bufs.index(idx).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        acc = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=True)
        _pass_turn(turns, WG, PINGPONG)
        s = warpgroup_mma_wait(1, deps=(s_next, ))
        s = _score(s, j * BLOCK_N, row0, rows, cols, qk_scale, slope2, SCORE)
        m_new = gl.maximum(m, gl.max(s, axis=1) * c)
        alpha = gl.exp2(m - m_new)
        p = gl.exp2(s * c - gl.expand_dims(m_new, 1))
        l_sum = l_sum * alpha + gl.sum(p, axis=1)
        p = p.to(gl.bfloat16)
        m = m_new
        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
        mbarrier.arrive(kv_empty.index(prev), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
    mbarrier.arrive(q_empty.index(qb), count=1)  # every Q·Kᵀ of this item has completed
    last = (t + n_tiles - 1) % NBUF
    mbarrier.wait(v_ready.index(last), ((t + n_tiles - 1) // NBUF) & 1)
    p_op = gl.convert_layout(p, p_layout)
    _take_turn(turns, t + it + n_tiles, WG, PINGPONG)
    acc = warpgroup_mma(p_op, v_bufs.index(last), acc, is_async=True)
    _pass_turn(turns, WG, PINGPONG)
    acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
    mbarrier.arrive(kv_empty.index(last), count=1)

    out = acc / gl.expand_dims(gl.convert_layout(l_sum, o_rows), 1)
    out_rows = row0 + gl.arange(0, BM, layout=o_rows)
    offs = gl.expand_dims((bh * S_q + out_rows).to(gl.int64), 1) * D + gl.expand_dims(out_cols, 0)
    gl.store(o_ptr + offs, out.to(o_ptr.dtype.element_ty), mask=gl.expand_dims(out_rows < S_q, 1))
    return n_tiles


@gluon.jit
def _score(s, start_n, row0, rows, cols, qk_scale, slope2, SCORE: gl.constexpr):
    """The score tile the softmax sees: raw Q·Kᵀ (vanilla; the scale is folded later), masked
    above the diagonal on the tiles that cross it (causal), or ``Q·Kᵀ·c + slope·log₂e·(j − i)``
    (ALiBi, in exp2 units; ``alibi_cols`` drops the row's own term ``−slope·i``)."""
    if SCORE == CAUSAL:
        BLOCK_N: gl.constexpr = s.shape[1]
        if start_n + BLOCK_N - 1 > row0:
            keep = gl.expand_dims(start_n + cols, 0) <= gl.expand_dims(rows, 1)
            s = gl.where(keep, s, float("-inf"))
    elif SCORE == ALIBI:
        dist = (gl.expand_dims(start_n + cols, 0) - gl.expand_dims(rows, 1)).to(gl.float32)
        s = s * qk_scale + slope2 * dist
    elif SCORE == ALIBI_COLS:
        # softmax is unchanged by a term that depends on the row only: slope·(j − i) → slope·j,
        # one multiply-add per score with a per-column vector (values grow with j: |t| ≤ slope·N)
        s = s * qk_scale + gl.expand_dims(slope2 * (start_n + cols).to(gl.float32), 0)
    return s


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


# One wrapper per consumer: warp_specialize passes its workers run-time values only (Triton 3.6
# refuses a Python int among them), and a consumer's index must be a compile-time constant.
@gluon.jit
def _consumer0(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns,
               o_ptr, qk_scale, S_q, S_kv, heads, kv_heads, num_m_blocks, n_items,
               PINGPONG: gl.constexpr, SCORE: gl.constexpr):
    _consumer(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns,
              o_ptr, qk_scale, S_q, S_kv, heads, kv_heads, num_m_blocks, n_items, 0, PINGPONG, SCORE)


@gluon.jit
def _consumer1(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns,
               o_ptr, qk_scale, S_q, S_kv, heads, kv_heads, num_m_blocks, n_items,
               PINGPONG: gl.constexpr, SCORE: gl.constexpr):
    _consumer(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns,
              o_ptr, qk_scale, S_q, S_kv, heads, kv_heads, num_m_blocks, n_items, 1, PINGPONG, SCORE)


@gluon.jit
def _consumer2(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns,
               o_ptr, qk_scale, S_q, S_kv, heads, kv_heads, num_m_blocks, n_items,
               PINGPONG: gl.constexpr, SCORE: gl.constexpr):
    _consumer(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns,
              o_ptr, qk_scale, S_q, S_kv, heads, kv_heads, num_m_blocks, n_items, 2, PINGPONG, SCORE)


@gluon.jit
def _attention_ws(q_desc, k_desc, v_desc, o_ptr, S_q, S_kv, heads, kv_heads, qk_scale, num_m_blocks, n_items,
                  CONSUMERS: gl.constexpr, NBUF: gl.constexpr, QB: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                  PINGPONG: gl.constexpr, SCORE: gl.constexpr):
    """Each CTA walks work items (query head, block of 64·CONSUMERS rows) from its program id
    by the grid's size: one item per CTA with a full grid, several with a persistent one, whose
    loader fills the Q buffers of the next item (QB = 2) while the consumers finish one."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [QB * CONSUMERS, BM, D], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [NBUF, BLOCK_N, D], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [NBUF, BLOCK_N, D], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [QB, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [QB, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(QB):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=CONSUMERS)
    for i in gl.static_range(NBUF):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=CONSUMERS)
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(turns.index(i), count=1)

    args = (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns,
            o_ptr, qk_scale, S_q, S_kv, heads, kv_heads, num_m_blocks, n_items, PINGPONG, SCORE)
    if CONSUMERS == 2:
        gl.warp_specialize([(_consumer0, args), (_consumer1, args), (_loader, args)],
                           [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([(_consumer0, args), (_consumer1, args), (_consumer2, args), (_loader, args)],
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


def gluon_attention(q, k, v, out, consumers: int, block_n: int, nbuf: int, pingpong: bool = False,
                    persistent: bool = False, score: str = "vanilla", max_ctas: int | None = None):
    """``out`` = softmax(score(q·kᵀ/√D))·v for bf16 [B, H, S, D] tensors, ``score`` one of
    SCORES (ALiBi's slopes are ``2^(−8h/H)``, h = 1…H, as ``fxflash.variants.alibi``);
    ``persistent``: one CTA per SM (at most ``max_ctas``) walks the work items instead of one
    CTA per item."""
    B, H, S, D = q.shape
    if not all(t.is_contiguous() and t.dtype == torch.bfloat16 for t in (q, k, v, out)):
        raise ValueError("probe needs contiguous bf16 [B, H, S, D] tensors")
    if S % ROWS_PER_CONSUMER or k.shape[2] % block_n or (score == "causal" and k.shape[2] != S) or H % k.shape[1]:
        raise ValueError(f"probe needs S % {ROWS_PER_CONSUMER} == 0, N % {block_n} == 0, H a multiple of "
                         "K's heads (and N == S if causal)")
    q_desc, k_desc, v_desc = descriptors(q, k, v, block_n)
    maxnreg, regs = register_budget(consumers)
    num_m_blocks = triton.cdiv(S, consumers * ROWS_PER_CONSUMER)
    n_items = num_m_blocks * B * H
    ctas = max_ctas or torch.cuda.get_device_properties(q.device).multi_processor_count
    grid = (min(n_items, ctas) if persistent else n_items, )
    _attention_ws[grid](q_desc, k_desc, v_desc, out, S, k.shape[2], H, k.shape[1], LOG2E.value / math.sqrt(D),
                        num_m_blocks, n_items, CONSUMERS=consumers, NBUF=nbuf, QB=2 if persistent else 1,
                        CONSUMER_REGS=regs,
                        PINGPONG=pingpong, SCORE=SCORES[score], num_warps=4, maxnreg=maxnreg)
    return out


def parse_config(text: str) -> tuple[int, int, int, bool, bool]:
    """``CONSUMERS x BLOCK_N x NBUF``, then ``p`` for ping-pong and/or ``P`` for a persistent
    grid: ``2x128x3p``, ``3x128x3P``."""
    flags = text[len(text.rstrip("pP")):]
    consumers, block_n, nbuf = (int(x) for x in text.rstrip("pP").split("x"))
    if consumers not in (2, 3):
        raise argparse.ArgumentTypeError("CONSUMERS must be 2 or 3")
    return consumers, block_n, nbuf, "p" in flags, "P" in flags


def main():
    from bench_attention import case, flex_api, medians, softmax_calls

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="*", default=list(SCORES), choices=list(SCORES))
    parser.add_argument("--seqlens", nargs="*", type=int, default=[1024, 4096, 16384])
    parser.add_argument("--head-dim", type=int, default=64, choices=[64, 128])
    parser.add_argument("--kv-heads", type=int, default=16, help="16: MHA; 2: GQA as in the suite")
    parser.add_argument("--configs", nargs="*", type=parse_config, default=[parse_config(c) for c in CONFIGS])
    opts = parser.parse_args()
    H, Hkv, D = 16, opts.kv_heads, opts.head_dim
    flex, create_block_mask = flex_api()
    torch._dynamo.config.recompile_limit = 64  # Flex is compiled per (variant, shape): 9 cases by default
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; "
          f"{H} heads, {Hkv} KV heads, head dim {D}, bf16, 16k tokens", flush=True)
    for variant in opts.variants:
        for S in opts.seqlens:
            B = max(1, 16384 // S)
            case_name = variant.removesuffix("_cols")
            calls = softmax_calls(case_name, B, H, Hkv, S, D, "cuda", torch.bfloat16, flex, create_block_mask)
            reference = calls["flex_kernel"]().float()
            q, k, v = case(case_name, B, H, Hkv, S, D, "cuda", torch.bfloat16)[1]  # the same seeded inputs
            flops = 4 * B * H * S * S * D * (0.5 if variant == "causal" else 1)

            def report(label, call, result=None):
                out = call()
                if result is not None:  # a call that writes into a buffer
                    out = result
                diff = ((out.float() - reference).norm() / reference.norm()).item()
                ms, graph = medians(call)
                print(f"{variant} S={S} {label:<18} {ms:.3f} ms (graph {graph:.3f}) {flops / ms / 1e9:.0f} TFLOP/s "
                      f"rel diff to Flex {diff:.1e}", flush=True)

            for system in ("sdpa", "flex_kernel", "fxflash"):
                if system in calls:
                    report(system, calls[system])
            if "flex_blockmask" in calls:
                ms = medians(calls["flex_blockmask"])[0]
                print(f"{variant} S={S} {'flex_blockmask':<18} {ms:.3f} ms (create_block_mask)", flush=True)
            for consumers, block_n, nbuf, pingpong, persistent in opts.configs:
                label = f"gluon {consumers}x{block_n}x{nbuf}{'p' if pingpong else ''}{'P' if persistent else ''}"
                out = torch.full_like(q, float("nan"))
                try:
                    report(label, lambda: gluon_attention(q, k, v, out, consumers, block_n, nbuf, pingpong, persistent,
                                                          variant), out)
                except Exception as exc:  # noqa: BLE001 - a config the compiler refuses is a result
                    print(f"{variant} S={S} {label:<18} {type(exc).__name__}: {str(exc)[:400]}", flush=True)


if __name__ == "__main__":
    sys.path[:0] = [os.path.dirname(__file__), os.path.join(os.path.dirname(__file__), "..")]
    main()
