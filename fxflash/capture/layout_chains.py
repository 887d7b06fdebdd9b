"""Collapse chains of layout ops that move size-one axes (how ``torch.einsum`` decomposes).

``torch.einsum("bhmd,bhnd->bhmn", q, k)`` is traced as ``unsqueeze → permute → permute → view``
on each operand and ``view → permute → view`` on the product; the permutes move axes of size
one, which puts no element elsewhere. The fusion rules read transposes, batch views and
broadcasts, and such a chain hides the plain ``q @ k.transpose(-1, -2)`` it computes. This pass
rewrites each such chain into the ops a user would write, computing the same tensor:

    x → view(x, x's sizes without its size-one axes)     where x has size-one axes
      → transposes, or permute(·, π)                     where the chain reorders the axes of
                                                         size > 1 (π: their net order; _reorder)
      → clone(·)                                         where the chain's last op reads a clone
      → the chain's last op, or a view to its shape

A *chain* is a run of ops ``unsqueeze``, ``squeeze``, ``permute``, ``view``, ``_unsafe_view``,
``reshape``, each the only user of the one before, that contains a ``permute``; its last op may
read a ``clone`` of the op before (einsum's ``clone → _unsafe_view`` before each ``bmm``: the
rewrite clones the same elements in the same order, so the last op's result is the same, strides
included). Its first op may merge or split axes above size one (the rewrite then starts with that
op, to the sizes without their ones); every other op but the last is *unit-only*: a permute, or
an op that keeps the sizes above one in order (it adds or drops ones). Through unit-only ops each
axis above size one keeps its size and stride (a permute carries an axis's stride with it), so
the last op sees the same axes above one, in the same order and with the same strides, in the
rewrite as in the original: a ``view`` valid there is valid here, and the result holds the same
elements at the same places. A symbolic size (``torch.compile(dynamic=True)``) is never one
(Dynamo specializes sizes 0 and 1); the rewrite's views take it from the graph node that
computes it. A chain whose size no earlier node computes is left as it is, and so is one the
rewrite would lengthen, or leave as long where no value of it has a size-one axis (a user's own
reorder).
"""
from __future__ import annotations

import typing

import torch
import torch.fx as fx

aten = torch.ops.aten

LAYOUT_CHAIN_OPS = {aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
                    aten.permute.default, aten.view.default, aten._unsafe_view.default, aten.reshape.default}
# a chain's last op re-applied in the rewrite; any other last op becomes a view to its shape
REAPPLIED_ENDS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}


def _is_one(size) -> bool:
    return type(size) is int and size == 1


def _same(a, b) -> bool:
    """Equal sizes, symbolic ones by their expressions (no guard is recorded)."""
    if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt):
        return a.node.expr == b.node.expr
    return type(a) is int and type(b) is int and a == b


def _same_sizes(a, b) -> bool:
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))


def _sizes(node) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _labels(node) -> list | None:
    """One label per axis of ``node``: its index for an axis above size one, None for a one."""
    sizes = _sizes(node)
    return None if sizes is None else [None if _is_one(s) else i for i, s in enumerate(sizes)]


def _moved(step: fx.Node, labels: list) -> list | None:
    """The labels after the unit-only op ``step``, or None where ``step`` is not unit-only (it
    merges or splits axes above size one)."""
    if step.target is aten.permute.default:
        return [labels[p % len(labels)] for p in step.args[1]]
    src, out = _sizes(step.args[0]), _sizes(step)
    if not _same_sizes([s for s in src if not _is_one(s)], [s for s in out if not _is_one(s)]):
        return None
    kept = iter([a for a in labels if a is not None])
    return [None if _is_one(s) else next(kept) for s in out]


def _is_layout(node) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in LAYOUT_CHAIN_OPS


def _read_clone(end: fx.Node):
    """The contiguous clone a re-applied last op reads, where that clone has no other user, else
    None (a clone that preserves its input's strides is left in its chain's way)."""
    node = end.args[0]
    if (end.target in REAPPLIED_ENDS and isinstance(node, fx.Node) and node.op == "call_function"
            and node.target is aten.clone.default and len(node.users) == 1
            and node.kwargs.get("memory_format") is torch.contiguous_format):
        return node
    return None


class Chain(typing.NamedTuple):
    end: fx.Node     # its last op
    source: fx.Node  # x
    head: tuple      # the sizes whose ones the rewrite's first op drops (x's, or an absorbed op's)
    first: object    # that op: a view, or the absorbed op's own (view, reshape, _unsafe_view)
    ops: list        # the chain's ops before its last (and before the clone it reads)
    clone: object    # the clone its last op reads, or None
    order: list      # x's axes above one in their order after the chain's moves

    @property
    def replaced(self) -> list:
        """The nodes the rewrite replaces, in graph order."""
        return [*self.ops, *([self.clone] if self.clone is not None else []), self.end]


def _chain_ending_at(end: fx.Node) -> Chain | None:
    """The longest chain ending at ``end``, or None; its ``order`` is taken up to ``end``'s input
    where ``end`` is re-applied, through ``end`` where it is unit-only. Where an op is a view or
    reshape that merges or splits axes, the chain restarts there and absorbs it: dropping ones
    from a view (reshape) of x is a view (reshape) of x."""
    clone = _read_clone(end)
    walked, node = [], (clone or end).args[0]
    while _is_layout(node) and len(node.users) == 1:
        walked.insert(0, node)
        node = node.args[0]
    if _sizes(node) is None:
        return None
    moves = walked + ([] if end.target in REAPPLIED_ENDS else [end])
    source, head, first, labels, ops = node, _sizes(node), aten.view.default, _labels(node), []
    for step in moves:
        moved = _moved(step, labels)
        if moved is not None:
            labels, ops = moved, ops + [step]
        elif step is end:
            return None
        else:  # a view or reshape that merges or splits axes: absorbed
            source, head, first, labels, ops = step.args[0], _sizes(step), step.target, _labels(step), [step]
    return Chain(end, source, head, first, [op for op in ops if op is not end], clone,
                 [a for a in labels if a is not None])


def _is_end(node: fx.Node) -> bool:
    """Is ``node`` the last op of its run of layout ops: no layout op reads it, nor a clone
    that a layout op reads?"""
    if not _is_layout(node):
        return False
    users = list(node.users)
    if len(users) != 1:
        return True
    after = users[0]
    if _is_layout(after):
        return False
    return not (after.op == "call_function" and after.target is aten.clone.default and len(after.users) == 1
                and _read_clone(next(iter(after.users))) is after)


def _swap(rank: list):
    """The one pair of axes ``rank`` exchanges, or None where it is not a single swap."""
    moved = [i for i, a in enumerate(rank) if a != i]
    return tuple(moved) if len(moved) == 2 else None


def _reorder(rank: list) -> list:
    """The ops putting the axes in the order ``rank``, as users write them where they can: one
    transpose, or one transpose and then the last two axes' (``k.transpose(1, 2)`` then
    ``.transpose(-2, -1)``, what the rules read as a key in ``[B, S, H, D]`` storage), else a permute."""
    if rank == sorted(rank):
        return []
    if _swap(rank):
        return [(aten.transpose.int, _swap(rank), {})]
    last = len(rank) - 2
    before_last = rank[:last] + rank[last:][::-1]   # rank with its last two swapped back
    if _swap(before_last):
        return [(aten.transpose.int, _swap(before_last), {}), (aten.transpose.int, (last, last + 1), {})]
    return [(aten.permute.default, (rank,), {})]


def _size_args(sizes, symbols: dict, before: dict, at: int) -> list | None:
    """``sizes`` as a view's argument: integers as they are, each symbolic size as the node that
    computes it (``symbols``: its expression → node) if that node comes before position ``at``
    (``before``: node → position); None where one has no such node."""
    args = []
    for size in sizes:
        if isinstance(size, torch.SymInt):
            node = symbols.get(size.node.expr)
            if node is None or before[node] >= at:
                return None
            size = node
        args.append(size)
    return args


def _rewrite(chain: Chain, symbols: dict, before: dict) -> list | None:
    """The rewrite of ``chain``: (target, args after the tensor, kwargs) for each new op, or None
    where it cannot be expressed, or is longer — or as long, where no value of the chain has a
    size-one axis (a chain a user wrote)."""
    squeezed = [s for s in chain.head if not _is_one(s)]
    rank = [sorted(chain.order).index(a) for a in chain.order]  # the net order of squeezed's axes
    end = chain.end
    out = list(_sizes(end))
    steps = []
    if chain.first is not aten.view.default or not _same_sizes(list(_sizes(chain.source)), squeezed):
        steps.append((chain.first, squeezed, {}))
    steps += _reorder(rank)
    if chain.clone is not None:
        steps.append((aten.clone.default, (), dict(chain.clone.kwargs)))
    if not _same_sizes([squeezed[a] for a in rank], out) or not steps:
        steps.append((end.target if end.target in REAPPLIED_ENDS else aten.view.default, out, {}))
    replaced = chain.replaced
    ones = any(_is_one(s) for n in replaced for s in _sizes(n))
    if len(steps) > len(replaced) or (len(steps) == len(replaced) and not ones):
        return None
    resolved = []
    for target, rest, kwargs in steps:
        if target in REAPPLIED_ENDS:
            rest = _size_args(rest, symbols, before, before[end])
            if rest is None:
                return None
            rest = (rest,)
        resolved.append((target, rest, kwargs))
    return resolved


def _values(source: fx.Node, steps: list) -> list | None:
    """Each new op's value on the nodes' values (real or fake tensors, SymInts), for its meta;
    None where one raises (a view the chain's strides do not allow: left as it is)."""
    values, value = [], source.meta["val"]
    for target, rest, kwargs in steps:
        try:
            value = target(value, *fx.node.map_arg(rest, lambda n: n.meta["val"]), **kwargs)
        except Exception:  # noqa: BLE001 - the chain stays as written
            return None
        values.append(value)
    return values


def collapse_layout_chains(gm: fx.GraphModule) -> int:
    """Rewrite ``gm``'s chains (module docstring) in place; returns how many were rewritten."""
    graph, rewritten = gm.graph, 0
    before = {n: i for i, n in enumerate(graph.nodes)}
    symbols = {}
    for n in graph.nodes:  # the first node computing each symbolic size
        if isinstance(n.meta.get("val"), torch.SymInt):
            symbols.setdefault(n.meta["val"].node.expr, n)
    for end in [n for n in graph.nodes if _is_end(n)]:
        chain = _chain_ending_at(end)
        if chain is None or not any(n.target is aten.permute.default for n in (*chain.ops, end)):
            continue
        steps = _rewrite(chain, symbols, before)
        values = None if steps is None else _values(chain.source, steps)
        if values is None:
            continue
        y = chain.source
        with graph.inserting_before(end):
            for (target, rest, kwargs), value in zip(steps, values):
                y = graph.call_function(target, (y, *rest), kwargs)
                y.meta["val"] = value
        end.replace_all_uses_with(y)
        for node in reversed(chain.replaced):
            graph.erase_node(node)
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


__all__ = ["collapse_layout_chains"]
