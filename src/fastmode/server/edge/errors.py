"""Errors in each dialect's own format, whatever raised them.

Routes raise `ApiError(kind, message)`; the handlers here render it as
OpenAI's `{"error": {message, type, param, code}}` or Anthropic's
`{"type": "error", "error": {type, message}}`, chosen by the request path.
FastAPI's validation errors (malformed JSON, wrong types, missing fields) and
Starlette's 404/405 go through the same renderer, so a client never sees a
framework-shaped error.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fastmode.engine.tiers import Tier
from fastmode.server.edge.ratelimit import (
    LimitState,
    anthropic_headers,
    openai_headers,
    retry_after_header,
)

log = logging.getLogger(__name__)

OPENAI, ANTHROPIC = "openai", "anthropic"


@dataclass(frozen=True)
class _Kind:
    status: int
    openai_type: str
    anthropic_type: str
    anthropic_status: int | None = None  # when Anthropic uses another code


KINDS = {
    "invalid_request": _Kind(400, "invalid_request_error", "invalid_request_error"),
    "authentication": _Kind(401, "invalid_request_error", "authentication_error"),
    "not_found": _Kind(404, "invalid_request_error", "not_found_error"),
    "method_not_allowed": _Kind(405, "invalid_request_error", "invalid_request_error"),
    "forbidden": _Kind(403, "invalid_request_error", "permission_error"),
    "too_large": _Kind(413, "invalid_request_error", "request_too_large"),
    "rate_limit": _Kind(429, "rate_limit_error", "rate_limit_error"),
    "overloaded": _Kind(503, "server_error", "overloaded_error", anthropic_status=529),
    "server_error": _Kind(500, "server_error", "api_error"),
}


class ApiError(Exception):
    """An error answer. `param`/`code` fill OpenAI's fields; `retry_after_s` and
    `rate_limits` become retry-after and the dialect's rate-limit headers."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
        rate_limits: tuple[Tier, list[LimitState]] | None = None,
    ):
        super().__init__(message)
        if kind not in KINDS:
            raise ValueError(f"unknown error kind {kind!r}")
        self.kind, self.message, self.param, self.code = kind, message, param, code
        self.retry_after_s = retry_after_s
        self.rate_limits = rate_limits

    def status(self, dialect: str) -> int:
        k = KINDS[self.kind]
        return (k.anthropic_status or k.status) if dialect == ANTHROPIC else k.status

    def body(self, dialect: str) -> dict:
        k = KINDS[self.kind]
        if dialect == ANTHROPIC:
            return {"type": "error", "error": {"type": k.anthropic_type, "message": self.message}}
        return {"error": {"message": self.message, "type": k.openai_type, "param": self.param, "code": self.code}}

    def headers(self, dialect: str) -> dict[str, str]:
        h = {}
        if self.retry_after_s is not None:
            h["retry-after"] = retry_after_header(self.retry_after_s)
        if self.rate_limits is not None:
            tier, states = self.rate_limits
            h.update(anthropic_headers(tier, states) if dialect == ANTHROPIC else openai_headers(states))
        return h

    def response(self, dialect: str) -> JSONResponse:
        return JSONResponse(self.body(dialect), status_code=self.status(dialect), headers=self.headers(dialect))


CLIP_CHARS = 64  # how much of a client's value an error quotes


def clip(value: object, limit: int = CLIP_CHARS) -> str:
    """A client's value as an error quotes it: whole when short, else its start and its length,
    so a megabyte-long name is not sent back."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def dialect_of(path: str) -> str:
    return ANTHROPIC if path.startswith("/v1/messages") else OPENAI


# Steps of pydantic's error locations that name a branch of a union, not a field.
_TYPE_STEPS = {"str", "int", "float", "bool", "none", "dict", "list", "bytes"}


def _field_path(loc: tuple) -> str:
    """`messages[2].tool_calls[0].function` from pydantic's location, without the union branches it tried."""
    path, tagged = "", False
    for step in loc:
        if step == "body":
            continue
        if isinstance(step, int):
            path += f"[{step}]"
            continue
        if "[" in step or step in _TYPE_STEPS:  # a union member, e.g. "list[TextPart]" or "tagged-union[...]"
            tagged = tagged or "tagged-union" in step
            continue
        if tagged and path.endswith("]"):  # a tagged union's tag (the block's type) after the item's index
            tagged = False
            continue
        path += f".{step}" if path else step
    return clip(path)


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """One sentence naming the first bad field (and OpenAI's `param`) from pydantic's error list.

    A field that fails every branch of a union gives one error per branch; the most
    specific of them (the deepest location) is the one reported.
    """
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}", None
    param = _field_path(tuple(first.get("loc", ())))
    if not param and first.get("type") in ("missing", "model_attributes_type", "dict_type", "model_type"):
        return "the request body must be a JSON object (send Content-Type: application/json)", None
    top = param.split("[")[0].split(".")[0]
    same = [e for e in errors if _field_path(tuple(e.get("loc", ()))).split("[")[0].split(".")[0] == top]
    e = max(same, key=lambda e: len(e.get("loc", ())))  # max keeps the first of equals
    param = _field_path(tuple(e.get("loc", ()))) or None
    kind, ctx = e.get("type"), e.get("ctx") or {}
    if kind == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}", param
    if kind == "missing":
        return f"{param} is required", param
    if kind == "union_tag_invalid":
        return (
            f"{param}: the type {clip(repr(ctx.get('tag')))} is not accepted here (use one of {ctx.get('expected_tags')})",
            param,
        )
    if kind == "union_tag_not_found":
        return f"{param}: the `type` field is missing", param
    msg = str(e.get("msg", "invalid value"))
    return (f"{param}: {msg[0].lower()}{msg[1:]}" if param else msg), param


def _routes(routes) -> list:
    out = []
    for r in routes:
        inner = getattr(r, "original_router", None)  # newer FastAPI keeps an included router whole
        out += _routes(inner.routes) if inner is not None else [r]  # (routers are included without a prefix)
    return out


def routes_text(app: FastAPI) -> str:
    """The app's routes as `GET /v1/models, POST /v1/chat/completions, ...` (WebSocket routes as `WS`)."""
    out = []
    for r in _routes(app.routes):
        path = getattr(r, "path", None)
        if path is None or not getattr(r, "include_in_schema", True):
            continue
        methods = sorted(m for m in getattr(r, "methods", None) or () if m != "HEAD") or ["WS"]
        out += [f"{m} {path.replace(':path', '')}" for m in methods]
    return ", ".join(out)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response(dialect_of(request.url.path))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(exc.errors()))
        return ApiError("invalid_request", message, param=param).response(dialect_of(request.url.path))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {401: "authentication", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        if kind is None:
            kind = "server_error" if exc.status_code >= 500 else "invalid_request"
        message = f"{request.method} {clip(request.url.path)}: {exc.detail}"
        if exc.status_code == 404:  # an unknown route: say which exist, so a wrong base URL is plain to see
            message += f"; this server has {routes_text(request.app)}"
        return ApiError(kind, message).response(dialect_of(request.url.path))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The details (and the traceback) go to the log, under an id the client is given.
        error_id = f"err_{uuid.uuid4().hex[:16]}"
        log.exception("unhandled error %s on %s", error_id, request.url.path)
        err = ApiError("server_error", f"internal error; the server log has the details under {error_id}")
        return err.response(dialect_of(request.url.path))
