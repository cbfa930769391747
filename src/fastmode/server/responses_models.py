"""Typed `response.create` events of the Responses WebSocket mode."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fastmode.server.errors import ApiError
from fastmode.server.openai_models import ServiceTier, Speculative


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ContentPart(_Strict):
    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None

    def as_chat(self) -> dict[str, str]:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ResponseCreate(_Strict):
    """The Responses body minus `stream`/`background`, as WebSocket mode defines it."""

    type: Literal["response.create"]
    model: str
    input: str | list[MessageItem]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    service_tier: ServiceTier | None = None
    speculative: Speculative | None = None  # an extension: how to speculate; None = the tier's default
    store: bool | None = None  # finished responses are kept in a bounded in-memory store either way
    metadata: dict[str, str] | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    truncation: Literal["disabled"] | None = None
    parallel_tool_calls: bool | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    stream: bool | None = None
    background: bool | None = None

    def unsupported(self) -> None:
        checks = [
            ("tools", bool(self.tools)),
            ("tool_choice", self.tool_choice not in (None, "none", "auto")),
            ("text", self.text not in (None, {"format": {"type": "text"}})),
            ("reasoning", self.reasoning is not None),
            ("include", bool(self.include)),
            ("background", bool(self.background)),
            ("service_tier", self.service_tier == "scale"),
        ]
        for name, bad in checks:
            if bad:
                raise ApiError(
                    "invalid_request", f"`{name}` is not supported by this server with that value",
                    param=name, code="unsupported_parameter",
                )

    def new_messages(self) -> list[dict[str, str]]:
        if not self.input:
            raise ApiError("invalid_request", "input is empty", param="input")
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        return [item.as_chat() for item in self.input]
