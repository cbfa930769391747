"""A Llama-family decoder in plain PyTorch (Llama 2/3, Mistral, Qwen2, Qwen3, Gemma 3, SmolLM).

RMSNorm, RoPE (none/linear/llama3 scaling), grouped-query attention over a
paged KV cache, SwiGLU MLP, tied or untied embeddings, optional q/k/v bias.
q/k/v and gate/up are fused into one matmul each: fewer, larger kernels are
what a memory-bound decode step wants.

What Qwen3 and Gemma 3 add, each switched on by a `ModelConfig` field: RMSNorm
of every head's q and k before RoPE (`qk_norm`); Gemma's four norms per block
with (1 + w) weights (`sandwich_norms`), GeGLU (`hidden_act`), scaled
embeddings, `query_pre_attn_scalar` and final logit soft-capping; and local
layers (`sliding_layers`) that attend only to the last `sliding_window`
positions, with their own RoPE base.
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


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm. `weight` holds the effective multiplier 1 + w (what GGUF files store;
    the Hugging Face loader adds the 1), kept in fp32 and applied before the cast back, as
    Gemma's reference does: in bf16 this differs from RMSNorm's cast-then-multiply."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None and x.dtype == torch.float32:
            return self.kernels.rms_norm(x, self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def make_norm(cfg: ModelConfig, dim: int) -> RMSNorm:
    return (GemmaRMSNorm if cfg.sandwich_norms else RMSNorm)(dim, cfg.rms_norm_eps)


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


# Rows of the RoPE tables computed at construction; more are added when a position needs them.
INITIAL_ROPE_POSITIONS = 8192
# Rows computed per call: few enough (x head_dim/2 columns) that torch computes each call on one
# thread, so a position's cos/sin never depend on the table's size or the thread count.
_ROPE_CHUNK = 128


class Rotary(nn.Module):
    """Rotate-half RoPE (the Hugging Face layout) with cos/sin tables; a second pair for local
    (sliding-window) layers where they have their own base (Gemma 3).

    The tables cover `max_positions` positions at most, but hold only what was asked for: the
    first `INITIAL_ROPE_POSITIONS`, grown (doubling) when a step reaches past them. Rows are
    computed in fixed chunks, so every position's values are the same whatever the size."""

    def __init__(self, cfg: ModelConfig, max_positions: int):
        super().__init__()
        self.max_positions = max_positions
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.has_local = bool(cfg.sliding_layers) and cfg.rope_local_theta is not None
        self.local_inv_freq = (
            rope_inv_freq(cfg.head_dim, cfg.rope_local_theta, RopeScaling()) if self.has_local else None
        )
        self._build(min(max_positions, INITIAL_ROPE_POSITIONS))

    @staticmethod
    def _table(inv_freq: torch.Tensor, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (n, hd/2) of positions [0, n), computed chunk by chunk."""
        inv_freq = inv_freq.to(device)
        cos, sin = [], []
        for first in range(0, n, _ROPE_CHUNK):
            freqs = torch.outer(torch.arange(first, first + _ROPE_CHUNK, dtype=torch.float32, device=device), inv_freq)
            cos.append(freqs.cos())
            sin.append(freqs.sin())
        if not cos:
            return torch.empty(0, inv_freq.shape[0], device=device), torch.empty(0, inv_freq.shape[0], device=device)
        return torch.cat(cos)[:n], torch.cat(sin)[:n]

    def _build(self, n: int) -> None:
        old = getattr(self, "cos", None)
        device = old.device if old is not None else self.inv_freq.device
        cos, sin = self._table(self.inv_freq, n, device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        if self.has_local:
            cos, sin = self._table(self.local_inv_freq, n, device)
            self.register_buffer("cos_local", cos, persistent=False)
            self.register_buffer("sin_local", sin, persistent=False)

    @property
    def num_positions(self) -> int:
        """Positions the tables hold now."""
        return self.cos.shape[0]

    def reserve(self, num_positions: int) -> None:
        """Make the tables hold positions [0, num_positions), up to `max_positions`."""
        if num_positions > self.num_positions:
            self._build(min(self.max_positions, max(num_positions, 2 * self.num_positions)))

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin rows for `positions`, (N, 1, hd/2) each: looked up once per step, used by every layer."""
        try:
            return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        except IndexError:  # past the tables (or past max_positions: raises again below)
            self.reserve(int(positions.max()) + 1)
            return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def local_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The local layers' cos/sin rows, or None where they share the global table. Called after
        `tables` for the same positions, which has grown both pairs."""
        if not getattr(self, "has_local", False):
            return None
        return self.cos_local[positions].unsqueeze(1), self.sin_local[positions].unsqueeze(1)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: (N, heads, hd), rotate-half layout
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int = 0):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.scale = cfg.attention_scale
        if cfg.qk_norm:
            self.q_norm = make_norm(cfg, cfg.head_dim)
            self.k_norm = make_norm(cfg, cfg.head_dim)
        else:
            self.q_norm = self.k_norm = None
        self.window = cfg.window_of(layer_idx)  # None: attends to the whole context
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
        slots = batch.slot_mapping
        if self.window is not None and batch.local_slot_mapping is not None:
            slots = batch.local_slot_mapping  # this layer's cache is the local pool
        if self.kernels is not None and k_cache.dtype in KERNEL_KV_DTYPES and self.q_norm is None:
            # RoPE and the K/V cache write in one op (the same one LlamaModel's fused decode uses).
            q = self.kernels.rope_qkv(
                self.qkv_proj(x),
                rope[0].reshape(n, -1),
                rope[1].reshape(n, -1),
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                slots,
                k_cache,
                v_cache,
            )
        else:
            q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = q.reshape(n, self.num_heads, self.head_dim)
            k = k.reshape(n, self.num_kv_heads, self.head_dim)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q = Rotary.apply(q, *rope)
            k = Rotary.apply(k, *rope)
            v = v.view(n, self.num_kv_heads, self.head_dim)
            # k_cache: (num_blocks, block_size, kvh, hd); write the new tokens' K/V into their slots.
            k_cache.view(-1, self.num_kv_heads, self.head_dim)[slots] = k.to(k_cache.dtype)
            v_cache.view(-1, self.num_kv_heads, self.head_dim)[slots] = v.to(v_cache.dtype)

        outs = []
        for span in batch.prefill_spans:
            outs.append(self._prefill(q[span.start : span.end], span, k_cache, v_cache))
        if batch.decode_block_tables is not None:
            outs.append(self._decode(q[batch.num_prefill_tokens :], batch, k_cache, v_cache))
        o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
        return self.o_proj(o)

    def _prefill(self, q, span, k_cache, v_cache) -> torch.Tensor:
        # q: (L, h, hd); gather the sequence's context (T tokens) from its blocks.
        t, length = span.context_len, q.shape[0]
        mask = span.mask
        first = 0  # the first key position gathered
        if self.window is not None and t > self.window:
            # A local layer: query i (position t - L + i) sees keys (pos - window, pos]; keys
            # before the first query's window are not gathered at all.
            first = max(0, t - length - self.window + 1)
            q_pos = torch.arange(t - length, t).unsqueeze(1)
            k_pos = torch.arange(first, t).unsqueeze(0)
            mask = (k_pos <= q_pos) & (k_pos > q_pos - self.window)
            if span.mask is not None:
                mask &= span.mask[:, first:]
        bs = k_cache.shape[1]
        table, table_start = span.block_table, 0
        if self.window is not None and span.local_block_table is not None:
            table, table_start = span.local_block_table, span.local_block_start  # from the local pool
        blocks = table[first // bs - table_start :]
        skip = first - first // bs * bs
        k = k_cache[blocks].flatten(0, 1)[skip : skip + t - first].to(q.dtype)  # (T', kvh, hd)
        v = v_cache[blocks].flatten(0, 1)[skip : skip + t - first].to(q.dtype)
        q_ = q.transpose(0, 1).unsqueeze(0)  # (1, h, L, hd)
        k_ = k.transpose(0, 1).unsqueeze(0)  # (1, kvh, T', hd)
        v_ = v.transpose(0, 1).unsqueeze(0)
        if mask is None:
            o = F.scaled_dot_product_attention(q_, k_, v_, is_causal=True, enable_gqa=True, scale=self.scale)
        else:
            o = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask, enable_gqa=True, scale=self.scale)
        return o[0].transpose(0, 1).reshape(length, self.q_size)

    def _decode(self, q, batch, k_cache, v_cache) -> torch.Tensor:
        # One query per sequence. Plain matmul attention: on CPU it beats SDPA for this shape.
        b = q.shape[0]
        if self.window is not None:
            return self._decode_window(q, batch, k_cache, v_cache)
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

    def _decode_window(self, q, batch, k_cache, v_cache) -> torch.Tensor:
        """Decode attention of a local layer: each row reads only the blocks that hold its last
        `window` positions (at most window/block_size + 1 of them), so its cost does not grow
        with the context. fastmode's paged decode kernel reads whole block tables from position
        0, hence plain PyTorch here."""
        b, bs = q.shape[0], k_cache.shape[1]
        ctx = batch.decode_context_lens  # (B,)
        if batch.local_decode_tables is not None:  # the local pool: the runner gathered each row's window
            blocks = batch.local_decode_tables
            idx = batch.local_decode_first.unsqueeze(1) + torch.arange(blocks.shape[1])  # logical blocks
        else:
            tables = batch.decode_block_tables
            width = tables.shape[1]
            num = min(width, -(-self.window // bs) + 1)  # a window straddles at most this many blocks
            first = ((ctx - self.window).clamp(min=0) // bs).clamp(max=width - num)  # (B,) first block read
            idx = first.unsqueeze(1) + torch.arange(num)  # (B, num) indexes into each row's table
            blocks = tables.gather(1, idx)
        pos = (idx.unsqueeze(2) * bs + torch.arange(bs)).flatten(1)  # (B, num*bs) key positions
        valid = (pos < ctx.unsqueeze(1)) & (pos >= (ctx - self.window).unsqueeze(1))
        mask = torch.zeros(valid.shape).masked_fill(~valid, float("-inf"))[:, None, None, :]
        g = self.num_heads // self.num_kv_heads
        k = k_cache[blocks].flatten(1, 2).to(q.dtype)  # (B, num*bs, kvh, hd)
        v = v_cache[blocks].flatten(1, 2).to(q.dtype)
        q = q.reshape(b, self.num_kv_heads, g, self.head_dim)
        scores = torch.matmul(q, k.permute(0, 2, 3, 1)).float() * self.scale  # (B, kvh, g, num*bs)
        probs = torch.softmax(scores + mask, dim=-1).to(v.dtype)
        o = torch.matmul(probs, v.transpose(1, 2))
        return o.reshape(b, self.q_size)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gelu = cfg.hidden_act == "gelu_tanh"  # GeGLU (Gemma) instead of SwiGLU
        self.kernels = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None and x.dtype == torch.float32 and not self.gelu:
            return self.down_proj(self.kernels.silu_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.down_proj(act * up)


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks; with `sandwich_norms` (Gemma) each block's output is
    normed too, and the MLP's input norm is `pre_feedforward_layernorm` (Hugging Face's names)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int = 0):
        super().__init__()
        self.sandwich = cfg.sandwich_norms
        self.input_layernorm = make_norm(cfg, cfg.hidden_size)
        self.self_attn = Attention(cfg, layer_idx)
        self.post_attention_layernorm = make_norm(cfg, cfg.hidden_size)
        if self.sandwich:
            self.pre_feedforward_layernorm = make_norm(cfg, cfg.hidden_size)
            self.post_feedforward_layernorm = make_norm(cfg, cfg.hidden_size)
        self.mlp = MLP(cfg)

    def forward(self, x, rope, batch, k_cache, v_cache):
        if self.sandwich:
            h = self.self_attn(self.input_layernorm(x), rope, batch, k_cache, v_cache)
            x = x + self.post_attention_layernorm(h)
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        x = x + self.self_attn(self.input_layernorm(x), rope, batch, k_cache, v_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Decoder over a paged KV cache. `forward` returns logits only for `logit_indices`."""

    def __init__(self, cfg: ModelConfig, max_positions: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = make_norm(cfg, cfg.hidden_size)
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
        cfg = self.cfg
        x = self.embed_tokens(input_ids)
        if cfg.embedding_scale != 1.0:
            # Gemma: the scale is rounded to the activations' dtype first, as its reference does.
            x = x * torch.tensor(cfg.embedding_scale, dtype=x.dtype)
        rope = self.rotary.tables(positions)
        fused = self._fused_decode(batch, kv_caches)
        if fused is not None:
            x = fused(x, rope)
        else:
            local = self.rotary.local_tables(positions) if cfg.sliding_layers else None
            for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
                layer_rope = local if local is not None and layer.self_attn.window is not None else rope
                x = layer(x, layer_rope, batch, k_cache, v_cache)
        x = self.norm(x[logit_indices])
        logits = self.lm_head(x).float()  # (S, vocab)
        if cfg.final_logit_softcapping:
            cap = cfg.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _fused_decode(self, batch: AttentionBatch, kv_caches):
        """For a step of decodes only, on fastmode's kernels with every layer's
        linears in ggml blocks: a function running all layers in one kernel
        call (no Python between ops). None where the per-layer path must run."""
        kernels = getattr(self, "kernels", None)
        if kernels is None or batch.prefill_spans or batch.decode_context_lens is None:
            return None
        c = self.cfg
        if c.qk_norm or c.sandwich_norms or c.sliding_layers or c.hidden_act != "silu":
            return None  # the fused kernel runs the Llama block only
        if kv_caches[0][0].dtype not in KERNEL_KV_DTYPES:
            return None
        pack = getattr(self, "_decode_pack", None)
        if pack is None:
            pack = self._decode_pack = _decode_pack(self)
        if not pack:
            return None
        norms, weights, qtypes, parts, int8 = pack
        cfg = self.cfg
        k_caches, v_caches = [k for k, _ in kv_caches], [v for _, v in kv_caches]

        def run(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            n = x.shape[0]
            return kernels.decode_layers(
                x,
                norms,
                weights,
                qtypes,
                parts,
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
    """(norm weights, block weights, ggml types, parts per linear, int8 activations) for `decode_layers`,
    or () when some layer cannot run fused (fp32 linears, a bias, mixed activation modes). A linear whose
    output rows are stored in several formats (a StackedLinear of QuantLinears) is passed as its parts."""
    from fastmode.models.quant_linear import QuantLinear, StackedLinear

    norms, weights, qtypes, parts, int8 = [], [], [], [], set()
    for layer in model.layers:
        norms += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
        for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            blocks = list(m.parts) if isinstance(m, StackedLinear) and m.bias is None else [m]
            if not all(isinstance(b, QuantLinear) and b.bias is None for b in blocks):
                return ()
            weights += [b.qweight for b in blocks]
            qtypes += [b.kernel_qtype for b in blocks]
            parts.append(len(blocks))
            int8 |= {b.int8_activations for b in blocks}
    if len(int8) != 1:
        return ()
    return norms, weights, qtypes, parts, int8.pop()


def use_kernels(model: nn.Module, kernels) -> None:
    """Route RMSNorm, SwiGLU and decode attention through fastmode's fused CPU
    ops (`kernels` = fastmode.kernels.ops()), or back to PyTorch with None.
    The loader turns them on with native quantized weights; the dequantized
    reference path keeps plain PyTorch."""
    for m in model.modules():
        if isinstance(m, (RMSNorm, Attention, MLP, LlamaModel)):  # GemmaRMSNorm included
            m.kernels = kernels
        if isinstance(m, LlamaModel):
            m._decode_pack = None  # rebuilt on the next decode step
