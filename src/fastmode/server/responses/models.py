"""Typed request bodies of the Responses API: `POST /v1/responses` and the
WebSocket mode's `response.create` event (the same body, plus `type` and `generate`).

Unknown fields are refused (`extra="forbid"`), as OpenAI refuses them; fields
we know but do not implement are refused by `unsupported()` with the
parameter's name. Input items and the chat messages they become are in
input_items.py.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from fastmode.sampling_params import StructuredOutput
from fastmode.server.edge.errors import ApiError
from fastmode.server.openai.models import ServiceTier
from fastmode.server.params import ApiSampling, Seed, Speculative, Temperature, TopP
from fastmode.server.reasoning import Effort, effort_switch
from fastmode.server.responses.conversation import Message
from fastmode.server.responses.input_items import InputItem, input_messages
from fastmode.server.tools.specs import ToolChoice, ToolSpec

OUTPUT_TEXT_LOGPROBS = "message.output_text.logprobs"
# Includes that ask for parts of items this server never writes (a reasoning item's
# encrypted_content: its text is in the clear): there is nothing to include, so asking is not an error.
_EMPTY_INCLUDES = {"reasoning.encrypted_content"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReasoningConfig(_Strict):
    """`reasoning`: the effort switches a thinking model's think block (reasoning.py); no
    summaries are written, so `summary` is accepted and the items' `summary` stays empty."""

    effort: Effort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # the SDK's deprecated name


class FunctionTool(_Strict):
    """A function tool in the Responses API's flat shape."""

    type: Literal["function"]
    name: str  # tools.check_tools refuses a bad one, naming the tool
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Strict):
    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    """`text.format`: text, json_object, or json_schema {name, schema, description, strict}."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponseRequest(_Strict):
    """The body of `POST /v1/responses`."""

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None  # an extension (Chat Completions has it): reproducible sampling
    service_tier: ServiceTier | None = None
    speculative: Speculative | None = None  # an extension: how to speculate; None = the tier's default
    store: bool | None = None  # false: not kept, so neither GET nor previous_response_id can find it
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None  # a routing hint; the prefix cache needs none
    truncation: Literal["auto", "disabled"] | None = None
    parallel_tool_calls: bool | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    text: TextConfig | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None  # include_obfuscation: a no-op, no padding is added
    reasoning: ReasoningConfig | None = None
    # Known, not implemented: refused by name when set.
    background: bool | None = None
    max_tool_calls: int | None = None
    prompt: Any = None
    conversation: Any = None
    context_management: Any = None
    prompt_cache_retention: Any = None

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools_only(cls, tools: Any) -> Any:
        for i, t in enumerate(tools if isinstance(tools, list) else ()):
            kind = t.get("type") if isinstance(t, dict) else None
            if kind != "function":
                raise PydanticCustomError(
                    "unsupported_tool",
                    "tools[{i}] has type {kind}; this server offers function tools only",
                    {"i": i, "kind": repr(kind)},
                )
        return tools

    def unsupported(self) -> None:
        checks = [
            ("text.verbosity", self.text is not None and self.text.verbosity is not None),
            ("include", any(i not in (OUTPUT_TEXT_LOGPROBS, *_EMPTY_INCLUDES) for i in self.include or ())),
            ("truncation", self.truncation == "auto"),
            ("background", bool(self.background)),
            ("max_tool_calls", self.max_tool_calls is not None),
            ("prompt", self.prompt is not None),
            ("conversation", self.conversation is not None),
            ("context_management", self.context_management is not None),
            ("prompt_cache_retention", self.prompt_cache_retention is not None),
            ("service_tier", self.service_tier == "scale"),
        ]
        for name, bad in checks:
            if bad:
                raise ApiError(
                    "invalid_request",
                    f"`{name}` is not supported by this server with that value",
                    param=name,
                    code="unsupported_parameter",
                )

    def thinking(self) -> bool | None:
        """The template's thinking switch for this request; None: the template's default."""
        return effort_switch(self.reasoning.effort if self.reasoning is not None else None)

    def reasoning_config(self) -> dict:
        """`reasoning` as the response object echoes it."""
        r = self.reasoning or ReasoningConfig()
        return {"effort": r.effort, "summary": r.summary or r.generate_summary}

    def tool_specs(self) -> list[ToolSpec]:
        return [
            ToolSpec(t.name, t.description or "", t.parameters or {"type": "object", "properties": {}}, bool(t.strict))
            for t in self.tools or ()
        ]

    def choice(self) -> ToolChoice:
        mode = self.tool_choice_mode()
        return ToolChoice(
            mode, self.tool_choice.name if mode == "named" else None, self.parallel_tool_calls is not False
        )

    def tool_choice_mode(self) -> str:
        """none | auto | required | named; a request with tools defaults to auto."""
        if isinstance(self.tool_choice, NamedFunction):
            return "named"
        return self.tool_choice or ("auto" if self.tools else "none")

    def sampling(self) -> ApiSampling:
        return ApiSampling(temperature=self.temperature, top_p=self.top_p, seed=self.seed, speculative=self.speculative)

    @property
    def logprobs(self) -> int | None:
        """SamplingParams.logprobs: None unless output_text logprobs are included."""
        if OUTPUT_TEXT_LOGPROBS not in (self.include or ()):
            return None
        return self.top_logprobs or 0

    def structured(self) -> StructuredOutput | None:
        """The grammar `text.format` asks for, or None for plain text."""
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return StructuredOutput("json_object")
        if fmt.schema_ is None:
            raise ApiError(
                "invalid_request", "text.format of type json_schema needs a `schema`", param="text.format.schema"
            )
        return StructuredOutput("json_schema", json.dumps(fmt.schema_))

    def text_config(self) -> dict:
        """`text` as the response object echoes it."""
        fmt = self.text.format if self.text else None
        if fmt is None:
            return {"format": {"type": "text"}}
        return {"format": fmt.model_dump(by_alias=True, exclude_none=True)}

    def new_messages(self, history: list[Message]) -> list[Message]:
        """The input items as chat messages; `history` (earlier turns) names the calls tool outputs answer."""
        return input_messages(self.input, history)


class ResponseCreateEvent(ResponseRequest):
    """The WebSocket mode's `response.create`: the same body, minus transport fields
    (`stream` is ignored there: every response streams), plus `generate`."""

    type: Literal["response.create"]
    generate: bool | None = None  # false: a warm-up that prefills the input and generates nothing
