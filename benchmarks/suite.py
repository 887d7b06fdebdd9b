"""The whole benchmark suite in one command: CSV, speedup plot and summary table.

    PYTHONPATH=. python benchmarks/suite.py [--resume] [--plot-only] [--out-dir benchmarks/results]
    PYTHONPATH=. python benchmarks/suite.py --only softmax --seqlens 16384   # a part, kept beside the rest

Runs, on the GPU it finds (bf16, ``bench_attention.py``'s method and configs):

* the softmax family — vanilla, ALiBi, softcap, causal, sliding window 256, prefix-LM 256,
  document mask (12 documents) — MHA and GQA, seqlen 1k, 4k, 16k at batch × seqlen = 16k,
  against eager, torch.compile, FlexAttention (kernel with a cached block mask, and the
  block mask's build) and SDPA;
* beyond the template — differential attention (seqlen 512 to 16k), the Evoformer's gated
  row attention (batch 1, 8, 32), sigmoid and ReLU attention (1k, 4k, 16k) — against eager
  and torch.compile;

and writes under ``--out-dir``: ``suite_<gpu>.csv`` (bench_attention's schema, device,
torch and Triton versions in every row), ``suite_<gpu>.png`` (speedup of fxflash over each
other system per variant and seqlen, log scale; FlexAttention with its mask build counted
is ``flex+mask``) and ``suite_<gpu>.md`` (the same ratios as a table). ``--resume`` keeps
the rows already in the CSV and runs only the missing ones (a run cut short goes on where it
stopped); ``--only FAMILY …`` (and ``--seqlens`` for the softmax family) measures a part of
the suite again and keeps the CSV's other rows (with ``--resume``: only that part's missing
rows), for machines that lend a GPU in short calls (each
family then measured whole within one call); ``--plot-only`` redraws from the CSV.
"""
from __future__ import annotations

import argparse
import collections
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

SOFTMAX = ["vanilla", "alibi", "softcap", "causal", "sliding_window", "prefix_lm", "document_mask"]
BEYOND = ["diff_attention", "evoformer_row", "sigmoid_attention", "relu_attention"]
BEYOND_SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
SEQLENS = [1024, 4096, 16384]
OTHERS = ["eager", "torch_compile", "flex_kernel", "flex+mask", "sdpa"]


def _beyond(variants, seqlens):
    def run_family(out, _softmax_seqlens):
        from bench_attention import run_beyond
        run_beyond(variants, seqlens, out, resume=True)
    return run_family


def _softmax(out, seqlens):
    from bench_attention import run
    run(SOFTMAX, seqlens, [False, True], out, resume=True)


def _in_part(row: dict, family: str, seqlens) -> bool:
    """Is this CSV row one that ``--only family`` (at the softmax ``seqlens``) measures?"""
    if family == "softmax":
        return row["suite"] == "softmax" and int(row["M"]) in seqlens
    variants = {"non_softmax": ("sigmoid_attention", "relu_attention")}.get(family, (family,))
    return row["suite"] == "beyond" and row["variant"] in variants


def drop_part(csv_path: str, families, seqlens) -> None:
    """Remove the rows of these families from the CSV (kept: every other row), so that the run
    that follows measures them again."""
    if not os.path.exists(csv_path):
        return
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(r for r in rows if not any(_in_part(r, fam, seqlens) for fam in families))


# The suite's parts, in the order one run measures them: run_family(csv path, softmax seqlens)
FAMILIES = {
    "softmax": _softmax,
    "diff_attention": _beyond(["diff_attention"], BEYOND_SEQLENS),
    "evoformer_row": _beyond(["evoformer_row"], [0]),
    "non_softmax": _beyond(["sigmoid_attention", "relu_attention"], SEQLENS),
}


def case_label(row: dict) -> str:
    """What distinguishes configs of one variant: the seqlen, and for the beyond suite the
    head dim and the Evoformer's batch."""
    if row["variant"].startswith("evoformer"):
        return f"B={int(row['B']) // 256} d{row['D']}"
    seq = int(row["M"])
    length = f"{seq // 1024}k" if seq >= 1024 else str(seq)
    return f"{length} d{row['D']}" if row["variant"].startswith("diff") else length


def speedups(rows: list) -> dict:
    """{(variant, config): {other system: its time / fxflash's time}}."""
    times = collections.defaultdict(dict)
    for row in rows:
        try:
            ms = float(row["ms"])
        except ValueError:
            continue
        if ms == ms:  # NaN: out of memory
            times[(row["variant"], case_label(row))][row["system"]] = ms
    table = {}
    for key, t in times.items():
        if "fxflash" not in t:
            continue
        if "flex_kernel" in t and "flex_blockmask" in t:
            t["flex+mask"] = t["flex_kernel"] + t["flex_blockmask"]
        table[key] = {s: t[s] / t["fxflash"] for s in OTHERS if s in t}
    return table


def plot(table: dict, title: str, path: str) -> None:
    """One panel per other system: the speedup of fxflash over it for each variant and config
    it runs (log scale; above the line at 1, fxflash is faster)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [s for s in OTHERS if any(s in ratios for ratios in table.values())]
    fig, axes = plt.subplots(len(systems), 1, figsize=(16, 2.6 * len(systems)), squeeze=False)
    for ax, system in zip(axes[:, 0], systems):
        keys = [k for k in table if system in table[k]]
        ys = [table[k][system] for k in keys]
        ax.bar(range(len(keys)), ys, color=["tab:green" if y >= 1 else "tab:red" for y in ys])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylabel(f"× vs {system}", fontsize=9)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"{v} {c}" for v, c in keys], rotation=70, ha="right", fontsize=6)
        ax.set_xlim(-0.6, len(keys) - 0.4)
    axes[0, 0].set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(table: dict, title: str) -> str:
    lines = [f"{title}", "", "| variant | config | " + " | ".join(f"vs {s}" for s in OTHERS) + " |",
             "|---|---|" + "---:|" * len(OTHERS)]
    for (variant, config), ratios in table.items():
        cells = [f"{ratios[s]:.2f}×" if s in ratios else "" for s in OTHERS]
        lines.append(f"| {variant} | {config} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(csv_path: str) -> None:
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"{csv_path} has no rows")
    first = rows[0]
    title = (f"fxflash speedup, {first['device']}, torch {first['torch']}, Triton {first['triton']}, bf16, "
             f"do_bench medians ({os.path.basename(csv_path)})")
    table = speedups(rows)
    stem = os.path.splitext(csv_path)[0]
    plot(table, title, stem + ".png")
    with open(stem + ".md", "w") as f:
        f.write(markdown(table, title))
    print(f"wrote {stem}.png and {stem}.md ({len(table)} configs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--resume", action="store_true", help="keep the rows already in the CSV")
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument("--only", nargs="+", choices=FAMILIES,
                        help="measure these families again, keep the CSV's other rows")
    parser.add_argument("--seqlens", nargs="+", type=int, help=f"softmax family's seqlens (default {SEQLENS})")
    opts = parser.parse_args()
    if opts.plot_only:
        paths = [os.path.join(opts.out_dir, n) for n in os.listdir(opts.out_dir)
                 if n.startswith("suite_") and n.endswith(".csv")]
        for path in paths:
            write_outputs(path)
        return
    import torch

    name = torch.cuda.get_device_name().replace(" ", "_")
    out = os.path.join(opts.out_dir, f"suite_{name}.csv")
    if not (opts.resume or opts.only) and os.path.exists(out):
        os.remove(out)
    if opts.only and not opts.resume:
        drop_part(out, opts.only, opts.seqlens or SEQLENS)
    for family in opts.only or FAMILIES:
        FAMILIES[family](out, opts.seqlens or SEQLENS)
    write_outputs(out)


if __name__ == "__main__":
    main()
