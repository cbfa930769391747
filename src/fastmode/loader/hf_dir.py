"""Read a Hugging Face model directory: config.json + safetensors (sharded or not)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from fastmode.config import ModelConfig, RopeScaling
from fastmode.loader.errors import ModelLoadError

_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}


def config_from_hf(d: dict[str, Any], source: str) -> ModelConfig:
    model_type = d.get("model_type")
    if model_type not in _MODEL_TYPES:
        raise ModelLoadError(
            f"{source}: model_type {model_type!r} is not supported; fastmode runs {sorted(_MODEL_TYPES)}"
        )
    try:
        hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
        # transformers >= 5 nests theta and scaling under rope_parameters.
        rope = d.get("rope_parameters") or {}
        theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
        scaling = RopeScaling.from_hf(
            d.get("rope_scaling") or (rope if rope.get("rope_type") not in (None, "default") else None)
        )
        return ModelConfig(
            architecture=_MODEL_TYPES[model_type],
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

    eos: list[int] = []
    gen = path / "generation_config.json"
    if gen.exists():
        e = json.loads(gen.read_text()).get("eos_token_id")
        eos = [e] if isinstance(e, int) else list(e or [])
    return cfg, tensors, eos
