"""The fusion rules as data.

Three transformations (Flashlight, You et al. 2025):

* **dimension demotion** — the producer contraction's parallel axis ``N`` becomes the region's
  reduction axis: one program owns a tile of rows and loops over ``N``.
* **algebraic transformation** — a value that depends on the *final* result of a reduction
  ``m = max_n x`` through a homomorphism ``E`` from (+) to (×), ``E(x - m)``, is computed
  against the running ``m_j`` and rescaled by ``E(m_j - m_{j+1})`` when ``m`` grows:
  ``E(x - m) = E(x - m_j) · E(m_j - m)``. Sums and contractions over ``N`` of such values are
  linear, so they carry the same rescale. Row factors that depend on a final reduction
  (``/ Σ e``) are deferred past the contraction by distributivity: ``(e / s)·V = (e·V) / s``.
* **tiling-aware dimension elimination** — the contracted head dim ``D`` of the producer and the
  output head dim ``Dv`` of the consumer fit in one tile (≤ ``MAX_HEAD_DIM``), so their tile
  loops collapse and the two contractions chain inside one loop over ``N``.
"""
from __future__ import annotations

import dataclasses

import torch

aten = torch.ops.aten

MAX_HEAD_DIM = 256


LOG2E = 1.4426950408889634
LN2 = 1 / LOG2E  # ln 2 (0.6931471805599453)


@dataclasses.dataclass(frozen=True)
class Homomorphism:
    """``E(a + b) = E(a) · E(b)``; ``E(x - m)`` is printed with ``apply``, the rescale of
    everything accumulated against an old running maximum with ``rescale``.

    ``apply_fma``, when given, is an equal form for 16-bit inputs: ``exp(x - m) = 2^(x·log₂e −
    m·log₂e)``, where ``m·log₂e`` is a per-row value and ``x·log₂e − (…)`` one fused multiply-add
    per score instead of a subtraction and the multiplication by log₂e inside ``tl.exp``. It
    rounds ``x·log₂e`` instead of ``x − m`` (relative error ~2⁻²⁴·|x| in the exponent), far
    below a 16-bit input's own error; fp32 inputs keep ``apply``. Its ``{k}`` is ``log₂e``, or
    ``c·log₂e`` when ``x = c·x'`` (POSITIVE_SCALE) and ``x'`` is printed instead: the score
    scale folds into the same multiply-add. Scores beyond ±FLT_MAX/log₂e (±2.4·10³⁸, where eager's
    ``x − m`` is still finite) overflow in this form.

    ``apply_log2`` and ``rescale_log2`` go with ``apply_fma`` when the running maximum is kept
    in exp2 units, ``m₂ = max(x)·log₂e`` (``max(x')·c·log₂e`` under a folded scale, one multiply
    per row tile as before): then ``exp(x − m) = 2^(x·log₂e − m₂)`` and the rescale ``exp(m_old −
    m_new) = 2^(m₂_old − m₂_new)`` take no per-row multiply by log₂e. Any row offset gives the
    same ``Σ E(x − m)·V / Σ E(x − m)``; the epilogue turns ``m₂`` back into ``m = m₂·ln 2`` once for
    whatever reads the maximum itself (a logsumexp, a deferred shift ``E(m − r)``)."""

    name: str
    apply: str      # format with x, m
    rescale: str    # format with old, new
    apply_fma: str | None = None
    apply_log2: str | None = None    # format with x, k, m (m in exp2 units)
    rescale_log2: str | None = None  # format with old, new (both in exp2 units)


HOMOMORPHISMS = {
    aten.exp: Homomorphism("exp", "tl.exp({x} - {m})", "tl.exp({old} - {new})",
                           f"tl.exp2({{x}} * {{k}} - {{m}} * {LOG2E!r})",
                           "tl.exp2({x} * {k} - {m})", "tl.exp2({old} - {new})"),
    aten.exp2: Homomorphism("exp2", "tl.exp2({x} - {m})", "tl.exp2({old} - {new})"),
}

# Ops through which a value stays a positive constant multiple ``c·x`` of a cheaper value ``x``
# (codegen's Value.scaled), and how: "times" (``x · c`` or ``c · x``, c a positive literal),
# "over" (``x / c``), "same" (a float cast: the kernel holds every float in fp32), "masked"
# (``where(m, -inf, c·x) = c·where(m, -inf, x)``), "plus"/"minus" (a bias whose factor ``f`` is
# constant along the keys, Value.row_factor, takes ``1/c`` per row: ``c·(x ± (f/c)·b)``). Then
# ``max(c·x) = c·max(x)`` (rounding is monotone: the same value for one multiply, within an ulp
# for a product of constants) and ``exp(c·x − m) = 2^(x·(c·log₂e) − m·log₂e)``: the score scale
# costs nothing per score.
POSITIVE_SCALE = {
    aten.mul: "times",
    aten.div: "over",
    aten._to_copy: "same",
    aten.where: "masked",
    aten.add: "plus",    # c·x + f·b = c·(x + (f/c)·b), f constant along the keys (ALiBi's slope)
    aten.sub: "minus",   # c·x − f·b = c·(x − (f/c)·b)
}

# Reductions over the demoted axis that can be computed online: packet → (combine, identity).
ONLINE_REDUCTIONS = {
    aten.amax: ("max", "float('-inf')"),
    aten.amin: ("min", "float('inf')"),
    aten.sum: ("sum", "0.0"),
}

# Ops that commute with multiplying one argument by a positive row factor ``c``:
# ``f(c·x, y) = c·f(x, y)`` for the listed argument positions when the other arguments do not
# depend on an unfinished reduction. Values rescaled online may pass through them.
LINEAR_IN = {
    aten.mul: (0, 1),
    aten.div: (0,),
    aten.neg: (0,),
    aten._to_copy: (0,),
    aten.clone: (0,),
    aten.alias: (0,),
}

# ``where(c, x, 0)`` / ``where(c, 0, x)`` keep linearity in x.
ZERO_PRESERVING_WHERE = aten.where

# Row factors that may be deferred past the consumer contraction: ``f(x, r)`` with ``r`` a row
# value known only after the loop; ``(f(x, r))·V = f(x·V, r)``.
DEFERRABLE = {
    aten.mul: (0, 1),   # x · r  or  r · x
    aten.div: (0,),     # x / r
}

# Linear ops on two values rescaled by the same running maximum.
LINEAR_COMBINE = {aten.add, aten.sub}
