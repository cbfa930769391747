"""A max_tokens past what is left of the context (clients' defaults: Anthropic SDK users send
16k-128k) is accepted; generation ends at the context limit and each dialect says so.
Only a prompt that leaves no room is a 400."""

from __future__ import annotations

import json

import pytest

from tests.server.conftest import LONG_PROMPT, chat_body, serve

CONTEXT = 64  # tokens: LONG_PROMPT runs without EOS far past this, so the context is what ends it


@pytest.fixture(scope="module")
def small(tiny_loaded):
    with serve(tiny_loaded, max_model_len=CONTEXT) as s:
        yield s


def messages_body(model: str, max_tokens: int, **extra) -> dict:
    return {
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": LONG_PROMPT}],
        "temperature": 0,
        **extra,
    }


def test_openai_ends_at_the_context_with_length(small, http):
    for field in ("max_tokens", "max_completion_tokens"):
        body = {**chat_body(small.model, max_tokens=None), field: 128_000}
        r = http.post(small.url + "/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["choices"][0]["finish_reason"] == "length"
        assert data["usage"]["prompt_tokens"] + data["usage"]["completion_tokens"] == CONTEXT
    r = http.post(
        small.url + "/v1/completions",
        json={"model": small.model, "prompt": [1] * (CONTEXT - 4), "max_tokens": 100_000, "ignore_eos": True},
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert small.wait_idle()


def test_anthropic_says_the_context_window_ended_it(small, http):
    r = http.post(small.url + "/v1/messages", json=messages_body(small.model, 128_000))
    assert r.status_code == 200, r.text
    msg = r.json()
    assert msg["stop_reason"] == "model_context_window_exceeded" and msg["stop_sequence"] is None
    used = msg["usage"]["input_tokens"] + msg["usage"]["cache_read_input_tokens"] + msg["usage"]["output_tokens"]
    assert used == CONTEXT
    # Its own budget reached first: max_tokens, as before.
    assert (
        http.post(small.url + "/v1/messages", json=messages_body(small.model, 3)).json()["stop_reason"] == "max_tokens"
    )
    with http.stream("POST", small.url + "/v1/messages", json=messages_body(small.model, 64_000, stream=True)) as s:
        assert s.status_code == 200
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == "model_context_window_exceeded"
    assert small.wait_idle()


def test_a_prompt_that_fills_the_context_is_still_a_400(small, http):
    body = {"model": small.model, "prompt": [1] * CONTEXT, "max_tokens": 1}
    err = http.post(small.url + "/v1/completions", json=body)
    assert err.status_code == 400 and err.json()["error"]["code"] == "context_length_exceeded"
    body = {**messages_body(small.model, 128_000), "messages": [{"role": "user", "content": "a b " * CONTEXT}]}
    err = http.post(small.url + "/v1/messages", json=body)
    assert err.status_code == 400 and "context limit" in err.json()["error"]["message"]
