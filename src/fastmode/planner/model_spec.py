"""The shape of a decoder-only transformer, as far as cost is concerned.

Parameter counts are derived from the shape (so a catalog entry cannot disagree
with itself) and checked against the published totals in tests. Biases, norms
and small extras (attention sinks, MTP heads) are left out: they are < 1% of
any model in the catalog.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastmode.planner.weight_format import WeightFormat, resolve_format


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a (possibly MoE) decoder. Counts unless a suffix gives a unit.

    MoE models: the first `num_dense_layers` layers use a dense FFN of
    `ffn_size`; the rest route each token to `experts_per_token` of
    `num_experts` experts of width `expert_ffn_size`, plus `num_shared_experts`
    always-on experts of the same width. Sliding-window models: the first
    `num_sliding_layers` layers (in cost terms, which ones does not matter)
    attend to at most `sliding_window_tokens` previous tokens.
    """

    name: str
    num_layers: int
    hidden_size: int
    ffn_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    expert_ffn_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0
    sliding_window_tokens: int = 0
    num_sliding_layers: int = 0
    max_context_tokens: int = 8192
    default_format: str = "bf16"
    published_params: float = 0.0  # as the model card states it; 0 if unknown
    published_active_params: float = 0.0
    origin: str = "published"  # "published" or "fastmode" (this project's own model)
    display_name: str = ""
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{self.name}: {name} must be > 0")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads must be a multiple of num_kv_heads")
        if self.num_experts:
            if not 0 < self.experts_per_token <= self.num_experts or self.expert_ffn_size <= 0:
                raise ValueError(f"{self.name}: MoE needs 0 < experts_per_token <= num_experts and expert_ffn_size > 0")
            if not 0 <= self.num_dense_layers < self.num_layers:
                raise ValueError(f"{self.name}: num_dense_layers must be in [0, num_layers)")
        elif self.ffn_size <= 0:
            raise ValueError(f"{self.name}: dense model needs ffn_size > 0")
        if not 0 <= self.num_sliding_layers <= self.num_layers:
            raise ValueError(f"{self.name}: num_sliding_layers must be in [0, num_layers]")
        if self.num_sliding_layers and self.sliding_window_tokens <= 0:
            raise ValueError(f"{self.name}: sliding layers need sliding_window_tokens > 0")
        if self.origin not in ("published", "fastmode"):
            raise ValueError(f"{self.name}: origin must be 'published' or 'fastmode'")
        resolve_format(self.default_format)  # raises on an unknown name

    # ---- shape-derived counts -------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def attn_params_per_layer(self) -> int:
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        return self.hidden_size * (2 * q_out + 2 * kv_out)  # W_q, W_o, W_k, W_v

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden_size * self.num_experts

    @property
    def params_per_expert(self) -> int:
        return 3 * self.hidden_size * self.expert_ffn_size  # SwiGLU: gate, up, down

    @property
    def dense_ffn_params_per_layer(self) -> int:
        return 3 * self.hidden_size * self.ffn_size

    @property
    def embedding_params(self) -> int:
        """Token embedding plus LM head (one table when tied)."""
        table = self.vocab_size * self.hidden_size
        return table if self.tied_embeddings else 2 * table

    @property
    def attn_params(self) -> int:
        return self.num_layers * self.attn_params_per_layer + self.num_moe_layers * self.router_params_per_layer

    @property
    def ffn_params(self) -> int:
        """All FFN weights: dense layers plus every routed and shared expert."""
        dense_layers = self.num_dense_layers if self.is_moe else self.num_layers
        experts = self.num_moe_layers * (self.num_experts + self.num_shared_experts) * self.params_per_expert
        return dense_layers * self.dense_ffn_params_per_layer + experts

    @property
    def total_params(self) -> int:
        return self.embedding_params + self.attn_params + self.ffn_params

    @property
    def active_ffn_params(self) -> int:
        """FFN weights one token multiplies with (top-k plus shared experts)."""
        if not self.is_moe:
            return self.ffn_params
        per_layer = (self.experts_per_token + self.num_shared_experts) * self.params_per_expert
        return self.num_dense_layers * self.dense_ffn_params_per_layer + self.num_moe_layers * per_layer

    @property
    def matmul_params_per_token(self) -> int:
        """Parameters one token multiplies with: 2x this is its linear-layer FLOPs.

        The input embedding is a lookup, not a matmul, so only the LM head of the
        embedding tables counts. This is the usual 'active parameters' figure.
        """
        lm_head = self.vocab_size * self.hidden_size
        return lm_head + self.attn_params + self.active_ffn_params

    # ---- bytes ------------------------------------------------------------------
    def weight_bytes(self, fmt: str | WeightFormat | None = None) -> float:
        """Bytes of all weights stored in `fmt` (default: the model's own format)."""
        f = resolve_format(fmt or self.default_format)
        return (
            self.embedding_params * f.embed_bytes_per_param
            + self.attn_params * f.attn_bytes_per_param
            + self.ffn_params * f.ffn_bytes_per_param
        )

    def expert_bytes(self, fmt: str | WeightFormat | None = None) -> float:
        """Bytes of one routed expert in one layer."""
        return self.params_per_expert * resolve_format(fmt or self.default_format).ffn_bytes_per_param

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2.0) -> float:
        """K and V for one token in every layer: 2 * layers * kv_heads * head_dim * bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_dtype_bytes

    def kv_tokens_held(self, context_tokens: float) -> float:
        """Token-layers of KV kept for a context, in units of 'full-attention tokens'.

        Sliding layers keep at most `sliding_window_tokens`; the result is scaled so
        that `kv_tokens_held(c) * kv_bytes_per_token` is the sequence's KV bytes.
        """
        full = self.num_layers - self.num_sliding_layers
        sliding = self.num_sliding_layers * min(context_tokens, self.sliding_window_tokens)
        return (full * context_tokens + sliding) / self.num_layers

    def kv_bytes(self, context_tokens: float, kv_dtype_bytes: float = 2.0) -> float:
        """KV-cache bytes for one sequence holding `context_tokens` tokens."""
        return self.kv_tokens_held(context_tokens) * self.kv_bytes_per_token(kv_dtype_bytes)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        """Build from a catalog entry (unknown keys are an error: they are typos)."""
        return cls(**d)

    @classmethod
    def from_config(cls, name: str, config: Any, default_format: str = "bf16") -> ModelSpec:
        """Build from any object with Llama-style fields (e.g. fastmode.config.ModelConfig)."""
        return cls(
            name=name,
            num_layers=config.num_layers,
            hidden_size=config.hidden_size,
            ffn_size=config.intermediate_size,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            vocab_size=config.vocab_size,
            tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            max_context_tokens=int(getattr(config, "max_position_embeddings", 8192)),
            default_format=default_format,
        )
