"""How close each measured kernel is to what the GPU allows, and whether a speed target can be met.

    python benchmarks/roofline.py [--suite benchmarks/results/suite_NVIDIA_H200.csv]
                                  [--peaks benchmarks/results/device_peaks_NVIDIA_H200.csv]
                                  [--out benchmarks/results/roofline_NVIDIA_H200.md]

For every dense case of the suite (no mask that skips work) the work one fused pass cannot
avoid, from the row's shape (``WORK``):

* tensor-core FLOPs: every score ``Q·Kᵀ`` (2·D per score) and every ``P·V`` (2·Dv per score
  and per stream — differential attention's two streams are each divided by their own row sum
  before they are combined, so each needs its own ``P·V``; combining them first needs both
  final sums, a second pass over ``Q·Kᵀ`` that costs what it saves);
* HBM bytes: each input read once and the output written once (2 bytes per element);
* special-function operations (MUFU): one ``exp2`` per score (two for softcap's ``tanh`` and
  exponential, and for sigmoid's ``exp2`` and reciprocal), two per output element for the
  Evoformer's ``sigmoid(gate)``.

Each divided by the device's measured rate (``device_peaks.py``) gives a time; the largest is
the *floor*: the kernel's time if that unit were busy the whole call and the others hid under
it. ``efficiency`` = floor / measured time. A target ``ratio × faster than SYSTEM`` is a time
``SYSTEM's ms / ratio``; ``needs`` = floor / that time, the efficiency the target demands —
above 100 % no kernel can meet it on this GPU; the best efficiency measured in the suite
(cuDNN's, FlashAttention's and fxflash's own dense kernels) says how close to 100 % kernels
get. Where the peaks CSV also holds ``attention_tflops`` (the fastest SDPA backend's rate on plain
attention), a tensor-bound target's *needs* also reads as a multiple of that rate: over 1×, the
target asks more of the tensor cores than the best hand-written attention kernel gets from them.
Writes a Markdown table (and prints it).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import os

HERE = os.path.dirname(__file__)
RESULTS = os.path.join(HERE, "results")
BYTES = 2            # bf16
EVOFORMER_NSEQ = 256  # the suite's Evoformer rows: B × N_seq in the CSV's B, N_seq = S = 256


@dataclasses.dataclass(frozen=True)
class Shape:
    b: int
    h: int
    hkv: int
    m: int
    n: int
    d: int
    dv: int

    @property
    def scores(self) -> int:
        return self.b * self.h * self.m * self.n


@dataclasses.dataclass(frozen=True)
class Work:
    flops: float
    bytes: float
    mufu: float


def attention(mufu_per_score: float):
    """One stream of ``softmax``-like scores per query head, ``Hkv`` key/value heads."""
    def work(s: Shape) -> Work:
        elems = s.b * (s.h * s.m * s.d + s.hkv * s.n * (s.d + s.dv) + s.h * s.m * s.dv)
        return Work(2 * s.scores * (s.d + s.dv), BYTES * elems, mufu_per_score * s.scores)
    return work


def diff_attention(s: Shape) -> Work:
    """``H`` = 2h score streams of head dim D; ``v`` and the output hold h heads of width Dv."""
    elems = s.b * (s.h * s.m * s.d + s.h * s.n * s.d + s.h // 2 * (s.n + s.m) * s.dv)
    return Work(2 * s.scores * (s.d + s.dv), BYTES * elems, s.scores)


def evoformer_row(s: Shape) -> Work:
    """q, k, v, gate and the output ``[B·N_seq, S, H, D]``; the pair bias ``[B, H, S, S]``;
    the mask's bias per key (negligible)."""
    pair_bias = s.b // EVOFORMER_NSEQ * s.h * s.m * s.n
    outputs = s.b * s.h * s.m * s.dv
    return Work(2 * s.scores * (s.d + s.dv), BYTES * (5 * outputs + pair_bias), s.scores + 2 * outputs)


WORK = {
    "vanilla": attention(1), "vanilla_gqa": attention(1),
    "alibi": attention(1), "alibi_gqa": attention(1),
    "softcap": attention(2), "softcap_gqa": attention(2),
    "sigmoid_attention": attention(2), "relu_attention": attention(0),
    "diff_attention": diff_attention, "evoformer_row": evoformer_row,
}

# The open issues' speed targets: (variant, head dims it applies to, ratio, other system, issue)
TARGETS = (
    ("diff_attention", (64, 128), 3.0, "torch_compile", 4),
    ("evoformer_row", (64, 128), 5.0, "torch_compile", 4),
    ("diff_attention", (64,), 4.0, "torch_compile", 6),
    ("evoformer_row", (64,), 6.0, "torch_compile", 6),
    ("alibi", (64,), 1.2, "flex_kernel", 6),
    ("softcap", (64,), 1.2, "flex_kernel", 6),
    ("vanilla", (64,), 1.0, "torch_compile", 3),
)
# Each unit: the Work field it does, and the device_peaks.py quantity (and its scale) it does it at.
UNITS = {"tensor": ("flops", "matmul_tflops", 1e12), "hbm": ("bytes", "hbm_tb_s", 1e12),
         "mufu": ("mufu", "exp2_per_s", 1.0)}


def read_peaks(path: str) -> dict[str, float]:
    """Each unit's rate per second, from device_peaks.py's CSV, and ``attention``: the FLOP/s of
    the fastest hand-written attention kernel (SDPA's) where the CSV has it."""
    with open(path, newline="") as f:
        rows = {r["quantity"]: float(r["value"]) for r in csv.DictReader(f)}
    peaks = {unit: rows[quantity] * scale for unit, (_, quantity, scale) in UNITS.items()}
    if "attention_tflops" in rows:
        peaks["attention"] = rows["attention_tflops"] * 1e12
    return peaks


def floor_ms(work: Work, peaks: dict[str, float]) -> tuple[float, str]:
    """The largest of the three units' times (ms) and the unit."""
    times = {unit: getattr(work, field) / peaks[unit] for unit, (field, _, _) in UNITS.items()}
    unit = max(times, key=times.get)
    return times[unit] * 1e3, unit


def read_cases(path: str) -> dict[tuple, dict[str, float]]:
    """``{(variant, Shape): {system: ms}}`` for the variants WORK knows."""
    cases: dict[tuple, dict[str, float]] = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["variant"] not in WORK:
                continue
            shape = Shape(*(int(r[k]) for k in ("B", "H", "Hkv", "M", "N", "D", "Dv")))
            cases.setdefault((r["variant"], shape), {})[r["system"]] = float(r["ms"])
    return cases


def rows(cases, peaks) -> list[dict]:
    out = []
    for (variant, shape), ms in cases.items():
        floor, unit = floor_ms(WORK[variant](shape), peaks)
        row = {"variant": variant, "shape": shape, "floor": floor, "unit": unit,
               "eff": {system: floor / t for system, t in ms.items()}, "ms": ms, "targets": [],
               # a tensor-bound target's FLOP/s over SDPA's = what it needs × this
               "per_sdpa": peaks["tensor"] / peaks["attention"] if unit == "tensor" and "attention" in peaks else None}
        for name, dims, ratio, other, issue in TARGETS:
            if name == variant and shape.d in dims and other in ms:
                target = ms[other] / ratio
                row["targets"].append((issue, ratio, other, target, floor / target))
        out.append(row)
    return out


def _config(variant: str, s: Shape) -> str:
    if variant == "evoformer_row":
        return f"B={s.b // EVOFORMER_NSEQ} d{s.d}"
    return f"{s.m // 1024}k d{s.d}" if s.m >= 1024 else f"{s.m} d{s.d}"


def table(rows_: list[dict]) -> str:
    best = max((r["eff"][sys], r["variant"], _config(r["variant"], r["shape"]), sys)
               for r in rows_ for sys in r["eff"])
    lines = [
        "| variant | config | floor ms (unit) | fxflash ms | fxflash eff. | best other (eff.) | target | target ms | needs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows_, key=lambda r: (r["variant"], r["shape"].d, r["shape"].m, r["shape"].b)):
        if "fxflash" not in r["ms"]:
            continue
        others = {s: e for s, e in r["eff"].items() if s != "fxflash"}
        other = max(others, key=others.get) if others else None
        best_other = f"{other} {others[other]:.0%}" if other else "–"
        targets = r["targets"] or [None]
        for t in targets:
            tgt = f"issue {t[0]}: {t[1]:g}× {t[2]}" if t else ""
            tms = f"{t[3]:.3f}" if t else ""
            needs = (f"**{t[4]:.0%}**" if t[4] > 1 else f"{t[4]:.0%}") if t else ""
            if t and r["per_sdpa"]:
                needs += f" ({t[4] * r['per_sdpa']:.2f}× SDPA)"
            lines.append(f"| {r['variant']} | {_config(r['variant'], r['shape'])} | {r['floor']:.3f} ({r['unit']}) "
                         f"| {r['ms']['fxflash']:.3f} | {r['eff']['fxflash']:.0%} | {best_other} | {tgt} | {tms} | {needs} |")
    lines.append("")
    lines.append(f"Best efficiency measured in the suite: {best[0]:.0%} ({best[3]}, {best[1]} {best[2]}).")
    return "\n".join(lines)


def _sdpa_line(peaks: dict[str, float]) -> str:
    """The header's sentence on the best hand-written attention kernel, where the peaks have it."""
    if "attention" not in peaks:
        return ""
    return (f" The fastest hand-written attention kernel here (SDPA, plain attention at 16k tokens) runs at "
            f"{peaks['attention'] / 1e12:.0f} TFLOP/s, {peaks['attention'] / peaks['tensor']:.0%} of the matmul rate; "
            f"a tensor-bound target's *needs* also says how many times that rate it asks for.")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default=os.path.join(RESULTS, "suite_NVIDIA_H200.csv"))
    parser.add_argument("--peaks", default=os.path.join(RESULTS, "device_peaks_NVIDIA_H200.csv"))
    parser.add_argument("--out", default=os.path.join(RESULTS, "roofline_NVIDIA_H200.md"))
    opts = parser.parse_args()
    peaks = read_peaks(opts.peaks)
    text = (f"# Roofline of the suite's dense cases\n\nFrom `{os.path.basename(opts.suite)}` and "
            f"`{os.path.basename(opts.peaks)}` (`python benchmarks/roofline.py`): matmul "
            f"{peaks['tensor'] / 1e12:.0f} TFLOP/s, HBM {peaks['hbm'] / 1e12:.2f} TB/s, exp2 "
            f"{peaks['mufu'] / 1e12:.2f}·10¹² /s. Efficiency = floor / measured ms; *needs* = the "
            f"efficiency a target demands (over 100 %: unreachable on this GPU).{_sdpa_line(peaks)}\n\n"
            + table(rows(read_cases(opts.suite), peaks)) + "\n")
    with open(opts.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
