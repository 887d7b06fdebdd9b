"""Running generated kernels: kernel modules and the cache directory (cache), launches (launch,
gluon_launch), tile tuning (tuning), the ``fxflash::region`` custom op (op) and the graph rewrite
that calls it (rewrite). It reads the plans code generation made (fxflash.codegen)."""
from .cache import load_kernel
from .op import region as region_op
from .rewrite import placement, reference_subgraph, replace_region

__all__ = ["load_kernel", "placement", "reference_subgraph", "region_op", "replace_region"]
