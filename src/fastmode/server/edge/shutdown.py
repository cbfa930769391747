"""Graceful shutdown: on SIGTERM (or Ctrl-C) the server drains, then exits.

1. New requests are refused with 503 (529 in Anthropic's dialect) and retry-after, and
   new WebSockets are refused, while the listening socket still answers: a client (or a
   load balancer reading /health) learns to go elsewhere instead of timing out.
2. Requests in flight may finish, for up to `drain_timeout_s`.
3. What is still running then is aborted: every such request receives an error in its
   own format (an SSE `error` event, a Responses `response.failed` event, a 503 for a
   request not yet answered), and open WebSockets are closed with 1001 and a reason.
4. uvicorn closes the connections, the app's lifespan stops the engines, the process exits.

uvicorn's own graceful shutdown would stop listening at once and, at its timeout, cancel
the responses still streaming without a word; `DrainingServer` runs the steps above first.
"""

from __future__ import annotations

import asyncio
import logging
import time

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from fastmode.server.edge.errors import ApiError, dialect_of
from fastmode.server.state import ServerState

log = logging.getLogger(__name__)

_RETRY_AFTER_S = 5.0  # a restart takes seconds; clients should come back then, or elsewhere
_ERRORS_WRITTEN_S = 2.0  # how long aborted requests get to write their error before connections close


def draining_error() -> ApiError:
    return ApiError(
        "overloaded",
        "the server is shutting down and takes no new requests; retry shortly",
        code="server_shutting_down",
        retry_after_s=_RETRY_AFTER_S,
    )


class DrainGate:
    """ASGI middleware: while the server drains, every new request is refused."""

    def __init__(self, app: ASGIApp, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.state.draining:
            await draining_error().response(dialect_of(scope["path"]))(scope, receive, send)
        elif scope["type"] == "websocket" and self.state.draining:
            await send({"type": "websocket.close", "code": 1001, "reason": "the server is shutting down"})
        else:
            await self.app(scope, receive, send)


def _in_flight(state: ServerState) -> int:
    return sum(m.admission.num_in_flight for m in state.models.values())


async def drain(state: ServerState, timeout_s: float) -> None:
    """Steps 1-3 of the module docstring."""
    state.draining = True
    deadline = time.monotonic() + timeout_s
    while _in_flight(state) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    left = _in_flight(state)
    if left:
        log.warning("drain timeout (%g s): aborting %d request(s) still in flight", timeout_s, left)
    for m in state.models.values():
        m.stop()  # each request still running receives an error
    deadline = time.monotonic() + _ERRORS_WRITTEN_S
    while _in_flight(state) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    for ws in list(state.websockets):
        try:
            await ws.close(code=1001, reason="the server is shutting down")
        except (RuntimeError, OSError):  # closed meanwhile
            pass


class DrainingServer(uvicorn.Server):
    """uvicorn's server, draining the app (`drain`) before its own shutdown."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout_s: float):
        super().__init__(config)
        self.state, self.drain_timeout_s = state, drain_timeout_s

    async def shutdown(self, sockets=None) -> None:
        await drain(self.state, self.drain_timeout_s)
        await super().shutdown(sockets)
