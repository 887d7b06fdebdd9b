"""The GPU suite: real Triton kernels on a CUDA GPU (``pytest -m gpu``), bf16 included."""
import gc
import weakref

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fxflash
from fxflash.codegen.gluon_plan import GLUON_CONFIGS, PERSISTENT_CONFIGS, STREAM_CONFIGS, gluon_tile
from fxflash.variants import VARIANTS, Shape
from helpers import assert_accurate, assert_gradients_accurate
from test_fused import FUSED_VARIANTS
from test_fused_backward import FUSED as FUSED_BACKWARD
from test_sparsity import (COMBINE, MASKS, _additive_minus_inf, _additive_minus_inf_window, _finite_fill,
                           _padded_program, _padding_args, _program, _skipping_changes_nothing, runs)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SHAPES = {
    "even": Shape(B=2, H=8, Hkv=2, M=256, N=256, D=64, Dv=64),
    "odd": Shape(B=3, H=4, Hkv=2, M=197, N=333, D=80, Dv=48),
    "d128": Shape(B=1, H=4, Hkv=4, M=130, N=520, D=128, Dv=128),
    "d256": Shape(B=1, H=2, Hkv=1, M=70, N=90, D=256, Dv=256),
}


DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CASES = [(name, "odd", dtype) for name in FUSED_VARIANTS for dtype in DTYPES] + [
    (name, shape, dtype)
    for name in ("vanilla", "causal", "gqa_expand", "softcap", "diff_attention", "evoformer_row")
    for shape in ("even", "d128", "d256")
    if not (name == "diff_attention" and shape == "d256")  # its V is 2·Dv = 512 wide
    for dtype in (torch.float16, torch.bfloat16)
]


@pytest.mark.parametrize("name,shape,dtype", CASES, ids=str)
def test_variant_on_gpu(name, shape, dtype):
    variant = VARIANTS[name]
    args = variant.inputs(SHAPES[shape], dtype, "cuda")
    report = fxflash.explain(variant.fn, *args)
    assert len(report.regions) == variant.chains and all(r.fused for r in report.regions), \
        [r.reason for r in report.regions]
    fast = fxflash.optimize(variant.fn, inner="eager")  # the kernel's own launches, no Inductor build
    first = fast(*args)  # through Triton's JIT entry point
    assert_accurate(variant.fn, args, first)
    # the same layout again: the bound launch (launch.Launcher), the same kernel
    torch.testing.assert_close(fast(*args), first, rtol=0, atol=0, equal_nan=True)


BACKWARD_CASES = [(name, "odd") for name in FUSED_BACKWARD] + [
    (name, shape) for name in ("vanilla", "causal", "gqa_expand", "softcap") for shape in ("even", "d128", "d256")]


@pytest.mark.parametrize("name,shape", BACKWARD_CASES, ids=str)
def test_fused_backward_on_gpu(name, shape):
    """bf16 gradients of Q, K and V from the generated backward kernels, as accurate as eager's."""
    variant = VARIANTS[name]
    args = variant.inputs(SHAPES[shape], torch.bfloat16, "cuda")
    assert [r.backward for r in fxflash.explain(variant.fn, *args).regions] == ["fused"]
    assert_gradients_accurate(variant.fn, fxflash.optimize(variant.fn, inner="eager"), args, wrt=(0, 1, 2))


@pytest.mark.parametrize("atomics", ["0", "1"])
@pytest.mark.parametrize("name", ["causal", "alibi", "gqa_expand"])
def test_remembered_backward_launches_on_gpu(name, atomics, monkeypatch):
    """The backward's second call in one layout replays its launches (runtime/backward._Bound),
    dQ by its own kernel or added by atomics: the gradients of new inputs are as accurate as the
    first call's."""
    from fxflash.runtime import op

    monkeypatch.setattr(fxflash.config, "dq_atomics", atomics)
    variant = VARIANTS[name]
    fast = fxflash.optimize(variant.fn, inner="eager")
    for seed in (0, 1):
        args = [a.roll(seed, -1) for a in variant.inputs(SHAPES["odd"], torch.bfloat16, "cuda")]
        assert_gradients_accurate(variant.fn, fast, args, wrt=(0, 1, 2))
    assert any(entry.bound_backward for entry in op._REGISTRY.values())


def test_gradients_of_a_bias_and_of_padded_rows_on_gpu():
    """bf16: a per-head bias's gradient from the dQ kernel; rows a finfo.min mask empties."""
    from test_fused_backward import _biased, padded, padded_keep

    s = SHAPES["odd"]
    q, k, v = VARIANTS["vanilla"].inputs(s, torch.bfloat16, "cuda")
    bias = torch.randn(s.H, s.M, s.N, generator=torch.Generator().manual_seed(0)).to("cuda", torch.bfloat16)
    assert_gradients_accurate(_biased, fxflash.optimize(_biased, inner="eager"), (q, k, v, bias), wrt=(0, 1, 2, 3))
    keep = padded_keep(s.M, s.N, "cuda")
    assert_gradients_accurate(padded, fxflash.optimize(padded, inner="eager"), (q, k, v, keep), wrt=(0, 1, 2))


@pytest.mark.parametrize("atomics", ["0", "1"])
@pytest.mark.parametrize("statistics", [True, False], ids=["forward_statistics", "backward_statistics"])
def test_16_bit_rows_the_forward_repaired_take_eagers_rounding_on_gpu(statistics, atomics, monkeypatch):
    """fp16 keys filled with 65504 then biased, which eager's rounding makes equal: the rows the
    forward repaired (or the backward's statistics kernel marked) take their chain in eager's
    rounding in every backward kernel, over several row and key tiles."""
    from test_fused_backward import _filled_then_biased

    monkeypatch.setattr(fxflash.config, "forward_statistics", statistics)
    monkeypatch.setattr(fxflash.config, "dq_atomics", atomics)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 64, generator=g).half().cuda() for n in (130, 520, 520))
    keep = (torch.rand(2, 1, 130, 520, generator=g) > 0.4).cuda()
    keep[0] = True           # heads with no marked row,
    keep[1, :, :40] = True   # and row tiles with none beside those with some
    bias = torch.randn(1, 1, 1, 520, generator=g).half().cuda()
    args = (q, k, v, keep, bias)
    fast = fxflash.optimize(_filled_then_biased, inner="eager")
    assert_gradients_accurate(_filled_then_biased, fast, args, wrt=(0, 1, 2, 4))


@pytest.mark.parametrize("atomics", ["0", "1"])
def test_16_bit_rows_a_few_keys_dominate_on_gpu(atomics, monkeypatch):
    """bf16 rows a few keys dominate: dQ and dK, and a temperature's gradient, from Δ taken from
    the forward's fp32 O within eager's error, dQ by its own kernel or by atomics."""
    from test_fused_backward import _peaked, _tempered, _unscaled

    monkeypatch.setattr(fxflash.config, "dq_atomics", atomics)
    for seed in (2, 3, 6):
        args = tuple(a.cuda() for a in _peaked(seed))
        assert_gradients_accurate(_unscaled, fxflash.optimize(_unscaled, inner="eager"), args, wrt=(0, 1, 2))
    q, k, v = (a.cuda() for a in _peaked(1, n=300))
    args = (q / 8, k, v, torch.tensor(0.7, dtype=torch.bfloat16, device="cuda"))
    assert_gradients_accurate(_tempered, fxflash.optimize(_tempered, inner="eager"), args, wrt=(0, 1, 2, 3))


@pytest.mark.parametrize("name", ["diff_attention", "diff_attention_causal", "diff_transformer"])
@pytest.mark.parametrize("shape", ["odd", "even"])
def test_softmax_streams_train_through_their_twin_on_gpu(name, shape):
    """bf16 gradients of differential attention's inputs, λ's and the Diff Transformer's λ vectors
    and norm weight included, through the twin's fused kernels (runtime/twin.py)."""
    variant = VARIANTS[name]
    args = variant.inputs(SHAPES[shape], torch.bfloat16, "cuda")
    assert [r.backward for r in fxflash.explain(variant.fn, *args).regions] == ["fused"]
    wrt = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point())
    assert_gradients_accurate(variant.fn, fxflash.optimize(variant.fn, inner="eager"), args, wrt)


def test_gradients_of_the_evoformer_s_gate_and_pair_bias_and_of_alibi_slopes_on_gpu():
    """bf16: the ops after P·V (transpose, gate) differentiated at the output the training forward
    kept, the gate's and the pair bias's gradients; learned ALiBi slopes through the bias the
    kernel computes from them."""
    variant = VARIANTS["evoformer_row"]
    args = variant.inputs(SHAPES["odd"], torch.bfloat16, "cuda")
    assert_gradients_accurate(variant.fn, fxflash.optimize(variant.fn, inner="eager"), args, wrt=(0, 1, 2, 4, 5))

    def alibi(q, k, v, slopes):
        i = torch.arange(q.size(-2), device=q.device)
        return torch.softmax(q @ k.transpose(-1, -2) + slopes[:, None, None] * (i[None, :] - i[:, None]), -1) @ v

    s = SHAPES["odd"]
    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=s.B, H=s.H, Hkv=s.H, M=s.M, N=s.M, D=s.D, Dv=s.Dv), torch.bfloat16, "cuda")
    slopes = torch.rand(s.H, device="cuda", dtype=torch.bfloat16)
    assert_gradients_accurate(alibi, fxflash.optimize(alibi, inner="eager"), (q, k, v, slopes), wrt=(0, 1, 2, 3))


def test_bound_launches_follow_alignment_and_cuda_graphs():
    """A pointer off 16-byte alignment is launched through the JIT (another specialization),
    then bound; a bound launch captured in a CUDA graph replays onto new inputs."""
    variant = VARIANTS["vanilla"]
    q, k, v = variant.inputs(SHAPES["odd"], torch.bfloat16, "cuda")
    fast = fxflash.optimize(variant.fn)
    aligned = fast(q, k, v)
    shifted = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda").as_strided(q.shape, q.stride(), 1).copy_(q)
    assert shifted.data_ptr() % 16 != 0
    for _ in range(2):
        torch.testing.assert_close(fast(shifted, k, v), aligned, rtol=0, atol=0)
    static = [t.clone() for t in (q, k, v)]
    fast(*static)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = fast(*static)
    q2, k2, v2 = q.flip(2), k.flip(2), v.flip(2)
    for t, new in zip(static, (q2, k2, v2)):
        t.copy_(new)
    graph.replay()
    torch.testing.assert_close(replayed, fast(q2, k2, v2), rtol=0, atol=0)
    assert_accurate(variant.fn, (q2, k2, v2), replayed)


def test_memory_stays_linear_in_sequence_length():
    variant = VARIANTS["causal"]
    args = variant.inputs(Shape(B=1, H=8, Hkv=8, M=8192, N=8192, D=64, Dv=64), torch.bfloat16, "cuda")
    fast = fxflash.optimize(variant.fn)
    fast(*args)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fast(*args)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    scores = 8 * 8192 * 8192 * 2
    assert extra < scores / 16, f"{extra / 2**20:.1f} MiB beyond the inputs"


@pytest.mark.parametrize("inner", ["eager", "inductor"])
@pytest.mark.parametrize("name", FUSED_VARIANTS)
def test_torch_compile_on_gpu(name, inner):
    """torch.compile(backend="fxflash") on the GPU machines' torch (2.11, the oldest supported;
    CI's CPU runs are on 2.13): one compile, every region fused, accurate, with eager or
    Inductor running what is not fused."""
    from fxflash.backend import recent_reports

    torch._dynamo.reset()
    recent_reports.clear()
    variant = VARIANTS[name]
    args = variant.inputs(SHAPES["odd"], torch.bfloat16, "cuda")
    compiled = torch.compile(variant.fn, backend="fxflash", options={"inner": inner})
    assert_accurate(variant.fn, args, compiled(*args))
    assert len(recent_reports) == 1
    assert all(r.fused for r in recent_reports[0].regions), [r.reason for r in recent_reports[0].regions]


@pytest.fixture
def fresh_workers():
    """Compile workers started by the test (with its environment), closed after it."""
    from fxflash.runtime import precompile

    precompile._close_all()
    precompile._pool.clear()
    yield
    precompile._close_all()
    precompile._pool.clear()


def test_the_tuners_kernels_compile_beside_inductor_on_gpu(tmp_path, monkeypatch, fresh_workers):
    """The backend starts compiling a region's tile candidates and its own ops (as Inductor compiles
    them, which the tuner times beside the kernels) in the worker processes (``precompile.start``,
    from ``op.compile_ahead``) before its inner Inductor compiles the graph; the first run's tuner
    waits for them, compiles no kernel more and loads the own ops from Inductor's cache, and the
    result is eager's."""
    import importlib

    import triton
    from torch._dynamo.utils import counters

    from fxflash.runtime import precompile, tuning

    backend = importlib.import_module("fxflash.backend")  # the module (fxflash.backend is also a function)

    if not hasattr(getattr(triton, "knobs", None), "runtime") or not hasattr(triton.knobs.runtime, "jit_cache_hook"):
        pytest.skip("this Triton has no jit_cache_hook")
    monkeypatch.setattr(fxflash.config, "kernel_cache_dir", str(tmp_path))
    monkeypatch.setattr(fxflash.config, "autotune", True)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # a hit only from the worker
    tuning.forget()
    events = []
    start, inner = precompile.start, backend._inner_compile
    monkeypatch.setattr(precompile, "start", lambda launches, graphs=(): (
        events.append("start"), events.append(len(graphs)), start(launches, graphs))[2])
    monkeypatch.setattr(backend, "_inner_compile", lambda *a, **k: (events.append("inductor"), inner(*a, **k))[1])
    monkeypatch.setattr(precompile, "_compile", lambda jobs: (events.append(len(jobs)), precompile._compile_batch(jobs))[1])
    torch._dynamo.reset()
    counters.clear()
    variant = VARIANTS["causal"]
    args = variant.inputs(Shape(B=2, H=3, Hkv=3, M=333, N=333, D=64, Dv=64), torch.bfloat16, "cuda")
    compiled = torch.compile(variant.fn, backend="fxflash")
    assert_accurate(variant.fn, args, compiled(*args))
    # started before Inductor ran, with one graph (the workers compile in a thread of their own: the
    # count of their jobs comes when they begin); the first run compiled nothing more in workers
    graphs, *batches = [e for e in events if isinstance(e, int)]
    assert events[0] == "start" and "inductor" in events and graphs == 1, events
    assert len(batches) == 1 and batches[0] > 1, events
    (tuned,) = [h for h in tuning.history if not h["from_disk"]][-1:]
    assert tuned["compiled_in_workers"] >= batches[0] - graphs
    assert counters["inductor"]["fxgraph_cache_hit"] >= 1, dict(counters["inductor"])
    tuning.forget()


def test_training_under_cuda_graphs_on_gpu():
    """``torch.compile(backend="fxflash", mode="reduce-overhead")``: Inductor records the graphs,
    the fused region's forward and backward launches among them, as CUDA graphs; steps replayed
    from them give eager's gradients."""
    from fxflash.backend import recent_reports

    torch._dynamo.reset()
    recent_reports.clear()
    variant = VARIANTS["causal"]
    args = variant.inputs(SHAPES["odd"], torch.bfloat16, "cuda")
    compiled = torch.compile(variant.fn, backend="fxflash", mode="reduce-overhead")
    for _ in range(3):   # warm-up, recording, replay
        assert_gradients_accurate(variant.fn, compiled, args, wrt=(0, 1, 2))
    assert [r.backward for r in recent_reports[-1].regions] == ["fused"]


def test_optimize_compiles_the_rest_with_inductor_on_gpu():
    variant = VARIANTS["diff_transformer"]  # a region with an epilogue, and ops around it
    args = variant.inputs(SHAPES["odd"], torch.bfloat16, "cuda")
    fast = fxflash.optimize(variant.fn)
    report = fast.report(*args)
    assert report.inner == "inductor" and all(r.fused for r in report.regions)
    assert_accurate(variant.fn, args, fast(*args))


@pytest.mark.parametrize("name,dtype,lengths", [("sliding_window", torch.float16, (128, 300)),
                                                ("evoformer_row", torch.bfloat16, (128, 256, 384))])
def test_torch_compile_dynamic_on_gpu(name, dtype, lengths):
    """One compile serves every length (Inductor compiling the rest of the graph), each accurate."""
    from fxflash.backend import recent_reports

    torch._dynamo.reset()
    recent_reports.clear()
    variant = VARIANTS[name]
    compiled = torch.compile(variant.fn, backend="fxflash", dynamic=True)
    for n in lengths:
        args = variant.inputs(Shape(B=2, H=4, Hkv=4, M=n, N=n, D=64, Dv=64), dtype, "cuda")
        assert_accurate(variant.fn, args, compiled(*args))
    assert len(recent_reports) == 1
    assert all(r.fused for r in recent_reports[0].regions)


@pytest.mark.parametrize("name,n", [("causal", 1000), ("sliding_window", 1000), ("prefix_lm", 1000),
                                    ("block_causal", 1000), ("dilated_window", 1000), ("neighbourhood_2d", 1000),
                                    ("document_mask", 1000), ("document_mask", 5000), ("causal", 9000),
                                    ("key_padding", 1000), ("key_lengths", 1000)])
def test_tile_skipping_on_gpu_changes_nothing(name, n):
    """Skipped tiles, full tiles with their masks folded, several chunks of tile tests
    (128 tiles per chunk for index masks, 32 for id summaries) — bit for bit the kernel that
    visits every tile and evaluates every mask (test_sparsity._skipping_changes_nothing: both
    untuned, as two separately tuned kernels may take tiles that round differently)."""
    variant = VARIANTS[name]
    args = variant.inputs(Shape(B=1 if n > 1000 else 2, H=2, Hkv=2, M=n, N=n, D=64, Dv=64), torch.bfloat16, "cuda")
    _, skipped = _skipping_changes_nothing(variant.fn, args)
    assert_accurate(variant.fn, args, skipped)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tree=MASKS, m=st.integers(2, 300), n=st.integers(2, 400))
def test_random_index_masks_skip_tiles_soundly_on_gpu(tree, m, n):
    """The CPU property test's random index masks (comparisons of affine forms, floor
    divisions and remainders of either sign) compiled for the GPU: the tile classification runs
    as real machine code (the interpreter cannot show a miscompile), and skipping changes
    nothing, bit for bit, against the kernel that visits every tile."""
    fn = _program(tree)
    args = VARIANTS["vanilla"].inputs(Shape(B=1, H=2, Hkv=2, M=m, N=n, D=32, Dv=32), torch.float16, "cuda")
    _skipping_changes_nothing(fn, args)


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(key_runs=runs(150), query_runs=runs(150), combine=COMBINE)
def test_boolean_masks_skip_tiles_soundly_on_gpu(key_runs, query_runs, combine):
    """The CPU property test's boolean padding masks (keys, queries, both) compiled for the GPU:
    their per-tile summaries (key tiles) and in-kernel reductions (query tiles) as machine
    code; skipping changes nothing, bit for bit."""
    padded = _padded_program(combine)
    args = _padding_args(key_runs, query_runs, torch.float16, "cuda")
    _skipping_changes_nothing(padded, args)


@pytest.mark.parametrize("spelling", ["where", "additive"])
def test_finite_fill_masks_on_gpu(spelling):
    """transformers' ``finfo.min`` masks, causal and left-padded, in bf16 on the GPU (whichever
    kernel the tuner keeps): within eager's error, and a row every key masks is V's average."""
    fn = _finite_fill(spelling)
    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=2, H=4, Hkv=4, M=1000, N=1000, D=64, Dv=64), torch.bfloat16, "cuda")
    padding = torch.ones(2, 1000, dtype=torch.bool, device="cuda")
    padding[1, :300] = False
    args = (q, k, v, padding)
    out = fxflash.optimize(fn)(*args)
    assert_accurate(fn, args, out)
    torch.testing.assert_close(out[1, :, :300].float(), v[1].float().mean(-2, keepdim=True).expand(-1, 300, -1),
                               atol=2e-2, rtol=0)


def test_tensors_on_different_devices_raise_eagers_error():
    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=1, H=2, Hkv=2, M=64, N=64, D=64, Dv=64), torch.float16, "cuda")
    with pytest.raises(Exception) as eager_error:
        VARIANTS["vanilla"].fn(q, k.cpu(), v)
    with pytest.raises(type(eager_error.value)):
        fxflash.optimize(VARIANTS["vanilla"].fn)(q, k.cpu(), v)


CANDIDATE_SHAPES = {  # the odd shape unless named; the split's: V 256 wide, two programs per row tile
    "document_mask": Shape(B=2, H=4, Hkv=2, M=333, N=333, D=80, Dv=48),
    "diff_attention_split": Shape(B=1, H=4, Hkv=4, M=300, N=333, D=128, Dv=128),
}


@pytest.mark.parametrize("name", ["causal", "document_mask", "diff_attention", "diff_attention_split",
                                  "evoformer_row"])
def test_every_candidate_tile_on_gpu(name):
    """Every configuration the tuner may pick compiles on this GPU and keeps eager's accuracy."""
    from fxflash.runtime import tuning

    variant = VARIANTS[name.removesuffix("_split")]
    args = variant.inputs(CANDIDATE_SHAPES.get(name, SHAPES["odd"]), torch.bfloat16, "cuda")
    (region,) = fxflash.explain(variant.fn, *args).regions
    assert ("dvb = pid % 2" in region.source) == name.endswith("_split")
    fast = fxflash.optimize(variant.fn)
    for tile in region.configs:
        with tuning.pinned(tile):
            assert_accurate(variant.fn, args, fast(*args))


TUNE_AND_REPORT = """
import json, torch, fxflash
from fxflash.runtime import tuning
from fxflash.variants import VARIANTS, Shape
v = VARIANTS["causal"]
args = v.inputs(Shape(B=2, H=4, Hkv=4, M=700, N=700, D=64, Dv=64), torch.bfloat16, "cuda")
fxflash.optimize(v.fn)(*args)
torch.cuda.synchronize()
print(json.dumps([dict(h, config=list(h["config"])) for h in tuning.history]))
"""


def test_tuning_is_timed_once_and_read_back_by_a_new_process(tmp_path):
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, FXFLASH_CACHE_DIR=str(tmp_path), FXFLASH_AUTOTUNE="1", FXFLASH_PROGRESS="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(fxflash.__file__)),
                                         env.get("PYTHONPATH", "")])
    runs = [subprocess.run([sys.executable, "-c", TUNE_AND_REPORT], env=env, capture_output=True, text=True,
                           timeout=600) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    first, second = (json.loads(run.stdout.strip().splitlines()[-1]) for run in runs)
    assert [h["from_disk"] for h in first] == [False] and "fxflash: tuning" in runs[0].stderr
    assert [h["from_disk"] for h in second] == [True] and "fxflash: tuning" not in runs[1].stderr
    assert first[0]["config"] == second[0]["config"]
    assert len(first[0]["ms"]) > 1 and all(ms > 0 for ms in first[0]["ms"].values())   # interleaved medians
    assert (tmp_path / "tuning.json").exists()
    import triton
    if hasattr(getattr(triton, "knobs", None), "runtime") and hasattr(triton.knobs.runtime, "jit_cache_hook"):
        # every candidate was compiled in the worker processes (runtime/precompile.py), not here
        kernels = first[0]["candidates"] - ("eager" in first[0]["ms"])   # tuning.EAGER compiles nothing
        assert first[0]["compiled_in_workers"] >= kernels, first[0]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="the Gluon probe is written for Hopper (wgmma, TMA, setmaxnreg)")
@pytest.mark.parametrize("config", ["2x128x3", "3x128x3", "3x128x3p", "3x128x3P", "2x128x2pP"])
@pytest.mark.parametrize("score", ["vanilla", "causal", "alibi", "alibi_cols"])
@pytest.mark.parametrize("S", [256, 384])
@pytest.mark.parametrize("H,Hkv,D", [(3, 3, 64), (4, 2, 128)])
def test_gluon_probe_computes_attention(config, score, S, H, Hkv, D):
    """benchmarks/probes/probe_gluon's warp-specialized kernel, timed against cuDNN and Flex in
    benchmarks/NOTES.md, computes each score it probes within eager's error, MHA and GQA, with
    one CTA per work item and persistent (``P``: 5 CTAs walk the 12–24 items, so barrier phases,
    the K/V ring and the two Q buffers carry across items): with S = 256 the CTA of three
    consumers (192 rows) holds rows of the next head, which it must not store."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "probes"))
    import probe_gluon

    if D == 128 and config.startswith("3x"):
        pytest.skip("three consumers with 128-key tiles need more than 227 KB of shared memory at D = 128")
    variant = VARIANTS[score.removesuffix("_cols")]
    q, k, v = variant.inputs(Shape(B=2, H=H, Hkv=H, M=S, N=S, D=D, Dv=D), torch.bfloat16, "cuda")
    k, v = k[:, :Hkv].contiguous(), v[:, :Hkv].contiguous()

    def grouped(q, k, v):  # query head h reads key/value head h // (H / Hkv)
        return variant.fn(q, k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1))
    out = torch.full_like(q, float("nan"))
    probe_gluon.gluon_attention(q, k, v, out, *probe_gluon.parse_config(config), score, max_ctas=5)
    assert_accurate(grouped, (q, k, v), out)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="the Gluon probe is written for Hopper (wgmma, TMA, setmaxnreg)")
@pytest.mark.parametrize("config", ["128x2", "128x2pP", "64x2p", "64x3P"])
@pytest.mark.parametrize("D", [64, 128])
def test_diff_gluon_probe_computes_differential_attention(config, D):
    """benchmarks/probes/probe_diff_gluon's two-stream kernel (one consumer warp group per stream,
    timed in benchmarks/NOTES.md) computes ``variants.diff_attention`` within eager's error, with
    one CTA per item and persistent (``P``: 5 CTAs walk the 24 items, so the Q buffers, the K/V
    ring and the buffer in which stream 1 hands its output over are reused across items)."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks", "probes"))
    import probe_diff_gluon

    if D == 128 and (config.startswith("128") or "P" in config or config.endswith("3p")):
        pytest.skip("at D = 128 only 64-key tiles, two buffers and one CTA per item fit in shared memory")
    variant = VARIANTS["diff_attention"]
    q, k, v = variant.inputs(Shape(B=2, H=3, Hkv=3, M=256, N=256, D=D, Dv=D), torch.bfloat16, "cuda")
    out = torch.full((2, 3, 256, 2 * D), float("nan"), dtype=torch.bfloat16, device="cuda")
    probe_diff_gluon.diff_attention_gluon(q, k, v, 0.5, out, *probe_diff_gluon.parse_config(config), max_ctas=5)
    assert_accurate(variant.fn, (q, k, v), out)


needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                                  reason="the Gluon kernel needs a Hopper GPU")

# Variants whose region qualifies for the Gluon kernel (codegen/gluon.py); the shapes have N a
# multiple of every Gluon key tile and M not a multiple of the CTA's 128 or 192 rows.
GLUON_VARIANTS = ["vanilla", "manual_softmax", "gqa_expand", "gqa_repeat_interleave", "alibi", "softcap", "causal",
                  "sliding_window", "prefix_lm", "block_causal", "dilated_window", "neighbourhood_2d",
                  "document_mask", "key_padding", "key_lengths", "additive_mask", "bshd", "einsum", "einsum_bshd",
                  "scale_q_first", "sdpa_key_lengths",
                  "evoformer_row", "diff_attention_chunked"]
GLUON_SHAPES = {64: Shape(B=2, H=4, Hkv=2, M=200, N=384, D=64, Dv=64),
                128: Shape(B=1, H=4, Hkv=2, M=130, N=256, D=128, Dv=128)}


@needs_hopper
@pytest.mark.parametrize("name,d,tile", [(name, d, tile) for name in GLUON_VARIANTS for d, tiles in GLUON_CONFIGS.items()
                                          for tile in tiles],
                         ids=lambda x: x if isinstance(x, (int, str)) else "x".join(map(str, x[1:])))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_generated_gluon_kernel_on_gpu(name, dtype, d, tile):
    """Each Gluon configuration (ids: consumers x key tile x buffers x ping-pong x CTAs per SM)
    of the region's generated Gluon kernel keeps eager's accuracy."""
    variant = VARIANTS[name]
    args = variant.inputs(GLUON_SHAPES[d], dtype, "cuda")
    for region in fxflash.explain(variant.fn, *args).regions:  # diff_attention_chunked: two
        assert region.fused and "warp_specialize" in region.gluon_source, region.steps
    assert_accurate(variant.fn, args, _pinned_call(fxflash.optimize(variant.fn), args, tile))


@needs_hopper
@pytest.mark.parametrize("tile", GLUON_CONFIGS[64][::2], ids=lambda x: "x".join(map(str, x[1:])))  # 3 and 2 consumers
def test_gluon_kernel_of_blooms_widened_q_and_k_on_gpu(tile):
    """BLOOM's baddbmm in bf16 (torch's decomposition widens Q and K to fp32 before the contraction):
    the Gluon kernel dots their 16-bit tiles with fp32 sums, the same exact products and fp32 sums,
    and keeps eager's accuracy with BLOOM's ALiBi rows and its ``finfo.min`` causal mask."""
    from test_batch_views import bloom_attention

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 384, 64, generator=g).to("cuda", torch.bfloat16) for _ in range(3))
    alibi = (2.0 ** -torch.arange(1, 5.0)[:, None] * torch.arange(384.0)).repeat(2, 1)[:, None].to("cuda", torch.bfloat16)
    mask = torch.zeros(2, 1, 384, 384, device="cuda", dtype=torch.bfloat16).masked_fill(
        torch.ones(384, 384, dtype=torch.bool, device="cuda").triu(1), torch.finfo(torch.bfloat16).min)
    args = (q, k, v, alibi, mask)
    (region,) = fxflash.explain(bloom_attention, *args).regions
    assert region.fused and "warp_specialize" in region.gluon_source, region.steps
    assert_accurate(bloom_attention, args, _pinned_call(fxflash.optimize(bloom_attention), args, tile))


@needs_hopper
@pytest.mark.parametrize("fn", [_additive_minus_inf, _additive_minus_inf_window], ids=["causal", "window"])
@pytest.mark.parametrize("tile", GLUON_CONFIGS[64][:2], ids=lambda x: "x".join(map(str, x[1:])))
def test_gluon_kernel_skips_by_additive_minus_inf_masks_under_their_bound_on_gpu(fn, tile):
    """An additive ``-inf`` mask's tiles are skipped by the Gluon kernel too, while the launch's
    bound on the scores holds (``skip_bound``); where it fails (scores of ``+inf``), every tile is
    visited and the NaNs are eager's."""
    args = VARIANTS["vanilla"].inputs(Shape(B=2, H=4, Hkv=4, M=1000, N=1024, D=64, Dv=64), torch.bfloat16, "cuda")
    (region,) = fxflash.explain(fn, *args).regions
    assert "skip_bound" in region.gluon_source
    fast = fxflash.optimize(fn)
    assert_accurate(fn, args, _pinned_call(fast, args, tile))
    q, k, v = args
    q[0, 0, :, 0], k[0, 0, -1, 0] = 1e20, 1e20
    out, eager = _pinned_call(fast, args, tile), fn(*args)
    assert eager.isnan().any() and torch.equal(out.isnan(), eager.isnan())
    assert_accurate(fn, tuple(a[1:] for a in args), out[1:])   # the batch without infinite scores


@needs_hopper
@pytest.mark.parametrize("spelling", ["where", "masked_fill", "additive"])
@pytest.mark.parametrize("tile", GLUON_CONFIGS[64][::2], ids=lambda x: "x".join(map(str, x[1:])))  # 3 and 2 consumers
def test_gluon_kernel_skips_by_finite_fill_masks_and_repairs_their_rows_on_gpu(spelling, tile):
    """transformers' ``finfo.min`` masks skip tiles in the Gluon kernel: a row whose maximum is not
    above ``-T`` (left padding: every key masked) is flagged, and the repair kernel computes it over
    every key, V's average as in eager."""
    fn = _finite_fill(spelling)
    q, k, v = VARIANTS["vanilla"].inputs(Shape(B=2, H=4, Hkv=4, M=1000, N=1024, D=64, Dv=64), torch.bfloat16, "cuda")
    padding = torch.ones(2, 1024, dtype=torch.bool, device="cuda")
    padding[1, :300] = False
    args = (q, k, v, padding)
    (region,) = fxflash.explain(fn, *args).regions
    assert "~(m > " in region.gluon_source
    out = _pinned_call(fxflash.optimize(fn), args, tile)
    assert_accurate(fn, args, out)
    torch.testing.assert_close(out[1, :, :300].float(), v[1].float().mean(-2, keepdim=True).expand(-1, 300, -1),
                               atol=2e-2, rtol=0)


@needs_hopper
@pytest.mark.parametrize("tile", GLUON_CONFIGS[64], ids=lambda x: "x".join(map(str, x[1:])))
def test_gluon_kernel_of_an_sdpa_call_gives_zero_for_rows_every_key_masks(tile):
    """The safe softmax of an SDPA call's math form in the Gluon kernel: rows whose every key is
    masked are 0 (SDPA's answer), not flagged for repair, and the other rows keep SDPA's accuracy."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 4, n, 64, generator=g).to("cuda", torch.bfloat16) for n in (200, 384, 384))
    keep = torch.rand(2, 1, 200, 384, generator=g) > 0.5
    keep[0, :, :7] = False
    keep = keep.cuda()

    def call(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    (region,) = fxflash.explain(call, q, k, v).regions
    assert region.fused and "warp_specialize" in region.gluon_source, region.steps
    out = _pinned_call(fxflash.optimize(call), (q, k, v), tile)
    assert out[0, :, :7].eq(0).all()
    assert_accurate(call, (q, k, v), out)


# V's head dim other than Q's and K's: one-CTA-per-item configurations on every variant here,
# persistent ones on those without tile masks (GluonPlan.configs_dim: those of head dim 128).
DV_VARIANTS = ["vanilla", "causal", "additive_mask", "diff_attention_chunked"]
DV_CASES = [(name, dims, tile) for dims in ((64, 128), (128, 64)) for name in DV_VARIANTS
            for tile in GLUON_CONFIGS[128] + (PERSISTENT_CONFIGS[128] if name != "causal" else ())]


@needs_hopper
@pytest.mark.parametrize("name,dims,tile", DV_CASES,
                         ids=lambda x: x if isinstance(x, str) else "x".join(map(str, x[1:] if x[0] == "gluon" else x)))
def test_gluon_kernel_with_v_head_dim_other_than_qk_on_gpu(name, dims, tile):
    """Q and K of head dim D, V of Dv (differential attention written as two attention calls
    has D = 64, Dv = 128): the Gluon kernel's V tiles and accumulator are Dv wide; bf16 within
    eager's error, for each configuration of the wider head dim that fits."""
    d, dv = dims
    variant = VARIANTS[name]
    args = variant.inputs(Shape(B=2, H=4, Hkv=2, M=200, N=256, D=d, Dv=dv), torch.bfloat16, "cuda")
    for region in fxflash.explain(variant.fn, *args).regions:
        assert region.fused and "warp_specialize" in region.gluon_source, region.steps
    assert_accurate(variant.fn, args, _pinned_call(fxflash.optimize(variant.fn), args, tile))


# Differential attention's two-stream configurations: head dim 64 (V 128 wide) and 128 (V 256);
# the causal form (tiles past the diagonal skipped) on those with one CTA per item.
STREAM_CASES = [(name, d, tile) for name in ("diff_attention", "diff_attention_causal")
                for d, key in ((64, 128), (128, 256)) for tile in STREAM_CONFIGS[key]
                if name == "diff_attention" or not gluon_tile(tile).persistent]


@needs_hopper
@pytest.mark.parametrize("name,d,tile", STREAM_CASES,
                         ids=lambda x: x if isinstance(x, (int, str)) else "x".join(map(str, x[1:])))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_two_stream_gluon_kernel_on_gpu(name, d, tile, dtype):
    """The generated two-stream kernel (one consumer warp group per softmax stream) keeps eager's
    accuracy on every configuration, in three calls: 288 items (4 batches × 8 head pairs × 9 row
    blocks, the last partly past M) outnumber the SMs, so persistent grids reuse the Q buffers,
    the K/V ring and the buffer in which stream 1 hands its output to stream 0."""
    variant = VARIANTS[name]
    args = variant.inputs(Shape(B=4, H=8, Hkv=8, M=520, N=512, D=d, Dv=d), dtype, "cuda")
    (region,) = fxflash.explain(variant.fn, *args).regions
    assert region.fused and "c_buf.store(out)" in region.gluon_source, region.steps
    fast = fxflash.optimize(variant.fn)
    for _ in range(3):
        assert_accurate(variant.fn, args, _pinned_call(fast, args, tile))


@needs_hopper
@pytest.mark.parametrize("tile", GLUON_CONFIGS[64][:2], ids=lambda t: "x".join(map(str, t[1:])))
@pytest.mark.parametrize("name", ["vanilla", "causal", "gqa_expand", "softcap", "key_padding", "padded"])
def test_gluon_training_forward_stores_the_backward_statistics_on_gpu(name, tile, monkeypatch):
    """The Gluon kernel's training forward (its configuration pinned) stores each row's m and 1/l
    and O in fp32, and the fused backward reading them gives eager's gradients; "padded": rows a
    finfo.min mask empties, which the repair kernel computes and stores again."""
    import fxflash.runtime.backward as backward
    from test_fused_backward import padded, padded_keep

    calls = []
    run = backward.run_backward
    monkeypatch.setattr(backward, "run_backward", lambda *a, **k: calls.append(len(a[8])) or run(*a, **k))
    s = GLUON_SHAPES[64]
    if name == "padded":
        fn, args = padded, (*VARIANTS["vanilla"].inputs(s, torch.bfloat16, "cuda"), padded_keep(s.M, s.N, "cuda"))
    else:
        fn, args = VARIANTS[name].fn, VARIANTS[name].inputs(s, torch.bfloat16, "cuda")
    fast = fxflash.optimize(fn, inner="eager")
    assert_gradients_accurate(fn, lambda *a: _pinned_call(fast, a, tile), args, wrt=(0, 1, 2))
    assert calls and all(n == 3 for n in calls)   # m, 1/l and O came from the forward


# Why a pinned Gluon configuration cannot run beside a TMA-read score tile (gluon_launch.launch_refusal).
SCORE_TILE_REFUSALS = ("exceed shared memory", "power-of-two number of consumers")


def _pinned_call(fast, args, tile):
    """``fast(*args)`` with Gluon configuration ``tile`` pinned; skipped where the region's
    TMA-read score tiles rule the configuration out (its buffers do not fit shared memory, or
    three consumers' 192 rows make no TMA block): the tuner never offers it there."""
    from fxflash.runtime import tuning

    try:
        with tuning.pinned(tile):
            return fast(*args)
    except ValueError as exc:
        if any(why in str(exc) for why in SCORE_TILE_REFUSALS):
            pytest.skip(str(exc))
        raise


def _beyond_range_cases():
    from fxflash.variants import diff_attention
    from test_edges import additive_mask, saturated

    return {"finfo_min_mask": (additive_mask(torch.finfo(torch.bfloat16).min), 3),  # batch 1's rows all masked
            "saturated": (saturated(1e9), 3),
            "diff_saturated": (diff_attention, 2)}  # on inputs of 3·10⁴


@needs_hopper
@pytest.mark.parametrize("tile", [*GLUON_CONFIGS[64], *PERSISTENT_CONFIGS[64], *STREAM_CONFIGS[64]],
                         ids=lambda t: "x".join(map(str, t[1:])))
@pytest.mark.parametrize("case", ["finfo_min_mask", "saturated", "diff_saturated"])
def test_gluon_kernel_repairs_rows_beyond_its_range_on_gpu(case, tile):
    """Rows whose maximum leaves the Gluon kernel's multiply-add range (transformers' finfo.min
    mask over a fully padded sequence, logits of 10⁹) are flagged by it and computed again by the
    repair kernel: eager's values, on every configuration."""
    from test_edges import assert_weighted_means

    program, count = _beyond_range_cases()[case]
    if (case == "diff_saturated") != (len(tile) > 7 and tile[7] == 2):
        pytest.skip("two-stream configurations are differential attention's")
    g = torch.Generator(device="cuda").manual_seed(7)
    shape = (2, 8 if case == "diff_saturated" else 4, 512, 64)
    args = [torch.randn(*shape, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    if case == "diff_saturated":
        args = [args[0] * 3e4, args[1] * 3e4, torch.randn(2, 4, 512, 128, generator=g, device="cuda",
                                                          dtype=torch.bfloat16)]
    if count == 3:
        mask = torch.ones(2, 512, device="cuda")
        mask[0, 300:], mask[1] = 0, 0
        args.append(mask)
    fast = fxflash.optimize(program)
    (region,) = fast.report(*args).regions
    assert region.fused and "warp_specialize" in region.gluon_source, region.steps
    out = _pinned_call(fast, args, tile)
    if case == "finfo_min_mask":
        assert_accurate(program, args, out)
    elif case == "saturated":
        assert_weighted_means(out, args[2], program(*args))
    else:
        assert torch.isfinite(out).all()


# Persistent configurations (the tuner's, one with ping-pong); the regions without tile masks.
PERSISTENT_TILES = {64: list(PERSISTENT_CONFIGS[64]),
                    128: list(PERSISTENT_CONFIGS[128])}
PERSISTENT_VARIANTS = ["vanilla", "gqa_expand", "alibi", "softcap", "additive_mask", "bshd", "evoformer_row",
                       "scale_q_first"]


@needs_hopper
@pytest.mark.parametrize("name,d,tile", [(name, d, tile) for name in PERSISTENT_VARIANTS
                                          for d, tiles in PERSISTENT_TILES.items() for tile in tiles],
                         ids=lambda x: x if isinstance(x, (int, str)) else "x".join(map(str, x[1:])))
def test_persistent_gluon_kernel_walks_items_on_gpu(name, d, tile, monkeypatch):
    """A persistent grid of 3 SMs' worth of CTAs walks every work item (8 or more here, so
    each CTA several, its Q buffers and K/V ring reused across items) and keeps eager's
    accuracy; the next call on the full GPU's grid gives the same result bit for bit."""
    from fxflash.runtime import gluon_launch, tuning

    variant = VARIANTS[name]
    args = variant.inputs(GLUON_SHAPES[d], torch.bfloat16, "cuda")
    fast = fxflash.optimize(variant.fn)
    monkeypatch.setattr(fxflash.config, "bind_gluon_launches", False)  # each call computes its grid
    multiprocessors = gluon_launch._multiprocessors
    monkeypatch.setattr(gluon_launch, "_multiprocessors", lambda index: 3)
    few = _pinned_call(fast, args, tile)
    monkeypatch.setattr(gluon_launch, "_multiprocessors", multiprocessors)
    assert_accurate(variant.fn, args, few)
    with tuning.pinned(tile):
        torch.testing.assert_close(fast(*args), few, rtol=0, atol=0, equal_nan=True)


@needs_hopper
@pytest.mark.parametrize("d,tile", [(64, GLUON_CONFIGS[64][0]), (64, GLUON_CONFIGS[64][3]), (128, GLUON_CONFIGS[128][0])],
                         ids=lambda x: x if isinstance(x, int) else "x".join(map(str, x[1:])))
def test_gluon_kernel_reads_heads_inside_long_rows_on_gpu(d, tile):
    """The Evoformer's column attention: Q, K and V are [B, S, H, N_seq, D] views of
    [B, N_seq, S, H, D] tensors, so TMA reads one row per sequence (S·H·D wide) with each
    (residue, head) block at a column of it; 256 sequences make N a multiple of the key tile."""
    from fxflash.runtime import tuning

    fn, args = _column_attention(d)
    (region,) = fxflash.explain(fn, *args).regions
    assert "warp_specialize" in region.gluon_source, region.steps
    with tuning.pinned(tile):
        assert_accurate(fn, args, fxflash.optimize(fn)(*args))


def _column_attention(d):
    """The Evoformer's column attention over 256 sequences (the keys) of 6 residues, 2 heads."""
    g = torch.Generator().manual_seed(5)
    q, k, v, gate = (torch.randn(1, 256, 6, 2, d, generator=g).to(torch.bfloat16).cuda() for _ in range(4))
    mask = (torch.rand(1, 256, 6, generator=g) > 0.2).to(torch.bfloat16).cuda()
    mask[:, 0] = 1
    return VARIANTS["evoformer_col"].fn, (q, k, v, mask, gate)


@needs_hopper
def test_gated_regions_on_persistent_grids_of_every_consumer_count_on_gpu(monkeypatch):
    """Every persistent configuration keeps eager's accuracy call after call on the Evoformer's
    row and column attention (B=1, 256 sequences of 256 residues, 4 heads: 512 items or more on
    the full GPU's grid, so every CTA walks several and reuses its Q buffers and K/V ring).
    Without the proxy fence before the consumers release a buffer they read with ordinary
    loads (gluon._release), two consumers were wrong in 7 of 10 calls on the row attention and
    three with ping-pong in 10 of 10 on the column attention (the 2026-11-24 log).
    The row attention's mask bias is loaded per element here (config.gluon_tma_key_vectors off):
    its ring by TMA leaves two consumers' buffers no room, and the gate's race needs them."""
    from fxflash.runtime import tuning

    monkeypatch.setattr(fxflash.config, "gluon_tma_key_vectors", False)

    g = torch.Generator().manual_seed(6)
    q, k, v, gate = (torch.randn(1, 256, 256, 4, 64, generator=g).to(torch.bfloat16).cuda() for _ in range(4))
    mask = torch.rand(1, 256, 256, generator=g) > 0.2
    mask[:, 0, :] = mask[:, :, 0] = True
    mask = mask.to(torch.bfloat16).cuda()
    pair_bias = torch.randn(1, 1, 4, 256, 256, generator=g).to(torch.bfloat16).cuda()
    cases = {"evoformer_row": (q, k, v, mask, pair_bias, gate), "evoformer_col": (q, k, v, mask, gate)}
    ran = []
    for name, args in cases.items():
        fn = VARIANTS[name].fn
        fast = fxflash.optimize(fn)
        for tile in PERSISTENT_CONFIGS[64]:
            try:
                with tuning.pinned(tile):
                    outs = [fast(*args) for _ in range(10)]
            except ValueError as exc:  # three consumers beside a TMA-read pair bias
                assert any(why in str(exc) for why in SCORE_TILE_REFUSALS), exc
                continue
            for out in outs:
                assert_accurate(fn, args, out)
            ran.append((name, tile[1]))
    assert {("evoformer_row", 2), ("evoformer_col", 3)} <= set(ran), ran


@needs_hopper
@pytest.mark.parametrize("name,tile", [("causal", GLUON_CONFIGS[64][0]), ("vanilla", PERSISTENT_CONFIGS[64][0]),
                                       ("evoformer_row", PERSISTENT_CONFIGS[64][5])],  # 128 rows per consumer
                         ids=lambda x: x if isinstance(x, str) else "x".join(map(str, x[1:])))
def test_a_gluon_launch_is_remembered_and_repeats_the_first_bit_for_bit(name, tile, monkeypatch):
    """The second call of a layout whose tile is a Gluon configuration (one CTA per item, or a
    persistent grid) is a BoundGluonLaunch (no tuner lookup, no launch checks) and gives the
    first call's result bit for bit (a persistent grid of 3 SMs' worth of CTAs: they walk items),
    and so do the calls after it, which take the arguments the key fixes from it and read the
    inputs before their folded views (the Evoformer's transposes and unsqueezes, its pair bias
    and gate by TMA); with new inputs of the same layout it reads them (its descriptors pointed
    at them), and it keeps none of the first call's inputs alive."""
    from fxflash.runtime import gluon_launch, launch
    from fxflash.runtime.op import _REGISTRY

    monkeypatch.setattr(fxflash.config, "bind_gluon_launches", True)
    monkeypatch.setattr(launch, "tile_for", lambda plan, inputs, frame, run, own=None: tile)
    monkeypatch.setattr(gluon_launch, "_multiprocessors", lambda index: 3)
    variant = VARIANTS[name]
    args = variant.inputs(GLUON_SHAPES[64], torch.bfloat16, "cuda")
    fast = fxflash.optimize(variant.fn)
    first = fast(*args)
    launcher = list(_REGISTRY.values())[-1].launcher
    assert [type(b) for b in launcher.bound.values()] == [launch.BoundGluonLaunch]
    for _ in range(2):  # the bound launch's first call, then one from its kept arguments
        torch.testing.assert_close(fast(*args), first, rtol=0, atol=0, equal_nan=True)
    assert_accurate(variant.fn, args, first)
    others = [a.flip(0).clone() if a.is_floating_point() else a for a in args]  # other values, same layout
    assert_accurate(variant.fn, others, fast(*others))
    assert len(launcher.bound) == 1
    firsts = [weakref.ref(a) for a in args if a.is_floating_point()]
    del args, first
    gc.collect()
    assert all(ref() is None for ref in firsts)


@needs_hopper
@pytest.mark.parametrize("name", ["causal", "sliding_window", "prefix_lm", "block_causal", "document_mask",
                                  "key_lengths"])
def test_gluon_kernel_with_folded_full_tiles_on_gpu(name, monkeypatch):
    """``config.gluon_full_tiles``: on (the default) the masks are folded on full tiles
    (``_score_full``, whose accuracy test_generated_gluon_kernel_on_gpu checks); off, every
    visited tile evaluates them and keeps eager's accuracy too."""
    from fxflash.runtime import tuning
    from fxflash.config import config

    variant = VARIANTS[name]
    args = variant.inputs(GLUON_SHAPES[64], torch.bfloat16, "cuda")
    (region,) = fxflash.explain(variant.fn, *args).regions
    assert "def _score_full(" in region.gluon_source, region.steps
    monkeypatch.setattr(config, "gluon_full_tiles", False)
    (region,) = fxflash.explain(variant.fn, *args).regions
    assert "def _score_full(" not in region.gluon_source
    fast = fxflash.optimize(variant.fn)
    for tile in GLUON_CONFIGS[64]:
        with tuning.pinned(tile):
            assert_accurate(variant.fn, args, fast(*args))
