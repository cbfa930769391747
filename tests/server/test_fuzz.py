"""Malformed input, table-driven and generated: no 5xx, every error in its dialect's shape, and the
server healthy after every case. Bounded in examples so CI stays fast."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")


def check_answer(r, path: str) -> None:
    assert r.status_code < 500, (path, r.status_code, r.text[:500])
    if r.status_code < 400:
        return
    body = r.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert "Traceback" not in r.text and len(r.text) < 4000


def post(http, server, path: str, body) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = http.post(server.url + path, content=raw, headers={"content-type": "application/json"})
    if r.status_code == 200 and r.headers.get("content-type", "").startswith("text/event-stream"):
        r.read()
    check_answer(r, path)


def bases(model: str) -> dict[str, dict]:
    msg = [{"role": "user", "content": "hi"}]
    return {
        "/v1/chat/completions": {"model": model, "messages": msg, "max_tokens": 2, "temperature": 0},
        "/v1/completions": {"model": model, "prompt": "hi", "max_tokens": 2, "temperature": 0},
        "/v1/responses": {"model": model, "input": "hi", "max_output_tokens": 2, "temperature": 0},
        "/v1/messages": {"model": model, "messages": msg, "max_tokens": 2, "temperature": 0},
        "/v1/messages/count_tokens": {"model": model, "messages": msg},
    }


CORPUS = [
    b"",
    b"{",
    b"null",
    b"[]",
    b"42",
    b'"text"',
    b"\xff\xfe",
    b"{" * 50_000,
    b"[" * 100_000,
    b'{"model": NaN}',
    b'{"messages": Infinity}',
]
FIELD_VALUES = [
    None,
    True,
    -1,
    0,
    2**64,
    -(2**63) - 1,
    1e308,
    5e-324,
    -5e-324,
    math.nan,
    math.inf,
    "",
    "\ud800",
    "x" * 5000,
    [],
    [None],
    {},
    {"a": {"b": {"c": []}}},
    [[[[[]]]]],
]


@pytest.mark.parametrize("path", OPENAI_PATHS + ANTHROPIC_PATHS)
def test_malformed_corpus(server, http, path):
    for raw in CORPUS:
        post(http, server, path, raw)
    base = bases(server.model)[path]
    for field in list(base) + ["stop", "seed", "top_p", "top_k", "n", "tools", "tool_choice", "system", "stream"]:
        for value in FIELD_VALUES:
            post(http, server, path, {**base, field: value})
    assert http.get(server.url + "/health").status_code == 200
    assert server.wait_idle()


json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.sampled_from(["\ud800", "\udfff", "auto", "fast", "priority", "function", "text", "user"])
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(path=st.sampled_from(OPENAI_PATHS + ANTHROPIC_PATHS), data=st.data())
def test_generated_requests(server, http, path, data):
    base = bases(server.model)[path]
    names = sorted(base) + [
        "stop",
        "seed",
        "top_p",
        "top_k",
        "n",
        "tools",
        "tool_choice",
        "stream",
        "logit_bias",
        "response_format",
        "text",
        "stop_sequences",
        "service_tier",
        "speed",
        "metadata",
    ]
    changes = data.draw(st.dictionaries(st.sampled_from(names), json_value, min_size=1, max_size=3))
    body = {**base, **changes}
    if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 8:
        body["max_tokens"] = 8  # keep generation short: the fuzzing is about the input
    post(http, server, path, body)
    assert http.get(server.url + "/health").status_code == 200
