"""What every route needs: the engine, the limits, the metrics, the served name, the key."""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass, field

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection

from fastmode.engine.async_engine import AsyncEngine
from fastmode.engine.llm_engine import LLMEngine
from fastmode.server.admission import AdmissionController
from fastmode.server.config import ServerConfig
from fastmode.server.conversation import ResponseStore
from fastmode.server.errors import ApiError
from fastmode.server.metrics import ServerMetrics
from fastmode.server.ratelimit import RateLimiter


@dataclass
class ServerState:
    config: ServerConfig
    engine: LLMEngine
    metrics: ServerMetrics
    limiter: RateLimiter
    admission: AdmissionController
    responses: ResponseStore
    async_engine: AsyncEngine | None = None  # started by the app's lifespan
    created_s: int = field(default_factory=lambda: int(time.time()))

    @property
    def model_name(self) -> str:
        return self.config.served_model_name or self.engine.model_name

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def running(self) -> AsyncEngine:
        if self.async_engine is None:
            raise ApiError("overloaded", "the engine is not running (server starting or shutting down)")
        return self.async_engine

    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise ApiError(
                "not_found",
                f"The model `{model}` does not exist; this server serves `{self.model_name}`",
                param="model", code="model_not_found",
            )

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
