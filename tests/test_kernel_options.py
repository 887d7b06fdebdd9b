"""The kernel settings travel as one frozen KernelOptions: read once per graph, recorded in the plan."""
import dataclasses

import pytest
import torch

import fxflash
from fxflash.codegen import gluon
from fxflash.codegen.emit import emit_kernel
from fxflash.config import KernelOptions, interpreting, kernel_options
from fxflash.variants import VARIANTS, Shape
from helpers import needs_gluon, region_and_kinds

SHAPE = Shape(B=2, H=4, Hkv=2, M=40, N=48, D=64, Dv=64)  # a head dim the Gluon kernel takes


@pytest.mark.fusion_independent  # prints from a region directly
@needs_gluon
def test_printing_reads_the_options_it_is_given_not_config():
    region, kinds = region_and_kinds(VARIANTS["causal"].fn, *VARIANTS["causal"].inputs(SHAPE, torch.bfloat16))
    options = dataclasses.replace(kernel_options(), row_reciprocal=False, full_tiles=False)
    plan = emit_kernel(region, kinds, options=options)
    gluon.attach(plan, region, kinds)
    assert plan.options is options and plan.gluon.options is options
    with fxflash.config.overridden(row_reciprocal=True, full_tiles=True):
        again = emit_kernel(region, kinds, options=options)
        gluon.attach(again, region, kinds)
    assert again.source == plan.source and again.gluon.source == plan.gluon.source
    assert emit_kernel(region, kinds, options=kernel_options()).source != plan.source


@pytest.mark.fusion_independent
def test_options_are_frozen_and_name_every_kernel_setting_of_config():
    options = kernel_options()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.fold_scale = False
    names = {f.name for f in dataclasses.fields(KernelOptions)} - {"interpreter"}
    assert names <= {f.name for f in dataclasses.fields(fxflash.config)}
    assert all(getattr(options, name) == getattr(fxflash.config, name) for name in names)
    assert options.interpreter == interpreting()


@pytest.mark.fusion_independent  # prints from a region directly
def test_the_interpreters_kernel_is_chosen_by_the_options_not_the_environment(monkeypatch):
    """Where kernels run (Triton's interpreter or a GPU) is one of the options: the interpreter's
    kernel widens bf16 tiles to fp32 before ``tl.dot`` (its bf16 products are wrong) and imports
    no libdevice, whatever TRITON_INTERPRET says while printing; the forward's and the backward's alike."""
    from fxflash.codegen.backward import emit_backward
    from fxflash.codegen.printers import PRINTERS

    region, kinds = region_and_kinds(VARIANTS["causal"].fn, *VARIANTS["causal"].inputs(SHAPE, torch.bfloat16))
    sources = {}
    for interpreter, environment in ((True, "0"), (False, "1")):
        monkeypatch.setenv("TRITON_INTERPRET", environment)
        plan = emit_kernel(region, kinds, options=dataclasses.replace(kernel_options(), interpreter=interpreter))
        sources[interpreter] = (plan.source, emit_backward(region, kinds, plan, PRINTERS).source)
    for source in sources[True]:
        assert "to(tl.float32), " in source and "libdevice" not in source
    for source in sources[False]:
        assert "to(tl.float32), " not in source and "from triton.language.extra import libdevice" in source
