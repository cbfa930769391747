"""WebSocket mode: events, previous_response_id with prefix-cache reuse, error events."""

from __future__ import annotations

import json

import pytest
from websockets.sync.client import connect

from tests.server.conftest import LONG_PROMPT

TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")


def run_turn(ws, **body) -> list[dict]:
    ws.send(json.dumps({"type": "response.create", **body}))
    events = []
    while not events or events[-1]["type"] not in TERMINAL:
        events.append(json.loads(ws.recv(timeout=30)))
    return events


def test_event_sequence_and_usage(server):
    with connect(server.ws_url) as ws:
        events = run_turn(
            ws, model=server.model, input=LONG_PROMPT, max_output_tokens=6, temperature=0, service_tier="priority"
        )
    types = [e["type"] for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert final["output"][0]["content"][0]["text"] == text == events[-4]["text"]
    assert final["usage"]["output_tokens"] == 6 and final["usage"]["cost_usd"] > 0
    assert final["service_tier"] == "priority" and final["incomplete_details"] == {"reason": "max_output_tokens"}


def test_previous_response_id_reuses_the_kv_prefix(server):
    with connect(server.ws_url) as ws:
        # Sampled (not greedy) so the reply may end inside a UTF-8 character: the prefix must still hold.
        first = run_turn(
            ws,
            model=server.model,
            instructions="You are an agent.",
            max_output_tokens=40,
            temperature=1.0,
            input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": LONG_PROMPT}]}],
        )[-1]
        prompt1 = first["response"]["usage"]["input_tokens"]
        out1 = first["response"]["usage"]["output_tokens"]
        second = run_turn(
            ws,
            model=server.model,
            instructions="You are an agent.",
            max_output_tokens=5,
            previous_response_id=first["response"]["id"],
            input="tool output: 42",
        )[-1]
    usage = second["response"]["usage"]
    assert second["response"]["previous_response_id"] == first["response"]["id"]
    # Every full block of turn 1 (prompt + reply) is served from the cache.
    assert usage["input_tokens_details"]["cached_tokens"] >= (prompt1 + out1 - 1) // 16 * 16 > 0
    assert usage["input_tokens"] > prompt1 + out1


@pytest.mark.parametrize(
    "message, code",
    [
        ("{not json", "invalid_json"),
        ('{"type": "session.update"}', "unknown_event"),
        ('{"type": "response.create", "model": "m"}', None),
    ],
)
def test_error_events_keep_the_connection_open(server, message, code):
    with connect(server.ws_url) as ws:
        ws.send(message)
        err = json.loads(ws.recv(timeout=10))
        assert err["type"] == "error" and err["status"] == 400 and err["error"]["message"]
        if code:
            assert err["code"] == code
        # The connection still serves a turn (greedy: a sampled reply could end with EOS inside 2 tokens).
        last = run_turn(ws, model=server.model, input="hi", max_output_tokens=2, temperature=0)[-1]
        assert (
            last["type"] == "response.incomplete"
            and last["response"]["incomplete_details"]["reason"] == "max_output_tokens"
        )


def test_unknown_previous_response_and_unknown_model(server):
    with connect(server.ws_url) as ws:
        err = run_turn(ws, model=server.model, input="hi", previous_response_id="resp_missing")[-1]
        assert err["code"] == "previous_response_not_found" and err["param"] == "previous_response_id"
        err = run_turn(ws, model="gpt-9", input="hi")[-1]
        assert err["status"] == 404 and err["code"] == "model_not_found"
        err = run_turn(ws, model=server.model, input="hi", tools=[{"type": "web_search"}])[-1]
        assert err["param"] == "tools"


def test_one_response_at_a_time_and_disconnect_frees_kv(server):
    with connect(server.ws_url) as ws:
        body = {
            "type": "response.create",
            "model": server.model,
            "input": LONG_PROMPT,
            "max_output_tokens": 400,
            "temperature": 0,
        }
        ws.send(json.dumps(body))
        while json.loads(ws.recv(timeout=10))["type"] != "response.output_text.delta":
            pass
        ws.send(json.dumps(body))
        while (event := json.loads(ws.recv(timeout=10)))["type"] != "error":
            assert event["type"] == "response.output_text.delta"
        assert event["code"] == "response_already_in_flight"
    # The socket closed mid-response: the request is aborted and its KV freed.
    assert server.wait_idle()
