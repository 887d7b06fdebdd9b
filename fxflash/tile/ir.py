"""The tile program: what one fused kernel does, as typed tile operations.

One program runs per row tile of the output frame (``[*batch, M]`` split into ``BM`` rows). It
loads its rows' operand tiles, then visits the key tiles (``BN`` keys each) in one loop, and
finishes the row values and the output tile after it:

    prologue   ops run once per row tile, before the loop (the Q tile)
    skips      tile-skip predicates: a key tile on which one holds is not visited
    body       ops run per key tile: loads, contractions, elementwise maps, online row
               reductions, accumulations into the output
    epilogue   ops run after the loop: row factors applied to the accumulators, row values,
               the output ops (transposes, a gate)
    stores     the values written to memory

Values are named (the FX node a value comes from, or a name of the program's own: ``acc0``).
Everything here is plain, frozen data: a program prints itself (``str``) the way the papers
write a tile program, and compares equal to another of the same structure.
"""
from __future__ import annotations

import dataclasses

Arg = "str | float | int | bool | None"  # a value's name, or a literal


@dataclasses.dataclass(frozen=True)
class Load:
    """``name = tensor[index]`` for one tile. ``tile``: "rows" (``[BM, cols]``, once per row
    tile), "keys" (``[BN, cols]``, per key tile), "scores" (``[BM, BN]``, broadcast from the
    tensor's own shape), "row values" (``[BM]``), "output" (``[BM, Dv]``, read by an output op) or
    "program" (one value per program). ``transposed``: the tensor holds the tile's transpose.
    ``scale``: (("mul" | "div", constant), …) applied to the loaded tile. ``operand``: a
    contraction's operand (Q, K or V of the scores or of ``P·V``: ``q``, ``k``, ``v``; a further
    score contraction's ``q1``, ``k1``, …), read at addresses the program computes once. A value
    from outside the region that the kernel computes from its own inputs (``tile.outside``) is not
    loaded: the program holds its ops, as Maps over the loads of those inputs."""

    name: str
    tensor: str
    tile: str
    cols: int | None = None
    transposed: bool = False
    scale: tuple = ()
    operand: bool = False

    def __str__(self) -> str:
        cols = f", :{self.cols}" if self.cols is not None else ""
        where = {"rows": f"[rows{cols}]", "keys": f"[keys{cols}]", "scores": "[rows, keys]",
                 "row values": "[rows]", "output": "[rows, :Dv]", "program": ""}[self.tile]
        text = f"{self.name} = load {self.tensor}{where}" + ("ᵀ" if self.transposed else "")
        return text + "".join(f" {'×' if op == 'mul' else '÷'} {c:g}" for op, c in self.scale)


@dataclasses.dataclass(frozen=True)
class Index:
    """``name`` is computed from the tile's indices (an iota, a comparison of iotas, a constant
    fill): never loaded."""

    name: str
    op: str
    args: tuple = ()

    def __str__(self) -> str:
        return f"{self.name} = index {self.op}({', '.join(map(_arg, self.args))})"


@dataclasses.dataclass(frozen=True)
class Dot:
    """``name = a · bᵀ`` on tiles (``[BM, d] · [BN, d]ᵀ``): a contraction."""

    name: str
    a: str
    b: str

    def __str__(self) -> str:
        return f"{self.name} = dot({self.a}, {self.b}ᵀ)"


@dataclasses.dataclass(frozen=True)
class Map:
    """``name = op(*args)`` elementwise. ``form``: how the value relates to the running row
    values ("plain", "scaled by <max>": computed against the running maximum, "deferred": row
    factors still to apply, "row": a function of finished reductions, "binds": the program's value
    for the region node ``name``, which the region's own ops after it read)."""

    name: str
    op: str
    args: tuple
    form: str = "plain"

    def __str__(self) -> str:
        note = "" if self.form == "plain" else f"    [{self.form}]"
        return f"{self.name} = {self.op}({', '.join(map(_arg, self.args))}){note}"


@dataclasses.dataclass(frozen=True)
class RowReduce:
    """An online reduction over the key axis: ``name`` combines ``source``'s row with ``combine``
    ("max" | "min" | "sum") across key tiles; a sum of values scaled by a running maximum is
    rescaled by ``E(m_old − m_new)`` whenever that maximum grows (``rescaled_by``)."""

    name: str
    combine: str
    source: str
    rescaled_by: str | None = None

    def __str__(self) -> str:
        rescale = f", rescaled when {self.rescaled_by} grows" if self.rescaled_by else ""
        return f"{self.name} = online {self.combine}({self.source}){rescale}"


@dataclasses.dataclass(frozen=True)
class Accumulate:
    """``acc += sign · p · v`` (``[BM, BN] · [BN, Dv]``), rescaled like ``p``'s running maximum;
    ``transposed``: ``acc += pᵀ · v`` (a backward's ``dV += Pᵀ·dO``, per key tile); ``fresh``:
    ``acc = p · v``, this tile's own product (a partial sum a Store adds to memory); ``unbounded``:
    ``p`` is not bounded by 1 (a ReLU's P over a score ``finfo.max`` reaches), so the sum can
    overflow in the kernel's order where eager's stays finite: a tile whose sum is not finite is
    summed again with ``p·2⁻⁶⁴`` (exact) and scaled back (codegen/backward.py, ``REDO``)."""

    acc: str
    p: str
    v: str
    sign: int = 1
    rescaled_by: str | None = None
    transposed: bool = False
    fresh: bool = False
    unbounded: bool = False

    def __str__(self) -> str:
        rescale = f", rescaled when {self.rescaled_by} grows" if self.rescaled_by else ""
        redo = ", summed again scaled where it overflows" if self.unbounded else ""
        p = f"{self.p}ᵀ" if self.transposed else self.p
        op = "=" if self.fresh else "+=" if self.sign > 0 else "-="
        return f"{self.acc} {op} dot({p}, {self.v}){rescale}{redo}"


@dataclasses.dataclass(frozen=True)
class SkipIf:
    """A key tile (``unit``: the tile the loop visits) is not visited when ``condition`` is
    ``masked_when`` on all of it (its scores are -inf there: every accumulator would be scaled by
    ``exp(-inf) = 0``, and in a backward every P and dS there is 0)."""

    condition: str
    masked_when: bool
    unit: str = "key"

    def __str__(self) -> str:
        return f"skip the {self.unit} tile if {self.condition} is {self.masked_when} on all of it"


@dataclasses.dataclass(frozen=True)
class Finish:
    """After the loop: ``acc`` with the row factors of its deferred value applied in order:
    (("mul" | "div", row), …) or ("shift", row) for ``E(m − row)``. ``name == acc``: an online
    reduction's running value, final (printed ``amax final``)."""

    name: str
    acc: str
    factors: tuple

    def __str__(self) -> str:
        text = self.acc
        for op, row in self.factors:
            text = {"mul": f"{text} · {row}", "div": f"{text} / {row}", "shift": f"{text} · E(m − {row})"}[op]
        if self.name == self.acc:
            return f"{self.name} final" + (f" = {text}" if self.factors else "")
        return f"{self.name} = {text}"


@dataclasses.dataclass(frozen=True)
class Store:
    """``tensor[index] = value``: ``tile`` "output" (``[BM, Dv]``), "row values" (``[BM]``), or a
    backward's gradient tiles "rows" (``[BM, D]``, dQ), "keys" (``[BN, D]``, dK and dV) and
    "scores" (``[BM, BN]``, a bias's, per tile in the loop). ``add``: added atomically to what
    the tensor holds (the partial sums of several programs: dQ from each key tile's program)."""

    value: str
    tensor: str
    tile: str = "output"
    add: bool = False

    def __str__(self) -> str:
        where = {"output": "[rows, :Dv]", "row values": "[rows]", "rows": "[rows, :]", "keys": "[keys, :]",
                 "scores": "[rows, keys]"}[self.tile]
        return f"{'atomically add' if self.add else 'store'} {self.value} → {self.tensor}{where}"


@dataclasses.dataclass(frozen=True)
class TileProgram:
    """One fused kernel as tile operations (module docstring). ``frame``: the score frame's
    sizes ``[*batch, M, N]``; ``streams``: score maps computed over the same keys (differential
    attention), each with its own Q tile and running values. ``per``: the tile each program
    owns, "row" (the forward) or "key" (a backward's dK and dV); ``loop``: the tiles its loop
    visits, "key", "row" or "" (no loop: a backward's row sums). ``group``: a key program of
    grouped-query attention, one per key tile of a K/V head, whose loop visits the row tiles of
    every query head that reads that K/V head (dK and dV summed over the group in the program)."""

    name: str
    frame: tuple
    prologue: tuple
    skips: tuple
    body: tuple
    epilogue: tuple
    stores: tuple
    streams: int = 1
    per: str = "row"
    loop: str = "key"
    group: bool = False

    def ops(self) -> tuple:
        """Every operation, in program order."""
        return (*self.prologue, *self.skips, *self.body, *self.epilogue, *self.stores)

    def __str__(self) -> str:
        *batch, m, n = self.frame
        tiles = {"row": f"⌈{m}/BM⌉", "key": f"⌈{n}/BN⌉"}[self.per]
        grid = " × ".join([*(str(b) for b in batch), tiles] if not self.group else ["K/V heads", tiles])
        owner = f"{self.per} tile" + (" of a K/V head" if self.group else "")
        lines = [f"tile program {self.name}: one program per {owner}, grid [{grid}]"
                 + (f", {self.streams} streams" if self.streams > 1 else "")]
        lines += [f"  {op}" for op in self.prologue]
        if self.loop:
            count = {"key": f"{n} keys", "row": f"{m} rows"}[self.loop]
            lines.append(f"  for each {self.loop} tile of {count}"
                         + (" of each query head of the group:" if self.group else ":"))
            lines += [f"    {op}" for op in (*self.skips, *self.body)]
            lines.append("  after the loop:")
            lines += [f"    {op}" for op in self.epilogue]
        else:
            lines += [f"  {op}" for op in self.epilogue]
        lines += [f"  {op}" for op in self.stores]
        return "\n".join(lines)


def _arg(a) -> str:
    if isinstance(a, float):
        return f"{a:g}"
    return str(a)
