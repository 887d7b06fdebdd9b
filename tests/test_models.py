"""Hugging Face transformers models as they come, through optimize() and the backend.

Tiny random-initialised configs (2 layers, hidden 64, fp32; transformers' eager attention, and its
sdpa attention where the model has one) on CPU. For each architecture, through ``fxflash.optimize``
and ``torch.compile(backend="fxflash")``, with and without padding: every attention fuses (counted
from fxflash's own reports), the logits match eager's, ``generate()`` gives eager's tokens with a
DynamicCache and a StaticCache, and one training step's gradients match eager's.
"""
from __future__ import annotations

import contextlib
import functools

import pytest
import torch

transformers = pytest.importorskip("transformers")

import fxflash  # noqa: E402
from fxflash.backend import recording  # noqa: E402

LAYERS = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=128)
AUTO = {"causal": "AutoModelForCausalLM", "encoder": "AutoModel", "seq2seq": "AutoModelForSeq2SeqLM",
        "speech": "AutoModelForSpeechSeq2Seq"}
# model type → (kind, config, attentions per forward call, as fxflash counts regions)
MODELS = {
    "gpt2": ("causal", dict(n_layer=2, n_embd=64, n_head=4, vocab_size=128, bos_token_id=1, eos_token_id=2), 2),
    "llama": ("causal", dict(LAYERS, num_key_value_heads=2), 2),
    "mistral": ("causal", dict(LAYERS, num_key_value_heads=2, sliding_window=8), 2),
    "gemma2": ("causal", dict(LAYERS, num_key_value_heads=2, head_dim=16, sliding_window=8), 2),
    "qwen2": ("causal", dict(LAYERS, num_key_value_heads=2), 2),
    "diffllama": ("causal", dict(LAYERS, num_key_value_heads=2), 4),  # two softmax streams per layer
    "falcon": ("causal", dict(LAYERS, num_kv_heads=2, new_decoder_architecture=True), 2),
    "gpt_neox": ("causal", dict(LAYERS), 2),
    "bloom": ("causal", dict(n_layer=2, hidden_size=64, n_head=4, vocab_size=128), 2),
    "bert": ("encoder", dict(LAYERS), 2),
    "roberta": ("encoder", dict(LAYERS), 2),
    "vit": ("encoder", dict(LAYERS, image_size=32, patch_size=8), 2),
    "t5": ("seq2seq", dict(num_layers=2, num_decoder_layers=2, d_model=64, d_ff=128, num_heads=4, d_kv=16,
                           vocab_size=128, decoder_start_token_id=0), 6),
    "whisper": ("speech", dict(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
                               decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=128,
                               num_mel_bins=16, max_source_positions=16, max_target_positions=32,
                               pad_token_id=1, bos_token_id=2, eos_token_id=2, decoder_start_token_id=2), 6),
}
# Where a graph cannot be traced to ATen (it then runs as Dynamo captured it, with a warning).
NOT_TRACED_IN_TRAINING = {
    "bloom": "custom_function_call",  # its GELU is an autograd.Function in training mode
}
# The attentions of one decoder call, for seq2seq generation: generate() runs the encoder once, apart.
DECODER_ATTENTIONS = {"t5": 4}
DROPOUTS = ("attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout", "attention_dropout", "dropout",
            "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout_rate", "activation_dropout")
AVAILABLE = [name for name in MODELS if name in transformers.models.auto.configuration_auto.CONFIG_MAPPING]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Dynamo keeps compiled frames on the model classes' code objects, eight each at most: each test
    starts from none (as a process would), not from the earlier tests' models."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@functools.lru_cache(maxsize=None)
def _config(name: str, attention: str = "eager"):
    kind, settings, _ = MODELS[name]
    config = transformers.AutoConfig.for_model(name, **settings)
    for attr in DROPOUTS:  # a training step compares gradients: no randomness
        if isinstance(getattr(config, attr, None), float):
            setattr(config, attr, 0.0)
    config._attn_implementation = attention
    return config


def _model(name: str, attention: str = "eager") -> torch.nn.Module:
    """The model, its attention transformers' ``eager`` or ``sdpa`` implementation (the latter's
    ``scaled_dot_product_attention`` calls fxflash reads as their math form)."""
    torch.manual_seed(0)
    auto = getattr(transformers, AUTO[MODELS[name][0]])
    try:
        return auto.from_config(_config(name, attention)).eval()
    except ValueError as exc:  # transformers' own refusal: "does not support an attention implementation …"
        pytest.skip(f"{name}: {exc}")


def _inputs(name: str, padded: bool) -> dict:
    g = torch.Generator().manual_seed(0)
    kind = MODELS[name][0]
    if name == "vit":
        return dict(pixel_values=torch.randn(2, 3, 32, 32, generator=g))
    ids = torch.randint(3, 128, (2, 12), generator=g)
    if kind == "speech":
        return dict(input_features=torch.randn(2, 16, 32, generator=g), decoder_input_ids=ids[:, :6])
    mask = torch.ones(2, 12, dtype=torch.long)
    if padded:
        mask[1, :4] = 0  # left padding, as batched generation pads
    inputs = dict(input_ids=ids, attention_mask=mask)
    if kind == "seq2seq":
        inputs["decoder_input_ids"] = ids[:, :6]
    return inputs


def _output(out) -> torch.Tensor:
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _entry(target, entry: str):
    """``target`` (a model or its forward) through ``optimize()`` or the backend."""
    if entry == "optimize":
        return fxflash.optimize(target)
    return torch.compile(target, backend="fxflash", options={"inner": "eager"})


def _one_entry_for_sdpa(entry: str, attention: str) -> None:
    if attention == "sdpa" and entry != "optimize":
        pytest.skip("the sdpa attention through optimize() alone: the backend compiles each graph the same way")


def _every_sdpa_call(attention: str):
    """With the sdpa attention, the calls without a mask (ViT's, Whisper's) are read as their math
    form too, so that every attention is counted (by default they keep PyTorch's kernel: test_sdpa)."""
    return fxflash.config.overridden(sdpa_calls="all") if attention == "sdpa" else contextlib.nullcontext()


def _check_fused(name: str, reports: list, calls: int = 1, per_call: int | None = None) -> None:
    regions = [r for report in reports for r in report.regions]
    fused = sum(r.fused for r in regions)
    expected = (per_call or MODELS[name][2]) * calls
    assert fused == expected, [r.verdict() for r in regions if not r.fused]


ENTRIES = ["optimize", "backend"]
GENERATIVE = [name for name in AVAILABLE if MODELS[name][0] in ("causal", "seq2seq")]


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("name", AVAILABLE)
def test_every_attention_fuses_and_the_outputs_match(name, entry, padded, attention):
    if name == "vit" and padded:
        pytest.skip("images have no padding")
    if attention == "sdpa" and not padded and name != "vit":
        pytest.skip("under Dynamo, transformers builds the same sdpa mask with or without padding: the padded "
                    "run covers it")
    if padded and name in GENERATIVE:
        pytest.skip("test_generate_gives_eagers_tokens compares the padded prefill's logits, and every step's")
    _one_entry_for_sdpa(entry, attention)
    model, inputs = _model(name, attention), _inputs(name, padded)
    with torch.no_grad():
        expected = _output(model(**inputs))
        fast = _entry(model, entry)
        with recording() as reports, _every_sdpa_call(attention):
            out = _output(fast(**inputs))
    _check_fused(name, reports)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("cache,attention", [("dynamic", "eager"), ("static", "eager"), ("dynamic", "sdpa")])
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("name", GENERATIVE)
def test_generate_gives_eagers_tokens(name, entry, cache, attention):
    """Batched greedy generation with left padding: the prefill and every decode step (q_len = 1)
    fuse, every call's logits match eager's (the prefill's at every position) and the tokens are
    eager's. A growing cache compiles a decode step twice (its first length, then every length:
    Dynamo's automatic dynamic shapes), never once per token."""
    if cache == "static" and name in ("bloom", "gpt_neox", "falcon"):
        pytest.skip(f"{name} has no StaticCache support in transformers")
    _one_entry_for_sdpa(entry, attention)
    model, inputs = _model(name, attention), _inputs(name, padded=True)
    settings = dict(max_new_tokens=4, do_sample=False, cache_implementation=cache)

    def generated(forward) -> tuple:
        """The tokens, and each call's logits, with ``forward`` as the model's."""
        logits = []
        model.forward = lambda *a, **k: logits.append(_output(out := forward(*a, **k))) or out
        try:
            return model.generate(**inputs, **settings), logits
        finally:
            del model.forward

    with torch.no_grad():
        expected, expected_logits = generated(model.forward)
        compiled = _entry(model.forward, entry)
        with recording() as reports, _every_sdpa_call(attention):
            tokens, logits = generated(compiled)
    assert len(logits) == len(expected_logits)
    for step, (out, ref) in enumerate(zip(logits, expected_logits)):
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4, msg=lambda m: f"call {step}: {m}")
    assert torch.equal(tokens, expected)
    _check_fused(name, reports, calls=len(logits), per_call=DECODER_ATTENTIONS.get(name))
    graphs = len({id(report) for report in reports})
    assert graphs <= 3 + (MODELS[name][0] == "seq2seq"), f"{graphs} graphs compiled for {len(logits)} calls"


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("name", AVAILABLE)
def test_a_training_step_gives_eagers_gradients(name, entry):
    model, inputs = _model(name).train(), _inputs(name, padded=True)
    reference = _model(name).train()
    _output(reference(**inputs)).square().mean().backward()
    fast = _entry(model, entry)
    why = NOT_TRACED_IN_TRAINING.get(name)
    with recording() as reports, pytest.warns(RuntimeWarning, match=why) if why else contextlib.nullcontext():
        _output(fast(**inputs)).square().mean().backward()
    if not why:
        _check_fused(name, reports)
    for (key, p), r in zip(model.named_parameters(), reference.parameters()):
        if r.grad is None:
            assert p.grad is None, key
        else:
            torch.testing.assert_close(p.grad, r.grad, atol=1e-5, rtol=1e-4, msg=key)


def test_the_generate_example_fuses_and_matches_eager():
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    result = subprocess.run([sys.executable, os.path.join(here, "..", "examples", "hf_generate.py"), "--tokens", "2",
                             "--prompt", "8"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "tokens match eager's: True" in result.stdout
    assert "2 fused>" in result.stdout, result.stdout
