"""Per-request decoding parameters (the vLLM / nano-vllm shape)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

StructuredKind = Literal["json_schema", "json_object", "regex", "lark"]


@dataclass(frozen=True)
class StructuredOutput:
    """A grammar the output must follow, enforced token by token while decoding.

    `spec` is the JSON schema (serialized JSON text) for "json_schema", the
    pattern for "regex", the grammar for "lark" (llguidance's Lark dialect,
    which may embed `%json {...}` schemas), and empty for "json_object"
    (any JSON object).
    """

    kind: StructuredKind
    spec: str = ""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop.

    temperature 0 is greedy. top_k 0 (or -1) and top_p 1 disable those filters.
    A seed makes sampling reproducible, whatever else shares the batch.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    speculative: str | None = None  # None = the tier/server default; "off", "ngram", "draft"
    structured: StructuredOutput | None = None  # a grammar the output must match
    logprobs: int | None = None  # None: off; 0: the chosen token's logprob; k: plus the k most likely
    presence_penalty: float = 0.0  # OpenAI semantics: subtracted once from every token already output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output so far
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)

    def __post_init__(self) -> None:
        # Accept a single stop string or a list; store tuples so the object stays hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop or ()))
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        if not (self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if self.speculative not in (None, "off", "ngram", "draft"):
            raise ValueError(f"speculative must be one of off, ngram, draft; got {self.speculative!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
