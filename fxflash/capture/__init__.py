"""Stage 1: tracing a graph of torch calls to a decomposed, functional ATen graph."""
from .trace import CaptureError, CapturedGraph, capture

__all__ = ["CaptureError", "CapturedGraph", "capture"]
