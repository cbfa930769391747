"""Turn Hugging Face-named tensors into a ready `LlamaModel`.

Both loaders produce tensors under Hugging Face names (the GGUF loader renames
and un-permutes); this module fuses q/k/v and gate/up and checks that every
parameter the model needs is present, naming what is missing. Weights that
arrive as `QuantTensor`s (a GGUF file read natively) become `QuantLinear` /
`QuantEmbedding` layers running on the file's own blocks; fused q/k/v or gate/up
whose parts are stored in different formats become a `StackedLinear` of the parts,
so no part is expanded to fp32.
"""

from __future__ import annotations

import torch

from fastmode.config import ModelConfig
from fastmode.loader.errors import ModelLoadError
from fastmode.models.llama import LlamaModel
from fastmode.models.quant_linear import QuantEmbedding, QuantLinear, QuantTensor, StackedLinear

Weight = torch.Tensor | QuantTensor


class Stacked(list):
    """Parts of a fused weight kept apart (their formats differ), stacked along the output dimension."""

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self), self[0].shape[1])


def _shape(t: Weight | Stacked) -> tuple[int, ...]:
    return tuple(t.shape)


def _fuse(parts: list[Weight]) -> Weight | Stacked:
    """Concatenate along the output dimension: in blocks when every part shares one block format;
    kept as parts when some are blocks in different formats; plain tensors when none is in blocks."""
    if all(isinstance(p, QuantTensor) for p in parts):
        fused = QuantTensor.cat_rows(parts)  # type: ignore[arg-type]
        if fused is not None:
            return fused
    if any(isinstance(p, QuantTensor) for p in parts):
        return Stacked(parts)
    return torch.cat(parts, dim=0)


def _take(tensors: dict[str, Weight], name: str, source: str) -> Weight:
    try:
        return tensors.pop(name)
    except KeyError:
        raise ModelLoadError(f"{source}: tensor {name!r} is missing from the checkpoint") from None


def build_model(
    cfg: ModelConfig,
    tensors: dict[str, Weight],
    dtype: torch.dtype,
    source: str,
    max_positions: int | None = None,
) -> LlamaModel:
    """Consume `tensors` (HF names) into a model in `dtype`. Unused tensors are an error-free no-op."""
    with torch.device("meta"):
        model = LlamaModel(cfg, max_positions=max_positions)
    state: dict[str, Weight] = {}
    p = "model."
    state["embed_tokens.weight"] = _take(tensors, p + "embed_tokens.weight", source)
    state["norm.weight"] = _take(tensors, p + "norm.weight", source)
    if not cfg.tie_word_embeddings:
        state["lm_head.weight"] = _take(tensors, "lm_head.weight", source)
    for i in range(cfg.num_layers):
        lp = f"{p}layers.{i}."
        a = lp + "self_attn."
        qkv = [_take(tensors, f"{a}{x}_proj.weight", source) for x in "qkv"]
        state[f"layers.{i}.self_attn.qkv_proj.weight"] = _fuse(qkv)
        if cfg.attention_bias:
            bias = [_take(tensors, f"{a}{x}_proj.bias", source) for x in "qkv"]
            state[f"layers.{i}.self_attn.qkv_proj.bias"] = _fuse(bias)
        state[f"layers.{i}.self_attn.o_proj.weight"] = _take(tensors, a + "o_proj.weight", source)
        m = lp + "mlp."
        gate_up = [_take(tensors, f"{m}{x}_proj.weight", source) for x in ("gate", "up")]
        state[f"layers.{i}.mlp.gate_up_proj.weight"] = _fuse(gate_up)
        state[f"layers.{i}.mlp.down_proj.weight"] = _take(tensors, m + "down_proj.weight", source)
        norms = ["input_layernorm", "post_attention_layernorm"]
        if cfg.sandwich_norms:
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        if cfg.qk_norm:
            norms += ["self_attn.q_norm", "self_attn.k_norm"]
        for norm in norms:
            state[f"layers.{i}.{norm}.weight"] = _take(tensors, f"{lp}{norm}.weight", source)

    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    for name, t in state.items():
        if _shape(t) != expected[name]:
            raise ModelLoadError(f"{source}: {name} has shape {_shape(t)}, config implies {expected[name]}")
    quant = {k: v for k, v in state.items() if isinstance(v, (QuantTensor, Stacked))}
    # Gemma's norms multiply in fp32 (see GemmaRMSNorm), so their weights stay fp32 in any dtype.
    keep_fp32 = {k for k in state if cfg.sandwich_norms and k.endswith("norm.weight")}
    plain = {
        k: v.float() if k in keep_fp32 else v.to(dtype)
        for k, v in state.items()
        if not isinstance(v, (QuantTensor, Stacked))
    }
    model.load_state_dict(plain, strict=False, assign=True)
    for name, qt in quant.items():
        path = name.removesuffix(".weight")
        parent_path, _, attr = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        if isinstance(qt, Stacked):
            setattr(parent, attr, StackedLinear(list(qt), bias=getattr(parent, attr).bias))
        elif path == "embed_tokens":
            setattr(parent, attr, QuantEmbedding(qt))
        else:
            setattr(parent, attr, QuantLinear(qt, bias=getattr(parent, attr).bias))
    if cfg.tie_word_embeddings:
        if isinstance(model.embed_tokens, QuantEmbedding):
            model.lm_head = model.embed_tokens.as_linear()
        else:
            model.lm_head.weight = model.embed_tokens.weight
    # Buffers (the RoPE table) were created on meta; rebuild them for real, in fp32.
    model.rotary = type(model.rotary)(cfg, max_positions or cfg.max_position_embeddings)
    return model.eval().requires_grad_(False)
