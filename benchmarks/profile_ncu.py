"""Hardware-counter profiles (Nsight Compute) of fxflash's kernels beside the systems they race.

    PYTHONPATH=. python benchmarks/profile_ncu.py --out-dir DIR [--cases vanilla:fxflash …] [--pin gluon,2,128,3,0,1,1]
    python benchmarks/profile_ncu.py --summarize DIR > summary.md

The first form runs, for each ``case:system``, one process under ``ncu --set full
--clock-control none --profile-from-start off`` (METHOD.md: leave the clocks alone): the
process builds the call, calls it until it is compiled and tuned, and profiles one more call
between ``cudaProfilerStart``/``Stop``, so only that call's kernels are replayed. Each
profile's metrics go to ``DIR/<case>_<seqlen>_<system>_raw.csv`` (``ncu --page raw --csv``) and, for
fxflash, per-SASS-instruction samples to ``…_sass.csv``. The second form prints one table
per profile from those files: time, registers, occupancy, issue-slot use, the busiest pipes
and the top warp-stall reasons; for fxflash's kernel also the share of instructions and of
stall samples per SASS opcode.

Cases (bf16, the suite's shapes): ``vanilla``, ``alibi``, ``causal`` (16 heads, head dim 64,
16k tokens, ``--seqlen``, default 16384); ``evoformer_row`` (B 8, N_seq = S = 256, 4 heads,
head dim 64); ``diff_attention`` (32 heads of dim 64 in pairs, ``--seqlen`` tokens per row,
16k tokens). Systems: ``fxflash``, ``sdpa``, ``flex_kernel``, ``torch_compile``.
"""
from __future__ import annotations

import argparse
import csv
import glob
import os
import re
import shutil
import subprocess
import sys

DEFAULT_CASES = ["vanilla:fxflash", "vanilla:sdpa", "alibi:fxflash", "alibi:flex_kernel",
                 "causal:fxflash", "causal:flex_kernel", "evoformer_row:fxflash:256",
                 "evoformer_row:torch_compile:256", "diff_attention:fxflash:512",
                 "diff_attention:torch_compile:512"]


def calls_for(case: str, seqlen: int):
    """{system: zero-argument call} for one case (imports torch and fxflash only here)."""
    import torch

    sys.path.insert(0, os.path.dirname(__file__))
    import bench_attention as bench
    import fxflash
    from tile_sweep import case_of

    if case in bench.SUITES["beyond"]:
        batch = 8 if case.startswith("evoformer") else max(1, 16384 // seqlen)
        _, fn, args, _ = case_of(argparse.Namespace(variant=case, batch=batch, head_dim=64, seqlen=seqlen, gqa=False))
        fast, compiled = fxflash.optimize(fn), torch.compile(fn, dynamic=False)
        return {"fxflash": lambda: fast(*args), "torch_compile": lambda: compiled(*args)}
    return bench.softmax_calls(case, max(1, 16384 // seqlen), 16, 16, seqlen, 64, "cuda", torch.bfloat16,
                               *bench.flex_api())


def profile_target(case: str, system: str, seqlen: int, pin: str | None = None) -> None:
    """Warm the call (compile, tune), then run it once inside the profiler's range; ``pin``: a
    tile configuration (``gluon,2,128,3,0,1,1`` or ``64,64,4,3``) fxflash runs instead of the
    tuner's pick (timings under ncu's injection can change what the tuner keeps)."""
    import contextlib

    import torch
    from fxflash.runtime import tuning

    call = calls_for(case, seqlen)[system]
    tile = tuning.tile_of(pin.replace(",", "x")) if pin else None
    with tuning.pinned(tile) if tile else contextlib.nullcontext():
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        call()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def ncu_binary() -> str:
    """``ncu`` on the PATH, else the newest Nsight Compute installed."""
    installed = sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu") + glob.glob("/usr/local/cuda*/bin/ncu"))
    found = shutil.which("ncu") or (installed[-1] if installed else None)
    if not found:
        raise SystemExit("ncu (Nsight Compute) not found on PATH or under /opt/nvidia/nsight-compute")
    return found


def profile_all(cases, seqlen: int, out_dir: str, pin: str | None = None) -> None:
    ncu = ncu_binary()
    os.makedirs(out_dir, exist_ok=True)
    for item in cases:
        case, system, *length = item.split(":")
        length = int(length[0]) if length else seqlen
        name = f"{case}_{length}_{system}"
        report = os.path.join(out_dir, name)
        target = [sys.executable, os.path.abspath(__file__), "--target", f"{case}:{system}", "--seqlen", str(length),
                  *(["--pin", pin] if pin and system == "fxflash" else [])]
        run = subprocess.run([ncu, "--profile-from-start", "off", "--clock-control", "none", "--set", "full",
                              "--import-source", "no", "-f", "-o", report] + target,
                             capture_output=True, text=True)
        print(f"== {name}: ncu exit {run.returncode}\n{run.stdout[-1500:]}{run.stderr[-1500:]}", flush=True)
        pages = [("raw", [])] + ([("sass", ["--page", "source", "--print-source", "sass"])]
                                 if system == "fxflash" else [])
        for suffix, page in pages:
            args = [ncu, "--import", report + ".ncu-rep", "--csv"] + (page or ["--page", "raw"])
            with open(f"{report}_{suffix}.csv", "w") as f:
                done = subprocess.run(args, stdout=f, stderr=subprocess.PIPE, text=True)
            if done.returncode:
                print(f"   {suffix} page: exit {done.returncode}: {done.stderr[-500:]}", flush=True)


# ------------------------------------------------------------------ summary of the raw pages

HEADLINE = [("time (µs)", "gpu__time_duration.sum"),
            ("registers/thread", "launch__registers_per_thread"),
            ("grid", "launch__grid_size"), ("threads", "launch__block_size"),
            ("achieved occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active"),
            ("SM throughput %", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
            ("DRAM throughput %", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
            ("issue slots busy %", "smsp__issue_active.avg.pct_of_peak_sustained_active")]
TO_MICROSECONDS = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6, "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}
# a pipe's use as ncu reports it: cycles active, or instructions issued (the XU's only form);
# "tensor" and "shared" repeat tensor_op_hmma's cycles (the pipe the tensor cores share)
PIPE = re.compile(r"^sm__(?:inst_executed_)?pipe_(\w+?)(?:_cycles_active)?\.avg\.pct_of_peak_sustained_active$")
ALIASES = ("tensor", "shared")
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")


def read_raw(path: str) -> list[dict]:
    """Rows of ``ncu --page raw --csv``, one per kernel, times converted to µs (the file's
    second line holds each metric's unit)."""
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    rows = list(csv.DictReader(lines))
    if not rows:
        return rows
    units, rows = rows[0], rows[1:]
    scale = TO_MICROSECONDS.get(units.get("gpu__time_duration.sum", ""), 1.0)
    for row in rows:
        value = number(row.get("gpu__time_duration.sum", ""))
        if value is not None:
            row["gpu__time_duration.sum"] = str(value * scale)
    return rows


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def read_sass(path: str, kernel: str = "fxflash_region") -> list[dict]:
    """SASS lines of ``kernel`` from ``ncu --page source --csv`` (one block per kernel)."""
    rows, name, header = [], None, None
    with open(path) as f:
        for record in csv.reader(f):
            if record and record[0] == "Kernel Name":
                name, header = record[1], None
            elif record and record[0] == "Address":
                header = record
            elif record and header and name and kernel in name:
                rows.append(dict(zip(header, record)))
    return rows


def opcode_table(rows: list[dict], top: int = 12) -> list[str]:
    """Share of executed warp instructions and of warp-stall samples per SASS opcode."""
    executed, sampled, lines = {}, {}, {}
    for row in rows:
        words = row.get("Source", "").split()
        words = words[1:] if words and words[0].startswith("@") else words  # a predicate
        op = words[0].split(".")[0] if words else "?"
        executed[op] = executed.get(op, 0.0) + (number(row.get("Instructions Executed", "")) or 0.0)
        sampled[op] = sampled.get(op, 0.0) + (number(row.get("Warp Stall Sampling (All Samples)", "")) or 0.0)
        lines[op] = lines.get(op, 0) + 1
    total_x, total_s = sum(executed.values()) or 1.0, sum(sampled.values()) or 1.0
    out = [f"{len(rows)} SASS lines, {total_x:.3g} warp instructions executed, {total_s:.0f} stall samples", "",
           "| opcode | lines | % of instructions | % of stall samples |", "|---|---|---|---|"]
    for op in sorted(executed, key=lambda o: -executed[o])[:top]:
        out.append(f"| {op} | {lines[op]} | {100 * executed[op] / total_x:.1f} | {100 * sampled[op] / total_s:.1f} |")
    return out + [""]


def summarize(out_dir: str) -> str:
    out = []
    for path in sorted(glob.glob(os.path.join(out_dir, "*_raw.csv"))):
        rows = read_raw(path)
        if not rows:
            continue
        out.append(f"### {os.path.basename(path)[:-8]}\n")
        out.append("| kernel | " + " | ".join(label for label, _ in HEADLINE) + " | busiest pipes (% of peak) "
                   "| top stalls (cycles per issue) |")
        out.append("|---" * (len(HEADLINE) + 3) + "|")
        for row in rows:
            cells = []
            for _, metric in HEADLINE:
                value = number(row.get(metric, ""))
                cells.append("" if value is None else f"{value:.4g}")
            busy = {}
            for key, value in row.items():
                if (m := PIPE.match(key)) and m.group(1) not in ALIASES:
                    busy[m.group(1)] = max(busy.get(m.group(1), 0.0), number(value) or 0.0)
            pipes = sorted(((v, p) for p, v in busy.items()), reverse=True)
            stalls = sorted(((number(v) or 0.0, m.group(1)) for k, v in row.items() if (m := STALL.match(k))),
                            reverse=True)
            name = row.get("Kernel Name", "?")[:40]
            out.append(f"| {name} | " + " | ".join(cells) + " | "
                       + ", ".join(f"{p} {v:.0f}" for v, p in pipes[:5]) + " | "
                       + ", ".join(f"{s} {v:.2f}" for v, s in stalls[:5]) + " |")
        out.append("")
        sass = path[:-len("_raw.csv")] + "_sass.csv"
        if os.path.exists(sass):
            out += ["fxflash_region by SASS opcode:", ""] + opcode_table(read_sass(sass))
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=DEFAULT_CASES,
                        help="case:system[:seqlen] (the Evoformer's seqlen is always 256)")
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--out-dir")
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--summarize", metavar="DIR")
    parser.add_argument("--pin", help="fxflash's tile configuration, comma-separated (default: the tuner's)")
    opts = parser.parse_args()
    if opts.target:
        profile_target(*opts.target.split(":"), opts.seqlen, opts.pin)
    elif opts.summarize:
        print(summarize(opts.summarize))
    elif opts.out_dir:
        profile_all(opts.cases, opts.seqlen, opts.out_dir, opts.pin)
    else:
        parser.error("give --out-dir (profile) or --summarize DIR")


if __name__ == "__main__":
    main()
