"""Input limits: how large and how deep a request may be, checked where it enters.

- The body: `BodyLimit` refuses (413) a request whose Content-Length is over
  `max_body_mib` before reading a byte of it, and counts a chunked body as it
  arrives, refusing it once it passes the limit. WebSocket messages have the same
  limit (responses/ws.py).
- The parsed request: `check_body` walks it once, for every dialect, before
  anything reads it: every string and key must be valid Unicode (JSON's `\\ud800`
  escapes give lone UTF-16 surrogates, which no tokenizer or encoder accepts),
  nesting at most `max_nesting_depth`, at most `max_messages` messages or input
  items, `max_tools` tools, `max_stop_sequences` stop strings of at most
  `max_stop_chars` each, and names (model, tool, function) of at most
  `max_name_chars`. Stop strings are bounded because every one is matched
  against every step's output: 200,000 of them slow every request in the batch.
- Tokenization: `tokenize` runs a prompt's rendering and encoding on a worker
  thread, at most `max_concurrent_tokenizations` at once, so a large prompt
  never stalls the event loop (and with it every other request and /health).

Each refusal is a 4xx in the dialect's format naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fastmode.server.config import ServerConfig
from fastmode.server.edge.errors import ApiError, clip, dialect_of

_SURROGATE = re.compile("[\ud800-\udfff]")
_LISTS = {"messages": "max_messages", "input": "max_messages", "tools": "max_tools"}
_STOPS = ("stop", "stop_sequences")
_NAMES = ("model", "name")
_NUMBERS = {int, float, bool, type(None)}
T = TypeVar("T")


def _invalid(param: str, message: str) -> ApiError:
    return ApiError("invalid_request", f"{param}: {message}", param=param)


def _surrogate(text: str) -> re.Match | None:
    return None if text.isascii() else _SURROGATE.search(text)


def _check_text(text: str, param: str) -> None:
    if (m := _surrogate(text)) is not None:
        raise _invalid(
            param,
            f"the text holds a lone UTF-16 surrogate (\\u{ord(m.group()):04x} at character "
            f"{m.start()}), which is not valid Unicode",
        )


def _fields(value: Any) -> list[tuple[str, Any]]:
    """(key, child) pairs of a model or a JSON object, keys as the client wrote them."""
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        out = [(fields[k].alias or k, v) for k, v in value.__dict__.items() if v is not None]
        return out + list((value.__pydantic_extra__ or {}).items())
    return list(value.items())


def check_body(body: Any, config: ServerConfig) -> None:
    """Refuse (400, naming the field) a request that breaks an input limit or holds invalid Unicode.

    One pass, without recursion; numbers are skipped without a path being built, so a
    prompt of millions of token ids costs a fraction of a second."""
    stack: list[tuple[Any, str, int]] = [(body, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if depth > config.max_nesting_depth:
            raise _invalid(path or "body", f"the request nests deeper than {config.max_nesting_depth} levels")
        if isinstance(value, list):
            if set(map(type, value)) <= _NUMBERS:  # token ids: nothing to check, and at C speed
                continue
            for i, child in enumerate(value):
                if isinstance(child, str):
                    if _surrogate(child) is not None:
                        _check_text(child, f"{path}[{i}]")
                elif isinstance(child, (list, dict, BaseModel)):
                    stack.append((child, f"{path}[{i}]", depth + 1))
            continue
        for key, child in _fields(value):
            _check_text(key, path or "body")
            here = f"{path}.{key}" if path else key
            if depth == 1:
                _check_top_field(key, child, here, config)
            if isinstance(child, str):
                _check_text(child, here)
                if key in _NAMES and len(child) > config.max_name_chars:
                    raise _invalid(here, f"{clip(child)} is longer than {config.max_name_chars} characters")
            elif isinstance(child, (list, dict, BaseModel)):
                stack.append((child, here, depth + 1))


def _check_top_field(key: str, value: Any, param: str, config: ServerConfig) -> None:
    if key in _LISTS and isinstance(value, list):
        limit = getattr(config, _LISTS[key])
        if len(value) > limit:
            raise _invalid(param, f"{len(value)} items; at most {limit} are accepted")
    if key in _STOPS:
        stops = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        if len(stops) > config.max_stop_sequences:
            raise _invalid(param, f"{len(stops)} stop strings; at most {config.max_stop_sequences} are accepted")
        for i, s in enumerate(stops):
            if isinstance(s, str) and len(s) > config.max_stop_chars:
                raise _invalid(
                    param if isinstance(value, str) else f"{param}[{i}]",
                    f"a stop string of {len(s)} characters; at most {config.max_stop_chars} are accepted",
                )


class Tokenizers:
    """Prompt rendering and tokenization on worker threads, a bounded number at once."""

    def __init__(self, max_concurrent: int):
        self.max_concurrent = max_concurrent
        self._limiter: anyio.CapacityLimiter | None = None  # made in the event loop, on first use

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.max_concurrent)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)


class BodyLimit:
    """ASGI middleware: HTTP request bodies over `max_bytes` are refused with 413 before they are read."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def _error(self, scope: Scope) -> ApiError:
        mib = self.max_bytes / 2**20
        return ApiError(
            "too_large", f"the request body is larger than this server accepts ({mib:g} MiB)", code="request_too_large"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        dialect = dialect_of(scope["path"])
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._error(scope).response(dialect)(scope, receive, send)
            return
        received, over, answered = 0, False, False

        async def counted_receive() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    over = True
                    raise _TooLarge(f"the request body passed {self.max_bytes} bytes")
            return message

        async def checked_send(message: Message) -> None:
            # Whatever the app made of the interrupted read, the client is told why: the 413
            # replaces the app's answer, and the rest of that answer is dropped.
            nonlocal answered
            if not over:
                await send(message)
            elif message["type"] == "http.response.start" and not answered:
                answered = True
                await self._error(scope).response(dialect)(scope, receive, send)

        try:
            await self.app(scope, counted_receive, checked_send)
        except _TooLarge:  # a route that reads the body itself let it through
            if not answered:
                answered = True
                await self._error(scope).response(dialect)(scope, receive, send)


class _TooLarge(Exception):
    """A chunked body passed the limit while being read."""
