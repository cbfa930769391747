"""A client that leaves aborts its request and frees its KV; shutdown drains."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.server.conftest import chat_body, serve


def aborted_total(http, server) -> float:
    text = http.get(server.url + "/metrics").text
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("fastmode:request_aborted_total")
    )


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/chat/completions", {"stream": True}),
        ("/v1/completions", {"stream": True, "prompt": "tell me"}),
        ("/v1/messages", {"stream": True, "speed": "fast"}),
    ],
)
def test_stream_disconnect_aborts_and_frees_kv(server, http, path, body):
    before = aborted_total(http, server)
    payload = {**chat_body(server.model), **body}
    if "prompt" in payload:
        payload.pop("messages")
    with httpx.Client(timeout=30) as own:  # its own connection, closed under the stream
        with own.stream("POST", server.url + path, json=payload) as r:
            lines = r.iter_lines()
            num_data = 0
            while num_data < 4:
                num_data += next(lines).startswith("data: ")
    assert server.wait_idle(), "the request kept running after its client left"
    assert server.kv_all_free()
    assert aborted_total(http, server) == before + 1


def test_non_streaming_disconnect_aborts(server, http):
    before = aborted_total(http, server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=chat_body(server.model, max_tokens=400), timeout=0.3)
    assert server.wait_idle()
    assert aborted_total(http, server) == before + 1


def test_shutdown_drains_a_request_in_flight(tiny_loaded, http):
    lines: list[str] = []
    with serve(tiny_loaded) as s:
        started = threading.Event()

        def stream():
            body = {**chat_body(s.model, max_tokens=120), "stream": True}
            with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=30) as r:
                for line in r.iter_lines():
                    lines.append(line)
                    started.set()

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(10)
        engine = s.engine
    # serve() has asked uvicorn to exit: it lets the response finish, then stops the engine.
    t.join(10)
    assert [line for line in lines if line][-1] == "data: [DONE]"
    assert (
        not engine.scheduler.running
        and engine.scheduler.block_manager.num_free_blocks == engine.scheduler_config.num_blocks
    )
