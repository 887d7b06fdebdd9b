"""The tile program of a fused kernel: its IR (ir.py) and the lowering of a region into it (lower.py)."""
from .ir import TileProgram
from .lower import lower

__all__ = ["TileProgram", "lower"]
