"""OpenAI `service_tier` for vLLM's OpenAI server: `--middleware fastmode.vllm.ServiceTierMiddleware`.

vLLM's server accepts `service_tier` in a request body and drops it: nothing reaches the engine
(its request models take unknown fields and ignore them). What does reach the scheduler is
`vllm_xargs`, vLLM's own per-request extension, as `SamplingParams.extra_args`. This ASGI
middleware copies a request's `service_tier` into `vllm_xargs.service_tier`, where
`FastLaneScheduler` reads it, so unmodified OpenAI clients reach the fast lane with
`"service_tier": "priority"` (or `"fast"`). It answers 400, in vLLM's error format, for a tier
fastmode does not offer, and rewrites `"fast"` to `"priority"` (vLLM's Responses model only
accepts OpenAI's names). Pure ASGI, no vLLM import; bodies that are not JSON objects pass through
untouched for vLLM to judge.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastmode.engine.tiers import OPENAI_SERVICE_TIERS

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})
MAX_BODY_BYTES = 64 << 20  # larger bodies pass through unread (vLLM applies its own limits)
OFFERED = (*OPENAI_SERVICE_TIERS, "auto")


class ServiceTierMiddleware:
    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in PATHS:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left: let the app see it
                await self.app(scope, _replay([*map(_partial, chunks), message], receive), send)
                return
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            more = message.get("more_body", False)
            if size > MAX_BODY_BYTES and more:
                await self.app(scope, _replay(list(map(_partial, chunks)), receive), send)
                return
        body = b"".join(chunks)
        rewritten, error = rewrite_body(body)
        if error is not None:
            await _send_error(send, error)
            return
        if rewritten is not body:
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
            scope["headers"].append((b"content-length", str(len(rewritten)).encode()))
        await self.app(scope, _replay([_body(rewritten)], receive), send)


def rewrite_body(body: bytes) -> tuple[bytes, str | None]:
    """(the body to pass on, an error message or None). The same bytes object comes back when
    nothing changes."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body, None
    if not isinstance(data, dict) or data.get("service_tier") is None:
        return body, None
    tier = data["service_tier"]
    if tier not in OFFERED:
        return body, f"service_tier {tier!r} is not offered; use one of {', '.join(OFFERED)}"
    xargs = data.get("vllm_xargs")
    if xargs is None:
        xargs = data["vllm_xargs"] = {}
    elif not isinstance(xargs, dict):
        return body, None  # vLLM answers for a malformed vllm_xargs itself
    xargs.setdefault("service_tier", tier)
    if tier == "fast":
        data["service_tier"] = "priority"
    return json.dumps(data).encode(), None


def _body(chunk: bytes) -> Message:
    return {"type": "http.request", "body": chunk, "more_body": False}


def _partial(chunk: bytes) -> Message:
    return {"type": "http.request", "body": chunk, "more_body": True}


def _replay(messages: list[Message], tail: Receive) -> Receive:
    """A `receive` that hands out `messages` (what was read already), then defers to `tail`, the
    server's own: a streaming response waits on it for the client's disconnect."""
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        return await tail()

    return receive


async def _send_error(send: Send, message: str) -> None:
    payload = json.dumps(
        {"error": {"message": message, "type": "BadRequestError", "param": "service_tier", "code": 400}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})
