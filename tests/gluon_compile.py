"""Compile a variant's generated Gluon kernel for sm_90 without a GPU (run by test_gluon.py in a
process without TRITON_INTERPRET, which cannot run or compile Gluon):

    python tests/gluon_compile.py [--edit NAME] [--dv DV] [--training] VARIANT DTYPE D CONSUMERS BLOCK_N NBUF PINGPONG
        [CTAS_PER_SM [PERSISTENT [STREAMS [CONSUMER_ROWS]]]]

Prints the kernel's shared memory (and gluon_plan.shared_bytes's count of its buffers), how it sums
each row's ``p``, how it stores the output (by TMA where the region can: gluon_launch.stores_by_tma), and from this Triton's ptxas (``-v``) its spills: a proxy
for register pressure that needs no GPU (the GPU machine's Triton may bundle another ptxas). The
kernel is specialized as Triton's JIT specializes it at a launch (``jit_specializations``).
``--edit NAME`` compiles a hand edit of the printed source (benchmarks/probes/probe_gluon_edits.py);
``--dv DV`` gives V a head dim other than Q's and K's D (differential attention's V is 2·DV wide);
``--training`` compiles the training forward's kernel (it also stores m, 1/l and O in fp32);
STREAMS 2 compiles a two-stream region's configuration, CONSUMER_ROWS 128 one whose consumers own 128 rows each.
``python tests/gluon_compile.py --serve`` answers such checks one per line of stdin (``serve``)."""
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from fxflash.runtime import gluon_launch
from fxflash.runtime.cache import load_kernel
from fxflash.codegen.gluon import emit_gluon, refusal
from fxflash.codegen.gluon_plan import register_budget, shared_bytes
from fxflash.variants import VARIANTS, Shape
from helpers import REPLY, TRITON_TYPES as TYPES, region_and_kinds



def main(name, dtype, d, consumers, block_n, nbuf, pingpong, ctas=1, persistent=0, streams=1, consumer_rows=64, edit=None,
         dv=None, training=False):
    dtype = getattr(torch, dtype)
    variant = VARIANTS[name]
    dv = dv or d
    args = variant.inputs(Shape(B=2, H=4, Hkv=2, M=200, N=256, D=d, Dv=dv), dtype)
    region, kinds = region_and_kinds(variant.fn, *args)
    assert refusal(region, training) is None, refusal(region, training)
    plan = emit_gluon(region, kinds, statistics=training)
    if edit:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "probes"))
        from probe_gluon_edits import edit_named

        plan.source = edit_named(edit)(plan.source)
    kernel = load_kernel(plan.source, plan.name)
    layout = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]

    def desc(block):
        return f"tensordesc<{TYPES[dtype]}{block},{gl.NVMMASharedLayout.get_default_for(block, layout)!r}>"

    tile = ("gluon", consumers, block_n, nbuf, pingpong, ctas, persistent, streams, consumer_rows)
    first = kernel.arg_names.index("sat_ptr") + 1  # the TMA descriptors come before out_ptr, in _blocks's order
    blocks = gluon_launch._blocks(plan, tile)
    runtime = {name: desc(block) for name, block in zip(kernel.arg_names[:first - 2], blocks)}
    runtime["out_ptr"] = f"*{TYPES[dtype]}"
    runtime["sat_ptr"] = "*i8"  # the repair kernel's row flags
    for spec, arg in zip(plan.args, kernel.arg_names[first:]):
        runtime[arg] = {"ptr": lambda: "*" + TYPES[plan.input_nodes[spec[1]].meta["val"].dtype],
                        "summary": lambda: "*i64", "side": lambda: "*fp32"}.get(spec[0], lambda: "i32")()
    maxnreg, regs = register_budget(consumers, ctas)
    # the kernel's last arguments, in order (BoundGluonLaunch); the output by TMA where the region can
    constexprs = gluon_launch.constexprs(tile, plan.store is not None)
    assert list(kernel.arg_names[-len(constexprs):]) == list(constexprs), kernel.arg_names
    ones, attrs = jit_specializations(plan, kernel.arg_names[first:], tuple(region.frame.meta["val"].shape), first)
    signature = {n: "constexpr" if n in ones or n in constexprs else runtime[n] for n in kernel.arg_names}
    compiled = triton.compile(GluonASTSource(kernel, signature, constexprs={**constexprs, **ones}, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": maxnreg})
    row_sums = "wgmma.mma_async.sync.aligned.m64n8k16" in compiled.asm["ptx"]  # P·1 (gluon_plan.row_sums_by_mma)
    stores = "by TMA" if "cp.async.bulk.tensor.2d.global.shared" in compiled.asm["ptx"] else "per element"
    print(f"compiled {name}{' edited by ' + edit if edit else ''}{' (training)' if training else ''} {dtype} d{d}: shared {compiled.metadata.shared} bytes (buffers "
          f"{shared_bytes(tile, d, dtype.itemsize, len(plan.tiles) - len(plan.vectors), plan.dv, len(plan.vectors), mma_row_sum=plan.options.gluon_mma_row_sum)}), {regs} registers per consumer thread; row sums "
          f"{'by P·1 on the tensor cores' if row_sums else 'added up'}; output stored {stores}; "
          f"{spills(compiled.asm['ptx'])}")


def jit_specializations(plan, arg_names, frame, first) -> tuple[dict, dict]:
    """What Triton's JIT would specialize the kernel on at a launch with these inputs' strides
    and sizes (16-byte aligned pointers): integer arguments equal to 1 become constants, those
    divisible by 16 and every pointer get ``tt.divisibility`` 16 (vectorized loads depend on
    both). ``arg_names``: the kernel's arguments from ``first``, ``plan.args``'s. Returns (constant
    arguments, attributes by argument index)."""
    ones, attrs = {}, {first - 2: True, first - 1: True}  # out_ptr, sat_ptr
    for index, (spec, arg) in enumerate(zip(plan.args, arg_names), start=first):
        value = {"stride": lambda: plan.input_nodes[spec[1]].meta["val"].stride(spec[2]),
                 "size": lambda: plan.input_nodes[spec[1]].meta["val"].size(spec[2]),
                 "frame": lambda: frame[spec[1]]}.get(spec[0], lambda: None)()
        if value == 1:
            ones[arg] = 1
        elif spec[0] in ("ptr", "summary", "side") or (value is not None and int(value) % 16 == 0):
            attrs[index] = True
    return ones, {(i,): [["tt.divisibility", 16]] for i in attrs}


def spills(ptx: str) -> str:
    """ptxas's spill report for ``ptx`` on sm_90a, or why there is none."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        try:
            done = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", path, "-o", path + ".cubin"],
                                  capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"spills unknown ({exc})"
    found = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    return f"spills {found.group(1)}/{found.group(2)} bytes stored/loaded" if found else "spills unknown"


def run(argv: list) -> None:
    """One compile check from its command line (the module docstring's)."""
    argv = list(argv)
    edit = argv.pop(argv.index("--edit") + 1) if "--edit" in argv else None
    dv = int(argv.pop(argv.index("--dv") + 1)) if "--dv" in argv else None
    training = "--training" in argv
    argv = [a for a in argv if a not in ("--edit", "--dv", "--training")]
    main(argv[0], argv[1], *(int(a) for a in argv[2:]), edit=edit, dv=dv, training=training)


def serve() -> None:
    """``--serve``: one check per line of stdin (JSON: ``argv`` as above, ``settings`` as
    ``{"FXFLASH_GLUON_TMA_TILES": "0"}``, applied to fxflash.config for that check only), each
    answered by one line on stdout that begins with ``REPLY`` (JSON: its report, or the error's traceback) — the
    checks of a test session share one process, which imports torch and Triton once."""
    from fxflash.config import config

    for line in sys.stdin:
        job = json.loads(line)
        saved, report = {}, io.StringIO()
        try:
            for name, value in job["settings"].items():
                field = name.removeprefix("FXFLASH_").lower()
                saved[field] = getattr(config, field)  # an unknown setting is an error, not ignored
                assert isinstance(saved[field], bool), f"{name} is not an on/off setting"
                setattr(config, field, value != "0")
            with contextlib.redirect_stdout(report):
                run(job["argv"])
            reply = {"stdout": report.getvalue(), "error": None}
        except Exception:
            reply = {"stdout": report.getvalue(), "error": traceback.format_exc()}
        finally:
            for field, value in saved.items():
                setattr(config, field, value)
        print(REPLY + json.dumps(reply), flush=True)


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    serve() if sys.argv[1:] == ["--serve"] else run(sys.argv[1:])
