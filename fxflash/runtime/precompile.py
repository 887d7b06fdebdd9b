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
``start`` also takes graphs (``graph_job``): a region's own ops, which the tuner times as Inductor
compiles them, compiled by a worker into Inductor's on-disk caches, which the tuner's own
compilation then loads (``op.RegisteredRegion.own_ops``).

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


# The matmul settings of this process that Inductor's cache key reads, set alike in a worker
# that compiles a graph for it.
GRAPH_SETTINGS = ("allow_tf32", "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction")


def graph_job(module, args: list) -> dict | None:
    """The job of compiling GraphModule ``module`` for ``args`` (tensors, whose layouts are sent,
    and scalars) as ``torch._inductor.standalone_compile`` would here. The module is sent as its
    Python code: unpickling a GraphModule traces that code symbolically again, which runs a factory
    op of constant arguments (``full``, ``iota``) and keeps its result as a constant, a graph Inductor
    would key differently. None where the module holds attributes (constants, submodules)."""
    import torch
    from torch.fx.graph_module import _format_import_block
    from torch.package import sys_importer

    if any(node.op in ("get_attr", "call_module") for node in module.graph.nodes):
        return None
    code = module.graph.python_code(root_module="self")
    inputs = [[list(a.shape), list(a.stride()), a.storage_offset(), str(a.dtype).removeprefix("torch."), str(a.device)]
              if isinstance(a, torch.Tensor) else a for a in args]
    settings = {name: getattr(torch.backends.cuda.matmul, name) for name in GRAPH_SETTINGS}
    device = next((a.device.index for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"), None)
    return dict(graph=_format_import_block(code.globals, sys_importer) + "\n" + code.src, inputs=inputs,
                settings=settings, device=device)


def start(launches: list, graphs: tuple = ()) -> None:
    """``compile_all`` begun and not waited for: the specializations are recorded now (dry
    launches, in this thread), and a thread of its own hands them to the workers, after the
    ``graphs`` (``graph_job``s: the longest, started first). The backend starts it before its
    inner compiler compiles the graph, whose work is mostly one thread's; ``compile_all`` waits
    for it first."""
    jobs = [*graphs, *_jobs_of(launches)[0]]
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


def wait_started() -> None:
    """Wait for the compilations ``start`` began."""
    with _pool_lock:
        started, _started[:] = list(_started), []
    for future in started:
        with contextlib.suppress(Exception):
            future.result()


def compile_all(launches: list) -> int:
    """Compile in worker processes what each of ``launches`` (dry-runnable callables) would
    compile, side by side; waits for them, and for compilations ``start`` began. Returns how many
    of the launches' specializations were compiled there."""
    wait_started()
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
                kernels = [job for job in compiled if "graph" not in job]
                _compiled.update((job["module"], job["data"]) for job in kernels)
                done += len(kernels)
    return done
