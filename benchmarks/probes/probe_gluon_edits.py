"""Time hand edits of a region's generated Gluon kernel against the kernel as printed.

    PYTHONPATH=. python benchmarks/probes/probe_gluon_edits.py --variant evoformer_row --batch 8 --seqlen 256 \
        --per-element-loads --edits gate_first bias_async without:x3 --tiles gluonx1x128x3x0x2x1 gluonx1x128x2x0x2x1
    PYTHONPATH=. python benchmarks/probes/probe_gluon_edits.py --variant alibi --seqlen 16384 --edits hoist_key_linear
    PYTHONPATH=. python benchmarks/probes/probe_gluon_edits.py --variant evoformer_row --batch 8 --seqlen 256 \
        --tiles gluonx1x128x2x0x2x1 gluonx2x128x3x0x1x1 --edits no_release_fence

probe_edits.py's counterpart for the Gluon kernel (codegen/gluon.py): the variant's region is
compiled with the first tile pinned, then each named edit of its printed Gluon source (``EDITS``:
source → source, raising ValueError where it finds nothing to change) is swapped into the
registered region and timed with each tile of ``--tiles`` pinned, alternating the order of
the sources per round: CUDA-graph replay medians and the relative difference from the printed
kernel's output with the first tile (``no_release_fence``, the third line above, times what the
proxy fences before the consumers' releases cost; without them the second tile's results were
wrong in 4 of 10 calls). ``without:x1,x3`` replaces the named loads by 0.0 — it changes the result and
measures an upper bound, what those loads cost. The ``bias_*`` edits move the score's per-element
loads: print the kernel with ``--per-element-loads`` (config.gluon_tma_tiles off; with it on, a
[rows, keys] tile arrives by TMA instead, which is what the probe's measurements led to; the mask
bias's [1, keys] vector too unless ``FXFLASH_GLUON_TMA_KEY_VECTORS=0``; the edits that name the mask
bias's load ``x1`` were written for the bias eager computes: ``FXFLASH_VECTOR_PRODUCERS=0``). Cases are the suite's shapes
(``tile_sweep.case_of``). What wins is then built into codegen as a rule, with tests.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import statistics
import sys

sys.path[:0] = [os.path.dirname(__file__), os.path.join(os.path.dirname(__file__), "..")]
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

# a load of a tensor input, as emit's printer prints it: ``name = gl.load(address, mask=…, other=0).to(dtype)``
LOAD = re.compile(r"^( +)(\w+) = gl\.load\((.*), mask=(.*), other=0\)\.to\((gl\.\w+)\)$", re.M)
SCORE_FN = re.compile(r"(@gluon.jit\ndef _score\(s, rm, cn, )(.*?)(\):\n)(.*?\n    return \w+)", re.S)
ITEM_START = "    qb = it % QB\n    q = q_bufs.index(qb * CONSUMERS + WG)\n"
LOOP_TOP = "    for j in range(1, n_t):\n"
# the key tile of each score call in _attend: the first tile's, the loop's, and the tile after each
KEYS_FIRST = "gl.expand_dims(lo_t * BLOCK_N + cols, 0)"
KEYS_LOOP = "gl.expand_dims((lo_t + j) * BLOCK_N + cols, 0)"
KEYS_AFTER_FIRST = "gl.expand_dims((lo_t + 1) * BLOCK_N + cols, 0)"
KEYS_AFTER_LOOP = "gl.expand_dims((lo_t + j + 1) * BLOCK_N + cols, 0)"


def _must(found, what: str):
    if not found:
        raise ValueError(f"edit found nothing to change: {what}")
    return found


def _replace(src: str, old: str, new: str) -> str:
    _must(old in src, old.strip().splitlines()[0])
    return src.replace(old, new, 1)


def _score_call(src: str, keys: str):
    """The match of ``x = _score(s, rm, <keys>, <rest>)`` in _attend (group 1: indent, 2: rest)."""
    return _must(re.search(r"\n( +)x = _score\(s, rm, " + re.escape(keys) + r", ([^\n]*)\)", src), keys)


def hoist_key_linear(src: str) -> str:
    """ALiBi's printed score ``s + (c) * (cn − rm)``: ``c·cols`` computed once per item outside
    the key loop (``x = s + ub``), the row term ``c·(key0 − rm)`` added to each row's maximum and
    subtracted in the exponent, so one add per score is left of the bias."""
    fn = _must(SCORE_FN.search(src), "_score")
    lines, ret = fn.group(4).splitlines(), fn.group(4).split("return ")[-1]
    final = _must(next((ln for ln in lines if ln.strip().startswith(ret + " =")), None), ret)
    # the coefficient: the slope over the scale, printed clamped where the scale is below 1 (emit._divided)
    coef = _must(re.fullmatch(r"\s*\w+ = s \+ \((.+)\) \* \w+", final), "s + (c) * (cn - rm)").group(1)
    need = _must(re.search(r"\bt\d+\b", coef), "the slope").group(0)
    pre = []  # the lines computing the coefficient (they read neither rm nor cn)
    for ln in lines:
        if re.match(r"\s*t\d+ = ", ln) and not re.search(r"\b(rm|cn)\b", ln):
            pre.append(ln)
        if ln.strip().startswith(need + " ="):
            break
    anchor = "    row0 = mt * (CONSUMERS * BM) + WG * BM\n"
    src = _replace(src, anchor, anchor + "".join(ln + "\n" for ln in pre) + f"    a8 = {coef}\n"
                   "    ub = gl.expand_dims(cols.to(gl.float32) * a8, 0)\n"
                   "    rows_f = (row0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))).to(gl.float32)\n")
    for keys, tile in ((KEYS_FIRST, "lo_t"), (KEYS_LOOP, "(lo_t + j)")):
        call = _score_call(src, keys)
        ind = call.group(1)
        src = src.replace(call.group(0), f"\n{ind}x = s + ub\n{ind}wb = a8 * (({tile} * BLOCK_N).to(gl.float32) - rows_f)")
    k = _must(re.search(r"m = mx \* ([^\n]+)", src), "the row maximum").group(1)
    for old, new in (("mx = gl.max(x, axis=1)\n", "mx = gl.max(x, axis=1) + wb\n"),
                     ("gl.expand_dims(mu, 1))", f"gl.expand_dims(mu - wb * {k}, 1))"),
                     ("mx = gl.max(x, axis=1)\n", "mx = gl.max(x, axis=1) + wb\n"),
                     ("gl.expand_dims(mu_new, 1))", f"gl.expand_dims(mu_new - wb * {k}, 1))")):
        src = _replace(src, old, new)
    return src


def _split_score_loads(src: str, only=None) -> tuple[str, str, str]:
    """The score's loads (all, or those ``only`` accepts) moved into ``_score_loads(rm, cn, …)``
    returning them unconverted; ``_score`` takes them as ``<name>_raw``. Returns (source, the
    raw names joined, the score functions' shared trailing arguments)."""
    fn = _must(SCORE_FN.search(src), "_score")
    params, body = fn.group(2), fn.group(4)
    loads = [m for m in LOAD.finditer(body) if only is None or only(m)]
    _must(loads, "a load in _score")
    raws = ", ".join(f"{m.group(2)}_raw" for m in loads)
    for m in loads:
        body = body.replace(m.group(0), f"{m.group(1)}{m.group(2)} = {m.group(2)}_raw.to({m.group(5)})")
    loader = (f"@gluon.jit\ndef _score_loads(rm, cn, {params}):\n    col_ok = cn < N\n"
              + "".join(f"    {m.group(2)}_raw = gl.load({m.group(3)}, mask={m.group(4)}, other=0)\n" for m in loads)
              + f"    return {raws}\n\n\n")
    src = src.replace(fn.group(0), loader + fn.group(1) + raws + ", " + params + fn.group(3) + body)
    rest = None
    for keys in (KEYS_FIRST, KEYS_LOOP):
        call = _score_call(src, keys)
        rest = call.group(2)
        src = src.replace(call.group(0), f"\n{call.group(1)}x = _score(s, rm, {keys}, {raws}, {rest})")
    return src, raws, rest


def _bias_ahead(src: str, only=None) -> str:
    """The score's loads one key tile ahead, held in registers: tiles lo_t and lo_t + 1 at the
    item's start, tile lo_t + j + 1 at the top of iteration j."""
    src, raws, rest = _split_score_loads(src, only)
    rest = re.sub(r"\btile\d+\b", "0", rest)  # a TMA-read tile (not loaded here) is read after the wait for K
    ahead = raws.replace("_raw", "_next")
    src = _replace(src, ITEM_START, f"    {raws} = _score_loads(rm, {KEYS_FIRST}, {rest})\n"
                   f"    {ahead} = _score_loads(rm, {KEYS_AFTER_FIRST}, {rest})\n" + ITEM_START)
    return _replace(src, LOOP_TOP, LOOP_TOP + f"        {raws} = {ahead}\n"
                    f"        {ahead} = _score_loads(rm, {KEYS_AFTER_LOOP}, {rest})\n")


def bias_ahead(src: str) -> str:
    """Every load of the score one key tile ahead (registers)."""
    return _bias_ahead(src)


def bias_ahead_tile(src: str) -> str:
    """The score's [rows, keys] loads (the Evoformer's pair bias) one key tile ahead (registers)."""
    return _bias_ahead(src, lambda m: re.search(r"\brm\b", m.group(3)) and re.search(r"\bcn\b", m.group(3)))


def _async_copy_name() -> str:
    """Gluon's cp.async call: ``async_copy_global_to_shared`` (Triton 3.6), ``async_load`` (3.9)."""
    from triton.experimental.gluon.language.nvidia.ampere import async_copy

    return "async_load" if hasattr(async_copy, "async_load") else "async_copy_global_to_shared"


def bias_async(src: str) -> str:
    """The score's [rows, keys] load copied into shared memory by cp.async (one [BM, BLOCK_N]
    buffer per consumer, swizzled for the accumulator layout's reads) one key tile ahead: tile
    lo_t at the item's start, tile j + 1 once tile j has been read back."""
    fn = _must(SCORE_FN.search(src), "_score")
    params, body = fn.group(2), fn.group(4)
    m = _must(next((m for m in LOAD.finditer(body)
                    if re.search(r"\brm\b", m.group(3)) and re.search(r"\bcn\b", m.group(3))), None), "a [rows, keys] load")
    name, address, mask, dtype = m.group(2), m.group(3), m.group(4), m.group(5)
    ptr = re.match(r"\(?(in\d+_ptr)", address).group(1)
    body = body.replace(m.group(0), f"    {name} = {name}_raw.to({dtype})")
    copier = (f"@gluon.jit\ndef _score_copy(buf, rm, cn, {params}):\n    col_ok = cn < N\n"
              f"    async_copy.{_async_copy_name()}(buf, {address}, mask={mask})\n    async_copy.commit_group()\n\n\n")
    src = src.replace(fn.group(0), copier + fn.group(1) + f"{name}_raw, " + params + fn.group(3) + body)
    src = _replace(src, "from triton.language.extra import libdevice\n", "from triton.language.extra import libdevice\n"
                   "from triton.experimental.gluon.language.nvidia.ampere import async_copy\n")
    src = src.replace("ones, q_ready", "ones, b_bufs, q_ready")  # every signature and call passes the buffers
    alloc = "    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [NBUF, BLOCK_N, DV], v_desc.layout)\n"
    src = _replace(src, alloc, alloc + "    b_layout: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, order=[1, 0])\n"
                   f"    b_bufs = gl.allocate_shared_memory({ptr}.dtype.element_ty, [CONSUMERS, BM, BLOCK_N], b_layout)\n")
    rest = None
    for keys, after, more in ((KEYS_FIRST, KEYS_AFTER_FIRST, "1 < n_t"), (KEYS_LOOP, KEYS_AFTER_LOOP, "j + 1 < n_t")):
        call = _score_call(src, keys)
        ind, rest = call.group(1), call.group(2)
        src = src.replace(call.group(0), f"\n{ind}async_copy.wait_group(0)\n{ind}{name}_raw = bbuf.load(s_layout)\n"
                          f"{ind}if {more}:\n{ind}    _score_copy(bbuf, rm, {after}, {rest})\n"
                          f"{ind}x = _score(s, rm, {keys}, {name}_raw, {rest})")
    return _replace(src, ITEM_START, f"    bbuf = b_bufs.index(WG)\n    _score_copy(bbuf, rm, {KEYS_FIRST}, {rest})\n" + ITEM_START)


def _output_loads_at(src: str, anchor: str) -> str:
    """The epilogue's loads (an output gate) issued at ``anchor`` of _attend, converted where they were."""
    epilogue = _must(re.search(r"    rm = gl.expand_dims\(out_rows, 1\)\n", src), "the epilogue's output ops")
    loads = list(LOAD.finditer(src, epilogue.end()))
    _must(loads, "a load in the epilogue")
    early = ("    out_rows = row0 + gl.arange(0, BM, layout=o_rows)\n"
             "    out_cols = gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))\n"
             "    g_rm = gl.expand_dims(out_rows, 1)\n    g_dvc = gl.expand_dims(out_cols, 0)\n")
    for m in loads:
        src = src.replace(m.group(0), f"{m.group(1)}{m.group(2)} = {m.group(2)}_raw.to({m.group(5)})")
        load = f"gl.load({m.group(3)}, mask={m.group(4)}, other=0)"
        early += f"    {m.group(2)}_raw = " + re.sub(r"\brm\b", "g_rm", re.sub(r"\bdvc\b", "g_dvc", load)) + "\n"
    return _replace(src, anchor, early + anchor)


def gate_early(src: str) -> str:
    """The epilogue's loads issued before the item's last P·V product."""
    return _output_loads_at(src, "    last = (t + n_t - 1) % NBUF\n")


def gate_first(src: str) -> str:
    """The epilogue's loads issued at the item's start, held in registers across its key loop."""
    return _output_loads_at(src, ITEM_START)


def gate_prefetch(src: str) -> str:
    """The second loader warp prefetches each item's gate rows into L2 (``prefetch.global.L2``,
    one 128-byte line per row at head dim 64) before it waits for the item's last Q·Kᵀ, so
    that its TMA load into the Q buffers then hits L2."""
    sr = _must(re.search(r"gate0_row = \(gate0_off // (in(\d+)_s\d+)\)", src), "the gate's row stride")
    wait = "    mbarrier.wait(q_free.index(qb), (it // QB) & 1)\n"
    prefetch = (f"    pf_rows = gl.arange(0, CONSUMERS * BM, layout=gl.BlockedLayout([CONSUMERS * BM // 32], [32], [1], [0]))\n"
                f"    pf_ptrs = in{sr.group(2)}_ptr + (gate0_row + pf_rows).to(gl.int64) * {sr.group(1)} + gate0_col\n"
                "    gl.inline_asm_elementwise(\"prefetch.global.L2 [$1]; mov.u32 $0, 0;\", \"=r,l\", [pf_ptrs], "
                "dtype=gl.int32, is_pure=False, pack=1)\n")
    return _replace(src, wait, prefetch + wait)


def q_scale_on_scores(src: str) -> str:
    """Q's scale (gluon.q_tile_scale: each consumer rewrites its Q tile in shared memory, rounded
    as eager rounds ``q * c``) applied to the scores in fp32 instead, unrounded: what the pass over
    the Q tile costs."""
    m = _must(re.search(r"\n    q_in = q\.load\(.*\n    q_in = \(q_in\.to\(gl\.float32\) ([*/]) ([^)]+)\)\.to\(q_in\.dtype\)"
                        r"\n    q\.store\(q_in\)\n    fence_async_shared\(\)", src), "Q's scale lines")
    src = src.replace(m.group(0), "", 1)
    return src.replace("x = _score(s, ", f"x = _score(s {m.group(1)} {m.group(2)}, ").replace(
        "x = _score_full(s, ", f"x = _score_full(s {m.group(1)} {m.group(2)}, ")


# float(x) for an int32 |x| < 2²²: 0x4B400000 + x read as fp32 is exactly 1.5·2²³ + x (its ulp is 1)
MAGIC_INT, MAGIC_FLOAT = 0x4B400000, 12582912.0


def magic_int_to_float(src: str) -> str:
    """The score's int32 index difference (ALiBi's ``j − i``) converted to fp32 by an integer add,
    a bitcast and a float subtraction (exact for |j − i| < 2²²) instead of a conversion: the
    conversion runs on the special-function pipe beside the exponentials, the add and the
    subtraction on the ALU and FMA pipes."""
    m = _must(re.search(r"^( +t\d+ = s \+ \(.+\) \* )(t\d+)$", src, re.M), "an int32 factor of the score")
    _must(re.search(rf"^ +{m.group(2)} = \(\(t\d+ - t\d+\)\)\.to\(gl\.int32\)$", src, re.M), "an index difference")
    return src.replace(m.group(0), f"{m.group(1)}(({m.group(2)} + {MAGIC_INT}).to(gl.float32, bitcast=True) - {MAGIC_FLOAT})", 1)


WALK_LOOP = "        for item in range(gl.program_id(0), n_items, gl.num_programs(0)):\n"
TILE_EXPECT = re.compile(r"^( +)mbarrier\.expect\(k_ready\.index\(idx\), k_desc\.block_type\.nbytes((?: \+ tile\d+_desc\.block_type\.nbytes)+)\)\n", re.M)
TILE_LOAD = re.compile(r"^ +tma\.\w+\(tile\d+_desc, .*\n", re.M)


def no_tile_loads(src: str) -> str:
    """An upper bound: the [rows, keys] score tiles (the pair bias) never loaded by TMA, the
    consumers reading whatever their buffers hold (changes the result): what their L2 → shared
    memory traffic costs."""
    _must(TILE_EXPECT.search(src), "a tile's bytes in K's expect")
    src = TILE_EXPECT.sub(r"\1mbarrier.expect(k_ready.index(idx), k_desc.block_type.nbytes)\n", src)
    src, n = TILE_LOAD.subn("", src)
    _must(n, "a tile's TMA load")
    return src


def chunked_items(src: str) -> str:
    """Persistent grid: each CTA walks a contiguous run of items instead of every grid-th one."""
    return _replace(src, WALK_LOOP, "        chunk = gl.cdiv(n_items, gl.num_programs(0))\n"
                    "        for item in range(gl.program_id(0) * chunk, gl.minimum(gl.program_id(0) * chunk + chunk, n_items)):\n")


def bias_order(src: str) -> str:
    """Items numbered with the second batch axis fastest (the Evoformer's N_seq, over which its
    pair bias is broadcast), then the row block, the third and the first batch axes: with
    ``chunked_items`` a CTA's consecutive items read the same pair-bias rows."""
    order = ("@gluon.jit\ndef _bias_order(item, FB1, FB2, n_mt):\n    fb1 = item % FB1\n    r = item // FB1\n"
             "    mt = r % n_mt\n    r = r // n_mt\n    fb2 = r % FB2\n    fb0 = r // FB2\n"
             "    return ((fb0 * FB1 + fb1) * FB2 + fb2) * n_mt + mt\n\n\n@gluon.jit\ndef _walk(")
    src = _replace(src, "@gluon.jit\ndef _walk(", order)
    return _replace(src, "= _work(item, ", "= _work(_bias_order(item, FB1, FB2, gl.cdiv(M, BLOCK_M)), ")


def resident_tiles(src: str) -> str:
    """With ``chunked_items`` + ``bias_order`` and as many K/V buffers as key tiles: the score
    tiles loaded only at a CTA's first item and where the item's N_seq index is 0 (a new group of
    pair-bias rows), then read again by the following items from the same buffers (result kept)."""
    m = _must(TILE_EXPECT.search(src), "a tile's bytes in K's expect")
    ind, tiles = m.group(1), m.group(2)
    k_load = _must(re.search(r"^ +tma\.\w+\(k_desc, .*\n", src, re.M), "K's TMA load").group(0)
    loads = "".join("    " + ln.group(0) for ln in TILE_LOAD.finditer(src))
    new = (f"{ind}reload = (it == 0) | (fb1 == 0)\n{ind}if reload:\n"
           f"{ind}    mbarrier.expect(k_ready.index(idx), k_desc.block_type.nbytes{tiles})\n{ind}else:\n"
           f"{ind}    mbarrier.expect(k_ready.index(idx), k_desc.block_type.nbytes)\n{k_load}{ind}if reload:\n{loads}")
    src = src.replace(m.group(0) + k_load, new, 1)
    src, n = re.subn(r"(?m)^ {8}tma\.\w+\(tile\d+_desc, .*\n", "", src)
    _must(n, "a tile's TMA load after K's")
    return src


def no_release_fence(src: str) -> str:
    """What the proxy fence before each release of a buffer read with ordinary loads costs
    (gluon._release): the fence removed. Wrong results without it on persistent grids of two or
    three consumers (benchmarks/NOTES.md, 2026-11-24): a timing probe only."""
    src, n = re.subn(r"^TILE_LOADS = gl\.constexpr\(True\)", "TILE_LOADS = gl.constexpr(False)", src, flags=re.M)
    src, m = re.subn(r"_release\(q_empty\.index\(qb\), True\)", "_release(q_empty.index(qb), False)", src)
    _must(n + m, "a release of a buffer read with ordinary loads")
    return src


OUTPUT_STORE = re.compile(r"^( +)gl\.store\(out_ptr(.*), mask=(.*)\)\n", re.M)
TMA_STORE_SWITCH = "O_TMA: gl.constexpr = len(o_bufs.type.shape) == 3"  # defined once, by gluon.STORE_DRAIN


def no_store(src: str) -> str:
    """An upper bound: the epilogue's store predicated off at run time (``M < 0``), its values
    and addresses still computed, and where the rows would go by TMA (gluon._tma_store_lines)
    the per-element path taken instead (changes the result): what writing O costs."""
    m = _must(OUTPUT_STORE.search(src), "the epilogue's gl.store")
    src = src[:m.start()] + f"{m.group(1)}gl.store(out_ptr{m.group(2)}, mask=({m.group(3)}) & (M < 0))\n" + src[m.end():]
    return src.replace(TMA_STORE_SWITCH, "O_TMA: gl.constexpr = False")


def without(names: str):
    """An upper bound: the loads ``names`` (comma-separated) replaced by 0.0 (changes the result)."""
    def edit(src: str) -> str:
        for name in names.split(","):
            src, n = re.subn(rf"^( +){name} = gl\.load\(.*$", rf"\g<1>{name} = 0.0", src, flags=re.M)
            _must(n, f"a load named {name}")
        return src
    edit.__name__ = f"without:{names}"
    return edit


EDITS = {f.__name__: f for f in (hoist_key_linear, bias_ahead, bias_ahead_tile, bias_async, gate_early, gate_first,
                                  gate_prefetch, q_scale_on_scores, magic_int_to_float, no_tile_loads, chunked_items,
                                  bias_order, resident_tiles, no_release_fence, no_store)}


def edit_named(name: str):
    """An edit of ``EDITS``, ``without:NAMES``, or several joined by ``+`` (applied in turn)."""
    if "+" in name:
        edits = [edit_named(part) for part in name.split("+")]

        def chain(src: str) -> str:
            for edit in edits:
                src = edit(src)
            return src
        return chain
    if name.startswith("without:"):
        return without(name.split(":", 1)[1])
    return EDITS[name]


def main():
    import torch

    import fxflash
    from fxflash.runtime import op as region_op
    from fxflash.runtime import tuning
    from fxflash.runtime.launch import Launcher
    from bench_attention import medians
    from tile_sweep import add_case_options, case_of

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_case_options(parser)
    parser.add_argument("--edits", nargs="+", required=True, help=f"of {list(EDITS)}, or without:NAME[,NAME…]; A+B applies A, then B")
    parser.add_argument("--tiles", nargs="+", default=["gluonx3x128x3x0x1"], help="Gluon tiles as tuning labels")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--show", action="store_true", help="print each edited source")
    parser.add_argument("--per-element-loads", action="store_true",
                        help="print the kernel with config.gluon_tma_tiles off (the bias_* edits change those loads)")
    opts = parser.parse_args()
    fields, fn, args, flops = case_of(opts)
    print(opts.variant, fields, torch.cuda.get_device_name(), flush=True)
    fxflash.config.gluon_tma_tiles = not opts.per_element_loads
    fast = fxflash.optimize(fn)
    before = set(region_op._REGISTRY)
    with tuning.pinned(tuning.tile_of(opts.tiles[0])):
        reference = fast(*args)
    (key,) = set(region_op._REGISTRY) - before
    entry = region_op._REGISTRY[key]
    printed = entry.plan.gluon.source
    sources = {"printed": printed, **{name: edit_named(name)(printed) for name in opts.edits}}
    plans = {}
    for name, source in sources.items():
        if opts.show and name != "printed":
            print(source)
        plan = dataclasses.replace(entry.plan, gluon=dataclasses.replace(entry.plan.gluon, source=source))
        plans[name] = (plan, Launcher(plan, entry.kernel))
    times = {}
    for r in range(opts.rounds):
        for label in opts.tiles:
            for name in (list(sources) if r % 2 == 0 else list(sources)[::-1]):
                entry.plan, entry.launcher = plans[name]
                try:
                    with tuning.pinned(tuning.tile_of(label)):
                        out = fast(*args)
                        diff = ((out.float() - reference.float()).norm() / reference.float().norm()).item()
                        graph = medians(lambda: fast(*args))[1]
                except Exception as exc:  # an edit this tile cannot compile or launch
                    print(f"{label:<22} {name:<18} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                times.setdefault((label, name), []).append(graph)
                print(f"round {r} {label:<22} {name:<18} {graph:.4f} ms (graph replay) "
                      f"{flops / graph / 1e9:.0f} TFLOP/s  rel. diff {diff:.1e}", flush=True)
    entry.plan, entry.launcher = plans["printed"]
    for (label, name), t in sorted(times.items()):
        print(f"median {label:<22} {name:<18} {statistics.median(t):.4f} ms")


if __name__ == "__main__":
    main()
