"""The backward of a fused region as tile programs, lowered from the same region as the forward.

For ``O = softmax(x)·V`` with ``x = f(S)``, ``S = Q·Kᵀ`` (``f``: the region's score chain, its
ops between the contraction and the softmax) and each row's statistics, its maximum ``m`` and
``1/l`` (``l``: its sum of ``exp(x − m)``; ``lower_statistics``, or a forward that stores them,
``with_statistics``), the gradients are

    P  = exp(x − m) · (1/l)          recomputed from Q, K, m and 1/l: no [M, N] tensor is kept
    dV = Pᵀ·dO
    dP = dO·Vᵀ
    dx = P ⊙ (dP − Δ),  Δ = rowsum(dO ⊙ O)
    dS = dx · f′                     the score chain's derivative, op by op (DERIVATIVES)
    dQ = dS·K,  dK = dSᵀ·Q           times the operands' constant scales

as three programs (no atomics: deterministic): Δ per row tile; dK and dV per key tile, looping
over the row tiles; dQ per row tile, looping over the key tiles. Δ equals ``Σⱼ P·dP``; from the
16-bit O it is off by O's rounding, and the dS rows no longer sum to 0, which a peaked row weighs
into dQ and dK, and a temperature's gradient by the row's mean score, at many times eager's error.
A 16-bit training forward stores O in fp32 for it (``o``, codegen/emit's ``training_outputs``).
Where none did, a program of its own sums ``P·dP`` over the key tiles instead, a softmax's
divided by ``Σ P`` (``_exact_delta``, config.exact_delta): each dS row then sums to 0. A fourth
program replaces the last two where atomics are allowed (FlashAttention-2's split): per key tile,
dK, dV and the tile's share of dQ, ``dS·K``, added to dQ in memory, so that P and dP are computed
once. The score chain's inputs (a bias, index masks, a tensor the kernel computes) are recomputed
or loaded exactly as in the forward, and the forward's tile masks skip the same tiles. The
statistics are kept apart rather than as ``L = m + log l``: for a row every key masks with a
finite fill (``finfo.min``), ``m ≈ −3.4·10³⁸`` absorbs ``log l`` in fp32, and ``exp(x − L)``
would be 1 where eager's P is ``1/N``.

The quiet softmax, ``exp(x) / (1 + Σ exp(x))``, has the softmax's derivative; its rows keep the
value its exponent subtracts and its divisor in place of ``m`` and ``l`` (``softmax_form``).
Retention's normalization, ``P = x / n`` with ``n = max(Σ|x|, 1)``, has
``dx = (dP − [Σ|x| ≥ 1]·sign(x)·Δ) / n`` with the same Δ; its rows keep ``Σ|x|`` and ``1/n``
(``abs_sum_form``).

Where P is an elementwise function of the scores with no row reduction (sigmoid or ReLU
attention, ``elementwise_form``), the chain runs from S to P itself and ``dx`` is ``dP``: the
programs are dK and dV and dQ alone, with no statistics and no Δ.

The gradients are those of the region's own inputs: where the kernel reads a K or V expanded
over a GQA group, each program's dK and dV are its head's, and the expand's own backward sums
them. A loaded input of the score chain (a bias) gets its gradient tile too, stored by the dQ
program. codegen/backward.py prints these programs; tests/test_tile_backward.py evaluates them
against autograd.

Ops after P·V (a gate, a transpose: ``Region.output_ops``) are not in the programs: they read O
and dO before those ops (``attention_output``), which the training forward stores and autograd's
backward of the ops gives (runtime/backward.py).

``lower_backward`` raises BackwardRefused, naming the op, where a region is outside this form
(another reduction before P·V, several streams or score contractions, row values returned beside
the output, an op of the score chain without a derivative rule).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..analysis import OpKind
from ..analysis.ops import constant_value, packet
from ..patterns.region import Region
from ..patterns.sparsity import score_bound
from .ir import Accumulate, Dot, Load, Map, RowReduce, SkipIf, Store, TileProgram
from .lower import _Lowering, _op_name, _size

aten = torch.ops.aten


class BackwardRefused(Exception):
    """The region's backward is not expressed as tile programs; the message says why."""


def _mul(node, grad, deps, name):
    a, b = node.args
    if a in deps and b in deps:
        return [(a, Map(name(a), "mul", (grad, _n(b)))), (b, Map(name(b), "mul", (grad, _n(a))))]
    dep, other = (a, b) if a in deps else (b, a)
    return [(dep, Map(name(dep), "mul", (grad, _n(other))))]


def _div(node, grad, deps, name):
    a, b = node.args
    out = [(a, Map(name(a), "div", (grad, _n(b))))] if a in deps else []
    if b in deps:   # a loaded divisor (never a value of the scores: _derivative): −g·((a/b)/b), in
        # eager's order (autograd's div_tensor_other_backward): (a/b)/b overflows where eager's does,
        # as a temperature's over scores near finfo.min, whose gradient is then eager's NaN
        t = name(b)
        out += [(None, Map(f"{t}_qb", "div", (node.name, _n(b)))), (None, Map(f"{t}_gqb", "mul", (grad, f"{t}_qb"))),
                (b, Map(t, "neg", (f"{t}_gqb",)))]
    return out


def _add(node, grad, deps, name, sign=1):
    if node.kwargs.get("alpha", 1) != 1:
        raise BackwardRefused(f"{node.name}: an add with alpha")
    a, b = node.args[:2]
    out = [] if a not in deps else [(a, Map(name(a), "alias", (grad,)))]
    if b in deps:
        out.append((b, Map(name(b), "alias" if sign > 0 else "neg", (grad,))))
    return out


def _unary(op):
    """``d a = op(grad, y)``: ATen's own backward forms (``tanh_backward(g, y) = g·(1 − y²)``)."""
    def rule(node, grad, deps, name):
        (a,) = [x for x in node.args if isinstance(x, fx.Node)][:1]
        return [(a, Map(name(a), op, (grad, node.name)))]
    return rule


def _passes(node, grad, deps, name):
    """Views and casts in the score frame: the gradient passes unchanged (autograd's too)."""
    return [(node.args[0], Map(name(node.args[0]), "alias", (grad,)))]


def _where(node, grad, deps, name):
    c, a, b = node.args
    out = []
    if a in deps:
        out.append((a, Map(name(a), "where", (_n(c), grad, 0.0))))
    if b in deps:
        out.append((b, Map(name(b), "where", (_n(c), 0.0, grad))))
    return out


def _exp(node, grad, deps, name):
    return [(node.args[0], Map(name(node.args[0]), "mul", (grad, node.name)))]


# The derivative of each score-chain op with respect to its arguments that depend on the scores.
DERIVATIVES = {
    aten.mul: _mul, aten.div: _div, aten.add: _add, aten.sub: lambda *a: _add(*a, sign=-1),
    aten.neg: lambda node, grad, deps, name: [(node.args[0], Map(name(node.args[0]), "neg", (grad,)))],
    aten.tanh: _unary("tanh_backward"), aten.sigmoid: _unary("sigmoid_backward"), aten.exp: _exp,
    # ATen's threshold_backward(g, y, 0): g where relu's result is above 0
    aten.relu: lambda node, grad, deps, name: [
        (node.args[0], Map(name(node.args[0]), "threshold_backward", (grad, node.name, 0.0)))],
    aten.where: _where, aten._to_copy: _passes, aten.clone: _passes, aten.alias: _passes,
    aten.view: _passes, aten._unsafe_view: _passes, aten.reshape: _passes,
}


def _skipping(r: Region) -> list:
    """The tile masks a backward skips by: those whose masked scores are -inf with no check at run
    time, where P is exactly 0 (a finite fill's row that every key masks is V's average, not 0;
    an additive mask skips only under its bound, which the backward's loops do not check)."""
    return [m for m in r.tile_masks if not (m.checked or m.bounded)]


def _n(a):
    return a.name if isinstance(a, fx.Node) else a


def with_statistics(program: TileProgram, region: Region) -> TileProgram:
    """The forward ``program`` that also stores each row's maximum and ``1/l`` (the backward's P);
    unchanged for an elementwise P, whose backward reads no statistics."""
    if elementwise_form(region) is not None:
        return program
    m, d = statistics_nodes(region)
    epilogue = (*program.epilogue, Map("inv_l", "div", (1.0, d.name), "row"))
    return TileProgram(program.name, program.frame, program.prologue, program.skips, program.body, epilogue,
                       (*program.stores, Store(m.name, "m", "row values"), Store("inv_l", "inv_l", "row values")),
                       program.streams)


def softmax_form(r: Region) -> tuple:
    """(c, d, x): a region of the form ``P·V`` with ``P = exp(x − c) / d``, ``d = Σ exp(x − c)``
    (the softmax, ``c`` its maximum or a row value computed from it) or ``d = Σ exp(x − c) + exp(−c)``
    (the quiet softmax, ``exp(x) / (1 + Σ exp(x))``). Both are ``exp(x) / (Σ exp(x) + R)`` with
    ``R`` (0 or 1) independent of x, whose derivative is the softmax's, ``dx = P ⊙ (dP − Δ)``;
    the backward reads each row's ``c`` and ``1/d`` (as ``m`` and ``inv_l``)."""
    if r.partners or r.split is not None:
        raise BackwardRefused("several score contractions or softmax streams")
    if r.side_outputs:
        raise BackwardRefused("row values returned beside the output")
    maxes = [red for red in r.reductions if red.combine == "max"]
    sums = [red for red in r.reductions if red.combine == "sum"]
    if len(maxes) != 1 or len(sums) != 1 or len(r.reductions) != 2 or sums[0].scale is not maxes[0].node:
        raise BackwardRefused("reductions other than one softmax's max and sum")
    (sign, p, form), *more = r.terms
    factors = [(f.op, f.row) for f in form.factors]
    shift = factors.pop(0)[1] if factors and factors[0][0] == "shift" else maxes[0].node
    if more or sign != 1 or len(factors) != 1 or factors[0][0] != "div" or shift not in (maxes[0].node, *r.epilogue):
        raise BackwardRefused(f"{p.name}: P·V with P other than the softmax's exp / sum")
    d = factors[0][1]
    if d is not sums[0].node and not _quiet_divisor(d, sums[0].node, shift) and not _safe_divisor(d, sums[0].node):
        raise BackwardRefused(f"{d.name}: a softmax's divisor other than Σ exp(x − c), Σ exp(x − c) + exp(−c) "
                              "or the safe softmax's")
    e = sums[0].source
    while _passes_gradient(p):   # P rounded to V's dtype (a 16-bit softmax), or viewed in the score
        p = p.args[0]            # frame (an expand to its own sizes): the gradient passes unchanged
    if packet(p.target) is aten.div and p.args[1] is d:
        p = p.args[0]
    if packet(e.target) is not aten.exp or p is not e and p.args[0] is not e or packet(e.args[0].target) is not aten.sub:
        raise BackwardRefused(f"{e.name}: a softmax other than exp(x − c) / sum")
    x, c = e.args[0].args[:2]
    if c is not shift or maxes[0].source is not x:
        raise BackwardRefused(f"{e.name}: the exponent is not x − c, c the row's maximum or a value of it")
    return shift, d, x


def abs_sum_form(r: Region) -> tuple | None:
    """(S, n, x, floor) of a region whose P is ``x / n``, ``n = max(S, floor)`` (``clamp(min=floor)``,
    floor > 0) or ``n = S`` (floor None), ``S = Σ|x|`` over the keys: retention's normalization.
    Its derivative, with ``Δ = rowsum(dP ⊙ P) = rowsum(dO ⊙ O)``, is
    ``dx = (dP − [S ≥ floor]·sign(x)·Δ) / n``; the backward reads each row's ``S`` (as ``m``) and
    ``1/n`` (as ``inv_l``). None for any other region."""
    if r.partners or r.split is not None or r.side_outputs or len(r.reductions) != 1:
        return None
    (red,) = r.reductions
    if red.combine != "sum" or red.scale is not None or packet(red.source.target) is not aten.abs:
        return None
    x = red.source.args[0]
    (sign, p, form), *more = r.terms
    if more or sign != 1 or len(form.factors) != 1 or form.factors[0].op != "div":
        return None
    n, floor = form.factors[0].row, None
    if n is not red.node:
        bounds = (*n.args[1:], None, None)[:2] if packet(n.target) is aten.clamp else (None, None)
        if n.args[0] is not red.node or not isinstance(bounds[0], (int, float)) or bounds[0] <= 0 \
                or bounds[1] is not None or n.kwargs:
            return None
        floor = float(bounds[0])
    while _passes_gradient(p):
        p = p.args[0]
    if packet(p.target) is aten.div and p.args[1] is n:
        p = p.args[0]
    return (red.node, n, x, floor) if p is x else None


def statistics_nodes(r: Region) -> tuple:
    """The row values a softmax's or retention's training forward stores for its backward, as
    ``m`` and (their reciprocal) ``inv_l``: (c, d) of softmax_form or (S, n) of abs_sum_form."""
    norm = abs_sum_form(r)
    return norm[:2] if norm is not None else softmax_form(r)[:2]


def _safe_divisor(d: fx.Node, total: fx.Node) -> bool:
    """Is ``d`` = ``where(total == 0, 1, total)``, the safe softmax's (SDPA's math form)? A row whose
    every key is masked has ``total = 0`` and P = 0 there, and ``dx = P ⊙ (dP − Δ)`` is 0, as eager's;
    its statistics (the region's own row ops: ``c = 0``, ``d = 1``) recompute that P = 0."""
    if packet(d.target) is not aten.where or d.args[2] is not total:
        return False
    cond = d.args[0]
    return (isinstance(cond, fx.Node) and packet(cond.target) is aten.eq and cond.args[0] is total
            and constant_value(cond.args[1], None) == 0 and constant_value(d.args[1], None) == 1)


def _quiet_divisor(d: fx.Node, total: fx.Node, c: fx.Node) -> bool:
    """Is ``d`` = ``total + exp(−c)`` (in either order)?"""
    if packet(d.target) is not aten.add or d.kwargs.get("alpha", 1) != 1 or total not in d.args[:2]:
        return False
    other = d.args[1] if d.args[0] is total else d.args[0]
    return (isinstance(other, fx.Node) and packet(other.target) is aten.exp
            and isinstance(other.args[0], fx.Node) and packet(other.args[0].target) is aten.neg
            and other.args[0].args[0] is c)


def attention_output(r: Region) -> fx.Node:
    """O = P·V as the programs read it: the region's output, or where ops follow P·V (a gate, a
    transpose: ``Region.output_ops``) the value they apply to, which the training forward stores
    beside the output; the backward of those ops is autograd's (runtime/backward.py)."""
    return r.output_ops[0].args[0] if r.output_ops else r.output


def elementwise_form(r: Region) -> fx.Node | None:
    """P of a region whose P·V reads an elementwise function of the scores, with no row reduction
    (sigmoid or ReLU attention): ``P = g(S)``, differentiated through the chain like the scores'
    own ops, with no statistics and no Δ. None for any other region."""
    if r.partners or r.split is not None or r.side_outputs or r.reductions or r.epilogue:
        return None
    (sign, p, form), *more = r.terms
    return p if not more and sign == 1 and not form.factors else None


def unbounded_p(r: Region) -> bool:
    """Is P an elementwise function of the scores not bounded by 1 (a ReLU's, over scores that
    ``finfo.max`` reaches)? Then a sum of P's terms (``P·V``, ``Pᵀ·dO``) can overflow in a kernel's
    order where eager's stays finite. A softmax's P and a normalization by ``Σ|x|`` are at most 1,
    as are a sigmoid's and a tanh's: their sums stay within the count times the other operand's
    largest value, whatever the order."""
    p = elementwise_form(r)
    if p is None:
        return False
    bound = score_bound(p, r.frame, float("inf"))
    return bound is None or bound[1].dot != 0 or abs(bound[1].const) > 1


def _passes_gradient(node: fx.Node) -> bool:
    """A cast, or a view with as many elements as its input (no broadcast, whose gradient sums)."""
    if packet(node.target) is aten._to_copy:
        return True
    if packet(node.target) not in (aten.expand, aten.view, aten._unsafe_view, aten.reshape, aten.alias):
        return False
    return node.meta["val"].numel() == node.args[0].meta["val"].numel()


def _chain(r: Region, x: fx.Node) -> list:
    """The score chain: the nodes of the region's DAG on a path from S to x, in graph order."""
    inside = set(r.dag) | {r.frame}
    from_s = {r.frame}
    for node in r.dag:
        if any(a in from_s for a in node.all_input_nodes):
            from_s.add(node)
    to_x = _ancestors(x, inside)
    return [n for n in r.dag if n in from_s and n in to_x]


def _derivative(r: Region, chain: list, loaded: list) -> tuple:
    """(Maps from ``dx`` back to ``dS`` (named ``ds``), through the chain in reverse order, and the
    name of each gradient): the gradients of the scores and of the tensors in ``loaded`` (inputs the
    chain reads as they are, such as a bias)."""
    deps = {r.frame, *chain}
    grads = {chain[-1]: "dx"} if chain else {r.frame: "dx"}
    ops = []
    for node in reversed(chain):
        rule = DERIVATIVES.get(packet(node.target))
        if rule is None:
            raise BackwardRefused(f"{node.name} ({_op_name(node)}): no derivative rule")
        if packet(node.target) is aten.div and node.args[1] in deps:
            raise BackwardRefused(f"{node.name}: a division by a value of the scores")
        for arg, op in rule(node, grads[node], deps | set(loaded), lambda a, node=node: f"d_{a.name}_from_{node.name}"):
            ops.append(op)
            if arg is None:   # a step of the rule's own
                continue
            if arg in grads:  # a value read twice: its gradients add
                total = f"d_{arg.name}_{len(ops)}"
                ops.append(Map(total, "add", (grads[arg], op.name)))
                grads[arg] = total
            else:
                grads[arg] = op.name
    ops.append(Map("ds", "alias", (grads[r.frame],)))
    return ops, grads


def _loaded(r: Region, chain: list, kinds: dict) -> list:
    """The floating values from outside the region that the score chain reads (a bias, a
    temperature; loaded, or computed by the kernel from smaller tensors, as ALiBi's bias from its
    slopes), not the contraction's operands nor values of indices alone: the backward can give
    their gradients (``dS`` through the chain), a computed one's through the ops computing it."""
    operands = {r.q.node, r.k.node, r.v.node}
    inside = set(r.nodes) | {r.frame}
    found = []
    for node in chain:
        for a in node.all_input_nodes:
            value = a.meta.get("val")
            if (a in inside or a in operands or a in found or not isinstance(value, torch.Tensor)
                    or not value.dtype.is_floating_point or kinds.get(a) is OpKind.INDEX):
                continue
            found.append(a)
    return found


def _scaled(name: str, operand, acc: str) -> list:
    """``name`` = the accumulated gradient of a loaded (scaled) operand tile, times its scales."""
    ops, value = [], acc
    for i, (op, c) in enumerate(operand.scale):
        ops.append(Map(f"{name}_{i}" if i < len(operand.scale) - 1 else name, op, (value, c), "row"))
        value = ops[-1].name
    return ops or [Map(name, "alias", (acc,), "row")]


def lower_statistics(region: Region, kinds: dict, printable, name: str = "fxflash_region") -> TileProgram:
    """The row statistics ``m`` and ``1/l`` of ``softmax(x)``, per row tile over the key tiles: the
    forward's score chain and online softmax without P·V (the backward's first program, while the
    forward kernel does not store them itself)."""
    r = region
    norm = abs_sum_form(r)
    c, d, x = norm[:3] if norm is not None else softmax_form(r)
    lowering = _Lowering(r, kinds, printable)
    body = [lowering._operand("k", r.k, "keys", r.D, key_side=True), Dot(r.frame.name, "q", "k")]
    lowering.bound.add(r.frame)
    for node in _chain(r, x):
        body += lowering._inputs(node, "scores")
        body.append(Map(node.name, _op_name(node), lowering._args(node)))
        lowering.bound.add(node)
    if norm is not None:   # retention's: S = Σ|x|, and n from it by the region's own row ops
        body += [Map("ax", "abs", (x.name,)), RowReduce("l", "sum", "ax")]
        of_n = _ancestors(d, r.epilogue)
        epilogue = [Map(c.name, "alias", ("l",), "binds"),
                    *(Map(node.name, _op_name(node), lowering._args(node), "row") for node in r.epilogue if node in of_n)]
    else:
        body += [RowReduce("m", "max", x.name), Map("x_minus_m", "sub", (x.name, "m"), "against the running m"),
                 Map("e", "exp", ("x_minus_m",), "against the running m"), RowReduce("l", "sum", "e", "m")]
        epilogue = _divisor_ops(r, c, d, lowering)
    frame = tuple(_size(s) for s in r.frame.meta["val"].shape)
    divisor = "l" if norm is None and d is _sum(r) else d.name
    return TileProgram(
        f"{name}_bwd_stats", frame, (lowering._operand("q", r.q, "rows", r.D),),
        tuple(SkipIf(m.condition.name, m.masked_when) for m in _skipping(r)), tuple(body),
        (*epilogue, Map("inv_l", "div", (1.0, divisor), "row")),
        (Store(c.name if norm is not None or c is not _max(r) else "m", "m", "row values"),
         Store("inv_l", "inv_l", "row values")))


def _max(r: Region) -> fx.Node:
    return next(red.node for red in r.reductions if red.combine == "max")


def _sum(r: Region) -> fx.Node:
    return next(red.node for red in r.reductions if red.combine == "sum")


def _divisor_ops(r: Region, c: fx.Node, d: fx.Node, lowering: _Lowering) -> list:
    """After the statistics program's loop (``m`` the row's maximum, ``l`` its sum of
    ``exp(x − m)``): ``c`` and ``d`` where they are not ``m`` and ``l`` (softmax_form), by the
    region's own row ops, the maximum and the sum bound to the program's values (a Map named by
    a node, form "binds") and the sum taken against ``c``: ``Σ exp(x − c) = l · exp(m − c)``."""
    if c is _max(r) and d is _sum(r):
        return []
    ops = [Map(_max(r).name, "alias", ("m",), "binds")]
    of_c = _ancestors(c, r.epilogue)
    ops += [Map(node.name, _op_name(node), lowering._args(node), "row") for node in r.epilogue if node in of_c]
    ops += [Map("m_minus_c", "sub", ("m", c.name), "row"), Map("to_c", "exp", ("m_minus_c",), "row"),
            Map(_sum(r).name, "mul", ("l", "to_c"), "binds")]
    of_d = _ancestors(d, r.epilogue) - of_c
    return ops + [Map(node.name, _op_name(node), lowering._args(node), "row") for node in r.epilogue if node in of_d]


def _ancestors(node: fx.Node, within) -> set:
    """``node`` and the nodes of ``within`` it is computed from through nodes of ``within``."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n in seen or n not in within:
            continue
        seen.add(n)
        todo += n.all_input_nodes
    return seen


def _exact_delta(r: Region, norm) -> tuple:
    """The ops after the exact Δ program's loop, from its sums ``pdp_sum`` = Σ P·dP and ``p_sum`` =
    Σ P of the recomputed P. A softmax's P is ``exp(x − m)/l`` recomputed with the forward's ``m``:
    where the recomputed scores and that maximum round apart by an ulp of a large score, exp of it
    scales the row's P, which ``Σ P·dP`` alone would carry into dS = P·(dP − Δ), a difference of
    nearly equal terms on a row one key takes. Dividing by ``Σ P`` and multiplying by the sum the
    row's P has in exact arithmetic (1; the quiet softmax's ``1 − exp(−c)/d``, ``c`` and ``1/d`` the
    row's ``m`` and ``1/l``) cancels that scale. Retention's ``x / n`` has no exponent: Σ P·dP."""
    if norm is not None:
        return (Map("delta", "alias", ("pdp_sum",)),)
    # a row P empties (its keys all masked, a row past M) takes Δ = 0
    ops = [Map("p_some", "ne", ("p_sum", 0.0)), Map("p_norm", "where", ("p_some", "p_sum", 1.0)),
           Map("p_ratio", "div", ("pdp_sum", "p_norm"))]
    if softmax_form(r)[1] is _sum(r):
        return (*ops, Map("delta", "alias", ("p_ratio",)))
    return (*ops, Map("neg_m", "neg", ("m",)), Map("e_neg_m", "exp", ("neg_m",)),
            Map("r_share", "mul", ("e_neg_m", "inv_l")), Map("p_total", "rsub", ("r_share", 1.0)),
            Map("p_scaled", "mul", ("p_ratio", "p_total")), Map("delta", "where", ("p_some", "p_scaled", 0.0)))


def lower_backward(region: Region, kinds: dict, printable, name: str = "fxflash_region") -> tuple:
    """The backward of ``region`` as (Δ, dK and dV, dQ) tile programs (module docstring); for an
    elementwise P (``elementwise_form``), (dK and dV, dQ): P recomputed through the chain, whose
    derivative takes ``dP`` itself. Returned with the program that replaces the last two where
    atomics are allowed: dK, dV and each key tile's share of dQ, added atomically; and with the
    program that replaces Δ's in 16 bits, Δ summed over the key tiles (``_exact_delta``; None for an
    elementwise P, which has no Δ)."""
    r = region
    p_node = elementwise_form(r)
    norm = abs_sum_form(r) if p_node is None else None
    x = p_node if p_node is not None else norm[2] if norm is not None else softmax_form(r)[2]
    chain = _chain(r, x)
    loaded = _loaded(r, chain, kinds)
    derivative, grads = _derivative(r, chain, loaded)
    # the gradient tile of each loaded input, stored per (row tile, key tile) where dS is
    input_grads = tuple(Store(grads[a], f"d{a.name}", "scores") for a in loaded if a in grads)
    frame = tuple(_size(s) for s in r.frame.meta["val"].shape)
    out = attention_output(r).name
    unbounded = unbounded_p(r)
    delta = TileProgram(
        f"{name}_bwd_delta", frame, (Load("do", f"d{out}", "output"), Load("o", out, "output")), (), (),
        (Map("do_o", "mul", ("do", "o"), "row"), Map("delta", "sum", ("do_o", -1), "row")),
        (Store("delta", "delta", "row values"),), per="row", loop="")

    def recompute(lowering: _Lowering) -> list:
        """S, the score chain with its inputs, and P = exp(x − L)."""
        ops = [Dot(r.frame.name, "q", "k")]
        lowering.bound.add(r.frame)
        for node in chain:
            ops += lowering._inputs(node, "scores")
            ops.append(Map(node.name, _op_name(node), lowering._args(node)))
            lowering.bound.add(node)
        if p_node is not None:
            return ops + [Map("p", "alias", (x.name,))]
        if norm is not None:   # retention's P = x / n (inv_l holds 1/n)
            return ops + [Map("p", "mul", (x.name, "inv_l"))]
        return ops + [Map("x_minus_m", "sub", (x.name, "m")), Map("e", "exp", ("x_minus_m",)),
                      Map("p", "mul", ("e", "inv_l"))]

    def gradient_of_x() -> list:
        if p_node is not None:   # the chain ends at P: its gradient is dP
            return [Map("dx", "alias", ("dp",))]
        if norm is not None:     # dx = (dP − [S ≥ floor]·sign(x)·Δ) / n, m holding S (abs_sum_form)
            sign = [Map("sgn", "sign", (x.name,))]
            if norm[3] is not None:
                sign += [Map("above", "ge", ("m", norm[3])), Map("sgn_above", "where", ("above", "sgn", 0.0))]
            return [*sign, Map("sgn_delta", "mul", (sign[-1].name, "delta")),
                    Map("dp_minus_delta", "sub", ("dp", "sgn_delta")), Map("dx", "mul", ("dp_minus_delta", "inv_l"))]
        return [Map("dp_minus_delta", "sub", ("dp", "delta")), Map("dx", "mul", ("p", "dp_minus_delta"))]

    # the row values P reads: the statistics and Δ of a softmax, none of an elementwise P
    row_values = () if p_node is not None else (
        Load("m", "m", "row values"), Load("inv_l", "inv_l", "row values"), Load("delta", "delta", "row values"))

    def over_keys(rows: tuple) -> tuple:
        """A program per row tile over the key tiles (dQ's, the exact Δ's): its prologue (Q, dO and
        the row values ``rows``), its skips, and its loop body up to ``dP = dO·Vᵀ``."""
        lowering = _Lowering(r, kinds, printable)
        return ((lowering._operand("q", r.q, "rows", r.D), Load("do", f"d{out}", "output"), *rows),
                tuple(SkipIf(m.condition.name, m.masked_when) for m in _skipping(r)),
                (lowering._operand("k", r.k, "keys", r.D, key_side=True), *recompute(lowering),
                 lowering._operand("v", r.v, "keys", r.Dv), Dot("dp", "do", "v")))

    def key_program(suffix: str, dq_atomics: bool) -> TileProgram:
        """dK and dV per key tile; with ``dq_atomics`` also each tile's dS·K, added to dQ in memory
        (FlashAttention-2's split: the dQ program's recomputation of P and dP is not needed)."""
        kv = _Lowering(r, kinds, printable)
        rows = [kv._operand("q", r.q, "rows", r.D), Load("do", f"d{out}", "output"), *row_values]
        dq_part = (*input_grads, Accumulate("dq_part", "ds", "k", fresh=True), *_scaled("dq_sum", r.q, "dq_part"),
                   Store("dq_sum", f"d{r.q.node.name}", "rows", add=True)) if dq_atomics else ()
        return TileProgram(
            f"{name}_bwd_{suffix}", frame,
            (kv._operand("k", r.k, "keys", r.D, key_side=True), kv._operand("v", r.v, "keys", r.Dv)),
            tuple(SkipIf(m.condition.name, m.masked_when, "row") for m in _skipping(r)),
            (*rows, *recompute(kv), Accumulate("dv_acc", "p", "do", transposed=True, unbounded=unbounded),
             Dot("dp", "do", "v"),
             *gradient_of_x(), *derivative, Accumulate("dk_acc", "ds", "q", transposed=True), *dq_part),
            (*_scaled("dk", r.k, "dk_acc"), *_scaled("dv", r.v, "dv_acc")),
            (Store("dk", f"d{r.k.node.name}", "keys"), Store("dv", f"d{r.v.node.name}", "keys")),
            per="key", loop="row")

    exact_delta = None
    if p_node is None:   # Σ P·dP (and Σ P) over the keys, then _exact_delta's ops
        prologue, skips, head = over_keys(row_values[:2])
        exact_delta = TileProgram(
            f"{name}_bwd_exact_delta", frame, prologue, skips,
            (*head, Map("p_dp", "mul", ("p", "dp")), RowReduce("pdp_sum", "sum", "p_dp"),
             *(() if norm is not None else (RowReduce("p_sum", "sum", "p"),))),
            _exact_delta(r, norm), (Store("delta", "delta", "row values"),), per="row", loop="key")
    dkdv = key_program("dkdv", False)
    prologue, skips, head = over_keys(row_values)
    dq = TileProgram(
        f"{name}_bwd_dq", frame, prologue, skips,
        (*head, *gradient_of_x(), *derivative, *input_grads, Accumulate("dq_acc", "ds", "k")),
        tuple(_scaled("dq", r.q, "dq_acc")), (Store("dq", f"d{r.q.node.name}", "rows"),), per="row", loop="key")
    programs = (dkdv, dq) if p_node is not None else (delta, dkdv, dq)
    return programs, key_program("dkdvdq", True), exact_delta
