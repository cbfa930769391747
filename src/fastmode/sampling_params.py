"""Per-request decoding parameters (the vLLM / nano-vllm shape)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

StructuredKind = Literal["json_schema", "json_object", "regex", "lark"]
STRUCTURED_KINDS = ("json_schema", "json_object", "regex", "lark")
MAX_LOGPROBS = 20  # most alternatives a token's logprobs may list (OpenAI's limit)


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

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise ValueError(f"structured output kind must be one of {', '.join(STRUCTURED_KINDS)}; got {self.kind!r}")
        if not isinstance(self.spec, str):
            # ValueError like every other bad request field: the server maps it to a 400.
            raise ValueError(f"structured output spec must be a string, got {type(self.spec).__name__}")  # noqa: TRY004


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
        if not (0 <= self.temperature < math.inf):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
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
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise ValueError("structured must be a StructuredOutput")
        if self.logprobs is not None and (
            isinstance(self.logprobs, bool)
            or not isinstance(self.logprobs, int)
            or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise ValueError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}] (or None), got {self.logprobs!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be a number in [-2, 2], got {value!r}")
        object.__setattr__(self, "logit_bias", _normalize_logit_bias(self.logit_bias))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _normalize_logit_bias(bias) -> tuple[tuple[int, float], ...]:
    """A mapping or pairs of (token id, bias) -> pairs sorted by id, one per id (the last wins).
    Ids are checked against the model's vocabulary where the request is (the engine)."""
    pairs = bias.items() if isinstance(bias, Mapping) else bias or ()
    out: dict[int, float] = {}
    for pair in pairs:
        try:
            token, value = pair
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias entries must be (token id, bias) pairs, got {pair!r}") from None
        if isinstance(token, str) and token.strip().lstrip("-").isdigit():
            token = int(token)  # JSON object keys are strings
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"logit_bias token ids must be integers >= 0, got {token!r}")
        if not _is_number(value) or not -100.0 <= value <= 100.0:
            raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {value!r} for token {token}")
        out[token] = float(value)
    return tuple(sorted(out.items()))
