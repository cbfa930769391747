"""A request whose part of an engine step fails gets an error in its dialect's shape, while a
request running next to it finishes with exactly the text it has alone (engine/fault_isolation.py
isolates the failing request). The fault is injected in the sampler, keyed to one request."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

import fastmode.engine.model_runner as model_runner
from tests.server.conftest import LONG_PROMPT, chat_body, serve

MARK = 0.777  # the temperature of the requests the injected fault hits


@pytest.fixture(scope="module")
def server(tiny_loaded):
    with serve(tiny_loaded) as s:
        yield s


def test_the_failing_request_gets_an_error_and_its_neighbour_is_unaffected(server, monkeypatch):
    url, model = server.url, server.model
    victim = chat_body(model, LONG_PROMPT, max_tokens=400, ignore_eos=True)
    with httpx.Client(timeout=60) as c:
        alone = c.post(url + "/v1/chat/completions", json=victim).json()["choices"][0]["message"]["content"]

    sample_row = model_runner.sample_row

    batch_at_fault: list[int] = []

    def faulty_sample_row(row, p, gen):
        if p.temperature == MARK:
            batch_at_fault.append(len(server.engine.scheduler.running))
            raise RuntimeError("injected sampler fault")
        return sample_row(row, p, gen)

    monkeypatch.setattr(model_runner, "sample_row", faulty_sample_row)
    got: dict = {}

    def run_victim() -> None:
        with httpx.Client(timeout=60) as c:
            got["victim"] = c.post(url + "/v1/chat/completions", json=victim)

    t = threading.Thread(target=run_victim)
    t.start()
    deadline = time.monotonic() + 10
    while not server.engine.scheduler.running:  # the victim is generating
        assert time.monotonic() < deadline
        time.sleep(0.005)
    with httpx.Client(timeout=60) as c:
        # OpenAI, not streamed: a 500 in OpenAI's error shape, naming no Python class.
        r = c.post(url + "/v1/chat/completions", json=chat_body(model, "hi", max_tokens=20, temperature=MARK))
        assert r.status_code == 500
        err = r.json()["error"]
        assert err["type"] == "server_error" and "RuntimeError" not in err["message"]
        # OpenAI, streamed: the error in-band, after the first chunk.
        body = chat_body(model, "hi", max_tokens=20, temperature=MARK, stream=True)
        with c.stream("POST", url + "/v1/chat/completions", json=body) as s:
            lines = [line for line in s.iter_lines() if line.startswith("data:")]
        assert json.loads(lines[-1].removeprefix("data:"))["error"]["type"] == "server_error"
        # Anthropic, streamed: an `error` event in Anthropic's shape.
        body = {
            "model": model,
            "max_tokens": 20,
            "temperature": MARK,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
        with c.stream("POST", url + "/v1/messages", json=body) as s:
            lines = list(s.iter_lines())
        i = lines.index("event: error")
        event = json.loads(lines[i + 1].removeprefix("data:"))
        assert event["type"] == "error" and event["error"]["type"] == "api_error"
    t.join(60)
    assert max(batch_at_fault) > 1, "the failing requests shared no step with the victim"
    r = got["victim"]
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == alone
    assert server.wait_idle()
    with httpx.Client(timeout=60) as c:
        assert c.get(url + "/health").status_code == 200
