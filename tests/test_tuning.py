"""The tile tuner (codegen/tuning.py): picks the fastest candidate, remembers it on disk, reads
it back in a fresh process, and never lets a bad cache file or a failing tile change a result."""
import json

import pytest
import torch

import fxflash
from fxflash.codegen import tuning
from fxflash.variants import VARIANTS, Shape
from helpers import assert_accurate

CANDIDATES = [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 2)]
TIMES = {(128, 64, 4, 3): 0.30, (128, 128, 8, 3): 0.20, (64, 64, 4, 2): 0.25}
SOURCE = "@triton.jit\ndef k(): pass\n"
FRAME = [4, 16, 1000, 1000]


class FakeGPU:
    """``run(tile)`` records launches; ``timer(fn)`` runs fn and returns the tile's table time."""

    def __init__(self, times=TIMES, failing=()):
        self.times, self.failing = times, set(failing)
        self.launched, self.timed = [], 0

    def run(self, tile):
        if tile in self.failing:
            raise RuntimeError("out of resources: shared memory")
        self.launched.append(tile)

    def timer(self, fn):
        self.timed += 1
        fn()
        return self.times[self.launched[-1]]


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty tuning cache, tuning on, and no choices remembered by this process."""
    monkeypatch.setattr(fxflash.config, "kernel_cache_dir", str(tmp_path))
    monkeypatch.setattr(fxflash.config, "autotune", True)
    tuning.forget()
    yield tmp_path
    tuning.forget()


def choose(gpu, frame=FRAME, dtypes=(torch.bfloat16,) * 3, device="H200 sm90", capturing=False):
    return tuning.choose("fxflash_region", SOURCE, CANDIDATES, dtypes, device, frame, gpu.run, gpu.timer,
                         capturing=capturing)


def test_picks_the_fastest_and_a_fresh_process_reads_it_from_disk(fresh):
    gpu = FakeGPU()
    assert choose(gpu) == (128, 128, 8, 3)
    assert gpu.timed == len(CANDIDATES) * tuning.ROUNDS
    data = json.loads((fresh / "tuning.json").read_text())
    (key, entry), = data["entries"].items()
    assert entry["config"] == [128, 128, 8, 3] and entry["kernel"] == "fxflash_region"
    assert set(entry["ms"]) == {"x".join(map(str, t)) for t in CANDIDATES}
    assert (fresh / "tuning.json").stat().st_mode & 0o077 == 0

    again = FakeGPU()
    assert choose(again) == (128, 128, 8, 3) and again.timed == 0      # this process remembers
    tuning.forget()                                                     # a new process
    assert choose(again) == (128, 128, 8, 3) and again.timed == 0      # reads tuning.json
    assert tuning.history[-1]["from_disk"]


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
    assert gpu.timed == 2 * len(CANDIDATES) * tuning.ROUNDS


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

    path.write_text("{ not json")
    tuning.forget()
    with pytest.warns(RuntimeWarning, match="ignoring the tuning cache"):
        assert choose(FakeGPU()) == (128, 128, 8, 3)
    assert (fresh / "tuning.json.bad").exists()
    assert json.loads(path.read_text())["version"] == tuning.FORMAT_VERSION


def test_failing_tiles_are_skipped_and_all_failing_is_an_error(fresh):
    gpu = FakeGPU(failing={(128, 128, 8, 3)})
    assert choose(gpu) == (64, 64, 4, 2)
    entry, = json.loads((fresh / "tuning.json").read_text())["entries"].values()
    assert entry["failed"] == ["128x128x8x3"]
    tuning.forget(disk=True)
    with pytest.raises(RuntimeError, match="no tile configuration"):
        choose(FakeGPU(failing=set(CANDIDATES)))


def test_no_timing_when_off_or_while_capturing_a_cuda_graph(fresh, monkeypatch):
    gpu = FakeGPU()
    assert choose(gpu, capturing=True) == CANDIDATES[0]
    monkeypatch.setattr(fxflash.config, "autotune", False)
    assert choose(gpu) == CANDIDATES[0]
    assert gpu.timed == 0 and not (fresh / "tuning.json").exists()


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
