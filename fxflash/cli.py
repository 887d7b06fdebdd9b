"""``python -m fxflash explain path/to/script.py:function``: print what fxflash finds and fuses
in a function (or ``nn.Module`` class) of a script, for the script's example inputs.

The script gives its inputs in one of three ways, looked up in this order:

* an attribute of the function:  ``attention.example_inputs = lambda: (q, k, v)``;
* a module-level dict by name:   ``example_inputs = {"attention": lambda: (q, k, v)}``;
* a module-level function:       ``def example_inputs(): return q, k, v``.

Each is a tuple of positional arguments or a callable that returns one. The script runs with
``__name__ != "__main__"``, so its ``main()`` does not.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import torch

USAGE_INPUTS = ("define example inputs in the script: `example_inputs = {name: lambda: (q, k, v)}`, a function "
                "`example_inputs()` returning the argument tuple, or `fn.example_inputs = …`")


SCRIPT_MODULE = "__fxflash_script__"  # the name the script runs under


class CLIError(Exception):
    """A problem with the command line or the script, reported without a traceback."""


def _load(target: str):
    path, sep, name = target.rpartition(":")
    if not sep or not path or not name:
        raise CLIError(f"expected path/to/script.py:function, got {target!r}")
    if not os.path.isfile(path):
        raise CLIError(f"no such script: {path}")
    # a module in sys.modules, as TorchDynamo looks a function's module up by its name
    spec = importlib.util.spec_from_file_location(SCRIPT_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[SCRIPT_MODULE] = module
    spec.loader.exec_module(module)
    namespace = vars(module)
    if name not in namespace:
        found = sorted(k for k, v in namespace.items() if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == SCRIPT_MODULE)
        raise CLIError(f"{path} defines no {name!r}; it defines: {', '.join(found) or 'nothing callable'}")
    return namespace, name, namespace[name]


def _inputs(namespace: dict, name: str, fn) -> tuple:
    given = getattr(fn, "example_inputs", None)
    table = namespace.get("example_inputs")
    if given is None and isinstance(table, dict):
        given = table.get(name)
    elif given is None and callable(table):
        given = table
    if given is None:
        raise CLIError(f"no example inputs for {name!r}: {USAGE_INPUTS}")
    args = given() if callable(given) else given
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, (tuple, list)):
        raise CLIError(f"example inputs for {name!r} must be a tuple of arguments, got {type(args).__name__}")
    return tuple(args)


def _target(fn):
    if isinstance(fn, type) and issubclass(fn, torch.nn.Module):
        try:
            return fn()
        except TypeError as exc:
            raise CLIError(f"cannot build {fn.__name__}() without arguments ({exc}); define an instance in "
                           "the script and name it instead") from exc
    if not callable(fn):
        raise CLIError(f"{fn!r} is not a function or an nn.Module")
    return fn


def explain_command(opts) -> int:
    import fxflash
    import fxflash.viz

    fmt = os.path.splitext(opts.render)[1].lstrip(".").lower() if opts.render else "svg"
    if fmt not in fxflash.viz.FORMATS:  # said before anything is traced
        raise CLIError(f"--render {opts.render}: the drawing is written as .svg or .png, not .{fmt or '(none)'}")
    namespace, name, fn = _load(opts.target)
    report = fxflash.explain(_target(fn), *_inputs(namespace, name, fn))
    print(report)
    if opts.source:
        for i, region in enumerate(report.regions):
            if region.source:
                print(f"\n# generated Triton source of region {i}\n{region.source}")
    if opts.render:
        try:
            engine = fxflash.viz.render(report, opts.render, engine=opts.engine)
        except (ValueError, RuntimeError, ImportError, OSError) as exc:  # no dot, no matplotlib, no such folder
            raise CLIError(f"--render {opts.render}: {exc}") from exc
        print(f"\ngraph drawn to {opts.render} ({engine})")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fxflash", description="fxflash command line")
    sub = parser.add_subparsers(dest="command", required=True)
    explain = sub.add_parser("explain", help="print the regions fxflash finds in a script's function",
                             description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    explain.add_argument("target", help="path/to/script.py:function (a function or an nn.Module class/instance)")
    explain.add_argument("--render", metavar="FILE", help="also draw the graph to FILE (.svg or .png)")
    explain.add_argument("--engine", default="auto", choices=("auto", "graphviz", "matplotlib"))
    explain.add_argument("--source", action="store_true", help="print the generated Triton source too")
    opts = parser.parse_args(argv)
    try:
        return {"explain": explain_command}[opts.command](opts)
    except CLIError as exc:
        print(f"fxflash {opts.command}: {exc}", file=sys.stderr)
        return 2


__all__ = ["main"]
