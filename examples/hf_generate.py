"""Generate with a Hugging Face transformers model whose attention fxflash fuses.

    python examples/hf_generate.py                      # a tiny random Llama (CPU or GPU)
    python examples/hf_generate.py path/to/checkpoint   # a local checkpoint directory
        [--tokens 16] [--batch 2] [--prompt 16] [--cache static|dynamic]

The model keeps its eager attention (``attn_implementation="eager"``): fxflash reads that code
and fuses it. ``generate()`` calls the model's own ``forward``, so the forward is optimized in
place. Prints the regions fused per forward call, whether the tokens match eager's, and the
tokens per second of both. Without a GPU the kernels run in Triton's interpreter: right, slow.
"""
from __future__ import annotations

import argparse
import time

import torch

import fxflash
from fxflash.backend import recording


def build(path: str | None, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if path:
        return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=dtype).to(device).eval()
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device, dtype).eval()


def timed_generate(model, inputs: dict, settings: dict):
    if inputs["input_ids"].is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = model.generate(**inputs, **settings)
    if tokens.is_cuda:
        torch.cuda.synchronize()
    return tokens, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", nargs="?", default=None)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--cache", choices=["dynamic", "static"], default="static")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = build(args.checkpoint, device, dtype)

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt), generator=g).to(device)
    mask = torch.ones_like(ids)
    mask[1:, : args.prompt // 4] = 0  # the later rows left-padded, as batched prompts are
    inputs = dict(input_ids=ids, attention_mask=mask)
    settings = dict(max_new_tokens=args.tokens, do_sample=False, cache_implementation=args.cache,
                    pad_token_id=0)

    with torch.no_grad():
        expected, eager_s = timed_generate(model, inputs, settings)
        model.forward = fxflash.optimize(model.forward)
        timed_generate(model, inputs, settings)  # the first call compiles (and tunes, on a GPU)
        with recording() as reports:
            tokens, fused_s = timed_generate(model, inputs, settings)

    graphs = {id(r): r for r in reports}
    print(f"{len(reports)} graph runs of {len(graphs)} compiled graphs; fused regions per graph:")
    for report in graphs.values():
        print(f"  {report!r}: " + "; ".join(r.verdict() for r in report.regions if r.fused))
    new = args.batch * args.tokens
    print(f"tokens match eager's: {torch.equal(tokens, expected)}")
    print(f"eager:   {new / eager_s:8.1f} tokens/s")
    print(f"fxflash: {new / fused_s:8.1f} tokens/s  ({device}, {dtype})")


if __name__ == "__main__":
    main()
