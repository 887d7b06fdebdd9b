"""Test setup: without a CUDA GPU, generated kernels run in Triton's interpreter.

TRITON_INTERPRET must be set before triton is imported, so it is set here, first.
"""
import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture
def device():
    return "cuda" if HAS_CUDA else "cpu"


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run the I-th (from 0) of N interleaved parts of the selected tests, e.g. the GPU "
                          "suite in device calls of limited length: -m gpu --shard 0/3, 1/3, 2/3")


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs
def pytest_collection_modifyitems(config, items):
    shard = config.getoption("--shard")
    if shard is None:
        return
    try:
        index, parts = (int(x) for x in shard.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard takes I/N (two integers, 0 <= I < N), not {shard!r}") from None
    if not 0 <= index < parts:
        raise pytest.UsageError(f"--shard {shard}: I must satisfy 0 <= I < N")
    config.hook.pytest_deselected(items=[item for k, item in enumerate(items) if k % parts != index])
    items[:] = [item for k, item in enumerate(items) if k % parts == index]
