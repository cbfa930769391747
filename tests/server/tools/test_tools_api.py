"""Tools, structured output, n, logprobs and penalties over HTTP, through the official SDKs.

The tiny model is random: nothing here relies on what it would choose. The
grammar guarantees the shape of every call and every structured answer, and
tool_choice forces a call where a test needs one. The tools' schemas are
bounded (enums, integer ranges, no extra properties) so a constrained answer
always ends well within max_tokens. The server's model has a longer context
than the shared tiny model's 512 tokens: the tool descriptions in the system
prompt take ~600 tokens of its 384-token vocabulary.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest

from fastmode.loader import load_model
from tests.builders import build_hf_model
from tests.server.conftest import serve

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Berlin"]}, "days": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME_SCHEMA = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": WEATHER_SCHEMA,
            "strict": True,
        },
    },
    {"type": "function", "function": {"name": "get_time", "description": "The time", "parameters": TIME_SCHEMA}},
]
ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in OPENAI_TOOLS
]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_TOKENS = 200  # a call takes ~80 tokens of the tiny vocabulary


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    path = build_hf_model(tmp_path_factory.mktemp("tiny-long"), "llama", max_position_embeddings=4096)
    with serve(load_model(str(path), "float32")) as s:
        yield s


@pytest.fixture(scope="module")
def oai(tool_server):
    with openai.OpenAI(base_url=tool_server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def ant(tool_server):
    with anthropic.Anthropic(base_url=tool_server.url, api_key="unused", max_retries=0) as c:
        yield c


def valid(name: str, arguments: dict) -> dict:
    jsonschema.validate(arguments, SCHEMAS[name])
    return arguments


def chat(oai, server, messages=ASK, **kw):
    kw.setdefault("max_tokens", CALL_TOKENS)
    kw.setdefault("temperature", 0)
    return oai.chat.completions.create(model=server.model, messages=messages, **kw)


# --- OpenAI Chat Completions ---------------------------------------------------------------


def test_forced_call_on_the_fast_tier_then_the_result_goes_back(oai, tool_server):
    raw = oai.chat.completions.with_raw_response.create(
        model=tool_server.model,
        messages=ASK,
        tools=OPENAI_TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=CALL_TOKENS,
        temperature=0,
        service_tier="priority",
    )
    r = raw.parse()
    assert r.service_tier == "priority" and raw.headers["x-fastmode-tier"] == "priority"
    assert raw.headers["x-request-id"] == r.id
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    valid(call.function.name, json.loads(call.function.arguments))
    # The second turn sends the call and its result back; it completes, on a longer prompt.
    history = ASK + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    second = chat(oai, tool_server, history, tools=OPENAI_TOOLS, max_tokens=8, service_tier="priority")
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert second.usage.prompt_tokens > r.usage.prompt_tokens
    # The same history without tools renders too (calls and results in the fallback's layout).
    assert chat(oai, tool_server, history, max_tokens=4).choices[0].finish_reason in ("stop", "length")


def test_streamed_call_matches_the_plain_one(oai, tool_server):
    kw = {
        "tools": OPENAI_TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        "service_tier": "priority",
    }
    plain = chat(oai, tool_server, **kw).choices[0]
    chunks = list(chat(oai, tool_server, stream=True, stream_options={"include_usage": True}, **kw))
    assert all(c.service_tier == "priority" for c in chunks)
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    first = deltas[0]
    assert first.index == 0 and first.id.startswith("call_") and first.function.name == "get_time"
    assert all(d.id is None and d.function.name is None for d in deltas[1:])
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert len(deltas) > 2  # the arguments arrive in pieces
    assert arguments == plain.message.tool_calls[0].function.arguments
    assert valid("get_time", json.loads(arguments))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens > 0


def test_required_with_parallel_calls_gives_valid_calls(oai, tool_server):
    r = chat(oai, tool_server, tools=OPENAI_TOOLS, tool_choice="required", max_tokens=400)
    calls = r.choices[0].message.tool_calls or []
    if r.choices[0].finish_reason == "tool_calls":
        assert calls
    for c in calls:  # every finished call is well-formed, whatever the model chose
        valid(c.function.name, json.loads(c.function.arguments))
    assert len({c.id for c in calls}) == len(calls)


def test_auto_answers_with_text_or_valid_calls(oai, tool_server):
    for seed in (1, 2):
        m = chat(oai, tool_server, tools=OPENAI_TOOLS, tool_choice="auto", temperature=1.0, seed=seed).choices[0]
        for c in m.message.tool_calls or []:
            valid(c.function.name, json.loads(c.function.arguments))
        assert m.message.content is not None or m.message.tool_calls
        assert "<tool_call>" not in (m.message.content or "")


def test_tool_choice_none_renders_no_tools(oai, tool_server):
    with_tools = chat(oai, tool_server, tools=OPENAI_TOOLS, tool_choice="none", max_tokens=4)
    without = chat(oai, tool_server, max_tokens=4)
    assert with_tools.usage.prompt_tokens == without.usage.prompt_tokens
    assert with_tools.choices[0].message.tool_calls is None


def test_response_format_json_schema_and_json_object(oai, tool_server):
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER_SCHEMA, "strict": True}}
    r = chat(oai, tool_server, response_format=fmt, service_tier="priority")
    assert r.choices[0].finish_reason == "stop"
    valid("get_weather", json.loads(r.choices[0].message.content))
    obj = chat(oai, tool_server, response_format={"type": "json_object"}, max_tokens=30)
    assert obj.choices[0].message.content.startswith("{")


def test_response_format_with_tools(oai, tool_server):
    # As openai-agents sends it: the final answer's format, with tools the model may call first.
    fmt = {"type": "json_schema", "json_schema": {"name": "report", "schema": TIME_SCHEMA, "strict": True}}
    for seed in (1, 2, 3):
        m = chat(oai, tool_server, tools=OPENAI_TOOLS, response_format=fmt, temperature=1.0, seed=seed).choices[0]
        if m.finish_reason == "tool_calls":
            for c in m.message.tool_calls:
                valid(c.function.name, json.loads(c.function.arguments))
        elif m.finish_reason == "stop":
            valid("get_time", json.loads(m.message.content))
    forced = chat(
        oai, tool_server, tools=OPENAI_TOOLS, response_format=fmt, tool_choice="required", parallel_tool_calls=False
    ).choices[0]
    assert forced.finish_reason == "tool_calls" and len(forced.message.tool_calls) == 1


def test_invalid_schemas_are_400s_naming_them(oai, tool_server):
    bad = {"type": "object", "properties": {"x": {"type": "strng"}}}
    with pytest.raises(openai.BadRequestError) as e:
        chat(
            oai, tool_server, tools=[{"type": "function", "function": {"name": "f", "parameters": bad, "strict": True}}]
        )
    assert e.value.body["param"] == "tools" and "tools[0] (f)" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        chat(
            oai,
            tool_server,
            response_format={"type": "json_schema", "json_schema": {"name": "o", "schema": bad, "strict": True}},
        )
    assert e.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, tool_server, tools=OPENAI_TOOLS, tool_choice={"type": "function", "function": {"name": "other"}})
    assert e.value.body["param"] == "tool_choice" and "'other'" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        chat(
            oai,
            tool_server,
            messages=ASK
            + [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{not json"}}
                    ],
                }
            ],
        )
    assert e.value.body["param"] == "messages[1].tool_calls[0].function.arguments"
    assert tool_server.wait_idle()


def test_n_choices_share_the_prompt_and_count_in_usage(oai, tool_server):
    r = chat(oai, tool_server, n=2, max_tokens=6)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content == r.choices[1].message.content  # greedy
    assert r.usage.completion_tokens == 12
    sampled = chat(oai, tool_server, n=3, max_tokens=6, temperature=1.0, seed=5)
    again = chat(oai, tool_server, n=3, max_tokens=6, temperature=1.0, seed=5)
    assert [c.message.content for c in sampled.choices] == [c.message.content for c in again.choices]
    assert len({c.message.content for c in sampled.choices}) > 1  # each choice samples on its own
    chunks = list(
        chat(
            oai,
            tool_server,
            n=2,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
            service_tier="priority",
        )
    )
    finished = {
        c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    }
    assert finished == {0: "length", 1: "length"} and chunks[-1].usage.completion_tokens == 10


def test_chat_logprobs(oai, tool_server):
    r = chat(oai, tool_server, max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
        assert t.logprob == pytest.approx(max(x.logprob for x in t.top_logprobs))  # greedy: the most likely
    streamed = list(chat(oai, tool_server, max_tokens=6, logprobs=True, stream=True))
    tokens = [t for c in streamed for t in ((c.choices[0].logprobs.content or []) if c.choices[0].logprobs else [])]
    assert [t.token for t in tokens] == [t.token for t in content]
    with pytest.raises(openai.BadRequestError):
        chat(oai, tool_server, max_tokens=2, top_logprobs=2)  # without logprobs: true


def test_completions_logprobs_and_n(oai, tool_server):
    r = oai.completions.create(
        model=tool_server.model, prompt="def add(a, b):", max_tokens=5, temperature=0, logprobs=2, n=2
    )
    assert len(r.choices) == 2 and r.usage.completion_tokens == 10
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert lp.text_offset[0] == 0 and all(len(t) == 2 for t in lp.top_logprobs)


def test_logit_bias_and_penalties(oai, tool_server):
    tok = tool_server.engine.tokenizer
    target = tok.encode("fox", add_special_tokens=False)[0]
    r = chat(oai, tool_server, max_tokens=4, logit_bias={str(target): 100})
    assert r.choices[0].message.content == tok.decode([target] * 4)
    for bad in ({"abc": 1}, {"999999": 1}, {str(target): 101}):
        with pytest.raises(openai.BadRequestError) as e:
            chat(oai, tool_server, max_tokens=2, logit_bias=bad)
        assert e.value.body["param"] == "logit_bias"
    # A frequency penalty on a forced token lets another through once the penalty outweighs the bias.
    r = chat(oai, tool_server, max_tokens=4, logit_bias={str(target): 3}, frequency_penalty=2, presence_penalty=2)
    assert r.choices[0].message.content != tok.decode([target] * 4)


# --- Anthropic Messages --------------------------------------------------------------------


def test_anthropic_forced_call_fast_then_tool_result(ant, tool_server):
    raw = ant.messages.with_raw_response.create(
        model=tool_server.model,
        max_tokens=CALL_TOKENS,
        messages=ASK,
        tools=ANTHROPIC_TOOLS,
        speed="fast",
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body={"temperature": 0},
    )
    m = raw.parse()
    assert raw.headers["request-id"] == raw.headers["x-request-id"] == m.id
    assert raw.headers["x-fastmode-tier"] == "fast" and m.usage.speed == "fast"
    assert m.stop_reason == "tool_use"
    [use] = [b for b in m.content if b.type == "tool_use"]
    assert use.id.startswith("toolu_")
    valid(use.name, use.input)
    results = [
        {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "sunny"}]},
        {"type": "text", "text": "And tomorrow?"},
    ]
    second = ant.messages.create(
        model=tool_server.model,
        max_tokens=6,
        tools=ANTHROPIC_TOOLS,
        speed="fast",
        messages=ASK + [{"role": "assistant", "content": m.content}, {"role": "user", "content": results}],
    )
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    errored = [{"type": "tool_result", "tool_use_id": use.id, "content": "no such city", "is_error": True}]
    third = ant.messages.create(
        model=tool_server.model,
        max_tokens=6,
        tools=ANTHROPIC_TOOLS,
        messages=ASK + [{"role": "assistant", "content": m.content}, {"role": "user", "content": errored}],
    )
    assert third.usage.input_tokens + third.usage.cache_read_input_tokens > m.usage.input_tokens


def test_anthropic_streamed_tool_use(ant, tool_server):
    kw = {
        "model": tool_server.model,
        "max_tokens": CALL_TOKENS,
        "messages": ASK,
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "extra_body": {"temperature": 0},
    }
    plain = ant.messages.create(**kw)
    with ant.messages.stream(**kw, speed="fast") as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [e for e in events if e.type == "content_block_start"]
    assert [s.content_block.type for s in starts] == ["tool_use"] and starts[0].index == 0
    partial = [e.delta.partial_json for e in events if e.type == "content_block_delta"]
    assert len(partial) > 2 and all(
        e.delta.type == "input_json_delta" for e in events if e.type == "content_block_delta"
    )
    [use] = final.content
    assert use.type == "tool_use" and use.name == "get_weather" and final.stop_reason == "tool_use"
    assert json.loads("".join(partial)) == use.input == plain.content[0].input
    valid("get_weather", use.input)


def test_anthropic_tool_choice_none_and_count_tokens(ant, tool_server):
    m = ant.messages.create(
        model=tool_server.model,
        max_tokens=8,
        messages=ASK,
        tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "none"},
        extra_body={"temperature": 0},
    )
    assert [b.type for b in m.content] == ["text"] and m.stop_reason in ("end_turn", "max_tokens")
    with_tools = ant.messages.count_tokens(model=tool_server.model, messages=ASK, tools=ANTHROPIC_TOOLS)
    without = ant.messages.count_tokens(model=tool_server.model, messages=ASK)
    assert with_tools.input_tokens > without.input_tokens
    assert with_tools.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_anthropic_tool_errors(tool_server, http):
    base = {"model": tool_server.model, "max_tokens": 5, "messages": ASK}
    cases = [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
        ({"tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "'nope'"),
        ({"tools": [{"name": "f", "input_schema": {"type": "string"}}]}, "tools[0] (f)"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "messages[0].content[0].tool_use_id"),
    ]
    for change, words in cases:
        r = http.post(tool_server.url + "/v1/messages", json={**base, **change})
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert words in r.json()["error"]["message"]


def test_unknown_route_lists_the_routes(tool_server):
    r = httpx.post(tool_server.url + "/v1/chat/completion", json={})
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "POST /v1/chat/completions" in message and "POST /v1/messages" in message
    r = httpx.get(tool_server.url + "/v1/messages/batches")
    assert r.status_code == 404 and "POST /v1/messages" in r.json()["error"]["message"]
