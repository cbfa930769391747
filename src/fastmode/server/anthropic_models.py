"""Typed request bodies of the Anthropic dialect (POST /v1/messages).

Unknown fields are refused; tools, thinking and other features this server
does not implement are refused by name instead of being ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fastmode.server.errors import ApiError
from fastmode.server.openai_models import Speculative  # the same extension in every dialect


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None  # accepted: the prefix cache here is automatic


class InputMessage(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[TextBlock]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)


class MessagesRequest(_Strict):
    model: str
    max_tokens: int = Field(ge=1)  # required, as in Anthropic's API
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    # Sampling knobs: newer SDKs no longer list them, but the API accepts them (send via extra_body).
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool = False
    speed: Literal["standard", "fast"] | None = None
    speculative: Speculative | None = None  # an extension: how to speculate; None = the tier's default
    metadata: dict[str, Any] | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # both mean standard capacity here
    tools: list[Any] | None = None
    tool_choice: Any = None
    thinking: dict[str, Any] | None = None
    mcp_servers: list[Any] | None = None
    container: Any = None
    context_management: Any = None
    inference_geo: str | None = None
    output_config: dict[str, Any] | None = None
    diagnostics: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None  # accepted: the prefix cache here is automatic
    user_profile_id: str | None = None  # attribution only
    workspace_id: str | None = None  # attribution only

    def unsupported(self) -> None:
        checks = [
            ("tools", bool(self.tools)),
            ("tool_choice", self.tool_choice is not None and self.tool_choice != {"type": "none"}),
            ("thinking", self.thinking is not None and self.thinking.get("type") != "disabled"),
            ("mcp_servers", bool(self.mcp_servers)),
            ("container", self.container is not None),
            ("context_management", self.context_management is not None),
            ("inference_geo", self.inference_geo is not None),
            ("output_config", any(v is not None for v in (self.output_config or {}).values())),
            ("diagnostics", any(v is not None for v in (self.diagnostics or {}).values())),
        ]
        for name, bad in checks:
            if bad:
                raise ApiError("invalid_request", f"{name}: not supported by this server; remove it", param=name)

    def system_text(self) -> str | None:
        if self.system is None:
            return None
        return self.system if isinstance(self.system, str) else "\n".join(b.text for b in self.system)
