"""Typed request bodies of the OpenAI dialect.

Unknown fields are refused (`extra="forbid"`), as OpenAI refuses them, and
fields we know but do not implement are refused by `unsupported()` with the
parameter's name: a client that asks for tools or n=3 must learn it did not
get them, not receive a silently different answer.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fastmode.server.errors import ApiError

ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast"]
# An extension in every dialect: how to speculate for this request; None = the tier's default.
Speculative = Literal["off", "ngram", "draft"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            raise ApiError("invalid_request", f"{self.role} messages need content", param="messages")
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # a no-op here: we add no padding to chunks


class SamplingFields(_Strict):
    model: str
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # an extension (vLLM has it too)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    service_tier: ServiceTier | None = None
    speculative: Speculative | None = None  # an extension; output is the same either way, only speed differs
    ignore_eos: bool = False  # an extension (vLLM has it too): run to max_tokens, as load generators need
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: Any = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    prompt_cache_key: str | None = None  # a routing hint; our prefix cache needs none
    safety_identifier: str | None = None

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def _common_unsupported(self) -> list[tuple[str, bool]]:
        return [
            ("n", self.n not in (None, 1)),
            ("presence_penalty", self.presence_penalty not in (None, 0)),
            ("frequency_penalty", self.frequency_penalty not in (None, 0)),
            ("logit_bias", bool(self.logit_bias)),
            ("logprobs", self.logprobs not in (None, False, 0)),
            ("store", bool(self.store)),
            ("service_tier", self.service_tier == "scale"),
            ("stream_options", self.stream_options is not None and not self.stream),
        ]


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    reasoning_effort: str | None = None
    web_search_options: Any = None
    verbosity: str | None = None

    def unsupported(self) -> None:
        checks = self._common_unsupported() + [
            ("top_logprobs", self.top_logprobs not in (None, 0)),
            ("tools", bool(self.tools)),
            ("tool_choice", self.tool_choice not in (None, "none", "auto")),
            ("functions", bool(self.functions)),
            ("function_call", self.function_call not in (None, "none", "auto")),
            ("response_format", self.response_format not in (None, {"type": "text"})),
            ("audio", self.audio is not None),
            ("modalities", self.modalities not in (None, ["text"])),
            ("prediction", self.prediction is not None),
            ("reasoning_effort", self.reasoning_effort is not None),
            ("web_search_options", self.web_search_options is not None),
            ("verbosity", self.verbosity is not None),
        ]
        _refuse(checks)

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # the legacy endpoint's own default
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> None:
        _refuse(self._common_unsupported() + [
            ("echo", bool(self.echo)),
            ("suffix", self.suffix is not None),
            ("best_of", self.best_of not in (None, 1)),
        ])

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise ApiError("invalid_request", "batched prompts are not supported: send one prompt per request", param="prompt")
            p = p[0]
        if not p:
            raise ApiError("invalid_request", "prompt is empty", param="prompt")
        return p


def _refuse(checks: list[tuple[str, bool]]) -> None:
    for name, bad in checks:
        if bad:
            raise ApiError(
                "invalid_request", f"`{name}` is not supported by this server with that value; remove it or use the default",
                param=name, code="unsupported_parameter",
            )
