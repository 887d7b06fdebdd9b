"""Input signatures: what a captured graph is specialized on.

A graph traced for one signature is reused only for calls with the same signature: the same
tensor shapes, dtypes, devices, stride class and ``requires_grad`` flags, the same values of
non-tensor arguments (a dataclass's by its attributes, a tensor among them by identity and
version: a trace reads it as a constant; other objects by identity), and the same grad mode,
module modes and plain values the function's code reads (``Ambient``). Anything else is captured
anew.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
import types
from typing import Any, Callable, Hashable

import torch
import torch.utils._pytree as pytree


def stride_class(t: torch.Tensor) -> tuple:
    """The layout facts a trace may depend on: the order of the strides and which axes are
    broadcast (stride 0) or of size one. Two tensors of one class are traced alike."""
    strides = t.stride()
    order = tuple(sorted(range(len(strides)), key=lambda i: (-strides[i], i)))
    zero = tuple(s == 0 for s in strides)
    return (order, zero, t.is_contiguous())


PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device)  # values keyed by value


def _value(x: Any) -> Hashable:
    """A plain value as a key: floats by their bits (-0.0 is not 0.0; every NaN is one key)."""
    return x.hex() if isinstance(x, float) else x


class _Held:
    """An object in a key by identity, held (so that its address is never another object's while
    the key lives)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _Held) and other.obj is self.obj


OBJECT_DEPTH = 3  # attributes of attributes … keyed by content this deep, then by identity


def _object_key(x: Any, depth: int) -> Hashable:
    """A record argument (a dataclass instance, a SimpleNamespace: a config) by its contents: its
    type and each attribute's key (a tensor attribute, which a trace reads as a constant, by
    identity and version too), to OBJECT_DEPTH levels. Any other object (a cache the code
    updates as it runs) by identity, held: its address is never another's while the key lives."""
    fields = getattr(x, "__dict__", None)
    record = dataclasses.is_dataclass(x) or isinstance(x, types.SimpleNamespace)
    if not record or not isinstance(fields, dict) or depth >= OBJECT_DEPTH:
        return ("O", type(x).__qualname__, _Held(x))
    return ("O", type(x).__qualname__,
            tuple((name, _leaf_key(value, depth + 1)) for name, value in sorted(fields.items())))


def _leaf_key(x: Any, depth: int = 0) -> Hashable:
    if isinstance(x, torch.Tensor) and depth > 0:  # inside an object: traced as a constant
        return ("C", _leaf_key(x), _Held(x), x._version)
    if isinstance(x, (list, tuple)) and depth > 0:
        return (type(x).__name__, tuple(_leaf_key(v, depth + 1) for v in x))
    if isinstance(x, dict) and depth > 0:
        return ("dict", tuple((repr(k), _leaf_key(v, depth + 1)) for k, v in x.items()))
    if isinstance(x, torch.Tensor):
        return (
            "T",
            tuple(x.shape),
            x.dtype,
            x.device.type,
            x.device.index,
            stride_class(x),
            x.requires_grad,
        )
    if isinstance(x, PLAIN):
        return ("V", type(x).__name__, _value(x))
    if isinstance(x, (torch.nn.Module, types.ModuleType)) or callable(x):  # classes too
        return ("O", type(x).__qualname__, _Held(x))  # code, Python modules and nn.Modules: by identity
    return _object_key(x, depth)


def signature_of(args: tuple, kwargs: dict, params: dict | None = None) -> Hashable:
    """A hashable key for one call: its pytree structure, every leaf's key, the grad mode."""
    param_key = tuple((n, _leaf_key(p)) for n, p in params.items()) if params else ()
    if is_flat_call(args, kwargs):
        # the common call f(q, k, v, 0.5): a flat tuple, no pytree walk (the per-call cost)
        return ("flat", len(args), tuple(_leaf_key(x) for x in args), param_key, torch.is_grad_enabled())
    leaves, spec = pytree.tree_flatten((args, kwargs))
    return (str(spec), tuple(_leaf_key(x) for x in leaves), param_key, torch.is_grad_enabled())




def _exact_leaf(x: Any) -> Hashable:
    if isinstance(x, torch.Tensor):
        return (x.shape, x.stride(), x.dtype, x.device, x.requires_grad)
    return (type(x), _value(x))


def exact_key(args: tuple, kwargs: dict, params: dict | None = None) -> Hashable | None:
    """For a flat call (``is_flat_call``): every tensor's shape, strides, dtype, device and
    ``requires_grad`` flag and every other argument's value, and the grad mode. It determines
    ``signature_of`` (the stride class is a function of shape and strides) and costs a fifth
    of it, so it memoizes it; None for other calls."""
    if not is_flat_call(args, kwargs):
        return None
    param_key = tuple((n, _exact_leaf(p)) for n, p in params.items()) if params else ()
    return (tuple(_exact_leaf(x) for x in args), param_key, torch.is_grad_enabled())


def is_flat_call(args: tuple, kwargs: dict) -> bool:
    """No kwargs and every argument a pytree leaf (a tensor or a plain value): the flat
    leaves are ``args`` themselves."""
    return not kwargs and all(type(x) in PLAIN or isinstance(x, torch.Tensor) for x in args)


class SignatureCache:
    """A bounded LRU map from signature to compiled graph, safe under concurrent first calls:
    two threads that miss on the same key build it once."""

    def __init__(self, capacity: Callable[[], int]):
        self._capacity = capacity
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.RLock()
        self._building: dict = {}

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list:
        with self._lock:
            return list(self._entries)

    def get_or_build(self, key: Hashable, build: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            event = self._building.get(key)
            owner = event is None
            if owner:
                event = self._building[key] = threading.Event()
        if not owner:
            event.wait()
            with self._lock:
                if key in self._entries:
                    return self._entries[key]
            return self.get_or_build(key, build)
        try:
            value = build()
            with self._lock:
                self._entries[key] = value
                while len(self._entries) > max(1, self._capacity()):
                    self._entries.popitem(last=False)
            return value
        finally:
            with self._lock:
                self._building.pop(key, None)
            event.set()


class Ambient:
    """What a trace reads besides its arguments and parameters, as part of the signature: the
    train/eval flag of every submodule (dropout, batch norm), every submodule's public attributes
    (``self.scale``, ``self.causal``; not tensors or submodules), and the closure cells and
    globals that the function's own code names (a flag in a closure, a global constant): plain
    values by value, other objects by identity (_plain_key). Names are listed once; their values
    are read at each call. Code the function calls is not looked into."""

    def __init__(self, fn: Callable, module: torch.nn.Module | None):
        self.modules = list(module.modules()) if module is not None else []
        self.attributes = [(m, name) for m in self.modules for name, value in vars(m).items()
                           if not name.startswith("_") and name != "training"
                           and not isinstance(value, (torch.Tensor, torch.nn.Module))]
        code = getattr(fn, "__code__", None)
        self.cells = list(getattr(fn, "__closure__", None) or ())
        self.globals = getattr(fn, "__globals__", {})
        self.global_names = sorted(n for n in _names(code) if n in self.globals) if code is not None else []

    def key(self) -> Hashable:
        return (tuple(m.training for m in self.modules),
                tuple(_plain_key(getattr(m, name, None)) for m, name in self.attributes),
                tuple(_plain_key(_cell_value(c)) for c in self.cells),
                tuple(_plain_key(self.globals.get(n)) for n in self.global_names))


def _plain_key(x: Any) -> Hashable:
    """A plain value (or a tuple of them) by value; anything else by identity: a list, dict or
    object the function updates as it runs (a log, a cache) would otherwise change the key at
    every call. (An attribute changed inside such an object is not seen.)"""
    if isinstance(x, PLAIN):
        return (type(x).__name__, _value(x))
    if isinstance(x, tuple) and all(isinstance(v, PLAIN) for v in x):
        return tuple((type(v).__name__, _value(v)) for v in x)
    return _Held(x)


def _names(code) -> set:
    """The global names ``code`` and the code nested in it (lambdas, comprehensions) load."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:  # not yet bound
        return None
