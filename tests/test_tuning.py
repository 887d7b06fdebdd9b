"""The tile tuner (runtime/tuning.py): picks the fastest candidate, remembers it on disk, reads
it back in a fresh process, and never lets a bad cache file or a failing tile change a result."""
import json
import statistics

import pytest
import torch

import fxflash
from fxflash.runtime import tuning
from fxflash.variants import VARIANTS, Shape
from helpers import assert_accurate

CANDIDATES = [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 2)]
TIMES = {(128, 64, 4, 3): 0.30, (128, 128, 8, 3): 0.20, (64, 64, 4, 2): 0.25}
SOURCE = "@triton.jit\ndef k(): pass\n"
FRAME = [4, 16, 1000, 1000]


class FakeGPU:
    """``run(tile)`` records launches; the clock (``time(fn)``, ``hold(n)``, as
    tuning.CudaClock) runs fn and gives the tile's table time, times ``drift ** launches so
    far`` (a GPU whose clock slows down while it is timed); from the ``SETTLED``-th launch of
    one tile in a row, its ``sustained`` time where given (a GPU at its power limit)."""

    SETTLED = 50

    def __init__(self, times=TIMES, failing=(), drift=1.0, sustained=None):
        self.times, self.failing, self.drift, self.sustained = times, set(failing), drift, sustained or {}
        self.launched, self.timed = [], 0

    def run(self, tile):
        if tile in self.failing:
            raise RuntimeError("out of resources: shared memory")
        self.launched.append(tile)

    def time(self, fn):
        fn()
        tile = self.launched[-1]
        in_a_row = next((i for i, t in enumerate(reversed(self.launched)) if t != tile), len(self.launched))
        table = self.sustained if in_a_row >= self.SETTLED and tile in self.sustained else self.times
        ms = table[tile] * self.drift ** self.timed
        self.timed += 1
        return lambda: ms

    def hold(self, launches):
        pass

    def rest(self, ms):
        self.launched.append(None)   # what ran before no longer heats the GPU


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty tuning cache, tuning on, and no choices remembered by this process."""
    monkeypatch.setattr(fxflash.config, "kernel_cache_dir", str(tmp_path))
    monkeypatch.setattr(fxflash.config, "autotune", True)
    tuning.forget()
    yield tmp_path
    tuning.forget()


def choose(gpu, frame=FRAME, dtypes=(torch.bfloat16,) * 3, device="H200 sm90", capturing=False,
           candidates=CANDIDATES):
    return tuning.choose("fxflash_region", SOURCE, candidates, dtypes, device, frame, gpu.run, gpu,
                         capturing=capturing)



@pytest.mark.fusion_independent
def test_picks_the_fastest_and_a_fresh_process_reads_it_from_disk(fresh):
    gpu = FakeGPU()
    assert choose(gpu) == (128, 128, 8, 3)
    data = json.loads((fresh / "tuning.json").read_text())
    (key, entry), = data["entries"].items()
    assert tuning.MIN_ROUNDS <= entry["rounds"] <= tuning.MAX_ROUNDS and gpu.timed > 0
    assert entry["sustained_ms"] == {}   # no other candidate within CONTENDER_MARGIN of the fastest
    assert entry["config"] == [128, 128, 8, 3] and entry["kernel"] == "fxflash_region"
    assert set(entry["ms"]) == {"x".join(map(str, t)) for t in CANDIDATES}
    assert (fresh / "tuning.json").stat().st_mode & 0o077 == 0

    again = FakeGPU()
    assert choose(again) == (128, 128, 8, 3) and again.timed == 0      # this process remembers
    tuning.forget()                                                     # a new process
    assert choose(again) == (128, 128, 8, 3) and again.timed == 0      # reads tuning.json
    assert tuning.history[-1]["from_disk"]


@pytest.mark.fusion_independent
def test_key_has_size_bucket_dtypes_and_device(fresh):
    key = tuning.tuning_key(SOURCE, [torch.bfloat16], "H200 sm90", [4, 16, 1000, 1000])
    assert key == tuning.tuning_key(SOURCE, [torch.bfloat16], "H200 sm90", [4, 16, 1024, 513 + 500])
    assert tuning.size_bucket([4, 16, 1000, 1000]) == (64, 1024, 1024)
    for other in ([SOURCE + "#", [torch.bfloat16], "H200 sm90", FRAME], [SOURCE, [torch.float16], "H200 sm90", FRAME],
                  [SOURCE, [torch.bfloat16], "H100 sm90", FRAME], [SOURCE, [torch.bfloat16], "H200 sm90", [4, 16, 1025, 1000]]):
        assert tuning.tuning_key(*other) != key
    gpu = FakeGPU()
    choose(gpu)
    choose(gpu, frame=[4, 16, 3000, 3000])            # another bucket: timed again
    assert len(json.loads((fresh / "tuning.json").read_text())["entries"]) == 2


@pytest.mark.fusion_independent
def test_interleaved_rounds_pick_the_fastest_on_a_drifting_clock(fresh):
    """The GPU slows by 0.5 % per launch while it is timed. Timed one candidate after another
    (all of the slowest's samples first), the slowest would look fastest; interleaved rounds
    expose every candidate to the same drift."""
    order = [(128, 64, 4, 3), (64, 64, 4, 2), (128, 128, 8, 3)]   # slowest first, fastest last
    gpu = FakeGPU(drift=1.005)
    assert choose(gpu, candidates=order) == (128, 128, 8, 3)
    rounds = json.loads((fresh / "tuning.json").read_text())["entries"].popitem()[1]["rounds"]
    blocks, medians = FakeGPU(drift=1.005), {}
    for tile in order:  # the same number of samples, one candidate after another
        times = tuning.interleaved_samples({tile: lambda tile=tile: blocks.run(tile)}, blocks, rounds)[tile]
        medians[tile] = statistics.median(times)
    assert min(medians, key=medians.get) == order[0]


@pytest.mark.fusion_independent
def test_contenders_are_decided_by_their_sustained_time(fresh):
    """At full clock 64×64 is 3 % ahead; run continuously (a GPU at its power limit) it is 5 %
    behind: the sustained time decides. The slowest candidate, 25 % behind, is not run sustained."""
    quick = {(128, 64, 4, 3): 1.03, (128, 128, 8, 3): 1.25, (64, 64, 4, 2): 1.00}
    sustained = {(128, 64, 4, 3): 1.05, (64, 64, 4, 2): 1.10}
    gpu = FakeGPU(times=quick, sustained=sustained)
    assert choose(gpu) == (128, 64, 4, 3)
    entry, = json.loads((fresh / "tuning.json").read_text())["entries"].values()
    assert entry["sustained_ms"] == {"128x64x4x3": 1.05, "64x64x4x2": 1.10}
    assert tuning.contenders_of(quick) == [(64, 64, 4, 2), (128, 64, 4, 3)]


@pytest.mark.fusion_independent
def test_a_label_names_its_tile():
    for tile in [(128, 64, 8, 3), ("gluon", 3, 128, 3, 0, 1, 1)]:
        assert tuning.tile_of(tuning._label(tile)) == tile


@pytest.mark.fusion_independent
def test_rounds_rotate_so_no_candidate_always_goes_first():
    firsts = []

    class Recorder(FakeGPU):
        def hold(self, launches):
            self.held = True

        def time(self, fn):
            if getattr(self, "held", False):
                firsts.append(fn)
                self.held = False
            return super().time(fn)

    gpu = Recorder()
    runs = {tile: (lambda tile=tile: gpu.run(tile)) for tile in CANDIDATES}
    samples = tuning.interleaved_samples(runs, gpu, rounds=6)
    assert {tile: len(times) for tile, times in samples.items()} == {tile: 6 for tile in CANDIDATES}
    assert firsts == [runs[t] for t in CANDIDATES] * 2
    assert tuning.rounds_for([1000.0]) == tuning.MIN_ROUNDS and tuning.rounds_for([1e-6]) == tuning.MAX_ROUNDS


@pytest.mark.fusion_independent
def test_stale_entry_and_corrupt_file_are_timed_again(fresh):
    choose(FakeGPU())
    path = fresh / "tuning.json"
    data = json.loads(path.read_text())
    for entry in data["entries"].values():
        entry["config"] = [256, 256, 8, 9]           # not a candidate of this kernel any more
    path.write_text(json.dumps(data))
    tuning.forget()
    gpu = FakeGPU()
    assert choose(gpu) == (128, 128, 8, 3) and gpu.timed > 0

    for unreadable in ("{ not json", json.dumps(dict(data, version=1))):   # version 1: an earlier tuner's picks
        path.write_text(unreadable)
        tuning.forget()
        with pytest.warns(RuntimeWarning, match="ignoring the tuning cache"):
            assert choose(FakeGPU()) == (128, 128, 8, 3)
        assert (fresh / "tuning.json.bad").read_text() == unreadable
        assert json.loads(path.read_text())["version"] == tuning.FORMAT_VERSION


@pytest.mark.fusion_independent
def test_failing_tiles_are_skipped_and_all_failing_is_an_error(fresh):
    gpu = FakeGPU(failing={(128, 128, 8, 3)})
    assert choose(gpu) == (64, 64, 4, 2)
    entry, = json.loads((fresh / "tuning.json").read_text())["entries"].values()
    assert entry["failed"] == ["128x128x8x3"]
    tuning.forget(disk=True)
    with pytest.raises(RuntimeError, match="no tile configuration"):
        choose(FakeGPU(failing=set(CANDIDATES)))


@pytest.mark.fusion_independent
def test_no_timing_when_off_or_while_capturing_a_cuda_graph(fresh, monkeypatch):
    gpu = FakeGPU()
    assert choose(gpu, capturing=True) == CANDIDATES[0]
    monkeypatch.setattr(fxflash.config, "autotune", False)
    assert choose(gpu) == CANDIDATES[0]
    assert gpu.timed == 0 and not (fresh / "tuning.json").exists()


@pytest.mark.fusion_independent
def test_progress_line_names_kernel_and_choice(fresh, capsys, monkeypatch):
    choose(FakeGPU())
    err = capsys.readouterr().err
    assert "fxflash: tuning fxflash_region [4×16×1000×1000]" in err and "128×128 tiles, 8 warps, 3 stages" in err
    tuning.forget(disk=True)
    monkeypatch.setattr(fxflash.config, "progress", False)
    choose(FakeGPU())
    assert capsys.readouterr().err == ""


def test_every_candidate_tile_computes_the_same_attention():
    """Each tile the tuner may pick (here run in the interpreter through ``pinned``) gives
    eager's accuracy, on sizes that are multiples of no tile."""
    variant = VARIANTS["causal"]
    args = variant.inputs(Shape(B=1, H=2, Hkv=2, M=70, N=150, D=16, Dv=16), torch.float32)
    report = fxflash.explain(variant.fn, *args)
    configs = {tile for r in report.regions for tile in r.configs}
    assert len(configs) > 1
    fast = fxflash.optimize(variant.fn)
    for tile in sorted(configs):
        with tuning.pinned(tile):
            assert_accurate(variant.fn, args, fast(*args))


@pytest.mark.fusion_independent
def test_a_dry_launch_records_each_specialization_and_leaves_triton_s_hook_as_it_was(monkeypatch):
    """precompile.specializations: while ``run`` runs, Triton's jit_cache_hook records what each
    launch would compile and stops it (True); another thread's compilation goes to the hook it
    replaced; afterwards Triton's hook is the one it found."""
    import threading
    from types import SimpleNamespace

    from fxflash.runtime import precompile

    knobs = pytest.importorskip("triton").knobs
    if not hasattr(knobs.runtime, "jit_cache_hook"):
        pytest.skip("this Triton has no jit_cache_hook")
    passed = []

    def users_hook(**kwargs):
        passed.append(kwargs["compile"]["specialization_data"])
        return None

    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", users_hook)

    def compile_call(data):
        return knobs.runtime.jit_cache_hook(key=data, repr=data, fn=SimpleNamespace(jit_function=data),
                                            compile={"specialization_data": data}, is_manual_warmup=False,
                                            already_compiled=False)

    stops = []

    def run():
        stops.append(compile_call("tile-a"))
        other = threading.Thread(target=compile_call, args=("elsewhere",))
        other.start()
        other.join()
        stops.append(compile_call("repair"))

    assert precompile.specializations(run) == [("tile-a", "tile-a"), ("repair", "repair")]
    assert stops == [True, True] and passed == ["elsewhere"]
    assert knobs.runtime.jit_cache_hook is users_hook


@pytest.mark.fusion_independent
def test_a_worker_that_cannot_compile_a_job_answers_so_and_serves_the_next():
    """A compile worker (a fresh interpreter) answers every job, a failed one too: the launch then
    compiles that kernel itself, and nothing waits on a worker forever."""
    from fxflash.runtime import precompile

    worker = precompile._Worker()
    try:
        bad = dict(source="x = 1\n", module="fxflash_kernels.k_test", file="<fxflash kernel k_test>", name="k",
                   data="{}")
        assert worker.compile([bad, bad]) == []
        assert worker.alive()
        assert worker._answer_to(bad).startswith("error AttributeError")
    finally:
        worker.close()


@pytest.mark.fusion_independent
def test_a_graph_compiled_by_a_worker_is_loaded_from_inductors_cache(tmp_path, monkeypatch):
    """A region's own ops compiled ahead by a worker (precompile.graph_job) are what the tuner's own
    compilation of them loads (op._inductor_compile): a hit in Inductor's on-disk cache, for inputs
    that are views (their strides and offset sent), with a scalar beside them, and a mask made by
    factory ops of constant arguments (which a pickled GraphModule would hold as a constant)."""
    from torch._dynamo.utils import counters
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxflash.runtime import op, precompile

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    def attention(q, k, v, scale):
        causal = torch.ones(17, 17, dtype=torch.bool).tril()
        return (torch.softmax((q @ k.transpose(-1, -2) * scale).masked_fill(~causal, -1e4), -1) @ v,)

    q, k, v = (torch.randn(2, 3, 17, 24)[..., 4:20] for _ in range(3))
    module = make_fx(attention)(q, k, v, 0.25)
    args = [q, k, v, 0.25]
    worker = precompile._Worker()
    try:
        job = precompile.graph_job(module, args)
        assert job["inputs"][0][1:3] == [list(q.stride()), 4]
        assert worker.compile([job]) == [job]
    finally:
        worker.close()
    counters.clear()
    compiled = op._inductor_compile(module, args)
    assert counters["inductor"]["fxgraph_cache_hit"] == 1 and counters["inductor"]["fxgraph_cache_miss"] == 0, dict(counters["inductor"])
    torch.testing.assert_close(compiled(*args)[0], attention(*args)[0])


@pytest.mark.fusion_independent
def test_a_graph_job_compiles_on_fake_inputs(tmp_path, monkeypatch):
    """A worker compiles a graph job on fake tensors of its inputs' layouts: it holds none of the
    user's GPU memory (compile_worker.compile_graph, run here)."""
    import torch._inductor.config as inductor_config
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxflash.runtime import compile_worker, precompile

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    threads = inductor_config.compile_threads
    made = []
    original = compile_worker._input
    monkeypatch.setattr(compile_worker, "_input", lambda spec: made.append(original(spec)) or made[-1])
    q = torch.randn(2, 3, 17, 16)
    module = make_fx(lambda q, k: (torch.softmax(q @ k.transpose(-1, -2), -1),))(q, q)
    compile_worker.compile_graph(precompile.graph_job(module, [q, q]))
    assert len(made) == 2 and all(isinstance(t, FakeTensor) for t in made)
    assert inductor_config.compile_threads == threads  # one thread while the job compiled, as before after


@pytest.mark.fusion_independent
def test_compilations_started_ahead_are_waited_for_and_never_repeated(monkeypatch):
    """precompile.start records the specializations now and compiles them in a thread of its own;
    compile_all waits for it, then compiles only what was not compiled before, and counts both."""
    import threading
    from types import SimpleNamespace

    from fxflash.runtime import cache, precompile

    monkeypatch.setattr(precompile, "_compiled", set())
    monkeypatch.setattr(precompile, "_started", [])
    monkeypatch.setattr(precompile, "specializations", lambda run: run())
    monkeypatch.setattr(cache, "source_of", lambda module: "source")
    kernel = SimpleNamespace(fn=SimpleNamespace(__module__=precompile.__name__, __name__="kernel"))
    gate, batches = threading.Event(), []

    class Worker:
        def compile(self, jobs):
            gate.wait(10)
            batches.append([job["data"] for job in jobs])
            return jobs

    monkeypatch.setattr(precompile, "start_workers", lambda count: [Worker()])
    precompile.start([lambda: [(kernel, "a")], lambda: [(kernel, "b"), (kernel, "a")]])
    assert batches == [] and len(precompile._started) == 1   # returned before compiling
    threading.Timer(0.2, gate.set).start()
    assert precompile.compile_all([lambda: [(kernel, "a")], lambda: [(kernel, "c")]]) == 2
    assert batches == [["a", "b"], ["c"]] and precompile._started == []


@pytest.mark.fusion_independent
def test_the_tuner_keeps_the_regions_own_ops_only_where_they_are_faster(fresh):
    """tuning.EAGER and COMPILED (the ops run by PyTorch, or compiled by Inductor) are candidates
    like a tile: kept, stored and read back where they are the fastest, passed over where a tile
    is; a choice of one is not handed to a caller that offers the other."""
    for own in tuning.OWN_OPS:
        for own_ms, kept in ((0.1, own), (0.5, (128, 128, 8, 3))):
            tuning.forget(disk=True)
            gpu = FakeGPU(times={**TIMES, own: own_ms})
            assert tuning.choose("fxflash_region", "src", [*CANDIDATES, own], [torch.bfloat16], "GPU",
                                 FRAME, gpu.run, gpu) == kept
            tuning.forget()
            assert tuning.choose("fxflash_region", "src", [*CANDIDATES, own], [torch.bfloat16], "GPU",
                                 FRAME, gpu.run, gpu) == kept   # from tuning.json
        (other,) = set(tuning.OWN_OPS) - {own}
        tuning.forget(disk=True)
        gpu = FakeGPU(times={**TIMES, own: 0.1, other: 0.5})
        assert tuning.choose("fxflash_region", "src", [*CANDIDATES, own], [torch.bfloat16], "GPU",
                             FRAME, gpu.run, gpu) == own
        for forget in (False, True):   # this process's choice, then tuning.json's
            if forget:
                tuning.forget()
            assert tuning.choose("fxflash_region", "src", [*CANDIDATES, other], [torch.bfloat16], "GPU",
                                 FRAME, gpu.run, gpu) == (128, 128, 8, 3)
    assert "PyTorch" in tuning.describe(tuning.EAGER) and "Inductor" in tuning.describe(tuning.COMPILED)


@pytest.mark.fusion_independent
def test_a_candidate_far_slower_at_its_first_launch_is_not_sampled_further(fresh):
    """tuning.OUT_OF_RANGE: one timed launch shows the region's own ops (or a tile) far behind the
    fastest; they are not run in the interleaved rounds, and tuning.json records that launch."""
    slow = (64, 64, 4, 2)
    gpu = FakeGPU(times={**TIMES, slow: TIMES[(128, 128, 8, 3)] * (tuning.OUT_OF_RANGE + 1)})
    assert choose(gpu) == (128, 128, 8, 3)
    assert gpu.launched.count(slow) == 1
    (entry,) = json.loads((fresh / "tuning.json").read_text())["entries"].values()
    assert "64x64x4x2" in entry["ms"]


def test_explain_says_where_the_tuner_kept_the_regions_own_ops(fresh):
    """explain() tells that the tuner times the region's own ops, and at which sizes it kept them
    (a choice of this process or of tuning.json)."""
    from helpers import assert_fused

    variant = VARIANTS["vanilla"]
    args = variant.inputs(Shape(B=1, H=2, Hkv=2, M=20, N=24, D=16, Dv=16), torch.float32, "cpu")
    (region,) = assert_fused(fxflash.explain(variant.fn, *args))
    (line,) = [step for step in region.steps if step.startswith("tuning:")]
    assert "own ops" in line and "kept so" not in line
    tuning._chosen[tuning.tuning_key(region.source, [torch.bfloat16] * 3, "GPU sm90", FRAME)] = tuning.EAGER
    (region,) = assert_fused(fxflash.explain(variant.fn, *args))
    (line,) = [step for step in region.steps if step.startswith("tuning:")]
    assert "kept so at sizes 64x1024x1024" in line


@pytest.mark.fusion_independent
def test_a_choice_of_the_regions_own_ops_is_not_returned_to_a_caller_that_cannot_run_them(fresh):
    """A launch that does not offer tuning.EAGER (its own ops not at hand, or no memory to time
    them) is never handed it from this process's earlier choice: its kernels are timed instead."""
    gpu = FakeGPU(times={**TIMES, tuning.EAGER: 0.1})
    assert choose(gpu, candidates=[*CANDIDATES, tuning.EAGER]) == tuning.EAGER
    assert choose(gpu) == (128, 128, 8, 3)
