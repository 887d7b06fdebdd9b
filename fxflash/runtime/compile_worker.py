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


def load(source: str, module_name: str, filename: str, name: str):
    """The kernel ``name`` of ``source``, executed as runtime/cache.py executes it: a module of
    that name and file name, whose lines linecache holds (Triton reads a kernel's source there)."""
    module = sys.modules.get(module_name)
    if module is None:
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        module = types.ModuleType(module_name)
        module.__file__ = filename
        sys.modules[module_name] = module
        exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)
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
