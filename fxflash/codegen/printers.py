"""Elementwise printers: one rule per ATen op, printing Triton from argument expressions.

Floating values are computed in fp32 inside kernels whatever their storage dtype (as
Inductor does), booleans as ``int1``, integers in their own width. Every printer takes the
argument expressions (strings) and the FX node, and returns an expression.
"""
from __future__ import annotations

import math

import torch

from ..analysis.ops import packet

aten = torch.ops.aten


class Unprintable(Exception):
    """No printer for this op (or these arguments)."""


class Namespace:
    """How a backend's kernels name the tile language's functions and types, for the printers
    (``f"{L.exp}({x})"``): ``TL``, Triton's ``tl`` (the default), or the Gluon kernel's
    (codegen/gluon.py), whose names are ``allowed`` ones only — any other raises Unprintable while
    the kernel is printed. ``renamed``: a name spelled otherwise (Triton's ``erf`` is ``tl.math.erf``)."""

    def __init__(self, prefix: str, allowed=None, renamed=None, backend: str = "Triton"):
        self.prefix, self.allowed, self.renamed, self.backend = prefix, allowed, dict(renamed or {}), backend

    def __getattr__(self, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self.renamed:
            return self.renamed[name]
        if self.allowed is not None and name not in self.allowed:
            raise Unprintable(f"tl.{name} has no {self.backend} form in fxflash's {self.backend} kernel")
        return f"{self.prefix}.{name}"


TL = Namespace("tl", renamed={"erf": "tl.math.erf"})


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


def dtype_name(dtype: torch.dtype, L: Namespace = TL) -> str:
    """``dtype`` as a kernel names it."""
    if dtype not in TRITON_DTYPES:
        raise Unprintable(f"dtype {dtype}")
    return getattr(L, TRITON_DTYPES[dtype].removeprefix("tl."))


def compute_dtype(dtype: torch.dtype, L: Namespace = TL) -> str:
    """The type a value of ``dtype`` is held in inside a kernel."""
    if dtype.is_floating_point:
        if dtype is torch.float64:
            raise Unprintable("float64 values are not computed in fused kernels")
        return L.float32
    return dtype_name(dtype, L)


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


class Call(str):
    """Printed code that calls a helper function the module defines (``HELPERS``): the code, and
    the helper's name, which the printer records (``_Printer.helpers``)."""

    def __new__(cls, helper: str, args):
        code = super().__new__(cls, f"{helper}({', '.join(args)})")
        code.helper = helper
        return code


def _helper(name: str, arity: int = 1):
    return lambda a, node, L=TL: Call(name, a[:arity])


def _binary(fmt):
    return lambda a, node, L=TL: fmt.format(*a[:2], L=L)


def _unary(fmt):
    return lambda a, node, L=TL: fmt.format(a[0], L=L)


def _add(a, node, L=TL):
    alpha = node.kwargs.get("alpha", 1)
    return f"({a[0]} + {a[1]})" if alpha == 1 else f"({a[0]} + {a[1]} * {literal(alpha)})"


def _sub(a, node, L=TL):
    alpha = node.kwargs.get("alpha", 1)
    return f"({a[0]} - {a[1]})" if alpha == 1 else f"({a[0]} - {a[1]} * {literal(alpha)})"


def _div(a, node, L=TL):
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


def _pow(a, node, L=TL):
    exponent = node.args[1]
    if isinstance(exponent, (int, float)) and float(exponent).is_integer() and 0 <= exponent <= 8:
        n = int(exponent)
        return "1.0" if n == 0 else "(" + " * ".join([a[0]] * n) + ")"
    if exponent == 0.5:
        return f"{L.sqrt}({a[0]})"
    if exponent == -0.5:
        return f"{L.rsqrt}({a[0]})"
    raise Unprintable(f"pow by {exponent!r}")


def _clamp(a, node, L=TL):
    out = a[0]
    lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
    hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    if lo is not None:
        out = f"{L.maximum}({out}, {a[1]})"
    if hi is not None:
        out = f"{L.minimum}({out}, {a[2]})"
    return out


def _to_copy(a, node, L=TL):
    dtype = node.kwargs.get("dtype")
    if dtype is None:
        return a[0]
    return f"({a[0]}).to({compute_dtype(dtype, L)})"


def _where(a, node, L=TL):
    cond = node.args[0]
    if isinstance(cond, torch.fx.Node) and cond.meta["val"].dtype is not torch.bool:
        return f"{L.where}({a[0]} != 0, {a[1]}, {a[2]})"  # Triton's where takes booleans only
    return f"{L.where}({a[0]}, {a[1]}, {a[2]})"


def _not(a, node, L=TL):
    return f"({a[0]} == 0)" if node.meta["val"].dtype is torch.bool else f"(~{a[0]})"


def _floating(node) -> bool:
    val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    return val is None or val.dtype.is_floating_point


def _sign(a, node, L=TL):
    # 0 and NaN are their own sign
    return f"{L.where}({a[0]} > 0, 1, {L.where}({a[0]} < 0, -1, {a[0]}))"


def _trunc(a, node, L=TL):
    return f"{L.where}({a[0]} < 0, {L.ceil}({a[0]}), {L.floor}({a[0]}))" if _floating(node) else a[0]


def _round(a, node, L=TL):
    decimals = node.kwargs.get("decimals", node.args[1] if len(node.args) > 1 else 0)
    if decimals != 0:
        raise Unprintable(f"round to {decimals!r} decimals")
    return Call("_fx_rint", a[:1]) if _floating(node) else a[0]


def _fmod(a, node, L=TL):
    """``x − c·trunc(x / c)`` of integers by a positive literal (the remainder with the sign of x). A
    float fmod is exact in eager and would not be here: it stays eager's."""
    c = positive_int_divisor(node)
    r = python_mod_code(a[0], c)
    return f"{L.where}(({a[0]} < 0) & ({r} != 0), {r} - {c}, {r})"


PRINTERS = {
    aten.add: _add,
    aten.sub: _sub,
    aten.mul: _binary("({} * {})"),
    aten.div: _div,
    aten.floor_divide: lambda a, node, L=TL: floor_div_code(a[0], positive_int_divisor(node)),
    aten.remainder: lambda a, node, L=TL: python_mod_code(a[0], positive_int_divisor(node)),
    aten.neg: _unary("(-{})"),
    aten.reciprocal: _unary("(1.0 / {})"),
    aten.exp: _unary("{L.exp}({})"),
    aten.exp2: _unary("{L.exp2}({})"),
    aten.log: _unary("{L.log}({})"),
    aten.log2: _unary("{L.log2}({})"),
    aten.sqrt: _unary("{L.sqrt}({})"),
    aten.rsqrt: _unary("{L.rsqrt}({})"),
    aten.sigmoid: _helper("_fx_sigmoid"),
    aten.tanh: _helper("_fx_tanh"),
    aten.relu: _unary("{L.maximum}({}, 0.0)"),
    aten.abs: _unary("{L.abs}({})"),
    aten.sin: _unary("{L.sin}({})"),
    aten.cos: _unary("{L.cos}({})"),
    aten.erf: _unary("{L.erf}({})"),
    aten.floor: _unary("{L.floor}({})"),
    aten.ceil: _unary("{L.ceil}({})"),
    aten.maximum: _binary("{L.maximum}({}, {}, propagate_nan={L.PropagateNan}.ALL)"),
    aten.minimum: _binary("{L.minimum}({}, {}, propagate_nan={L.PropagateNan}.ALL)"),
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
    aten.isnan: lambda a, node, L=TL: f"({a[0]} != {a[0]})",
    aten.isinf: _unary("({L.abs}({}) == float('inf'))"),
    aten.isposinf: _unary("({} == float('inf'))"),
    aten.isneginf: _unary("({} == float('-inf'))"),
    aten.logical_xor: _binary("(({} != 0) ^ ({} != 0))"),
    aten.sign: _sign,
    aten.trunc: _trunc,
    aten.round: _round,
    aten.fmod: _fmod,
    aten.log10: _unary("({L.log}({}) * 0.4342944819032518)"),
    aten.log1p: _helper("_fx_log1p"),
    aten.expm1: _helper("_fx_expm1"),
    aten.sinh: _helper("_fx_sinh"),
    aten.cosh: _helper("_fx_cosh"),
    aten.tan: lambda a, node, L=TL: f"({L.sin}({a[0]}) / {L.cos}({a[0]}))",
    aten.atan: _helper("_fx_atan"),
    aten.atan2: _helper("_fx_atan2", 2),
    aten.asin: _helper("_fx_asin"),
    aten.acos: _helper("_fx_acos"),
    aten.asinh: _helper("_fx_asinh"),
    aten.acosh: _helper("_fx_acosh"),
    aten.atanh: _helper("_fx_atanh"),
}


def refusal(nodes, L: Namespace = TL) -> str | None:
    """Why one of the elementwise ``nodes`` cannot be printed (its op has no printer, or its printer
    refuses these arguments: a rounding mode, a float64 cast, a function ``L``'s backend lacks), or
    None: decided before a kernel is printed, by running each op's printer once on placeholder
    argument codes (a printer decides from the node, never from its arguments' codes)."""
    for node in nodes:
        p = packet(node.target)
        if p not in PRINTERS:
            return f"no printer for {node.target}"
        try:
            PRINTERS[p]([f"a{i}" for i in range(len(node.args) + len(node.kwargs))], node, L)
        except Unprintable as exc:
            return str(exc)
    return None


# Helper functions a generated module defines when its kernel calls them: name → source.
# GPU_HELPERS replace them on GPUs with CUDA's libdevice or the special-function unit's
# instructions (same accuracy, fewer instructions: no IEEE division, no range fix-ups); the
# interpreter has neither.
_GPU_HELPER_TEMPLATES = {
    "_fx_tanh": '''
@{jit}
def _fx_tanh(x):
    return libdevice.tanh(x.to({ns}.float32))
''',
    "_fx_sigmoid": '''
@{jit}
def _fx_sigmoid(x):
    # 1 / (1 + 2^(-x·log₂e)) with the special-function unit's exp2 and reciprocal (within 2 and
    # 1 ulp), flushing subnormals to zero: where 2^(-x·log₂e) is subnormal, 1 + it rounds to 1
    # anyway; where it overflows (x < -88), 1/inf = 0 stands for a sigmoid below 2^-126.
    e = {ns}.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x.to({ns}.float32) * -1.4426950408889634],
                                  dtype={ns}.float32, is_pure=True, pack=1)
    return {ns}.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [1.0 + e],
                                     dtype={ns}.float32, is_pure=True, pack=1)
''',
}


def gpu_helpers(ns: str = "tl", jit: str = "triton.jit") -> dict:
    """GPU_HELPERS for a backend: its language's prefix ``ns`` and its decorator ``jit`` (the Gluon
    kernel's: ``gl``, ``gluon.jit``)."""
    return {name: src.format(ns=ns, jit=jit) for name, src in _GPU_HELPER_TEMPLATES.items()}


GPU_HELPERS = gpu_helpers()
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

# The functions of the pointwise math ops without a tl form, in fp32, for the interpreter and GPUs
# alike: each avoids the cancellation and the overflow of its textbook formula (a value eager keeps
# finite stays finite: sinh and cosh of 89 are 2.2e38).
MATH_HELPERS = {
    "_fx_signbit": """
@triton.jit
def _fx_signbit(x):
    # set for -0.0 and every negative value, as x < 0 is not for -0.0
    return (x.to(tl.float32).to(tl.uint32, bitcast=True) >> 31) == 1
""",
    "_fx_rint": """
@triton.jit
def _fx_rint(x):
    # to nearest, ties to even: adding and subtracting 2^23 rounds the fraction away in fp32
    # arithmetic (round to nearest even); from 2^23 on every fp32 is an integer
    a = tl.abs(x)
    r = (a + 8388608.0) - 8388608.0
    r = tl.where(a < 8388608.0, r, a)
    # the sign bit: -0.0 and -0.4 round to -0.0
    return tl.where(_fx_signbit(x), -r, r)
""",
    "_fx_log1p": """
@triton.jit
def _fx_log1p(x):
    # log(1 + x) = log(u)·x/(u − 1) with u = 1 + x rounded (Goldberg): exact to a few ulp for small x
    # (each branch is computed on operands it is defined for: nothing divides by zero)
    u = 1.0 + x
    d = u - 1.0
    ok = (d != 0.0) & (u > 0.0) & (u != float('inf'))
    r = tl.log(tl.where(ok, u, 2.0)) * (x / tl.where(ok, d, 1.0))
    r = tl.where(ok, r, tl.where(u == 0.0, float('-inf'), tl.where(u < 0.0, float('nan'), tl.where(d == 0.0, x, u))))
    return tl.where(x != x, x, r)
""",
    "_fx_expm1": """
@triton.jit
def _fx_expm1(x):
    # exp(x) − 1 = (u − 1)·x/log(u) with u = exp(x) rounded (Kahan)
    u = tl.exp(x)
    ok = (u != 1.0) & (u != 0.0) & (u != float('inf'))
    r = (u - 1.0) * (x / tl.log(tl.where(ok, u, 2.0)))
    return tl.where(ok, r, tl.where(u == 1.0, x, u - 1.0))
""",
    "_fx_sinh": """
@triton.jit
def _fx_sinh(x):
    # (E + E/(E + 1))/2 with E = expm1(|x|); beyond 88, e^|x|/2 as h·(h/2), h = e^(|x|/2), which
    # overflows only where e^|x|/2 does (exp(|x| − ln 2) would round its argument: 12 ulp at 88)
    a = tl.abs(x)
    small = a < 88.0
    e = _fx_expm1(tl.where(small, a, 0.0))
    h = tl.exp(0.5 * a)
    s = tl.where(small, 0.5 * (e + e / (e + 1.0)), h * (0.5 * h))
    return tl.where(_fx_signbit(x), -s, s)
""",
    "_fx_cosh": """
@triton.jit
def _fx_cosh(x):
    # E + 1/(4E) with E = e^|x|/2 = h·(h/2), h = e^(|x|/2): finite wherever cosh is
    h = tl.exp(0.5 * tl.abs(x))
    e = h * (0.5 * h)
    return e + 0.25 / e
""",
    "_fx_atan": """
@triton.jit
def _fx_atan(x):
    # Cephes' atanf: |x| reduced to [0, tan(pi/8)] by atan(a) = pi/2 − atan(1/a) above tan(3pi/8)
    # and pi/4 + atan((a − 1)/(a + 1)) above tan(pi/8), then an odd polynomial
    a = tl.abs(x)
    big = a > 2.414213562373095
    mid = (a > 0.4142135623730950) & (a <= 2.414213562373095)
    t = tl.where(big, -1.0 / tl.where(big, a, 1.0), tl.where(mid, (a - 1.0) / (a + 1.0), a))
    y0 = tl.where(big, 1.5707963267948966, tl.where(mid, 0.7853981633974483, 0.0))
    z = t * t
    p = ((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1
    r = y0 + (p * z * t + t)
    r = tl.where(a == float('inf'), 1.5707963267948966, r)
    return tl.where(_fx_signbit(x), -r, r)
""",
    "_fx_atan2": """
@triton.jit
def _fx_atan2(y, x):
    # the angle of min/max of |y|, |x| (pi/4 where both are infinite), moved to its octant; the
    # signs of zeros count (atan2(0, -0) = pi, atan2(-0, x) = -0)
    ay = tl.abs(y)
    ax = tl.abs(x)
    hi = tl.maximum(ax, ay)
    lo = tl.minimum(ax, ay)
    both_inf = (ax == float('inf')) & (ay == float('inf'))
    q = tl.where(hi == 0.0, 0.0, tl.where(both_inf, 1.0, lo / tl.where((hi == 0.0) | both_inf, 1.0, hi)))
    t = _fx_atan(q)
    t = tl.where(ay > ax, 1.5707963267948966 - t, t)
    x_neg = _fx_signbit(x)
    t = tl.where(x_neg, 3.141592653589793 - t, t)
    y_neg = _fx_signbit(y)
    t = tl.where(y_neg, -t, t)
    return tl.where((x != x) | (y != y), x + y, t)
""",
    "_fx_asin": """
@triton.jit
def _fx_asin(x):
    return _fx_atan2(x, tl.sqrt((1.0 - x) * (1.0 + x)))
""",
    "_fx_acos": """
@triton.jit
def _fx_acos(x):
    return _fx_atan2(tl.sqrt((1.0 - x) * (1.0 + x)), x)
""",
    "_fx_asinh": """
@triton.jit
def _fx_asinh(x):
    # log1p(a + a²/(1 + sqrt(1 + a²))) for a = |x|; beyond 2^28, log(a) + ln 2 (a² would overflow)
    a = tl.abs(x)
    small = a < 268435456.0
    b = tl.where(small, a, 0.0)
    r = tl.where(small, _fx_log1p(b + b * b / (1.0 + tl.sqrt(1.0 + b * b))),
                 tl.log(tl.where(small, 1.0, a)) + 0.6931471805599453)
    return tl.where(_fx_signbit(x), -r, r)
""",
    "_fx_acosh": """
@triton.jit
def _fx_acosh(x):
    # log1p(t + sqrt(2t + t²)) for t = x − 1; beyond 2^28, log(x) + ln 2; NaN below 1
    small = x < 268435456.0
    u = tl.where(small & (x >= 1.0), x - 1.0, 0.0)
    r = tl.where(small, _fx_log1p(u + tl.sqrt(2.0 * u + u * u)), tl.log(tl.where(small, 1.0, x)) + 0.6931471805599453)
    return tl.where((x < 1.0) | (x != x), float('nan'), r)
""",
    "_fx_atanh": """
@triton.jit
def _fx_atanh(x):
    # sign(x)·0.5·log1p(2a/(1 − a)), a = |x| (1 − a is exact near 1); ±inf at ±1, NaN beyond
    a = tl.abs(x)
    inside = a < 1.0
    r = 0.5 * _fx_log1p(2.0 * a / (1.0 - tl.where(inside, a, 0.0)))
    r = tl.where(inside, r, tl.where(a == 1.0, float('inf'), float('nan')))
    return tl.where(_fx_signbit(x), -r, r)
""",
}
HELPERS.update(MATH_HELPERS)
# a helper may call another: each one's callees, defined before it in the module
HELPER_CALLS = {"_fx_rint": ("_fx_signbit",), "_fx_sinh": ("_fx_signbit", "_fx_expm1"),
                "_fx_atan": ("_fx_signbit",), "_fx_atan2": ("_fx_signbit", "_fx_atan"),
                "_fx_asin": ("_fx_signbit", "_fx_atan", "_fx_atan2"), "_fx_acos": ("_fx_signbit", "_fx_atan", "_fx_atan2"),
                "_fx_asinh": ("_fx_signbit", "_fx_log1p"), "_fx_acosh": ("_fx_log1p",),
                "_fx_atanh": ("_fx_signbit", "_fx_log1p")}
