"""Random attention programs from a grammar: ``optimize()`` matches eager, fused or not.

A program is drawn as a plain spec and turned into ordinary PyTorch code: a layout
(``[B, H, S, D]`` or ``[B, S, H, D]`` transposed inside), a GQA ratio, sizes including 1 and
sizes that are not multiples of the 16-wide interpreter tile, a score DAG of supported ops
(scales, saturating scales, tensor biases with random broadcasting, ALiBi-style distance
biases, tanh soft-capping, index-expression masks, boolean tensor masks, masks added or filled
in at extreme finite values, a temperature or slope held in a 0-d tensor, a score scaled in
place), a normalization (softmax, a hand-written stable softmax, quiet softmax, sigmoid,
ReLU / N, a row-sum normalization, two softmaxes combined with a learned λ), optional strided
inputs, an input written in place, and an optional gated or transposed epilogue. Inputs are
fp32, fp16 or bf16 (bf16 runs right in Triton's interpreter too). Every program is checked
against a float64 reference within eager's own error (helpers.assert_accurate), whatever
fxflash decided; how many fuse is asserted by its own test.

CI runs a bounded number of examples; ``FXFLASH_LONG=1`` runs the long profile, and
``FXFLASH_EXAMPLES=N`` runs N (the GPU's run: head dims 64 and 128, ``expand``-style GQA).
"""
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import fxflash
from helpers import assert_accurate, assert_gradients_accurate

EXAMPLES = int(os.environ.get("FXFLASH_EXAMPLES", 400 if os.environ.get("FXFLASH_LONG") else 20))
# the gradients' test runs fewer: each example runs the backward kernels in the interpreter too
GRADIENT_EXAMPLES = max(1, EXAMPLES // 2)
ON_GPU = torch.cuda.is_available()
SIZES = st.sampled_from([1, 5, 16, 17, 33] + ([64, 130] if ON_GPU else []))
HEAD_DIMS = st.sampled_from([1, 8, 16, 24] + ([64, 128] if ON_GPU else []))
BROADCASTS = st.lists(st.booleans(), min_size=4, max_size=4)  # which of [B, H, M, N] the tensor keeps
# finite constants at the edge of every dtype the grammar draws (each is cast to the input dtype
# where it fits, else to that dtype's extreme of the same sign)
EXTREMES = st.sampled_from(["min", "max", -1e38, 1e38, -1e30, 1e30, -1e9])

SCORE_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("scale"), st.sampled_from([0.5, -1.0, 0.125, 2.0, 1e4])),
        st.tuples(st.just("bias"), BROADCASTS, st.booleans()),  # the last: expanded to the scores in the program
        st.tuples(st.just("extreme_mask"), BROADCASTS, EXTREMES),  # transformers' (1 − m)·finfo.min
        st.tuples(st.just("extreme_fill"), BROADCASTS, EXTREMES),  # masked_fill(~m, finite)
        st.tuples(st.just("temperature"), st.sampled_from([0.7, 3.0])),  # s / t, t a 0-d tensor input
        st.tuples(st.just("inplace_scale"), st.sampled_from([0.5, 2.0])),  # s.mul_(c)
        st.tuples(st.just("distance_bias"), st.sampled_from([0.25, -0.5])),  # ALiBi's slope·(j − i)
        st.tuples(st.just("softcap"), st.sampled_from([5.0, 30.0])),
        st.tuples(st.just("index_mask"), st.sampled_from(["causal", "window", "prefix", "band"]), st.integers(0, 6)),
        st.tuples(st.just("tensor_mask"), BROADCASTS, st.booleans()),
    ),
    max_size=3,
)
NORMALIZATIONS = st.sampled_from(["softmax", "manual", "softmax_one", "softmax_one_exp2", "sigmoid", "relu",
                                  "row_sum", "learned_lambda", "streams"])
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
    "gqa": st.sampled_from(["repeat_interleave", "expand"]),
    "strided_q": st.booleans(),
    "writes_k": st.booleans(),  # k.mul_(c) on the caller's tensor before it is read
    "dtype": st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
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


def _extreme(value, dtype) -> float:
    fi = torch.finfo(dtype)
    if value in ("min", "max"):
        return getattr(fi, value)
    return max(fi.min, min(fi.max, value))


def _normalize(s: torch.Tensor, norm: str, lam=None) -> torch.Tensor:
    if norm == "learned_lambda":  # differential attention's two maps, the second weighted by λ
        return torch.softmax(s, dim=-1) - lam * torch.softmax(s * 0.5, dim=-1)
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


def _as_drawn(t: torch.Tensor, op: tuple, s: torch.Tensor) -> torch.Tensor:
    """A bias or mask as the op draws it: as given, or expanded to the scores' shape in the program
    (a view whose broadcast axes are stride 0, as transformers' masks are)."""
    return t.expand(s.shape) if len(op) > 2 and op[2] else t


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
    tensors = []  # extra inputs: biases, masks and 0-d parameters in op order, λ, then the gate
    full = (B, H, M, N)
    for op in spec["ops"]:
        if op[0] == "bias":
            tensors.append(rnd(*[s if keep else 1 for s, keep in zip(full, op[1])]))
        elif op[0] in ("tensor_mask", "extreme_mask", "extreme_fill"):
            shape = [s if keep else 1 for s, keep in zip(full, op[1])]
            tensors.append(torch.rand(*shape, generator=g) > 0.25)
        elif op[0] == "temperature":
            tensors.append(torch.tensor(op[1], dtype=dtype))
    # "streams": the Diff Transformer's pairs of score maps (H/2 output heads; a softmax where H is 1)
    streams = spec["norm"] == "streams" and H % 2 == 0
    if spec["norm"] == "learned_lambda" or streams:
        tensors.append(torch.tensor(0.3, dtype=dtype))
    Ho = H // 2 if streams else H
    out_shape = (B, M, Ho, Dv) if bshd else (B, Ho, M, Dv)
    epilogue = spec["epilogue"]
    if epilogue in ("gate", "add"):
        tensors.append(rnd(*out_shape))
    elif epilogue == "transpose_gate":
        tensors.append(rnd(*((B, Ho, M, Dv) if bshd else (B, M, Ho, Dv))))

    def program(q, k, v, *extra):
        extra = list(extra)
        if spec["writes_k"]:
            k.mul_(0.5)
        if bshd:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if spec["group"] > 1 and spec["gqa"] == "expand":  # [B, Hkv, 1, S, D] → [B, H, S, D]
            b, hkv, n, d = k.shape
            k = k[:, :, None].expand(b, hkv, spec["group"], n, d).reshape(b, hkv * spec["group"], n, d)
            v = v[:, :, None].expand(b, hkv, spec["group"], n, v.size(-1)).reshape(b, hkv * spec["group"], n, -1)
        elif spec["group"] > 1:
            k = k.repeat_interleave(spec["group"], dim=1)
            v = v.repeat_interleave(spec["group"], dim=1)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        for op in spec["ops"]:
            if op[0] == "scale":
                s = s * op[1]
            elif op[0] == "inplace_scale":
                s.mul_(op[1])
            elif op[0] == "temperature":
                s = s / extra.pop(0)
            elif op[0] == "extreme_mask":
                s = s + (1.0 - extra.pop(0).to(s.dtype)) * _extreme(op[2], s.dtype)
            elif op[0] == "extreme_fill":
                s = s.masked_fill(~extra.pop(0), _extreme(op[2], s.dtype))
            elif op[0] == "bias":
                s = s + _as_drawn(extra.pop(0), op, s)
            elif op[0] == "distance_bias":
                j, i = torch.arange(s.size(-1), device=s.device), torch.arange(s.size(-2), device=s.device)
                s = s + (op[1] * (j[None, :] - i[:, None])).to(s.dtype)
            elif op[0] == "softcap":
                s = op[1] * torch.tanh(s / op[1])
            elif op[0] == "index_mask":
                keep = _index_mask(op[1], op[2], s.size(-2), s.size(-1), s.device)
                s = s.masked_fill(~keep, float("-inf"))
            else:
                s = s.masked_fill(~_as_drawn(extra.pop(0), op, s), float("-inf"))
        if spec["norm"] == "streams":   # softmax over the H maps, viewed as H/2 pairs, the second weighted by λ
            p = torch.softmax(s, dim=-1)
            if streams:
                p = p.view(p.size(0), Ho, 2, p.size(-2), p.size(-1))
                p, v = p[:, :, 0] - extra.pop(0) * p[:, :, 1], v[:, :Ho]
            o = p @ v
        else:
            o = _normalize(s, spec["norm"], extra.pop(0) if spec["norm"] == "learned_lambda" else None) @ v
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


DRAWN = {"programs": 0, "fused": 0}  # what test_random_program_matches_eager drew and fused


def _copies(args):
    return tuple(a.clone() for a in args)  # a program may write an input: each run gets its own


@pytest.mark.fusion_independent  # right whatever fxflash decides; the fusion rate is asserted below
@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("FXFLASH_LONG"),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(PROGRAMS)
def test_random_program_matches_eager(spec):
    if os.environ.get("FXFLASH_LONG"):
        print(f"drawing {spec}", flush=True)  # the program a crash that stops the process was running
    program, args = make_program(spec)
    args = tuple(a.to("cuda" if ON_GPU else "cpu") for a in args)
    optimized = fxflash.optimize(program)
    out = optimized(*_copies(args))
    report = optimized.report(*_copies(args))
    fused = report is not None and any(r.fused for r in report.regions)
    DRAWN["programs"] += 1
    DRAWN["fused"] += fused
    for region in report.regions if report is not None else ():
        event("fused" if region.fused else f"not fused: {region.reason.split(':')[0]}")
    assert_accurate(program, _copies(args), out)
    print(f"program {'fused' if fused else 'eager'} right")  # counted by tests/random_soak.sh (pytest -s)


@pytest.mark.fusion_independent  # right whatever fxflash decides: fused backward, eager recompute or eager
@settings(max_examples=GRADIENT_EXAMPLES, deadline=None, derandomize=not os.environ.get("FXFLASH_LONG"),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(PROGRAMS)
def test_random_program_gradients_match_eager(spec):
    """The gradients of every floating input (Q, K, V, biases, temperatures, λ, the gate) against
    float64 autograd within eager's own error. No input is written in place: autograd refuses
    that on a leaf that needs a gradient, in eager too; a bias constant along the keys, whose
    gradient under a softmax is 0 (each row's dS sums to 0: the fused backward's Δ is taken
    from O in fp32), included; so are extreme fills and masks, whose rows eager's 16-bit rounding
    can turn into equal scores (the backward takes those rows' chain in eager's rounding)."""
    program, args = make_program({**spec, "writes_k": False})
    args = tuple(a.to("cuda" if ON_GPU else "cpu") for a in args)
    report = fxflash.explain(program, *args)
    for region in report.regions:
        event(f"backward: {region.backward.split(':')[0]}" if region.fused else "not fused")
    wrt = tuple(i for i, a in enumerate(args) if a.is_floating_point())
    # a row one key takes whole under scores times 10⁴: eager's dS is exactly 0 (P one-hot, dP − Σ
    # P·dP cancels), the kernel's is dP's rounding against Δ's times 10⁴ (FlashAttention's too);
    # dP = dO·Vᵀ sums Dv products of unit draws, so that rounding grows with √Dv
    amplification = (math.prod(max(1.0, abs(op[1])) for op in spec["ops"] if op[0] in ("scale", "inplace_scale"))
                     * math.sqrt(spec["Dv"]))
    assert_gradients_accurate(program, fxflash.optimize(program), args, wrt, amplification)


# test_most_drawn_programs_fuse reads what test_random_program_matches_eager drew: in one part of
# a sharded run (tests/conftest.py)
SHARD_WHOLE = True

# The share of drawn programs that fuse: 12 of the 20 derandomized CI draws before the grammar
# drew extreme constants, parameters and bf16 (a program without a matmul chain has nothing to
# fuse; sigmoid, ReLU and row-sum normalizations over masked rows stay as written).
MIN_FUSION_RATE = 0.5


def test_most_drawn_programs_fuse():
    """The grammar's programs are not vacuous: at least MIN_FUSION_RATE of those the test above
    drew fused (fxflash's own reports)."""
    if DRAWN["programs"] < 10:
        pytest.skip("test_random_program_matches_eager drew too few programs in this run")
    assert DRAWN["fused"] >= MIN_FUSION_RATE * DRAWN["programs"], DRAWN


def test_the_grammar_produces_programs_that_fuse():
    """The generator is not vacuous: a plain drawn program fuses into one kernel."""
    spec = dict(B=1, Hkv=2, group=2, M=17, N=33, D=16, Dv=8, layout="bshd", gqa="expand", strided_q=True,
                writes_k=False, dtype=torch.float32, ops=[("bias", [False, True, True, True]), ("index_mask", "window", 3)],
                norm="softmax_one", epilogue="transpose_gate", seed=1)
    program, args = make_program(spec)
    report = fxflash.explain(program, *args)
    assert [r.fused for r in report.regions] == [True], [r.reason for r in report.regions]
    assert_accurate(program, args, fxflash.optimize(program)(*args))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("FXFLASH_LONG"),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@pytest.mark.fusion_independent
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
