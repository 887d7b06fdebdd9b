"""What a printed kernel is to the rest of fxflash: plain data the printers produce and the runtime
launches by (the launch, the tuner, the custom op), without the printers themselves."""
from __future__ import annotations

import dataclasses

import torch

from ..config import KernelOptions

INT32_LIMIT = 1 << 31
INTERPRETER_TILE = (16, 16, 1, 1)  # every kernel's tile in Triton's interpreter: its dots are 16 wide,
                                  # and the tests' small shapes cross several tiles


def pow2(n: int) -> int:
    """The tile width of a head dim ``n``: the next power of two, at least 16 (``tl.dot``'s least)."""
    return max(16, 1 << (n - 1).bit_length())


@dataclasses.dataclass
class KernelPlan:
    """How to launch the kernel: its source, and for each run-time parameter where its value
    comes from. ``args`` entries: ("ptr", i) | ("stride", i, axis) | ("size", i, axis) |
    ("frame", j) with i an index into the op's tensor inputs and j into the frame sizes."""

    name: str
    source: str
    args: list
    input_nodes: list        # fx nodes whose runtime tensors are the op's inputs, in order
    frame_rank: int
    out_dtype: torch.dtype
    d: int
    dv: int
    configs: tuple = ()      # (BLOCK_M, BLOCK_N, warps, stages) that fit the kernel, first the
                             # default; timed at the first launch on a GPU (tuning.choose)
    index_bound: tuple = (0, 0)  # int32 index arithmetic is exact while a·max(frame) + b < 2³¹
    side_dtypes: tuple = ()  # dtypes of the row values stored beside the output (a logsumexp)
    partner_dims: tuple = ()  # head dims of further score contractions
    out_order: tuple | None = None  # the output's axes from outermost to innermost in memory
                                    # (None: contiguous, stored without strides)
    summaries: tuple = ()    # (input, axis): integer inputs whose min and max per key tile along
                             # that axis the launch computes for its BLOCK_N ("summary" args);
                             # (input, "absmax" | "colsum"): _Printer.summary_param
    dv_split: int = 1        # programs per row tile, each with its own part of the output's Dv
    unclassified: tuple = ()  # what the per-tile tests leave out, one sentence each (explain())
    flags: bool = False      # the kernel flags the rows it leaves to the repair kernel (sat_ptr)
    fp_fusion: bool = False  # it prints multiply-add forms (launched with fp contraction); without,
                             # it prints eager's own form and runs without
    repair_args: tuple | None = None  # the run-time parameters of ``{name}_repair`` (after out_ptr and
                             # sat_ptr), the kernel that recomputes the rows a kernel flagged
    gluon: object = None     # gluon_plan.GluonPlan: the region as a Gluon kernel for Hopper, or None
    gluon_refusal: str = ""  # why there is none (explain())
    options: KernelOptions | None = None  # the settings it was printed with
    sym_nodes: tuple = ()    # symbolic integers it reads at run time (("symint", j) args): the op's
                             # last sizes, in this order
    backward: object = None  # backward_plan.BackwardPlan: the region's fused backward, or None
    backward_note: str = ""  # "fused", or "eager recompute: <why>" (explain())
    training: "KernelPlan | None" = None  # the forward that also stores what the backward reads
                             # (its training_outputs after the region's own results), or None
    training_outputs: tuple = ()  # a training forward's: "m", "inv_l" (fp32 rows), "o" ([*batch, M, Dv])
    twin: object = None      # runtime/twin.Twin: a region with streams, differentiated through its twin

    def symints(self, sizes) -> tuple:
        """This call's values of ``sym_nodes``: the op's last sizes."""
        return tuple(sizes[len(sizes) - len(self.sym_nodes):]) if self.sym_nodes else ()

    def int32_index_ok(self, frame) -> bool:
        a, b = self.index_bound
        return a * max(frame) + b < INT32_LIMIT


def block_dims_of(plan: KernelPlan) -> dict:
    """The head-dim constexprs: D and Dv, those of further score contractions, and their
    power-of-two tile widths."""
    dims = {"D": plan.d, "DP": pow2(plan.d), "DV": plan.dv, "DVP": pow2(plan.dv)}
    for j, d in enumerate(plan.partner_dims):
        dims.update({f"DX{j}": d, f"DXP{j}": pow2(d)})
    return dims


def reindexed(spec: tuple, inputs: list, own_inputs: list, sym_nodes: list, own_sym_nodes: list) -> tuple:
    """An argument spec of a kernel printed beside the plan's (the repair kernel, the Gluon kernel),
    its input or symbolic integer referred to by its place among the plan's."""
    if spec[0] in ("ptr", "stride", "size", "dense_stride"):
        return (spec[0], inputs.index(own_inputs[spec[1]]), *spec[2:])
    if spec[0] == "symint":
        return ("symint", sym_nodes.index(own_sym_nodes[spec[1]]))
    return spec
