"""Time hand edits of a generated kernel against the kernel itself, before building them.

    PYTHONPATH=. python benchmarks/probes/probe_edits.py --variant evoformer_row --batch 8 --edits loads_first bias_in_dot
    PYTHONPATH=. python benchmarks/probes/probe_edits.py --variant evoformer_row --batch 8 --head-dim 128 --tiles 64x64x4x2

A change to the code generator is a prediction about the printed kernel; this probe measures
the prediction first. It compiles the variant's fused kernel as fxflash prints it, then each
named edit of that source (``EDITS``: functions source → source, each raising if it finds
nothing to change), swaps it into the registered region, checks the result against the
unedited kernel's, and times the call with each tile in ``--tiles`` (default: the kernel's
own candidates) pinned: CUDA-graph replay medians (device time; pinned tiles take the
unbound launch path) and the best tile per edit. An edit that stands for one of several
programs of a wider grid (``programs`` > 1) is reported at that multiple of its time. Cases
are the suite's shapes (``tile_sweep.case_of``). The edits are experiments: what wins is then built into
``codegen`` as a rule, with tests.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import fxflash  # noqa: E402
from fxflash.runtime import cache, tuning  # noqa: E402
from fxflash.runtime import op as region_op  # noqa: E402
from fxflash.runtime.launch import Launcher  # noqa: E402

sys.path[:0] = [os.path.dirname(__file__), os.path.join(os.path.dirname(__file__), "..")]
from bench_attention import medians, tuned_configs  # noqa: E402
from tile_sweep import add_case_options, case_of  # noqa: E402


def _sub(pattern: str, repl, source: str, count: int = 0) -> str:
    out, n = re.subn(pattern, repl, source, count=count, flags=re.M)
    if n == 0 or out == source:  # no match, or only matches the rewrite leaves as they were
        raise ValueError(f"edit found nothing to change: {pattern!r}")
    return out


def loads_first(source: str) -> str:
    """Issue the loads of the score tile's tensor inputs (biases) before the score dot, so their
    latency overlaps the dot instead of following it."""
    def move(match):
        dot, between = match.group(1), match.group(2)
        loads = re.findall(r"^ +x\d+ = tl\.load[^\n]*\n", between, flags=re.M)
        if not loads:
            return match.group(0)
        return "".join(loads) + dot + "".join(line for line in between.splitlines(True) if line not in loads)
    return _sub(r"^( +s = tl\.dot\(q, k[^\n]*\n)((?:(?! +tile_amax)[^\n]*\n)*?)(?= +tile_amax)", move, source)


def bias_in_dot(source: str) -> str:
    """``s + x1 + x3`` with x1, x3 loaded tiles: the loads first, their sum the score dot's
    accumulator input (``tl.dot(q, k, x3 + x1)``), the adds after the dot gone."""
    def rewrite(match):
        indent, precision, body = match.group(1), match.group(2) or "", match.group(3)
        loads = re.findall(r"^ +x\d+ = tl\.load[^\n]*\n", body, flags=re.M)
        names = [re.match(r" +(x\d+)", line).group(1) for line in loads]
        adds = re.findall(r"^ +(t\d+) = \(\((s|t\d+) \+ (x\d+)\)\)\.to\(tl\.float32\)\n", body, flags=re.M)
        if not loads or len(adds) != len(names):
            return match.group(0)
        acc = " + ".join(reversed(names))
        shape = "[BLOCK_M, BLOCK_N]"
        out = "".join(loads) + f"{indent}s = tl.dot(q, k, tl.broadcast_to({acc}, {shape}){precision})\n"
        for t, src, _ in adds:
            out += f"{indent}{t} = {src}\n"
        return out
    return _sub(r"^( +)s = tl\.dot\(q, k(, input_precision='ieee')?\)\n((?:(?: +x\d+ = tl\.load[^\n]*| +t\d+ = \(\((?:s|t\d+) \+ x\d+\)\)\.to\(tl\.float32\))\n)+)",
                rewrite, source)


def dots_first(source: str) -> str:
    """Two score streams (differential attention): the second stream's K load and score dot
    issued right after the first's, before the first stream's softmax, so the tensor cores
    work on the second dot while the first stream's exponentials run."""
    def move(match):
        body = match.group(0)
        second = re.search(r"^( +)k_1 = tl\.load[^\n]*\n\1s_1 = tl\.dot[^\n]*\n", body, flags=re.M)
        first = re.search(r"^ +s_0 = tl\.dot[^\n]*\n", body, flags=re.M)
        if not second or not first:
            return body
        body = body[:second.start()] + body[second.end():]
        return body[:first.end()] + second.group(0) + body[first.end():]
    return _sub(r"^ +k_0 = tl\.load(?:[^\n]*\n)+? +s_1 = tl\.dot[^\n]*\n", move, source)


def v_first(source: str) -> str:
    """The V tile loaded right after the (first) K tile instead of after the softmax."""
    def move(match):
        body = match.group(0)
        v = re.search(r"^ +v = tl\.load[^\n]*\n", body, flags=re.M)
        k = re.search(r"^ +k(?:_0)? = tl\.load[^\n]*\n", body, flags=re.M)
        body = body[:v.start()] + body[v.end():]
        return body[:k.end()] + v.group(0) + body[k.end():]
    return _sub(r"^ +k(?:_0)? = tl\.load(?:[^\n]*\n)+? +v = tl\.load[^\n]*\n", move, source)


def half_dv(source: str) -> str:
    """One of the two programs of a split of the output's Dv: accumulators, V tiles and the
    store over the first half of Dv only. Its result is partial; twice its time (``programs``)
    predicts the split kernel, which recomputes the scores in each half."""
    source = _sub(r"offs_dv = tl\.arange\(0, DVP\)", "offs_dv = tl.arange(0, DVP // 2)", source)
    return _sub(r"tl\.zeros\(\[BLOCK_M, DVP\]", "tl.zeros([BLOCK_M, DVP // 2]", source)


_TILE_LOAD = re.compile(r"^( +)(x\d+) = tl\.load\((in\d+)_ptr \+ ([^\n]*?), mask=[^\n]*, other=0\)\.to\(tl\.float32\)$",
                        re.M)


def triton_sigmoid(source: str) -> str:
    """The sigmoid as Triton's ``tl.sigmoid`` (``1 / (1 + exp(-x))`` with a full-range division and
    exp2) in place of the printed ``_fx_sigmoid`` (the special-function unit's approximate exp2
    and reciprocal on GPUs, printers.GPU_HELPERS): what the kernel printed before the helper."""
    return _sub(r"^def _fx_sigmoid\(x\):\n(?: {4}.*\n)+",
                "def _fx_sigmoid(x):\n    return tl.sigmoid(x.to(tl.float32))\n", source, count=1)


LAZY_GROWTH = 8.0  # lazy_rescale: how far (in the exponent's units) a row's maximum may grow unapplied


def lazy_rescale(source: str) -> str:
    """Rescale a stream's accumulators and row sum only when some row's maximum grew by more
    than LAZY_GROWTH since it was last applied (one test over the program's rows per key tile,
    FlashAttention-4's lazy rescaling); otherwise the stale maximum stays, and the tile's
    exponentials reach at most 2^8 (e^8 in natural units). Exact in real arithmetic: O and l
    carry the same factor, which O / l cancels. Predicted to pay where the rescale is a large
    part of each score's work — differential attention at head dim 64, whose two accumulators
    are 2·BLOCK_N wide (two multiplies per score and stream)."""
    rescaled: dict = {}  # stream's maximum → the accumulators and sums its alpha rescales
    for pattern in (r"^ +(acc_\w+) = \1 \* alpha_(\w+) \+ tl\.sum\(", r"^ +(acc\d+) = \1 \* alpha_(\w+)\n"):
        for m in re.finditer(pattern, source, flags=re.M):
            rescaled.setdefault(m[2], dict())[m[1]] = None
    out = _sub(r"^( +)(acc_\w+) = \2 \* alpha_\w+ \+ tl\.sum\(", r"\1\2 = \2 + tl.sum(", source)
    out = _sub(r"^ +(acc\d+) = \1 \* alpha_\w+\n", "", out)
    out = _sub(r"^ +acc_(\w+) = new_\1\n", "", out)

    def lazy(match):
        indent, x, nan, floor, exp = match.groups()
        inner = indent + "    "
        return "".join([
            f"{indent}if tl.max(tl.where(tile_{x} > acc_{x} + {LAZY_GROWTH!r}, 1, 0)) > 0:\n",
            f"{inner}new_{x} = tl.maximum(acc_{x}, tile_{x}, {nan})\n",
            f"{inner}alpha_{x} = {exp}(acc_{x} - tl.maximum(new_{x}, {floor}, {nan}))\n",
            *(f"{inner}{a} = {a} * alpha_{x}\n" for a in rescaled.get(x, ())),
            f"{inner}acc_{x} = new_{x}\n",
            f"{indent}mu_{x} = tl.maximum(acc_{x}, {floor}, {nan})\n"])

    return _sub(r"^( +)new_(\w+) = tl\.maximum\(acc_\2, tile_\2, (propagate_nan=[^)]*)\)\n"
                r"\1mu_\2 = tl\.maximum\(new_\2, ([^,]+), propagate_nan=[^)]*\)\n"
                r"\1alpha_\2 = (tl\.exp2?)\(acc_\2 - mu_\2\)\n", lazy, out)


def _tile_address(address: str, col: str):
    """``(base terms, row stride, column stride)`` of a tile load's address ``base + (rm) * sr +
    ({col}) * sc``; None for a load of another shape."""
    terms = address.split(" + ")
    row = [t for t in terms if t.startswith("(rm) * ")]
    cols = [t for t in terms if t.startswith(f"({col}) * ")]
    if len(row) != 1 or len(cols) != 1:
        return None
    return [t for t in terms if t not in row + cols], row[0].split(" * ")[1], cols[0].split(" * ")[1]


def _insert_before(source: str, anchor: str, lines) -> str:
    """``lines`` inserted before the first line that starts with ``anchor``, at its indent."""
    indent = re.search(rf"^( +){anchor}", source, flags=re.M).group(1)
    return _sub(rf"^( +){anchor}", "".join(f"{indent}{line}\n" for line in lines) + r"\1" + anchor, source, 1)


def _through_descriptors(source: str, col: str, shape: str, block: str, start: str, where: str) -> str:
    """Each load of a 2-D tile of an input, rows ``rm`` and columns ``col`` (a [1, n] index
    whose stride is 1), read through a tensor descriptor (TMA bulk copy into shared memory,
    out-of-range elements zero) made before ``where`` (the start of a line; "": at the load)."""
    made: dict = {}

    def replace(match):
        indent, name, arg, address = match.groups()
        parts = _tile_address(address, col)
        if parts is None:
            return match.group(0)
        base, row_stride, _ = parts
        made[arg] = (f"{arg}_desc = tl.make_tensor_descriptor({' + '.join([f'{arg}_ptr', *base])}, [{shape}], "
                     f"[{row_stride}, 1], [{block}])")
        load = f"{indent}{name} = {arg}_desc.load([mt * BLOCK_M, {start}]).to(tl.float32)"
        return load if where else f"{indent}{made[arg]}\n{load}"

    out = _TILE_LOAD.sub(replace, source)
    if not made:
        raise ValueError(f"no [rm, {col}] tile load")
    return _insert_before(out, where, made.values()) if where else out


def bias_tma(source: str) -> str:
    """The score tile's tensor inputs (the Evoformer's pair bias) loaded through tensor
    descriptors: a TMA copy the pipeliner can issue ahead, read from shared memory in the
    layout the scores need, instead of a register load converted through shared memory."""
    return _through_descriptors(source, "cn", "M, N", "BLOCK_M, BLOCK_N", "start_n", "lo_t = 0")


def gate_tma(source: str) -> str:
    """The epilogue's [rows, Dv] tensor inputs (the Evoformer's gate) loaded through tensor
    descriptors."""
    return _through_descriptors(source, "dvc", "M, DV", "BLOCK_M, DVP", "0", "")


def gate_prefetch(source: str) -> str:
    """Before the key loop, a ``prefetch.global.L2`` of every 128-byte line of the epilogue's
    [rows, Dv] tensor inputs (the Evoformer's gate): no registers held across the loop (as
    loading it there would), and the epilogue's load then hits L2. Inline PTX: GPU only."""
    lines = []
    for _, name, arg, address in _TILE_LOAD.findall(source):
        parts = _tile_address(address, "dvc")
        if parts is not None:
            base, row_stride, col_stride = parts
            pointers = " + ".join([f"{arg}_ptr", *base, f"tl.minimum(rm, M - 1) * {row_stride}",
                                   f"pf_col * {col_stride}"])
            lines.append(f"pf_{name} = tl.inline_asm_elementwise('prefetch.global.L2 [$1]; mov.b32 $0, 0;', "
                         f"'=r,l', [{pointers}], dtype=tl.int32, is_pure=False, pack=1)")
    if not lines:
        raise ValueError("no [rm, dvc] tile load")
    setup = "pf_col = (tl.arange(0, (DVP + 63) // 64) * 64)[None, :]"  # one element per 128-byte line (2-byte dtype)
    return _insert_before(source, "lo_t = 0", [setup, *lines])


gate_prefetch.gpu_only = True


def bias_tma_gate_prefetch(source: str) -> str:
    """``bias_tma`` and ``gate_prefetch`` together."""
    return gate_prefetch(bias_tma(source))


bias_tma_gate_prefetch.gpu_only = True


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 4


def _one_loop(source: str) -> str:
    """The key loop as one loop of masked tiles: the full tiles' loop dropped, the remainder
    loop started at the first tile."""
    source = _sub(r"^( +)for start_n in range\(\(lo_t\) \* BLOCK_N, \(n_split\)[^\n]*\n(?:\1 [^\n]*\n)+", "", source)
    return _sub(r"range\(\(n_split\) \* BLOCK_N, \(hi_t\)", "range((lo_t) * BLOCK_N, (hi_t)", source)


def _persistent(per_sm: int, flatten: bool, one_loop: bool = False):
    def edit(source: str) -> str:
        if one_loop:
            source = _one_loop(source)
        if "dvb = " in source:
            raise ValueError("persistent: a Dv-split kernel is not handled")
        head, sep, body = source.partition("    pid = tl.program_id(0)\n")
        if not sep:
            raise ValueError("persistent: no program id")
        batch = re.findall(r"\b(FB\d+)\b", head.splitlines()[-1])
        items = " * ".join(["tl.cdiv(M, BLOCK_M)", *batch])
        loop = (f"    pid0 = tl.program_id(0)\n    n_items = {items}\n"
                f"    n_progs = tl.minimum(n_items, {per_sm * _sms()})\n"
                f"    for pid in tl.range(pid0, tl.where(pid0 < n_progs, n_items, 0), n_progs"
                f"{', flatten=True' if flatten else ''}):\n")
        body, sep, rest = body.partition("\n@triton.jit")  # the module's next kernel (the repair) stays
        return (head + loop + "".join("    " + line if line.strip() else line for line in body.splitlines(True))
                + sep + rest)
    edit.__name__ = f"persistent_{per_sm}{'' if flatten else '_nested'}{'_one_loop' if one_loop else ''}"
    nest = ("flattened (tl.range(flatten=True)): the next row tile's key tiles are prefetched while this one "
            "finishes" if flatten else "left nested")
    edit.__doc__ = (f"A persistent grid: {per_sm} program(s) per SM each walk the row tiles (grid stride), the "
                    f"loop nest {nest}. The launch grid stays the printed one; programs beyond the persistent "
                    "count exit at once." + (" One key loop of masked tiles." if one_loop else ""))
    return edit


persistent_1, persistent_2, persistent_4, persistent_2_nested, persistent_2_one_loop, persistent_4_one_loop = (
    _persistent(1, True), _persistent(2, True), _persistent(4, True), _persistent(2, False),
    _persistent(2, True, True), _persistent(4, True, True))


half_dv.programs = 2
EDITS = {f.__name__: f for f in (loads_first, bias_in_dot, dots_first, v_first, half_dv, bias_tma, gate_tma, gate_prefetch,
                                 bias_tma_gate_prefetch, triton_sigmoid, lazy_rescale, persistent_1, persistent_2,
                                 persistent_4, persistent_2_nested, persistent_2_one_loop, persistent_4_one_loop)}


def swap_kernel(entry, source: str) -> None:
    """Run ``source`` (same parameters as the printed kernel) in place of ``entry``'s kernel."""
    kernel = cache.load_kernel(source, entry.plan.name)
    entry.plan = dataclasses.replace(entry.plan, source=source)
    entry.kernel = kernel
    entry.launcher = Launcher(entry.plan, kernel)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_case_options(parser)
    parser.add_argument("--edits", nargs="+", default=list(EDITS), choices=list(EDITS))
    parser.add_argument("--tiles", nargs="*", default=None, help="BMxBNxWxS, e.g. 64x64x4x2 (default: the kernel's candidates)")
    parser.add_argument("--show", action="store_true", help="print each edited loop")
    opts = parser.parse_args()
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    fields, fn, args, flops = case_of(opts)
    print(opts.variant, fields, torch.cuda.get_device_name(), flush=True)
    fast = fxflash.optimize(fn)
    before = set(region_op._REGISTRY)
    reference = fast(*args)
    (key,) = set(region_op._REGISTRY) - before
    entry = region_op._REGISTRY[key]
    print(f"tuner's pick for the printed kernel: {tuned_configs()}", flush=True)
    printed = entry.plan.source
    tiles = ([tuple(int(x) for x in t.split("x")) for t in opts.tiles] if opts.tiles
             else [tuple(c) for c in entry.plan.configs])
    for name in ["as printed", *opts.edits]:
        try:
            source = printed if name == "as printed" else EDITS[name](printed)
        except ValueError as exc:
            print(f"{name:<14} not applicable: {exc}", flush=True)
            continue
        swap_kernel(entry, source)
        if opts.show and name != "as printed":
            changed = [line for line in source.splitlines() if line not in printed.splitlines()]
            print("\n".join(f"    | {line}" for line in changed))
        best, programs = None, getattr(EDITS.get(name), "programs", 1)
        for tile in tiles:
            try:
                with tuning.pinned(tile):
                    out = fast(*args)
                    err = ((out.float() - reference.float()).norm() / reference.float().norm()).item()
                    graph = programs * medians(lambda: fast(*args))[1]
            except Exception as exc:  # a tile this edit cannot compile (resources)
                print(f"{name:<14} {tuning.describe(tile):<28} failed: {type(exc).__name__}", flush=True)
                continue
            print(f"{name:<14} {tuning.describe(tile):<28} {graph:.4f} ms (graph replay) "
                  f"{flops / graph / 1e9:.0f} TFLOP/s  rel. diff {err:.1e}", flush=True)
            if best is None or graph < best[1]:
                best = (tile, graph)
        if best:
            print(f"{name:<14} best {tuning.describe(best[0])}: {best[1]:.4f} ms", flush=True)


if __name__ == "__main__":
    main()
