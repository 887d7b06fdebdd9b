"""The fused backward's plan and launch configurations, plain data: what codegen/backward.py prints
into and runtime/backward.py launches by (the kernels in launch order, the tiles the tuner times)."""
from __future__ import annotations

import dataclasses

from ..tile.backward import BackwardRefused
from .plan import pow2

# Candidate tiles (BLOCK_M, BLOCK_N, warps, stages) of the kernels, timed at the first launch on
# a GPU (tuning.choose, like the forward's), by the larger head dim and the tile a program owns: a
# row tile (statistics, Δ, dQ: BLOCK_M rows held, BLOCK_N keys per step) or a key tile (dK and dV: BLOCK_N
# keys held, BLOCK_M rows per step); the first is the default (plan.INTERPRETER_TILE in the interpreter).
BACKWARD_TILES = {
    64: {"row": [(64, 64, 4, 2), (128, 32, 4, 2), (64, 32, 4, 3), (128, 64, 8, 2), (128, 64, 4, 2)],
         "key": [(64, 64, 4, 2), (64, 128, 4, 2), (32, 128, 4, 2), (32, 64, 4, 3), (64, 128, 8, 2)]},
    128: {"row": [(64, 32, 4, 2), (64, 64, 8, 2), (128, 32, 8, 2), (64, 32, 4, 3)],
          "key": [(32, 64, 4, 2), (64, 64, 8, 2), (32, 128, 8, 2), (64, 32, 4, 2), (32, 64, 4, 4)]},
    256: {"row": [(32, 32, 8, 1), (32, 32, 4, 1), (64, 32, 8, 1)],
          "key": [(32, 32, 8, 1), (32, 32, 4, 1), (32, 64, 8, 1)]},
}


@dataclasses.dataclass
class BackwardKernel:
    """One kernel of the module: its name, the tile its programs own ("row" | "key"), the
    program's own tensors it reads or writes (``_OWN`` names, in parameter order), and where
    the rest of its parameters come from (KernelPlan.args specs, indexed like the forward's)."""

    name: str
    per: str
    own: tuple
    args: list
    summaries: tuple = ()  # (input, axis): per-tile minima and maxima its loop's range reads (KernelPlan.summaries)
    ranged: bool = False   # its loop visits only the tiles the masks leave (tile_range)
    full_tiles: bool = False  # … and those every mask keeps whole with the masks folded away (full_loop)
    statistics: bool = False  # the row statistics' kernel (constexpr REPAIRED_ONLY)
    input_grads: tuple = ()  # per gradient tile it stores, the input it belongs to (by name, then
                             # by index; None: a value the kernels compute, not an input)
    group: bool = False    # one program per key tile of a K/V head (TileProgram.group; constexprs GROUP, G_INNER)
    held: bool = False     # launched twice (constexpr HELD): the heads with no row held in eager's
                           # rounding, then those with one (codegen/backward.py, held_block)
    redo: bool = False     # launched again after (constexpr REDO): the key tiles whose dV overflowed in the
                           # kernel's order summed again scaled (tile.ir.Accumulate.unbounded)


@dataclasses.dataclass
class BackwardPlan:
    """A region's backward: the module's source, its kernels in launch order, which of the
    forward's inputs Q, K and V are (with how each is read), the tile programs printed, and the
    inputs the score chain reads as they are whose gradients it can give (a bias)."""

    source: str
    kernels: tuple
    q: tuple          # (input index, whether it holds [*, D, M] rather than [*, M, D], batch rank) of Q
    k: tuple
    v: tuple
    inputs: tuple     # the input indices of Q, K and V, each once (the gradients the backward returns)
    d: int
    dv: int
    index_bound: tuple
    programs: tuple
    input_grads: tuple = ()  # the input indices of the tensors whose gradients the dQ kernel can store
    o_dtype: object = None   # O's dtype (P·V's), which dO takes for the programs' products
    ops_after_pv: bool = False  # the programs read O and dO before the region's ops after P·V (RegisteredRegion.epilogue)
    slot_values: tuple = ()  # per gradient tile the kernels store (``dg<j>``), the name of the value it belongs to
    atomics: BackwardKernel | None = None  # replaces the last two kernels where atomics are allowed:
                                           # dK, dV and each key tile's dS·K added to dQ (``dq_sum``)
    grouped: tuple = ()      # dK·dV's kernel and ``atomics`` per key tile of a K/V head (group_axis)
    grouped_programs: tuple = ()  # their tile programs
    group_axis: int | None = None  # the batch axis of K and V that broadcasts over query heads
    exact_delta: BackwardKernel | None = None  # replaces Δ's kernel in 16 bits (config.exact_delta):
                                               # Σ P·dP over the keys (tile.backward._exact_delta)
    exact_delta_program: object = None          # its tile program
    held: bool = False   # the statistics kernel's REPAIRED_ONLY launch marks the rows (``held``, int8 per row)
                         # and heads (``held_heads``, zeroed) whose chain the kernels take in eager's rounding


def backward_tiles(d: int, dv: int, per: str) -> list:
    """The candidate tiles of the kernels whose programs own a ``per`` ("row" | "key") tile."""
    width = max(pow2(d), pow2(dv))
    for limit, tiles in sorted(BACKWARD_TILES.items()):
        if width <= limit:
            return tiles[per]
    raise BackwardRefused(f"head dim {width} is wider than the backward's tiles")
