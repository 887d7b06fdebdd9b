"""Shared helpers: capture + analyse a function, find nodes by op."""
from __future__ import annotations

import atexit
import concurrent.futures
import json
import os
import subprocess
import sys

import pytest
import torch

from fxflash.analysis import analyse
from fxflash.tile import ir
from fxflash.analysis.ops import packet
from fxflash.capture import capture
from fxflash.codegen.gluon import gluon_api
from fxflash.patterns import find_chains
from fxflash.patterns.region import build_region

REPLY = "@@gluon_compile "  # how gluon_compile.serve's answers begin among other lines on its stdout


def analysed(fn, *args, **kwargs):
    captured = capture(fn, args, kwargs)
    return captured, analyse(captured.graph_module)


def chains_of(fn, *args, **kwargs):
    _, analysis = analysed(fn, *args, **kwargs)
    return find_chains(analysis)


def region_and_kinds(fn, *args):
    """The region of ``fn(*args)``'s one matmul chain and the graph's op kinds (what the code
    generators print from: ``emit_gluon(region, kinds)``)."""
    _, analysis = analysed(fn, *args)
    (chain,) = find_chains(analysis)
    return build_region(analysis, chain), analysis.kinds


needs_gluon = pytest.mark.skipif(gluon_api() is None, reason="this Triton has no Gluon Hopper API")


def compile_for_hopper(name, dtype, d, tile, edit=None, dv=None, training=False, **settings) -> str:
    """tests/gluon_compile.py's report of ``name``'s Gluon kernel with configuration ``tile`` (hand
    edit ``edit`` of probe_gluon_edits applied, if given; V's head dim ``dv`` if not ``d``; with
    ``training``, its training forward's),
    compiled for sm_90 without TRITON_INTERPRET, with the on/off ``settings`` (environment names:
    ``FXFLASH_GLUON_TMA_TILES="0"``) — by one ``gluon_compile.py --serve`` process that the test
    session's checks share (each started its own, 3–4 s of imports apiece)."""
    argv = [*(["--edit", edit] if edit else []), *(["--dv", str(dv)] if dv else []), *(["--training"] if training else []),
            name, dtype, str(d), *map(str, tile)]
    server = _compile_server()
    server.stdin.write(json.dumps({"argv": argv, "settings": settings}) + "\n")
    server.stdin.flush()
    reader = concurrent.futures.ThreadPoolExecutor(1)
    try:
        reply = reader.submit(_reply_of, server).result(timeout=600)
    except concurrent.futures.TimeoutError:
        server.kill()  # the next check starts another
        raise
    finally:
        reader.shutdown(wait=False)
    assert reply["error"] is None and f"compiled {name}" in reply["stdout"], reply["error"]
    return reply["stdout"]


_SERVER: list = []  # the session's gluon_compile.py --serve process


def _compile_server() -> subprocess.Popen:
    if not _SERVER or _SERVER[0].poll() is not None:
        here = os.path.dirname(os.path.abspath(__file__))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        _SERVER[:] = [subprocess.Popen([sys.executable, os.path.join(here, "gluon_compile.py"), "--serve"], cwd=here,
                                       env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)]
        atexit.register(_SERVER[0].stdin.close)  # its loop ends with its input
    return _SERVER[0]


def _reply_of(server: subprocess.Popen) -> dict:
    """The server's next answer (other lines on its stdout, Triton's or torch's, skipped)."""
    for line in server.stdout:
        if line.startswith(REPLY):
            return json.loads(line[len(REPLY):])
    raise RuntimeError(f"gluon_compile.py --serve exited ({server.wait()}) without an answer; its stderr is above")


def nodes_with(gm, op_packet):
    return [n for n in gm.graph.nodes if n.op == "call_function" and packet(n.target) is op_packet]


aten = torch.ops.aten


def assert_fused(report, n: int = 1):
    """``report`` (fxflash's own Report, from explain() or .report()) fused exactly ``n`` regions:
    a test that claims a fused path proves it (with fusion off, this fails)."""
    assert report is not None, "no report: the call ran eagerly"
    fused = [r for r in report.regions if r.fused]
    assert len(fused) == n, f"{len(fused)} region(s) fused, expected {n}: " + "; ".join(
        f"{r.rule}: {r.reason}" for r in report.regions if not r.fused)
    return fused


def to_float64(args):
    return tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def max_error(out, ref) -> float:
    return (out.double() - ref.double()).abs().max().item()


# Fused error may be this many times eager's own error against float64 (plus a floor of a few
# units in the last place of the output dtype, for outputs eager happens to round exactly; relative
# to the largest output where that is above 1: outputs of 1e29 have ulps of 1e22).
ERROR_FACTOR = 3.0
FLOOR = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def assert_accurate(fn, args, out):
    """``out`` (the optimized call's result) is within ERROR_FACTOR × eager's error against a
    float64 reference, with NaN where the reference has NaN and nowhere else, and no inf where eager
    is finite (except where eager itself overflowed)."""
    ref = fn(*to_float64(args))
    eager = fn(*args)
    assert out.shape == eager.shape and out.dtype == eager.dtype
    # where eager's own dtype overflowed (and float64 did not) nothing is asked of the fused value
    asked = torch.isfinite(eager) | ~torch.isfinite(ref)
    assert torch.equal(torch.isnan(out)[asked], torch.isnan(ref)[asked]), "NaN pattern differs from float64 eager"
    assert not (torch.isinf(out) & torch.isfinite(eager)).any(), "infinite where eager is finite"
    finite = torch.isfinite(ref) & asked
    if not finite.any():
        return 0.0, 0.0
    fused_err = max_error(out[finite], ref[finite])
    eager_err = max_error(eager[finite], ref[finite])
    bound = ERROR_FACTOR * eager_err + FLOOR[out.dtype] * max(1.0, ref[finite].abs().max().item())
    assert fused_err <= bound, f"fused error {fused_err:.3g} > {bound:.3g} (eager {eager_err:.3g})"
    return fused_err, eager_err


def gradients(fn, args, wrt, grad=None) -> tuple:
    """(``fn(*args)``, the gradients of ``args[i]`` for i in ``wrt``, the incoming gradient): ``grad``,
    or where None a unit normal draw of seed 0, the same on every run."""
    leaves = [x.detach().clone().requires_grad_(i in wrt) if isinstance(x, torch.Tensor) else x
              for i, x in enumerate(args)]
    out = fn(*leaves)
    if grad is None:
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out)
    grad = grad.to(out.dtype)
    out.backward(grad)
    return out, [leaves[i].grad for i in wrt], grad


def assert_gradients_accurate(fn, fast, args, wrt, amplification: float = 1.0) -> list:
    """The gradients ``fast`` (fn optimized) gives the inputs ``args[i]`` for i in ``wrt`` are
    within ERROR_FACTOR × eager's own error against float64 autograd, by assert_accurate's rules
    (NaN where float64's is NaN and nowhere else, nothing asked where eager's own dtype overflowed).
    ``amplification`` multiplies the dtype's floor: the factor by which ``fn`` scales its scores,
    and with them the rounding of ``dP − Δ`` into dQ and dK, where eager's own error can be 0 by
    exact cancellation (a row one key takes whole). Returns [(fused error, eager error)] per input."""
    _, fused, grad = gradients(fast, args, wrt)
    _, eager, _ = gradients(fn, args, wrt, grad)
    _, ref, _ = gradients(fn, to_float64(args), wrt, grad)
    errors = []
    for got, own, want in zip(fused, eager, ref):
        assert got.shape == want.shape and got.dtype == own.dtype
        asked = torch.isfinite(own) | ~torch.isfinite(want)
        assert torch.equal(torch.isnan(got)[asked], torch.isnan(want)[asked]), "NaN pattern differs from float64 autograd"
        assert not (torch.isinf(got) & torch.isfinite(own)).any(), "infinite where eager's gradient is finite"
        finite = torch.isfinite(want) & asked
        if not finite.any():
            errors.append((0.0, 0.0))
            continue
        fused_err, eager_err = max_error(got[finite], want[finite]), max_error(own[finite], want[finite])
        bound = ERROR_FACTOR * eager_err + FLOOR[got.dtype] * amplification * max(1.0, want[finite].abs().max().item())
        assert fused_err <= bound, f"fused gradient error {fused_err:.3g} > {bound:.3g} (eager {eager_err:.3g})"
        errors.append((fused_err, eager_err))
    return errors


# Triton's signature names of the dtypes a kernel argument may have (for compiling without a GPU:
# gluon_compile.py, triton_compile.py).
TRITON_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64",
                torch.int32: "i32", torch.bool: "i1"}


def graph_values(gm, args) -> dict:
    """Every node's value in the captured graph run on ``args``: what an Index op computes from the
    tile's indices, here for the whole frame."""
    values = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            values[n.name] = super().run_node(n)
            return values[n.name]

    Recorder(gm).run(*args)
    return values


def evaluate_tile_program(program: ir.TileProgram, tensors: dict, graph: dict) -> dict:
    """Run ``program`` with one tile spanning every row and key (``tensors``: name → value, the
    batch axes leading; ``graph``: the captured graph's values, for Index ops); returns every
    value it named. Deferred row factors are left to Finish, as the kernel leaves them."""
    env = dict(tensors)

    def arg(a):
        return env[a] if isinstance(a, str) and a in env else a

    for op in program.ops():
        if isinstance(op, ir.Index):
            env[op.name] = graph[op.name]
        elif isinstance(op, ir.Load):
            t = tensors[op.tensor] if op.tensor in tensors else graph[op.tensor]
            t = t.transpose(-1, -2) if op.transposed else t
            for kind, c in op.scale:
                t = t * c if kind == "mul" else t / c
            env[op.name] = t.unsqueeze(-1) if op.tile == "row values" else t
        elif isinstance(op, ir.Dot):
            env[op.name] = env[op.a] @ env[op.b].transpose(-1, -2)
        elif isinstance(op, ir.Map):
            if op.form.startswith("row factors deferred"):
                env[op.name] = env[op.args[0]]
            elif op.op == "sum":
                env[op.name] = env[op.args[0]].sum(op.args[1], keepdim=True)
            else:
                env[op.name] = getattr(aten, op.op)(*map(arg, op.args))
        elif isinstance(op, ir.RowReduce):
            env[op.name] = getattr(torch, "amax" if op.combine == "max" else op.combine)(env[op.source], -1, keepdim=True)
        elif isinstance(op, ir.Accumulate):
            p = env[op.p].transpose(-1, -2) if op.transposed else env[op.p]
            env[op.acc] = (0 if op.fresh else env.get(op.acc, 0)) + op.sign * (p @ env[op.v])
        elif isinstance(op, ir.Finish):
            value = env[op.acc]
            for kind, row in op.factors:
                value = value * env[row] if kind == "mul" else value / env[row]
            env[op.name] = value
        elif isinstance(op, ir.Store):
            value = env[op.value].squeeze(-1) if op.tile == "row values" else env[op.value]
            tensors[op.tensor] = tensors.get(op.tensor, 0) + value if op.add else value
    return env
