"""Every spelling benchmarks/bench_spellings.py times (causal, sliding window, per-batch documents,
key padding, ALiBi: as users write them) fuses into one region and gives eager's answer, at sizes
the interpreter runs; BLOOM's baddbmm spelling in bf16 too (its operands widened to fp32 by torch's
decomposition)."""
import os
import sys

import pytest
import torch

import fxflash
from helpers import assert_accurate, assert_fused

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import bench_spellings as spellings  # noqa: E402

CASES = [(mask, fn) for mask, fns in spellings.MASKS.items() for fn in fns]


@pytest.fixture
def small(monkeypatch):
    for name, value in dict(B=2, H=2, L=40, D=16, W=8, DOCS=3).items():
        monkeypatch.setattr(spellings, name, value)


@pytest.mark.parametrize("mask, fn", CASES, ids=[fn.__name__ for _, fn in CASES])
def test_every_spelling_fuses_and_gives_eagers_answer(small, mask, fn):
    torch.manual_seed(0)
    dtype = torch.bfloat16 if fn is spellings.alibi_baddbmm else torch.float32
    q, k, v = (torch.randn(spellings.B, spellings.H, spellings.L, spellings.D, dtype=dtype) for _ in range(3))
    args = (q, k, v, *spellings._extra(mask, "cpu"))
    fast = fxflash.optimize(fn)
    assert_fused(fast.report(*args))
    assert_accurate(fn, args, fast(*args))
