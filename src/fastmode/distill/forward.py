"""A plain causal forward over a (B, T) batch, for training.

The engine's `LlamaModel.forward` runs over a paged KV cache, which training
does not need (every position of a fixed-length window is computed at once)
and which would cost a cache write per layer per step. This forward calls the
model's own submodules in the same order, so a model trained here is served
by the engine unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fastmode.models.llama import LlamaModel, Rotary


def causal_hidden(model: LlamaModel, input_ids: torch.Tensor) -> torch.Tensor:
    """Final-norm hidden states (B, T, hidden) for token ids (B, T); position 0 is the window's first token."""
    b, t = input_ids.shape
    if t > model.rotary.cos.shape[0]:
        raise ValueError(f"sequence of {t} tokens exceeds the model's {model.rotary.cos.shape[0]} positions")
    x = model.embed_tokens(input_ids)  # (B, T, H)
    # (T, 1, hd/2): broadcasts over batch and heads of a (B, T, heads, hd) tensor.
    rope = model.rotary.cos[:t].unsqueeze(1), model.rotary.sin[:t].unsqueeze(1)
    for layer in model.layers:
        attn = layer.self_attn
        q, k, v = attn.qkv_proj(layer.input_layernorm(x)).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q = Rotary.apply(q.view(b, t, attn.num_heads, attn.head_dim), *rope).transpose(1, 2)  # (B, h, T, hd)
        k = Rotary.apply(k.view(b, t, attn.num_kv_heads, attn.head_dim), *rope).transpose(1, 2)  # (B, kvh, T, hd)
        v = v.view(b, t, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=attn.scale)
        x = x + attn.o_proj(o.transpose(1, 2).reshape(b, t, attn.q_size))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x)


def causal_logits(model: LlamaModel, input_ids: torch.Tensor) -> torch.Tensor:
    """fp32 logits (B, T, vocab). Materialises B*T*vocab floats: use for small batches and tests."""
    return model.lm_head(causal_hidden(model, input_ids)).float()
