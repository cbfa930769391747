"""Bad input answered in each dialect's own error format (raw httpx)."""

from __future__ import annotations

import pytest

from tests.server.conftest import chat_body


def post(http, server, path, **kw):
    return http.post(server.url + path, **kw)


def openai_error(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def anthropic_error(r, status):
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body["error"]


def test_malformed_json(server, http):
    headers = {"content-type": "application/json"}
    err = openai_error(post(http, server, "/v1/chat/completions", content=b'{"model": ', headers=headers), 400)
    assert "not valid JSON" in err["message"]
    err = anthropic_error(post(http, server, "/v1/messages", content=b"{nope", headers=headers), 400)
    assert "not valid JSON" in err["message"]
    assert (
        "JSON object"
        in openai_error(post(http, server, "/v1/chat/completions", content=b"[1, 2]", headers=headers), 400)["message"]
    )


@pytest.mark.parametrize(
    "change, param",
    [
        ({"max_tokens": "many"}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
        ({"top_p": 0}, "top_p"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content[0]",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}]},
            "messages[0].tool_calls[0].function.arguments",
        ),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_wrong_types_and_values_are_400(server, change, param, http):
    err = openai_error(post(http, server, "/v1/chat/completions", json={**chat_body(server.model), **change}), 400)
    assert err["type"] == "invalid_request_error" and err["param"] == param


def test_context_limits(server, http):
    limit = server.engine.max_model_len
    long_text = "a b " * limit
    err = openai_error(post(http, server, "/v1/chat/completions", json=chat_body(server.model, content=long_text)), 400)
    assert err["code"] == "context_length_exceeded" and str(limit) in err["message"]
    r = post(
        http,
        server,
        "/v1/messages",
        json={"model": server.model, "max_tokens": 5, "messages": [{"role": "user", "content": long_text}]},
    )
    assert "context limit" in anthropic_error(r, 400)["message"]
    # A max_tokens past the context is accepted and ends at the context: tests/server/test_context_limit.py.
    # max_tokens omitted: the rest of the context, as OpenAI does.
    ok = post(
        http, server, "/v1/completions", json={"model": server.model, "prompt": [1] * (limit - 3), "max_tokens": None}
    )
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 3


def test_bad_token_ids_and_unknown_routes(server, http):
    err = openai_error(post(http, server, "/v1/completions", json={"model": server.model, "prompt": [10**9]}), 400)
    assert err["param"] == "prompt"
    missing = openai_error(http.get(server.url + "/v1/nothing-here"), 404)
    assert missing["type"] == "invalid_request_error"
    assert "this server has" in missing["message"] and "POST /v1/chat/completions" in missing["message"]
    assert "POST /v1/messages" in anthropic_error(http.post(server.url + "/v1/messages/batches"), 404)["message"]
    anthropic_error(http.get(server.url + "/v1/messages"), 405)
    assert openai_error(http.get(server.url + "/v1/models/other-model"), 404)["code"] == "model_not_found"


@pytest.mark.parametrize(
    "path, body, words",
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0]: the type 'image_url' is not accepted here (use one of 'text', 'refusal')",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": 5}]},
            "messages[0].content: input should be",
        ),
        (
            "/v1/messages",
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0]: the type 'image' is not accepted here",
        ),
        (
            "/v1/messages",
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            "messages[0].content[0].tool_use_id is required",
        ),
    ],
)
def test_history_errors_name_the_first_bad_field_in_one_sentence(server, http, path, body, words):
    r = post(http, server, path, json={"model": server.model, **body})
    err = openai_error(r, 400) if path.startswith("/v1/chat") else anthropic_error(r, 400)
    assert err["message"].startswith(words) and "\n" not in err["message"] and ";" not in err["message"]


def test_health(server, http):
    assert http.get(server.url + "/health").json() == {"status": "ok"}
