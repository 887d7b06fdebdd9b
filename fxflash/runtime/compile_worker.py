"""A compile worker of runtime/precompile.py, run as a script (``python compile_worker.py``) so
that it imports Triton and torch only, not the fxflash package (which would double its start).

It reads one job per line on standard input (JSON: a kernel's source, its module's name and file
name, the kernel's name and Triton's serialized specialization), compiles it into Triton's on-disk cache
(``JITFunction.preload``) and answers one line starting with ``ANSWER``: "ok", or "error" and
why. Other lines on its output are what imports printed. It ends when its input ends.
"""
import json
import linecache
import sys
import types

ANSWER = "fxflash-precompile: "


def execute(source: str, module_name: str, filename: str) -> types.ModuleType:
    """``source`` executed as a fresh module named ``module_name``, its lines held by linecache under
    ``filename`` (not a path: never looked up on disk), where Triton reads a kernel's source; the
    module is registered in ``sys.modules``, where ``inspect`` finds a function's module. The one
    way fxflash loads a kernel (runtime/cache.py), here as in a worker."""
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)  # no mtime
    module = types.ModuleType(module_name)
    module.__file__ = filename
    sys.modules[module_name] = module
    exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)
    return module


def load(source: str, module_name: str, filename: str, name: str):
    """The kernel ``name`` of ``source``, executed as runtime/cache.py executes it (``execute``)."""
    module = sys.modules.get(module_name) or execute(source, module_name, filename)
    return getattr(module, name)


def serve() -> None:
    import torch
    import triton  # noqa: F401 - imported before the first job arrives

    if torch.cuda.is_available():
        torch.cuda.init()  # preload reads the current device: initialised before the first job
    for line in sys.stdin:
        try:
            job = json.loads(line)
            load(job["source"], job["module"], job["file"], job["name"]).preload(job["data"])
            answer = "ok"
        except Exception as exc:  # the launch compiles it instead
            answer = f"error {type(exc).__name__}: {exc}".replace("\n", " ")
        sys.stdout.write(ANSWER + answer + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
