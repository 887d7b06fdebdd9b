"""The decomposition table used at capture.

Softmax and log-softmax are decomposed into ``amax/sub/exp/sum/div`` (and ``log``), so that
the fusion rules find the online form from the algebra instead of matching a softmax pattern.
Composite ops that only rename arithmetic (``masked_fill`` → ``where``) are decomposed so that
the elementwise printers need one rule each.
"""
from __future__ import annotations

import torch
from torch._decomp import get_decompositions

aten = torch.ops.aten

DECOMPOSED_OPS = [
    aten._softmax,
    aten._log_softmax,
    aten.masked_fill,
    aten.logsumexp,
    aten.repeat_interleave,
    aten.softplus,
    aten.hardtanh,
    aten.gelu,
    aten.silu,
    aten.relu6,
    aten.leaky_relu,
    aten.elu,
    aten.addcmul,
    aten.addcdiv,
    aten.lerp,
    aten.rsub,
    aten.clamp_min,
    aten.clamp_max,
    aten.baddbmm,  # beta·input + alpha·(b1 @ b2): BLOOM's ALiBi scores
    aten.nan_to_num,  # where(isnan, 0, where(x = ±inf, ±finfo.max, x)): the Diff Transformer's scores
]


def decomposition_table() -> dict:
    """ATen overload → Python decomposition, for ``make_fx``."""
    return get_decompositions(DECOMPOSED_OPS)
