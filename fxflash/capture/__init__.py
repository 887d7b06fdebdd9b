"""Stage 1: tracing, decomposition, functionalization, the input-signature cache."""
from .signature import Ambient, SignatureCache, exact_key, signature_of, stride_class
from .trace import CaptureError, CapturedGraph, capture, module_params

__all__ = [
    "Ambient",
    "CaptureError",
    "CapturedGraph",
    "SignatureCache",
    "capture",
    "exact_key",
    "module_params",
    "signature_of",
    "stride_class",
]
