"""optimize() and torch.compile(backend="fxflash") return what eager returns."""
import importlib.metadata
import os
import subprocess
import sys

import pytest
import torch

import fxflash
from fxflash.backend import recent_reports
from fxflash.variants import VARIANTS, Shape
from helpers import assert_fused

SHAPE = Shape(B=2, H=4, Hkv=2, M=9, N=13, D=8, Dv=8)


def _close(out, ref):
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


# programs without an attention chain (an MLP, a layer norm, a softmax over the queries) fuse nothing
# whether or not fusion is on
CASES = [pytest.param(name, marks=[pytest.mark.fusion_independent] if not v.chains else []) for name, v in VARIANTS.items()]


@pytest.mark.parametrize("name", CASES, ids=str)
def test_optimize_matches_eager(name):
    variant = VARIANTS[name]
    args = variant.inputs(SHAPE)
    fast = fxflash.optimize(variant.fn)
    _close(fast(*args), variant.fn(*args))
    assert_fused(fast.report(*args), variant.chains)


@pytest.mark.parametrize("name", CASES, ids=str)
def test_compile_backend_eager_inner_matches_eager(name):
    torch._dynamo.reset()
    variant = VARIANTS[name]
    args = variant.inputs(SHAPE)
    compiled = torch.compile(variant.fn, backend="fxflash", options={"inner": "eager"})
    _close(compiled(*args), variant.fn(*args))
    assert sum(len([r for r in report.regions if r.fused]) for report in _reports_of(compiled, args)) == variant.chains


def _reports_of(compiled, args) -> list:
    """The reports of the graphs the backend compiled for one call (Dynamo may split it)."""
    torch._dynamo.reset()
    recent_reports.clear()
    compiled(*args)
    return list(recent_reports)


@pytest.mark.parametrize("name", ["vanilla", "evoformer_row"])
def test_compile_backend_with_inductor_matches_eager(name):
    torch._dynamo.reset()
    variant = VARIANTS[name]
    args = variant.inputs(SHAPE)
    _close(torch.compile(variant.fn, backend="fxflash")(*args), variant.fn(*args))
    assert_fused(recent_reports[-1])


@pytest.mark.fusion_independent  # which compiler runs the rest, fused or not
def test_optimize_runs_the_rest_with_inductor_on_a_gpu_and_eagerly_on_a_cpu():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fxflash.backend import _resolved

    with FakeTensorMode():
        on_gpu = torch.empty(2, device="cuda")
    assert _resolved("auto", [on_gpu, 3]) == "inductor"
    assert _resolved("auto", [torch.ones(2), 3]) == "eager"
    assert _resolved("eager", [on_gpu]) == "eager"
    args = VARIANTS["vanilla"].inputs(SHAPE)
    report = fxflash.optimize(VARIANTS["vanilla"].fn).report(*args)
    assert report.inner == "eager" and "the rest of the graph: eager PyTorch" in str(report)
    torch._dynamo.reset()
    torch.compile(VARIANTS["vanilla"].fn, backend="fxflash")(*args)
    assert recent_reports[-1].inner == "inductor"


def test_backend_factory_and_bad_options():
    torch._dynamo.reset()
    args = VARIANTS["vanilla"].inputs(SHAPE)
    compiled = torch.compile(VARIANTS["vanilla"].fn, backend=fxflash.backend(inner="eager"))
    _close(compiled(*args), VARIANTS["vanilla"].fn(*args))
    assert_fused(recent_reports[-1])
    with pytest.raises(ValueError, match="inner must be one of"):
        fxflash.backend(inner="tvm")


@pytest.mark.fusion_independent
@pytest.mark.fusion_independent
def test_entry_point_is_declared():
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    assert "fxflash" in eps.names


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter serves machines without a CUDA GPU")
def test_fxflash_imported_after_triton_still_runs_its_kernels_in_the_interpreter():
    """transformers and torch.compile import triton before fxflash is imported: the kernels fxflash
    defines afterwards, and triton.language's functions they call (``tl.cdiv``, ``tl.max``), still
    run in Triton's interpreter, forward and backward, with no fallback to eager."""
    code = (
        "import os, warnings\n"
        "os.environ.pop('TRITON_INTERPRET', None)\n"
        "import triton.language, torch\n"
        "warnings.simplefilter('error', RuntimeWarning)\n"
        "import fxflash\n"
        "from fxflash.variants import VARIANTS, Shape\n"
        "v = VARIANTS['causal']\n"
        "args = [a.requires_grad_() for a in v.inputs(Shape(B=1, H=2, Hkv=2, M=9, N=13, D=8, Dv=8))]\n"
        "fast = fxflash.optimize(v.fn)\n"
        "assert all(r.fused and r.backward == 'fused' for r in fast.report(*args).regions)\n"
        "grads = torch.autograd.grad(fast(*args).sum(), args)\n"
        "for got, want in zip(grads, torch.autograd.grad(v.fn(*args).sum(), args)):\n"
        "    torch.testing.assert_close(got, want)\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"


@pytest.mark.fusion_independent
def test_backend_works_without_importing_fxflash():
    code = (
        "import sys, torch\n"
        "f = torch.compile(lambda x: torch.softmax(x, -1) * 2, backend='fxflash', options={'inner': 'eager'})\n"
        "x = torch.randn(3, 4)\n"
        "torch.testing.assert_close(f(x), torch.softmax(x, -1) * 2)\n"
        "print('ok')\n"
    )
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.fusion_independent
def test_explain_report():
    variant = VARIANTS["diff_attention_chunked"]
    report = fxflash.explain(variant.fn, *variant.inputs(SHAPE))
    assert len(report.regions) == 2
    text = str(report)
    assert "candidate region" in text and "amax" in text
    for region in report.regions:
        assert region.status in ("fused", "not fused")
        assert region.fused or region.reason
        assert any(s.startswith("[(") for s in region.sketches.values())
    assert isinstance(report.graph, torch.fx.GraphModule)


@pytest.mark.fusion_independent
def test_config_overridden_restores_settings_and_names_unknown_ones():
    before = (fxflash.config.gluon, fxflash.config.autotune)
    with pytest.raises(RuntimeError, match="inside"):
        with fxflash.config.overridden(gluon=not before[0], autotune=not before[1]) as config:
            assert (config.gluon, config.autotune) == (not before[0], not before[1])
            raise RuntimeError("inside")
    assert (fxflash.config.gluon, fxflash.config.autotune) == before
    with pytest.raises(AttributeError, match="no setting 'glun'.*block_sparsity"):
        with fxflash.config.overridden(glun=False):
            pass
