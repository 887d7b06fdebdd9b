"""The logits of benchmarks/hf_llama.py's model (2 layers, bf16, 4 × 4096, unpadded and left-padded)
through ``fxflash.optimize`` and eager, each against the same model in fp32: the largest error over
the rows the mask keeps and over all rows.

    PYTHONPATH=. python benchmarks/probes/probe_llama_logits.py    (a CUDA GPU)
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import hf_llama as H  # noqa: E402

import fxflash  # noqa: E402


def main() -> None:
    args = argparse.Namespace(layers=2, batch=4, seq=4096)
    model = H._model(args, "eager")
    exact = H._model(args, "eager").float()
    run = fxflash.optimize(model)
    for padded in (False, True):
        x = {**H._inputs(args, padded), "logits_to_keep": 0}
        with torch.no_grad():
            fused, eager, ref = run(**x).logits.float(), model(**x).logits.float(), exact(**x).logits
        keep = x["attention_mask"].bool()
        print(f"padded={padded}: kept rows: fused {(fused - ref).abs()[keep].max().item():.4g}, eager "
              f"{(eager - ref).abs()[keep].max().item():.4g}; all rows: fused {(fused - ref).abs().max().item():.4g}, "
              f"eager {(eager - ref).abs().max().item():.4g}")


if __name__ == "__main__":
    main()
