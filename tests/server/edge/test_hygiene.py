"""What the server tells and whom it serves: no echoed megabytes, no class names, keys out of `ps`,
Host and Origin checks, CORS, WebSocket close codes, the response store's bounds."""

from __future__ import annotations

import json
import time

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from fastmode.server.config import API_KEY_ENV, ServerConfig, api_key_from_env
from fastmode.server.edge.errors import install_error_handlers
from fastmode.server.edge.origin import OriginGuard
from fastmode.server.responses.conversation import ResponseStore, Turn, turn_bytes
from tests.server.conftest import serve


def test_unknown_values_are_never_echoed_whole(server, http):
    name = "m" * 1_000_000
    msg = [{"role": "user", "content": "hi"}]
    r = http.post(server.url + "/v1/chat/completions", json={"model": name, "messages": msg})
    assert r.status_code == 400 and len(r.text) < 1000  # the name limit, quoting its start only
    r = http.post(server.url + "/v1/chat/completions", json={"model": name[:200], "messages": msg})
    assert r.status_code == 404 and "(200 characters)" in r.text and len(r.text) < 1000
    r = http.get(server.url + "/v1/models/" + "x" * 5000)
    assert r.status_code == 404 and len(r.json()["error"]["message"]) < 500
    r = http.get(server.url + "/v1/responses/" + "r" * 5000)
    assert r.status_code == 404 and "(5000 characters)" in r.json()["error"]["message"]
    r = http.post(
        server.url + "/v1/chat/completions",
        json={"model": server.model, "k" * 10_000: 1, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 400 and len(r.text) < 1000


def test_internal_errors_name_no_class_and_carry_an_id_to_the_log(caplog):
    app = FastAPI()
    install_error_handlers(app)

    class SecretInternalThing(RuntimeError):
        pass

    @app.get("/v1/boom")
    async def boom():
        raise SecretInternalThing("db password is hunter2")

    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/v1/boom")
    assert r.status_code == 500
    message = r.json()["error"]["message"]
    assert "SecretInternalThing" not in r.text and "hunter2" not in r.text and "Traceback" not in r.text
    error_id = message.split()[-1]
    assert error_id.startswith("err_") and any(error_id in rec.getMessage() for rec in caplog.records)


def test_api_key_from_env_or_file(tmp_path, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    key_file = tmp_path / "key"
    key_file.write_text("from-file\nignored\n")
    assert api_key_from_env(None) == "from-env"
    assert api_key_from_env(None, str(key_file)) == "from-file"
    assert api_key_from_env("from-flag", str(key_file)) == "from-flag"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        api_key_from_env(None, str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="cannot read"):
        api_key_from_env(None, str(tmp_path / "missing"))
    monkeypatch.delenv(API_KEY_ENV)
    assert api_key_from_env(None) is None


def test_without_a_key_the_server_listens_on_loopback_only():
    with pytest.raises(ValueError, match="loopback only"):
        ServerConfig(host="0.0.0.0")
    ServerConfig(host="0.0.0.0", api_key="k")
    ServerConfig(host="localhost")
    ServerConfig(host="::1")


def test_foreign_host_and_origin_are_refused_without_a_key(server, http):
    url = server.url + "/v1/models"
    assert http.get(url).status_code == 200
    assert http.get(url, headers={"origin": "http://localhost:3000"}).status_code == 200
    r = http.get(url, headers={"host": "evil.example"})  # DNS rebinding: the page's own name
    assert r.status_code == 403 and "Host" in r.json()["error"]["message"]
    r = http.post(server.url + "/v1/messages", headers={"host": "evil.example:8000"}, json={})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = http.get(url, headers={"origin": "https://evil.example"})
    assert r.status_code == 403 and "Origin" in r.json()["error"]["message"]
    # No CORS unless configured.
    assert "access-control-allow-origin" not in http.get(url, headers={"origin": "http://localhost:3000"}).headers
    with pytest.raises(InvalidStatus) as e:
        connect(server.ws_url, origin="https://evil.example", open_timeout=10)
    assert e.value.response.status_code == 403
    with connect(server.ws_url, origin="http://127.0.0.1:5173", open_timeout=10) as ws:
        ws.send(json.dumps({"type": "nope"}))
        assert json.loads(ws.recv(timeout=10))["code"] == "unknown_event"


def test_allowed_hosts_origins_and_cors(tiny_loaded, http):
    cfg = ServerConfig(api_key="k", allowed_origins=("https://app.example",))
    with serve(tiny_loaded, cfg) as s:
        auth = {"authorization": "Bearer k"}
        # With a key, the key is the guard: any Host is served.
        assert http.get(s.url + "/v1/models", headers={**auth, "host": "api.example"}).status_code == 200
        pre = http.options(
            s.url + "/v1/chat/completions",
            headers={
                "origin": "https://app.example",
                "access-control-request-method": "POST",
                "access-control-request-headers": "authorization,content-type",
            },
        )
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://app.example"
        other = http.options(
            s.url + "/v1/chat/completions",
            headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
        )
        assert "access-control-allow-origin" not in other.headers
        with pytest.raises(InvalidStatus):
            connect(s.ws_url, origin="https://evil.example", additional_headers=auth, open_timeout=10)
        with connect(s.ws_url, origin="https://app.example", additional_headers=auth, open_timeout=10) as ws:
            ws.send(json.dumps({"type": "nope"}))
            assert json.loads(ws.recv(timeout=10))["code"] == "unknown_event"
    with serve(tiny_loaded, ServerConfig(allowed_hosts=("box.lan",))) as s:
        assert http.get(s.url + "/v1/models", headers={"host": "box.lan:8000"}).status_code == 200
        assert http.get(s.url + "/v1/models", headers={"host": "other.lan"}).status_code == 403


def _closed(ws) -> ConnectionClosed:
    with pytest.raises(ConnectionClosed) as e:
        while True:
            ws.recv(timeout=10)
    return e.value


def test_websocket_frames_get_a_close_code_and_reason(tiny_loaded):
    with serve(tiny_loaded, ServerConfig(max_body_mib=0.01, ws_idle_timeout_s=0.5)) as s:
        with connect(s.ws_url) as ws:
            ws.send(b"\xff\xfe not utf-8")
            e = _closed(ws)
            assert e.rcvd.code == 1003 and "binary" in e.rcvd.reason
        with connect(s.ws_url) as ws:
            ws.send(json.dumps({"type": "response.create", "input": "x" * 20_000}))
            e = _closed(ws)
            assert e.rcvd.code == 1009 and "too big" in e.rcvd.reason
        with connect(s.ws_url) as ws:  # too deep for the JSON parser: an error event, the connection stays
            ws.send("[" * 5000 + "]" * 5000)
            assert json.loads(ws.recv(timeout=10))["type"] == "error"
            ws.send(json.dumps({"type": "response.create", "model": s.model, "input": "\ud800"}))
            event = json.loads(ws.recv(timeout=10))
            assert event["type"] == "error" and event["param"] == "input" and "surrogate" in event["message"]
            t0 = time.monotonic()
            e = _closed(ws)  # then idle
            assert e.rcvd.code == 1000 and "idle" in e.rcvd.reason and time.monotonic() - t0 < 5


def _turn(i: int, num_ids: int) -> Turn:
    return Turn(f"resp_{i}", None, [{"role": "user", "content": "hi"}], list(range(num_ids)), [], True)


def test_response_store_is_bounded_in_bytes():
    store = ResponseStore(capacity=1000, max_bytes=100_000)
    for i in range(50):
        store.put(_turn(i, 1000))  # about 38 kB each
    assert store.num_bytes <= 100_000 and len(store) == 2
    assert store.get("resp_49") is not None and store.get("resp_0") is None
    store.put(_turn(99, 10_000))  # larger than the whole budget: not kept
    assert store.get("resp_99") is None and store.num_bytes <= 100_000
    store.pop("resp_49")
    assert len(store) == 1 and store.num_bytes == turn_bytes(store.get("resp_48"))


def test_store_false_is_not_stored(server, http):
    r = http.post(
        server.url + "/v1/responses",
        json={"model": server.model, "input": "hi", "max_output_tokens": 2, "temperature": 0, "store": False},
    )
    assert r.status_code == 200
    assert http.get(server.url + "/v1/responses/" + r.json()["id"]).status_code == 404


def test_origin_guard_rules():
    def scope(kind="http", **headers):
        return {"type": kind, "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}

    open_guard = OriginGuard(None, ServerConfig())
    assert open_guard.refusal(scope()) is None  # no Host: no browser sent it
    for host in ("127.0.0.1:8000", "localhost", "[::1]:8000", "app.localhost:3000", "127.0.0.2"):
        assert open_guard.refusal(scope(host=host)) is None, host
    for host in ("evil.example", "192.168.1.5:8000", "localhost.evil.example"):
        assert "Host" in open_guard.refusal(scope(host=host)), host
    assert "Origin" in open_guard.refusal(scope(host="localhost", origin="null"))
    assert open_guard.refusal(scope(host="localhost", origin="http://[::1]:5173")) is None
    keyed = OriginGuard(None, ServerConfig(api_key="k", allowed_origins=("https://app.example",)))
    assert keyed.refusal(scope(host="evil.example", origin="https://evil.example")) is None  # HTTP: CORS decides
    assert "Origin" in keyed.refusal(scope("websocket", host="x", origin="https://evil.example"))
    assert keyed.refusal(scope("websocket", host="x", origin="https://APP.example/")) is None
