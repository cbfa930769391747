"""Configuration dataclasses, one per layer, validated once.

`ModelConfig` describes a Llama-family checkpoint (what the loaders produce); how the
engine runs it is `fastmode.engine.config.EngineConfig`. Neither imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
HIDDEN_ACTIVATIONS = ("silu", "gelu_tanh")  # SwiGLU (Llama family), GeGLU with tanh GELU (Gemma)


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling as Hugging Face configs spell it (`rope_scaling`)."""

    kind: str = "none"  # none | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ("none", "linear", "llama3"):
            raise ValueError(f"unsupported rope scaling {self.kind!r}; supported: none, linear, llama3")
        if self.factor <= 0:
            raise ValueError(f"rope scaling factor must be > 0, got {self.factor}")

    @classmethod
    def from_hf(cls, d: dict[str, Any] | None) -> RopeScaling:
        if not d:
            return cls()
        kind = d.get("rope_type", d.get("type", "none")) or "none"
        if kind == "default":
            return cls()
        return cls(
            kind=kind,
            factor=float(d.get("factor", 1.0)),
            low_freq_factor=float(d.get("low_freq_factor", 1.0)),
            high_freq_factor=float(d.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(d.get("original_max_position_embeddings", 8192)),
        )


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-family decoder. Units: counts unless a suffix says otherwise."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    name: str = "model"
    # Qwen3 and Gemma 3: RMSNorm over each head's q and k before RoPE.
    qk_norm: bool = False
    # Gemma: a norm after attention and after the MLP too (four per block); norm weights act as (1 + w).
    sandwich_norms: bool = False
    hidden_act: str = "silu"
    embedding_scale: float = 1.0  # Gemma multiplies embeddings by sqrt(hidden_size)
    query_pre_attn_scalar: float | None = None  # attention scale is this ** -0.5; None: head_dim ** -0.5
    # Local (sliding-window) layers attend to the last `sliding_window` positions, their own included,
    # with RoPE base `rope_local_theta` and no scaling; the other layers attend to the whole context.
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()
    rope_local_theta: float | None = None
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {self.architecture!r}; fastmode runs {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_act not in HIDDEN_ACTIVATIONS:
            raise ValueError(f"unsupported activation {self.hidden_act!r}; supported: {', '.join(HIDDEN_ACTIVATIONS)}")
        if self.sliding_layers and not (self.sliding_window and self.sliding_window > 0):
            raise ValueError(f"sliding-window layers need a positive sliding_window, got {self.sliding_window}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def window_of(self, layer: int) -> int | None:
        """Positions layer `layer` attends to (its own included); None: the whole context."""
        return self.sliding_window if layer in self.sliding_layers else None

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V for one token across all layers."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    @property
    def num_params(self) -> int:
        embed = self.vocab_size * self.hidden_size
        attn = self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        norms = (4 if self.sandwich_norms else 2) * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        per_layer = attn + mlp + norms
        head = 0 if self.tie_word_embeddings else embed
        return embed + self.num_layers * per_layer + self.hidden_size + head
