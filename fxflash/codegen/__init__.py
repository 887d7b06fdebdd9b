"""Stage 4: region → Triton source, kernel cache, launch; stage 5: the graph rewrite."""
from .cache import load_kernel
from .emit import KernelPlan, Unprintable, emit_kernel
from .op import region as region_op
from .rewrite import reference_subgraph, replace_region

__all__ = ["KernelPlan", "Unprintable", "emit_kernel", "load_kernel", "reference_subgraph", "region_op", "replace_region"]
