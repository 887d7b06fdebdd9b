"""Process-wide settings of fxflash.

Every field can be changed at run time (``fxflash.config.autotune = False``) or set from the
environment before import (``FXFLASH_AUTOTUNE=0``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os

log = logging.getLogger("fxflash")


@dataclasses.dataclass
class Config:
    """Settings read by every stage.

    fuse:            False turns fusion off: graphs are captured and analysed but run as traced.
    kernel_cache_dir: where the tuning cache and remembered graphs are stored (user-only
                     permissions).
    remember_graphs: store what the backend makes of each graph (the rewritten graph, its
                     regions' kernels, the report) in ``<kernel_cache_dir>/graphs``, and load it in a
                     later process that compiles the same graph on inputs of the same layouts,
                     instead of capturing, analysing and generating again (runtime/graph_cache.py);
                     ``FXFLASH_REMEMBER_GRAPHS=0`` compiles every graph afresh.
    autotune:        on GPUs, time each kernel's candidate tile configurations at its first
                     launch for a size bucket and remember the fastest in
                     ``<kernel_cache_dir>/tuning.json`` (runtime/tuning.py); ``FXFLASH_AUTOTUNE=0``
                     takes the first candidate untimed.
    precompile:      before the tuner times a kernel's candidates, compile them side by side in
                     worker processes (runtime/precompile.py) rather than in this process, where
                     compilations barely overlap, under the inner Inductor while it compiles the
                     graph (with the region's own ops, which the tuner times as Inductor compiles
                     them); ``FXFLASH_PRECOMPILE=0`` compiles them here, at the first launch.
    time_eager:      on GPUs, the tuner also times the region's own ops (run by PyTorch, or
                     compiled by Inductor where it compiles the rest of the graph) and runs
                     them instead of the kernel where they are faster: a region never runs slower
                     than the code it replaced; ``FXFLASH_TIME_EAGER=0`` times kernels only (for
                     benchmarks of the kernels themselves).
    fused_backward:  a fused region's backward runs its generated kernels where it has them
                     (runtime/backward.py); ``FXFLASH_FUSED_BACKWARD=0`` recomputes the region's
                     own ops with eager autograd instead (for A/B measurements).
    forward_statistics: where the fused backward will run, the forward stores the row statistics
                     it reads (``KernelPlan.training``), and in 16 bits O in fp32 for its Δ;
                     ``FXFLASH_FORWARD_STATISTICS=0`` runs the inference forward and leaves them
                     to the backward's own kernels (A/B).
    fp32_o:          in fp16 and bf16, the training forward stores O in fp32 for the backward's
                     Δ = rowsum(dO ⊙ O), held until the backward (4 bytes per output element);
                     ``FXFLASH_FP32_O=0`` stores none, and the backward sums Δ over the keys in a
                     pass of its own (``exact_delta``): the memory of the 16-bit output alone,
                     the training step 18–23 % slower on an H100 (benchmarks/NOTES.md); the
                     training forward then runs its Triton kernel (the Gluon one stores O).
    dq_atomics:      how the fused backward computes dQ: "auto" lets the GPU tuner choose between
                     a dQ kernel of its own (deterministic) and dK·dV's kernel adding each key
                     tile's share of dQ by fp32 atomics (FlashAttention-2's split: P and dP
                     computed once), and keeps the dQ kernel in Triton's interpreter and under
                     ``torch.use_deterministic_algorithms(True)``; "1" always adds by atomics
                     (unless deterministic algorithms are asked for), "0" never
                     (``FXFLASH_DQ_ATOMICS``). Where atomics are allowed ("auto" on a GPU, "1"),
                     a bias's gradient is added by them too, into a tensor of its own shape.
    exact_delta:     where a 16-bit region's forward stored no fp32 O (``forward_statistics``
                     off, or its training forward not printed), its fused backward takes each
                     row's Δ = Σⱼ P·dP over the keys, in a pass of its own (a softmax's divided
                     by Σⱼ P), so that every dS row sums to 0 as the softmax's does;
                     ``FXFLASH_EXACT_DELTA=0`` takes FlashAttention's rowsum(dO ⊙ O) from the
                     16-bit O there instead (one pass fewer, but dQ and dK off by O's rounding,
                     many times eager's error, on rows a few keys dominate). A score input's
                     gradient (a bias, a temperature) always takes the summed Δ.
    progress:        show a progress bar on stderr while tuning (``FXFLASH_PROGRESS=0``: silent).
    block_sparsity:  skip key tiles that a mask built from indices empties (proved per tile by
                     interval arithmetic); ``FXFLASH_BLOCK_SPARSITY=0`` visits every tile.
    full_tiles:      with block sparsity, visit the key tiles that every mask keeps in a loop of
                     their own with the masks folded away; ``FXFLASH_FULL_TILES=0`` evaluates
                     the masks on every visited tile (for A/B measurements).
    vector_producers: compute in the kernel the elementwise ops (through views) whose value a
                     tile reads as a vector of keys or rows (the Evoformer's mask bias
                     ``INF·(mask − 1)``: emit's vector_producer), instead of loading what eager's
                     kernels for them wrote, on frames of at most emit.VECTOR_PRODUCER_MAX_SCORES
                     scores (the Evoformer at B=1 34 % faster per call on an H100, at B=8 1.3 %
                     slower); ``FXFLASH_VECTOR_PRODUCERS=0`` loads it (for A/B).
    fold_scale:      carry a positive constant factor of the scores (``s / √d``) past max and
                     into the exp2 multiply-add instead of multiplying every score by it
                     (rules.POSITIVE_SCALE); ``FXFLASH_FOLD_SCALE=0`` multiplies (for A/B).
    fold_scale_add:  with fold_scale, carry the factor past an added bias too, ``c·x + f·b =
                     c·(x + (f/c)·b)`` with ``f`` constant along the keys (ALiBi's slope), one
                     multiply-add per score; ``FXFLASH_FOLD_SCALE_ADD=0`` multiplies (for A/B).
    row_reciprocal:  divide a softmax's output by its row sum as one reciprocal per row and one
                     multiply per element (Region.unit_bounded_sums: sums ≥ 1, so ``1/s`` cannot
                     overflow) instead of a division per element; ``FXFLASH_ROW_RECIPROCAL=0``
                     divides (for A/B measurements).
    heavy_rows_first: give the row tiles to programs last tile first, so that under a mask that
                     lets later queries see more keys (causal, prefix-LM) the longest programs
                     start first and the short ones fill the last wave; ``FXFLASH_HEAVY_ROWS_FIRST=0``
                     keeps the natural order (for A/B measurements).
    exp2_fma:        for 16-bit inputs, print ``exp(x - m)`` as ``exp2(x·log₂e - m·log₂e)`` (one
                     fused multiply-add per score, rules.Homomorphism); ``FXFLASH_EXP2_FMA=0``
                     keeps ``tl.exp`` (for A/B measurements).
    log2_max:        with exp2_fma, keep a running maximum that exp reads in exp2 units
                     (``max·log₂e``; rules.Homomorphism.apply_log2): no per-row multiply by log₂e
                     in the exponent or the rescale; ``FXFLASH_LOG2_MAX=0`` keeps natural units
                     (for A/B measurements).
    prefetch_epilogue: load the inputs that the epilogue reads (an output gate) before the key
                     loop, so that their latency hides behind it (their tiles stay in registers
                     across the loop). Off by default (``FXFLASH_PREFETCH_EPILOGUE=1`` turns it
                     on): on an H200 it made the Evoformer 4 % faster at head dim 128 and 9 %
                     slower at 64 (benchmarks/NOTES.md).
    gluon:           on Hopper GPUs, a softmax region that qualifies (gluon.refusal) also gets a
                     Gluon kernel with FlashAttention-3's warp-specialized structure, whose
                     configurations the tuner times beside the ``tl`` kernel's (codegen/gluon.py);
                     ``FXFLASH_GLUON=0`` times the ``tl`` kernel's alone.
    gluon_full_tiles: in the Gluon kernel, score the run of tiles that every mask keeps with a
                     second score function whose masks are folded away (as ``full_tiles`` does for
                     the Triton kernel): causal and prefix-LM 13 % faster at 16k on an H200
                     (benchmarks/NOTES.md); ``FXFLASH_GLUON_FULL_TILES=0`` evaluates the masks on
                     every visited tile.
    gluon_mma_row_sum: in the Gluon kernel, accumulate each row's sum of ``p`` on the tensor cores, as
                     ``P·1`` beside ``P·V`` (from the same bf16/fp16 ``P``), instead of one add per
                     score; ``FXFLASH_GLUON_MMA_ROW_SUM=0`` adds (for A/B measurements).
    gluon_tma_tiles: in the Gluon kernel, read a [rows, keys] tile of a 16-bit score input (the
                     Evoformer's pair bias) by TMA from the loader warp into a ring beside K and V,
                     and an output gate by TMA from a second loader warp into the item's Q buffers,
                     instead of loading them per element in the consumers: the Evoformer 10 % faster
                     on an H200 (benchmarks/NOTES.md); ``FXFLASH_GLUON_TMA_TILES=0`` loads per element
                     (for A/B measurements).
    gluon_tma_key_vectors: with gluon_tma_tiles, also read a [1, keys] vector of a 16-bit score
                     input (the Evoformer's mask bias) by TMA beside K, one row per key tile for all
                     the item's rows, instead of per element in the consumers: the Evoformer at B=8
                     0.703 → 0.663 ms on an H100; ``FXFLASH_GLUON_TMA_KEY_VECTORS=0`` loads it per
                     element (for A/B measurements).
    gluon_tma_store: in the Gluon kernel of a region whose output gate arrives in the Q buffers
                     (gluon_tma_tiles), write each consumer's finished rows into its Q buffer and
                     store them by TMA instead of per element from registers: the Evoformer at B=8
                     0.772 → 0.738 ms on an H100 (benchmarks/NOTES.md); ``FXFLASH_GLUON_TMA_STORE=0``
                     stores per element (for A/B measurements).
    sdpa_calls:      which calls of ``scaled_dot_product_attention`` the backend reads as their
                     math form, to fuse (capture/sdpa.py): ``"masked"`` (default) those with an
                     ``attn_mask``, whose mask the kernel computes from the graph's ops, skipping
                     tiles; ``"all"`` those without a mask too; ``"none"`` keeps PyTorch's kernel
                     for every call. On an H100 (bf16, head dim 64; benchmarks/NOTES.md) PyTorch's
                     kernel was 2–14 % faster on calls without a mask at 4k keys (up to 40 % at 1k),
                     and with a boolean key mask 2.1× slower at 4k (at 1k: 1.18× faster with 16
                     KV heads, 1.53× slower with 2). ``FXFLASH_SDPA_CALLS``.
    bind_launches:   from the second launch of a kernel with one layout, call Triton's compiled
                     kernel directly, skipping the JIT entry point's per-call work
                     (launch.Launcher); ``FXFLASH_BIND_LAUNCHES=0`` launches every call through
                     the JIT (for A/B measurements, or a Triton whose launcher differs).
    bind_gluon_launches: remember a Gluon launch per layout too (launch.BoundGluonLaunch: no
                     tuner lookup, launch checks, JIT entry or descriptor builds after the first
                     call, and the arguments the layout fixes kept): 68 µs of host time per call
                     for vanilla instead of 191 on an H200, the Evoformer at B=1 114–121 µs
                     (157–177 before its arguments were kept; benchmarks/NOTES.md);
                     ``FXFLASH_BIND_GLUON_LAUNCHES=0`` sends every Gluon launch through the checks
                     and Gluon's JIT.
    """

    fuse: bool = os.environ.get("FXFLASH_FUSE", "1") != "0"
    autotune: bool = os.environ.get("FXFLASH_AUTOTUNE", "1") != "0"
    precompile: bool = os.environ.get("FXFLASH_PRECOMPILE", "1") != "0"
    time_eager: bool = os.environ.get("FXFLASH_TIME_EAGER", "1") != "0"
    fused_backward: bool = os.environ.get("FXFLASH_FUSED_BACKWARD", "1") != "0"
    forward_statistics: bool = os.environ.get("FXFLASH_FORWARD_STATISTICS", "1") != "0"
    fp32_o: bool = os.environ.get("FXFLASH_FP32_O", "1") != "0"
    dq_atomics: str = os.environ.get("FXFLASH_DQ_ATOMICS", "auto")
    exact_delta: bool = os.environ.get("FXFLASH_EXACT_DELTA", "1") != "0"
    progress: bool = os.environ.get("FXFLASH_PROGRESS", "1") != "0"
    block_sparsity: bool = os.environ.get("FXFLASH_BLOCK_SPARSITY", "1") != "0"
    full_tiles: bool = os.environ.get("FXFLASH_FULL_TILES", "1") != "0"
    vector_producers: bool = os.environ.get("FXFLASH_VECTOR_PRODUCERS", "1") != "0"
    fold_scale: bool = os.environ.get("FXFLASH_FOLD_SCALE", "1") != "0"
    fold_scale_add: bool = os.environ.get("FXFLASH_FOLD_SCALE_ADD", "1") != "0"
    row_reciprocal: bool = os.environ.get("FXFLASH_ROW_RECIPROCAL", "1") != "0"
    heavy_rows_first: bool = os.environ.get("FXFLASH_HEAVY_ROWS_FIRST", "1") != "0"
    exp2_fma: bool = os.environ.get("FXFLASH_EXP2_FMA", "1") != "0"
    log2_max: bool = os.environ.get("FXFLASH_LOG2_MAX", "1") != "0"
    prefetch_epilogue: bool = os.environ.get("FXFLASH_PREFETCH_EPILOGUE", "0") != "0"
    gluon: bool = os.environ.get("FXFLASH_GLUON", "1") != "0"
    gluon_full_tiles: bool = os.environ.get("FXFLASH_GLUON_FULL_TILES", "1") != "0"
    gluon_mma_row_sum: bool = os.environ.get("FXFLASH_GLUON_MMA_ROW_SUM", "1") != "0"
    gluon_tma_tiles: bool = os.environ.get("FXFLASH_GLUON_TMA_TILES", "1") != "0"
    gluon_tma_key_vectors: bool = os.environ.get("FXFLASH_GLUON_TMA_KEY_VECTORS", "1") != "0"
    gluon_tma_store: bool = os.environ.get("FXFLASH_GLUON_TMA_STORE", "1") != "0"
    sdpa_calls: str = os.environ.get("FXFLASH_SDPA_CALLS", "masked")
    bind_launches: bool = os.environ.get("FXFLASH_BIND_LAUNCHES", "1") != "0"
    bind_gluon_launches: bool = os.environ.get("FXFLASH_BIND_GLUON_LAUNCHES", "1") != "0"
    remember_graphs: bool = os.environ.get("FXFLASH_REMEMBER_GRAPHS", "1") != "0"
    kernel_cache_dir: str = os.environ.get(
        "FXFLASH_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "fxflash")
    )

    @contextlib.contextmanager
    def overridden(self, **values):
        """The given settings inside the block, the previous ones restored after it (also on an
        exception): ``with fxflash.config.overridden(gluon=False, block_sparsity=False): ...``."""
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise AttributeError(f"fxflash.config has no setting {', '.join(map(repr, unknown))}; its settings: "
                                 f"{', '.join(f.name for f in dataclasses.fields(self))}")
        previous = {name: getattr(self, name) for name in values}
        for name, value in values.items():
            setattr(self, name, value)
        try:
            yield self
        finally:
            for name, value in previous.items():
                setattr(self, name, value)


config = Config()


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """The settings that shape a generated kernel (each one's meaning: Config), as ``config`` held
    them when a graph was optimized: read once per graph (``kernel_options()``), passed to the
    fusion rules and the printers, and recorded in each kernel's plan (``KernelPlan.options``),
    which its launches read too. Nothing reads ``config`` while printing."""

    block_sparsity: bool
    full_tiles: bool
    vector_producers: bool
    fold_scale: bool
    fold_scale_add: bool
    row_reciprocal: bool
    heavy_rows_first: bool
    exp2_fma: bool
    log2_max: bool
    prefetch_epilogue: bool
    gluon_full_tiles: bool
    gluon_mma_row_sum: bool
    gluon_tma_tiles: bool
    gluon_tma_key_vectors: bool
    gluon_tma_store: bool
    fp32_o: bool
    interpreter: bool = False  # the kernels run in Triton's interpreter (``interpreting()``)


def kernel_options() -> KernelOptions:
    """``config``'s kernel settings now, and whether kernels run in Triton's interpreter."""
    return KernelOptions(**{f.name: getattr(config, f.name) for f in dataclasses.fields(KernelOptions)
                            if f.name != "interpreter"}, interpreter=interpreting())


def interpreting() -> bool:
    """Do generated kernels run in Triton's interpreter (TRITON_INTERPRET=1)?"""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _configure_logging() -> None:
    level = os.environ.get("FXFLASH_LOG")
    if level:
        logging.basicConfig()
        log.setLevel(getattr(logging, level.upper(), logging.INFO))


_configure_logging()
