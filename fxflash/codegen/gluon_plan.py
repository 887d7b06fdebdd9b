"""The Gluon kernel's configurations and plan, plain data: what the launch, the tuner and the
Gluon printer (gluon.py) share. A configuration ("gluon", consumers, key tile, K/V buffers,
ping-pong, CTAs per SM[, persistent, streams, rows per consumer]) and the shared-memory and
register budgets it must fit; ``GluonPlan``, the printed kernel's source and argument map."""
from __future__ import annotations

import dataclasses
import typing

from ..config import KernelOptions
from .plan import reindexed

ROWS_PER_CONSUMER = 64      # one wgmma M extent: 4 warps × 16 rows (a consumer may own two: GluonTile)
SHARED_BYTES = 227 * 1024   # Hopper's shared memory per CTA
SM_SHARED_BYTES = 228 * 1024  # … and per SM, of which each resident CTA's first 1 KB is the system's
CTA_RESERVED_BYTES = 1024
BARRIER_BYTES = 768  # a kernel's mbarriers and alignment beyond its buffers (tests/gluon_compile.py: 492–664)

# Gluon configurations ("gluon", consumers, key tile, K/V buffers, ping-pong, CTAs per SM), by
# head dim, fastest first as measured with the hand-written probe on an H200 (benchmarks/NOTES.md,
# 2026-11-23: 3 consumers of 64 rows with 128-key tiles and 3 buffers; ping-pong for
# ALiBi; 2 consumers at head dim 128, where 3 do not fit in shared memory). One consumer with
# registers and shared memory for two CTAs per SM: one CTA's Q load and epilogue overlap the
# other's key loop (short rows, 2026-11-23).
GLUON_CONFIGS = {
    64: (("gluon", 3, 128, 3, 0, 1), ("gluon", 3, 128, 3, 1, 1), ("gluon", 2, 128, 3, 0, 1),
         ("gluon", 1, 128, 3, 0, 2)),
    128: (("gluon", 2, 128, 3, 0, 1), ("gluon", 2, 128, 2, 0, 1), ("gluon", 2, 64, 3, 0, 1),
          ("gluon", 1, 64, 3, 0, 2)),
}
# Persistent configurations (the last field): fewer CTAs walk the work items, one item's loads
# under the previous one's epilogue; regions without tile masks only (GluonPlan.dense). Timed by
# the tuner on short rows (gluon_launch.GLUON_MIN_KEYS), where they beat the Triton kernel on the
# H200: vanilla at 1k keys 0.176–0.181 ms against 0.188, the Evoformer's 256 keys 0.841 against 0.892.
# One consumer with two K/V buffers leaves room, two CTAs per SM, for a ring of TMA-read score
# tiles (the Evoformer's pair bias: 0.780 ms at B=8 with it, the only such configuration that fits;
# at head dim 128 with 64-key tiles, 1.360 ms against the Triton kernel's 1.616: 2026-11-24).
# Three consumers with ping-pong: vanilla at 1k keys 0.165 ms replayed against 0.171 without.
# One consumer of 128 rows (two wgmma row blocks through each K/V tile) with 64-key tiles, two CTAs
# per SM: the Evoformer's 256 keys 0.697 ms against 0.719 for 64 rows with 128-key tiles, both
# with the output stored by TMA (H100, 2026-11-24).
PERSISTENT_CONFIGS = {
    64: (("gluon", 3, 128, 3, 0, 1, 1), ("gluon", 3, 128, 3, 1, 1, 1), ("gluon", 2, 128, 3, 0, 1, 1),
         ("gluon", 1, 128, 3, 0, 2, 1), ("gluon", 1, 128, 2, 0, 2, 1), ("gluon", 1, 64, 2, 0, 2, 1, 1, 128)),
    128: (("gluon", 2, 128, 2, 0, 1, 1), ("gluon", 1, 64, 2, 0, 2, 1)),
}
# Configurations of two-stream regions (differential attention; the last field: two streams, one
# consumer warp group each over the same 64 rows), by the wider head dim, at every row length. As
# timed hand-written (benchmarks/probes/probe_diff_gluon.py, H200, 2026-11-24): with Dv = 128
# the persistent grid with 128-key tiles and two buffers fastest from 512 to 8k keys, ping-pong
# within 3 %, one CTA per item at 16k; with Dv = 256 only 64-key tiles and two buffers, one CTA
# per item, fit shared memory (both streams' K tiles, V's, and stream 1's fp32 output).
STREAM_DV_DIMS = (64, 128, 256)
_STREAM_WIDE_TILES = (("gluon", 2, 128, 2, 0, 1, 1, 2), ("gluon", 2, 128, 2, 1, 1, 1, 2),
                      ("gluon", 2, 128, 2, 0, 1, 0, 2))
STREAM_CONFIGS = {64: _STREAM_WIDE_TILES,
                  128: _STREAM_WIDE_TILES + (("gluon", 2, 64, 2, 0, 1, 1, 2),),  # 64-key tiles fit D = Dv = 128
                  256: (("gluon", 2, 64, 2, 0, 1, 0, 2), ("gluon", 2, 64, 2, 1, 1, 0, 2))}


class GluonTile(typing.NamedTuple):
    """A Gluon configuration's fields (a tile of GLUON_CONFIGS without its "gluon" tag)."""
    consumers: int   # warp groups of ``consumer_rows`` query rows each
    block_n: int     # keys per K/V tile
    nbuf: int        # K/V tiles in flight (shared-memory ring)
    pingpong: int    # consumers take turns issuing their matrix products
    ctas: int        # CTAs per SM the register and shared-memory budgets are split for
    persistent: int = 0  # ``ctas`` CTAs per SM walk the work items, Q in two buffers (PERSISTENT_CONFIGS)
    streams: int = 1     # 2: one consumer per softmax stream over the same rows (STREAM_CONFIGS)
    consumer_rows: int = ROWS_PER_CONSUMER  # 128: two wgmma row blocks per consumer (one stream only)

    @property
    def rows(self) -> int:
        """Query rows per work item: each consumer's own, or with streams the 64 they share."""
        return self.consumer_rows * (1 if self.streams > 1 else self.consumers)


def is_gluon_tile(tile) -> bool:
    return bool(tile) and tile[0] == "gluon"


def gluon_tile(tile) -> GluonTile:
    return GluonTile(*tile[1:])


def shared_bytes(tile, d: int, elem: int = 2, tiles: int = 0, dv: int | None = None, vectors: int = 0, *,
                 mma_row_sum: bool) -> int:
    """Q tiles of every consumer (two sets on a persistent grid), ``NBUF`` K tiles of each
    stream (head dim ``d``) and V tiles (``dv``, d if None), ``NBUF`` [rows, keys] tiles of each
    of ``tiles`` score inputs read by TMA (GluonPlan.tiles) and ``NBUF`` [1, keys] ones of each of
    ``vectors`` more (GluonPlan.vectors), with the row sums on the tensor
    cores the ``[8, block_n]`` ones of ``P·1`` and with two streams the fp32 [64, dv] output
    one stream hands the other, for one CTA."""
    t = gluon_tile(tile)
    dv = d if dv is None else dv
    ones = 8 * t.block_n if row_sums_by_mma(tile, mma_row_sum) else 0
    kv = t.nbuf * t.block_n * (t.streams * d + dv)
    exchange = 4 * ROWS_PER_CONSUMER * dv if t.streams > 1 else 0
    q = (1 + t.persistent) * t.consumers * t.consumer_rows * d
    return (q + kv + (tiles * t.rows + vectors) * t.nbuf * t.block_n + ones) * elem + exchange


def fits_shared_memory(tile, buffers: int) -> bool:
    """Do ``buffers`` bytes (shared_bytes) with the kernel's barriers fit one CTA, and ``ctas`` such
    CTAs with their reserved kilobyte one SM? (Two CTAs of 116,204 bytes fit, of 116,764 do not:
    the Evoformer's pair bias, mask bias and gate on 1 × 128 × 2, 2026-11-24.)"""
    alloc = buffers + BARRIER_BYTES
    return alloc <= SHARED_BYTES and gluon_tile(tile).ctas * (alloc + CTA_RESERVED_BYTES) <= SM_SHARED_BYTES


def row_sums_by_mma(tile, mma_row_sum: bool) -> bool:
    """Does configuration ``tile`` sum each row's ``p`` as ``P·1`` on the tensor cores (where the
    kernel was printed with ``mma_row_sum``, options.gluon_mma_row_sum)? Not where two CTAs share
    an SM: their buffers leave no room for the ones. Not with two softmax streams: there it was
    1–5 % slower than adding them up (benchmarks/NOTES.md, 2026-11-24). The kernel applies the same
    rule (``ROW_SUM`` in ``_attend``; ``MMA_ROW_SUM`` printed off in a two-stream module)."""
    t = gluon_tile(tile)
    return mma_row_sum and t.ctas == 1 and t.streams == 1


LOADER_REGS = 24  # registers per thread of the loader's warp group


def register_budget(consumers: int, ctas: int = 1) -> tuple[int, int]:
    """(maxnreg of the kernel, registers per consumer thread): the loader's warp group keeps
    ``LOADER_REGS``, the consumers share the rest of the CTA's part (1/``ctas``) of the SM's
    64 K registers (multiples of 8, at most 256)."""
    warps = 4 * consumers + 4
    maxnreg = (65536 // (ctas * warps * 32)) // 8 * 8
    per_consumer = (maxnreg * warps * 32 - LOADER_REGS * 128) // (consumers * 128) // 8 * 8
    return maxnreg, min(per_consumer, 256)


@dataclasses.dataclass
class GluonPlan:
    """The Gluon kernel of a region: its source and name, the run-time parameters after the
    three descriptors and the output pointer (``KernelPlan.args`` kinds, indexing
    ``input_nodes``), the positions of Q, K and V among those inputs, the per-key-tile
    summaries its tile range reads (``KernelPlan.summaries``), and the head dims of Q and K
    (``d``) and of V (``dv``); ``configs_dim``: the head dim whose configurations it takes."""

    name: str
    source: str
    args: list
    input_nodes: list  # fx nodes whose runtime tensors the kernel reads, in order
    operands: tuple    # input indices of Q, K, V
    summaries: tuple
    d: int
    dv: int
    dense: bool = False  # no tile mask skips tiles (_Printer.skips_tiles): every item visits every key tile
    tiles: tuple = ()    # input indices of the score's [rows, keys] tiles read by TMA (_GluonPrinter)
    vectors: tuple = ()  # those of them that are [1, keys] vectors (one row for all the item's rows)
    gates: tuple = ()    # (input index, row axis) of an output gate read by TMA into the Q buffers
    store: int | None = None  # the output's row axis where the consumers store their rows by TMA
    streams: int = 1     # softmax streams, each its own consumer (STREAM_CONFIGS)
    options: KernelOptions | None = None  # the settings it was printed with
    sym_nodes: tuple = ()  # the symbolic integers it reads (KernelPlan.sym_nodes)

    def reindexed(self, nodes: list, sym_nodes: tuple) -> "GluonPlan":
        """This plan reading its inputs from ``nodes`` and its symbolic integers from ``sym_nodes``
        (the Triton kernel's, which the op passes to both kernels): every index mapped. ValueError
        if one is missing."""
        new = [nodes.index(n) for n in self.input_nodes]  # every input of a region is the Triton kernel's
        args = [reindexed(spec, nodes, self.input_nodes, list(sym_nodes), list(self.sym_nodes)) for spec in self.args]
        return dataclasses.replace(self, args=args, input_nodes=list(nodes), sym_nodes=tuple(sym_nodes),
                                   operands=tuple(new[i] for i in self.operands), tiles=tuple(new[i] for i in self.tiles),
                                   vectors=tuple(new[i] for i in self.vectors),
                                   gates=tuple((new[i], axis) for i, axis in self.gates),
                                   summaries=tuple((new[i], axis) for i, axis in self.summaries))

    @property
    def configs_dim(self) -> int:
        """The key of GLUON_CONFIGS, PERSISTENT_CONFIGS and STREAM_CONFIGS: the wider head dim,
        which sizes the accumulator (Dv) or the Q and K tiles (D) as those configurations were
        sized for."""
        return max(self.d, self.dv)
