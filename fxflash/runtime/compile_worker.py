"""A compile worker of runtime/precompile.py, run as a script (``python compile_worker.py``) so
that it imports Triton and torch only, not the fxflash package (which would double its start).

It reads one job per line on standard input (JSON) and answers one line starting with ``ANSWER``:
"ok", or "error" and why. Other lines on its output are what imports printed. It ends when its
input ends. A job is one of:

- a kernel: its source, its module's name and file name, the kernel's name and Triton's serialized
  specialization, compiled into Triton's on-disk cache (``JITFunction.preload``);
- a graph (``"graph"``): a GraphModule's Python code and the layouts of its inputs, compiled by
  Inductor's ``standalone_compile`` into Inductor's on-disk caches, from which the same compilation in
  the parent process loads it (``compile_graph``).
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


def _input(spec):
    """An example input of a graph job: a scalar as it is, or an uninitialized tensor of the
    layout ``[shape, strides, storage offset, dtype name, device]`` (a cache key reads all of it;
    a fake one under a FakeTensorMode)."""
    import torch

    if not isinstance(spec, list):
        return spec
    shape, stride, offset, dtype, device = spec
    extent = offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    base = torch.empty(extent, dtype=getattr(torch, dtype), device=device)
    return base.as_strided(shape, stride, offset)


def compile_graph(job: dict) -> None:
    """Compile the job's graph for its inputs as the parent's ``standalone_compile`` would, with
    the parent's matmul settings (part of Inductor's cache key); one compile thread, as this
    worker is one of several."""
    import torch
    import torch._inductor.config as inductor_config
    from torch.fx.experimental.proxy_tensor import make_fx

    for name, value in job["settings"].items():  # set only where they differ: setting one sets the
        if getattr(torch.backends.cuda.matmul, name) != value:  # precision the key reads ("none" → "ieee")
            setattr(torch.backends.cuda.matmul, name, value)
    if job["device"] is not None:
        torch.cuda.set_device(job["device"])
    namespace: dict = {}
    exec(compile(job["graph"], "<fxflash graph>", "exec"), namespace)
    forward = namespace["forward"]

    def compile_for(inputs):
        with torch.no_grad():  # the module's ops as the parent's AOTAutograd traces them, on fake tensors
            module = make_fx(lambda *args: forward(None, *args), tracing_mode="fake")(*inputs)
            torch._inductor.standalone_compile(module, inputs, dynamic_shapes="from_example_inputs")

    # inputs of fake tensors, which hold no memory on the user's GPU; allocated ones where this
    # torch's standalone_compile takes no fake inputs
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with FakeTensorMode(shape_env=ShapeEnv()):
        fake = [_input(spec) for spec in job["inputs"]]
    with inductor_config.patch(compile_threads=1):  # not a compile pool per worker
        try:
            compile_for(fake)
        except Exception:  # noqa: BLE001
            compile_for([_input(spec) for spec in job["inputs"]])


def serve() -> None:
    import torch
    import triton  # noqa: F401 - imported before the first job arrives

    if torch.cuda.is_available():
        torch.cuda.init()  # preload reads the current device: initialised before the first job
    for line in sys.stdin:
        try:
            job = json.loads(line)
            if "graph" in job:
                compile_graph(job)
            else:
                load(job["source"], job["module"], job["file"], job["name"]).preload(job["data"])
            answer = "ok"
        except Exception as exc:  # the launch compiles it instead
            answer = f"error {type(exc).__name__}: {exc}".replace("\n", " ")
        sys.stdout.write(ANSWER + answer + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
