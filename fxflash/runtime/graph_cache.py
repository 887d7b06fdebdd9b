"""Compiled graphs remembered across processes: a warm process skips capture, analysis and code
generation for a graph it has compiled before.

The backend's work on one Dynamo graph (trace it to ATen, find and fuse its chains, print and load
their kernels) depends only on the graph, its inputs' layouts and the environment: fxflash's own
code, torch's and Triton's versions, the GPU, ``config`` and the modes capture and printing read
(``graph_key``). For that key the backend stores what it produced (``Remembered``): the rewritten
graph, with its calls of ``fxflash::region``; each region's registered entry (its plans with their
kernels' sources, and the ops it replaced); how the call's inputs feed the graph; and the report. A
later process with the same key rebuilds these (0.13 s for a 16-layer Llama's graph) and hands the
graph to the inner compiler as the first process did, so that Inductor's own caches recognise it.

**Format.** One file per key in ``<kernel_cache_dir>/graphs``, written whole and then renamed into
place. FX graphs are stored as data (each node's op, name, target by name, and arguments), never as
code: a target is found again by name among PyTorch's operators and a few functions of ``operator``
and ``math`` (``_TARGET_FUNCTIONS``). The rest is pickled and read back by an unpickler that resolves only
fxflash's own data classes and PyTorch's dtypes, devices and layouts (``_Unpickler``); tensors
(graphs' constants) go through ``torch.save`` and ``torch.load(weights_only=True)``. The file holds generated kernel sources, which run
when loaded, as the kernels Inductor and Triton cache do; so it is read only from the trusted
cache directory (runtime/cache.py). A file that cannot be read, or that names what this process
cannot resolve, is a miss: the graph is compiled afresh and stored again.
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import importlib
import io
import logging
import os
import pickle
import sys
import tempfile

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
import triton

from ..config import config, interpreting

log = logging.getLogger("fxflash")

FORMAT = 1  # bump when what a file holds changes shape
SUBDIR = "graphs"

# Settings that change no graph's rewrite (where files go, whether a progress bar shows)
_UNKEYED_SETTINGS = ("kernel_cache_dir", "progress", "remember_graphs")


class Unrememberable(Exception):
    """The graph holds something this format cannot store; it is compiled anew in each process."""


@dataclasses.dataclass
class Remembered:
    """What the backend produced for one graph. ``graph``: the rewritten graph as data
    (``GraphData``; None where nothing fused, and Dynamo's graph is compiled as it is);
    ``regions``: (key, RegionData) per region it calls; ``in_spec``/``out_spec``: the pytree specs of
    the call's arguments and results (``treespec_dumps``), ``tensor_positions``: which argument leaves
    are the graph's inputs (capture.CapturedGraph); ``report``: the report, its chains as text."""

    graph: "GraphData | None"
    regions: list
    in_spec: str
    tensor_positions: list
    out_spec: str
    report: object


@dataclasses.dataclass
class NodeRef:
    """An FX node named in another node's arguments."""

    name: str


@dataclasses.dataclass
class GraphData:
    """An FX graph as data: ``nodes`` are (op, name, target, args, kwargs), targets by name
    (``_target_name``), nodes in arguments as NodeRef; ``constants``: the graph's tensor attributes
    (get_attr targets), stored by ``torch.save`` (``_Pickler``)."""

    nodes: list
    constants: dict


@dataclasses.dataclass
class RegionData:
    """A registered region (op.RegisteredRegion) as data: its plan without the FX nodes it was
    printed from, the ops it replaced as GraphData, and the rest as it is."""

    plan: object
    reference: GraphData
    out_ranks: tuple
    extra_is_float: tuple
    epilogue: tuple | None        # (GraphData, extras, inputs) of a Subgraph
    computed: dict
    views: tuple | None
    # a region with softmax streams: its twin (runtime/twin.Twin) as (GraphData of its fused module,
    # [(key, RegionData)] of the regions it calls, extras)
    twin: tuple | None = None


# ---------------------------------------------------------------------------------------- the key

@functools.lru_cache(maxsize=1)
def _package_digest() -> str:
    """A digest of fxflash's own source files: another version of fxflash keys other graphs."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                h.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def _tensor_layout(t: torch.Tensor) -> tuple:
    return (type(t).__name__, tuple(t.shape), t.stride(), t.storage_offset(), str(t.dtype), str(t.device),
            t.requires_grad)


def _device_names(devices: set) -> list:
    return [(str(d), torch.cuda.get_device_name(d), torch.cuda.get_device_capability(d))
            for d in sorted(devices, key=str) if d.type == "cuda"]


def _modes() -> tuple:
    """The process state that capture or printing reads besides ``config``: the interpreter, grad and
    inference mode, autocast (capture applies it), deterministic algorithms (dQ's kernel), TF32
    (the printed dots' precision)."""
    return (interpreting(), torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.are_deterministic_algorithms_enabled(), torch.backends.cuda.matmul.allow_tf32,
            [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")])


def graph_key(gm: fx.GraphModule, example_inputs, inner: str, mode: str | None) -> str | None:
    """The key of what the backend makes of ``gm`` on inputs like ``example_inputs``, or None where
    it is not remembered: symbolic sizes (``dynamic=True``), submodules, tensor subclasses."""
    parts = [str(FORMAT), _package_digest(), torch.__version__, sys.version, inner, str(mode), gm.code,
             repr(sorted((k, v) for k, v in dataclasses.asdict(config).items() if k not in _UNKEYED_SETTINGS)),
             repr(_modes()), triton.__version__]
    devices, storages = set(), {}
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            if type(x) not in (torch.Tensor, torch.nn.Parameter):
                return None
            # inputs that share memory: each with the first input of its storage
            parts.append(repr((_tensor_layout(x), storages.setdefault(x.untyped_storage()._cdata, len(storages)))))
            devices.add(x.device)
        elif isinstance(x, (bool, int, float)) and not isinstance(x, torch.SymInt):
            parts.append(repr(x))
        else:
            return None
    for node in gm.graph.nodes:
        if node.op == "call_module":
            return None
        if node.op == "get_attr":
            value = _attribute(gm, node.target)
            if not isinstance(value, torch.Tensor) or type(value) not in (torch.Tensor, torch.nn.Parameter):
                return None
            # a constant's values can shape the rewrite (capture reads constant masks and scalars); a
            # parameter's are the model's, not the graph's
            digest = "" if isinstance(value, torch.nn.Parameter) else hashlib.sha256(
                value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()).hexdigest()
            parts.append(repr((node.target, _tensor_layout(value), digest)))
            devices.add(value.device)
    parts.append(repr(_device_names(devices)))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _attribute(gm: torch.nn.Module, path: str):
    value = gm
    for name in path.split("."):
        value = getattr(value, name)
    return value


# ---------------------------------------------------------------------------------- graphs as data

# The functions that may be a graph's targets besides PyTorch's operators (torch.ops.*): an ATen
# graph's getitem of a multi-result op, and integer arithmetic on sizes. Any other is not stored.
_OPERATORS = ("getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "neg", "pow", "eq", "ne", "lt", "le",
              "gt", "ge")
_TARGET_FUNCTIONS = {*((m, f) for m in ("operator", "_operator") for f in _OPERATORS),
                     ("math", "ceil"), ("math", "floor"), ("math", "sqrt")}


def _target_name(target) -> tuple:
    if isinstance(target, str):
        return ("attr", target)
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return ("ops", *str(target).split("."))
    module, name = getattr(target, "__module__", None), getattr(target, "__name__", None)
    if (module, name) in _TARGET_FUNCTIONS and getattr(importlib.import_module(module), name) is target:
        return ("function", module, name)
    raise Unrememberable(f"graph target {target!r}")


def _target(name: tuple):
    kind, *rest = name
    if kind == "attr":
        return rest[0]
    if kind == "ops":
        value = torch.ops
        for part in rest:
            value = getattr(value, part)
        return value
    if kind == "function" and tuple(rest) in _TARGET_FUNCTIONS:
        return getattr(importlib.import_module(rest[0]), rest[1])
    raise Unrememberable(f"graph target {name!r}")


def _data_arg(arg):
    if isinstance(arg, fx.Node):
        return NodeRef(arg.name)
    if isinstance(arg, (list, tuple)):
        items = [_data_arg(a) for a in arg]
        return items if isinstance(arg, list) else tuple(items)
    if isinstance(arg, dict):
        return {k: _data_arg(v) for k, v in arg.items()}
    if isinstance(arg, slice):
        return slice(_data_arg(arg.start), _data_arg(arg.stop), _data_arg(arg.step))
    if arg is None or isinstance(arg, (bool, int, float, str, complex, torch.dtype, torch.device, torch.layout,
                                       torch.memory_format)):
        return arg
    raise Unrememberable(f"graph argument {arg!r}")


def graph_data(gm: fx.GraphModule) -> GraphData:
    nodes, constants = [], {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = _attribute(gm, node.target)
            if not isinstance(value, torch.Tensor):
                raise Unrememberable(f"graph attribute {node.target} ({type(value).__name__})")
            constants[node.target] = value.detach()
        nodes.append((node.op, node.name, _target_name(node.target), _data_arg(node.args), _data_arg(node.kwargs)))
    return GraphData(nodes, constants)


REGION_OP = ("ops", "fxflash", "region", "default")


def with_region_keys(data: GraphData, keys: dict) -> GraphData:
    """``data`` with each region call's key replaced as ``keys`` maps it."""
    nodes = [(op, name, target, (keys[args[0]], *args[1:]) if target == REGION_OP else args, kwargs)
             for op, name, target, args, kwargs in data.nodes]
    return GraphData(nodes, data.constants)


def graph_of(data: GraphData) -> fx.GraphModule:
    graph, env = fx.Graph(), {}

    def arg(a):
        if isinstance(a, NodeRef):
            return env[a.name]
        if isinstance(a, list):
            return [arg(x) for x in a]
        if isinstance(a, tuple):
            return tuple(arg(x) for x in a)
        if isinstance(a, dict):
            return {k: arg(v) for k, v in a.items()}
        if isinstance(a, slice):
            return slice(arg(a.start), arg(a.stop), arg(a.step))
        return a

    root = torch.nn.Module()
    for path, value in data.constants.items():
        owner = root
        *outer, last = path.split(".")
        for name in outer:
            if not hasattr(owner, name):
                owner.add_module(name, torch.nn.Module())
            owner = getattr(owner, name)
        owner.register_buffer(last, value)
    for op, name, target, args, kwargs in data.nodes:
        if op == "output":
            graph.output(arg(args[0]))
            continue
        node = graph.create_node(op, _target(target), arg(args), arg(kwargs), name=name)
        env[name] = node
    return fx.GraphModule(root, graph)


# --------------------------------------------------------------------------------------- regions

def _plan_data(plan):
    """A plan (a dataclass: KernelPlan, and the plans it holds: ``gluon``, ``training``) with the FX
    nodes it was printed from replaced by their names; the launches read only how many there are
    (``sym_nodes``)."""
    if not dataclasses.is_dataclass(plan) or isinstance(plan, type):
        return plan
    changes = {}
    for field in dataclasses.fields(plan):
        value = getattr(plan, field.name)
        if isinstance(value, (list, tuple)) and any(isinstance(v, fx.Node) for v in value):
            changes[field.name] = type(value)(v.name if isinstance(v, fx.Node) else v for v in value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            inner = _plan_data(value)
            if inner is not value:
                changes[field.name] = inner
    return dataclasses.replace(plan, **changes) if changes else plan


def region_data(entry) -> RegionData:
    from .op import registered

    def sub(s):
        return None if s is None else (graph_data(s.module), s.extras, s.inputs)

    twin = entry.plan.twin
    if twin is not None:
        twin = (graph_data(twin.module), [(n.args[0], region_data(registered(n.args[0])))
                                          for n in _region_calls(twin.module)], twin.extras)
    return RegionData(_plan_data(dataclasses.replace(entry.plan, twin=None)), graph_data(entry.reference),
                      entry.out_ranks, entry.extra_is_float, sub(entry.epilogue),
                      {j: sub(s) for j, s in entry.computed.items()}, entry.views, twin)


def region_of(data: RegionData):
    from .cache import load_kernel
    from .op import RegisteredRegion, Subgraph
    from .twin import Twin

    def sub(s):
        return None if s is None else Subgraph(graph_of(s[0]), s[1], s[2])

    plan = data.plan
    if data.twin is not None:   # its regions registered anew, as the graph's own (recall)
        graph, regions = _registered_graph(*data.twin[:2])
        plan = dataclasses.replace(plan, twin=Twin(graph, data.twin[2], None))
    return RegisteredRegion(plan, load_kernel(plan.source, plan.name), graph_of(data.reference),
                            data.out_ranks, data.extra_is_float, sub(data.epilogue),
                            {j: sub(s) for j, s in data.computed.items()}, data.views)


def _registered_graph(graph: GraphData, regions: list) -> tuple:
    """The graph rebuilt with its regions (``[(stored key, RegionData)]``) registered anew: each
    under its stored key in a process that has not used it, so that Inductor's caches recognise the
    graph; under another where it has."""
    from .op import owned, register

    entries = [region_of(data) for _, data in regions]
    renamed = {old: register(entry, None) for (old, _), entry in zip(regions, entries)}
    rebuilt = graph_of(with_region_keys(graph, renamed))
    owned[rebuilt] = list(entries)
    return rebuilt, entries


# ------------------------------------------------------------------------------------------ files

class _Pickler(pickle.Pickler):
    """Pickles an entry with its tensors (graphs' constants) left out, by their place in ``tensors``,
    to be stored by ``torch.save``."""

    def __init__(self, file, tensors: list):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor):
            self.tensors.append(obj.detach())
            return len(self.tensors) - 1
        return None


class _Unpickler(pickle.Unpickler):
    """Resolves fxflash's own data classes and enums and PyTorch's dtypes, devices, layouts and
    memory formats; any other global is refused (a file naming one is a miss). Tensors are the
    ones ``torch.load`` read, by their place (``_Pickler``)."""

    def __init__(self, file, tensors: list = ()):
        super().__init__(file)
        self.tensors = tensors

    def persistent_load(self, pid):
        return self.tensors[pid]

    _BUILTINS = {"set", "frozenset", "slice", "complex"}
    _TORCH_FUNCTIONS = {("torch.serialization", "_get_layout")}  # how torch.layout pickles

    def find_class(self, module, name):
        if module == "fxflash" or module.startswith("fxflash."):
            value = super().find_class(module, name)
            if isinstance(value, type) and (dataclasses.is_dataclass(value) or issubclass(value, enum.Enum)):
                return value
        elif module == "builtins" and name in self._BUILTINS:
            return super().find_class(module, name)
        elif (module, name) in self._TORCH_FUNCTIONS:
            return super().find_class(module, name)
        elif module == "torch" or module.startswith("torch."):
            value = super().find_class(module, name)
            if value is torch.device or isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        raise pickle.UnpicklingError(f"global {module}.{name} is not read from fxflash's graph cache")


def _path(key: str) -> str | None:
    from .cache import cache_dir

    root = cache_dir()
    return None if root is None else os.path.join(root, SUBDIR, key[:2], key)


def store(key: str, remembered: Remembered) -> None:
    """Write ``remembered`` under ``key``; where it cannot be (an unstorable graph, a full disk), the
    graph is simply compiled again by the next process."""
    path = _path(key)
    if path is None:
        return
    try:
        body, tensors = io.BytesIO(), []
        _Pickler(body, tensors).dump(remembered)
        body = body.getvalue()
        buffer = io.BytesIO()
        torch.save({"body": body, "digest": hashlib.sha256(body).hexdigest(),
                    "tensors": [(t.cpu(), str(t.device)) for t in tensors]}, buffer)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(buffer.getvalue())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        _evict(os.path.dirname(os.path.dirname(path)))
    except (Unrememberable, OSError, pickle.PicklingError, TypeError, AttributeError) as exc:
        log.debug("fxflash: graph %s not remembered: %s", key[:12], exc)


MAX_BYTES = 1 << 30  # the remembered graphs kept, at most; the least recently used go first


def _evict(root: str) -> None:
    """Remove the least recently used entries (``load`` marks an entry used) beyond MAX_BYTES."""
    entries = []
    for folder in os.listdir(root):
        for name in os.listdir(os.path.join(root, folder)):
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(root, folder, name))
                entries.append((st.st_mtime, st.st_size, os.path.join(root, folder, name)))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= MAX_BYTES:
            break
        with contextlib.suppress(OSError):
            os.remove(path)
        total -= size


def load(key: str) -> Remembered | None:
    """The entry stored under ``key``, or None (none, or one this process cannot read)."""
    path = _path(key)
    if path is None or not os.path.exists(path):
        return None
    from torch._guards import tracing
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    try:
        # real tensors: Dynamo calls the backend inside its tracing context, where torch.load gives
        # meta tensors, and with its fake mode active
        with open(path, "rb") as f, tracing(None), unset_fake_temporarily():
            stored = torch.load(f, map_location="cpu", weights_only=True)
        body = stored["body"]
        if hashlib.sha256(body).hexdigest() != stored["digest"]:
            raise pickle.UnpicklingError("its digest does not match")
        with unset_fake_temporarily():
            tensors = [t.to(device) for t, device in stored["tensors"]]
        remembered = _Unpickler(io.BytesIO(body), tensors).load()
        if not isinstance(remembered, Remembered):
            raise pickle.UnpicklingError(f"it holds a {type(remembered).__name__}")
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the last to be evicted
        return remembered
    except Exception as exc:  # noqa: BLE001 - an unreadable entry is a miss, never an error
        log.debug("fxflash: remembered graph %s not read: %s", key[:12], exc)
        return None


def specs(captured) -> tuple[str, str]:
    """The captured call's argument and result specs as text (raises Unrememberable where a
    container has no serialized name)."""
    try:
        return pytree.treespec_dumps(captured.in_spec), pytree.treespec_dumps(captured.out_spec)
    except Exception as exc:  # noqa: BLE001
        raise Unrememberable(f"the call's containers: {exc}") from None


def report_data(report):
    """``report`` as stored: its chains as text (report.RememberedChain), no graphs."""
    from ..report import RememberedChain

    regions = [dataclasses.replace(r, chain=RememberedChain(r.chain.describe(), r.chain.demoted))
               for r in report.regions]
    return dataclasses.replace(report, regions=regions, graph=None, analysis=None, rewritten=None, parts=[])


def _region_calls(gm: fx.GraphModule) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.fxflash.region.default]


def remember(key: str, captured, rewritten: fx.GraphModule | None, report) -> None:
    """Store what a graph became: the captured call (capture.CapturedGraph), the rewritten graph
    (None where nothing fused) and its report. A graph that cannot be stored is compiled afresh by
    the next process."""
    from .op import registered

    try:
        regions = [(n.args[0], region_data(registered(n.args[0]))) for n in _region_calls(rewritten)] \
            if rewritten is not None else []
        in_spec, out_spec = specs(captured)
        store(key, Remembered(graph_data(rewritten) if rewritten is not None else None, regions, in_spec,
                              list(captured.tensor_positions), out_spec, report_data(report)))
    except Exception as exc:  # noqa: BLE001 - storing is an optimization of the next process
        log.debug("fxflash: graph %s not remembered: %s", key[:12], exc)


def recall(key: str) -> tuple | None:
    """(graph, regions, captured, report) as stored under ``key``, the regions registered again for
    the rebuilt graph; (None, [], None, report) for a graph with nothing fused; None where nothing is
    stored or the entry cannot be rebuilt."""
    from ..capture.trace import CapturedGraph

    stored = load(key)
    if stored is None:
        return None
    if stored.graph is None:
        return None, [], None, stored.report
    try:
        graph, regions = _registered_graph(stored.graph, stored.regions)
        captured = CapturedGraph(None, pytree.treespec_loads(stored.in_spec), stored.tensor_positions,
                                 pytree.treespec_loads(stored.out_spec), "remembered")
    except Exception as exc:  # noqa: BLE001 - an entry this process cannot rebuild is compiled afresh
        log.debug("fxflash: remembered graph %s not rebuilt: %s", key[:12], exc)
        return None
    return graph, regions, captured, stored.report


__all__ = ["GraphData", "Remembered", "Unrememberable", "graph_data", "graph_key", "graph_of", "load", "recall",
           "region_data", "region_of", "remember", "report_data", "store", "with_region_keys"]
