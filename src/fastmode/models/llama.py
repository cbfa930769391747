"""A Llama-family decoder in plain PyTorch (Llama 2/3, Mistral, Qwen2, SmolLM).

RMSNorm, RoPE (none/linear/llama3 scaling), grouped-query attention over a
paged KV cache, SwiGLU MLP, tied or untied embeddings, optional q/k/v bias.
q/k/v and gate/up are fused into one matmul each: fewer, larger kernels are
what a memory-bound decode step wants.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fastmode.config import ModelConfig, RopeScaling
from fastmode.models.attention_batch import AttentionBatch

# KV cache element types fastmode's kernels read and write (fp16 halves the bytes attention streams).
KERNEL_KV_DTYPES = (torch.float32, torch.float16)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.kernels = None  # fastmode.kernels when fused CPU ops are on (see use_kernels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None and x.dtype == torch.float32:
            return self.kernels.rms_norm(x, self.weight, self.eps)
        # Normalise in fp32 as the reference implementations do, then cast back.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Inverse frequencies (head_dim/2,), with the checkpoint's scaling applied."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling.kind == "linear":
        inv_freq = inv_freq / scaling.factor
    elif scaling.kind == "llama3":
        # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, a smooth ramp between.
        low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
        high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
        mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        scaled = torch.where(mid, (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq, scaled)
        inv_freq = scaled
    return inv_freq.float()


class Rotary(nn.Module):
    """Rotate-half RoPE (the Hugging Face layout) with a precomputed cos/sin table."""

    def __init__(self, cfg: ModelConfig, max_positions: int):
        super().__init__()
        inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)  # (P, hd/2)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin rows for `positions`, (N, 1, hd/2) each: looked up once per step, used by every layer."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: (N, heads, hd), rotate-half layout
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.scale = cfg.head_dim**-0.5
        self.kernels = None

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        batch: AttentionBatch,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        n = x.shape[0]
        if self.kernels is not None and k_cache.dtype in KERNEL_KV_DTYPES:
            # RoPE and the K/V cache write in one op (the same one LlamaModel's fused decode uses).
            q = self.kernels.rope_qkv(
                self.qkv_proj(x),
                rope[0].reshape(n, -1),
                rope[1].reshape(n, -1),
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                batch.slot_mapping,
                k_cache,
                v_cache,
            )
        else:
            q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = Rotary.apply(q.view(n, self.num_heads, self.head_dim), *rope)
            k = Rotary.apply(k.view(n, self.num_kv_heads, self.head_dim), *rope)
            v = v.view(n, self.num_kv_heads, self.head_dim)
            # k_cache: (num_blocks, block_size, kvh, hd); write the new tokens' K/V into their slots.
            k_cache.view(-1, self.num_kv_heads, self.head_dim)[batch.slot_mapping] = k.to(k_cache.dtype)
            v_cache.view(-1, self.num_kv_heads, self.head_dim)[batch.slot_mapping] = v.to(v_cache.dtype)

        outs = []
        for span in batch.prefill_spans:
            outs.append(self._prefill(q[span.start : span.end], span, k_cache, v_cache))
        if batch.decode_block_tables is not None:
            outs.append(self._decode(q[batch.num_prefill_tokens :], batch, k_cache, v_cache))
        o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
        return self.o_proj(o)

    def _prefill(self, q, span, k_cache, v_cache) -> torch.Tensor:
        # q: (L, h, hd); gather the sequence's whole context (T tokens) from its blocks.
        t = span.context_len
        k = k_cache[span.block_table].flatten(0, 1)[:t].to(q.dtype)  # (T, kvh, hd)
        v = v_cache[span.block_table].flatten(0, 1)[:t].to(q.dtype)
        q_ = q.transpose(0, 1).unsqueeze(0)  # (1, h, L, hd)
        k_ = k.transpose(0, 1).unsqueeze(0)  # (1, kvh, T, hd)
        v_ = v.transpose(0, 1).unsqueeze(0)
        if span.mask is None:
            o = F.scaled_dot_product_attention(q_, k_, v_, is_causal=True, enable_gqa=True, scale=self.scale)
        else:
            o = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=span.mask, enable_gqa=True, scale=self.scale)
        return o[0].transpose(0, 1).reshape(q.shape[0], self.q_size)

    def _decode(self, q, batch, k_cache, v_cache) -> torch.Tensor:
        # One query per sequence. Plain matmul attention: on CPU it beats SDPA for this shape.
        b = q.shape[0]
        if self.kernels is not None and k_cache.dtype in KERNEL_KV_DTYPES and batch.decode_context_lens is not None:
            o = self.kernels.paged_decode_attention(
                q.reshape(b, self.num_heads, self.head_dim),
                k_cache,
                v_cache,
                batch.decode_block_tables,
                batch.decode_context_lens,
                self.scale,
            )
            return o.reshape(b, self.q_size)
        g = self.num_heads // self.num_kv_heads
        k = k_cache[batch.decode_block_tables].flatten(1, 2).to(q.dtype)  # (B, T, kvh, hd)
        v = v_cache[batch.decode_block_tables].flatten(1, 2).to(q.dtype)
        q = q.view(b, self.num_kv_heads, g, self.head_dim)  # (B, kvh, g, hd)
        scores = torch.matmul(q, k.permute(0, 2, 3, 1)).float() * self.scale  # (B, kvh, g, T)
        probs = torch.softmax(scores + batch.decode_mask, dim=-1).to(v.dtype)
        o = torch.matmul(probs, v.transpose(1, 2))  # (B, kvh, g, hd)
        return o.reshape(b, self.q_size)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.kernels = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None and x.dtype == torch.float32:
            return self.down_proj(self.kernels.silu_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, rope, batch, k_cache, v_cache):
        x = x + self.self_attn(self.input_layernorm(x), rope, batch, k_cache, v_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Decoder over a paged KV cache. `forward` returns logits only for `logit_indices`."""

    def __init__(self, cfg: ModelConfig, max_positions: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = Rotary(cfg, max_positions or cfg.max_position_embeddings)
        self.kernels = None  # set by use_kernels; enables the fused decode step

    def forward(
        self,
        input_ids: torch.Tensor,  # (N,)
        positions: torch.Tensor,  # (N,)
        batch: AttentionBatch,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logit_indices: torch.Tensor,  # (S,) rows of the flat batch whose next token is wanted
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rotary.tables(positions)
        fused = self._fused_decode(batch, kv_caches)
        if fused is not None:
            x = fused(x, rope)
        else:
            for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
                x = layer(x, rope, batch, k_cache, v_cache)
        x = self.norm(x[logit_indices])
        return self.lm_head(x).float()  # (S, vocab)

    def _fused_decode(self, batch: AttentionBatch, kv_caches):
        """For a step of decodes only, on fastmode's kernels with every layer's
        linears in ggml blocks: a function running all layers in one kernel
        call (no Python between ops). None where the per-layer path must run."""
        kernels = getattr(self, "kernels", None)
        if kernels is None or batch.prefill_spans or batch.decode_context_lens is None:
            return None
        if kv_caches[0][0].dtype not in KERNEL_KV_DTYPES:
            return None
        pack = getattr(self, "_decode_pack", None)
        if pack is None:
            pack = self._decode_pack = _decode_pack(self)
        if not pack:
            return None
        norms, weights, qtypes, int8 = pack
        cfg = self.cfg
        k_caches, v_caches = [k for k, _ in kv_caches], [v for _, v in kv_caches]

        def run(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            n = x.shape[0]
            return kernels.decode_layers(
                x,
                norms,
                weights,
                qtypes,
                k_caches,
                v_caches,
                rope[0].reshape(n, -1),
                rope[1].reshape(n, -1),
                batch.slot_mapping,
                batch.decode_block_tables,
                batch.decode_context_lens,
                cfg.num_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.rms_norm_eps,
                cfg.head_dim**-0.5,
                int8,
            )

        return run


def _decode_pack(model: LlamaModel) -> tuple | tuple[()]:
    """(norm weights, block weights, ggml types, int8 activations) for `decode_layers`,
    or () when some layer cannot run fused (fp32 linears, a q/k/v bias, mixed activation modes)."""
    from fastmode.models.quant_linear import QuantLinear

    norms, weights, qtypes, int8 = [], [], [], set()
    for layer in model.layers:
        linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
        if not all(isinstance(m, QuantLinear) and m.bias is None for m in linears):
            return ()
        norms += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
        weights += [m.qweight for m in linears]
        qtypes += [m.qtype for m in linears]
        int8 |= {m.int8_activations for m in linears}
    if len(int8) != 1:
        return ()
    return norms, weights, qtypes, int8.pop()


def use_kernels(model: nn.Module, kernels) -> None:
    """Route RMSNorm, SwiGLU and decode attention through fastmode's fused CPU
    ops (`kernels` = fastmode.kernels.ops()), or back to PyTorch with None.
    The loader turns them on with native quantized weights; the dequantized
    reference path keeps plain PyTorch."""
    for m in model.modules():
        if isinstance(m, (RMSNorm, Attention, MLP, LlamaModel)):
            m.kernels = kernels
        if isinstance(m, LlamaModel):
            m._decode_pack = None  # rebuilt on the next decode step
