"""GGUF loading: layout (q/k permutation), quant types, errors, and the embedded model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastmode import SamplingParams
from fastmode.loader import ModelLoadError, load_model
from fastmode.loader.default_model import default_model_path
from tests.builders import write_gguf_from_hf
from tests.models.test_llama_vs_transformers import PROMPTS, hf_logits, our_batched_logits


def test_f32_gguf_matches_the_hf_checkpoint(tiny_llama_dir, tmp_path):
    """A GGUF converted with llama.cpp's q/k permutation loads to the same logits."""
    path = write_gguf_from_hf(tiny_llama_dir, tmp_path / "tiny.gguf", "F32")
    ours = our_batched_logits(load_model(path, dtype="float32"), PROMPTS)
    theirs, _ = hf_logits(tiny_llama_dir, PROMPTS)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "F16", "BF16"])
def test_quantized_gguf_dequantizes_to_the_stored_values(tiny_llama_dir, tmp_path, qtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize
    from safetensors.numpy import load_file

    path = write_gguf_from_hf(tiny_llama_dir, tmp_path / f"tiny-{qtype}.gguf", qtype)
    loaded = load_model(path, dtype="float32", weights="dequantize")
    src = load_file(str(tiny_llama_dir / "model.safetensors"))
    q = GGMLQuantizationType[qtype]
    # The loader's fused gate/up must equal the round-tripped source weights.
    expect = np.concatenate(
        [dequantize(quantize(src[f"model.layers.1.mlp.{n}_proj.weight"], q), q) for n in ("gate", "up")]
    )
    got = loaded.model.layers[1].mlp.gate_up_proj.weight.numpy()
    np.testing.assert_array_equal(got, expect)
    # Read natively, the block formats the kernels run stay as stored and hold exactly those values.
    native = load_model(path, dtype="float32").model.layers[1].mlp.gate_up_proj
    from fastmode.models.quant_linear import GGML_TYPES

    if qtype in GGML_TYPES:
        from fastmode.kernels import ops
        from fastmode.models.quant_linear import QuantLinear

        assert isinstance(native, QuantLinear)
        blocks = ops().quant_dequantize(
            native.qweight, native.qtype, native.in_features, torch.empty(0, dtype=torch.long)
        )
        np.testing.assert_array_equal(blocks.numpy(), expect)
    else:  # formats without a kernel are dequantized at load
        np.testing.assert_array_equal(native.weight.numpy(), expect)
    # And quantization error stays small relative to the weights: the model still works.
    assert (
        np.abs(
            expect
            - np.concatenate([src["model.layers.1.mlp.gate_proj.weight"], src["model.layers.1.mlp.up_proj.weight"]])
        ).max()
        < 0.1
    )


def test_tokenizer_and_template_come_from_gguf_metadata(tiny_llama_dir, tmp_path):
    from fastmode.loader.tokenizer import tokenizer_from_hf_dir

    path = write_gguf_from_hf(tiny_llama_dir, tmp_path / "tiny.gguf")
    g = load_model(path, dtype="float32").tokenizer
    h = tokenizer_from_hf_dir(tiny_llama_dir)
    text = "def add(a, b):\n    return a + b  # the quick brown fox"
    assert g.encode(text) == h.encode(text)
    msgs = [{"role": "user", "content": "hi"}]
    assert g.apply_chat_template(msgs) == h.apply_chat_template(msgs)
    assert g.eos_token_ids == {h.backend.token_to_id("<|im_end|>")}


def test_unsupported_architecture_is_a_clear_error(tmp_path, tiny_llama_dir):
    path = write_gguf_from_hf(tiny_llama_dir, tmp_path / "x.gguf", arch="gpt2")
    with pytest.raises(ModelLoadError, match="architecture 'gpt2' is not supported"):
        load_model(path)


def test_missing_and_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match="not a readable GGUF"):
        load_model(bad)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="config.json is missing"):
        load_model(tmp_path / "empty")
    txt = tmp_path / "weights.bin"
    txt.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="must be .gguf"):
        load_model(txt)


def test_missing_tensor_is_named(tmp_path, tiny_llama_dir):
    import shutil

    from safetensors.numpy import load_file, save_file

    d = tmp_path / "broken"
    shutil.copytree(tiny_llama_dir, d)
    t = load_file(str(d / "model.safetensors"))
    del t["model.layers.2.mlp.down_proj.weight"]
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="model.layers.2.mlp.down_proj.weight"):
        load_model(d)


def test_default_model_is_found_without_configuration():
    path = default_model_path()
    assert path.suffix == ".gguf" and path.exists()


@pytest.mark.slow
def test_default_model_greedy_matches_transformers(default_llm):
    """SmolLM2-135M from the GGUF: ours vs transformers (gguf_file=), 64 greedy tokens, fp32."""
    import transformers

    path = default_model_path()
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, torch_dtype=torch.float32
    ).eval()
    tok = default_llm.tokenizer
    prompts = [
        tok.encode("The history of the Roman Empire"),
        tok.encode("def quicksort(arr):"),
        tok.encode_chat([{"role": "user", "content": "Give me three tips for learning to code."}]),
    ]
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    outs = default_llm.generate(prompts, params)
    for p, out in zip(prompts, outs):
        with torch.no_grad():
            want = ref.generate(
                torch.tensor([p]), max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=2
            )
        assert out.token_ids == want[0, len(p) :].tolist()


def test_conversion_cache_round_trips_and_survives_damage(tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTMODE_CACHE_DIR", str(tmp_path / "cache"))
    path = write_gguf_from_hf(tiny_llama_dir, tmp_path / "tiny.gguf", "Q8_0")
    first = load_model(path, dtype="float32")
    entries = list((tmp_path / "cache" / "gguf").iterdir())
    assert len(entries) == 1 and (entries[0] / "tensors.safetensors").exists()
    second = load_model(path, dtype="float32")
    for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values()):
        assert torch.equal(a, b)
    assert second.tokenizer.encode("the quick brown fox") == first.tokenizer.encode("the quick brown fox")
    (entries[0] / "tensors.safetensors").write_bytes(b"garbage")
    third = load_model(path, dtype="float32")  # a damaged entry is ignored, not fatal
    assert torch.equal(third.model.norm.weight, first.model.norm.weight)
    monkeypatch.setenv("FASTMODE_CACHE_DIR", "off")
    assert load_model(path, dtype="float32").config == first.config
