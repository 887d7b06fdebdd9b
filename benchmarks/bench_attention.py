"""Side-by-side timings of attention variants: fxflash, eager, torch.compile, FlexAttention, SDPA.

    PYTHONPATH=. python benchmarks/bench_attention.py [--variants …] [--seqlens …] [--out CSV]
    PYTHONPATH=. python benchmarks/bench_attention.py --suite beyond [--variants …] [--seqlens …]
    PYTHONPATH=. python benchmarks/bench_attention.py --suite train [--variants …] [--seqlens …]
    PYTHONPATH=. python benchmarks/bench_attention.py --suite decode [--variants …] [--seqlens …]

The FlexAttention paper's configs: bf16, 16 query heads (2 KV heads for GQA), head dim 64,
batch × seqlen = 16k tokens (``--heads 32 --kv-heads 8 --head-dim 128 --seqlens 4096 16384``: a
Llama-class model's attention); sliding window and prefix 256; 12 documents. Further index
masks, by ``--variants`` only (``EXTRA_MASKS``): block-causal blocks of 256, a dilated window
(512 keys each side, every 2nd), 2-D neighbourhoods of radius 8 on a √S × √S canvas, and key
padding from per-batch lengths (``key_lengths``: lengths drawn uniformly from [S/4, S]). Times are medians
of ``triton.testing.do_bench``. FlexAttention's kernel time (block mask built once, cached,
as its users do) and its ``create_block_mask`` time are separate rows. ``fxflash_sdpa`` is
``fxflash.optimize`` of the SDPA call itself (vanilla, causal, and ``key_lengths`` as a boolean
mask built in the graph), calls without a mask read as their math form too
(``config.sdpa_calls``). Each system is timed
from the same state: after a 0.2 s rest and 250 ms of back-to-back calls (``settled_ms``).
``peak_mb`` is ``torch.cuda.max_memory_allocated`` during one call beyond the memory held
before it (the inputs). TFLOP/s use the dense count ``2·B·H·M·N·(D + Dv)`` for every variant.
Rows append to ``benchmarks/results/<gpu-name>.csv`` (one row per variant, config, system).

The ``beyond`` suite times the programs no template expresses against eager and
torch.compile: differential attention (``diff_attention``, and by ``--variants`` its causal
form ``diff_attention_causal`` and ``diff_transformer`` with λ from parameters and the per-head
RMSNorm; bf16; 32 heads of dim 64 in 16 pairs with V of width 128, and 16 heads of dim 128 in 8 pairs with V of width 256; seqlen 512 to 16k at batch ×
seqlen = 16k), the Evoformer's gated row attention (batch 1, 8, 32; N_seq = S = 256; 4 heads;
head dim 64 and 128; ``B`` in the CSV is batch × N_seq), sigmoid and ReLU attention (the
softmax suite's shapes). Their TFLOP/s count the eager program's matrix products:
``2·B·Hqk·M·N·D + 2·B·Hv·M·N·Dv``.

The ``train`` suite times one forward plus backward (``run_train``): the softmax family at 4k
and 16k with 16 heads of dim 64 and with GQA 32/8 at head dim 128, against FlexAttention, SDPA,
eager and torch.compile; differential attention, the Evoformer (batch 8, its pair bias and gate
differentiated) and sigmoid attention against eager and torch.compile.

The ``decode`` suite (``decode.py``) times generation's steps: 1 or 16 new queries against a cache
of 8k to 128k keys, GQA 32/8 at head dim 128 and MHA at head dim 64; ``--seqlens`` picks cache
lengths.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import math
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fxflash  # noqa: E402
from fxflash import variants as V  # noqa: E402
from fxflash.runtime import tuning  # noqa: E402

FIELDS = "suite,variant,B,H,Hkv,M,N,D,Dv,dtype,system,ms,tflops,peak_mb,device,torch,triton".split(",")
WINDOW, PREFIX, DOCS = 256, 256, 12
# further index masks (not in the default suite): block-causal blocks, a dilated window
# (keys within DILATED_WINDOW at every DILATION-th distance), 2-D neighbourhoods of radius
# NEIGHBOURHOOD on a square canvas of √S × √S tokens
BLOCK, DILATED_WINDOW, DILATION, NEIGHBOURHOOD = 256, 512, 2, 8


def flex_api():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    return torch.compile(flex_attention, dynamic=False), create_block_mask


def document_ids(n: int, docs: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    cuts = torch.sort(torch.randperm(n - 1, generator=g)[: docs - 1] + 1)[0]
    ids = torch.zeros(n, dtype=torch.int64)
    ids[cuts] = 1
    return ids.cumsum(0).to(device)


def case(name: str, B, H, Hkv, S, D, device, dtype):
    """(fxflash/eager program, its args, flex score_mod, flex mask_mod, sdpa callable or None)."""
    g = torch.Generator(device="cpu").manual_seed(1)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    q, k, v = rnd(B, H, S, D), rnd(B, Hkv, S, D), rnd(B, Hkv, S, D)
    gqa = Hkv != H
    attention = V.gqa_expand if gqa else V.vanilla
    score_mod = mask_mod = None
    sdpa = None
    if name == "vanilla":
        fn, args = attention, (q, k, v)
        sdpa = functools.partial(torch.nn.functional.scaled_dot_product_attention, enable_gqa=gqa)
    elif name == "alibi":
        fn, args = V.alibi, (q, k, v)
        slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, device=device) / H)

        def score_mod(score, b, h, qi, ki):
            return score + slopes[h] * (ki - qi)
    elif name == "softcap":
        fn, args = V.softcap, (q, k, v)

        def score_mod(score, b, h, qi, ki):
            return 20.0 * torch.tanh(score / 20.0)
    elif name == "causal":
        fn, args = V.causal, (q, k, v)

        def mask_mod(b, h, qi, ki):
            return qi >= ki
        sdpa = functools.partial(torch.nn.functional.scaled_dot_product_attention, is_causal=True, enable_gqa=gqa)
    elif name == "sliding_window":
        fn, args = functools.partial(V.sliding_window, window=WINDOW), (q, k, v)

        def mask_mod(b, h, qi, ki):
            return (qi >= ki) & (qi - ki < WINDOW)
    elif name == "prefix_lm":
        fn, args = functools.partial(V.prefix_lm, prefix=PREFIX), (q, k, v)

        def mask_mod(b, h, qi, ki):
            return (ki <= qi) | (ki < PREFIX)
    elif name == "block_causal":
        fn, args = functools.partial(V.block_causal, block=BLOCK), (q, k, v)

        def mask_mod(b, h, qi, ki):
            return qi // BLOCK >= ki // BLOCK
    elif name == "dilated_window":
        fn, args = functools.partial(V.dilated_window, window=DILATED_WINDOW, dilation=DILATION), (q, k, v)

        def mask_mod(b, h, qi, ki):
            return ((qi - ki).abs() <= DILATED_WINDOW) & ((qi - ki) % DILATION == 0)
    elif name == "neighbourhood_2d":
        width = math.isqrt(S)
        fn, args = functools.partial(V.neighbourhood_2d, width=width, radius=NEIGHBOURHOOD), (q, k, v)

        def mask_mod(b, h, qi, ki):
            return (((qi // width - ki // width).abs() <= NEIGHBOURHOOD)
                    & ((qi % width - ki % width).abs() <= NEIGHBOURHOOD))
    elif name == "key_lengths":
        lengths = torch.randint(S // 4, S + 1, (B,), generator=torch.Generator().manual_seed(4)).to(device)
        fn, args = V.key_lengths, (q, k, v, lengths)

        def mask_mod(b, h, qi, ki):
            return ki < lengths[b]

        def sdpa(q, k, v):  # the boolean key mask built in the graph, as transformers builds its padding
            keep = torch.arange(k.size(-2), device=k.device)[None, :] < lengths[:, None]
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :],
                                                                    enable_gqa=gqa)
    elif name == "document_mask":
        ids = document_ids(S, DOCS, device)
        fn, args = V.document_mask, (q, k, v, ids)

        def mask_mod(b, h, qi, ki):
            return ids[qi] == ids[ki]
    else:
        raise ValueError(name)
    if gqa and name not in ("vanilla",):
        fn = _gqa_wrap(fn)
    return fn, args, score_mod, mask_mod, sdpa


def _gqa_wrap(fn):
    """The variant with its k and v expanded to the query heads (the Llama way)."""
    def gqa(q, k, v, *rest):
        b, hkv, n, d = k.shape
        g = q.size(1) // hkv
        k = k[:, :, None].expand(b, hkv, g, n, d).reshape(b, hkv * g, n, d)
        v = v[:, :, None].expand(b, hkv, g, n, v.size(-1)).reshape(b, hkv * g, n, v.size(-1))
        return fn(q, k, v, *rest)
    functools.update_wrapper(gqa, fn)
    return gqa


def settled_ms(call) -> float:
    """``do_bench`` median of ``call`` (ms), every call timed from the same state, as the
    tuner times its contenders (``tuning.REST_MS``, ``SETTLE_MS``, ``MEASURE_MS``): the GPU
    rests, runs the call back to back (its clock settles at what the call's power draw allows
    at the H200's 700 W limit) and is timed. Without the rest, a call timed right after a
    hotter one ran at a recovering clock for up to 400 ms (benchmarks/NOTES.md, 2026-11-22)."""
    torch.cuda.synchronize()
    time.sleep(tuning.REST_MS / 1e3)
    return triton.testing.do_bench(call, warmup=tuning.SETTLE_MS, rep=tuning.MEASURE_MS, return_mode="median")


def medians(call) -> tuple[float, float]:
    """(``settled_ms``, CUDA-graph replay median) of ``call``, ms: the second leaves out the
    host time between launches (for probes of calls that may be host-bound)."""
    call()
    bench = settled_ms(call)
    with torch.cuda.stream(torch.cuda.Stream()):
        graph = triton.testing.do_bench_cudagraph(call, rep=200, return_mode="median")
    return bench, graph


def measure(call) -> tuple[float, float]:
    """(``settled_ms``, peak memory beyond the inputs in MB) of ``call``."""
    call()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return settled_ms(call), peak


def tuned_configs() -> str:
    """The tile configuration fxflash's tuner last picked (or read from its cache)."""
    from fxflash.runtime import tuning

    if not tuning.history:
        return "none (not tuned)"
    last = tuning.history[-1]
    how = "from tuning.json" if last["from_disk"] else f"timed in {last['seconds']:.1f} s"
    return f"{tuning.describe(last['config'])} ({how})"


def check_fused(fast, args, label):
    """An fxflash row is recorded only for a call whose every candidate region fused (its own
    report); otherwise the row would time eager code under fxflash's name."""
    report = fast.report(*args)
    regions = report.regions if report is not None else []
    if not regions or not all(r.fused for r in regions):
        raise AssertionError(f"{label}: fxflash did not fuse: " + ("; ".join(
            f"{r.rule}: {r.reason}" for r in regions if not r.fused) or "no region"))


def check(out, ref, label):
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    if not err < 2e-2:
        raise AssertionError(f"{label}: relative error {err:.3g} against eager")


KEY_FIELDS = ("suite", "variant", "B", "H", "Hkv", "M", "N", "D", "Dv", "dtype", "system")


def _row_key(row: dict, system: str) -> tuple:
    return tuple(str(row[f]) if f != "system" else system for f in KEY_FIELDS)


def rows_done(out_path: str) -> set:
    """Keys of the rows already in ``out_path`` (for ``--resume``)."""
    if not os.path.exists(out_path):
        return set()
    with open(out_path, newline="") as f:
        return {_row_key(row, row["system"]) for row in csv.DictReader(f)}


@contextlib.contextmanager
def result_rows(out_path: str, resume: bool = False):
    """Warm the GPU, open ``out_path`` for appending (header when new) and yield
    ``record(row, system, label, before_timing, call, flops)``: it runs ``before_timing``
    (a correctness check), times ``call`` (NaN on out-of-memory), writes and prints the row.
    ``record.todo(row, systems)`` lists the systems whose row is not yet in the file when
    resuming (all of them otherwise). ``record`` returns the ms it wrote."""
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    done = rows_done(out_path) if resume else set()
    new = not os.path.exists(out_path)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "a", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        if new:
            writer.writeheader()

        def record(row, system, label, before_timing, call, flops):
            try:
                before_timing()
                ms, peak = measure(call)
                tflops = flops / (ms * 1e-3) / 1e12 if flops else float("nan")
            except torch.OutOfMemoryError:
                ms = peak = tflops = float("nan")
                torch.cuda.empty_cache()
            writer.writerow(dict(row, **meta, system=system, ms=f"{ms:.4f}", tflops=f"{tflops:.1f}",
                                 peak_mb=f"{peak:.1f}"))
            f.flush()
            print(f"{label} {system:<15} {ms:9.3f} ms {tflops:7.1f} TFLOP/s {peak:10.1f} MB", flush=True)
            return ms

        record.todo = lambda row, systems: [s for s in systems if _row_key(row, s) not in done]
        yield record


SOFTMAX_SYSTEMS = ("fxflash", "eager", "torch_compile", "flex_blockmask", "flex_kernel", "sdpa", "fxflash_sdpa")
BEYOND_SYSTEMS = ("fxflash", "eager", "torch_compile")


def softmax_calls(name, B, H, Hkv, S, D, device, dtype, flex, create_block_mask) -> dict:
    """``{system: zero-argument call}`` for one softmax-suite case: fxflash, eager,
    torch.compile, FlexAttention's kernel (block mask built once) and its mask build where the
    case has a mask_mod, SDPA where it applies."""
    fn, args, score_mod, mask_mod, sdpa = case(name, B, H, Hkv, S, D, device, dtype)
    q, k, v = args[:3]
    fast, compiled = fxflash.optimize(fn), torch.compile(fn, dynamic=False)
    calls = {"fxflash": lambda: fast(*args), "eager": lambda: fn(*args), "torch_compile": lambda: compiled(*args)}
    calls["fxflash"].fused = lambda label: check_fused(fast, args, label)
    block_mask = None
    if mask_mod is not None:
        def build():
            return create_block_mask(mask_mod, B if name in PER_BATCH_MASKS else None, None, S, S, device=device)
        block_mask = build()
        calls["flex_blockmask"] = build
    calls["flex_kernel"] = lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=Hkv != H)
    if sdpa is not None:
        calls["sdpa"] = lambda: sdpa(q, k, v)
        fast_sdpa = fxflash.optimize(sdpa)  # the SDPA call itself, read as its math form (with or without a mask)

        def fused_sdpa():
            with fxflash.config.overridden(sdpa_calls="all"):
                return fast_sdpa(q, k, v)
        calls["fxflash_sdpa"] = fused_sdpa

        def check_fused_sdpa(label):
            with fxflash.config.overridden(sdpa_calls="all"):
                check_fused(fast_sdpa, (q, k, v), label)
        calls["fxflash_sdpa"].fused = check_fused_sdpa
    return calls


def run(variants, seqlens, gqa_modes, out_path, tokens=16384, H=16, D=64, gqa_kv=2, systems=None, resume=False):
    dtype, device = torch.bfloat16, "cuda"
    flex, create_block_mask = flex_api()
    with result_rows(out_path, resume) as record:
        for S in seqlens:
            B = max(1, tokens // S)
            for gqa in gqa_modes:
                Hkv = gqa_kv if gqa else H
                for name in variants:
                    flops = 2 * B * H * S * S * (D + D)
                    row = dict(suite="softmax", variant=name + ("_gqa" if gqa else ""), B=B, H=H, Hkv=Hkv,
                               M=S, N=S, D=D, Dv=D, dtype="bf16")
                    todo = record.todo(row, systems or SOFTMAX_SYSTEMS)
                    if not todo:
                        continue
                    torch._dynamo.reset()
                    calls = softmax_calls(name, B, H, Hkv, S, D, device, dtype, flex, create_block_mask)
                    # fxflash is checked against FlexAttention, an independent implementation that,
                    # like fxflash, keeps scores in fp32 (eager rounds the bf16 bias of ALiBi)
                    reference = calls["flex_kernel"]()
                    label = f"{row['variant']:<22} S={S:<6} B={B:<3}"

                    def check_fxflash(system):
                        check(calls[system](), reference, f"{label} {system}")
                        calls[system].fused(label)
                        print("   tuned:", tuned_configs(), flush=True)

                    for system, call in calls.items():
                        if system in todo:
                            checked = hasattr(call, "fused")
                            record(row, system, label, functools.partial(check_fxflash, system) if checked
                                   else (lambda: None), call, 0 if system == "flex_blockmask" else flops)
                    calls.clear()
                    torch.cuda.empty_cache()


EVOFORMER_BATCHES = (1, 8, 32)


def beyond_cases(name: str, seqlens, device, dtype, tokens=16384, batches=EVOFORMER_BATCHES):
    """(row fields, program, args, flops) for each config of a ``beyond``-suite variant
    (``batches``: the Evoformer's, issue 4's by default)."""
    g = torch.Generator(device="cpu").manual_seed(2)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(device=device, dtype=dtype)

    if name in ("diff_attention", "diff_attention_causal", "diff_transformer", "diff_attention_chunked"):
        for heads, d in ((32, 64), (16, 128)):
            for S in seqlens:
                B, H = max(1, tokens // S), heads // 2
                args = rnd(B, heads, S, d), rnd(B, heads, S, d), rnd(B, H, S, 2 * d)
                if name == "diff_transformer":  # λ's four parameter vectors and subln's weight
                    args += tuple(rnd(d, scale=0.1) for _ in range(4)) + (1 + rnd(2 * d, scale=0.1),)
                flops = 2 * B * heads * S * S * d + 2 * B * H * S * S * 2 * d
                yield dict(B=B, H=heads, Hkv=heads, M=S, N=S, D=d, Dv=2 * d), getattr(V, name), args, flops
    elif name in ("evoformer_row", "evoformer_col"):
        n_seq = S = 256
        H = 4
        for d in (64, 128):
            for B in batches:
                q, k, v, gate = (rnd(B, n_seq, S, H, d) for _ in range(4))
                mask = (torch.rand(B, n_seq, S, generator=g) > 0.1).to(device=device, dtype=dtype)
                fn = getattr(V, name)
                args = (q, k, v, mask, rnd(B, 1, H, S, S), gate) if name == "evoformer_row" else (q, k, v, mask, gate)
                flops = 2 * B * n_seq * H * S * S * 2 * d
                yield dict(B=B * n_seq, H=H, Hkv=H, M=S, N=S, D=d, Dv=d), fn, args, flops
    elif name in ("sigmoid_attention", "relu_attention"):
        for S in seqlens:
            B, H, d = max(1, tokens // S), 16, 64
            args = rnd(B, H, S, d), rnd(B, H, S, d), rnd(B, H, S, d)
            yield dict(B=B, H=H, Hkv=H, M=S, N=S, D=d, Dv=d), getattr(V, name), args, 2 * B * H * S * S * 2 * d
    else:
        raise ValueError(name)


def run_beyond(variants, seqlens, out_path, systems=None, resume=False):
    """The ``beyond`` suite: fxflash, eager and torch.compile; fxflash checked against eager."""
    dtype, device = torch.bfloat16, "cuda"
    with result_rows(out_path, resume) as record:
        for name in variants:
            for fields, fn, args, flops in beyond_cases(name, seqlens, device, dtype):
                row = dict(suite="beyond", variant=name, dtype="bf16", **fields)
                todo = record.todo(row, systems or BEYOND_SYSTEMS)
                if not todo:
                    continue
                torch._dynamo.reset()
                fast = fxflash.optimize(fn)
                compiled = torch.compile(fn, dynamic=False)
                calls = {"fxflash": lambda: fast(*args), "eager": lambda: fn(*args),
                         "torch_compile": lambda: compiled(*args)}
                try:
                    reference = fn(*args)
                except torch.OutOfMemoryError:
                    reference = None
                    torch.cuda.empty_cache()
                label = f"{name:<18} {str(fields):<70}"

                def check_fxflash():
                    check_fused(fast, args, label)
                    if reference is not None:
                        check(calls["fxflash"](), reference, f"{label} fxflash")

                for system, call in calls.items():
                    if system in todo:
                        record(row, system, label, check_fxflash if system == "fxflash" else (lambda: None),
                               call, flops)
                reference = None  # free it before the next case
                calls.clear()
                torch.cuda.empty_cache()


TRAIN_SYSTEMS = ("fxflash", "eager", "torch_compile", "flex_kernel", "sdpa")
TRAIN_SOFTMAX_SHAPES = ((16, 16, 64), (32, 8, 128))   # (H, Hkv, D): MHA at 64, Llama's GQA 32/8 at 128


def _train_step(call, leaves, grad):
    """One forward plus backward of ``call``; the leaves' gradients dropped first, so that a step's
    peak counts the gradients it makes and not the last step's."""
    def step():
        for t in leaves:
            t.grad = None
        call().backward(grad)
    return step


def _grads_close(step, leaves, reference, label):
    """fxflash's gradients against the reference system's, as ``check`` compares outputs (not
    compared where the reference runs out of memory: eager at 16k)."""
    step()
    got = [t.grad.clone() for t in leaves]
    try:
        reference()
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        print(f"{label}: gradients not compared (the reference ran out of memory)", flush=True)
        return
    for a, b in zip(got, (t.grad for t in leaves)):
        check(a, b, f"{label} gradient")


# the inputs of a train case that take no gradient (the Evoformer's 0/1 mask)
NO_GRADIENT = {"evoformer_row": (3,), "evoformer_col": (3,)}


def run_train(variants, seqlens, out_path, systems=None, resume=False, tokens=16384, shapes=TRAIN_SOFTMAX_SHAPES):
    """The ``train`` suite: ``ms`` is one forward plus backward (gradients of every floating
    input), ``peak_mb`` the peak beyond the inputs and their gradients, TFLOP/s the dense count
    times 3.5 (the backward's five products against the forward's two). The softmax family at
    each ``TRAIN_SOFTMAX_SHAPES``, against FlexAttention (block mask built once) and SDPA where it
    applies; ``beyond`` variants (differential attention, the Evoformer with its pair bias and
    gate, sigmoid attention) at the beyond suite's shapes, against eager and torch.compile.
    fxflash's rows are recorded only where its report says the region fused forward and backward
    and its gradients match the reference system's."""
    dtype, device = torch.bfloat16, "cuda"
    flex, create_block_mask = flex_api()
    with result_rows(out_path, resume) as record:
        for name in variants:
            if name in SUITES["beyond"] or name.startswith(("diff_", "evoformer")):
                cases = [(dict(dtype="bf16", **fields), fn, args, 3.5 * flops)
                         for fields, fn, args, flops in beyond_cases(name, seqlens, device, dtype, batches=(8,))]
            else:
                cases = []
                for S in seqlens:
                    for H, Hkv, D in shapes:
                        B = max(1, tokens // S)
                        fields = dict(B=B, H=H, Hkv=Hkv, M=S, N=S, D=D, Dv=D, dtype="bf16")
                        cases.append((fields, (B, H, Hkv, S, D), None, 3.5 * 2 * B * H * S * S * 2 * D))
            for fields, fn, args, flops in cases:
                row = dict(suite="train", variant=name, **fields)
                todo = record.todo(row, systems or TRAIN_SYSTEMS)
                if not todo:
                    continue
                torch._dynamo.reset()
                score_mod = mask_mod = sdpa = None
                if args is None:   # a softmax-family case: its program, FlexAttention's mods, SDPA
                    B, H, Hkv, S, D = fn
                    fn, args, score_mod, mask_mod, sdpa = case(name, B, H, Hkv, S, D, device, dtype)
                args = tuple(a.detach().requires_grad_(a.is_floating_point() and i not in NO_GRADIENT.get(name, ()))
                             for i, a in enumerate(args))
                leaves = [a for a in args if a.requires_grad]
                fast, compiled = fxflash.optimize(fn), torch.compile(fn, dynamic=False)
                calls = {"fxflash": lambda: fast(*args), "eager": lambda: fn(*args),
                         "torch_compile": lambda: compiled(*args)}
                if score_mod is not None or mask_mod is not None or name == "vanilla":
                    q, k, v = args[:3]
                    block_mask = None if mask_mod is None else create_block_mask(
                        mask_mod, B if name in PER_BATCH_MASKS else None, None, S, S, device=device)
                    calls["flex_kernel"] = lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                                        enable_gqa=Hkv != H)
                if sdpa is not None:
                    calls["sdpa"] = lambda: sdpa(*args[:3])
                grad = torch.randn_like(fast(*args).detach())
                steps = {system: _train_step(call, leaves, grad) for system, call in calls.items()}
                label = f"{name:<18} {str(fields):<80}"

                def check_fxflash():
                    check_fused(fast, args, label)
                    notes = [r.backward for r in fast.report(*args).regions]
                    if notes != ["fused"] * len(notes):
                        raise AssertionError(f"{label}: backward not fused: {notes}")
                    reference = steps.get("flex_kernel") or steps["eager"]
                    _grads_close(steps["fxflash"], leaves, reference, label)

                for system, step in steps.items():
                    if system in todo:
                        record(row, system, label, check_fxflash if system == "fxflash" else (lambda: None),
                               step, flops)
                for t in leaves:
                    t.grad = None
                calls.clear(), steps.clear()
                torch.cuda.empty_cache()


EXTRA_MASKS = ["block_causal", "dilated_window", "neighbourhood_2d", "key_lengths"]  # --variants only
PER_BATCH_MASKS = ("document_mask", "key_lengths")  # FlexAttention's block mask is built per batch
SUITES = {
    "softmax": ["vanilla", "alibi", "softcap", "causal", "sliding_window", "prefix_lm", "document_mask"],
    "beyond": ["diff_attention", "evoformer_row", "sigmoid_attention", "relu_attention"],
    "train": ["vanilla", "alibi", "softcap", "causal", "sliding_window", "prefix_lm", "document_mask",
              "diff_attention", "evoformer_row", "sigmoid_attention"],
    "decode": ["vanilla", "causal", "softcap", "sliding_window"],   # decode.decode_case
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="softmax", choices=list(SUITES))
    parser.add_argument("--variants", nargs="*", default=None, help="default: the suite's variants")
    parser.add_argument("--seqlens", nargs="*", type=int, default=None,
                        help="default: 1k 4k 16k (softmax), 512 to 16k (beyond)")
    parser.add_argument("--gqa", nargs="*", default=["mha", "gqa"], choices=["mha", "gqa"])
    parser.add_argument("--heads", type=int, default=None, help="query heads (softmax suite: 16; train: "
                        "with --kv-heads and --head-dim, its one softmax shape instead of TRAIN_SOFTMAX_SHAPES)")
    parser.add_argument("--kv-heads", type=int, default=None, help="key/value heads (softmax suite: 2, under --gqa gqa)")
    parser.add_argument("--head-dim", type=int, default=None, help="head dim (softmax suite: 64)")
    parser.add_argument("--systems", nargs="*", default=None)
    parser.add_argument("--out", default=None)
    opts = parser.parse_args()
    name = torch.cuda.get_device_name().replace(" ", "_")
    out = opts.out or os.path.join(os.path.dirname(__file__), "results", f"{name}.csv")
    variants = opts.variants or SUITES[opts.suite]
    if opts.suite == "beyond":
        seqlens = opts.seqlens or [512, 1024, 2048, 4096, 8192, 16384]
        run_beyond(variants, seqlens, out, systems=opts.systems)
    elif opts.suite == "train":
        shape = (opts.heads, opts.kv_heads, opts.head_dim)
        run_train(variants, opts.seqlens or [4096, 16384], out, systems=opts.systems,
                  shapes=(shape,) if None not in shape else TRAIN_SOFTMAX_SHAPES)
    elif opts.suite == "decode":
        import decode

        caches = [c for c in decode.DECODE_CACHES if opts.seqlens is None or c[1] in opts.seqlens]
        shape = (opts.heads, opts.kv_heads, opts.head_dim)
        decode.run_decode(variants, caches, out, systems=opts.systems,
                          shapes=(shape,) if None not in shape else decode.DECODE_SHAPES)
    else:
        seqlens = opts.seqlens or [1024, 4096, 16384]
        run(variants, seqlens, [g == "gqa" for g in opts.gqa], out, H=opts.heads or 16, D=opts.head_dim or 64,
            gqa_kv=opts.kv_heads or 2, systems=opts.systems)


if __name__ == "__main__":
    main()
