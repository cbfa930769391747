"""Time limits on reading requests over HTTP/1.1, so slow or silent clients cannot hold connections.

uvicorn bounds only the idle time between two requests on a kept-alive connection
(`timeout_keep_alive`, armed once a response is complete). A connection that sends
nothing, sends its request head a few bytes at a time (slow-loris), or stalls in the
middle of its body stays open for as long as the client likes, each holding a socket,
a file descriptor and a parser. Neither uvicorn (up to 0.54) nor h11 has a setting for
this, hence the subclass of uvicorn's h11 protocol here, with two timers:

- the request head (request line and headers) must be complete within `header_timeout_s`
  of the connection opening, or of the first byte of the next request on a kept-alive
  connection; otherwise the client gets a 408 (if it sent anything) and the connection closes;
- while a request body is being read, no gap between two reads may exceed `body_timeout_s`
  (the server pausing its own reads does not count); otherwise the connection closes,
  which the app sees as the client leaving.

WebSocket upgrades are handed to uvicorn's WebSocket protocol and leave both timers behind
(an idle WebSocket is closed by the Responses WebSocket handler, `ws_idle_timeout_s`).
The h11 protocol is always used, not httptools: these timers hook into its parser state.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from fastmode.server.config import ServerConfig

log = logging.getLogger(__name__)

_TIMEOUT_BODY = b"the request head was not received in time\n"
_REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    b"content-length: " + str(len(_TIMEOUT_BODY)).encode() + b"\r\n\r\n" + _TIMEOUT_BODY
)


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the two read timers of the module docstring.
    `timed_protocol` makes a subclass with the configured limits."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._head_started = False  # some bytes of the current request head have arrived
        self._upgraded = False  # handed to the WebSocket protocol: no longer ours to time

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:  # bytes of a new request head
            self._head_started = True
            if self._head_timer is None:
                self._arm_head()
        super().data_received(data)
        if self._upgraded or self.transport.is_closing():
            self._cancel_timers()
            return
        state = self.conn.their_state
        if state is not h11.IDLE:  # the head is complete
            self._cancel(self._head_timer)
            self._head_timer, self._head_started = None, False
        self._cancel(self._body_timer)
        self._body_timer = None
        if state is h11.SEND_BODY:
            self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_timeout)

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._upgraded = True
        self._cancel_timers()
        super().handle_websocket_upgrade(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    # -- timers --------------------------------------------------------------
    @staticmethod
    def _cancel(timer: asyncio.TimerHandle | None) -> None:
        if timer is not None:
            timer.cancel()

    def _cancel_timers(self) -> None:
        self._cancel(self._head_timer)
        self._cancel(self._body_timer)
        self._head_timer = self._body_timer = None

    def _arm_head(self) -> None:
        self._cancel(self._head_timer)
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._upgraded or self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        log.info(
            "closing a connection from %s: no complete request head within %g s",
            self._peer(),
            self.header_timeout_s,
        )
        if self._head_started:  # a client that sent nothing gets no answer
            self.transport.write(_REQUEST_TIMEOUT)
        self.transport.close()

    def _body_timeout(self) -> None:
        self._body_timer = None
        if self._upgraded or self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        cycle = self.cycle
        if self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue):
            # The server is not reading (the app has not consumed what it has, or has not asked
            # for the body yet): the client is not the one stalling.
            self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_timeout)
            return
        log.info("closing a connection from %s: its request body stalled for %g s", self._peer(), self.body_timeout_s)
        self.transport.close()

    def _peer(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "a client"


def timed_protocol(header_timeout_s: float, body_timeout_s: float) -> type[TimedH11Protocol]:
    """The protocol class uvicorn instantiates per connection, with these limits."""
    return type(
        "TimedH11Protocol",
        (TimedH11Protocol,),
        {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s},
    )


def uvicorn_config(app: Any, config: ServerConfig, **overrides: Any) -> uvicorn.Config:
    """uvicorn's settings for serving `app` under `config`: the read timers above, the keep-alive,
    and WebSocket message size and pings. `overrides` are further uvicorn.Config arguments."""
    settings: dict[str, Any] = dict(
        host=config.host,
        port=config.port,
        http=timed_protocol(config.http_header_timeout_s, config.http_body_timeout_s),
        timeout_keep_alive=config.http_keep_alive_s,
        ws_max_size=config.max_body_bytes,
        ws_ping_interval=20.0,
        ws_ping_timeout=20.0,
    )
    return uvicorn.Config(app, **{**settings, **overrides})
