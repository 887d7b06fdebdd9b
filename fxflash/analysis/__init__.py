"""Stage 2: networkx dataflow graph, dimension ids, op kinds and computation sketches."""
from .dims import DimensionTable, build_dimension_table
from .graph import GraphAnalysis, analyse, dataflow_graph
from .ops import OpKind
from .sketch import Sketch, dim_name

__all__ = [
    "DimensionTable",
    "GraphAnalysis",
    "OpKind",
    "Sketch",
    "analyse",
    "build_dimension_table",
    "dataflow_graph",
    "dim_name",
]
