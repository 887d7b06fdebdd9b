"""The ``decode`` suite: attention steps of generation, a few new query tokens against a long cache.

    PYTHONPATH=. python benchmarks/bench_attention.py --suite decode [--variants …] [--seqlens …]

Each step's queries are the last ``q_len`` positions (1, and 16 as speculative decoding verifies)
of a cache of ``N`` keys, bf16, as transformers writes them: ``repeat_kv`` by expand and reshape
for grouped-query heads, every mask aligned to the end of the cache (bottom-right). Variants:
``vanilla`` (no mask, a q_len-1 step), ``causal`` (the new tokens causal among themselves),
``softcap`` (Gemma 2's tanh cap at 20) and ``sliding_window`` (Mistral's, the last ``WINDOW`` keys
of each query). Shapes (``DECODE_SHAPES``): Llama-class GQA 32/8 at head dim 128 and MHA 32/32 at
head dim 64; ``(B, N)`` from ``DECODE_CACHES`` (``--seqlens`` picks cache lengths among them).
Systems: fxflash, SDPA (vanilla, and causal by a boolean mask: its ``is_causal`` aligns to the
first key), FlexAttention (its kernel chooses its decoding form for short query blocks; block mask
built once), torch.compile and eager. Rows use bench_attention's CSV schema (``M`` is q_len); the
log line adds the bytes a step must read (Q, K, V and O once) per second, since a decode step is
bound by memory: ``bandwidth_tbps``.
"""
from __future__ import annotations

import functools

import torch

import bench_attention as bench
import fxflash
from fxflash import variants as V

WINDOW = 4096
DECODE_SHAPES = ((32, 8, 128), (32, 32, 64))   # (H, Hkv, D)
DECODE_CACHES = ((1, 8192), (1, 32768), (1, 131072), (8, 8192), (8, 32768), (64, 2048))   # (B, N)
Q_LENS = (1, 16)
DECODE_SYSTEMS = ("fxflash", "sdpa", "flex_kernel", "torch_compile", "eager")


def sliding_window_at_the_end(q, k, v, window=WINDOW):
    """Mistral's window for queries at the cache's last positions: key j is kept by the query at
    position i (``N − q_len ≤ i < N``) when ``j ≤ i`` and ``i − j < window``."""
    m, n = q.size(-2), k.size(-2)
    i = torch.arange(n - m, n, device=q.device)[:, None]
    j = torch.arange(n, device=q.device)[None, :]
    keep = (j <= i) & (i - j < window)
    s = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v


def decode_case(name: str, B, H, Hkv, M, N, D, device, dtype, window=WINDOW):
    """(program, args, flex score_mod, flex mask_mod, sdpa callable or None) for one step."""
    g = torch.Generator(device="cpu").manual_seed(1)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    q, k, v = rnd(B, H, M, D), rnd(B, Hkv, N, D), rnd(B, Hkv, N, D)
    score_mod = mask_mod = sdpa = None
    offset = N - M   # the first query's position in the cache
    if name == "vanilla":
        fn = V.vanilla
        sdpa = functools.partial(torch.nn.functional.scaled_dot_product_attention, enable_gqa=Hkv != H)
    elif name == "causal":
        fn = V.causal
        keep = torch.ones(M, N, dtype=torch.bool, device=device).tril(offset)
        sdpa = functools.partial(torch.nn.functional.scaled_dot_product_attention, attn_mask=keep,
                                 enable_gqa=Hkv != H)

        def mask_mod(b, h, qi, ki):
            return qi + offset >= ki
    elif name == "softcap":
        fn = V.softcap

        def score_mod(score, b, h, qi, ki):
            return 20.0 * torch.tanh(score / 20.0)
    elif name == "sliding_window":
        fn = functools.partial(sliding_window_at_the_end, window=window)

        def mask_mod(b, h, qi, ki):
            return (qi + offset >= ki) & (qi + offset - ki < window)
    else:
        raise ValueError(name)
    return (bench._gqa_wrap(fn) if Hkv != H else fn), (q, k, v), score_mod, mask_mod, sdpa


def bandwidth_tbps(B, H, Hkv, M, N, D, ms: float, itemsize: int = 2) -> float:
    """TB/s of the bytes one step cannot avoid: K and V once per K/V head, Q read and O written."""
    return (2 * B * Hkv * N * D + 2 * B * H * M * D) * itemsize / (ms * 1e-3) / 1e12


def run_decode(variants, caches, out_path, systems=None, resume=False, shapes=DECODE_SHAPES, q_lens=Q_LENS):
    dtype, device = torch.bfloat16, "cuda"
    flex, create_block_mask = bench.flex_api()
    with bench.result_rows(out_path, resume) as record:
        for name in variants:
            for M in q_lens:
                if name == "vanilla" and M > 1:
                    continue   # several new tokens are causal among themselves: the causal rows
                for H, Hkv, D in shapes:
                    for B, N in caches:
                        row = dict(suite="decode", variant=name, B=B, H=H, Hkv=Hkv, M=M, N=N, D=D, Dv=D,
                                   dtype="bf16")
                        todo = record.todo(row, systems or DECODE_SYSTEMS)
                        if not todo:
                            continue
                        torch._dynamo.reset()
                        fn, args, score_mod, mask_mod, sdpa = decode_case(name, B, H, Hkv, M, N, D, device, dtype)
                        q, k, v = args
                        fast, compiled = fxflash.optimize(fn), torch.compile(fn, dynamic=False)
                        calls = {"fxflash": lambda: fast(*args), "torch_compile": lambda: compiled(*args),
                                 "eager": lambda: fn(*args)}
                        block_mask = None if mask_mod is None else create_block_mask(
                            mask_mod, None, None, M, N, device=device)
                        calls["flex_kernel"] = lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                                            enable_gqa=Hkv != H)
                        if sdpa is not None:
                            calls["sdpa"] = lambda: sdpa(q, k, v)
                        reference = calls["flex_kernel"]()
                        label = f"{name:<15} q_len={M:<3} B={B:<3} N={N:<7} H={H}/{Hkv} d{D}"

                        def check_fxflash():
                            bench.check(fast(*args), reference, label)
                            bench.check_fused(fast, args, label)

                        flops = 2 * B * H * M * N * (D + D)
                        for system in DECODE_SYSTEMS:
                            if system in todo and system in calls:
                                ms = record(row, system, label, check_fxflash if system == "fxflash"
                                            else (lambda: None), calls[system], flops)
                                print(f"{'':>52} {bandwidth_tbps(B, H, Hkv, M, N, D, ms):6.2f} TB/s", flush=True)
                        calls.clear()
                        torch.cuda.empty_cache()
