"""What fxflash keeps on disk, and what it trusts there (runtime/cache.py, runtime/tuning.py).

Kernels are compiled from the source the printer made, never imported from a file: a planted
module or bytecode, or a file swapped while kernels load, never runs. The cache directory is
used only where it is this user's alone; ``tuning.json`` is read without following links or
waiting on a FIFO, its entries are checked, and concurrent stores merge under a lock.
"""
import inspect
import json
import multiprocessing
import os
import stat
import sys
import threading

import pytest
import torch

import fxflash
from fxflash.runtime import cache, op, tuning
from fxflash.variants import VARIANTS, Shape
from helpers import assert_fused
from test_tuning import CANDIDATES, FakeGPU, choose

FOREIGN = "import pathlib; pathlib.Path({marker!r}).write_text('ran'); raise SystemExit('foreign code ran')\n"
SHAPE = Shape(B=1, H=2, Hkv=2, M=20, N=24, D=16, Dv=16)


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache directory of this user's, no kernel module or choice remembered."""
    directory = tmp_path / "kc"
    monkeypatch.setattr(fxflash.config, "kernel_cache_dir", str(directory))
    monkeypatch.setattr(fxflash.config, "autotune", True)
    monkeypatch.setattr(cache, "_modules", {})
    tuning.forget()
    yield directory
    tuning.forget()


def _run_vanilla():
    variant = VARIANTS["vanilla"]
    args = variant.inputs(SHAPE)
    optimized = fxflash.optimize(variant.fn)
    out = optimized(*args)
    assert_fused(optimized.report(*args))
    return out


def test_planted_modules_and_bytecode_never_run(fresh, tmp_path, monkeypatch):
    """A ``k_<hash>.py`` and its ``__pycache__`` bytecode planted in the cache directory (and on
    sys.path) are never imported: the kernel runs from the printed source."""
    out = _run_vanilla()
    (key,) = cache._modules
    marker = tmp_path / "marker"
    fresh.mkdir(exist_ok=True)
    planted = fresh / f"k_{key}.py"
    planted.write_text(FOREIGN.format(marker=str(marker)))
    pyc = fresh / "__pycache__" / f"k_{key}.cpython-{sys.version_info.major}{sys.version_info.minor}.pyc"
    pyc.parent.mkdir()
    pyc.write_bytes(b"not bytecode, and never read")
    monkeypatch.syspath_prepend(str(fresh))
    monkeypatch.setattr(cache, "_modules", {})
    torch.testing.assert_close(_run_vanilla(), out)
    assert not marker.exists() and planted.read_text().startswith("import pathlib")
    assert sorted(p.name for p in fresh.iterdir()) == ["__pycache__", f"k_{key}.py"]  # nothing written


@pytest.mark.fusion_independent  # the cache's own rules; no fused kernel is claimed
def test_the_cache_directory_is_created_for_this_user_alone(fresh):
    assert cache.cache_dir() == str(fresh) and stat.S_IMODE(fresh.stat().st_mode) == 0o700


@pytest.mark.fusion_independent  # the cache's own rules; no fused kernel is claimed
def test_files_swapped_while_kernels_load_never_run(fresh, tmp_path):
    """A process that keeps swapping a foreign module in at every name a kernel could have while
    kernels load: none of its code runs, every kernel is the printed one."""
    source = "import triton\nimport triton.language as tl\n@triton.jit\ndef k(x_ptr):\n    tl.store(x_ptr, 1.0)\n"
    key = cache.source_key(source)
    marker = tmp_path / "marker"
    fresh.mkdir(exist_ok=True)
    stop = threading.Event()

    def swapper():
        foreign = FOREIGN.format(marker=str(marker))
        while not stop.is_set():
            for name in (f"k_{key}.py", f"k_{key}.py.tmp"):
                (fresh / name).write_text(foreign)
                os.replace(fresh / name, fresh / f"k_{key}.py")

    thread = threading.Thread(target=swapper)
    thread.start()
    try:
        for _ in range(200):
            cache._modules.clear()
            kernel = cache.load_kernel(source, "k")
            assert "tl.store(x_ptr, 1.0)" in inspect.getsource(kernel.fn)
    finally:
        stop.set()
        thread.join()
    assert not marker.exists()


@pytest.mark.fusion_independent  # the cache's own rules; no fused kernel is claimed
@pytest.mark.parametrize("make", ["world_writable", "group_writable", "a_file", "a_symlink", "a_dangling_link"])
def test_an_untrusted_cache_directory_is_refused_for_a_private_one(make, fresh, tmp_path):
    """A cache directory others can write, a file, or a link in its place is refused with a
    warning; tuning goes to a private directory instead, and the call runs."""
    target = tmp_path / "elsewhere"
    if make.endswith("writable"):
        fresh.mkdir()
        fresh.chmod(0o777 if make == "world_writable" else 0o770)
    elif make == "a_file":
        fresh.write_text("not a directory")
    else:
        if make == "a_symlink":
            target.mkdir(mode=0o700)
        fresh.symlink_to(target)
    with pytest.warns(RuntimeWarning, match="not using the cache directory"):
        assert choose(FakeGPU()) == (128, 128, 8, 3)
    private = cache.cache_dir()
    assert private != str(fresh) and stat.S_IMODE(os.stat(private).st_mode) == 0o700
    assert os.path.exists(os.path.join(private, "tuning.json"))
    assert not (target / "tuning.json").exists()


@pytest.mark.fusion_independent  # the cache's own rules; no fused kernel is claimed
def test_a_directory_owned_by_another_user_is_refused(fresh):
    if os.getuid() != 0:
        pytest.skip("changing a directory's owner needs root")
    fresh.mkdir(mode=0o700)
    os.chown(fresh, 12345, 12345)
    with pytest.warns(RuntimeWarning, match="owned by another user"):
        cache.cache_dir()


@pytest.mark.fusion_independent  # the cache's own rules; no fused kernel is claimed
def test_the_temporary_tuning_file_follows_no_link(fresh, tmp_path):
    """Links planted at the names a temporary tuning file once had lead nowhere: the unrelated
    file they point to keeps its content and mode."""
    fresh.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("unrelated")
    victim.chmod(0o644)
    for pid in range(os.getpid() - 5, os.getpid() + 5):
        (fresh / f"tuning.json.{pid}.tmp").symlink_to(victim)
    choose(FakeGPU())
    assert victim.read_text() == "unrelated" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert json.loads((fresh / "tuning.json").read_text())["entries"]


def _nested(depth):
    return "[" * depth + "]" * depth


@pytest.mark.fusion_independent  # the cache's own rules; no fused kernel is claimed
@pytest.mark.parametrize("config", [7, True, 0.5, "128x64", [128.0, 128.0, 8.0, 3.0], [True, 128, 8, 3], None])
def test_a_corrupt_entry_is_timed_again(config, fresh):
    """An entry whose config is no list of integer tile sizes (an int, a bool, floats that equal
    a candidate's sizes) is not launched: the kernel is timed again."""
    choose(FakeGPU())
    path = fresh / "tuning.json"
    data = json.loads(path.read_text())
    for entry in data["entries"].values():
        entry["config"] = config
    path.write_text(json.dumps(data))
    tuning.forget()
    gpu = FakeGPU()
    assert choose(gpu) == (128, 128, 8, 3) and gpu.timed > 0


@pytest.mark.fusion_independent  # the cache's own rules; no fused kernel is claimed
@pytest.mark.parametrize("make", ["deep", "not_utf8", "directory", "fifo", "dev_zero"])
def test_a_tuning_file_that_is_not_one_is_set_aside(make, fresh):
    """JSON nested 100,000 deep, bytes that are not UTF-8, a directory, a FIFO (never waited on)
    or a link to /dev/zero (never read without bound) in tuning.json's place: set aside with a
    warning, the kernel timed again and the file rewritten."""
    fresh.mkdir(mode=0o700)
    path = fresh / "tuning.json"
    if make == "deep":
        path.write_text(_nested(100_000))
    elif make == "not_utf8":
        path.write_bytes(b'{"version": 2, "entries": {"\xff\xfe": 1}}')
    elif make == "directory":
        path.mkdir()
    elif make == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    with pytest.warns(RuntimeWarning, match="ignoring the tuning cache"):
        assert choose(FakeGPU()) == (128, 128, 8, 3)
    assert json.loads(path.read_text())["version"] == tuning.FORMAT_VERSION


@pytest.mark.fusion_independent  # the cache's own rules; no fused kernel is claimed
def test_an_unwritable_cache_directory_keeps_choices_in_the_process(fresh):
    fresh.mkdir(mode=0o500)
    if os.access(fresh, os.W_OK):
        pytest.skip("this user writes everywhere (root)")
    with pytest.warns(RuntimeWarning, match="not using the cache directory"):
        assert choose(FakeGPU()) == (128, 128, 8, 3)
    fresh.chmod(0o700)


def _store_many(directory, worker, count):
    fxflash.config.kernel_cache_dir = directory
    for i in range(count):
        tuning._store(f"key-{worker}-{i}", {"config": list(CANDIDATES[0])})


@pytest.mark.fusion_independent  # the cache's own rules; no fused kernel is claimed
def test_concurrent_stores_keep_every_entry(fresh):
    """Four processes storing 40 entries each at once: all 160 are in the file (a locked
    read-merge-write)."""
    fresh.mkdir(mode=0o700)
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_store_many, args=(str(fresh), w, 40)) for w in range(4)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(60)
        assert p.exitcode == 0
    entries = json.loads((fresh / "tuning.json").read_text())["entries"]
    assert len(entries) == 160


def test_deleted_callables_free_their_regions():
    """Twelve sequence lengths compile two graphs (Dynamo makes the length dynamic at the second),
    whose regions stay registered while the optimized callable lives; deleting it frees them."""
    import gc

    variant = VARIANTS["vanilla"]
    before = set(op._REGISTRY)
    optimized = fxflash.optimize(variant.fn)
    for n in range(17, 29):
        optimized(*variant.inputs(Shape(B=1, H=2, Hkv=2, M=n, N=n, D=16, Dv=16)))
    gc.collect()
    assert 1 <= len(set(op._REGISTRY) - before) <= 2
    del optimized
    gc.collect()
    assert not set(op._REGISTRY) - before


def test_identical_regions_print_one_source():
    """Two layers' identical attentions print the same kernel source, whatever the graph named
    their nodes: one compilation and one tuning serve both."""
    variant = VARIANTS["vanilla"]
    shape = Shape(B=1, H=2, Hkv=2, M=16, N=16, D=16, Dv=16)

    def two_layers(q, k, v, q2, k2, v2):
        return variant.fn(q, k, v) + variant.fn(q2, k2, v2)

    report = fxflash.explain(two_layers, *variant.inputs(shape), *variant.inputs(shape))
    first, second = assert_fused(report, 2)
    assert first.source == second.source


def test_identical_regions_print_one_backward_source():
    """The backward programs name their values by the FX nodes (``d_div_3_from_where_3``): printed,
    identical layers' backward kernels are one source too."""
    variant = VARIANTS["causal"]
    shape = Shape(B=1, H=2, Hkv=2, M=16, N=16, D=16, Dv=16)

    def two_layers(q, k, v, q2, k2, v2):
        return variant.fn(q, k, v) + variant.fn(q2, k2, v2)

    before = set(op._REGISTRY)
    fast = fxflash.optimize(two_layers)
    args = [t.requires_grad_() for t in (*variant.inputs(shape), *variant.inputs(shape))]
    assert_fused(fast.report(*args), 2)
    fast(*args)
    entries = [op._REGISTRY[key] for key in set(op._REGISTRY) - before]
    assert len(entries) == 2 and entries[0].plan.backward is not None
    assert entries[0].plan.backward.source == entries[1].plan.backward.source


def test_region_keys_name_what_the_region_runs():
    """A region's key is a digest of what it runs (its kernels' sources, the ops it replaces) and
    how many such regions came before: the same code compiled again gets the same digest, the same
    code with another constant another one. So a graph that Inductor's caches reload in a fresh
    process (keyed by the graph, key strings included) calls the regions it was compiled with."""
    def attention(scale):
        return lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1) @ v

    args = VARIANTS["vanilla"].inputs(SHAPE)
    keys = []
    for scale in (0.25, 0.25, 0.5):
        before = set(op._REGISTRY)
        fast = fxflash.optimize(attention(scale))
        assert_fused(fast.report(*args), 1)
        (key,) = set(op._REGISTRY) - before
        keys.append(key.split("#"))
    (first, n), (again, m), (other, _) = keys
    assert first == again and int(m) == int(n) + 1 and other != first
