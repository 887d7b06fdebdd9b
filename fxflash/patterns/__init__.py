"""Stage 3: chain discovery and the fusion rules that turn chains into regions."""
from .chains import Chain, find_chains, is_convex

__all__ = ["Chain", "find_chains", "is_convex"]
