"""The user's objects as capture found them, restored after it.

Tracing runs the user's code, which may change what it is handed: append to a list, update a
dict, call ``cache.update()`` on a transformers ``DynamicCache`` (leaving fake tensors inside
it), set an attribute of a module, or write into a buffer. ``Snapshot`` records, before
tracing, every container and object reachable from the call's arguments and the module (lists,
dicts, sets, objects' ``__dict__``, tensors' versions and contents), and ``restore()`` puts each
back: the same objects hold the same items. Tensors are restored in place where their version
moved (an in-place write under real tracing); fake tracing never writes into real tensors.
"""
from __future__ import annotations

import types

import torch

# Objects whose state is not the user's to lose (classes, functions, modules of code) or that
# cannot change (scalars, strings): not walked.
_OPAQUE = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType,
           str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.Size)
_DEPTH = 8


class Snapshot:
    """``Snapshot(roots)`` records; ``restore()`` undoes what happened to them since."""

    def __init__(self, roots):
        self.lists: list = []      # (list, its items)
        self.dicts: list = []      # (dict, its items)
        self.sets: list = []       # (set, its items)
        self.objects: list = []    # (object, its __dict__ items)
        self.tensors: list = []    # (tensor, its version, a copy of it or None)
        self._seen: set = set()
        for root in roots:
            self._walk(root, 0)

    def _walk(self, x, depth: int) -> None:
        if isinstance(x, _OPAQUE) or id(x) in self._seen or depth > _DEPTH:
            return
        self._seen.add(id(x))
        if isinstance(x, torch.Tensor):
            self.tensors.append((x, _version(x), None))  # contents kept only for real tracing
            return
        if isinstance(x, list):
            self.lists.append((x, list(x)))
            items = x
        elif isinstance(x, tuple):
            items = x
        elif isinstance(x, dict):
            self.dicts.append((x, dict(x)))
            items = list(x.values())
        elif isinstance(x, set):
            self.sets.append((x, set(x)))
            items = list(x)
        elif hasattr(x, "__dict__") and isinstance(vars(x), dict) and _users(x):
            state = vars(x)
            self.objects.append((x, dict(state)))
            items = list(state.values())
        else:
            return
        for item in items:
            self._walk(item, depth + 1)

    def keep_contents(self, traced_on_copies) -> None:
        """Also copy the contents of every real tensor, for a trace that runs on real tensors,
        except ``traced_on_copies`` (the graph's inputs, which that trace reads as copies)."""
        skip = {id(t) for t in traced_on_copies}
        self.tensors = [(t, version, t.detach().clone() if _real(t) and id(t) not in skip else None)
                        for t, version, _ in self.tensors]

    def restore(self) -> list[str]:
        """Put everything back; returns what had changed other than a tensor's contents (the
        Python side effects of the traced code, which a graph cannot replay), one phrase each."""
        changed = [f"a {type(x).__name__}" for x, items in self.lists + self.dicts + self.sets
                   if _differs(x, items)]
        changed += [f"an attribute of a {type(x).__name__}" for x, items in self.objects if _differs(vars(x), items)]
        for x, items in self.lists:
            x[:] = items
        for x, items in self.dicts + self.sets + [(vars(x), items) for x, items in self.objects]:
            if _differs(x, items):
                x.clear()
                x.update(items)
        for t, version, contents in self.tensors:
            if contents is not None and _version(t) != version:
                with torch.no_grad():
                    t.copy_(contents)
        return changed


def _users(x) -> bool:
    """Is ``x`` an object of the user's (or a module), not PyTorch's own machinery (a SymInt's
    shape environment, a fake tensor mode), which tracing changes as it should?"""
    return isinstance(x, torch.nn.Module) or not type(x).__module__.startswith("torch")


def _differs(x, items) -> bool:
    """Does container ``x`` hold other items than ``items`` (its recorded copy), by identity?"""
    if isinstance(x, set):
        return x != items
    if isinstance(x, list):
        return len(x) != len(items) or any(a is not b for a, b in zip(x, items))
    return x.keys() != items.keys() or any(x[k] is not v for k, v in items.items())


def _version(t: torch.Tensor):
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version: it cannot be written under tracing
        return None


def _real(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return not t.is_meta and not isinstance(t, FakeTensor)


def real_copies(inputs: list) -> list:
    """The graph's inputs for a trace on real tensors: copies of real tensors (same values,
    ``requires_grad`` and strides), so that what the traced code writes stays in the copies."""
    def copy(x):
        if not isinstance(x, torch.Tensor) or not _real(x):
            return x
        c = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
        with torch.no_grad():
            c.copy_(x)
        return c.requires_grad_(x.requires_grad)
    return [copy(x) for x in inputs]
