"""The tile program of a fused kernel: its IR (ir.py), the lowering of a region into it (lower.py)
and of the region's backward (backward.py)."""
from .backward import BackwardRefused, lower_backward
from .ir import TileProgram
from .lower import lower

__all__ = ["BackwardRefused", "TileProgram", "lower", "lower_backward"]
