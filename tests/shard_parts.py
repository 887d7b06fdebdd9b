"""``--shard I/N``: the selected tests split into N interleaved parts, each run once, for a GPU suite
longer than one call of a lent machine; ``I,J/N`` runs several parts (.ci/run spreads the CPU suite
over two cores so). conftest.py calls these hooks; tests/test_shard.py loads this module alone as a
plugin (``-p shard_parts``), without the suite's imports."""
import pytest


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run the I-th (from 0) of N interleaved parts of the selected tests, e.g. the GPU "
                          "suite in device calls of limited length: -m gpu --shard 0/3, 1/3, 2/3; several "
                          "parts as I,J/N (.ci/run spreads the CPU suite over two cores so)")


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs
def pytest_collection_modifyitems(config, items):
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
