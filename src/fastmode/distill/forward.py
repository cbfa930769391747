"""A plain causal forward over a (B, T) batch, for training.

The engine's `LlamaModel.forward` runs over a paged KV cache, which training
does not need (every position of a fixed-length window is computed at once)
and which would cost a cache write per layer per step. This forward calls the
model's own submodules in the same order, so a model trained here is served
by the engine unchanged.

It covers the Llama block (Llama 2/3, Mistral, SmolLM), with q/k/v biases
(Qwen2) and per-head q/k RMSNorm (Qwen3). Gemma 3's block (four norms,
GeGLU, scaled embeddings, sliding-window layers, logit soft-capping) is not
reproduced: `check_supported` refuses such a teacher before anything is
trained on it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fastmode.config import ModelConfig
from fastmode.models.llama import DecoderLayer, LlamaModel, Rotary

SUPPORTED = "Llama-family decoders: Llama 2/3, Mistral, SmolLM, Qwen2 (q/k/v bias) and Qwen3 (q/k norm)"

Rope = tuple[torch.Tensor, torch.Tensor]


def unsupported_features(cfg: ModelConfig) -> list[str]:
    """The parts of `cfg` this forward does not compute (empty: the teacher can be distilled)."""
    found = []
    if cfg.sandwich_norms:
        found.append("four norms per block (Gemma 3)")
    if cfg.hidden_act != "silu":
        found.append(f"{cfg.hidden_act} MLP activation")
    if cfg.embedding_scale != 1.0:
        found.append("scaled embeddings")
    if cfg.sliding_layers:
        found.append("sliding-window layers")
    if cfg.final_logit_softcapping:
        found.append("logit soft-capping")
    return found


def check_supported(cfg: ModelConfig) -> None:
    """ValueError naming what is supported when the teacher's architecture is not."""
    found = unsupported_features(cfg)
    if found:
        raise ValueError(
            f"cannot distill {cfg.name}: its architecture has {', '.join(found)}, which the training "
            f"forward does not compute; distillation supports {SUPPORTED}"
        )


def rope_tables(model: LlamaModel, t: int) -> Rope:
    """RoPE cos/sin for positions 0..t-1, shaped (T, 1, hd/2) to broadcast over (B, T, heads, hd)."""
    if t > model.rotary.max_positions:
        raise ValueError(f"sequence of {t} tokens exceeds the model's {model.rotary.max_positions} positions")
    model.rotary.reserve(t)  # the tables grow on demand
    return model.rotary.cos[:t].unsqueeze(1), model.rotary.sin[:t].unsqueeze(1)


def layer_forward(layer: DecoderLayer, x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """One decoder layer over hidden states (B, T, hidden), causal attention within the window."""
    b, t, _ = x.shape
    attn = layer.self_attn
    q, k, v = attn.qkv_proj(layer.input_layernorm(x)).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    q = q.view(b, t, attn.num_heads, attn.head_dim)
    k = k.view(b, t, attn.num_kv_heads, attn.head_dim)
    if attn.q_norm is not None:  # Qwen3: RMSNorm of each head's q and k before RoPE
        q, k = attn.q_norm(q), attn.k_norm(k)
    q = Rotary.apply(q, *rope).transpose(1, 2)  # (B, h, T, hd)
    k = Rotary.apply(k, *rope).transpose(1, 2)  # (B, kvh, T, hd)
    v = v.view(b, t, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=attn.scale)
    x = x + attn.o_proj(o.transpose(1, 2).reshape(b, t, attn.q_size))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def causal_hidden(model: LlamaModel, input_ids: torch.Tensor) -> torch.Tensor:
    """Final-norm hidden states (B, T, hidden) for token ids (B, T); position 0 is the window's first token."""
    check_supported(model.cfg)
    rope = rope_tables(model, input_ids.shape[1])
    x = model.embed_tokens(input_ids)  # (B, T, H)
    for layer in model.layers:
        x = layer_forward(layer, x, rope)
    return model.norm(x)


def causal_logits(model: LlamaModel, input_ids: torch.Tensor) -> torch.Tensor:
    """fp32 logits (B, T, vocab). Materialises B*T*vocab floats: use for small batches and tests."""
    return model.lm_head(causal_hidden(model, input_ids)).float()
