"""The op tables the analysis reads: which ATen ops are contractions, reductions, layouts.

Elementwise ops are recognised by ATen's own ``pointwise`` tag plus the few listed here;
everything not listed anywhere is of kind ``other`` (it never joins a fused region).
"""
from __future__ import annotations

import enum

import torch

aten = torch.ops.aten


class OpKind(str, enum.Enum):
    CONTRACTION = "contraction"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    LAYOUT = "layout"
    INDEX = "index expression"
    INPUT = "input"
    OUTPUT = "output"
    OTHER = "other"


# Contractions: packet → number of leading batch axes. ``C[b.., m, n] = Σ_k A[b.., m, k]·B[b.., k, n]``.
CONTRACTIONS = {aten.mm: 0, aten.bmm: 1}

# Reductions: packet → how to read (dims, keepdim) from the node's args / kwargs.
REDUCTIONS = {
    aten.amax: "dims",
    aten.amin: "dims",
    aten.sum: "dims",
    aten.mean: "dims",
    aten.prod: "dim",
    aten.logsumexp: "dims",
    aten.var: "dims",
    aten.std: "dims",
    aten.any: "dims",
    aten.all: "dims",
}

# Layout ops: they move, split, merge or select axes without arithmetic.
LAYOUTS = {
    aten.view,
    aten._unsafe_view,
    aten.reshape,
    aten._reshape_alias,
    aten.permute,
    aten.transpose,
    aten.t,
    aten.expand,
    aten.unsqueeze,
    aten.squeeze,
    aten.slice,
    aten.select,
    aten.split,
    aten.split_with_sizes,
    aten.unbind,
    aten.clone,
    aten.alias,
    aten.contiguous,
    aten.detach,
    aten.lift_fresh_copy,
}

# Ops without tensor inputs whose value is a function of indices and constants only.
INDEX_SOURCES = {
    aten.arange,
    aten.full,
    aten.scalar_tensor,
    aten.zeros,
    aten.ones,
    aten.empty,
}

# Factories that read only the dtype and device of their tensor argument (``x.new_ones(())``, as
# transformers' mask functions start from): index expressions whatever that tensor holds.
LIKE_FILLS = {aten.new_ones, aten.new_zeros, aten.new_full}

# Non-elementwise ops whose output is an index expression when their input is one.
INDEX_PRESERVING = {aten.tril, aten.triu}

# Elementwise ops that ATen does not tag as pointwise.
EXTRA_ELEMENTWISE = {
    aten._to_copy,
    aten.where,
    aten.clamp,
    aten.masked_fill,
    aten.type_as,
    aten.floor_divide,
}


# Factory ops that fill a tensor with one constant: packet → how to read it from the args.
CONSTANT_FILLS = {
    aten.scalar_tensor: lambda args: args[0],
    aten.full: lambda args: args[1],
    aten.ones: lambda args: 1,
    aten.zeros: lambda args: 0,
    aten.new_ones: lambda args: 1,
    aten.new_zeros: lambda args: 0,
    aten.new_full: lambda args: args[2],
}
_NO_CONSTANT = object()


def constant_value(arg, default=_NO_CONSTANT):
    """The scalar a Python literal or a constant-filled factory node holds; ``default``
    (or a ValueError) when it holds none."""
    if isinstance(arg, (bool, int, float)):
        return arg
    if getattr(arg, "op", None) == "call_function" and packet(arg.target) in CONSTANT_FILLS:
        return CONSTANT_FILLS[packet(arg.target)](arg.args)
    if default is _NO_CONSTANT:
        raise ValueError(f"{arg} is not a constant")
    return default


# Ops that draw from the random number generator. A region never reads their values: the
# user's random draws stay exactly the user's (dropout falls back, bit for bit).
RANDOM = {
    aten.bernoulli, aten.rand, aten.rand_like, aten.randn, aten.randn_like, aten.randint,
    aten.randint_like, aten.randperm, aten.normal, aten.uniform, aten.exponential,
    aten.native_dropout, aten.multinomial, aten.poisson,
}


def packet(target):
    """The OpOverloadPacket of an FX target, or the target itself if it has none."""
    return getattr(target, "overloadpacket", target)


def is_elementwise(target) -> bool:
    if packet(target) in EXTRA_ELEMENTWISE:
        return True
    tags = getattr(target, "tags", ())
    return torch.Tag.pointwise in tags


def static_kind(target) -> OpKind:
    """The kind of a call_function target, before index-expression detection."""
    p = packet(target)
    if p in CONTRACTIONS:
        return OpKind.CONTRACTION
    if p in REDUCTIONS:
        return OpKind.REDUCTION
    if p in LAYOUTS:
        return OpKind.LAYOUT
    if is_elementwise(target):
        return OpKind.ELEMENTWISE
    return OpKind.OTHER
