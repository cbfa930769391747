"""The ASGI middleware that carries OpenAI `service_tier` into vLLM's `vllm_xargs`, driven with
the ASGI protocol itself in front of a small app that reports the body it received (no vLLM)."""

from __future__ import annotations

import asyncio
import json

from fastmode.vllm.middleware import ServiceTierMiddleware, rewrite_body


async def _echo_app(scope, receive, send):
    """Answers with the body it read and the content-length header it was given."""
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    length = dict(scope["headers"]).get(b"content-length")
    payload = json.dumps({"body": body.decode(), "content_length": length and length.decode()}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": payload})


def call(body: bytes, path: str = "/v1/chat/completions", chunks: int = 1) -> tuple[int, dict]:
    sent: list[dict] = []
    step = max(1, -(-len(body) // chunks))
    parts = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"content-length", str(len(body)).encode())]}
    asyncio.run(ServiceTierMiddleware(_echo_app)(scope, receive, send))
    status = sent[0]["status"]
    return status, json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def test_service_tier_is_copied_into_vllm_xargs():
    body = json.dumps({"model": "m", "messages": [], "service_tier": "priority"}).encode()
    status, got = call(body, chunks=3)
    assert status == 200
    sent = json.loads(got["body"])
    assert sent["vllm_xargs"] == {"service_tier": "priority"}
    assert sent["service_tier"] == "priority"
    assert got["content_length"] == str(len(got["body"]))


def test_fast_is_passed_as_fast_and_answered_as_priority_in_the_body():
    sent = json.loads(call(json.dumps({"service_tier": "fast", "vllm_xargs": {"k": 1}}).encode())[1]["body"])
    assert sent["vllm_xargs"] == {"k": 1, "service_tier": "fast"}
    assert sent["service_tier"] == "priority"  # the name vLLM's request models accept


def test_an_explicit_vllm_xargs_tier_is_kept():
    body = json.dumps({"service_tier": "flex", "vllm_xargs": {"service_tier": "priority"}}).encode()
    assert json.loads(call(body)[1]["body"])["vllm_xargs"] == {"service_tier": "priority"}


def test_a_tier_not_offered_gets_a_400_in_vllms_error_format():
    status, got = call(json.dumps({"service_tier": "scale"}).encode(), path="/v1/responses")
    assert status == 400
    assert got["error"]["param"] == "service_tier" and got["error"]["code"] == 400
    assert "service_tier 'scale' is not offered" in got["error"]["message"]


def test_other_bodies_and_paths_pass_through_byte_for_byte():
    for body in (b"not json", b"[1, 2]", json.dumps({"messages": []}).encode(), b'{"service_tier": null}'):
        assert rewrite_body(body) == (body, None)
        assert call(body)[1]["body"] == body.decode()
    body = json.dumps({"service_tier": "priority"}).encode()
    assert call(body, path="/v1/models")[1]["body"] == body.decode()
