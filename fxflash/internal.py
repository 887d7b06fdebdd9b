"""Internal errors: an exception raised inside one of fxflash's own stages never reaches the user.

Each stage runs inside ``stage(name)``: an exception other than the stage's own refusals becomes
an ``InternalError`` naming the stage and the exception. The caller refuses the region (rule
``internal error``, shown by ``explain()``), runs it as eager PyTorch, and warns once, asking for
a report. ``STAGES`` lists the names, in pipeline order.
"""
from __future__ import annotations

import contextlib
import warnings

import torch

RULE = "internal error"
STAGES = ("capture", "analysis", "fusion rules", "code generation", "kernel compilation", "rewrite", "tuning",
          "launch", "backward")
# Errors that are the machine's, not fxflash's: they reach the user as they are.
PASSED_THROUGH = (torch.OutOfMemoryError,)


class InternalError(Exception):
    """An exception raised inside fxflash's stage ``stage``: a bug in fxflash, not in the user's code."""

    def __init__(self, stage: str, exc: BaseException):
        super().__init__(stage, exc)
        self.stage, self.exc = stage, exc

    def __str__(self) -> str:
        return f"internal error in {self.stage}: {type(self.exc).__name__}: {self.exc}"


@contextlib.contextmanager
def stage(name: str, *refusals: type):
    """Turn an exception raised in the block into an InternalError of stage ``name``, except the
    stage's own ``refusals`` (its way of saying no), InternalErrors and PASSED_THROUGH."""
    assert name in STAGES, name
    try:
        yield
    except (InternalError, *refusals, *PASSED_THROUGH):
        raise
    except Exception as exc:  # noqa: BLE001 - the point: nothing of ours escapes
        raise InternalError(name, exc) from exc


def warn(error: InternalError, outcome: str = "the region runs as eager PyTorch", stacklevel: int = 2) -> None:
    warnings.warn(f"fxflash: {error}; {outcome}. This is a bug in fxflash: please report it with this message "
                  "and the output of fxflash.explain() for the same call.", RuntimeWarning, stacklevel=stacklevel + 1)
