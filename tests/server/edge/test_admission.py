"""429s, queue bounds, the fast lane, and API keys."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import anthropic
import httpx
import openai
import pytest
from websockets.sync.client import connect

from fastmode.engine.tiers import Tier
from fastmode.server.config import ServerConfig
from fastmode.server.edge.admission import TierChoice
from fastmode.server.edge.errors import ApiError
from tests.server.conftest import chat_body, serve


@contextlib.contextmanager
def open_stream(http, server, path="/v1/chat/completions", body=None):
    """A long streaming request held open (its first event read) until the block ends."""
    with http.stream("POST", server.url + path, json=body or {**chat_body(server.model), "stream": True}) as r:
        assert r.status_code == 200, r.read()
        # Keep the line iterator referenced: dropping it closes the connection (a disconnect).
        lines = r.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        yield r


def wait_for(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_rate_limits_answer_429_with_retry_after_in_each_dialect(tiny_loaded, http):
    cfg = ServerConfig(fast_requests_per_min=2, fast_output_tokens_per_min=300)
    with serve(tiny_loaded, cfg) as s:
        oa = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        ok = oa.chat.completions.with_raw_response.create(
            model=s.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, service_tier="priority"
        )
        assert ok.headers["x-ratelimit-limit-requests"] == "2" and ok.headers["x-ratelimit-remaining-requests"] == "1"
        ant = anthropic.Anthropic(base_url=s.url, api_key="x", max_retries=0)
        raw = ant.messages.with_raw_response.create(
            model=s.model, max_tokens=4, speed="fast", messages=[{"role": "user", "content": "hi"}]
        )
        assert raw.headers["anthropic-fast-output-tokens-limit"] == "300"
        with pytest.raises(openai.RateLimitError) as e:
            oa.chat.completions.create(
                model=s.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, service_tier="fast"
            )
        assert int(e.value.response.headers["retry-after"]) >= 1
        assert (
            e.value.body["code"] == "rate_limit_exceeded" and "x-ratelimit-reset-requests" in e.value.response.headers
        )
        with pytest.raises(anthropic.RateLimitError) as e:
            ant.messages.create(model=s.model, max_tokens=4, speed="fast", messages=[{"role": "user", "content": "hi"}])
        assert e.value.body["error"]["type"] == "rate_limit_error"
        assert (
            "anthropic-fast-requests-remaining" in e.value.response.headers
            and "retry-after" in e.value.response.headers
        )
        # The documented fallback: retry without fast mode; auto falls back by itself and says so.
        assert (
            ant.messages.create(model=s.model, max_tokens=4, messages=[{"role": "user", "content": "hi"}]).usage.speed
            == "standard"
        )
        r = oa.chat.completions.create(
            model=s.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, service_tier="auto"
        )
        assert (
            r.service_tier == "default" and r.model_extra["service_tier_fallback_reason"] == "fast rate limit reached"
        )
        too_big = http.post(
            s.url + "/v1/messages",
            json={
                "model": s.model,
                "max_tokens": 400,
                "speed": "fast",
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
        assert too_big.status_code == 429 and "too large" in too_big.json()["error"]["message"]


def test_full_fast_lane_refuses_explicit_fast_and_downgrades_auto(tiny_loaded, http):
    # Capacity 2 * 0.5 = 1 fast request; a lane of 2 lets the downgraded request run beside it.
    with serve(tiny_loaded, ServerConfig(fast_lane_full_factor=0.5), fast_lane_max_batch=2) as s:
        with open_stream(http, s, body={**chat_body(s.model), "stream": True, "service_tier": "priority"}):
            r = http.post(s.url + "/v1/chat/completions", json=chat_body(s.model, max_tokens=3, service_tier="fast"))
            assert r.status_code == 429 and r.json()["error"]["code"] == "fast_lane_full" and "retry-after" in r.headers
            r = http.post(
                s.url + "/v1/messages",
                json={
                    "model": s.model,
                    "max_tokens": 3,
                    "speed": "fast",
                    "messages": [{"role": "user", "content": "hi"}],
                },
            )
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
            auto = http.post(
                s.url + "/v1/chat/completions", json=chat_body(s.model, max_tokens=3, service_tier="auto"), timeout=30
            ).json()
            assert auto["service_tier"] == "default" and auto["service_tier_fallback_reason"] == "fast lane full"
            assert auto["requested_service_tier"] == "auto"
        assert s.wait_idle()
        after = http.post(
            s.url + "/v1/chat/completions", json=chat_body(s.model, max_tokens=3, service_tier="auto"), timeout=30
        )
        assert after.json()["service_tier"] == "priority"


def test_bounded_queue_refuses_flex_first_then_everyone(tiny_loaded, http):
    cfg = ServerConfig(max_waiting_requests=2, flex_queue_fraction=0.5)
    with serve(tiny_loaded, cfg, max_num_seqs=1) as s:
        waiting = lambda: len(s.engine.scheduler.waiting)  # noqa: E731
        with open_stream(http, s), open_stream(http, s):
            wait_for(lambda: waiting() == 1)
            flex = http.post(s.url + "/v1/chat/completions", json=chat_body(s.model, max_tokens=3, service_tier="flex"))
            assert flex.status_code == 429 and flex.json()["error"]["code"] == "resource_unavailable"
            with open_stream(http, s):
                wait_for(lambda: waiting() == 2)
                r = http.post(s.url + "/v1/chat/completions", json=chat_body(s.model, max_tokens=3))
                assert (
                    r.status_code == 503 and "overloaded" in r.json()["error"]["message"] and "retry-after" in r.headers
                )
                r = http.post(
                    s.url + "/v1/messages",
                    json={"model": s.model, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
                )
                assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
        assert s.wait_idle()


def test_api_keys_in_each_dialect(tiny_loaded, http):
    with serve(tiny_loaded, ServerConfig(api_key="sekrit")) as s:
        msg = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.AuthenticationError) as e:
            openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).chat.completions.create(
                model=s.model, messages=msg, max_tokens=2
            )
        assert e.value.body["code"] == "invalid_api_key"
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sekrit", max_retries=0)
        # greedy: a sampled first token of the tiny model can be EOS
        assert (
            good.chat.completions.create(
                model=s.model, messages=msg, max_tokens=2, temperature=0
            ).usage.completion_tokens
            == 2
        )
        with pytest.raises(anthropic.AuthenticationError) as e:
            anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0).messages.create(
                model=s.model, max_tokens=2, messages=msg
            )
        assert e.value.body["error"]["type"] == "authentication_error"
        ok = anthropic.Anthropic(base_url=s.url, api_key="sekrit", max_retries=0).messages.create(
            model=s.model, max_tokens=2, messages=msg, extra_body={"temperature": 0}
        )
        assert ok.usage.output_tokens == 2
        missing = http.get(s.url + "/v1/models")
        assert missing.status_code == 401 and "no API key" in missing.json()["error"]["message"]
        assert http.get(s.url + "/metrics").status_code == 200  # scrapers need no key
        with connect(s.ws_url) as ws:
            event = json.loads(ws.recv(timeout=10))
            assert event["type"] == "error" and event["status"] == 401
        with connect(s.ws_url, additional_headers={"Authorization": "Bearer sekrit"}) as ws:
            ws.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "model": s.model,
                        "input": "hi",
                        "max_output_tokens": 2,
                        "temperature": 0,
                    }
                )
            )
            types = []
            while not types or types[-1] not in ("response.completed", "response.incomplete", "error"):
                types.append(json.loads(ws.recv(timeout=10))["type"])
            assert types[-1] == "response.incomplete"


def test_the_bound_counts_every_admitted_request_and_fast_keeps_its_room(tiny_loaded):
    """Admissions the engine does not hold yet count: 64 at once against 8 running + 16 waiting."""
    cfg = ServerConfig(max_waiting_requests=16, fast_reserved_fraction=0.25, fast_lane_full_factor=100)
    with serve(tiny_loaded, cfg, max_num_seqs=8) as s:
        ctl = s.state.main.admission
        admitted, refused = [], []
        for _ in range(64):
            try:
                admitted.append(ctl.admit(TierChoice(Tier.STANDARD, None), 10, 10))
            except ApiError as e:
                refused.append(e)
        assert len(admitted) == 8 + 16 - 4  # the last 4 waiting places are fast's
        assert all(e.kind == "overloaded" and e.retry_after_s for e in refused)
        with pytest.raises(ApiError) as e:
            ctl.admit(TierChoice(Tier.FLEX, "flex"), 10, 10)
        assert e.value.code == "resource_unavailable"
        fast = [ctl.admit(TierChoice(Tier.FAST, "priority"), 10, 10) for _ in range(4)]
        with pytest.raises(ApiError) as e:  # now the whole bound is taken
            ctl.admit(TierChoice(Tier.FAST, "priority"), 10, 10)
        assert e.value.kind == "overloaded"
        for a in admitted + fast:
            a.settle(0)
        assert ctl.num_in_flight == 0
        ctl.admit(TierChoice(Tier.STANDARD, None), 10, 10).settle(0)


def test_a_burst_over_http_holds_the_bound_and_fast_still_gets_in(tiny_loaded, http):
    cfg = ServerConfig(max_waiting_requests=4, fast_reserved_fraction=0.5)
    with serve(tiny_loaded, cfg, max_num_seqs=2) as s:
        release = threading.Event()
        statuses: list[int] = []
        lock = threading.Lock()

        def client():
            body = {**chat_body(s.model), "stream": True}
            with httpx.Client(timeout=30) as c, c.stream("POST", s.url + "/v1/chat/completions", json=body) as r:
                with lock:
                    statuses.append(r.status_code)
                if r.status_code == 200:
                    release.wait(30)

        threads = [threading.Thread(target=client) for _ in range(10)]
        for t in threads:
            t.start()
        wait_for(lambda: len(statuses) == 10, 30)
        assert 1 <= statuses.count(200) <= 4 and statuses.count(503) == 10 - statuses.count(200)
        if statuses.count(200) == 4:  # standard's share is full: fast still has its own room
            r = http.post(s.url + "/v1/chat/completions", json=chat_body(s.model, max_tokens=3))
            assert r.status_code == 503
            with open_stream(http, s, body={**chat_body(s.model), "stream": True, "service_tier": "priority"}):
                pass
        release.set()
        for t in threads:
            t.join(30)
        assert s.wait_idle(10)
