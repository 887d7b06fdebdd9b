"""Code generation, a pure function of a region: its Triton kernel (emit), its Gluon kernel for
Hopper (gluon), the elementwise printers and interval arithmetic they share. Nothing here runs a
kernel: that is fxflash.runtime's."""
from .emit import Unprintable, emit_kernel
from .plan import KernelPlan

__all__ = ["KernelPlan", "Unprintable", "emit_kernel"]
