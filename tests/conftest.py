"""Test setup: without a CUDA GPU, generated kernels run in Triton's interpreter.

TRITON_INTERPRET must be set before triton is imported, so it is set here, first.
"""
import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# each test compiles afresh; tests/test_graph_cache.py turns remembered graphs on, in a directory of its own
os.environ.setdefault("FXFLASH_REMEMBER_GRAPHS", "0")

import pytest  # noqa: E402


@pytest.fixture
def device():
    return "cuda" if HAS_CUDA else "cpu"


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run the I-th (from 0) of N interleaved parts of the selected tests, e.g. the GPU "
                          "suite in device calls of limited length: -m gpu --shard 0/3, 1/3, 2/3; several "
                          "parts as I,J/N (.ci/run spreads the CPU suite over two cores so)")
    parser.addoption("--fusion-off-check", action="store_true",
                     help="with FXFLASH_FUSE=0: a test not marked fusion_independent must fail (it checks the "
                          "fused path); it is reported failed if it passes and passed if it fails. The tests "
                          "marked fusion_independent are deselected: the suite runs them as they are")


def pytest_configure(config):
    config.addinivalue_line("markers", "fusion_independent: passes whether or not fxflash fuses (capture, "
                                       "analysis, refusals, tools); --fusion-off-check leaves it out")
    if config.getoption("--fusion-off-check"):
        if os.environ.get("FXFLASH_FUSE") != "0":
            raise pytest.UsageError("--fusion-off-check runs with fusion turned off: set FXFLASH_FUSE=0")
        # a failing property test is the expected outcome here: no shrinking of its examples
        from hypothesis import Phase, settings

        settings.register_profile("fusion_off", phases=[Phase.explicit, Phase.reuse, Phase.generate])
        settings.load_profile("fusion_off")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """--fusion-off-check: a test that claims the fused path must fail with fusion off."""
    outcome = yield
    report = outcome.get_result()
    if not item.config.getoption("--fusion-off-check") or report.when == "teardown" or report.skipped:
        return
    if report.when == "setup":  # a fixture that needs a fused region fails without one: as it should
        if report.failed:
            report.outcome, report.longrepr = "passed", None
        return
    if report.passed:
        report.outcome = "failed"
        report.longrepr = ("passes with fusion turned off (FXFLASH_FUSE=0): it does not check the fused path. "
                           "Check fxflash's report (helpers.assert_fused), or mark it fusion_independent.")
    else:
        report.outcome, report.longrepr = "passed", None


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs
def pytest_collection_modifyitems(config, items):
    if config.getoption("--fusion-off-check"):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("fusion_independent")])
        items[:] = [item for item in items if not item.get_closest_marker("fusion_independent")]
    shard = config.getoption("--shard")
    if shard is None:
        return
    try:
        indices, parts = shard.split("/")
        indices, parts = {int(x) for x in indices.split(",")}, int(parts)
    except ValueError:
        raise pytest.UsageError(f"--shard takes I/N or I,J/N (integers, 0 <= I < N), not {shard!r}") from None
    if not all(0 <= index < parts for index in indices):
        raise pytest.UsageError(f"--shard {shard}: each I must satisfy 0 <= I < N")
    # a module that sets SHARD_WHOLE (its tests read what earlier ones recorded) stays in the part
    # of its first test
    whole: dict = {}
    parts_of = [whole.setdefault(item.module, k % parts) if getattr(item.module, "SHARD_WHOLE", False)
                else k % parts for k, item in enumerate(items)]
    config.hook.pytest_deselected(items=[item for item, part in zip(items, parts_of) if part not in indices])
    items[:] = [item for item, part in zip(items, parts_of) if part in indices]
