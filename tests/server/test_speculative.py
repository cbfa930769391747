"""Per-request `speculative` in every dialect, and the OpenAI `ignore_eos` extension."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from websockets.sync.client import connect

from tests.server.conftest import SHORT_PROMPT
from tests.server.test_metrics import REPETITIVE


@pytest.fixture(scope="module")
def oa(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def ant(server):
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as c:
        yield c


def chat(oa, server, speculative=None, **kw):
    extra = {"speculative": speculative} if speculative else {}
    kw.setdefault("max_tokens", 40)
    return oa.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": REPETITIVE}], temperature=0, extra_body=extra, **kw
    )


def test_greedy_output_is_the_same_with_and_without_speculation(oa, ant, server):
    stats = server.engine.spec.stats
    off = chat(oa, server, "off").choices[0].message.content
    assert stats.drafts.get("standard", 0) == 0  # standard does not speculate unless asked
    on = chat(oa, server, "ngram").choices[0].message.content
    assert stats.drafts.get("standard", 0) > 0  # it did speculate
    assert on == off == chat(oa, server).choices[0].message.content
    # The fast tier speculates by default; "off" turns that off for one request. Same text either way.
    assert chat(oa, server, "off", service_tier="priority").choices[0].message.content == off
    texts = {
        s: ant.messages.create(
            model=server.model,
            max_tokens=40,
            messages=[{"role": "user", "content": REPETITIVE}],
            extra_body={"temperature": 0, "speculative": s},
        )
        .content[0]
        .text
        for s in ("off", "ngram")
    }
    assert texts["off"] == texts["ngram"] == off


def test_draft_without_a_draft_model_is_a_400_in_each_dialect(oa, ant, server, http):
    assert server.engine.drafter is None
    for stream in (False, True):  # refused before the stream starts, not in-band after a 200
        with pytest.raises(openai.BadRequestError) as e:
            chat(oa, server, "draft", stream=stream)
        err = e.value.body
        assert (
            err["param"] == "speculative" and err["type"] == "invalid_request_error" and "draft model" in err["message"]
        )
    r = http.post(server.url + "/v1/completions", json={"model": server.model, "prompt": "hi", "speculative": "draft"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "speculative"
    body = {
        "model": server.model,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
        "speculative": "draft",
    }
    for stream in (False, True):
        r = http.post(server.url + "/v1/messages", json={**body, "stream": stream})
        assert r.status_code == 400
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
        assert r.json()["error"]["message"].startswith("speculative:")
    with pytest.raises(anthropic.BadRequestError):
        ant.messages.create(
            model=server.model,
            max_tokens=4,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"speculative": "draft"},
        )
    with connect(server.ws_url) as ws:
        ws.send(json.dumps({"type": "response.create", "model": server.model, "input": "hi", "speculative": "draft"}))
        event = json.loads(ws.recv())
        assert event["type"] == "error" and event["status"] == 400 and event["param"] == "speculative"
    assert server.wait_idle()
    assert not any(server.state.main.admission.in_flight.values())  # refused before admission: nothing held


def test_an_unknown_method_is_a_400(oa, server, http):
    with pytest.raises(openai.BadRequestError) as e:
        chat(oa, server, "eagle")
    assert e.value.body["param"] == "speculative"
    body = {
        "model": server.model,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
        "speculative": "eagle",
    }
    r = http.post(server.url + "/v1/messages", json=body)
    assert r.status_code == 400 and r.json()["type"] == "error" and "speculative" in r.json()["error"]["message"]
    with connect(server.ws_url) as ws:
        ws.send(json.dumps({"type": "response.create", "model": server.model, "input": "hi", "speculative": "eagle"}))
        event = json.loads(ws.recv())
        assert event["type"] == "error" and event["param"] == "speculative"


def test_ignore_eos_runs_to_max_tokens(oa, server):
    ask = dict(model=server.model, messages=[{"role": "user", "content": SHORT_PROMPT}], max_tokens=12, temperature=0)
    assert oa.chat.completions.create(**ask).choices[0].finish_reason == "stop"  # EOS at once
    r = oa.chat.completions.create(**ask, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
    c = oa.completions.create(
        model=server.model, prompt=SHORT_PROMPT, max_tokens=9, temperature=0, extra_body={"ignore_eos": True}
    )
    assert c.usage.completion_tokens == 9 and c.choices[0].finish_reason == "length"
