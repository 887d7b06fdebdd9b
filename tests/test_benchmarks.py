"""The benchmark suite's report: ratios, table and plot from a CSV (no GPU needed)."""
import csv
import os
import sys

sys.path[:0] = [os.path.join(os.path.dirname(__file__), "..", "benchmarks", d) for d in ("", "probes")]
import suite  # noqa: E402

import pytest  # noqa: E402
from helpers import compile_for_hopper, needs_gluon, region_and_kinds  # noqa: E402

FIELDS = "suite,variant,B,H,Hkv,M,N,D,Dv,dtype,system,ms,tflops,peak_mb,device,torch,triton".split(",")


def _row(variant, system, ms, M=4096, B=4, D=64, suite_name="softmax"):
    return dict(suite=suite_name, variant=variant, B=B, H=16, Hkv=16, M=M, N=M, D=D, Dv=D, dtype="bf16",
                system=system, ms=ms, tflops="1", peak_mb="1", device="GPU X", torch="2.11", triton="3.6")


def _write_csv(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.mark.fusion_independent
def test_speedups_table_and_plot(tmp_path):
    rows = [_row("causal", "fxflash", "1.0"), _row("causal", "flex_kernel", "1.5"),
            _row("causal", "flex_blockmask", "0.5"), _row("causal", "eager", "nan"),
            _row("diff_attention", "fxflash", "2.0", M=512, B=32, suite_name="beyond"),
            _row("diff_attention", "torch_compile", "5.0", M=512, B=32, suite_name="beyond"),
            _row("evoformer_row", "fxflash", "1.0", B=2048, M=256, suite_name="beyond"),
            _row("evoformer_row", "torch_compile", "0.5", B=2048, M=256, suite_name="beyond")]
    path = _write_csv(tmp_path / "suite_GPU_X.csv", rows)
    table = suite.speedups(rows)
    assert table[("causal", "4k")] == {"flex_kernel": 1.5, "flex+mask": 2.0}   # NaN (out of memory) left out
    assert table[("diff_attention", "512 d64")] == {"torch_compile": 2.5}
    assert table[("evoformer_row", "B=8 d64")] == {"torch_compile": 0.5}
    suite.write_outputs(str(path))
    text = (tmp_path / "suite_GPU_X.md").read_text()
    assert "| causal | 4k |" in text and "2.00×" in text and "GPU X" in text
    assert (tmp_path / "suite_GPU_X.png").stat().st_size > 10_000


@pytest.mark.fusion_independent
def test_roofline_floors_and_what_a_target_needs(tmp_path):
    """roofline.py: the floor is the busiest unit's time for the work one fused pass cannot avoid
    (every score's Q·Kᵀ and every stream's P·V on the tensor cores; inputs and output once
    through HBM; exponentials on the special-function unit), and a target ``r×`` faster than a
    system needs floor / (its ms / r) of the GPU — above 1: unreachable."""
    import roofline

    peaks = {"tensor": 1e15, "hbm": 1e12, "mufu": 1e13}
    s = roofline.Shape(b=1, h=16, hkv=16, m=16384, n=16384, d=64, dv=64)
    flops = 4 * 16 * 16384 ** 2 * 64
    assert roofline.WORK["vanilla"](s).flops == flops
    assert roofline.floor_ms(roofline.WORK["vanilla"](s), peaks) == (flops / 1e15 * 1e3, "tensor")
    diff = roofline.Shape(b=1, h=32, hkv=32, m=512, n=512, d=64, dv=128)   # both streams' P·V
    assert roofline.WORK["diff_attention"](diff).flops == 2 * 32 * 512 ** 2 * (64 + 128)
    evo = roofline.Shape(b=2048, h=4, hkv=4, m=256, n=256, d=64, dv=64)    # memory-bound
    assert roofline.floor_ms(roofline.WORK["evoformer_row"](evo), peaks)[1] == "hbm"

    rows = [_row("diff_attention", "fxflash", "2.0", M=512, B=32, suite_name="beyond"),
            _row("diff_attention", "torch_compile", "3.0", M=512, B=32, suite_name="beyond")]
    for r in rows:
        r.update(H=32, Hkv=32, Dv=128)
    peaks_path = tmp_path / "peaks.csv"
    peaks_path.write_text("quantity,value,unit,device,torch,triton\nmatmul_tflops,1e-3,TFLOP/s,X,,\n"
                          "hbm_tb_s,1,TB/s,X,,\nexp2_per_s,1e12,1/s,X,,\n")
    cases = roofline.read_cases(str(_write_csv(tmp_path / "suite.csv", rows)))
    (row,) = roofline.rows(cases, roofline.read_peaks(str(peaks_path)))
    floor = 2 * 32 * 32 * 512 ** 2 * 192 / 1e9 * 1e3       # 1 GFLOP/s: a floor of seconds
    assert row["unit"] == "tensor" and abs(row["floor"] - floor) < 1e-6 * floor
    needs = {(issue, ratio): need for issue, ratio, _, _, need in row["targets"]}
    assert abs(needs[(4, 3.0)] - floor / (3.0 / 3.0)) < 1e-6 * floor
    assert "**" in roofline.table([row])                       # a target over 100 % is marked
    assert "SDPA" not in roofline.table([row])                 # no attention rate in the peaks

    # with SDPA's rate at half the matmul's, a tensor-bound target asks for twice its share of it
    peaks_path.write_text(peaks_path.read_text() + "attention_tflops,5e-4,TFLOP/s,X,,\n")
    (row,) = roofline.rows(cases, roofline.read_peaks(str(peaks_path)))
    assert f"({2 * needs[(4, 3.0)]:.2f}× SDPA)" in roofline.table([row])
    (evo_row,) = roofline.rows({("evoformer_row", evo): {"fxflash": 1.0, "torch_compile": 5.0}},
                               {**peaks, "attention": 5e14})
    assert evo_row["unit"] == "hbm" and "SDPA" not in roofline.table([evo_row])   # not tensor-bound


@pytest.mark.fusion_independent
def test_only_a_part_is_measured_again(tmp_path):
    """``suite.py --only`` drops the rows of the parts it names (softmax: at its seqlens) and
    keeps every other row, so that the part is measured again rather than skipped."""
    rows = [_row("causal", "fxflash", "1.0"), _row("causal", "fxflash", "3.0", M=16384, B=1),
            _row("relu_attention", "fxflash", "1.0", suite_name="beyond"),
            _row("evoformer_row", "fxflash", "1.0", B=2048, M=256, suite_name="beyond")]
    path = _write_csv(tmp_path / "suite_GPU_X.csv", rows)
    suite.drop_part(str(path), ["softmax", "non_softmax"], [16384])
    with open(path, newline="") as f:
        kept = [(r["variant"], r["M"]) for r in csv.DictReader(f)]
    assert kept == [("causal", "4096"), ("evoformer_row", "256")]


def test_probe_edits_keep_each_kernel_s_result(monkeypatch):
    """Each of probe_edits' hand edits of a printed kernel computes what the printed kernel
    computes (interpreter, fp32), on the Evoformer's kernel and on differential attention's
    (two score streams), wherever it applies, and applies to one of them at least: the probe
    compares timings of equal programs. An edit that stands for one of several programs
    (``half_dv``) computes its part: the first half of each head's Dv (both outputs end in
    the head dim). Edits in inline PTX (``gpu_only``) are only checked to apply. The kernels are
    printed as the edits were written for them: the Evoformer's mask bias computed by eager and
    loaded (config.vector_producers off)."""
    import torch

    import fxflash
    from fxflash import variants as V
    from fxflash.runtime import op as region_op

    import probe_edits

    monkeypatch.setattr(fxflash.config, "vector_producers", False)
    g = torch.Generator().manual_seed(0)
    B, N_seq, S, H, D = 1, 3, 40, 2, 16
    evo = (*(torch.randn(B, N_seq, S, H, D, generator=g) for _ in range(3)),
           (torch.rand(B, N_seq, S, generator=g) > 0.2).float(), torch.randn(B, 1, H, S, S, generator=g),
           torch.randn(B, N_seq, S, H, D, generator=g))
    diff = (torch.randn(1, 4, 40, D, generator=g), torch.randn(1, 4, 50, D, generator=g),
            torch.randn(1, 2, 50, 2 * D, generator=g))
    applied = set()
    for fn, args in ((V.evoformer_row, evo), (V.diff_attention, diff)):
        fast = fxflash.optimize(fn)
        before = set(region_op._REGISTRY)
        printed_out = fast(*args)
        # the region the call runs: differential attention's twin registers one more, for its backward
        entries = [region_op._REGISTRY[k] for k in set(region_op._REGISTRY) - before]
        (entry,) = [e for e in entries if e.plan.twin is not None] if len(entries) > 1 else entries
        printed = entry.plan.source
        for name, edit in probe_edits.EDITS.items():
            try:
                source = edit(printed)
            except ValueError:  # nothing to change in this kernel
                continue
            applied.add(name)
            assert source != printed
            if getattr(edit, "gpu_only", False):  # inline PTX: the interpreter cannot run it
                continue
            probe_edits.swap_kernel(entry, source)
            part = ... if getattr(edit, "programs", 1) == 1 else (..., slice(0, printed_out.size(-1) // 2))
            torch.testing.assert_close(fast(*args)[part], printed_out[part], rtol=1e-5, atol=1e-5)
        probe_edits.swap_kernel(entry, printed)
    assert applied == set(probe_edits.EDITS)


@pytest.mark.fusion_independent
def test_probe_core_loop_switches_keep_attention():
    """probe_core_loop's hand kernel computes softmax attention with each switch that runs
    without a GPU (pointer loads; LAZY, AHEAD, EMU alone): the probe times equal programs.
    EMU's polynomial exp2 is within its 1.4e-4 relative error."""
    import torch

    import probe_core_loop

    g = torch.Generator().manual_seed(0)
    B, H, S, D = 1, 2, 256, 64
    q, k, v = (torch.randn(B, H, S, D, generator=g) for _ in range(3))
    ref = torch.softmax(q @ k.transpose(-1, -2) / 8, -1) @ v
    for switches in probe_core_loop.SWITCHES:
        if switches["DESC"] or switches["WS"]:  # TMA descriptors and warp specialization: GPU only
            continue
        out = torch.empty_like(q)
        probe_core_loop._probe_attention[(S // 64, B * H)](q, k, v, out, B * H, S, 0.125 * 1.4426950408889634,
                                                           D=D, BLOCK_M=64, BLOCK_N=64, **switches)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-3 if switches["EMU"] else 1e-5)


# probe_gluon_edits' hand edits, each with a kernel it was measured on (variant, Gluon tile, head
# dim, and whether the score's tiles and the gate come by TMA: config.gluon_tma_tiles; the mask
# bias computed by eager and loaded per element, as before config.vector_producers and
# config.gluon_tma_key_vectors: bias_ahead moves that load)
GLUON_EDITS = [
    ("hoist_key_linear", "alibi", (2, 128, 3, 0, 1), 64, False),
    ("magic_int_to_float", "alibi", (3, 128, 3, 0, 1), 64, True),
    ("bias_ahead", "evoformer_row", (1, 128, 2, 0, 2, 1), 64, False),
    ("bias_ahead", "evoformer_row", (1, 128, 2, 0, 2, 1), 64, True),   # the mask bias alone
    ("bias_ahead_tile", "evoformer_row", (1, 128, 2, 0, 2, 1), 64, False),
    ("bias_async", "evoformer_row", (1, 128, 2, 0, 2, 1), 64, False),
    ("gate_early", "evoformer_row", (1, 128, 3, 0, 2, 1), 64, False),
    ("gate_first", "evoformer_row", (1, 128, 3, 0, 2, 1), 64, False),
    ("gate_prefetch", "evoformer_row", (1, 128, 2, 0, 2, 1), 64, True),
    ("q_scale_on_scores", "evoformer_row", (1, 64, 2, 0, 2, 1), 128, True),
    ("no_tile_loads", "evoformer_row", (1, 128, 2, 0, 2, 1), 64, True),
    ("chunked_items+bias_order+resident_tiles", "evoformer_row", (1, 128, 2, 0, 2, 1), 64, True),
    ("no_release_fence", "evoformer_row", (2, 128, 3, 0, 1, 1), 64, True),
    ("without:x1,x3,x6", "evoformer_row", (1, 128, 3, 0, 2, 1), 64, False),
    ("no_store", "evoformer_row", (1, 128, 2, 0, 2, 1), 64, True),
]
EVERY_KERNEL_EDITS = {"no_store"}  # edits that change vanilla's kernel too


def _gluon_source(name: str, tma: bool = False, d: int = 64) -> str:
    """``name``'s printed Gluon kernel at head dim ``d``, with per-element loads unless ``tma``
    (config.gluon_tma_tiles: the probe's bias_* edits move those loads; ``--per-element-loads``)."""
    import torch

    from fxflash import config
    from fxflash.codegen.gluon import emit_gluon
    from fxflash.variants import VARIANTS, Shape

    args = VARIANTS[name].inputs(Shape(B=2, H=4, Hkv=2, M=256, N=256, D=d, Dv=d), torch.bfloat16)
    with config.overridden(gluon_tma_tiles=tma, gluon_tma_key_vectors=False, vector_producers=False):
        return emit_gluon(*region_and_kinds(VARIANTS[name].fn, *args)).source


@pytest.mark.fusion_independent
@needs_gluon
@pytest.mark.parametrize("edit, variant, tile, d, tma", GLUON_EDITS)
def test_probe_gluon_edits_compile_for_hopper(edit, variant, tile, d, tma):
    """Each of probe_gluon_edits' hand edits changes the Gluon kernel it was measured on and the
    edited kernel compiles for sm_90 (tests/gluon_compile.py, no GPU); in vanilla's kernel,
    which has neither a bias, a gate nor a scale on Q, it finds nothing to change and says so
    (but for EVERY_KERNEL_EDITS)."""
    import probe_gluon_edits

    if edit not in EVERY_KERNEL_EDITS:
        with pytest.raises(ValueError, match="nothing to change"):
            probe_gluon_edits.edit_named(edit)(_gluon_source("vanilla", tma, d))
    assert probe_gluon_edits.edit_named(edit)(_gluon_source(variant, tma, d)) != _gluon_source(variant, tma, d)
    compiled = compile_for_hopper(variant, "bfloat16", d, tile, edit, FXFLASH_GLUON_TMA_TILES=str(int(tma)),
                                  FXFLASH_GLUON_TMA_KEY_VECTORS="0", FXFLASH_VECTOR_PRODUCERS="0")
    assert f"compiled {variant} edited by {edit}" in compiled, compiled


@pytest.mark.fusion_independent
def test_ab_setting_holds_each_side_s_settings_in_its_calls(monkeypatch):
    """ab_setting's sides A and B each run with their settings in every call, not only at the
    first (``config.gluon`` is read at each launch: both sides once timed the same kernel); the
    process's settings are left as they were."""
    import ab_setting

    import fxflash

    seen = []
    monkeypatch.setattr(ab_setting.fxflash, "optimize", lambda fn: (lambda *args: seen.append(fxflash.config.gluon)))
    monkeypatch.setattr(ab_setting.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(ab_setting, "check_fused", lambda *args: None)
    before = fxflash.config.gluon
    a = ab_setting.compiled_with(None, (), ["gluon"], False)
    b = ab_setting.compiled_with(None, (), ["gluon"], True)
    a(), b(), a()
    assert seen == [False, True, False, True, False] and fxflash.config.gluon == before


def test_a_benchmark_records_no_fxflash_row_that_did_not_fuse():
    """bench_attention and ab_setting time an fxflash call only after its own report says every
    region fused; a call that runs eagerly is refused with the rule that stopped it."""
    import torch
    from bench_attention import check_fused

    import fxflash
    from fxflash import variants

    args = tuple(torch.randn(1, 2, 16, 16) for _ in range(3))
    check_fused(fxflash.optimize(variants.vanilla), args, "vanilla")
    with fxflash.config.overridden(fuse=False), pytest.raises(AssertionError, match="did not fuse: config"):
        check_fused(fxflash.optimize(variants.vanilla), args, "vanilla")


@pytest.mark.parametrize("q_len", [1, 5])
@pytest.mark.parametrize("name", ["vanilla", "causal", "softcap", "sliding_window"])
def test_decode_steps_fuse_with_their_masks_aligned_to_the_end_of_the_cache(name, q_len):
    """decode.py's steps (GQA by repeat_kv, q_len new queries at the cache's last positions) fuse,
    and match the same attention over the whole sequence, of which they are the last rows."""
    import torch
    from decode import decode_case

    import fxflash
    from fxflash import variants

    fn, (q, k, v), *_, sdpa = decode_case(name, 1, 4, 2, q_len, 40, 16, "cpu", torch.float32, window=8)
    fast = fxflash.optimize(fn)
    assert [r.fused for r in fast.report(q, k, v).regions] == [True]
    # the whole sequence: queries at every position, the masks aligned to the first key
    whole = torch.randn(1, 4, 40, 16, generator=torch.Generator().manual_seed(2))
    whole[:, :, -q_len:] = q
    full = {"vanilla": variants.vanilla, "causal": variants.causal, "softcap": variants.softcap,
            "sliding_window": lambda q, k, v: variants.sliding_window(q, k, v, window=8)}[name]
    expected = full(whole, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))[:, :, -q_len:]
    if name == "vanilla":   # no mask: every row sees every key, whatever its position
        expected = full(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    torch.testing.assert_close(fast(q, k, v), expected, atol=1e-5, rtol=1e-5)
    if sdpa is not None:
        torch.testing.assert_close(sdpa(q, k, v), expected, atol=1e-5, rtol=1e-5)
