"""The benchmark suite's report: ratios, table and plot from a CSV (no GPU needed)."""
import csv
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import suite  # noqa: E402

FIELDS = "suite,variant,B,H,Hkv,M,N,D,Dv,dtype,system,ms,tflops,peak_mb,device,torch,triton".split(",")


def _row(variant, system, ms, M=4096, B=4, D=64, suite_name="softmax"):
    return dict(suite=suite_name, variant=variant, B=B, H=16, Hkv=16, M=M, N=M, D=D, Dv=D, dtype="bf16",
                system=system, ms=ms, tflops="1", peak_mb="1", device="GPU X", torch="2.11", triton="3.6")


def test_speedups_table_and_plot(tmp_path):
    rows = [_row("causal", "fxflash", "1.0"), _row("causal", "flex_kernel", "1.5"),
            _row("causal", "flex_blockmask", "0.5"), _row("causal", "eager", "nan"),
            _row("diff_attention", "fxflash", "2.0", M=512, B=32, suite_name="beyond"),
            _row("diff_attention", "torch_compile", "5.0", M=512, B=32, suite_name="beyond"),
            _row("evoformer_row", "fxflash", "1.0", B=2048, M=256, suite_name="beyond"),
            _row("evoformer_row", "torch_compile", "0.5", B=2048, M=256, suite_name="beyond")]
    path = tmp_path / "suite_GPU_X.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    table = suite.speedups(rows)
    assert table[("causal", "4k")] == {"flex_kernel": 1.5, "flex+mask": 2.0}   # NaN (out of memory) left out
    assert table[("diff_attention", "512 d64")] == {"torch_compile": 2.5}
    assert table[("evoformer_row", "B=8 d64")] == {"torch_compile": 0.5}
    suite.write_outputs(str(path))
    text = (tmp_path / "suite_GPU_X.md").read_text()
    assert "| causal | 4k |" in text and "2.00×" in text and "GPU X" in text
    assert (tmp_path / "suite_GPU_X.png").stat().st_size > 10_000
