"""The three transformations of a fused region as rewrites of its sketches, for explain().

Each region's op sketches ``[(P…), (R…)]`` are shown before and after each step:

* **dimension demotion** — the producer's parallel axis ``N`` becomes a reduction axis of
  every op between the contractions: ``QKᵀ: [(B, M, N), (D)] → [(B, M), (N, D)]``. The fused
  region has the sketch ``[(P_consumer), (N, D)]``.
* **algebraic rewriting** — reductions over ``N`` that depend on each other need one pass over
  ``N`` each (``amax``; then ``Σ exp(x − amax)``; then ``÷`` and ``P·V``). Through the
  homomorphism table they become one online pass: every op in the loop is annotated
  ``pass 1``; row values after the loop ``after the loop``.
* **dimension elimination** — ``D``, ``Dv`` (and the head dims of further score contractions)
  fit one tile: their tile loops have one step and vanish. The rest is tiled:
  ``[(B, M/BM), (N/BN)]``.

The rule lines of :attr:`Region.steps` are grouped under these by the transformation each
``Step`` names; lines that change no sketch (streams, epilogue, block sparsity) form the
``tile program`` group.
"""
from __future__ import annotations

import dataclasses

from ..analysis import GraphAnalysis, OpKind
from ..analysis.sketch import Sketch, dim_name
from .region import ALGEBRAIC, DEMOTION, ELIMINATION, TILE_PROGRAM, Region

ORDER = (DEMOTION, ALGEBRAIC, ELIMINATION, TILE_PROGRAM)


@dataclasses.dataclass
class Transformation:
    """One step: the rule lines applied, the region's sketch after it (``summary``), and the
    sketches of the ops it changed, before and after (node name → printed sketch)."""

    name: str
    summary: str
    rules: list
    before: dict
    after: dict

    def __str__(self) -> str:
        lines = [f"{self.name}: {self.summary}" if self.summary else self.name]
        lines += [f"    {rule}" for rule in self.rules]
        width = max((len(n) for n in self.before), default=0)
        lines += [f"    {n:<{width}}  {self.before[n]}  →  {self.after[n]}" for n in self.before]
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class RegionDims:
    """The dimension ids of one region: the row axis ``M``, the demoted axis ``N`` and the
    axes eliminated by tiling. In self-attention ``M`` and ``N`` can share one id (both come
    from the same sequence axis); a sketch then lists it twice, ``N`` last."""

    M: tuple
    N: tuple
    eliminated: tuple  # D, Dv and further head dims: one tile each

    def has_key_axis(self, s: Sketch) -> bool:
        """Whether ``N`` is a parallel dimension of ``s`` (a value in the score frame)."""
        return s.parallel.count(self.N) > (1 if self.M == self.N and self.M in s.parallel else 0)

    def demote(self, s: Sketch) -> tuple:
        """``[(P, N), (R)] → [(P), (N, R)]``; other sketches unchanged."""
        if not self.has_key_axis(s):
            return s.parallel, s.reduced
        last = len(s.parallel) - 1 - s.parallel[::-1].index(self.N)
        return s.parallel[:last] + s.parallel[last + 1:], (self.N, *s.reduced)

    def iterates(self, s: Sketch | None) -> bool:
        return s is not None and (self.has_key_axis(s) or self.N in s.reduced)


def region_dims(analysis: GraphAnalysis, region: Region) -> RegionDims:
    axes, dim_id = analysis.dims.axes, analysis.dims.dim_id
    first, second = region.chain.first, region.chain.second
    contractions = [n for n in region.nodes if analysis.kinds[n] is OpKind.CONTRACTION]
    eliminated = [dim_id(analysis.reduced[c][0]) for c in contractions if c is not second]
    eliminated.append(dim_id(axes[second][-1]))
    return RegionDims(M=dim_id(axes[first][-2]), N=region.chain.demoted, eliminated=tuple(dict.fromkeys(eliminated)))


def _fmt(parallel, reduced, parallel_names=None, reduced_names=None) -> str:
    def names(ds, table):
        return ", ".join((table or {}).get(d, dim_name(d)) for d in ds)

    return f"[({names(parallel, parallel_names)}), ({names(reduced, reduced_names)})]"


def _passes(analysis: GraphAnalysis, region: Region, dims: RegionDims) -> dict:
    """The pass over ``N`` that computes each region node in the unfused program, where an op
    iterating over ``N`` can read a row value only after the pass that finished it."""
    passes: dict = {}
    finished: set = set()  # row values known only after a pass over N
    for node in region.nodes:
        s = analysis.sketch(node)
        iterates = dims.iterates(s)
        passes[node] = max([1] + [passes[a] + (a in finished and iterates)
                                  for a in node.all_input_nodes if a in passes])
        if s is not None and not dims.has_key_axis(s) and (
                dims.N in s.reduced or any(a in finished for a in node.all_input_nodes)):
            finished.add(node)
    return passes


def _demotion(analysis, region, dims) -> Transformation:
    before, after = {}, {}
    for node in region.nodes:
        s = analysis.sketch(node)
        if s is not None and dims.has_key_axis(s):
            before[node.name] = str(s)
            after[node.name] = _fmt(*dims.demote(s))
    consumer = analysis.sketch(region.chain.second)
    producer = analysis.sketch(region.chain.first)
    summary = f"region {_fmt(consumer.parallel, (dims.N, *producer.reduced))}"
    return Transformation(DEMOTION, summary, [], before, after)


def _algebraic(analysis, region, dims) -> Transformation:
    passes = _passes(analysis, region, dims)
    epilogue = set(region.epilogue)
    before, after = {}, {}
    for node in region.nodes:
        s = analysis.sketch(node)
        if s is None or not (dims.N in s.reduced or node in epilogue or (dims.has_key_axis(s) and passes[node] > 1)):
            continue  # ops already in the first pass and not reductions are left out
        before[node.name] = f"{_fmt(*dims.demote(s))} pass {passes[node]}"
        form = region.forms.get(node)
        deferred = "".join(f", {f.op} by {f.row.name} after the loop" for f in (form.factors if form else ()))
        after[node.name] = "after the loop" if node in epilogue else f"pass 1 (online){deferred}"
    loops = max((passes[n] for n in region.nodes if n.name in before and n not in epilogue), default=1)
    return Transformation(ALGEBRAIC, f"passes over {dim_name(dims.N)}: {loops} → 1", [], before, after)


def _elimination(analysis, region, dims) -> Transformation:
    rows, keys = {dims.M: f"{dim_name(dims.M)}/BM"}, {dims.N: f"{dim_name(dims.N)}/BN"}
    gone = set(dims.eliminated)
    before, after = {}, {}
    for node in region.nodes:
        s = analysis.sketch(node)
        if s is None:
            continue
        par, red = dims.demote(s)
        if gone & set(par + red):
            before[node.name] = _fmt(par, red)
            after[node.name] = _fmt([d for d in par if d not in gone], [d for d in red if d not in gone], rows, keys)
    consumer = analysis.sketch(region.chain.second)
    grid = [d for d in consumer.parallel if d not in gone]
    sizes = ", ".join(dim_name(d) for d in dims.eliminated)
    summary = f"region {_fmt(grid, (dims.N,), rows, keys)}; {sizes} fit one tile"
    return Transformation(ELIMINATION, summary, [], before, after)


BUILDERS = {DEMOTION: _demotion, ALGEBRAIC: _algebraic, ELIMINATION: _elimination}


def transformations(analysis: GraphAnalysis, region: Region) -> list[Transformation]:
    """The region's transformations in order, each with its rule lines and sketch changes."""
    dims = region_dims(analysis, region)
    steps = {name: (BUILDERS[name](analysis, region, dims) if name in BUILDERS
                    else Transformation(name, "", [], {}, {})) for name in ORDER}
    for step in region.steps:
        steps[step.group].rules.append(step.text)
    return [t for t in steps.values() if t.rules or t.before]


__all__ = ["RegionDims", "Transformation", "region_dims", "transformations"]
