"""Slow and silent HTTP clients are cut off after a bounded time while the server keeps answering:
a connection that sends nothing, a request head sent a byte at a time (slow-loris), a body that
stalls, and an idle kept-alive connection. Requests and WebSockets that outlast those limits
while behaving are untouched."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import torch
import uvicorn
from websockets.sync.client import connect

from fastmode.engine.config import EngineConfig
from fastmode.engine.llm_engine import LLMEngine
from fastmode.server.app import create_app
from fastmode.server.config import ServerConfig
from fastmode.server.edge.timeouts import uvicorn_config
from tests.server.conftest import LONG_PROMPT

HEAD_S, BODY_S, KEEP_ALIVE_S = 0.6, 0.6, 0.6
SLACK_S = 1.5  # timers fire on the event loop; a loaded machine may be late
HEALTH_S = 5.0  # /health answers at once; this bound only tells "answers" from "hangs" on a loaded machine


@contextlib.contextmanager
def timed_server(tiny_loaded) -> Iterator[tuple[str, str]]:
    """The server as `fastmode serve` configures uvicorn, with short read limits; yields (url, model)."""
    threads = torch.get_num_threads()
    engine = LLMEngine(
        EngineConfig(model=str(tiny_loaded.path), dtype="float32", kv_cache_gib=0.01, num_threads=1), loaded=tiny_loaded
    )
    config = ServerConfig(http_header_timeout_s=HEAD_S, http_body_timeout_s=BODY_S, http_keep_alive_s=KEEP_ALIVE_S)
    app = create_app(engine, config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn_config(app, config, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app.state.fastmode.main.name
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def server(tiny_loaded) -> Iterator[tuple[str, str]]:
    with timed_server(tiny_loaded) as s:
        yield s


def open_socket(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    return s


def closed_after(s: socket.socket, t0: float) -> tuple[float, bytes]:
    """Read until the server closes the connection: (seconds since t0, what it sent). A reset
    (the client wrote after the server closed) also counts as closed."""
    data = b""
    s.settimeout(10)
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(4096):
            data += chunk
    return time.monotonic() - t0, data


def health_ok(url: str) -> float:
    t = time.monotonic()
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    return time.monotonic() - t


def test_silent_and_slow_loris_connections_are_closed_while_health_answers(server):
    url, _ = server
    t0 = time.monotonic()
    silent = [open_socket(url) for _ in range(10)]
    slow = [open_socket(url) for _ in range(10)]
    results: dict[int, tuple[float, bytes]] = {}

    def watch(i: int, s: socket.socket) -> None:
        results[i] = closed_after(s, t0)

    watchers = [threading.Thread(target=watch, args=(i, s), daemon=True) for i, s in enumerate(silent + slow)]
    for w in watchers:
        w.start()
    for s in slow:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n")
    # The slow clients keep dribbling header bytes, well past the limit, while /health is asked.
    stop = threading.Event()

    def dribble() -> None:
        i = 0
        while not stop.is_set():
            for j, s in enumerate(slow):
                if 10 + j not in results:  # not yet closed by the server
                    with contextlib.suppress(OSError):
                        s.sendall(b"x-pad-%d: y\r\n" % i)
            i += 1
            time.sleep(0.1)

    feeder = threading.Thread(target=dribble, daemon=True)
    feeder.start()
    try:
        for _ in range(3):
            assert health_ok(url) < HEALTH_S
        for w in watchers:
            w.join(HEAD_S + SLACK_S + 5)
    finally:
        stop.set()
        feeder.join()
        for s in silent + slow:
            s.close()
    assert sorted(results) == list(range(20)), "a connection was never closed"
    for seconds, _ in results.values():
        assert HEAD_S * 0.9 <= seconds <= HEAD_S + SLACK_S
    assert all(results[i][1] == b"" for i in range(10)), "a client that sent nothing gets no answer"
    answered = [results[i][1] for i in range(10, 20) if results[i][1]]  # empty only if reset first
    assert len(answered) >= 5 and all(d.startswith(b"HTTP/1.1 408 ") for d in answered)
    assert health_ok(url) < HEALTH_S


def test_a_stalled_body_closes_its_connection(server):
    url, model = server
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    s = open_socket(url)
    head = "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    s.sendall(head.encode() + f"content-length: {len(body)}\r\n\r\n".encode() + body[:10])
    t0 = time.monotonic()
    seconds, _ = closed_after(s, t0)
    s.close()
    assert BODY_S * 0.9 <= seconds <= BODY_S + SLACK_S
    assert health_ok(url) < HEALTH_S


def test_a_body_sent_slowly_but_steadily_is_served(server):
    url, model = server
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    ).encode()
    s = open_socket(url)
    head = "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    s.sendall(head.encode() + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode())
    chunks = [body[i : i + len(body) // 4 + 1] for i in range(0, len(body), len(body) // 4 + 1)]
    for c in chunks:  # in all longer than the body timeout, but no gap reaches it
        time.sleep(BODY_S / 3)
        s.sendall(c)
    _, data = closed_after(s, time.monotonic())
    s.close()
    assert data.startswith(b"HTTP/1.1 200 ")
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["choices"][0]["message"]["role"] == "assistant"


def test_an_idle_kept_alive_connection_is_closed(server):
    url, _ = server
    s = open_socket(url)
    s.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
    t0 = time.monotonic()
    seconds, data = closed_after(s, t0)
    s.close()
    assert data.startswith(b"HTTP/1.1 200 ")
    assert seconds <= KEEP_ALIVE_S + SLACK_S


def test_responses_and_websockets_that_outlast_the_limits_are_not_cut(server):
    url, model = server
    body = {
        "model": model,
        "messages": [{"role": "user", "content": LONG_PROMPT}],
        "max_tokens": 300,
        "temperature": 0,
        "stream": True,
    }
    with httpx.Client(timeout=30) as c, c.stream("POST", url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = []
        for line in r.iter_lines():
            if not line:
                continue
            lines.append(line)
            if len(lines) == 2:
                time.sleep(HEAD_S + BODY_S)  # the client reads slowly: the server's limits are on reads only
    assert lines[-1] == "data: [DONE]"
    with connect(url.replace("http", "ws") + "/v1/responses") as ws:
        time.sleep(HEAD_S + KEEP_ALIVE_S + 0.2)  # idle, but far below the WebSocket idle timeout
        ws.send(json.dumps({"type": "response.create", "model": model, "input": "hi", "max_output_tokens": 4}))
        while (event := json.loads(ws.recv(timeout=20)))["type"] not in ("response.completed", "response.incomplete"):
            assert event["type"] != "error", event


def test_the_timeouts_are_serve_flags():
    import argparse

    from fastmode.commands.serve import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--http-header-timeout-s", "3", "--http-body-timeout-s", "4"])
    assert (args.http_header_timeout_s, args.http_body_timeout_s, args.http_keep_alive_s) == (3.0, 4.0, 5.0)
    with pytest.raises(ValueError, match="http_header_timeout_s"):
        ServerConfig(http_header_timeout_s=0)
