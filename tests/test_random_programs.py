"""Random attention programs from a grammar: ``optimize()`` matches eager, fused or not.

A program is drawn as a plain spec and turned into ordinary PyTorch code: a layout
(``[B, H, S, D]`` or ``[B, S, H, D]`` transposed inside), a GQA ratio, sizes including 1 and
sizes that are not multiples of the 16-wide interpreter tile, a score DAG of supported ops
(scales, tensor biases with random broadcasting, ALiBi-style distance biases, tanh
soft-capping, index-expression masks, boolean tensor masks), a normalization (softmax, a hand-written stable softmax, quiet
softmax, sigmoid, ReLU / N, a row-sum normalization), optional strided inputs and an
optional gated or transposed epilogue. Every program is checked against a float64
reference within eager's own error (helpers.assert_accurate), whatever fxflash decided.

CI runs a bounded number of examples; ``FXFLASH_LONG=1`` runs the long profile.
"""
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import fxflash
from helpers import assert_accurate

EXAMPLES = 400 if os.environ.get("FXFLASH_LONG") else 20
SIZES = st.sampled_from([1, 5, 16, 17, 33])
HEAD_DIMS = st.sampled_from([1, 8, 16, 24])
BROADCASTS = st.lists(st.booleans(), min_size=4, max_size=4)  # which of [B, H, M, N] the tensor keeps

SCORE_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("scale"), st.sampled_from([0.5, -1.0, 0.125, 2.0])),
        st.tuples(st.just("bias"), BROADCASTS),
        st.tuples(st.just("distance_bias"), st.sampled_from([0.25, -0.5])),  # ALiBi's slope·(j − i)
        st.tuples(st.just("softcap"), st.sampled_from([5.0, 30.0])),
        st.tuples(st.just("index_mask"), st.sampled_from(["causal", "window", "prefix", "band"]), st.integers(0, 6)),
        st.tuples(st.just("tensor_mask"), BROADCASTS),
    ),
    max_size=3,
)
NORMALIZATIONS = st.sampled_from(["softmax", "manual", "softmax_one", "softmax_one_exp2", "sigmoid", "relu",
                                  "row_sum"])
EPILOGUES = st.sampled_from([None, "gate", "transpose_gate", "add"])

PROGRAMS = st.fixed_dictionaries({
    "B": st.sampled_from([1, 2]),
    "Hkv": st.sampled_from([1, 2]),
    "group": st.sampled_from([1, 2]),
    "M": SIZES,
    "N": SIZES,
    "D": HEAD_DIMS,
    "Dv": HEAD_DIMS,
    "layout": st.sampled_from(["bhsd", "bshd"]),
    "strided_q": st.booleans(),
    "dtype": st.sampled_from([torch.float32, torch.float16]),
    "ops": SCORE_OPS,
    "norm": NORMALIZATIONS,
    "epilogue": EPILOGUES,
    "seed": st.integers(0, 2**16),
})


def _index_mask(kind: str, c: int, m: int, n: int, device):
    i = torch.arange(m, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    return {
        "causal": j <= i + c,
        "window": (j <= i) & (i - j < c + 1),
        "prefix": (j <= i) | (j < c),
        "band": (i - j).abs() <= c,
    }[kind]


def _normalize(s: torch.Tensor, norm: str) -> torch.Tensor:
    if norm == "softmax":
        return torch.softmax(s, dim=-1)
    if norm == "manual":
        e = (s - s.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)
    if norm in ("softmax_one", "softmax_one_exp2"):
        exp = torch.exp if norm == "softmax_one" else torch.exp2
        m = s.amax(-1, keepdim=True).clamp(min=0)
        e = exp(s - m)
        return e / (exp(-m) + e.sum(-1, keepdim=True))
    if norm == "sigmoid":
        return torch.sigmoid(s)
    if norm == "relu":
        return torch.relu(s) / s.size(-1)
    return s / s.abs().sum(-1, keepdim=True).clamp(min=1)


def make_program(spec):
    """(the program, its inputs) for one drawn spec; the program is plain PyTorch."""
    g = torch.Generator().manual_seed(spec["seed"])
    B, Hkv, M, N, D, Dv, dtype = (spec[k] for k in ("B", "Hkv", "M", "N", "D", "Dv", "dtype"))
    H = Hkv * spec["group"]
    bshd = spec["layout"] == "bshd"

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    def qkv(heads, length, width):
        return rnd(B, length, heads, width) if bshd else rnd(B, heads, length, width)

    q, k, v = qkv(H, M, D), qkv(Hkv, N, D), qkv(Hkv, N, Dv)
    if spec["strided_q"]:
        q = torch.cat([q, q], dim=-1)[..., ::2]  # same values, stride 2 along D
    tensors = []  # extra inputs: biases and masks in op order, then the gate
    full = (B, H, M, N)
    for op in spec["ops"]:
        if op[0] == "bias":
            tensors.append(rnd(*[s if keep else 1 for s, keep in zip(full, op[1])]))
        elif op[0] == "tensor_mask":
            shape = [s if keep else 1 for s, keep in zip(full, op[1])]
            tensors.append(torch.rand(*shape, generator=g) > 0.25)
    out_shape = (B, M, H, Dv) if bshd else (B, H, M, Dv)
    epilogue = spec["epilogue"]
    if epilogue in ("gate", "add"):
        tensors.append(rnd(*out_shape))
    elif epilogue == "transpose_gate":
        tensors.append(rnd(*((B, H, M, Dv) if bshd else (B, M, H, Dv))))

    def program(q, k, v, *extra):
        extra = list(extra)
        if bshd:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if spec["group"] > 1:
            k = k.repeat_interleave(spec["group"], dim=1)
            v = v.repeat_interleave(spec["group"], dim=1)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        for op in spec["ops"]:
            if op[0] == "scale":
                s = s * op[1]
            elif op[0] == "bias":
                s = s + extra.pop(0)
            elif op[0] == "distance_bias":
                j, i = torch.arange(s.size(-1), device=s.device), torch.arange(s.size(-2), device=s.device)
                s = s + (op[1] * (j[None, :] - i[:, None])).to(s.dtype)
            elif op[0] == "softcap":
                s = op[1] * torch.tanh(s / op[1])
            elif op[0] == "index_mask":
                keep = _index_mask(op[1], op[2], s.size(-2), s.size(-1), s.device)
                s = s.masked_fill(~keep, float("-inf"))
            else:
                s = s.masked_fill(~extra.pop(0), float("-inf"))
        o = _normalize(s, spec["norm"]) @ v
        if bshd:
            o = o.transpose(1, 2)
        if epilogue == "gate":
            o = o * torch.sigmoid(extra.pop(0))
        elif epilogue == "transpose_gate":
            o = o.transpose(1, 2) * torch.sigmoid(extra.pop(0))
        elif epilogue == "add":
            o = o + extra.pop(0)
        return o

    return program, (q, k, v, *tensors)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("FXFLASH_LONG"),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(PROGRAMS)
def test_random_program_matches_eager(spec):
    program, args = make_program(spec)
    for region in fxflash.explain(program, *args).regions:
        event("fused" if region.fused else f"not fused: {region.reason.split(':')[0]}")
    optimized = fxflash.optimize(program)
    assert_accurate(program, args, optimized(*args))


def test_the_grammar_produces_programs_that_fuse():
    """The generator is not vacuous: a plain drawn program fuses into one kernel."""
    spec = dict(B=1, Hkv=2, group=2, M=17, N=33, D=16, Dv=8, layout="bshd", strided_q=True,
                dtype=torch.float32, ops=[("bias", [False, True, True, True]), ("index_mask", "window", 3)],
                norm="softmax_one", epilogue="transpose_gate", seed=1)
    program, args = make_program(spec)
    report = fxflash.explain(program, *args)
    assert [r.fused for r in report.regions] == [True], [r.reason for r in report.regions]
    assert_accurate(program, args, fxflash.optimize(program)(*args))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("FXFLASH_LONG"),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(PROGRAMS)
def test_random_programs_get_a_gluon_kernel_or_a_reason(spec):
    """In bf16 with head dim 64 (what the Gluon kernel takes), every fused region is either
    printed as a Gluon kernel or refused by a named rule — the printer never fails."""
    from fxflash.codegen.gluon import PRINTER_FAILED, gluon_api

    if gluon_api() is None:
        pytest.skip("this Triton has no Gluon Hopper API")
    # with the output as the matmul leaves it (no gate, no transpose), which the Gluon kernel needs
    program, args = make_program({**spec, "dtype": torch.bfloat16, "D": 64, "Dv": 64, "layout": "bhsd",
                                  "epilogue": None})
    for region in fxflash.explain(program, *args).regions:
        if region.fused:
            line = region.steps[-1]
            assert line.startswith("Gluon kernel (Hopper): ") and PRINTER_FAILED not in line, line
            assert ("printed" in line) == bool(region.gluon_source)
            event("Gluon kernel" if region.gluon_source else line.split(", ", 1)[-1].split(" (")[0])
