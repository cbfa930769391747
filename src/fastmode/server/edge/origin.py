"""Which hosts and browser origins may reach the server.

A server without an API key serves whoever reaches it, so it listens on loopback
only (ServerConfig refuses another host without a key). That alone does not keep
web pages out: a page can point its own host name at 127.0.0.1 (DNS rebinding; its
requests then carry `Host: evil.example`), and any page may open a WebSocket to
localhost (the handshake carries the page's `Origin`). So without a key a request
is refused (403) when its Host is not a loopback name or in `allowed_hosts`, or it
carries an Origin that is not loopback or in `allowed_origins`.

With a key, the key is the guard; a WebSocket's Origin is still checked against
`allowed_origins` when that list is set. CORS is off unless `allowed_origins` is
set: browsers then may call the API from those origins (app.py adds Starlette's
CORS middleware).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from fastmode.server.config import ServerConfig, is_loopback
from fastmode.server.edge.errors import ApiError, clip, dialect_of


def _host_name(host_header: str) -> str:
    """`example.com:8000` -> `example.com`, `[::1]:8000` -> `::1`."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class OriginGuard:
    """ASGI middleware: refuses foreign Host and Origin headers as the module docstring says."""

    def __init__(self, app: ASGIApp, config: ServerConfig):
        self.app = app
        self.open = config.api_key is None
        self.hosts = {h.lower() for h in config.allowed_hosts}
        self.origins = {o.rstrip("/").lower() for o in config.allowed_origins}

    def _origin_allowed(self, origin: str) -> bool:
        origin = origin.rstrip("/").lower()
        if "*" in self.origins or origin in self.origins:
            return True
        return self.open and is_loopback(urlsplit(origin).hostname or "")

    def refusal(self, scope: Scope) -> str | None:
        """Why this request is refused, or None."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in (b"host", b"origin")}
        if self.open and "host" in headers:  # browsers always send Host; a request without one is no page's
            host = _host_name(headers["host"])
            if not (is_loopback(host) or "*" in self.hosts or host.lower() in self.hosts):
                return (
                    f"the Host {clip(host)!r} is not served: without an API key this server answers loopback "
                    "names only (allow others with --allowed-hosts)"
                )
        origin = headers.get("origin")
        checked = self.open or (scope["type"] == "websocket" and self.origins)
        if origin is not None and checked and not self._origin_allowed(origin):
            return f"the Origin {clip(origin)!r} is not allowed (allow it with --allowed-origins)"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        reason = self.refusal(scope)
        if reason is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            # Closing before accepting answers the handshake with 403.
            await send({"type": "websocket.close", "code": 1008, "reason": reason[:120]})
        else:
            await ApiError("forbidden", reason, code="forbidden").response(dialect_of(scope["path"]))(
                scope, receive, send
            )
