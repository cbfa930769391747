"""Every request parameter checked where the request enters, and the input limits.

A value the sampler cannot use (an out-of-range seed, NaN) is a 400 naming the field in the
dialect's format; a value that means the same as one it can use (a subnormal temperature is
greedy) is served as that. Neither reaches the engine's batch, so no other request is hurt.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from fastmode.server.config import ServerConfig
from fastmode.server.edge.errors import ApiError
from fastmode.server.edge.limits import Tokenizers
from tests.server.conftest import LONG_PROMPT, chat_body, serve


def post_raw(http, url: str, body: dict):
    """POST `body` as JSON with \\u escapes, the way a client can send lone surrogates."""
    return http.post(url, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


def openai_error(r, status=400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def anthropic_error(r, status=400) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body["error"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("seed", 2**64),
        ("seed", -(2**63) - 1),
        ("temperature", 3.0),
        ("top_p", 0.0),
        ("top_k", 2**40),
        ("presence_penalty", 5.0),
    ],
)
def test_openai_parameters_out_of_range_are_400_naming_the_field(server, http, field, value):
    r = http.post(server.url + "/v1/chat/completions", json=chat_body(server.model, max_tokens=2, **{field: value}))
    err = openai_error(r)
    assert err["param"] == field and err["message"].startswith(field)


def test_nan_and_infinity_are_refused(server, http):
    # Python's json writes NaN and Infinity, as some clients do.
    for field, value in (("temperature", float("nan")), ("top_p", float("inf")), ("frequency_penalty", float("-inf"))):
        err = openai_error(
            post_raw(http, server.url + "/v1/chat/completions", chat_body(server.model, max_tokens=2, **{field: value}))
        )
        assert err["param"] == field
    err = anthropic_error(
        post_raw(
            http,
            server.url + "/v1/messages",
            {
                "model": server.model,
                "max_tokens": 2,
                "temperature": float("nan"),
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
    )
    assert err["message"].startswith("temperature")


def test_seed_at_the_int64_bounds_is_served(server, http):
    for seed in (2**63 - 1, -(2**63)):
        r = http.post(
            server.url + "/v1/chat/completions",
            json=chat_body(server.model, max_tokens=2, temperature=1.0, seed=seed, n=2),
        )
        assert r.status_code == 200, r.text


def test_subnormal_temperature_and_top_p_are_served_greedy_token_exact(server, http):
    greedy = http.post(server.url + "/v1/chat/completions", json=chat_body(server.model, max_tokens=8)).json()
    for extra in ({"temperature": 1e-300}, {"temperature": 5e-324}, {"temperature": 1.0, "top_p": 5e-324}):
        r = http.post(server.url + "/v1/chat/completions", json={**chat_body(server.model, max_tokens=8), **extra})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]
    r = http.post(
        server.url + "/v1/messages",
        json={
            "model": server.model,
            "max_tokens": 8,
            "temperature": 5e-324,
            "messages": [{"role": "user", "content": LONG_PROMPT}],
        },
    )
    assert r.status_code == 200 and r.json()["content"][0]["text"] == greedy["choices"][0]["message"]["content"]


def test_lone_surrogates_are_400_in_every_field_and_dialect(server, http):
    bad = "a\ud800b"
    m = server.model
    cases = [
        ("/v1/chat/completions", chat_body(m, content=bad, max_tokens=2), "messages[0].content"),
        ("/v1/chat/completions", {**chat_body(m, max_tokens=2), "model": bad}, "model"),
        ("/v1/chat/completions", {**chat_body(m, max_tokens=2), "stop": [bad]}, "stop[0]"),
        ("/v1/completions", {"model": m, "prompt": bad, "max_tokens": 2}, "prompt"),
        ("/v1/responses", {"model": m, "input": bad, "max_output_tokens": 2}, "input"),
        ("/v1/responses", {"model": m, "input": "hi", "instructions": bad}, "instructions"),
    ]
    for path, body, param in cases:
        err = openai_error(post_raw(http, server.url + path, body))
        assert err["param"] == param and "surrogate" in err["message"], (path, err)
    for body in (
        {"model": m, "max_tokens": 2, "system": bad, "messages": [{"role": "user", "content": "hi"}]},
        {"model": m, "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", "text": bad}]}]},
        {"model": bad, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
    ):
        err = anthropic_error(post_raw(http, server.url + "/v1/messages", body))
        assert "surrogate" in err["message"] and err["type"] == "invalid_request_error"
    # A key counts too (tool schemas, metadata).
    err = openai_error(
        post_raw(http, server.url + "/v1/chat/completions", {**chat_body(m, max_tokens=2), "metadata": {bad: "x"}})
    )
    assert err["param"] == "metadata"


def test_bad_requests_do_not_hurt_requests_in_flight(server, http):
    """Bad values sent while others run: refused at the door, and the others finish token-exact."""
    solo = http.post(server.url + "/v1/chat/completions", json=chat_body(server.model, max_tokens=40)).json()
    results = {}

    def victim(i):
        results[i] = http.post(server.url + "/v1/chat/completions", json=chat_body(server.model, max_tokens=40)).json()

    threads = [threading.Thread(target=victim, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    for extra in ({"seed": 2**64}, {"seed": -(2**63) - 1}, {"temperature": 5e-324, "max_tokens": 3}):
        r = http.post(server.url + "/v1/chat/completions", json={**chat_body(server.model, max_tokens=40), **extra})
        assert r.status_code in (200, 400)
        post_raw(
            http,
            server.url + "/v1/messages",
            {
                "model": server.model,
                "max_tokens": 3,
                "system": "\udc00",
                "messages": [{"role": "user", "content": "x"}],
            },
        )
    for t in threads:
        t.join(60)
    text = solo["choices"][0]["message"]["content"]
    assert [results[i]["choices"][0]["message"]["content"] for i in range(3)] == [text] * 3
    assert server.wait_idle()


@pytest.fixture(scope="module")
def small(tiny_loaded):
    cfg = ServerConfig(
        max_body_mib=0.0625,
        max_messages=8,
        max_tools=2,
        max_stop_sequences=4,
        max_stop_chars=16,
        max_name_chars=32,
        max_nesting_depth=12,
    )
    with serve(tiny_loaded, cfg) as s:
        yield s


def _tool(name="f", parameters=None):
    return {"type": "function", "function": {"name": name, "parameters": parameters or {"type": "object"}}}


def test_input_limits_are_400_naming_the_field(small, http):
    m = small.model
    url = small.url + "/v1/chat/completions"
    cases = [
        ({"stop": ["x"] * 5}, "stop", "at most 4"),
        ({"stop": "y" * 17}, "stop", "at most 16"),
        ({"stop": ["ok", "z" * 17]}, "stop[1]", "at most 16"),
        ({"messages": [{"role": "user", "content": "hi"}] * 9}, "messages", "at most 8"),
        ({"tools": [_tool("a"), _tool("b"), _tool("c")]}, "tools", "at most 2"),
        ({"tools": [_tool("n" * 33)]}, "tools[0].function.name", "longer than 32"),
        ({"model": "m" * 100}, "model", "longer than 32"),
    ]
    for extra, param, words in cases:
        err = openai_error(http.post(url, json={**chat_body(m, max_tokens=2), **extra}))
        assert err["param"] == param and words in err["message"], (extra, err)
    deep: dict = {"type": "object"}
    for _ in range(20):
        deep = {"type": "object", "properties": {"a": deep}}
    err = openai_error(http.post(url, json={**chat_body(m, max_tokens=2), "tools": [_tool(parameters=deep)]}))
    assert "nests deeper than 12" in err["message"] and err["param"].startswith("tools[0].function.parameters")
    err = anthropic_error(
        http.post(
            small.url + "/v1/messages",
            json={
                "model": m,
                "max_tokens": 2,
                "stop_sequences": ["s"] * 5,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
    )
    assert err["message"].startswith("stop_sequences")
    # JSON nested past the parser's own recursion limit is a 400 too, never a 500.
    r = http.post(url, content=b"[" * 100_000 + b"]" * 100_000, headers={"content-type": "application/json"})
    assert r.status_code in (400, 413) and r.json()["error"]["type"] == "invalid_request_error"
    assert http.post(url, json=chat_body(m, max_tokens=2)).status_code == 200


def test_body_size_is_checked_before_the_body_is_read(small, http):
    big = {**chat_body(small.model, content="x" * 100_000, max_tokens=2)}
    err = openai_error(http.post(small.url + "/v1/chat/completions", json=big), 413)
    assert "larger than this server accepts" in err["message"]
    body = {"model": small.model, "max_tokens": 2, "messages": [{"role": "user", "content": "x" * 100_000}]}
    err = anthropic_error(http.post(small.url + "/v1/messages", json=body), 413)
    assert err["type"] == "request_too_large"
    # Without Content-Length (chunked): counted as it arrives.
    data = json.dumps(big).encode()

    def chunks():
        for i in range(0, len(data), 8192):
            yield data[i : i + 8192]

    r = http.post(small.url + "/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    openai_error(r, 413)
    r = http.post(
        small.url + "/v1/messages/count_tokens", content=chunks(), headers={"content-type": "application/json"}
    )
    anthropic_error(r, 413)
    assert http.get(small.url + "/health").status_code == 200


def test_tokenization_runs_off_the_event_loop_with_a_bound():
    tokenizers = Tokenizers(max_concurrent=2)
    running, peak, lock = [0], [0], threading.Lock()

    def slow_encode(text: str) -> list[int]:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        return [len(text)]

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.ensure_future(ticker())
        out = await asyncio.gather(*(tokenizers.run(slow_encode, "x" * i) for i in range(6)))
        t.cancel()
        return out, ticks

    out, ticks = asyncio.run(main())
    assert out == [[i] for i in range(6)]
    assert peak[0] == 2  # bounded, and run in parallel up to the bound
    assert ticks >= 10  # the loop kept running during 0.3 s of tokenization


def test_a_large_prompt_does_not_stall_other_requests(server, http):
    """A prompt of several MB tokenizes on a worker thread: /health answers meanwhile."""
    done = threading.Event()
    status = {}

    def big():
        r = http.post(
            server.url + "/v1/completions", json={"model": server.model, "prompt": "word " * 200_000, "max_tokens": 2}
        )
        status["big"] = r.status_code
        done.set()

    t = threading.Thread(target=big)
    t.start()
    time.sleep(0.3)  # the body is in; tokenizing it takes seconds
    health_s = []
    while not done.is_set() and len(health_s) < 5:
        t0 = time.perf_counter()
        assert http.get(server.url + "/health").status_code == 200
        health_s.append(time.perf_counter() - t0)
    t.join(60)
    assert status["big"] == 400  # longer than the context
    assert not health_s or min(health_s) < 0.5


def test_checking_a_prompt_of_millions_of_token_ids_does_not_stall_the_loop():
    from fastmode.server.edge.limits import check_body
    from fastmode.server.openai.models import CompletionRequest

    body = CompletionRequest(model="m", prompt=list(range(3_000_000)))
    t0 = time.perf_counter()
    check_body(body, ServerConfig())
    assert time.perf_counter() - t0 < 2.0  # a walk that builds a path per id takes ~10 s
    with pytest.raises(ApiError, match="surrogate") as e:  # a list of numbers and text is still read
        check_body({"enum": [1, 2.5, None, "ok", "\udfff"]}, ServerConfig())
    assert e.value.param == "enum[4]"
