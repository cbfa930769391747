"""The Responses API over HTTP, through the official `openai` SDK: non-streaming and
streamed turns, the store, previous_response_id on the prefix cache, tool calls,
structured output, the fast tier, and the same events as the WebSocket mode.

The tiny model is random: constrained decoding guarantees the shapes these tests
check, and tool_choice forces calls where a test needs one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from websockets.sync.client import connect

from fastmode.loader import load_model
from tests.builders import build_hf_model
from tests.server.conftest import LONG_PROMPT, RunningServer, serve
from tests.server.responses.test_ws import run_turn

# The fallback tool prompt is long for the tiny tokenizer (384 tokens of vocabulary):
# this server's model has a longer context than the shared tiny one.
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "strict": True,
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 9},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
TEXT_DONE = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[RunningServer]:
    folder = build_hf_model(tmp_path_factory.mktemp("tiny-llama-4k"), "llama", max_position_embeddings=4096)
    with serve(load_model(str(folder), "float32")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def valid_weather_args(arguments: str) -> bool:
    args = json.loads(arguments)
    return (
        set(args) == {"city", "days"}
        and args["city"] in ("Paris", "Rome", "Oslo")
        and isinstance(args["days"], int)
        and 1 <= args["days"] <= 9
    )


def test_non_streaming_turn_and_headers(server, client):
    raw = client.responses.with_raw_response.create(
        model=server.model, input=LONG_PROMPT, max_output_tokens=6, temperature=0
    )
    r = raw.parse()
    assert raw.headers["x-request-id"] == r.id and r.id.startswith("resp_")
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["message"] and r.output[0].status == "incomplete"
    assert r.usage.output_tokens == 6 and r.usage.input_tokens > 0 and r.output_text
    assert r.service_tier == "default" and r.model == server.model and r.previous_response_id is None


def test_stream_event_order_and_sequence(server, client):
    events = list(
        client.responses.create(model=server.model, input=LONG_PROMPT, max_output_tokens=5, temperature=0, stream=True)
    )
    types = [e.type for e in events]
    assert types[:4] == TEXT_EVENTS and types[-4:] == TEXT_DONE + ["response.incomplete"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == text == events[-4].text and final.usage.output_tokens == 5


def test_sse_framing_names_each_event(server, http):
    body = {"model": server.model, "input": LONG_PROMPT, "max_output_tokens": 3, "temperature": 0, "stream": True}
    with http.stream("POST", server.url + "/v1/responses", json=body) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        blocks = resp.read().decode().strip().split("\n\n")
    for block in blocks:
        event_line, data_line = block.split("\n")
        assert event_line.removeprefix("event: ") == json.loads(data_line.removeprefix("data: "))["type"]
    assert "[DONE]" not in blocks[-1]


def test_get_stored_response_and_store_false(server, client):
    r = client.responses.create(model=server.model, input="hi", max_output_tokens=3, temperature=0)
    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    unstored = client.responses.create(model=server.model, input="hi", max_output_tokens=3, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(unstored.id)
    assert e.value.body["type"] == "invalid_request_error" and unstored.id in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:  # nor can a turn chain from it
        client.responses.create(model=server.model, input="again", previous_response_id=unstored.id)
    assert e.value.code == "previous_response_not_found"
    assert client.responses.delete(r.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_previous_response_id_reuses_the_prefix(server, client):
    first = client.responses.create(
        model=server.model, instructions="You are terse.", input=LONG_PROMPT, max_output_tokens=30, temperature=1.0
    )
    second = client.responses.create(
        model=server.model,
        instructions="You are terse.",
        input="go on",
        previous_response_id=first.id,
        max_output_tokens=3,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    done = first.usage.input_tokens + first.usage.output_tokens
    # Every full block of turn 1 (prompt + reply) is served from the cache.
    assert second.usage.input_tokens_details.cached_tokens >= (done - 1) // 16 * 16 > 0
    assert second.usage.input_tokens > done


def test_forced_call_then_tool_result(server, client):
    first = client.responses.create(
        model=server.model,
        input="Weather in Rome?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=300,
        temperature=0.8,
        service_tier="priority",
    )
    assert first.status == "completed" and first.service_tier == "priority"
    [call] = first.output
    assert call.type == "function_call" and call.status == "completed" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_") and valid_weather_args(call.arguments)
    second = client.responses.create(
        model=server.model,
        previous_response_id=first.id,
        tools=[WEATHER],
        tool_choice="none",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"}],
        max_output_tokens=8,
        temperature=0,
        service_tier="priority",
    )
    assert second.status in ("completed", "incomplete") and [o.type for o in second.output] == ["message"]
    done = first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= (done - 1) // 16 * 16 > 0


def test_full_history_tool_loop_without_previous_response_id(server, client):
    history = [
        {"type": "message", "role": "user", "content": "Weather in Oslo?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": json.dumps({"city": "Oslo", "days": 2}),
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "snow"},
    ]
    r = client.responses.create(
        model=server.model,
        input=history,
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=300,
        temperature=0,
    )
    assert r.status == "completed" and r.output[0].type == "function_call" and valid_weather_args(r.output[0].arguments)


def test_streamed_call_events(server, client):
    events = list(
        client.responses.create(
            model=server.model,
            input="Weather?",
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=300,
            temperature=0,
            stream=True,
        )
    )
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert events[2].item.type == "function_call" and events[2].item.arguments == ""
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert set(types[3:-3]) == {"response.function_call_arguments.delta"}
    streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert streamed == events[-3].arguments == events[-2].item.arguments == events[-1].response.output[0].arguments
    assert valid_weather_args(streamed)


def test_text_format_json_schema(server, client):
    r = client.responses.create(
        model=server.model,
        input="Answer as JSON.",
        max_output_tokens=200,
        temperature=0.7,
        text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER_SCHEMA, "strict": True}},
    )
    assert r.status == "completed" and r.text.format.type == "json_schema"
    value = json.loads(r.output_text)
    assert set(value) == {"answer", "sure"} and 0 <= value["answer"] <= 99 and isinstance(value["sure"], bool)
    obj = client.responses.create(
        model=server.model,
        input="JSON please",
        max_output_tokens=200,
        temperature=0,
        text={"format": {"type": "json_object"}},
    )
    assert obj.status != "completed" or isinstance(json.loads(obj.output_text), dict)


def test_text_format_with_tools_is_an_answer_or_calls(server, client):
    """tool_choice auto with text.format (as openai-agents sends an output_type): each turn is
    either calls with valid arguments or one answer under the format, whichever the model starts."""
    fmt = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}
    for seed in range(4):
        r = client.responses.create(
            model=server.model,
            input="Weather in Rome?",
            tools=[WEATHER],
            text=fmt,
            max_output_tokens=300,
            temperature=1.0,
            extra_body={"seed": seed},
        )
        assert r.status == "completed"
        if r.output[0].type == "function_call":
            assert all(o.type == "function_call" and valid_weather_args(o.arguments) for o in r.output)
        else:
            assert [o.type for o in r.output] == ["message"] and set(json.loads(r.output_text)) == {"answer", "sure"}


def test_invalid_schema_is_a_400_before_the_stream(server, http):
    body = {
        "model": server.model,
        "input": "x",
        "stream": True,
        "text": {"format": {"type": "json_schema", "name": "bad", "schema": {"type": "object", "properties": 7}}},
    }
    r = http.post(server.url + "/v1/responses", json=body)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["param"] == "text.format"
    bad_tool = {**WEATHER, "parameters": {"type": "string"}}
    r = http.post(server.url + "/v1/responses", json={**body, "text": None, "tools": [bad_tool]})
    assert (
        r.status_code == 400 and r.json()["error"]["param"] == "tools" and "get_weather" in r.json()["error"]["message"]
    )


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"service_tier": "scale"}, "service_tier"),
        ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, "input[0].call_id"),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]},
            "input[0].arguments",
        ),
        ({"frequency_penalty": 1}, "frequency_penalty"),
        ({"input": "word " * 5000}, "input"),
        ({"speculative": "draft"}, "speculative"),
    ],
)
def test_refusals_name_the_parameter(server, http, extra, param):
    r = http.post(server.url + "/v1/responses", json={"model": server.model, "input": "x", **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


def test_fast_tier_is_served_and_reported(server, client):
    raw = client.responses.with_raw_response.create(
        model=server.model, input="hi", max_output_tokens=2, service_tier="priority", temperature=0
    )
    r = raw.parse()
    assert r.service_tier == "priority" and raw.headers["x-fastmode-tier"] == "priority"
    assert r.model_extra["requested_service_tier"] == "priority"


def _comparable(event: dict) -> dict:
    """An event without what differs between two runs of the same turn (ids, clock, metering)."""
    drop = {"id", "item_id", "call_id", "created_at", "usage"}

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in drop}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return strip(event)


def test_websocket_and_http_send_the_same_events(server, http):
    body = {
        "model": server.model,
        "input": "Weather in Paris?",
        "tools": [WEATHER],
        "tool_choice": "auto",
        "max_output_tokens": 40,
        "temperature": 0.9,
        "seed": 7,
    }
    with http.stream("POST", server.url + "/v1/responses", json={**body, "stream": True}) as resp:
        over_http = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    with connect(server.ws_url) as ws:
        over_ws = run_turn(ws, **body)
    assert len(over_http) > 4 and [_comparable(e) for e in over_ws] == [_comparable(e) for e in over_http]


def test_websocket_warm_up_then_generate(server):
    with connect(server.ws_url) as ws:
        warm = run_turn(
            ws,
            model=server.model,
            instructions="You help.",
            tools=[WEATHER],
            generate=False,
            input=[{"type": "message", "role": "user", "content": LONG_PROMPT}],
        )
        assert [e["type"] for e in warm] == ["response.created", "response.in_progress", "response.completed"]
        done = warm[-1]["response"]
        assert done["output"] == [] and done["usage"]["output_tokens"] == 0 and done["usage"]["input_tokens"] > 0
        turn = run_turn(
            ws,
            model=server.model,
            instructions="You help.",
            tools=[WEATHER],
            tool_choice="required",
            previous_response_id=done["id"],
            input="and in Oslo?",
            max_output_tokens=300,
            temperature=0,
        )
    final = turn[-1]["response"]
    assert turn[-1]["type"] == "response.completed" and final["previous_response_id"] == done["id"]
    assert final["output"][0]["type"] == "function_call" and valid_weather_args(final["output"][0]["arguments"])
    # The warm-up's prompt was prefilled: its full blocks are served from the cache.
    assert final["usage"]["input_tokens_details"]["cached_tokens"] >= (done["usage"]["input_tokens"] - 1) // 16 * 16 > 0


def test_websocket_store_false_chains_on_its_connection_only(server, client):
    with connect(server.ws_url) as ws:
        first = run_turn(ws, model=server.model, input="hi", max_output_tokens=2, store=False)[-1]["response"]
        second = run_turn(ws, model=server.model, input="more", max_output_tokens=2, previous_response_id=first["id"])[
            -1
        ]
        assert second["type"] in ("response.completed", "response.incomplete")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first["id"])


def test_output_text_logprobs(server, client):
    r = client.responses.create(
        model=server.model,
        input=LONG_PROMPT,
        max_output_tokens=5,
        temperature=0,
        include=["message.output_text.logprobs"],
        top_logprobs=3,
    )
    logprobs = r.output[0].content[0].logprobs
    assert len(logprobs) == r.usage.output_tokens == 5
    for lp in logprobs:
        assert lp.logprob <= 0 and len(lp.top_logprobs) == 3 and bytes(lp.bytes).decode("utf-8", "replace")
        # Greedy: the chosen token is the most likely one.
        assert lp.logprob == pytest.approx(max(t.logprob for t in lp.top_logprobs), abs=1e-4)
    events = list(
        client.responses.create(
            model=server.model,
            input=LONG_PROMPT,
            max_output_tokens=5,
            temperature=0,
            include=["message.output_text.logprobs"],
            top_logprobs=3,
            stream=True,
        )
    )
    streamed = [(lp.token, lp.logprob) for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    done = [(lp.token, lp.logprob) for lp in events[-4].logprobs]
    # Each delta carries its tokens' logprobs; a token whose text is held back (part of a
    # UTF-8 character at the end) is only in the done event, which has every token.
    assert done == [(lp.token, lp.logprob) for lp in logprobs] and done[: len(streamed)] == streamed
    assert len(streamed) >= len(done) - 3


def test_stream_disconnect_frees_kv(server):
    body = {"model": server.model, "input": LONG_PROMPT, "max_output_tokens": 400, "temperature": 0, "stream": True}
    with httpx.Client(timeout=30) as c, c.stream("POST", server.url + "/v1/responses", json=body) as resp:
        for line in resp.iter_lines():
            if "response.output_text.delta" in line:
                break
    assert server.wait_idle()


def test_engine_failure_is_response_failed(server, client, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("injected step failure")

    monkeypatch.setattr(server.engine.runner, "execute", broken)
    events = list(client.responses.create(model=server.model, input="hi", max_output_tokens=5, stream=True))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *TEXT_DONE,
        "response.failed",
    ]
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "server_error" and failed.error.message
    assert failed.output[0].status == "incomplete"
    with pytest.raises(openai.InternalServerError) as e:
        client.responses.create(model=server.model, input="hi", max_output_tokens=5)
    assert e.value.body["type"] == "server_error"
    monkeypatch.undo()
    assert server.wait_idle()
    assert client.responses.create(model=server.model, input="hi", max_output_tokens=2, temperature=0).status
