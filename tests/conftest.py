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
