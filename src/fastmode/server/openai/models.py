"""Typed request bodies of the OpenAI dialect.

Unknown fields are refused (`extra="forbid"`), as OpenAI refuses them, and
fields we know but do not implement are refused by `unsupported()` with the
parameter's name: a client that asks for audio or a predicted output must
learn it did not get them, not receive a silently different answer.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fastmode.sampling_params import StructuredOutput
from fastmode.server.edge.errors import ApiError
from fastmode.server.params import ApiSampling, Penalty, Seed, Speculative, Temperature, TopK, TopP
from fastmode.server.reasoning import Effort, effort_switch
from fastmode.server.tools.specs import ToolChoice, ToolSpec

ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast"]
MAX_N = 16  # choices per request: each is a request in the engine
MAX_TOP_LOGPROBS = 20  # OpenAI's bound


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class RefusalPart(_Strict):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCallItem(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallItem] | None = None  # assistant
    tool_call_id: str | None = None  # tool
    refusal: str | None = None  # assistant; history only
    reasoning_content: str | None = None  # assistant; history only: a thinking model's earlier reasoning

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text if isinstance(p, TextPart) else p.refusal for p in self.content)


def chat_messages(messages: list[ChatMessage]) -> list[dict]:
    """The conversation in the internal (Hugging Face) shape; 400 naming the first bad message."""
    out: list[dict] = []
    names: dict[str, str] = {}  # tool call id -> function name, for tool results
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.role != "assistant" and m.tool_calls:
            raise ApiError(
                "invalid_request",
                f"{where}.tool_calls: only assistant messages carry tool calls",
                param=f"{where}.tool_calls",
            )
        if m.role == "tool":
            if not m.tool_call_id:
                raise ApiError(
                    "invalid_request",
                    f"{where}.tool_call_id is required in a tool message",
                    param=f"{where}.tool_call_id",
                )
            tool = {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.text()}
            if m.tool_call_id in names:
                tool["name"] = names[m.tool_call_id]
            out.append(tool)
            continue
        if m.role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": m.text() if m.content is not None else None}
            if m.reasoning_content:  # thinking templates (Qwen3) render or drop it themselves
                msg["reasoning_content"] = m.reasoning_content
            if m.tool_calls:
                msg["tool_calls"] = [_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(m.tool_calls)]
                names.update((c.id, c.function.name) for c in m.tool_calls)
            elif m.content is None:
                raise ApiError(
                    "invalid_request",
                    f"{where}: an assistant message needs content or tool_calls",
                    param=f"{where}.content",
                )
            out.append(msg)
            continue
        if m.content is None:
            raise ApiError(
                "invalid_request", f"{where}.content is required in a {m.role} message", param=f"{where}.content"
            )
        # "developer" is the newer name of "system"; chat templates know only the latter.
        out.append({"role": "system" if m.role == "developer" else m.role, "content": m.text()})
    return out


def _call(c: ToolCallItem, where: str) -> dict:
    try:
        args = json.loads(c.function.arguments) if c.function.arguments.strip() else {}
    except json.JSONDecodeError as e:
        raise ApiError(
            "invalid_request", f"{where}.function.arguments is not valid JSON: {e}", param=f"{where}.function.arguments"
        ) from None
    if not isinstance(args, dict):
        raise ApiError(
            "invalid_request", f"{where}.function.arguments must be a JSON object", param=f"{where}.function.arguments"
        )
    return {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}}


class FunctionDef(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionTool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    name: str
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # a no-op here: we add no padding to chunks


class SamplingFields(_Strict):
    model: str
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None  # an extension (vLLM has it too)
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    service_tier: ServiceTier | None = None
    speculative: Speculative | None = None  # an extension; output is the same either way, only speed differs
    ignore_eos: bool = False  # an extension (vLLM has it too): run to max_tokens, as load generators need
    n: int | None = Field(None, ge=1, le=MAX_N)
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    prompt_cache_key: str | None = None  # a routing hint; our prefix cache needs none
    safety_identifier: str | None = None

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def sampling(self) -> ApiSampling:
        return ApiSampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=self.stop_list(),
            ignore_eos=self.ignore_eos,
            speculative=self.speculative,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=self.logit_bias,
        )

    def _common_unsupported(self) -> list[tuple[str, bool]]:
        return [
            ("store", bool(self.store)),
            ("service_tier", self.service_tier == "scale"),
            ("stream_options", self.stream_options is not None and not self.stream),
        ]


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: ResponseFormat | None = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    # A thinking model's switch (see server/reasoning.py): "none" off, any other effort on.
    reasoning_effort: Effort | None = None
    web_search_options: Any = None
    verbosity: str | None = None

    def unsupported(self) -> None:
        checks = self._common_unsupported() + [
            ("functions", bool(self.functions)),  # the deprecated form of `tools`
            ("function_call", self.function_call not in (None, "none", "auto")),
            ("audio", self.audio is not None),
            ("modalities", self.modalities not in (None, ["text"])),
            ("prediction", self.prediction is not None),
            ("web_search_options", self.web_search_options is not None),
            ("verbosity", self.verbosity is not None),
        ]
        _refuse(checks)

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def thinking(self) -> bool | None:
        """The template's thinking switch for this request; None: the template's default."""
        return effort_switch(self.reasoning_effort)

    def num_logprobs(self) -> int | None:
        """SamplingParams.logprobs: None (off), 0 (the chosen token's) or top_logprobs alternatives."""
        if not self.logprobs:
            if self.top_logprobs:
                raise ApiError("invalid_request", "top_logprobs needs logprobs: true", param="top_logprobs")
            return None
        return self.top_logprobs or 0

    def tool_specs(self) -> list[ToolSpec]:
        return [
            ToolSpec(t.function.name, t.function.description or "", t.function.parameters, bool(t.function.strict))
            for t in self.tools or ()
        ]

    def tool_choice_of(self) -> ToolChoice:
        """`tool_choice` (default: auto with tools, none without) and `parallel_tool_calls`."""
        parallel = self.parallel_tool_calls is not False
        c = self.tool_choice
        if isinstance(c, NamedToolChoice):
            return ToolChoice("named", c.function.name, parallel)
        return ToolChoice(c or ("auto" if self.tools else "none"), None, parallel)

    def structured(self) -> StructuredOutput | None:
        """response_format as a grammar; 400 where it is incomplete."""
        f = self.response_format
        if f is None or f.type == "text":
            return None
        if f.type == "json_object":
            return StructuredOutput("json_object")
        if f.json_schema is None or f.json_schema.schema_ is None:
            raise ApiError(
                "invalid_request",
                "response_format.json_schema.schema is required with type json_schema",
                param="response_format.json_schema",
            )
        schema = f.json_schema.schema_
        if not f.json_schema.strict:  # not strict: keywords the grammar engine lacks are ignored, not refused
            schema = {**schema, "x-guidance": {"lenient": True, **schema.get("x-guidance", {})}}
        return StructuredOutput("json_schema", json.dumps(schema, ensure_ascii=False))


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # the legacy endpoint's own default
    logprobs: int | None = Field(None, ge=0, le=5)  # the legacy shape: how many alternatives per token
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> None:
        _refuse(
            self._common_unsupported()
            + [
                ("echo", bool(self.echo)),
                ("suffix", self.suffix is not None),
                ("best_of", self.best_of not in (None, 1)),
            ]
        )

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise ApiError(
                    "invalid_request", "batched prompts are not supported: send one prompt per request", param="prompt"
                )
            p = p[0]
        if not p:
            raise ApiError("invalid_request", "prompt is empty", param="prompt")
        return p


def _refuse(checks: list[tuple[str, bool]]) -> None:
    for name, bad in checks:
        if bad:
            raise ApiError(
                "invalid_request",
                f"`{name}` is not supported by this server with that value; remove it or use the default",
                param=name,
                code="unsupported_parameter",
            )
