"""The agent frameworks people use, run against the server on the fast tier.

Each test runs a real agent loop of openai-agents, pydantic-ai or litellm
against one live server on 127.0.0.1 serving the embedded
SmolLM2-135M-Instruct (the official SDKs alone, streaming and not, are tested
in tools/test_tools_api.py and responses/test_http.py): a function tool is
called, its result goes back to the model, and the final turn produces a
structured output. The model is not trusted to choose well: each turn is
forced (a named `tool_choice`; the tool withdrawn once it has been called),
one call per turn (parallel_tool_calls off, or the model keeps calling), and
constrained decoding guarantees the shape. The assertions are on what the
frameworks record and on what went over the wire (every request and response
body is kept by an httpx event hook): the call's arguments validate against
the schema the framework sent, the tool's unique result is in the next
request, and every response says it was served on the fast tier.

Offline: tracing and telemetry are off, and a guard on `socket.connect` fails
the module if anything tries to reach a host other than loopback.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

# Before the frameworks are imported: litellm reads these at import time.
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")  # no fetched catalogs, cost maps or beta-header lists
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no trace export to OpenAI

import httpx2
import jsonschema
import pytest
from pydantic import BaseModel, Field

from fastmode.loader import load_model
from tests.server.conftest import RunningServer, serve

pytestmark = pytest.mark.slow

MAX_TOKENS = 64  # a forced call or the final JSON is ~20-30 tokens of SmolLM2's vocabulary
City = Literal["paris", "rome", "tokyo"]


class Report(BaseModel):
    """The structured final output every agent must produce."""

    city: City
    celsius: int = Field(ge=-60, le=60)


# Strict, as OpenAI's strict mode wants it (pydantic leaves additionalProperties out).
REPORT_SCHEMA = {**Report.model_json_schema(), "additionalProperties": False}


# --------------------------------------------------------------------------- offline guard


def _loopback(address: Any) -> bool:
    if not isinstance(address, tuple):  # AF_UNIX paths and the like never leave the machine
        return True
    try:
        return ipaddress.ip_address(address[0]).is_loopback
    except ValueError:  # a host name: only localhost resolves to loopback for sure
        return address[0] == "localhost"


@pytest.fixture(scope="module", autouse=True)
def loopback_only() -> Iterator[list]:
    """Refuse, and remember, any connection to a host other than loopback (tracing, telemetry, catalogs).

    Frameworks swallow errors in their background exporters, so a refusal alone
    could go unnoticed: the module fails at the end if any was attempted.
    """
    attempts: list = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(address):
        if not _loopback(address):
            attempts.append(address)
            raise OSError(f"test_agent_frameworks: connection to {address!r} refused (loopback only)")

    def connect(self, address):
        check(address)
        return real_connect(self, address)

    def connect_ex(self, address):
        check(address)
        return real_connect_ex(self, address)

    socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
    try:
        from agents import set_tracing_disabled

        set_tracing_disabled(True)
        yield attempts
    finally:
        socket.socket.connect, socket.socket.connect_ex = real_connect, real_connect_ex
    assert not attempts, f"something tried to leave the machine: {attempts}"


# --------------------------------------------------------------------------- server and wire


@pytest.fixture(scope="module")
def live() -> Iterator[RunningServer]:
    """The embedded model (real tokenizer, 8k context: agent prompts with tool schemas fit)."""
    with serve(load_model(None, "float32"), kv_cache_gib=0.25) as s:
        yield s


@dataclass
class Exchange:
    path: str
    request: dict
    status: int = 0
    body: dict | None = None  # a JSON response
    events: list[dict] = field(default_factory=list)  # the data of an SSE response, in order

    @property
    def payloads(self) -> list[dict]:
        return [self.body] if self.body is not None else self.events


class Wire:
    """Every request and response body between a framework and the server, via httpx event hooks.

    Reading the response in the hook buffers it (a streamed response is parsed
    by the framework from the buffer afterwards): fine at these sizes.
    """

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []

    def _on_request(self, request) -> None:
        self.exchanges.append(Exchange(request.url.path, json.loads(request.content or b"{}")))

    def _on_response(self, response) -> None:
        ex = self.exchanges[-1]
        ex.status = response.status_code
        if response.headers.get("content-type", "").startswith("application/json"):
            ex.body = json.loads(response.content)
        else:
            for line in response.text.splitlines():
                if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                    ex.events.append(json.loads(line[5:]))

    def client(self) -> httpx2.Client:
        def on_response(r):
            r.read()
            self._on_response(r)

        return httpx2.Client(timeout=120, event_hooks={"request": [self._on_request], "response": [on_response]})

    def async_client(self) -> httpx2.AsyncClient:
        async def on_request(r):
            self._on_request(r)

        async def on_response(r):
            await r.aread()
            self._on_response(r)

        return httpx2.AsyncClient(timeout=120, event_hooks={"request": [on_request], "response": [on_response]})

    def model_calls(self) -> list[Exchange]:
        calls = [e for e in self.exchanges if e.path.endswith(("/chat/completions", "/responses", "/messages"))]
        assert all(e.status == 200 for e in calls), [(e.path, e.status, e.body) for e in calls]
        return calls


@pytest.fixture
def wire() -> Iterator[Wire]:
    """The test's wire; printed at teardown, so a failing test shows what was sent and received."""
    w = Wire()
    yield w
    for ex in w.exchanges:
        print(f"--- POST {ex.path} -> {ex.status}\n{json.dumps(ex.request)[:3000]}")
        for p in ex.payloads:
            print(f"  <- {json.dumps(p)[:1500]}")


def served_tier(ex: Exchange) -> set[str]:
    """The tier each payload of a response says it was served on, in its dialect's words."""
    tiers = set()
    for p in ex.payloads:
        if ex.path.endswith("/messages"):  # Anthropic: usage.speed ("service_tier" there means capacity)
            for usage in (p.get("usage"), (p.get("message") or {}).get("usage")):
                if usage and usage.get("speed"):
                    tiers.add(usage["speed"])
        else:
            for obj in (p, p.get("response") or {}):
                if obj.get("service_tier"):
                    tiers.add(obj["service_tier"])
    return tiers


def sent_tool_schema(ex: Exchange, name: str) -> dict:
    """The JSON schema of tool `name` as the framework sent it, in any dialect."""
    for t in ex.request.get("tools") or []:
        if t.get("function", {}).get("name") == name:  # chat completions
            return t["function"]["parameters"]
        if t.get("name") == name:  # responses (flat) or anthropic
            return t.get("parameters") or t["input_schema"]
    raise AssertionError(f"tool {name!r} not in the request: {ex.request.get('tools')}")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


def sent_tool_results(ex: Exchange) -> dict[str, str]:
    """call id -> tool result text, for every tool result in the request's history, in any dialect."""
    out = {}
    for m in ex.request.get("messages") or []:
        if m.get("role") == "tool":  # chat completions
            out[m["tool_call_id"]] = _text(m["content"])
        elif isinstance(m.get("content"), list):  # anthropic tool_result blocks
            for b in m["content"]:
                if b.get("type") == "tool_result":
                    out[b["tool_use_id"]] = _text(b.get("content"))
    items = ex.request.get("input")
    for item in items if isinstance(items, list) else []:  # responses
        if item.get("type") == "function_call_output":
            out[item["call_id"]] = _text(item["output"])
    return out


def check_tool_round_trip(wire: Wire, name: str, call_id: str, args: dict, result: str, dialect_tier: str) -> None:
    """The forced call's arguments fit the schema sent, its result went into the next request, all on the fast tier."""
    calls = wire.model_calls()
    assert len(calls) >= 2, [e.path for e in calls]
    jsonschema.validate(args, sent_tool_schema(calls[0], name))
    assert call_id not in sent_tool_results(calls[0])
    assert sent_tool_results(calls[1]).get(call_id, "").find(result) >= 0, sent_tool_results(calls[1])
    for ex in calls:
        assert served_tier(ex) == {dialect_tier}, (ex.path, ex.payloads[-1:])


class WeatherTool:
    """get_weather(city): returns a token unique to the test, so its trip back to the model can be traced."""

    description = "Current temperature in a city."

    def __init__(self) -> None:
        self.token = f"w-{uuid.uuid4().hex[:10]}"
        self.calls: list[str] = []

    def __call__(self, city: City) -> str:
        self.calls.append(city)
        return self.result(city)

    def result(self, city: str) -> str:
        return f"{self.token}: 21 C in {city}"


# --------------------------------------------------------------------------- openai-agents


def check_stored_turns(live: RunningServer, response_ids: list[str], result: str, chained: bool) -> None:
    """Server side, from the response store: the second turn's prompt holds the tool result, both on the fast tier."""
    first, second = (live.state.responses.get(r) for r in response_ids)
    assert first is not None and second is not None, response_ids
    assert result in live.engine.tokenizer.decode(second.prompt_ids)
    assert result not in live.engine.tokenizer.decode(first.prompt_ids)
    assert first.response["service_tier"] == second.response["service_tier"] == "priority"
    assert second.response["previous_response_id"] == (first.response_id if chained else None)


@pytest.mark.parametrize(
    "api,streamed",
    [("chat", False), ("chat", True), ("responses", False), ("responses", True), ("responses-websocket", True)],
)
def test_openai_agents(live, wire, api, streamed):
    """openai-agents through OpenAIChatCompletionsModel and its default, the Responses API (over HTTP, and over the
    WebSocket with `use_responses_websocket`), run and streamed.

    The tool is forced by name on the first turn and offered only until it has
    been called, so the second turn must answer with the structured output
    (`output_type` = a json_schema the server enforces). The streamed Responses
    runs chain turns with previous_response_id, so the server's store is used.
    """
    from agents import (
        Agent,
        ItemHelpers,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIProvider,
        RunConfig,
        Runner,
        function_tool,
    )
    from agents.items import ToolCallItem, ToolCallOutputItem
    from openai import AsyncOpenAI

    weather = WeatherTool()

    @function_tool(is_enabled=lambda ctx, agent: not weather.calls)
    def get_weather(city: City) -> str:
        """Current temperature in a city."""
        return weather(city)

    async def run():
        client = AsyncOpenAI(
            base_url=live.url + "/v1", api_key="unused", http_client=wire.async_client(), max_retries=0
        )
        settings = ModelSettings(
            tool_choice="get_weather",
            parallel_tool_calls=False,
            temperature=0,
            max_tokens=MAX_TOKENS,
            extra_body={"service_tier": "priority"},
        )
        if api == "chat":
            model, config = (
                OpenAIChatCompletionsModel(model=live.model, openai_client=client),
                RunConfig(tracing_disabled=True),
            )
        else:  # a model name, resolved by the provider to its default: the Responses API
            model = live.model
            config = RunConfig(
                tracing_disabled=True,
                model_provider=OpenAIProvider(
                    openai_client=client, use_responses_websocket=api == "responses-websocket"
                ),
            )
        agent = Agent(
            name="weather",
            instructions="Report the weather in the city the user names.",
            model=model,
            tools=[get_weather],
            output_type=Report,
            model_settings=settings,
        )
        kwargs = {"max_turns": 3, "run_config": config}
        if streamed:
            kwargs["auto_previous_response_id"] = api != "chat"
            result = Runner.run_streamed(agent, "Weather in Paris?", **kwargs)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, "Weather in Paris?", **kwargs)
        await client.close()
        return result

    result = asyncio.run(run())
    calls = [i for i in result.new_items if isinstance(i, ToolCallItem)]
    outputs = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert len(calls) == 1 and len(outputs) == 1 and len(weather.calls) == 1
    raw = calls[0].raw_item
    assert raw.name == "get_weather" and outputs[0].output == weather.result(weather.calls[0])
    assert isinstance(result.final_output, Report)
    assert ItemHelpers.text_message_outputs(result.new_items)  # the final turn's message holds the JSON
    assert len(result.raw_responses) == 2
    if api == "responses-websocket":  # nothing went over HTTP: the tool's schema is checked as the framework has it
        assert not wire.model_calls()
        jsonschema.validate(json.loads(raw.arguments), get_weather.params_json_schema)
    else:
        paths = {e.path for e in wire.model_calls()}
        assert paths == {"/v1/chat/completions" if api == "chat" else "/v1/responses"}
        check_tool_round_trip(wire, "get_weather", raw.call_id, json.loads(raw.arguments), weather.token, "priority")
    if api != "chat":
        check_stored_turns(live, [r.response_id for r in result.raw_responses], weather.token, chained=streamed)


# --------------------------------------------------------------------------- pydantic-ai


def _pydantic_ai_agent(model, weather: WeatherTool, settings: dict):
    """A pydantic-ai agent whose every step is forced: the tool first, then the output tool (`final_result`)."""
    from pydantic_ai import Agent

    def step_settings(ctx):
        return {
            **settings,
            "temperature": 0,
            "max_tokens": MAX_TOKENS,
            "parallel_tool_calls": False,
            "tool_choice": ["final_result"] if weather.calls else ["get_weather"],
        }

    agent = Agent(
        model,
        output_type=Report,
        instructions="Report the weather in the city the user names.",
        model_settings=step_settings,
        retries=0,
    )

    @agent.tool_plain
    def get_weather(city: City) -> str:
        """Current temperature in a city."""
        return weather(city)

    return agent


def _pydantic_ai_checks(result, wire: Wire, weather: WeatherTool, tier: str) -> None:
    from pydantic_ai.messages import ModelResponse, ToolCallPart, ToolReturnPart

    assert isinstance(result.output, Report)
    messages = result.all_messages()
    calls = [p for m in messages if isinstance(m, ModelResponse) for p in m.parts if isinstance(p, ToolCallPart)]
    assert [c.tool_name for c in calls] == ["get_weather", "final_result"]
    returns = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
    assert returns[0].tool_call_id == calls[0].tool_call_id and weather.token in str(returns[0].content)
    assert len(weather.calls) == 1
    # The final output is the second call's arguments, validated against the output tool's schema.
    jsonschema.validate(calls[1].args_as_dict(), sent_tool_schema(wire.model_calls()[1], "final_result"))
    assert result.output == Report.model_validate(calls[1].args_as_dict())
    check_tool_round_trip(wire, "get_weather", calls[0].tool_call_id, calls[0].args_as_dict(), weather.token, tier)
    assert len(wire.model_calls()) == 2


def test_pydantic_ai_openai(live, wire):
    """pydantic-ai's OpenAI provider (Chat Completions), the structured output as its default output tool."""
    from pydantic_ai.messages import ModelResponse
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    weather = WeatherTool()

    async def run():
        http = wire.async_client()
        model = OpenAIChatModel(
            live.model, provider=OpenAIProvider(base_url=live.url + "/v1", api_key="unused", http_client=http)
        )
        result = await _pydantic_ai_agent(model, weather, {"service_tier": "priority"}).run("Weather in Rome?")
        await http.aclose()
        return result

    result = asyncio.run(run())
    _pydantic_ai_checks(result, wire, weather, "priority")
    assert {m.provider_details.get("service_tier") for m in result.all_messages() if isinstance(m, ModelResponse)} == {
        "priority"
    }


def test_pydantic_ai_anthropic_streamed(live, wire):
    """pydantic-ai's Anthropic provider, streamed, on `speed: "fast"`; tool inputs enforced by their schemas."""
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.profiles.anthropic import AnthropicModelProfile
    from pydantic_ai.providers.anthropic import AnthropicProvider

    weather = WeatherTool()
    events: list = []

    async def run():
        http = wire.async_client()
        # pydantic-ai sends `speed` (and the fast-mode beta header) only to models it knows have fast mode.
        model = AnthropicModel(
            live.model,
            provider=AnthropicProvider(base_url=live.url, api_key="unused", http_client=http),
            profile=AnthropicModelProfile(anthropic_supports_fast_speed=True),
        )
        settings = {"anthropic_speed": "fast"}

        async def on_events(ctx, stream):
            async for e in stream:
                events.append(e)

        result = await _pydantic_ai_agent(model, weather, settings).run(
            "Weather in Tokyo?", event_stream_handler=on_events
        )
        await http.aclose()
        return result

    result = asyncio.run(run())
    assert all(e.request.get("stream") and e.request["speed"] == "fast" for e in wire.model_calls())
    assert any(type(e).__name__ == "FunctionToolCallEvent" for e in events)
    _pydantic_ai_checks(result, wire, weather, "fast")


# --------------------------------------------------------------------------- litellm


def test_litellm_tool_loop(live, wire):
    """litellm.completion on the OpenAI-compatible endpoint: a named tool call, then a json_schema answer."""
    import litellm
    from openai import OpenAI

    weather = WeatherTool()
    client = OpenAI(base_url=live.url + "/v1", api_key="unused", http_client=wire.client(), max_retries=0)
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": WeatherTool.description,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["paris", "rome", "tokyo"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    common = {
        "model": f"openai/{live.model}",
        "api_base": live.url + "/v1",
        "api_key": "unused",
        "client": client,
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "service_tier": "priority",
        "parallel_tool_calls": False,
    }
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = litellm.completion(
        messages=messages, tools=[tool], tool_choice={"type": "function", "function": {"name": "get_weather"}}, **common
    )
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = first.choices[0].message.tool_calls
    args = json.loads(call.function.arguments)
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": weather(**args)},
    ]
    final = litellm.completion(
        messages=messages,
        tools=[tool],
        tool_choice="none",
        **common,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "report", "strict": True, "schema": REPORT_SCHEMA},
        },
    )
    Report.model_validate_json(final.choices[0].message.content)
    assert final.choices[0].finish_reason == "stop"
    check_tool_round_trip(wire, "get_weather", call.id, args, weather.token, "priority")
    client.close()
