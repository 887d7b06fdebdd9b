"""Shared helpers: capture + analyse a function, find nodes by op."""
from __future__ import annotations

import torch

from fxflash.analysis import analyse
from fxflash.analysis.ops import packet
from fxflash.capture import capture
from fxflash.patterns import find_chains


def analysed(fn, *args, **kwargs):
    captured = capture(fn, args, kwargs)
    return captured, analyse(captured.graph_module)


def chains_of(fn, *args, **kwargs):
    _, analysis = analysed(fn, *args, **kwargs)
    return find_chains(analysis)


def nodes_with(gm, op_packet):
    return [n for n in gm.graph.nodes if n.op == "call_function" and packet(n.target) is op_packet]


aten = torch.ops.aten
