"""Read a Hugging Face model directory: config.json + safetensors (sharded or not)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from fastmode.config import ModelConfig, RopeScaling
from fastmode.loader.errors import ModelLoadError

_MODEL_TYPES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",  # the multimodal checkpoint: its language model is read, the vision tower ignored
}
# Gemma3TextConfig's defaults: Gemma 3 config.json files leave these out where they equal them.
_GEMMA3_DEFAULTS = {
    "vocab_size": 262_208,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 131_072,
    "tie_word_embeddings": True,
    "hidden_activation": "gelu_pytorch_tanh",
}
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
# The multimodal Gemma 3 checkpoint's language-model weights, under the text model's names.
_GEMMA3_PREFIXES = {
    "language_model.model.": "model.",
    "model.language_model.": "model.",
    "language_model.lm_head.": "lm_head.",
}


def _gemma3_fields(d: dict[str, Any], source: str) -> dict[str, Any]:
    """Gemma 3's extra config: four norms, GeGLU, scaled embeddings, q/k norm, and the layout of
    its local (sliding-window) and global layers with their two RoPE bases."""
    if d.get("attn_logit_softcapping"):
        raise ModelLoadError(f"{source}: attn_logit_softcapping is not supported (Gemma 3 checkpoints have none)")
    if d.get("use_bidirectional_attention"):
        raise ModelLoadError(f"{source}: bidirectional attention (an embedding model) is not supported")
    n = int(d["num_hidden_layers"])
    types = d.get("layer_types")
    if types is None:
        pattern = int(d.get("sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    rope = d.get("rope_parameters") or {}
    local = rope.get("sliding_attention") if isinstance(rope.get("sliding_attention"), dict) else {}
    window = d.get("sliding_window")
    return dict(
        sandwich_norms=True,
        embedding_scale=float(d["hidden_size"]) ** 0.5,
        query_pre_attn_scalar=float(d["query_pre_attn_scalar"]),
        sliding_window=int(window) if window else None,
        sliding_layers=tuple(i for i, t in enumerate(types) if t == "sliding_attention") if window else (),
        rope_local_theta=float(local.get("rope_theta", d.get("rope_local_base_freq", 10_000.0))),
        final_logit_softcapping=float(d["final_logit_softcapping"]) if d.get("final_logit_softcapping") else None,
    )


def _rope(d: dict[str, Any]) -> tuple[float, RopeScaling]:
    """The (global) RoPE base and scaling. transformers >= 5 nests them under rope_parameters,
    per layer type for models with local layers."""
    rope = d.get("rope_parameters") or {}
    if isinstance(rope.get("full_attention"), dict):
        rope = rope["full_attention"]
    theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
    scaling = RopeScaling.from_hf(
        d.get("rope_scaling") or (rope if rope.get("rope_type") not in (None, "default") else None)
    )
    return theta, scaling


def config_from_hf(d: dict[str, Any], source: str) -> ModelConfig:
    model_type = d.get("model_type")
    if model_type not in _MODEL_TYPES:
        raise ModelLoadError(
            f"{source}: model_type {model_type!r} is not supported; fastmode runs {', '.join(sorted(_MODEL_TYPES))}"
        )
    arch = _MODEL_TYPES[model_type]
    if model_type == "gemma3":
        d = {**d.get("text_config", {}), "_name_or_path": d.get("_name_or_path")}
    if arch == "gemma3":
        d = {**_GEMMA3_DEFAULTS, **d}
    try:
        hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
        theta, scaling = _rope(d)
        act = d.get("hidden_activation") or d.get("hidden_act") or "silu"
        if act not in _ACTIVATIONS:
            raise ModelLoadError(f"{source}: activation {act!r} is not supported; supported: {sorted(_ACTIVATIONS)}")
        if arch == "qwen3" and d.get("use_sliding_window"):
            raise ModelLoadError(f"{source}: Qwen3 with use_sliding_window is not supported")
        extra = _gemma3_fields(d, source) if arch == "gemma3" else {}
        return ModelConfig(
            architecture=arch,
            vocab_size=int(d["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=model_type == "qwen2" or bool(d.get("attention_bias", False)),
            name=str(d.get("_name_or_path") or "model"),
            qk_norm=arch in ("qwen3", "gemma3"),
            hidden_act=_ACTIVATIONS[act],
            **extra,
        )
    except KeyError as e:
        raise ModelLoadError(f"{source}: config.json lacks {e.args[0]!r}") from None


def read_hf_dir(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], list[int]]:
    """Return (config, HF-named tensors, extra EOS ids from generation_config.json)."""
    from safetensors.torch import load_file

    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise ModelLoadError(f"{path}: config.json is missing; is this a Hugging Face model directory?")
    cfg = config_from_hf(json.loads(cfg_file.read_text()), str(path))
    if cfg.name == "model":
        cfg = ModelConfig(**{**cfg.__dict__, "name": path.name})

    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        hint = " (found PyTorch .bin weights: convert them to safetensors)" if list(path.glob("*.bin")) else ""
        raise ModelLoadError(f"{path}: no *.safetensors weights{hint}")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        f = path / name
        if not f.exists():
            raise ModelLoadError(f"{path}: weight shard {name} named in the index is missing")
        tensors.update(load_file(str(f)))
    if cfg.architecture == "gemma3":
        tensors = _gemma3_tensors(tensors)

    eos: list[int] = []
    gen = path / "generation_config.json"
    if gen.exists():
        e = json.loads(gen.read_text()).get("eos_token_id")
        eos = [e] if isinstance(e, int) else list(e or [])
    return cfg, tensors, eos


def _gemma3_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The language model's tensors under the text model's names, with every norm weight w
    stored as the multiplier 1 + w (in fp32) that GemmaRMSNorm applies, as GGUF files store it."""
    out = {}
    for name, t in tensors.items():
        for prefix, to in _GEMMA3_PREFIXES.items():
            if name.startswith(prefix):
                name = to + name[len(prefix) :]
                break
        if not name.startswith(("model.", "lm_head.")):
            continue  # the vision tower and projector of a multimodal checkpoint
        out[name] = t.float() + 1.0 if name.endswith("norm.weight") else t
    return out
