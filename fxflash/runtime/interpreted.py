"""Triton's language functions made runnable by its interpreter after the fact.

``@triton.jit`` reads TRITON_INTERPRET when it defines a function. fxflash sets it when it is
imported without a CUDA GPU, but where something imported triton before (torch.compile does,
when it loads the "fxflash" backend by name), triton.language's own jit functions (``tl.cdiv``,
``tl.max``, ``tl.sum`` and the functions they call) were defined as compiled-only JITFunctions,
which the interpreter refuses to call from a kernel. ``interpret_triton_language`` defines them
again as the interpreter would have: each JITFunction attribute of a ``triton.language`` module
becomes an InterpretedFunction of the same Python function. It runs only in interpreter mode,
where no compiled Triton kernel can run.
"""
from __future__ import annotations

import sys


def interpret_triton_language() -> int:
    """Rebind triton.language's JITFunctions as InterpretedFunctions; returns how many."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    made: dict = {}   # by id: a JITFunction's hash walks the functions it calls
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "triton.language" or name.startswith("triton.language.")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                if id(value) not in made:
                    made[id(value)] = InterpretedFunction(value.fn)
                setattr(module, attr, made[id(value)])
    return len(made)
