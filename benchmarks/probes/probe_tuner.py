"""Does the tuner pick what a long interleaved timing says is fastest?

    PYTHONPATH=. python benchmarks/probes/probe_tuner.py
    PYTHONPATH=. python benchmarks/probes/probe_tuner.py --add-candidate 64x64x4x3 --cases causal:16384

For each case: tune afresh (an empty tuning cache), keep the tuner's own launch function, then
time every candidate again with the tuner's interleaved rounds (full clock), ``--longer`` times
as many, ``--repeats`` times, and the three fastest with long ``do_bench`` runs (sustained, at
the GPU's power limit: 300 ms warm-up, 300 ms timed), in ranked then reversed order. Prints
each candidate's medians and how far the pick is behind the best sustained one. ``--add-candidate`` puts tiles among the head
dim's candidates first (to see whether the tuner would pick them where they pay).
"""
import argparse
import os
import statistics
import sys
import tempfile

import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path[:0] = [os.path.dirname(__file__), os.path.join(os.path.dirname(__file__), "..")]
import fxflash  # noqa: E402
from fxflash.codegen import emit  # noqa: E402
from fxflash.runtime import tuning
from tile_sweep import case_of  # noqa: E402

CASES = ["causal:16384", "vanilla:16384", "vanilla:4096", "document_mask:16384", "alibi:16384",
         "evoformer_row:256:8:64", "evoformer_row:256:8:128", "diff_attention:8192:2:64", "diff_attention:512:32:64"]


def parse_case(text: str) -> argparse.Namespace:
    """``variant:seqlen[:batch[:head dim]]`` as tile_sweep's options."""
    variant, seqlen, *rest = text.split(":")
    batch, head_dim = (list(map(int, rest)) + [8, 64][len(rest):])[:2]
    return argparse.Namespace(variant=variant, seqlen=int(seqlen), batch=batch, head_dim=head_dim, gqa=False)


def add_candidates(tiles) -> None:
    """Put ``tiles`` first among every head dim's candidates."""
    emit.TILE_CONFIGS = tuple((limit, list(tiles) + [c for c in configs if c not in tiles])
                              for limit, configs in emit.TILE_CONFIGS)


label = tuning._label  # a tile as tuning.json names it


def probe(text: str, longer: int, repeats: int) -> None:
    fields, fn, args, _ = case_of(parse_case(text))
    captured = {}
    tune = tuning._tune

    def keep_launcher(name, key, candidates, frame, run, clock, device_index):
        captured["run"] = run  # the tuner's own launch function: run(tile)
        return tune(name, key, candidates, frame, run, clock, device_index)

    tuning._tune = keep_launcher
    try:
        tuning.forget()
        fast = fxflash.optimize(fn)
        fast(*args)
    finally:
        tuning._tune = tune
    tuned = tuning.history[-1]
    pick, run = tuple(tuned["config"]), captured["run"]
    tuned_ms = {tuning.tile_of(t): ms for t, ms in tuned["ms"].items()}
    clock = tuning.CudaClock()
    runs = {tile: (lambda tile=tile: run(tile)) for tile in tuned_ms}
    rounds = longer * tuning.rounds_for(list(tuned_ms.values()))
    again = [{t: statistics.median(s) for t, s in tuning.interleaved_samples(runs, clock, rounds).items()}
             for _ in range(repeats)]
    top = sorted(tuned_ms, key=tuned_ms.get)[:3]
    sustained = {tile: [] for tile in top}
    for tile in top + top[::-1]:
        sustained[tile].append(triton.testing.do_bench(runs[tile], warmup=300, rep=300, return_mode="median"))
    print(f"{text} {fields}: tuner picked {label(pick)} in {tuned['seconds']:.1f} s; "
          f"re-timed {repeats}× with {rounds} rounds", flush=True)
    for tile in sorted(tuned_ms, key=tuned_ms.get):
        retimed = " ".join(f"{m[tile]:.4f}" for m in again)
        long_runs = " ".join(f"{ms:.4f}" for ms in sustained.get(tile, []))
        tuner_sustained = tuned["sustained_ms"].get(label(tile))
        print(f"  {label(tile):>12} tuning {tuned_ms[tile]:.4f}"
              f"{f' sustained {tuner_sustained:.4f}' if tuner_sustained else ''}  re-timed {retimed}"
              f"{f'  do_bench {long_runs}' if long_runs else ''}{'  <- pick' if tile == pick else ''}")
    mean = {tile: statistics.mean(v) for tile, v in sustained.items()}
    best = min(mean, key=mean.get)
    behind = f"{100 * (mean[pick] / mean[best] - 1):+.1f} %" if pick in mean else "not among the three fastest"
    print(f"  sustained best {label(best)}: pick is {behind} behind", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=CASES, help="variant:seqlen[:batch[:head dim]]")
    parser.add_argument("--add-candidate", nargs="*", default=[], help="tiles BMxBNxWARPSxSTAGES")
    parser.add_argument("--longer", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    opts = parser.parse_args()
    add_candidates([tuple(map(int, t.split("x"))) for t in opts.add_candidate])
    fxflash.config.kernel_cache_dir = tempfile.mkdtemp()  # an empty tuning cache: time afresh
    for text in opts.cases:
        probe(text, opts.longer, opts.repeats)


if __name__ == "__main__":
    main()
