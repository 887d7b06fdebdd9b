"""Compiling a kernel's tile candidates in worker processes before the tuner launches them.

The tuner launches every candidate once through Triton's JIT, which compiles it there. Part of a
compilation is Python (the frontend) and holds the interpreter lock, so candidates compiled from
threads barely overlap: the 11 candidates of a Llama attention took 11–14.5 s, about one
compilation each (benchmarks/NOTES.md). Here each candidate is first launched *dry*: Triton's
``jit_cache_hook`` sees the specialization a real launch computes (Triton's own serialized form,
the one ``JITFunction.preload`` reads) and returns True, which stops the JIT before it compiles
or launches. Worker processes then compile each specialization into Triton's on-disk cache, side
by side, and the tuner's real launches load them from there.

``start`` begins the same work without waiting for it: the backend calls it (``op.compile_ahead``)
before its inner Inductor compiles the graph, which is mostly one thread's work, so the workers
compile beside it; ``compile_all`` waits for what ``start`` began and compiles only the rest.

Nothing here decides what runs: a specialization a worker did not compile (an older Triton
without the hook, a worker that failed, a launch that specializes differently) is compiled by
the launch itself, as before.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import contextvars
import json
import logging
import os
import subprocess
import sys
import threading
from typing import Callable

from . import compile_worker

log = logging.getLogger("fxflash")

# Set while a dry launch runs: the list its kernels' specializations are added to.
_RECORDING: contextvars.ContextVar = contextvars.ContextVar("fxflash_dry_launch", default=None)
MAX_WORKERS = 16
_pool: list = []
_pool_lock = threading.Lock()
_batch_lock = threading.Lock()
_started: list = []    # compilations ``start`` began, not yet waited for (Futures)
_compiled: set = set()  # (kernel module, specialization) compiled in workers by this process


def _knobs():
    try:
        from triton import knobs
    except ImportError:  # a Triton without knobs has no jit_cache_hook either
        return None
    return knobs if hasattr(knobs.runtime, "jit_cache_hook") else None


def specializations(run: Callable[[], None]) -> list:
    """[(JITFunction, specialization data)] of the kernels ``run()`` would launch, launching none
    of them. ``run`` must survive its launches returning None (launch.py's launches do: no
    bound launch is made of them). The hook is Triton's global setting: it is set for the dry
    launch only, and passes every other thread's compilation on to the hook it replaced."""
    knobs = _knobs()
    if knobs is None:
        return []
    previous = knobs.runtime.jit_cache_hook
    recorded: list = []

    def hook(*args, **kwargs):
        if _RECORDING.get() is not recorded:
            return previous(*args, **kwargs) if previous else None
        recorded.append((kwargs["fn"].jit_function, kwargs["compile"]["specialization_data"]))
        return True  # stop here: no compilation, no launch

    token = _RECORDING.set(recorded)
    knobs.runtime.jit_cache_hook = hook
    try:
        run()
    except Exception as exc:  # a dry launch that fails records what it reached
        log.debug("fxflash: dry launch stopped: %s", exc)
    finally:
        knobs.runtime.jit_cache_hook = previous
        _RECORDING.reset(token)
    return recorded


class _Worker:
    """One compiling process (compile_worker.py, run as a script: it imports Triton and torch,
    not fxflash, and not by multiprocessing, whose spawned processes would import the user's
    main script again)."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, compile_worker.__file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)

    def alive(self) -> bool:
        return self.process.poll() is None

    def compile(self, jobs: list) -> list:
        """Compile ``jobs`` one after another; those that compiled."""
        return [job for job in jobs if self._answer_to(job) == "ok"]

    def _answer_to(self, job: dict) -> str:
        """Send ``job``; the worker's answer ("ok", or "error …")."""
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:
            if line.startswith(compile_worker.ANSWER):
                return line[len(compile_worker.ANSWER):].strip()
        return "exited"

    def close(self) -> None:
        """End the worker (its loop ends with its input)."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        if self.process.poll() is None:
            self.process.kill()
        self.process.stdout.close()


def start_workers(count: int) -> list:
    """``count`` live workers (at most one fewer than the CPUs, and MAX_WORKERS), started at the
    first kernel tuned and kept for the process. (Started earlier, when the backend has generated
    a kernel, their imports and compilations overlapped Inductor's and slowed it as much as they
    gained: a Llama prefill's first call 43.5 s against 42.8 started here, benchmarks/NOTES.md.)"""
    count = max(1, min(count, (os.cpu_count() or 2) - 1, MAX_WORKERS))
    with _pool_lock:
        _pool[:] = [w for w in _pool if w.alive()]
        while len(_pool) < count:
            _pool.append(_Worker())
        return _pool[:count]


@atexit.register
def _close_all() -> None:
    for worker in _pool:
        worker.close()


def start(launches: list) -> None:
    """``compile_all`` begun and not waited for: the specializations are recorded now (dry
    launches, in this thread), and a thread of its own hands them to the workers. The backend
    starts it before its inner compiler compiles the graph, whose work is mostly one thread's;
    ``compile_all`` waits for it first."""
    jobs, _ = _jobs_of(launches)
    if not jobs:
        return
    future: concurrent.futures.Future = concurrent.futures.Future()

    def compile_jobs():
        try:
            future.set_result(_compile(jobs))
        except BaseException as exc:  # noqa: BLE001 - the tuner's launches compile what is left
            future.set_exception(exc)

    with _pool_lock:
        _started.append(future)
    threading.Thread(target=compile_jobs, name="fxflash-precompile", daemon=True).start()


def compile_all(launches: list) -> int:
    """Compile in worker processes what each of ``launches`` (dry-runnable callables) would
    compile, side by side; waits for them, and for compilations ``start`` began. Returns how many
    of the launches' specializations were compiled there."""
    with _pool_lock:
        started, _started[:] = list(_started), []
    for future in started:
        with contextlib.suppress(Exception):
            future.result()
    jobs, earlier = _jobs_of(launches)
    return earlier + (_compile(jobs) if jobs else 0)


def _jobs_of(launches: list) -> tuple[list, int]:
    """(the compile jobs of the specializations ``launches`` would compile, but for those compiled
    in workers before; how many of those there were)."""
    from .cache import source_of

    seen, jobs, earlier = set(), [], 0
    for run in launches:
        for fn, data in specializations(run):
            if data in seen:
                continue  # the same kernel and specialization (the repair kernel of each candidate)
            seen.add(data)
            module = fn.fn.__module__
            if (module, data) in _compiled:
                earlier += 1
                continue
            source = source_of(module)
            if source is not None:  # a kernel of fxflash's (no other is launched here)
                jobs.append(dict(source=source, module=module, file=sys.modules[module].__file__,
                                 name=fn.fn.__name__, data=data))
    return jobs, earlier


def _compile(jobs: list) -> int:
    """Compile ``jobs`` in workers, side by side; how many compiled. One batch at a time: a
    worker answers one job at a time, over one pipe."""
    with _batch_lock:
        return _compile_batch(jobs)


def _compile_batch(jobs: list) -> int:
    workers = start_workers(len(jobs))
    shares = [jobs[i::len(workers)] for i in range(len(workers))]
    with concurrent.futures.ThreadPoolExecutor(len(workers)) as threads:
        futures = [threads.submit(w.compile, share) for w, share in zip(workers, shares)]
        done = 0
        for future in futures:
            with contextlib.suppress(Exception):  # a broken worker: the launches compile its share
                compiled = future.result()
                _compiled.update((job["module"], job["data"]) for job in compiled)
                done += len(compiled)
    return done
