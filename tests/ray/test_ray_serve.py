"""The pools on a local Ray cluster: both dialects through the ingress, routing by tier, auto's
fallback, prefix affinity, the Responses WebSocket, and a replica killed under load.

One application for the module, kept small for a shared 2-core machine: the
embedded model, one engine thread a replica, a standard pool of two replicas and
a fast pool of one whose lane holds a single request (so one held fast request
saturates it), and a few tokens a request. Skipped when Ray is not installed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from fastmode.ray import build_app  # noqa: E402
from fastmode.server.config import ServerConfig  # noqa: E402

pytestmark = pytest.mark.slow

APP = "fastmode"
POOLS = {
    "pools": {
        "standard": {"replicas": 2, "max_num_seqs": 4},
        "fast": {"replicas": 1, "max_num_seqs": 2, "fast_lane_max_batch": 1},
    }
}
ENGINE = {"num_threads": 1, "kv_cache_gib": 0.05, "speculative_method": "off"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    port = _free_port()
    ray.init(num_cpus=3, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(POOLS, ENGINE, ServerConfig(fast_lane_full_factor=1.0)), name=APP, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120) as c:
        yield c


def chat(tier: str | None = None, max_tokens: int = 4, **extra) -> dict:
    body = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Say hi."}]}
    body.update(max_tokens=max_tokens, temperature=0, **extra)
    if tier is not None:
        body["service_tier"] = tier
    return body


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a series' samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.index("}")]))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_app_builder_takes_serve_flags_as_arguments():
    from fastmode.ray import app_builder

    app = app_builder({"pools": "standard=2,fast=1", "num_threads": 2, "fast_requests_per_min": "60"})
    assert isinstance(app, serve.Application)
    with pytest.raises(ValueError, match="bad arguments"):
        app_builder({"pools": "standard=1", "max_num_seqs": "many"})


def test_both_dialects_route_by_tier(url, http):
    fast = http.post(url + "/v1/chat/completions", json=chat("priority"))
    assert fast.status_code == 200, fast.text
    assert fast.json()["service_tier"] == "priority" and fast.headers["x-fastmode-tier"] == "priority"
    assert fast.json()["usage"]["completion_tokens"] == 4
    standard = http.post(url + "/v1/chat/completions", json=chat())
    assert standard.status_code == 200 and standard.json()["service_tier"] == "default"
    body = {
        "model": "SmolLM2-135M-Instruct",
        "max_tokens": 4,
        "speed": "fast",
        "stream": True,
        "messages": [{"role": "user", "content": "Say hi."}],
    }
    with http.stream("POST", url + "/v1/messages", json=body) as r:
        assert r.status_code == 200 and r.headers["x-fastmode-tier"] == "fast"
        events = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    page = http.get(url + "/metrics").text
    assert metric(page, "fastmode:pool_request_success_total", pool="fast", tier="fast") >= 2
    assert metric(page, "fastmode:pool_request_success_total", pool="standard", tier="standard") >= 1
    assert metric(page, "fastmode:pool_request_success_total", pool="standard", tier="fast") == 0
    assert metric(page, "fastmode:pool_replicas", pool="standard") == 2
    assert metric(page, "fastmode:pool_generation_tokens_total", pool="fast") >= 8


def test_auto_falls_back_to_standard_while_the_fast_pool_is_saturated(url, http):
    held = chat("priority", max_tokens=200, ignore_eos=True, stream=True)
    with http.stream("POST", url + "/v1/chat/completions", json=held) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        auto = http.post(url + "/v1/chat/completions", json=chat("auto"))
        assert auto.status_code == 200, auto.text
        assert auto.json()["service_tier"] == "default"
        assert auto.json()["service_tier_fallback_reason"] == "fast lane full"
        refused = http.post(url + "/v1/chat/completions", json=chat("priority"))
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "fast_lane_full"
        anthropic_fast = {
            "model": "SmolLM2-135M-Instruct",
            "max_tokens": 4,
            "speed": "fast",
            "messages": [{"role": "user", "content": "hi"}],
        }
        refused = http.post(url + "/v1/messages", json=anthropic_fast)
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "rate_limit_error"
    # The held request was aborted when its stream closed; the lane frees once the ingress settles it.
    deadline = time.monotonic() + 30
    while True:
        again = http.post(url + "/v1/chat/completions", json=chat("auto"))
        if again.json().get("service_tier") == "priority" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert again.json()["service_tier"] == "priority"


def test_a_conversations_next_turn_hits_its_replicas_prefix_cache(url, http):
    # Four conversations over the two standard replicas: by random routing, about half of the
    # second turns would land where their prefix is not cached.
    for i in range(4):
        first = f"Conversation {i}: " + " ".join(f"item{i}-{k}" for k in range(40)) + ". Summarize."
        turn1 = http.post(
            url + "/v1/completions", json={"model": "SmolLM2-135M-Instruct", "prompt": first, "max_tokens": 2}
        )
        assert turn1.status_code == 200, turn1.text
        second = first + turn1.json()["choices"][0]["text"] + " And now in one word:"
        turn2 = http.post(
            url + "/v1/completions", json={"model": "SmolLM2-135M-Instruct", "prompt": second, "max_tokens": 2}
        )
        assert turn2.status_code == 200
        usage = turn2.json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 64, (i, usage)


def test_responses_websocket_passes_through(url):
    with connect(url.replace("http://", "ws://") + "/v1/responses") as ws:
        ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": "SmolLM2-135M-Instruct",
                    "input": "Say hi.",
                    "max_output_tokens": 4,
                    "service_tier": "priority",
                }
            )
        )
        events = []
        while not events or events[-1]["type"] not in ("response.completed", "response.incomplete", "error"):
            events.append(json.loads(ws.recv(timeout=60)))
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["service_tier"] == "priority"
    assert events[-1]["response"]["usage"]["output_tokens"] == 4


def _standard_replica_pids(timeout_s: float = 60.0) -> dict[str, int]:
    """replica id -> pid of the standard pool's replicas (asked until both have answered)."""
    handle = serve.get_deployment_handle("fastmode-standard", app_name=APP)
    seen: dict[str, int] = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < 2 and time.monotonic() < deadline:
        try:
            card = handle.describe.remote().result(timeout_s=timeout_s)
        except ray.exceptions.RayError:  # a replica that just died, until Ray's router drops it
            time.sleep(0.5)
            continue
        seen[card.replica] = card.pid
    return seen


def test_a_killed_replica_fails_only_its_requests_and_ray_replaces_it(url, http):
    pids = _standard_replica_pids()
    assert len(pids) == 2
    results: list[str] = [""] * 6
    started = threading.Barrier(len(results) + 1, timeout=120)

    def stream(i: int) -> None:
        body = {
            "model": "SmolLM2-135M-Instruct",
            "prompt": f"Request {i} counts: " + " ".join(str(i * 100 + k) for k in range(12)),
            "max_tokens": 48,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.Client(timeout=120) as c, c.stream("POST", url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = (line for line in r.iter_lines() if line.startswith("data: "))
            first = next(lines)
            started.wait()
            last = first
            for line in lines:
                last = line
        if last == "data: [DONE]":
            results[i] = "done"
        else:
            err = json.loads(last.removeprefix("data: "))["error"]
            results[i] = f"{err['type']}:{err['code']}"

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    started.wait()  # every request is streaming
    victim = next(iter(pids.values()))
    os.kill(victim, signal.SIGKILL)
    for t in threads:
        t.join(120)
    assert set(results) <= {"done", "server_error:replica_failed"}, results
    assert "done" in results, results  # the other replica's requests finished
    assert "server_error:replica_failed" in results, results  # the victim's failed, each with an error event
    # The pool keeps serving from the survivor while Ray replaces the dead replica.
    for _ in range(3):
        r = http.post(url + "/v1/completions", json={"model": "SmolLM2-135M-Instruct", "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        now = _standard_replica_pids()
        if len(now) == 2 and victim not in now.values():
            break
        time.sleep(2)
    assert len(now) == 2 and victim not in now.values(), now
    page = http.get(url + "/metrics").text
    assert metric(page, "fastmode:pool_replica_failures_total", pool="standard") >= 1
