"""Read a GGUF file: metadata -> ModelConfig, tensors (dequantized, or kept in
their quantized blocks for the native kernels), tokenizer.

Dequantization is the `gguf` package's (the reference Python implementation
maintained with llama.cpp). llama.cpp's converter permutes the q/k rows of
Llama-architecture checkpoints for its interleaved RoPE; we undo that so one
rotate-half implementation serves both formats.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastmode.config import ModelConfig, RopeScaling
from fastmode.loader.errors import ModelLoadError
from fastmode.loader.gguf_cache import load_cached, store
from fastmode.loader.tokenizer import check_gguf_tokenizer
from fastmode.models.quant_linear import GGML_TYPES, QuantTensor

# Block types the kernels run as stored (with `native`; dequantized otherwise): GGML_TYPES. These
# others are dequantized to fp32 at load (gguf's dequantization, tested here). Any other type is
# refused before anything is read.
DEQUANTIZED_QUANTS = frozenset({"F32", "F16", "BF16", "Q2_K", "Q3_K"})
SUPPORTED_QUANTS = DEQUANTIZED_QUANTS | frozenset(GGML_TYPES)
_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "mistral": "llama", "qwen3": "qwen3", "gemma3": "gemma3"}

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Gemma's blocks norm before and after both attention and MLP: its ffn_norm is the MLP's input norm
# and post_attention_norm the attention output's (in the Llama layout ffn_norm takes that name).
_GEMMA3_LAYER_NAMES = {**_LAYER_NAMES, "ffn_norm": "pre_feedforward_layernorm"}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def read_metadata(reader) -> dict[str, Any]:
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        meta[key] = field.contents()
    return meta


def config_from_metadata(meta: dict[str, Any], tensor_names: set[str], source: str) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in _ARCHITECTURES:
        raise ModelLoadError(
            f"{source}: GGUF architecture {arch!r} is not supported; fastmode runs {sorted(_ARCHITECTURES)}"
        )

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"{source}: GGUF metadata {arch}.{key} is missing")
        return value

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    scaling_type = meta.get(f"{arch}.rope.scaling.type", "none")
    scaling = RopeScaling(
        kind={"none": "none", "linear": "linear", "llama3": "llama3"}.get(scaling_type, scaling_type),
        factor=float(meta.get(f"{arch}.rope.scaling.factor", 1.0)),
        original_max_position_embeddings=int(meta.get(f"{arch}.rope.scaling.original_context_length", 8192)),
    )
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    extra = _gemma3_fields(meta, heads, source) if arch == "gemma3" else {}
    return ModelConfig(
        architecture=_ARCHITECTURES[arch],
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(meta.get(f"{arch}.attention.key_length", hidden // heads)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=int(get("context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        name=str(meta.get("general.name", "model")),
        qk_norm=arch in ("qwen3", "gemma3"),
        **extra,
    )


def _gemma3_fields(meta: dict[str, Any], heads: int, source: str) -> dict[str, Any]:
    """Gemma 3's settings that llama.cpp's files leave to the reader (its own values):
    every 6th layer global and the rest local, a local RoPE base of 10000, and attention
    scaled by head_dim ** -0.5, except the 62-layer 27B, scaled by (hidden / heads) ** -0.5."""
    hidden, layers = int(meta["gemma3.embedding_length"]), int(meta["gemma3.block_count"])
    head_dim = int(meta.get("gemma3.attention.key_length", hidden // heads))
    window = int(meta.get("gemma3.attention.sliding_window", 0) or 0)
    pattern = meta.get("gemma3.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # one flag per layer: True = local
        local = tuple(i for i, flag in enumerate(pattern) if flag)
    else:
        local = tuple(i for i in range(layers) if (i + 1) % int(pattern))
    softcap = meta.get("gemma3.final_logit_softcapping")
    if meta.get("gemma3.attn_logit_softcapping"):
        raise ModelLoadError(f"{source}: attn_logit_softcapping is not supported (Gemma 3 files have none)")
    return dict(
        sandwich_norms=True,
        hidden_act="gelu_tanh",
        embedding_scale=float(hidden) ** 0.5,
        query_pre_attn_scalar=float(hidden // heads if layers == 62 else head_dim),
        sliding_window=window or None,
        sliding_layers=local if window else (),
        rope_local_theta=float(meta.get("gemma3.rope.freq_base_swa", 10_000.0)),
        final_logit_softcapping=float(softcap) if softcap else None,
    )


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    # Inverse of llama.cpp's convert permute: rows (heads, 2, hd/2) were stored as (heads, hd/2, 2).
    shape = w.shape
    return w.reshape(n_heads, shape[0] // n_heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _hf_name(name: str, arch: str | None = None) -> str | None:
    base, _, suffix = name.rpartition(".")
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    parts = base.split(".")
    layer_names = _GEMMA3_LAYER_NAMES if arch == "gemma3" else _LAYER_NAMES
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{suffix}"
    return None  # e.g. rope_freqs: not a parameter of ours


def _supported_types_text() -> str:
    return (
        f"fastmode runs {', '.join(GGML_TYPES)} as stored on its CPU kernels and dequantizes "
        f"{', '.join(sorted(DEQUANTIZED_QUANTS))} at load"
    )


def check_block_types(reader, source: str, arch: str | None = None) -> None:
    """One error naming every unsupported block type among the tensors fastmode reads (with how many
    tensors and one of them) and what is supported; from the tensor table alone, before any data."""
    bad: dict[str, list[str]] = {}
    for t in reader.tensors:
        if _hf_name(t.name, arch) is not None and t.tensor_type.name not in SUPPORTED_QUANTS:
            bad.setdefault(t.tensor_type.name, []).append(t.name)
    if bad:
        found = "; ".join(
            f"{qtype} ({len(names)} tensor{'s' if len(names) > 1 else ''}, e.g. {names[0]})"
            for qtype, names in sorted(bad.items())
        )
        kinds = "block types" if len(bad) > 1 else "block type"
        raise ModelLoadError(f"{source}: unsupported GGUF {kinds} {found}; {_supported_types_text()}")


def read_gguf(path: Path, native: bool = False) -> tuple[ModelConfig, dict[str, Any], dict[str, Any]]:
    """Return (config, HF-named tensors, metadata).

    Tensors are fp32, except with `native`: 2-D weights stored in a block type the
    kernels read (GGML_TYPES: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) then
    come back as `QuantTensor`s holding the file's own blocks, so memory stays about
    the file's size. A file with a tensor in any other unsupported type is refused
    before any tensor is read.
    """
    from gguf import GGUFReader
    from gguf.quants import dequantize

    source = str(path)
    cached = load_cached(path, native)
    if cached is not None:
        tensors, meta = cached
        return config_from_metadata(meta, set(meta["_tensor_names"]), source), tensors, meta
    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # the gguf package raises ValueError/struct errors on a bad file
        if "GGMLQuantizationType" in str(e):  # a type id newer than the gguf package knows
            raise ModelLoadError(
                f"{source}: a tensor uses an unknown GGUF block type ({e}); {_supported_types_text()}"
            ) from e
        raise ModelLoadError(f"{source}: not a readable GGUF file ({e})") from e
    meta = read_metadata(reader)
    names = {t.name for t in reader.tensors}
    cfg = config_from_metadata(meta, names, source)
    check_gguf_tokenizer(meta, source)  # before any tensor is dequantized
    permute = meta.get("general.architecture") in ("llama", "mistral")
    check_block_types(reader, source, meta.get("general.architecture"))

    tensors: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        hf = _hf_name(t.name, meta.get("general.architecture"))
        if hf is None:
            continue
        qtype = t.tensor_type.name
        shape = tuple(reversed([int(d) for d in t.shape]))
        if native and qtype in GGML_TYPES and len(shape) == 2:
            blocks = np.asarray(t.data).reshape(shape[0], -1)  # one row of blocks per output feature
            if permute and t.name.endswith("attn_q.weight"):
                blocks = _unpermute(blocks, cfg.num_heads)
            elif permute and t.name.endswith("attn_k.weight"):
                blocks = _unpermute(blocks, cfg.num_kv_heads)
            tensors[hf] = QuantTensor(
                torch.from_numpy(np.array(blocks, copy=True, order="C")), GGML_TYPES[qtype], shape
            )
            continue
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape(shape)
        if permute and t.name.endswith(("attn_q.weight", "attn_q.bias")):
            w = _unpermute(w, cfg.num_heads)
        elif permute and t.name.endswith(("attn_k.weight", "attn_k.bias")):
            w = _unpermute(w, cfg.num_kv_heads)
        tensors[hf] = torch.from_numpy(np.array(w, copy=True, order="C"))
    meta["_tensor_names"] = sorted(names)
    store(path, tensors, meta, native)
    return cfg, tensors, meta
