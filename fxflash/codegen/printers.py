"""Elementwise printers: one rule per ATen op, printing Triton from argument expressions.

Floating values are computed in fp32 inside kernels whatever their storage dtype (as
Inductor does), booleans as ``int1``, integers in their own width. Every printer takes the
argument expressions (strings) and the FX node, and returns an expression.
"""
from __future__ import annotations

import math

import torch

aten = torch.ops.aten


class Unprintable(Exception):
    """No printer for this op (or these arguments)."""


TRITON_DTYPES = {
    torch.float32: "tl.float32",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.bool: "tl.int1",
    torch.int8: "tl.int8",
    torch.int16: "tl.int16",
    torch.int32: "tl.int32",
    torch.int64: "tl.int64",
    torch.uint8: "tl.uint8",
}


def compute_dtype(dtype: torch.dtype) -> str:
    """The Triton type a value of ``dtype`` is held in inside a kernel."""
    if dtype.is_floating_point:
        if dtype is torch.float64:
            raise Unprintable("float64 values are not computed in fused kernels")
        return "tl.float32"
    if dtype not in TRITON_DTYPES:
        raise Unprintable(f"dtype {dtype}")
    return TRITON_DTYPES[dtype]


def literal(value) -> str:
    """A Python scalar as Triton source."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        return repr(value)
    raise Unprintable(f"scalar {value!r}")


def _binary(fmt):
    return lambda a, node: fmt.format(*a[:2])


def _unary(fmt):
    return lambda a, node: fmt.format(a[0])


def _add(a, node):
    alpha = node.kwargs.get("alpha", 1)
    return f"({a[0]} + {a[1]})" if alpha == 1 else f"({a[0]} + {a[1]} * {literal(alpha)})"


def _sub(a, node):
    alpha = node.kwargs.get("alpha", 1)
    return f"({a[0]} - {a[1]})" if alpha == 1 else f"({a[0]} - {a[1]} * {literal(alpha)})"


def _div(a, node):
    mode = node.kwargs.get("rounding_mode")
    if mode == "floor":
        return floor_div_code(a[0], positive_int_divisor(node))
    if mode is not None:
        raise Unprintable(f"div with rounding mode {mode!r}")
    return f"({a[0]} / {a[1]})"


# -- integer floor division and remainder by a positive literal (index expressions: block
# ids i // b, positions on a 2-D canvas i % w, dilations (i - j) % d) ------------------------
def positive_int_divisor(node) -> int:
    """The literal divisor ``c > 0`` of an integer floor division or remainder ``node``;
    Unprintable for anything else (a tensor divisor, a float or negative one, float values)."""
    c = node.args[1] if len(node.args) > 1 else None
    val = node.meta.get("val")
    if (isinstance(c, bool) or not isinstance(c, int) or c <= 0
            or not isinstance(val, torch.Tensor) or val.dtype.is_floating_point or val.dtype is torch.bool):
        raise Unprintable(f"{node.name}: integer floor division or remainder by {c!r} (only by a positive literal)")
    return c


def python_mod_code(x: str, c: int) -> str:
    """``x mod c`` in ``[0, c)`` (Python's and PyTorch's ``%`` for ``c > 0``), for any sign of
    ``x``: right whether Triton's integer ``%`` takes the sign of ``x`` (C) or of ``c``."""
    return f"(((({x}) % {c}) + {c}) % {c})"


def floor_div_code(x: str, c: int) -> str:
    """``⌊x / c⌋`` for ``c > 0`` and any sign of ``x``: ``x`` minus its remainder is a multiple
    of ``c``, so the division is exact whether Triton's ``//`` rounds down or toward zero."""
    return f"((({x}) - {python_mod_code(x, c)}) // {c})"


def _pow(a, node):
    exponent = node.args[1]
    if isinstance(exponent, (int, float)) and float(exponent).is_integer() and 0 <= exponent <= 8:
        n = int(exponent)
        return "1.0" if n == 0 else "(" + " * ".join([a[0]] * n) + ")"
    if exponent == 0.5:
        return f"tl.sqrt({a[0]})"
    if exponent == -0.5:
        return f"tl.rsqrt({a[0]})"
    raise Unprintable(f"pow by {exponent!r}")


def _clamp(a, node):
    out = a[0]
    lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
    hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    if lo is not None:
        out = f"tl.maximum({out}, {a[1]})"
    if hi is not None:
        out = f"tl.minimum({out}, {a[2]})"
    return out


def _to_copy(a, node):
    dtype = node.kwargs.get("dtype")
    if dtype is None:
        return a[0]
    return f"({a[0]}).to({compute_dtype(dtype)})"


def _where(a, node):
    cond = node.args[0]
    if isinstance(cond, torch.fx.Node) and cond.meta["val"].dtype is not torch.bool:
        return f"tl.where({a[0]} != 0, {a[1]}, {a[2]})"  # Triton's where takes booleans only
    return f"tl.where({a[0]}, {a[1]}, {a[2]})"


def _not(a, node):
    return f"({a[0]} == 0)" if node.meta["val"].dtype is torch.bool else f"(~{a[0]})"


PRINTERS = {
    aten.add: _add,
    aten.sub: _sub,
    aten.mul: _binary("({} * {})"),
    aten.div: _div,
    aten.floor_divide: lambda a, node: floor_div_code(a[0], positive_int_divisor(node)),
    aten.remainder: lambda a, node: python_mod_code(a[0], positive_int_divisor(node)),
    aten.neg: _unary("(-{})"),
    aten.reciprocal: _unary("(1.0 / {})"),
    aten.exp: _unary("tl.exp({})"),
    aten.exp2: _unary("tl.exp2({})"),
    aten.log: _unary("tl.log({})"),
    aten.log2: _unary("tl.log2({})"),
    aten.sqrt: _unary("tl.sqrt({})"),
    aten.rsqrt: _unary("tl.rsqrt({})"),
    aten.sigmoid: _unary("_fx_sigmoid({})"),
    aten.tanh: _unary("_fx_tanh({})"),
    aten.relu: _unary("tl.maximum({}, 0.0)"),
    aten.abs: _unary("tl.abs({})"),
    aten.sin: _unary("tl.sin({})"),
    aten.cos: _unary("tl.cos({})"),
    aten.erf: _unary("tl.math.erf({})"),
    aten.floor: _unary("tl.floor({})"),
    aten.ceil: _unary("tl.ceil({})"),
    aten.maximum: _binary("tl.maximum({}, {}, propagate_nan=tl.PropagateNan.ALL)"),
    aten.minimum: _binary("tl.minimum({}, {}, propagate_nan=tl.PropagateNan.ALL)"),
    aten.pow: _pow,
    aten.clamp: _clamp,
    aten._to_copy: _to_copy,
    aten.where: _where,
    aten.eq: _binary("({} == {})"),
    aten.ne: _binary("({} != {})"),
    aten.lt: _binary("({} < {})"),
    aten.le: _binary("({} <= {})"),
    aten.gt: _binary("({} > {})"),
    aten.ge: _binary("({} >= {})"),
    aten.logical_and: _binary("(({} != 0) & ({} != 0))"),
    aten.logical_or: _binary("(({} != 0) | ({} != 0))"),
    aten.logical_not: _not,
    aten.bitwise_and: _binary("({} & {})"),
    aten.bitwise_or: _binary("({} | {})"),
    aten.bitwise_xor: _binary("({} ^ {})"),
    aten.bitwise_not: _not,
    aten.clone: _unary("{}"),
    aten.alias: _unary("{}"),
}

# Helper functions a generated module defines when its kernel calls them: name → source.
# GPU_HELPERS replace them on GPUs with CUDA's libdevice or the special-function unit's
# instructions (same accuracy, fewer instructions: no IEEE division, no range fix-ups); the
# interpreter has neither.
GPU_HELPERS = {
    "_fx_tanh": '''
@triton.jit
def _fx_tanh(x):
    return libdevice.tanh(x.to(tl.float32))
''',
    "_fx_sigmoid": '''
@triton.jit
def _fx_sigmoid(x):
    # 1 / (1 + 2^(-x·log₂e)) with the special-function unit's exp2 and reciprocal (within 2 and
    # 1 ulp), flushing subnormals to zero: where 2^(-x·log₂e) is subnormal, 1 + it rounds to 1
    # anyway; where it overflows (x < -88), 1/inf = 0 stands for a sigmoid below 2^-126.
    e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x.to(tl.float32) * -1.4426950408889634],
                                  dtype=tl.float32, is_pure=True, pack=1)
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [1.0 + e],
                                     dtype=tl.float32, is_pure=True, pack=1)
''',
}
HELPERS = {
    "_fx_sigmoid": '''
@triton.jit
def _fx_sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x.to(tl.float32)))
''',
    "_fx_tanh": '''
@triton.jit
def _fx_tanh(x):
    # tanh(x) = sign(x)·(1 - e)/(1 + e), e = exp(-2|x|); below |x| = 1/4 the Taylor series
    # (to x^11, remainder < 1e-9 relative) replaces 1 - e, which would cancel.
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    big = (1.0 - e) / (1.0 + e)
    x2 = x * x
    poly = -1382.0 / 155925.0
    poly = 62.0 / 2835.0 + x2 * poly
    poly = -17.0 / 315.0 + x2 * poly
    poly = 2.0 / 15.0 + x2 * poly
    poly = -1.0 / 3.0 + x2 * poly
    small = ax * (1.0 + x2 * poly)
    t = tl.where(ax < 0.25, small, big)
    return tl.where(x < 0, -t, t)
''',
    "_fx_round_bf16": """
@triton.jit
def _fx_round_bf16(x):
    # x rounded to bfloat16 (to nearest, ties to even) and held in fp32; Triton's interpreter
    # truncates its own bf16 conversions. A carry past the 16 low bits rounds up; inf and NaN stay.
    bits = x.to(tl.uint32, bitcast=True)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.to(tl.float32, bitcast=True)
""",
}
