"""How many graphs ``generate()`` compiles through ``optimize()``: a tiny random Llama (eager
attention, CPU), greedy, ``DynamicCache``; prints the seconds, the graphs compiled, the calls
and the regions fused per call.

    PYTHONPATH=. python benchmarks/probes/probe_decode_compiles.py [--tokens 10]
"""
import argparse
import time

import fxflash  # first: on a CPU it turns Triton's interpreter on before transformers imports Triton
import torch
from fxflash.backend import recording
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=10)
    tokens = parser.parse_args().tokens
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=100, attn_implementation="eager")
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 100, (1, 12))
    model.forward = fxflash.optimize(model.forward)
    with torch.no_grad(), recording() as reports:
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=tokens, do_sample=False)
        seconds = time.perf_counter() - start
    print(f"generate: {seconds:.1f} s, {len({id(r) for r in reports})} graphs compiled for {len(reports)} calls; "
          f"regions fused per call: {[sum(r.fused for r in report.regions) for report in reports]}")


if __name__ == "__main__":
    main()
