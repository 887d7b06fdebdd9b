"""fxflash's own stages on a tiny random Llama (hidden 128, eager attention, fp32, CPU, 2 × 64 tokens,
one sequence padded) as its layer count grows: ``explain()``'s compile-time line per layer count.
Identical layers should cost each stage the same per layer.

    PYTHONPATH=. python benchmarks/probes/probe_analysis_scaling.py [layers ...]    (8 16 32 by default)
"""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import fxflash


def main() -> None:
    for layers in [int(a) for a in sys.argv[1:]] or [8, 16, 32]:
        config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=layers, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=32, vocab_size=1000, max_position_embeddings=8192)
        config._attn_implementation = "eager"
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
        ids = torch.randint(0, 1000, (2, 64))
        mask = torch.ones(2, 64, dtype=torch.long)
        mask[1, :10] = 0
        report = str(fxflash.explain(model, input_ids=ids, attention_mask=mask, logits_to_keep=1)).splitlines()
        print(f"{layers} layers: {report[0]}; {next(line for line in report if line.startswith('compile time'))}")


if __name__ == "__main__":
    main()
