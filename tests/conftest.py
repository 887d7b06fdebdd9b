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

import shard_parts  # noqa: E402  (--shard; a plugin of its own for tests/test_shard.py's runs)


@pytest.fixture
def device():
    return "cuda" if HAS_CUDA else "cpu"


def pytest_addoption(parser):
    shard_parts.pytest_addoption(parser)
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
    shard_parts.pytest_collection_modifyitems(config, items)
