"""Every pointwise op of core ATen prints in a kernel (or is decomposed into ops that do), and the
math helpers that have no tl form are right at the edges of their domains."""
import math

import pytest
import torch

import fxflash
from fxflash.capture.decompositions import decomposition_table
from fxflash.codegen.printers import HELPER_CALLS, HELPERS, PRINTERS
from fxflash.runtime.cache import load_kernel
from fxflash.variants import VARIANTS, Shape
from helpers import assert_accurate, assert_fused

aten = torch.ops.aten


def _core_pointwise_ops() -> list:
    """PyTorch's own list: every overload tagged both ``core`` and ``pointwise``."""
    ops = []
    for name in dir(aten):
        packet = getattr(aten, name, None)
        if isinstance(packet, torch._ops.OpOverloadPacket):
            ops += [op for op in (getattr(packet, o) for o in packet.overloads())
                    if torch.Tag.pointwise in op.tags and torch.Tag.core in op.tags]
    return ops


@pytest.mark.fusion_independent
def test_every_core_pointwise_op_has_a_printer_or_a_decomposition():
    ops = _core_pointwise_ops()
    assert len(ops) > 50  # the tags are read
    decomposed = decomposition_table()
    missing = sorted({str(op.overloadpacket) for op in ops if op.overloadpacket not in PRINTERS and op not in decomposed})
    assert not missing, missing


# op → (the op on a score tensor x, where x keeps the op in its domain)
OPS = {
    "log1p": lambda x: torch.log1p(x.abs()),
    "expm1": lambda x: torch.expm1(x * 0.1),
    "log10": lambda x: torch.log10(x.abs() + 1e-3),
    "sinh": torch.sinh,
    "cosh": lambda x: torch.cosh(x * 0.5),
    "tan": lambda x: torch.tan(x * 0.1),
    "atan": torch.atan,
    "atan2": lambda x: torch.atan2(x - 0.3, x * 0.7 + 0.2),
    "asin": lambda x: torch.asin(torch.tanh(x)),
    "acos": lambda x: torch.acos(torch.tanh(x)),
    "asinh": torch.asinh,
    "acosh": lambda x: torch.acosh(x.abs() + 1),
    "atanh": lambda x: torch.atanh(torch.tanh(x) * 0.99),
    "trunc": lambda x: torch.trunc(x * 3),
    "round": lambda x: torch.round(x * 3),
    "sign": lambda x: torch.sign(x) * x,
    "isnan_isinf": lambda x: torch.where(torch.isnan(x) | torch.isinf(x), 0.0, x),
    "logical_xor": lambda x: torch.where(torch.logical_xor(x > 0, x > 1), x, -x),
    "nan_to_num": lambda x: torch.nan_to_num(torch.where(x > 1, float("nan"), x)),  # not core: decomposed
}


@pytest.mark.parametrize("name", OPS)
def test_a_math_op_in_the_scores_fuses_and_is_accurate(name):
    op = OPS[name]

    def attention(q, k, v):
        return torch.softmax(op(q @ k.transpose(-1, -2) * 0.5), dim=-1) @ v

    args = VARIANTS["vanilla"].inputs(Shape(B=2, H=2, Hkv=2, M=9, N=13, D=8, Dv=8))
    fast = fxflash.optimize(attention)
    assert_fused(fast.report(*args))
    assert_accurate(attention, args, fast(*args))


# values at the edges: zeros of both signs, tiny and huge magnitudes, the overflow thresholds of
# exp, ties of rounding, the domain limits, infinities and NaN
EDGES = [0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 0.25, -0.5, 0.5, 1.5, 2.5, -2.5, 0.99999994, -0.99999994, 1.0, -1.0,
         0.49999997, 88.0, 88.7, 89.0, 89.5, -89.0, 1e20, -1e20, 3e38, math.inf, -math.inf, math.nan, 8388609.0]
UNARY = {"_fx_rint": torch.round, "_fx_log1p": torch.log1p, "_fx_expm1": torch.expm1, "_fx_sinh": torch.sinh,
         "_fx_cosh": torch.cosh, "_fx_atan": torch.atan, "_fx_asin": torch.asin, "_fx_acos": torch.acos,
         "_fx_asinh": torch.asinh, "_fx_acosh": torch.acosh, "_fx_atanh": torch.atanh}


def _helper_kernel(name: str, arity: int):
    names = [*HELPER_CALLS.get(name, ()), name]
    args = ", ".join(f"tl.load(x{i}_ptr + i)" for i in range(arity))
    source = "\n".join(["import triton", "import triton.language as tl",
                        *(HELPERS[n] for n in dict.fromkeys(names)), f"""
@triton.jit
def probe({', '.join(f'x{i}_ptr' for i in range(arity))}, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, {name}({args}))
"""])
    return load_kernel(source, "probe")


def _check(out, ref64, eager):
    """Within 4 ulp (fp32) of float64, or as eager where eager is off by more; inf, NaN and the
    sign of zero as float64 gives them, rounded to fp32."""
    expected = ref64.to(torch.float32)
    assert torch.equal(torch.isnan(out), torch.isnan(expected)), (out, expected)
    same = torch.isfinite(expected)
    assert torch.equal(out[~same & ~torch.isnan(expected)], expected[~same & ~torch.isnan(expected)])
    ulp = torch.finfo(torch.float32).eps * expected[same].abs().clamp(min=torch.finfo(torch.float32).tiny)
    error = (out[same].double() - ref64[same]).abs()
    assert (error <= torch.maximum(4 * ulp.double(), 2 * (eager[same].double() - ref64[same]).abs())).all(), \
        (out[same], expected[same])
    zeros = expected == 0
    assert torch.equal(torch.signbit(out[zeros]), torch.signbit(expected[zeros]))


@pytest.mark.fusion_independent
@pytest.mark.parametrize("name", UNARY)
def test_a_math_helper_at_the_edges_of_its_domain(name):
    x = torch.tensor(EDGES + [-e for e in EDGES if e == e], dtype=torch.float32)
    n = 1 << (len(x) - 1).bit_length()
    x = torch.cat([x, torch.zeros(n - len(x))])
    out = torch.empty_like(x)
    _helper_kernel(name, 1)[(1,)](x, out, n)
    _check(out, UNARY[name](x.double()), UNARY[name](x))


@pytest.mark.fusion_independent
def test_atan2_in_every_quadrant_and_at_signed_zeros_and_infinities():
    values = [0.0, -0.0, 1.0, -1.0, 1e-30, -1e30, math.inf, -math.inf, math.nan, 3.0]
    y = torch.tensor([a for a in values for _ in values], dtype=torch.float32)
    x = torch.tensor([b for _ in values for b in values], dtype=torch.float32)
    n = 1 << (len(x) - 1).bit_length()
    y, x = (torch.cat([t, torch.ones(n - len(t))]) for t in (y, x))
    out = torch.empty_like(x)
    _helper_kernel("_fx_atan2", 2)[(1,)](y, x, out, n)
    _check(out, torch.atan2(y.double(), x.double()), torch.atan2(y, x))
