"""The Anthropic dialect through the official `anthropic` SDK, fast mode included."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from tests.server.conftest import LONG_PROMPT, SHORT_PROMPT


@pytest.fixture(scope="module")
def client(server):
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as c:
        yield c


GREEDY = {"temperature": 0}  # newer SDKs dropped the sampling kwargs; the API still takes them


def msgs(content=LONG_PROMPT):
    return [{"role": "user", "content": content}]


def test_standard_message_and_metered_usage(client, server):
    raw = client.messages.with_raw_response.create(model=server.model, max_tokens=6, messages=msgs(), extra_body=GREEDY)
    m = raw.parse()
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 6
    assert m.usage.speed == "standard" and raw.headers["x-fastmode-tier"] == "standard"
    assert m.usage.model_extra["cost_usd"] > 0


def test_fast_mode_with_the_beta_header(client, server):
    raw = client.beta.messages.with_raw_response.create(
        model=server.model,
        max_tokens=6,
        messages=msgs(),
        extra_body=GREEDY,
        speed="fast",
        betas=["fast-mode-2026-02-01"],
    )
    m = raw.parse()
    assert m.usage.speed == "fast" and raw.headers["x-fastmode-tier"] == "fast"


def test_fast_mode_without_the_beta_header(client, server):
    m = client.messages.create(model=server.model, max_tokens=4, messages=msgs(), speed="fast")
    assert m.usage.speed == "fast"


def test_end_turn_and_stop_sequence(client, server):
    assert (
        client.messages.create(
            model=server.model, max_tokens=20, messages=msgs(SHORT_PROMPT), extra_body=GREEDY
        ).stop_reason
        == "end_turn"
    )
    full = client.messages.create(model=server.model, max_tokens=30, messages=msgs(), extra_body=GREEDY).content[0].text
    stop = full[8:11]
    m = client.messages.create(
        model=server.model, max_tokens=30, messages=msgs(), stop_sequences=[stop], extra_body=GREEDY
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert m.content[0].text == full[: full.index(stop)]


def test_system_blocks_prefill_and_top_k(client, server):
    m = client.messages.create(
        model=server.model,
        max_tokens=5,
        extra_body={"top_k": 5, "top_p": 0.9, "temperature": 0.5},
        system=[{"type": "text", "text": "You are terse."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": "Well,"},
        ],
    )
    assert m.usage.output_tokens <= 5


def test_sdk_stream_accumulates_the_message(client, server):
    with client.messages.stream(model=server.model, max_tokens=8, messages=msgs(), extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    plain = client.messages.create(model=server.model, max_tokens=8, messages=msgs(), extra_body=GREEDY)
    assert text == final.content[0].text == plain.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8


def test_raw_event_sequence(server):
    # Greedy, so the tiny model's text (and so the number of non-empty deltas) is fixed: sampled
    # tokens could end inside a UTF-8 character or at EOS and leave no delta to send.
    body = {
        "model": server.model,
        "max_tokens": 5,
        "messages": msgs(),
        "stream": True,
        "speed": "fast",
        "temperature": 0,
    }
    with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=30) as r:
        events = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
        assert r.status_code == 200
    assert events[:3] == ["message_start", "content_block_start", "ping"]
    assert set(events[3:-3]) <= {"content_block_delta"}
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_stream_usage_reports_speed(server):
    body = {
        "model": server.model,
        "max_tokens": 3,
        "messages": msgs(),
        "stream": True,
        "speed": "fast",
        "temperature": 0,
    }
    with httpx.stream("POST", server.url + "/v1/messages", json=body, timeout=30) as r:
        data = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert data[0]["message"]["usage"]["speed"] == "fast"
    delta = next(d for d in data if d["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 3


@pytest.mark.parametrize(
    "body, status, kind",
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error"),  # max_tokens missing
        ({"max_tokens": 5, "messages": []}, 400, "invalid_request_error"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "temperature": -1},
            400,
            "invalid_request_error",
        ),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "x"}]},
            400,
            "invalid_request_error",
        ),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "model": "claude-9"},
            404,
            "not_found_error",
        ),
    ],
)
def test_errors_in_anthropic_format(server, body, status, kind, http):
    r = http.post(server.url + "/v1/messages", json={"model": server.model, **body}, timeout=30)
    assert r.status_code == status
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == kind and r.json()["error"]["message"]


def test_sdk_raises_typed_errors(client, server):
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=5, messages=msgs())
    with pytest.raises(anthropic.BadRequestError, match="context limit"):
        client.messages.create(model=server.model, max_tokens=10, messages=[{"role": "user", "content": "a b " * 600}])


def test_count_tokens_matches_usage(client, server):
    counted = client.messages.count_tokens(model=server.model, messages=msgs(), system="be brief")
    m = client.messages.create(model=server.model, max_tokens=2, messages=msgs(), system="be brief")
    assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens
