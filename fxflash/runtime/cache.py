"""Generated kernel modules, and the directory that holds what fxflash remembers across processes.

**Kernels are compiled from memory.** A generated module's source exists in this process (the
printer made it), so it is compiled from that string and executed into a fresh module, never
imported from a file: nothing on disk (a planted ``k_<hash>.py``, its ``__pycache__`` bytecode,
a file swapped between a check and an import) can run in its place. Triton reads a kernel's
source through ``inspect``; the module's lines are registered in ``linecache`` under a name that
is not a path (``<fxflash kernel k_<hash>>``), which ``linecache`` never looks up on disk. One
module per distinct source and toolchain (``source_key``), kept for the process.

**The cache directory** (``config.kernel_cache_dir``) holds ``tuning.json`` (runtime/tuning.py) and
the remembered graphs (``graphs/``, runtime/graph_cache.py, whose kernel sources run when loaded).
It is trusted only as a directory of this user's alone: created user-only (0700), and an existing
one that is a symlink, not a directory, owned by another user, or writable by group or others is
refused with a warning for a private temporary directory, as SSH refuses key files others can
write. Where neither can be had, nothing is stored (``cache_dir()`` returns None) and kernels are
tuned again in each process.
"""
from __future__ import annotations

import functools
import hashlib
import os
import stat
import tempfile
import threading
import types
import warnings

import torch
import triton

from ..config import config
from .compile_worker import execute

_lock = threading.Lock()
_modules: dict = {}
_sources: dict = {}  # a kernel module's name → the source it was executed from
_dirs: dict = {}  # configured path → the directory used for it (itself, a private one, or None)


def cache_dir() -> str | None:
    """The directory to store in: the configured one where it can be trusted (created user-only
    where missing), else a private temporary one (with a warning), else None."""
    path = config.kernel_cache_dir
    with _lock:
        if path not in _dirs:
            _dirs[path] = _trusted_dir(path)
        return _dirs[path]


def _trusted_dir(path: str) -> str | None:
    why = _distrust(path)
    if why is None:
        return path
    warnings.warn(f"fxflash: not using the cache directory {path} ({why}); kernels tuned in this process are "
                  "remembered in a private temporary directory instead", RuntimeWarning, stacklevel=4)
    try:
        return tempfile.mkdtemp(prefix="fxflash-")  # created 0700 by this user
    except OSError:
        return None


def _distrust(path: str) -> str | None:
    """Why ``path`` cannot be trusted as this user's cache directory, or None (then it exists)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        return f"cannot be created: {exc.strerror or exc}"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"owned by another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    if not os.access(path, os.W_OK | os.X_OK):
        return "not writable"
    return None


@functools.lru_cache(maxsize=128)
def source_key(source: str) -> str:
    """The kernel module's key: a hash of its source and of the Triton and torch versions (kept
    for the sources seen last: a backward looks its kernels up on every call)."""
    h = hashlib.sha256()
    for part in (source, triton.__version__, torch.__version__):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def load_kernel(source: str, name: str):
    """The ``@triton.jit`` function ``name`` defined by ``source``, compiled from ``source`` itself."""
    key = source_key(source)
    with _lock:
        module = _modules.get(key)
        if module is None:
            module = _modules[key] = _module_of(source, key)
        return getattr(module, name)


def source_of(module_name: str) -> str | None:
    """The source of the kernel module ``module_name`` loaded here (None: not one of fxflash's)."""
    return _sources.get(module_name)


def _module_of(source: str, key: str) -> types.ModuleType:
    name = f"fxflash_kernels.k_{key}"
    _sources[name] = source
    return execute(source, name, f"<fxflash kernel k_{key}>")
