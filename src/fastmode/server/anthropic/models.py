"""Typed request bodies of the Anthropic dialect (POST /v1/messages).

Unknown fields are refused; server tools and other features this server does
not implement are refused by name instead of being ignored. `thinking` switches
a thinking model's think block (see server/reasoning.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fastmode.server.edge.errors import ApiError, validation_message
from fastmode.server.params import ApiSampling, Speculative, Temperature1, TopK, TopP
from fastmode.server.tools.specs import ToolChoice, ToolSpec

THINKING_TYPES = ("enabled", "adaptive", "disabled")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None  # accepted: the prefix cache here is automatic
    citations: list[Any] | None = None  # history only


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None

    def text(self) -> str:
        c = self.content
        text = c if isinstance(c, str) else "\n".join(b.text for b in c or ())
        # The error flag reaches the model as words: chat templates have no field for it.
        return f"Error: {text}" if self.is_error else text


class ThinkingBlock(_Strict):
    """An earlier answer's reasoning, sent back in the history (tool loops send it back)."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # Anthropic's integrity check; this server signs nothing
    cache_control: dict[str, Any] | None = None


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock, Field(discriminator="type")
]


class InputMessage(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))


def chat_messages(messages: list[InputMessage]) -> list[dict]:
    """The conversation in the internal (Hugging Face) shape: tool_use blocks become the
    assistant's tool_calls, tool_result blocks become tool messages (before the user's text)."""
    out: list[dict] = []
    for i, m in enumerate(messages):
        blocks = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        if m.role == "assistant":
            if any(isinstance(b, ToolResultBlock) for b in blocks):
                raise ApiError("invalid_request", f"messages[{i}]: tool_result blocks belong in user messages")
            calls = [
                {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
                for b in blocks
                if isinstance(b, ToolUseBlock)
            ]
            msg: dict[str, Any] = {"role": "assistant", "content": m.text()}
            thought = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))
            if thought:  # thinking templates (Qwen3) render or drop it themselves
                msg["reasoning_content"] = thought
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
            continue
        if any(isinstance(b, ToolUseBlock) for b in blocks):
            raise ApiError("invalid_request", f"messages[{i}]: tool_use blocks belong in assistant messages")
        out += [
            {"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()}
            for b in blocks
            if isinstance(b, ToolResultBlock)
        ]
        text = [b for b in blocks if isinstance(b, TextBlock)]
        if text or not out or out[-1]["role"] != "tool":
            out.append({"role": "user", "content": "".join(b.text for b in text)})
    return out


class Tool(_Strict):
    """A client tool. Server tools (web search, code execution ...) have other types and are refused."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceSpec(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MessagesRequest(_Strict):
    model: str
    max_tokens: int = Field(ge=1)  # required, as in Anthropic's API
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    # Sampling knobs: newer SDKs no longer list them, but the API accepts them (send via extra_body).
    temperature: Temperature1 | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    speed: Literal["standard", "fast"] | None = None
    speculative: Speculative | None = None  # an extension: how to speculate; None = the tier's default
    metadata: dict[str, Any] | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # both mean standard capacity here
    tools: list[dict[str, Any]] | None = None  # read by tool_specs(), which names a server tool it refuses
    tool_choice: ToolChoiceSpec | None = None
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

    def sampling(self) -> ApiSampling:
        return ApiSampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=tuple(self.stop_sequences or ()),
            speculative=self.speculative,
        )

    def unsupported(self) -> None:
        checks = [
            ("thinking", self.thinking is not None and self.thinking.get("type") not in THINKING_TYPES),
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

    def thinking_enabled(self) -> bool:
        """Whether the request asks for a think block: Anthropic's default is no thinking."""
        return self.thinking is not None and self.thinking.get("type") in ("enabled", "adaptive")

    def tool_specs(self) -> list[ToolSpec]:
        specs = []
        for i, raw in enumerate(self.tools or ()):
            kind = raw.get("type") if isinstance(raw, dict) else None
            if kind not in (None, "custom"):
                raise ApiError(
                    "invalid_request",
                    f"tools[{i}]: server tools ({kind}) are not supported by this "
                    "server; define a client tool with name, description and input_schema",
                    param="tools",
                )
            try:
                t = Tool.model_validate(raw)
            except ValidationError as e:
                message, field = validation_message(list(e.errors()))
                where = f"tools[{i}]." if field and message.startswith(field) else f"tools[{i}]: "
                raise ApiError("invalid_request", where + message, param="tools") from None
            specs.append(ToolSpec(t.name, t.description or "", t.input_schema, bool(t.strict)))
        return specs

    def tool_choice_of(self) -> ToolChoice:
        """auto without tool_choice; `any` is OpenAI's required, `tool` a named call."""
        c = self.tool_choice
        if c is None:
            return ToolChoice("auto" if self.tools else "none")
        parallel = not c.disable_parallel_tool_use
        if c.type == "tool":
            if not c.name:
                raise ApiError("invalid_request", "tool_choice: type tool needs the tool's name", param="tool_choice")
            return ToolChoice("named", c.name, parallel)
        return ToolChoice({"any": "required"}.get(c.type, c.type), None, parallel)

    def system_text(self) -> str | None:
        if self.system is None:
            return None
        return self.system if isinstance(self.system, str) else "\n".join(b.text for b in self.system)
