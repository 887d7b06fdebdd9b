"""Triton's language functions made runnable by its interpreter after the fact.

``@triton.jit`` reads TRITON_INTERPRET when it defines a function. fxflash sets it when it is
imported without a CUDA GPU, but where something imported triton before (torch.compile does,
when it loads the "fxflash" backend by name), triton.language's own jit functions (``tl.cdiv``,
``tl.max``, ``tl.sum`` and the functions they call) were defined as compiled-only JITFunctions,
which the interpreter refuses to call from a kernel. ``interpreted_language()`` defines them as
the interpreter would have, InterpretedFunctions of the same Python functions, for the time of
one interpreted launch, and puts the JITFunctions back after it: a kernel compiled for a GPU in
the same process (a test that compiles for Hopper) still finds triton.language as it was.
"""
from __future__ import annotations

import contextlib
import sys


def _jit_functions() -> list:
    """(module, attribute, JITFunction, its InterpretedFunction) of every triton.language module's
    compiled-only function (none where triton was imported in interpreter mode)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    made: dict = {}   # by id: a JITFunction's hash walks the functions it calls
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "triton.language" or name.startswith("triton.language.")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                interpreted = made.setdefault(id(value), InterpretedFunction(value.fn))
                found.append((module, attr, value, interpreted))
    return found


_FOUND: list | None = None


@contextlib.contextmanager
def interpreted_language():
    """Inside the block, triton.language's JITFunctions are InterpretedFunctions (the caller holds
    the interpreter's lock: launch._launching)."""
    global _FOUND
    if _FOUND is None:
        _FOUND = _jit_functions()
    for module, attr, _, interpreted in _FOUND:
        setattr(module, attr, interpreted)
    try:
        yield
    finally:
        for module, attr, original, _ in _FOUND:
            setattr(module, attr, original)
