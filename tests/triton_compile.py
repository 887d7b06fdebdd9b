"""Compile a variant's generated Triton kernel, as printed for a GPU, for sm_90 without one (run by
test_fused.py; with TRITON_INTERPRET=0, which ``import fxflash`` leaves as it is: the interpreter's
printing has no GPU helpers, printers.GPU_HELPERS, so only this checks that their libdevice calls
and inline PTX compile):

    python tests/triton_compile.py VARIANT DTYPE [--backward]

Prints the GPU helpers the kernel calls and the special-function instructions in its PTX; ptxas
must have assembled it. With ``--backward``, every kernel of the region's fused backward instead
(test_fused_backward.py), the statistics kernel with and without REPAIRED_ONLY."""
import os
import re
import sys

os.environ["TRITON_INTERPRET"] = "0"  # before fxflash, which selects the interpreter where no GPU is found

import torch  # noqa: E402
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fxflash.runtime.cache import load_kernel
from fxflash.codegen.emit import emit_kernel
from fxflash.codegen.printers import GPU_HELPERS
from fxflash.config import interpreting
from fxflash.patterns import find_chains
from fxflash.patterns.region import build_region
from fxflash.variants import VARIANTS, Shape
from helpers import TRITON_TYPES as TYPES, analysed

CONSTEXPRS = {"BLOCK_M": 64, "BLOCK_N": 64}


def _planned(name, dtype):
    """(the variant's region, its analysis, its forward KernelPlan) as printed for a GPU."""
    assert not interpreting(), "run without TRITON_INTERPRET: the interpreter prints no GPU helpers"
    variant = VARIANTS[name]
    args = variant.inputs(Shape(B=2, H=4, Hkv=2, M=200, N=256, D=64, Dv=64), dtype)
    _, analysis = analysed(variant.fn, *args)
    (chain,) = find_chains(analysis)
    region = build_region(analysis, chain)
    return region, analysis, emit_kernel(region, analysis.kinds)


def main(name, dtype):
    dtype = getattr(torch, dtype)
    _, _, plan = _planned(name, dtype)
    lead = {"out_ptr": "*" + TYPES[plan.out_dtype], **({"sat_ptr": "*i8"} if plan.flags else {})}
    compiled = _compiled(plan, load_kernel(plan.source, plan.name), plan.args, lead)
    helpers = sorted(h for h in GPU_HELPERS if f"{h}(" in plan.source)
    ftz = sorted(set(re.findall(r"\b(?:ex2|rcp)\.approx\.ftz\.f32", compiled.asm["ptx"])))
    repair = "no repair kernel"
    if plan.repair_args is not None:  # the kernel that recomputes the rows a Gluon kernel flagged
        _compiled(plan, load_kernel(plan.source, f"{plan.name}_repair"), plan.repair_args,
                  {"out_ptr": "*" + TYPES[plan.out_dtype], "sat_ptr": "*i8"}, SAT_STREAMS=1, REPAIR_SCAN=16)
        repair = "repair kernel compiled"
    print(f"compiled {name} {dtype}: GPU helpers {helpers}, approximate PTX {ftz}; {repair}")


# The backward's own tensors' types (codegen/backward._OWN; dQ, dK, dV, dO and O in the inputs' dtype)
BACKWARD_OWN = {"m": "*fp32", "inv_l": "*fp32", "delta": "*fp32", "held": "*i8", "held_heads": "*i32",
                "dq_sum": "*fp32"}


def backward(name, dtype):
    """Every kernel of the variant's fused backward compiled for sm_90."""
    from fxflash.codegen.backward import emit_backward

    dtype = getattr(torch, dtype)
    region, analysis, plan = _planned(name, dtype)
    bw = emit_backward(region, analysis.kinds, plan, None)
    for kernel in (*bw.kernels, bw.atomics, *bw.grouped, *((bw.exact_delta,) if bw.exact_delta else ())):
        lead = {f"{n}_ptr": BACKWARD_OWN.get(n, "*fp32" if n.startswith("dg") else "*" + TYPES[dtype])
                for n in kernel.own}
        flags = dict(STORE_DG=True, ADD_DG=True, GROUP=2, G_INNER=1)
        # the statistics kernel with and without REPAIRED_ONLY; a held kernel's two launches (HELD)
        switch = "REPAIRED_ONLY" if kernel.statistics else "HELD" if kernel.held else None
        for value in (False, True) if switch else (None,):
            extra = {**flags, **({} if switch is None else {switch: value})}
            _compiled(plan, load_kernel(bw.source, kernel.name), kernel.args, lead, **extra)
        print(f"compiled {kernel.name}" + (" (rows held)" if bw.held else ""))


def _compiled(plan, kernel, specs, lead: dict, **extra):
    """``kernel`` compiled for sm_90: ``lead`` its first parameters' types, ``specs`` the rest's."""
    types = {"ptr": lambda spec: "*" + TYPES[plan.input_nodes[spec[1]].meta["val"].dtype],
             "side": lambda spec: "*fp32", "summary": lambda spec: "*i64"}
    runtime = dict(lead)
    for spec, arg in zip(specs, kernel.arg_names[len(lead):]):
        runtime[arg] = types.get(spec[0], lambda spec: "i32")(spec)
    constexprs = {**CONSTEXPRS, "D": plan.d, "DP": plan.d, "DV": plan.dv, "DVP": plan.dv, **extra}
    signature = {n: runtime.get(n, "constexpr") for n in kernel.arg_names}
    assert {n for n, t in signature.items() if t == "constexpr"} <= set(constexprs), signature
    constexprs = {n: v for n, v in constexprs.items() if n in signature}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs=constexprs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2})
    assert compiled.asm.get("cubin"), "ptxas produced no cubin"
    return compiled


if __name__ == "__main__":
    backward(*sys.argv[1:3]) if "--backward" in sys.argv else main(*sys.argv[1:])
