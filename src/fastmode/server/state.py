"""What every route needs: the served models, the limits, the metrics, the response store, the key."""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass, field

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection

from fastmode.server.config import ServerConfig
from fastmode.server.edge.errors import ApiError, clip
from fastmode.server.edge.limits import Tokenizers, check_body
from fastmode.server.edge.ratelimit import RateLimiter
from fastmode.server.metrics import ServerMetrics
from fastmode.server.responses.conversation import ResponseStore
from fastmode.server.served_model import ServedModel


@dataclass
class ServerState:
    config: ServerConfig
    models: dict[str, ServedModel]  # by served name, the main model first
    metrics: ServerMetrics
    limiter: RateLimiter  # shared by every model: limits are per key and tier
    responses: ResponseStore
    created_s: int = field(default_factory=lambda: int(time.time()))
    tokenizers: Tokenizers | None = None  # prompt tokenization off the event loop; from the config when None
    draining: bool = False  # shutting down: new requests are refused (edge/shutdown.py)
    websockets: set = field(default_factory=set)  # open WebSocket connections, closed with 1001 on shutdown

    def __post_init__(self) -> None:
        if self.tokenizers is None:
            self.tokenizers = Tokenizers(self.config.max_concurrent_tokenizations)

    def check_input(self, body: object) -> None:
        """The input limits and Unicode check of a parsed request (limits.check_body); 400 naming the field."""
        check_body(body, self.config)

    @property
    def main(self) -> ServedModel:
        return next(iter(self.models.values()))

    def select(self, model: str) -> ServedModel:
        """The served model a request names; 404 (listing what is served) for any other name."""
        served = self.models.get(model)
        if served is None:
            names = ", ".join(f"`{n}`" for n in self.models)
            raise ApiError(
                "not_found",
                f"The model `{clip(model)}` does not exist; this server serves {names}",
                param="model",
                code="model_not_found",
            )
        return served

    @property
    def all_alive(self) -> bool:
        return all(m.is_alive for m in self.models.values())

    def check_api_key(self, headers: Headers) -> None:
        """Accept `Authorization: Bearer KEY` (OpenAI) or `x-api-key: KEY` (Anthropic) on any route."""
        expected = self.config.api_key
        if expected is None:
            return
        auth = headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key")
        if not given:
            raise ApiError(
                "authentication",
                "no API key provided: send `Authorization: Bearer KEY` or `x-api-key: KEY`",
                code="invalid_api_key",
            )
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise ApiError("authentication", "invalid API key", code="invalid_api_key")


def get_state(conn: HTTPConnection) -> ServerState:
    return conn.app.state.fastmode


def require_api_key(conn: HTTPConnection) -> None:
    """FastAPI dependency for the /v1 routes."""
    get_state(conn).check_api_key(conn.headers)
