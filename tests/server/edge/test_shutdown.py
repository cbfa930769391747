"""Graceful shutdown: new requests refused with 503 and retry-after, in-flight requests given the drain
timeout, the rest ended with an error in their own format, and the process done within seconds."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import uvicorn
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from fastmode.engine.config import EngineConfig
from fastmode.engine.llm_engine import LLMEngine
from fastmode.server.app import create_app
from fastmode.server.config import ServerConfig
from fastmode.server.edge.shutdown import DrainingServer
from tests.server.conftest import LONG_PROMPT


def _read_all(client: httpx.Client, url: str, body: dict, out: list) -> None:
    with client.stream("POST", url, json=body) as r:
        out.append(r.status_code)
        out.extend(r.iter_lines())


def test_sigterm_drains_then_ends_what_is_left_with_errors(tiny_loaded):
    engine = LLMEngine(
        EngineConfig(model=str(tiny_loaded.path), dtype="float32", kv_cache_gib=0.01, num_threads=1), loaded=tiny_loaded
    )
    drain_s = 1.0
    app = create_app(engine, ServerConfig(drain_timeout_s=drain_s))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = DrainingServer(
        uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2), app.state.fastmode, drain_s
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    model = app.state.fastmode.main.name
    # Runs to the end of the context: longer than the drain timeout.
    long = {
        "model": model,
        "messages": [{"role": "user", "content": LONG_PROMPT}],
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    anthropic_long = {
        "model": model,
        "max_tokens": 100_000,
        "messages": [{"role": "user", "content": LONG_PROMPT}],
        "stream": True,
        "temperature": 0,
    }
    oa, an = [], []
    with httpx.Client(timeout=60) as c1, httpx.Client(timeout=60) as c2, httpx.Client(timeout=10) as c3:
        threads = [
            threading.Thread(target=_read_all, args=(c1, url + "/v1/chat/completions", long, oa)),
            threading.Thread(target=_read_all, args=(c2, url + "/v1/messages", anthropic_long, an)),
        ]
        for t in threads:
            t.start()
        ws = connect(url.replace("http", "ws") + "/v1/responses")
        ws.send(json.dumps({"type": "response.create", "model": model, "input": LONG_PROMPT, "temperature": 0}))
        assert json.loads(ws.recv(timeout=10))["type"] == "response.created"
        deadline = time.monotonic() + 10
        while app.state.fastmode.main.admission.num_in_flight < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        t0 = time.monotonic()
        server.should_exit = True  # what SIGTERM does
        time.sleep(0.2)
        refused = c3.post(url + "/v1/chat/completions", json={**long, "stream": False, "max_tokens": 2})
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "server_shutting_down"
        refused = c3.post(url + "/v1/messages", json={**anthropic_long, "stream": False})
        assert refused.status_code == 529 and refused.json()["error"]["type"] == "overloaded_error"
        assert c3.get(url + "/health").status_code == 503
        events = []
        try:
            while True:
                events.append(json.loads(ws.recv(timeout=15)))
        except ConnectionClosed as e:
            close = e.rcvd
        for t in threads:
            t.join(15)
    thread.join(15)
    elapsed_s = time.monotonic() - t0
    sock.close()
    assert not thread.is_alive() and drain_s <= elapsed_s < drain_s + 6
    # Each stream ends with an error in its own format, after running through the drain.
    assert oa[0] == 200 and any(line.startswith("data: ") and '"error"' in line for line in oa[-4:]), oa[-4:]
    assert an[0] == 200 and "event: error" in an, an[-4:]
    assert events[-1]["type"] == "response.failed"
    assert close.code == 1001 and "shutting down" in close.reason
