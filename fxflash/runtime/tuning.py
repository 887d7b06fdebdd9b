"""Choosing each kernel's tile configuration on the GPU, once, remembered on disk.

A fused kernel has a few candidate configurations ``(BLOCK_M, BLOCK_N, num_warps,
num_stages)``: ``plan.configs``, already pruned by shared memory and registers
(``emit.tile_configs``). At the first launch for a problem size each candidate is compiled
(concurrently) and launched once, then timed in two steps, each launch after an L2 flush and
timed by CUDA events:

1. *Interleaved rounds* at full clock: in each round every candidate runs once, the rounds
   rotating their order, after a short GPU sleep (so the queued launches run back to back and
   the GPU stays below its power limit). This ranks the kernels, not the moment each was timed.
2. *Sustained runs* of the contenders (within ``CONTENDER_MARGIN`` of the fastest): each,
   after the GPU rested ``REST_MS`` (every contender starts from the same cool state: one
   that follows a hotter kernel would otherwise be timed while the clock recovers, which
   takes up to 400 ms), runs back to back for ``SETTLE_MS``, then ``MEASURE_MS`` more are
   timed. A heavy attention kernel run continuously holds an H200 at its power limit, where
   the clock depends on the kernel's own power draw: 64×64 tiles with 3 stages are 2.5 %
   faster than 128×64 at full clock but 4.5 % slower sustained (1 780 vs 1 906 MHz;
   benchmarks/NOTES.md, 2026-11-22). The contender with the smallest sustained median
   is kept

* in memory, for this process;
* in ``<kernel cache dir>/tuning.json``, so another process launches it with no timing.

(Timing candidates one after another with ``do_bench``, as this tuner did before, ordered
them partly by when each was timed: the first ones ran while the GPU was still cool.)
``run(tile)`` launches a candidate as the caller's later calls will: launch.py's ``run`` goes
through the JIT once per tile, then through that tile's bound launch, whose host time is not
the JIT's (a Gluon JIT launch outlasts a short kernel).

The key is the kernel source's hash (region structure and printed dtypes; Triton and torch
versions, ``cache.source_key``), the input dtypes, the device (name and compute capability)
and the size bucket: the batch product, M and N each rounded up to a power of two. Entries
are checked on reading: a configuration that is not among the kernel's candidates is timed
again, and an unreadable file is set aside with a warning and rewritten.

The chosen kernel is then launched directly (a plain ``@triton.jit`` function with its tile
constexprs), never through ``triton.autotune``'s wrapper. No timing happens while a CUDA
graph is being captured: the first candidate runs instead, and nothing is stored.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import logging
import math
import os
import stat
import statistics
import sys
import tempfile
import threading
import time
import warnings
from typing import Callable

import torch
import triton

from ..config import config
from . import precompile
from .cache import cache_dir, source_key
from ..codegen.gluon_plan import gluon_tile

log = logging.getLogger("fxflash")

FORMAT_VERSION = 2          # 1: picks by sequential do_bench timing (misordered some tiles)
SAMPLE_MS = 50              # GPU time spent timing each candidate, split over the rounds
MIN_ROUNDS, MAX_ROUNDS = 10, 100
CONTENDER_MARGIN = 0.10     # within 10 % of the fastest at full clock: timed sustained
MAX_CONTENDERS = 3
OUT_OF_RANGE = 4.0          # a candidate whose first timed launch took this many times the fastest's
                            # is not sampled further (the region's own ops: 24 ms against 0.4)
REST_MS, SETTLE_MS, MEASURE_MS = 200, 250, 100   # a contender's rest, sustained run, timed launches
MAX_SETTLE_LAUNCHES, MAX_MEASURED_LAUNCHES = 1000, 200

Tile = tuple  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
# The candidates that run the region's own ops instead of a kernel, timed beside the kernel's
# tiles, so that a region whose best kernel loses keeps the code it replaced: EAGER, the ops run
# by PyTorch; COMPILED, the ops as Inductor compiles them, where the graph's inner compiler is
# Inductor (the code the region replaced there).
EAGER: Tile = ("eager",)
COMPILED: Tile = ("inductor",)
OWN_OPS = (EAGER, COMPILED)

_lock = threading.Lock()
_chosen: dict[str, Tile] = {}     # key → configuration, this process
_disk: dict | None = None         # tuning.json's entries, read once
_pinned: list[Tile] = []          # configurations forced by pinned() (benchmark sweeps)
_epoch = 0                        # bumped by forget(): what was decided before is stale
history: list[dict] = []          # one record per tuning or disk hit (when timed, with the medians
                                  # of tuning.json's entry), for reports and benchmarks


def tuning_file() -> str | None:
    """``<cache dir>/tuning.json``, or None where no directory can be trusted (cache.cache_dir)."""
    directory = cache_dir()
    return os.path.join(directory, "tuning.json") if directory is not None else None


def size_bucket(frame) -> tuple:
    """(batch product, M, N), each rounded up to a power of two: sizes in one bucket share a
    configuration (the best tile depends on how many programs fill the GPU and how many key
    tiles each visits, not on the exact length)."""
    batch = math.prod(frame[:-2])
    return tuple(1 << max(0, int(s) - 1).bit_length() for s in (batch, frame[-2], frame[-1]))


@functools.lru_cache(maxsize=256)
def _source_hash(source: str) -> str:
    return source_key(source)[:32]


def tuning_key(source: str, dtypes, device: str, frame) -> str:
    bucket = "x".join(str(s) for s in size_bucket(frame))
    return f"{_source_hash(source)}|{','.join(str(d).removeprefix('torch.') for d in dtypes)}|{device}|{bucket}"


def _label(tile: Tile) -> str:
    """A tile as tuning.json names it: ``128x64x8x3``, ``gluonx3x128x3x0x1x1``."""
    return "x".join(map(str, tile))


def tile_of(label: str) -> Tile:
    """The tile a label names (_label's inverse)."""
    return tuple(int(part) if part.isdigit() else part for part in label.split("x"))


def describe(tile: Tile) -> str:
    if tile == EAGER:
        return "the region's own ops, run by PyTorch (every kernel was slower)"
    if tile == COMPILED:
        return "the region's own ops, compiled by Inductor (every kernel was slower)"
    if tile[0] == "gluon":  # gluon_plan.GLUON_CONFIGS
        t = gluon_tile(tile)
        groups = (f"{t.consumers} consumer warp group{'s' if t.consumers > 1 else ''}"
                  + (" (one per softmax stream)" if t.streams > 1 else ""))
        return (f"Gluon: {groups} × {t.consumer_rows} rows, {t.block_n}-key tiles, {t.nbuf} K/V buffers"
                + (", ping-pong" if t.pingpong else "") + (f", {t.ctas} CTAs per SM" if t.ctas > 1 else "")
                + (", persistent" if t.persistent else ""))
    if tile[0] in ("kernels", "atomics"):   # runtime/backward._launch_key_kernels
        how = "dQ added by atomics" if tile[0] == "atomics" else "dQ by its own kernel"
        return f"{describe(tile[1:])}, {how}"
    bm, bn, warps, stages = tile
    return f"{bm}×{bn} tiles, {warps} warps, {stages} stages"


def _read_disk() -> dict:
    global _disk
    if _disk is None:
        _disk = _load(tuning_file())
    return _disk


MAX_FILE_BYTES = 64 << 20  # a tuning file larger than this is not read


def _load(path: str | None) -> dict:
    """tuning.json's entries; {} where there is none. A file that is not a regular file of at
    most MAX_FILE_BYTES (a FIFO, a link to /dev/zero), or not the JSON this tuner writes, is set
    aside with a warning: never followed through a symlink, never waited on, never parsed
    without bound."""
    if path is None:
        return {}
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return {}
    except OSError as exc:
        _set_aside(path, exc)
        return {}
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
                raise ValueError("not a regular file of at most 64 MiB")
            data = json.loads(f.read(MAX_FILE_BYTES + 1))
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        _set_aside(path, exc)
        return {}
    if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION or not isinstance(data.get("entries"), dict):
        _set_aside(path, "unknown format")
        return {}
    return data["entries"]


def _set_aside(path: str, why) -> None:
    warnings.warn(f"fxflash: ignoring the tuning cache {path} ({why}); kernels will be timed again "
                  "and the file rewritten", RuntimeWarning, stacklevel=2)
    with contextlib.suppress(OSError):
        os.replace(path, path + ".bad")


@contextlib.contextmanager
def _file_lock(path: str):
    """An exclusive lock on ``<path>.lock`` (POSIX advisory), so that processes storing at once
    merge their entries in turn instead of the last writer's winning."""
    try:
        import fcntl
    except ImportError:  # no advisory locks here: unlocked, as before
        yield
        return
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _store(key: str, entry: dict) -> None:
    """Merge ``entry`` into tuning.json under its lock: read what other processes stored, add
    ``entry``, write a temporary file of this process's own (``mkstemp``: created exclusively,
    never through a symlink) and rename it over the file."""
    _read_disk()[key] = entry
    path = tuning_file()
    if path is None:
        return
    directory = os.path.dirname(path)
    with _file_lock(path):
        entries = _load(path)
        entries[key] = entry
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tuning-", suffix=".tmp")  # mode 0600
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"version": FORMAT_VERSION, "entries": entries}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise


def _valid_tile(config) -> Tile | None:
    """A stored ``config`` as a tile: a list of ints (not bools, not floats) and labels; else None."""
    if not isinstance(config, list) or not config:
        return None
    if not all(type(part) is int or isinstance(part, str) for part in config):
        return None
    return tuple(config)


def _stored_tile(key: str, candidates) -> Tile | None:
    entry = _read_disk().get(key)
    if not isinstance(entry, dict):
        return None
    tile = _valid_tile(entry.get("config"))
    return tile if tile is not None and tile in candidates else None


def own_ops_kept(sources) -> list[str]:
    """The size buckets (``batch×M×N``, rounded up to powers of two) at which the tuner kept the
    region's own ops (EAGER or COMPILED) for a kernel printed as one of ``sources``, in this
    process or in tuning.json: for explain()."""
    hashes = {_source_hash(source) for source in sources}
    stored = {key: _valid_tile(entry.get("config")) for key, entry in _read_disk().items() if isinstance(entry, dict)}
    return sorted({key.rsplit("|", 1)[-1] for key, tile in {**stored, **_chosen}.items()
                   if tile in OWN_OPS and key.split("|", 1)[0] in hashes})


@contextlib.contextmanager
def pinned(tile: Tile):
    """Launch every kernel with ``tile`` while inside, on the GPU and in the interpreter (for
    sweeps over configurations and tests of every candidate)."""
    _pinned.append(tuple(tile))
    try:
        yield
    finally:
        _pinned.pop()


def pinned_tile() -> Tile | None:
    return _pinned[-1] if _pinned else None


def state() -> tuple:
    """What a remembered choice depends on besides its key: ``forget()`` calls so far, whether
    tuning is on and whether the Gluon kernel is offered (launch.Launcher keys its bound launches
    on it)."""
    return (_epoch, config.autotune, config.gluon)


class CudaClock:
    """Times launches on the current CUDA stream. ``time(fn)`` flushes the L2 cache (as
    ``triton.testing.do_bench`` does), records an event, launches, records another, and returns
    a function that waits for the second and gives the milliseconds between them. ``hold(n)``
    keeps the GPU busy for about n launches' host time, so that the launches queued behind it
    start back to back and no event pair times the host. ``rest(ms)`` lets it idle."""

    FLUSH_BYTES = 256 * 2**20
    HOST_MS_PER_LAUNCH = 0.2
    CYCLES_PER_MS = 2_000_000   # ≈ an H100/H200 SM clock; only the order of magnitude matters

    def __init__(self):
        self.flush = torch.empty(self.FLUSH_BYTES, dtype=torch.int8, device="cuda")

    def hold(self, launches: int) -> None:
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is not None:
            sleep(int(launches * self.HOST_MS_PER_LAUNCH * self.CYCLES_PER_MS))

    def rest(self, ms: float) -> None:
        torch.cuda.synchronize()
        time.sleep(ms / 1e3)

    def time(self, fn: Callable[[], None]) -> Callable[[], float]:
        self.flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()

        def elapsed() -> float:
            end.synchronize()
            return start.elapsed_time(end)
        return elapsed


def interleaved_samples(runs: dict, clock, rounds: int) -> dict[Tile, list[float]]:
    """``rounds`` timings of each ``runs[tile]()``: round r launches every candidate once,
    starting at the r-th (so no candidate is always first after the hold or last before the
    next), all queued before any is read."""
    tiles = list(runs)
    pending: dict[Tile, list] = {tile: [] for tile in tiles}
    for r in range(rounds):
        clock.hold(len(tiles))
        shift = r % len(tiles)
        for tile in tiles[shift:] + tiles[:shift]:
            pending[tile].append(clock.time(runs[tile]))
    return {tile: [elapsed() for elapsed in reads] for tile, reads in pending.items()}


def sustained_median(run: Callable[[], None], clock, estimate_ms: float) -> float:
    """The median time of ``run`` launched back to back after the GPU rested ``REST_MS``:
    first for about ``SETTLE_MS`` (the power limiter settles on this kernel's draw; results
    dropped), then ``MEASURE_MS`` more."""
    typical = max(estimate_ms, 1e-3)
    clock.rest(REST_MS)
    settle = max(1, min(MAX_SETTLE_LAUNCHES, round(SETTLE_MS / typical)))
    measured = max(MIN_ROUNDS, min(MAX_MEASURED_LAUNCHES, round(MEASURE_MS / typical)))
    for _ in range(settle):
        clock.time(run)
    reads = [clock.time(run) for _ in range(measured)]
    return statistics.median(elapsed() for elapsed in reads)


def contenders_of(medians: dict) -> list:
    """The candidates within ``CONTENDER_MARGIN`` of the fastest, fastest first (at most
    ``MAX_CONTENDERS``)."""
    fastest = min(medians.values())
    ranked = sorted((t for t, ms in medians.items() if ms <= fastest * (1 + CONTENDER_MARGIN)), key=medians.get)
    return ranked[:MAX_CONTENDERS]


def rounds_for(estimates_ms) -> int:
    """Rounds that spend about ``SAMPLE_MS`` timing each candidate (the median candidate)."""
    typical = max(statistics.median(estimates_ms), 1e-3)
    return max(MIN_ROUNDS, min(MAX_ROUNDS, round(SAMPLE_MS / typical)))


def choose(name: str, source: str, candidates, dtypes, device: str, frame,
           run: Callable[[Tile], None], clock=None, capturing: bool = False,
           device_index: int | None = None) -> Tile:
    """The configuration to launch ``name`` with for sizes ``frame`` = [*batch, M, N].

    ``run(tile)`` launches the kernel once with ``tile``; ``clock`` times launches (a
    ``CudaClock`` unless given: ``time(fn)``, ``hold(n)``, ``rest(ms)``). With the CUDA ``device_index``,
    every candidate is first compiled concurrently.
    Order: this process's choice; tuning.json's; otherwise time every
    candidate (when tuning is on and no CUDA graph is being captured) or take the first."""
    candidates = [tuple(c) for c in candidates]
    key = tuning_key(source, dtypes, device, frame)
    tile = _chosen.get(key)
    if tile is not None and (tile not in OWN_OPS or tile in candidates):  # own ops only to a caller that has them
        return tile
    if not config.autotune or capturing or len(candidates) == 1:
        return candidates[0]
    with _lock:
        tile = _stored_tile(key, candidates)
        if tile is not None:
            history.append(dict(kernel=name, key=key, config=tile, seconds=0.0, from_disk=True))
        else:
            tile = _tune(name, key, candidates, frame, run, clock or CudaClock(), device_index)
        _chosen[key] = tile
    return tile


def compile_ahead(source: str, candidates, dtypes, device: str, frame, launch: Callable[[Tile], object],
                  own_ops: Callable[[], dict | None] | None = None) -> None:
    """Start compiling ``candidates`` (kernel configurations) in worker processes and return at
    once, where ``choose`` would time them for this launch (nothing is chosen yet in this process
    or in tuning.json): the backend calls it before its inner compiler compiles the graph, so that
    the two compile side by side and the tuner's first launches load the kernels
    (``precompile.start``). ``launch(tile)``: the launch of ``tile``, run dry; ``own_ops()``: the
    ``precompile.graph_job`` of the region's own ops where the tuner will time them as Inductor
    compiles them (COMPILED), or None."""
    candidates = [tuple(c) for c in candidates]
    if not (config.autotune and config.precompile) or len(candidates) < 2:
        return
    key = tuning_key(source, dtypes, device, frame)
    with _lock:
        if key in _chosen or _stored_tile(key, [*candidates, *OWN_OPS]) is not None:
            return
    graph = own_ops() if own_ops is not None else None
    precompile.start([functools.partial(launch, tile) for tile in candidates], [graph] if graph else [])


def _compile_all(candidates, run, device_index) -> int:
    """Compile every candidate in worker processes (precompile.py; returns how many kernels
    compiled there), then launch each once from a thread of its own, which loads what the
    workers compiled (or compiles what they did not). Errors are left to the first launches
    in this thread, which record what fails."""
    def first_launch(tile):
        with torch.cuda.device(device_index) if device_index is not None else contextlib.nullcontext():
            run(tile)

    # EAGER: nothing to compile; COMPILED: Inductor compiles it at its first run, in a thread of
    # its own started first, while the workers compile the kernels (its compilation is kept out of
    # its timing), after what ``compile_ahead`` began (it may have compiled those ops already)
    candidates = [tile for tile in candidates if tile != EAGER]
    kernels = [tile for tile in candidates if tile != COMPILED]
    precompile.wait_started()
    with concurrent.futures.ThreadPoolExecutor(len(candidates)) as pool:
        futures = [pool.submit(first_launch, tile) for tile in candidates if tile == COMPILED]
        compiled = (precompile.compile_all([functools.partial(first_launch, tile) for tile in kernels])
                    if config.precompile else 0)
        for future in futures + [pool.submit(first_launch, tile) for tile in kernels]:
            with contextlib.suppress(Exception):
                future.result()
    return compiled


def _tune(name, key, candidates, frame, run, clock, device_index) -> Tile:
    start = time.perf_counter()
    progress = _Progress(name, frame, len(candidates) + 1)
    in_workers = _compile_all(candidates, run, device_index) if device_index is not None else 0
    compiled = time.perf_counter() - start
    failures: dict[Tile, str] = {}
    estimates: dict[Tile, float] = {}
    for tile in candidates:  # one timed launch each: what fails here, and how long each takes
        try:
            estimates[tile] = clock.time(lambda tile=tile: run(tile))()
        except Exception as exc:  # this tile does not compile or launch here (resources)
            failures[tile] = f"{type(exc).__name__}: {exc}"
            log.debug("fxflash: %s cannot run with %s: %s", name, describe(tile), exc)
        progress.step(tile)
    if not estimates:
        raise RuntimeError(f"fxflash: no tile configuration of {name} runs on this device: {failures}")
    fastest = min(estimates.values())
    sampled = [tile for tile, ms in estimates.items() if ms <= OUT_OF_RANGE * fastest]
    rounds = rounds_for([estimates[tile] for tile in sampled])
    samples = interleaved_samples({tile: (lambda tile=tile: run(tile)) for tile in sampled}, clock, rounds)
    medians = {tile: statistics.median(times) for tile, times in samples.items()}
    contenders = contenders_of(medians)
    sustained = {} if len(contenders) == 1 else {
        tile: sustained_median(lambda tile=tile: run(tile), clock, medians[tile]) for tile in contenders}
    best = min(sustained, key=sustained.get) if sustained else contenders[0]
    seconds = time.perf_counter() - start
    progress.step(best)
    progress.done(best, seconds)
    ms = {_label(t): round(m, 5) for t, m in medians.items()}
    ms.update({_label(t): round(m, 5) for t, m in estimates.items() if t not in medians})  # one launch each
    entry = dict(kernel=name, config=list(best), sizes=[int(s) for s in frame], rounds=rounds, ms=ms,
                 sustained_ms={_label(t): round(m, 5) for t, m in sustained.items()},
                 failed=sorted(_label(t) for t in failures), seconds=round(seconds, 3),
                 compile_seconds=round(compiled, 3), compiled_in_workers=in_workers, triton=triton.__version__)
    try:
        _store(key, entry)
    except OSError as exc:
        warnings.warn(f"fxflash: could not write the tuning cache ({exc}); the choice is kept for this "
                      "process only", RuntimeWarning, stacklevel=2)
    history.append(dict(kernel=name, key=key, config=best, seconds=seconds, compile_seconds=compiled,
                        compiled_in_workers=in_workers,
                        candidates=len(candidates), from_disk=False, ms=ms, sustained_ms=entry["sustained_ms"]))
    return best


def chosen() -> dict[str, Tile]:
    """This process's choices, by tuning key."""
    return dict(_chosen)


def forget(disk: bool = False) -> None:
    """Drop this process's choices (and with ``disk``, tuning.json): the next launch reads the
    file again (or tunes again). For tests and benchmarks that measure a cold start."""
    global _disk, _epoch
    with _lock:
        _chosen.clear()
        _disk = None
        _epoch += 1
        if disk and tuning_file() is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tuning_file())


class _Progress:
    """``fxflash: tuning <kernel> [B·H×M×N] ▕██████░░░░▏ 6/12`` on a terminal (redrawn in
    place); one summary line per kernel otherwise. Off with ``config.progress = False``."""

    WIDTH = 20

    def __init__(self, name: str, frame, total: int):
        self.label = f"fxflash: tuning {name} [{'×'.join(str(int(s)) for s in frame)}]"
        self.total, self.done_steps = total, 0
        self.live = config.progress and sys.stderr.isatty()

    def step(self, tile: Tile) -> None:
        self.done_steps += 1
        if self.live:
            filled = self.WIDTH * self.done_steps // self.total
            bar = "█" * filled + "░" * (self.WIDTH - filled)
            sys.stderr.write(f"\r{self.label} ▕{bar}▏ {self.done_steps}/{self.total} ({describe(tile)})\x1b[K")
            sys.stderr.flush()

    def done(self, best: Tile, seconds: float) -> None:
        where = f"stored in {tuning_file()}" if tuning_file() is not None else "not stored: no cache directory"
        line = f"{self.label}: {describe(best)} ({seconds:.1f} s; {where})"
        log.info("%s", line)
        if config.progress:
            sys.stderr.write(f"\r{line}\x1b[K\n" if self.live else f"{line}\n")
            sys.stderr.flush()


__all__ = ["choose", "chosen", "forget", "pinned", "size_bucket", "tuning_file", "tuning_key"]
