"""Turn Hugging Face-named tensors into a ready `LlamaModel`.

Both loaders produce tensors under Hugging Face names (the GGUF loader renames
and un-permutes); this module fuses q/k/v and gate/up and checks that every
parameter the model needs is present, naming what is missing.
"""

from __future__ import annotations

import torch

from fastmode.config import ModelConfig
from fastmode.loader.errors import ModelLoadError
from fastmode.models.llama import LlamaModel


def _take(tensors: dict[str, torch.Tensor], name: str, source: str) -> torch.Tensor:
    try:
        return tensors.pop(name)
    except KeyError:
        raise ModelLoadError(f"{source}: tensor {name!r} is missing from the checkpoint") from None


def build_model(
    cfg: ModelConfig,
    tensors: dict[str, torch.Tensor],
    dtype: torch.dtype,
    source: str,
    max_positions: int | None = None,
) -> LlamaModel:
    """Consume `tensors` (HF names) into a model in `dtype`. Unused tensors are an error-free no-op."""
    with torch.device("meta"):
        model = LlamaModel(cfg, max_positions=max_positions)
    state: dict[str, torch.Tensor] = {}
    p = "model."
    state["embed_tokens.weight"] = _take(tensors, p + "embed_tokens.weight", source)
    state["norm.weight"] = _take(tensors, p + "norm.weight", source)
    if not cfg.tie_word_embeddings:
        state["lm_head.weight"] = _take(tensors, "lm_head.weight", source)
    for i in range(cfg.num_layers):
        lp = f"{p}layers.{i}."
        a = lp + "self_attn."
        qkv = [_take(tensors, f"{a}{x}_proj.weight", source) for x in "qkv"]
        state[f"layers.{i}.self_attn.qkv_proj.weight"] = torch.cat(qkv, dim=0)
        if cfg.attention_bias:
            bias = [_take(tensors, f"{a}{x}_proj.bias", source) for x in "qkv"]
            state[f"layers.{i}.self_attn.qkv_proj.bias"] = torch.cat(bias, dim=0)
        state[f"layers.{i}.self_attn.o_proj.weight"] = _take(tensors, a + "o_proj.weight", source)
        m = lp + "mlp."
        gate_up = [_take(tensors, f"{m}{x}_proj.weight", source) for x in ("gate", "up")]
        state[f"layers.{i}.mlp.gate_up_proj.weight"] = torch.cat(gate_up, dim=0)
        state[f"layers.{i}.mlp.down_proj.weight"] = _take(tensors, m + "down_proj.weight", source)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            state[f"layers.{i}.{norm}.weight"] = _take(tensors, f"{lp}{norm}.weight", source)

    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    for name, t in state.items():
        if tuple(t.shape) != expected[name]:
            raise ModelLoadError(f"{source}: {name} has shape {tuple(t.shape)}, config implies {expected[name]}")
    state = {k: v.to(dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    # Buffers (the RoPE table) were created on meta; rebuild them for real, in fp32.
    model.rotary = type(model.rotary)(cfg, max_positions or cfg.max_position_embeddings)
    return model.eval().requires_grad_(False)
