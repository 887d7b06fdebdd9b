"""The on-disk kernel cache: generated Triton modules, content-addressed.

Each kernel's source is written once to ``<cache dir>/k_<sha256>.py``, where the hash covers
the source and the Triton and torch versions (so the region structure, the dtypes that the
source prints, and the toolchain are all in the key; Triton keeps its own per-device binary
cache). The directory is created with user-only permissions. A file whose content does not
hash to its name (corrupt, or written by someone else) is never imported: it is rewritten.
No pickle is used anywhere.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading

import torch
import triton

from ..config import config

_lock = threading.Lock()
_modules: dict = {}


def cache_dir() -> str:
    path = config.kernel_cache_dir
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def source_key(source: str) -> str:
    h = hashlib.sha256()
    for part in (source, triton.__version__, torch.__version__):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _write_atomic(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp_", suffix=".py")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _stored(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def load_kernel(source: str, name: str):
    """The ``@triton.jit`` function ``name`` defined by ``source``, through the disk cache."""
    key = source_key(source)
    with _lock:
        if key in _modules:
            return getattr(_modules[key], name)
        path = os.path.join(cache_dir(), f"k_{key}.py")
        if _stored(path) != source:
            _write_atomic(path, source)
        spec = importlib.util.spec_from_file_location(f"fxflash_kernels.k_{key}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # triton.jit reads the source through inspect
        spec.loader.exec_module(module)
        _modules[key] = module
        return getattr(module, name)
