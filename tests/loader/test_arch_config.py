"""Architecture configs: Qwen3 and Gemma 3 as their released config.json files spell them, and
one clear error, before any weight is read, for an architecture fastmode does not run."""

from __future__ import annotations

import json

import pytest

from fastmode.loader import ModelLoadError, load_model
from fastmode.loader.hf_dir import config_from_hf
from tests.builders import write_gguf_from_hf

# The text config of a released Gemma 3 1B checkpoint (written by transformers 4.x).
GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_hidden_layers": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "vocab_size": 262144,
    "max_position_embeddings": 32768,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "hidden_activation": "gelu_pytorch_tanh",
}


def test_gemma3_text_config_as_released():
    cfg = config_from_hf(GEMMA3_1B, "gemma-3-1b")
    assert cfg.architecture == "gemma3" and cfg.qk_norm and cfg.sandwich_norms and cfg.hidden_act == "gelu_tanh"
    assert cfg.sliding_window == 512 and cfg.rope_theta == 1e6 and cfg.rope_local_theta == 1e4
    # Every 6th layer is global: 5, 11, 17, 23.
    assert [i for i in range(26) if i not in cfg.sliding_layers] == [5, 11, 17, 23]
    assert cfg.attention_scale == 256**-0.5 and cfg.embedding_scale == 1152**0.5
    assert cfg.tie_word_embeddings and cfg.final_logit_softcapping is None


def test_multimodal_gemma3_config_reads_its_language_model():
    """Gemma 3 4B and up ship as image-text checkpoints; the text config leaves defaults out,
    and RoPE scaling applies to the global layers."""
    d = {
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
        "vision_config": {"model_type": "siglip_vision_model"},
    }
    cfg = config_from_hf(d, "gemma-3-4b")
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (8, 4, 256, 262208)
    assert cfg.rope_scaling.kind == "linear" and cfg.rope_scaling.factor == 8.0
    assert len(cfg.sliding_layers) == 34 - 5 and cfg.sliding_window == 1024


def test_qwen3_config():
    d = {
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "rope_theta": 1000000,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "use_sliding_window": False,
        "hidden_act": "silu",
    }
    cfg = config_from_hf(d, "qwen3-0.6b")
    assert cfg.architecture == "qwen3" and cfg.qk_norm and not cfg.attention_bias and not cfg.sliding_layers
    assert cfg.head_dim == 128 and cfg.q_size == 2048 and cfg.attention_scale == 128**-0.5


def test_unsupported_architecture_is_named_before_any_weight_is_read(tmp_path):
    d = tmp_path / "phi"
    d.mkdir()  # no weights at all: the error must come from the config alone
    (d / "config.json").write_text(json.dumps({"model_type": "phi3", "hidden_size": 64}))
    with pytest.raises(ModelLoadError, match="model_type 'phi3' is not supported") as e:
        load_model(d)
    assert "qwen3" in str(e.value) and "gemma3" in str(e.value) and "llama" in str(e.value)


def test_unsupported_gguf_architecture_lists_the_supported_ones(tmp_path, tiny_llama_dir):
    path = write_gguf_from_hf(tiny_llama_dir, tmp_path / "x.gguf", arch="phi3")
    with pytest.raises(ModelLoadError, match="architecture 'phi3' is not supported") as e:
        load_model(path)
    assert "qwen3" in str(e.value) and "gemma3" in str(e.value)


@pytest.mark.parametrize(
    "change,match",
    [
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        ({"hidden_activation": "relu"}, "activation 'relu'"),
    ],
)
def test_gemma3_features_not_run_are_refused_by_name(change, match):
    with pytest.raises(ModelLoadError, match=match):
        config_from_hf({**GEMMA3_1B, **change}, "gemma")


@pytest.mark.parametrize("prefix", ["language_model.model.", "model.language_model."])
def test_multimodal_gemma3_checkpoint_loads_its_language_model(tmp_path, tiny_gemma3_dir, prefix):
    """An image-text Gemma 3 directory (weights under the language model's prefix, as released
    checkpoints and transformers 5 save them, next to a vision tower) runs as its text model."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from tests.models.test_llama_vs_transformers import PROMPTS, our_batched_logits

    d = tmp_path / "gemma3-mm"
    shutil.copytree(tiny_gemma3_dir, d)
    text = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": text}))
    tensors = load_file(str(d / "model.safetensors"))
    renamed = {prefix + k.removeprefix("model."): v for k, v in tensors.items()}
    renamed["vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.zeros(4, 3)
    save_file(renamed, str(d / "model.safetensors"))
    ours = our_batched_logits(load_model(d, dtype="float32"), PROMPTS)
    want = our_batched_logits(load_model(tiny_gemma3_dir, dtype="float32"), PROMPTS)
    for a, b in zip(ours, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
