"""The FastAPI application: both dialects, WebSocket mode, metrics, health.

`create_app(engine, config)` wires one engine to one app. The engine's
background thread (AsyncEngine) starts with the app's lifespan and stops with
it: on shutdown uvicorn first lets in-flight responses finish (up to
`drain_timeout_s`), then the lifespan aborts whatever is left, and each such
request receives an error, never silence.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from fastmode.engine.async_engine import AsyncEngine
from fastmode.engine.llm_engine import LLMEngine
from fastmode.engine.tiers import Tier
from fastmode.server import anthropic_api, openai_api, responses_ws
from fastmode.server.admission import AdmissionController
from fastmode.server.config import ServerConfig
from fastmode.server.conversation import ResponseStore
from fastmode.server.errors import install_error_handlers
from fastmode.server.metrics import CONTENT_TYPE, ServerMetrics
from fastmode.server.ratelimit import RateLimiter
from fastmode.server.state import ServerState, get_state

log = logging.getLogger(__name__)


def create_app(engine: LLMEngine, config: ServerConfig = ServerConfig()) -> FastAPI:
    """An app serving `engine`. The engine thread runs while the app's lifespan does."""
    limiter = RateLimiter({t: config.tier_limits(t) for t in Tier})
    state = ServerState(config=config, engine=engine, metrics=None, limiter=limiter, admission=None,  # type: ignore[arg-type]
                        responses=ResponseStore(config.response_store_size))
    state.metrics = ServerMetrics(lambda: state.async_engine.stats() if state.async_engine else None)
    state.admission = AdmissionController(config, engine, limiter, state.metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.async_engine = AsyncEngine(engine)
        log.info("serving %s (max_model_len %d)", state.model_name, engine.max_model_len)
        try:
            yield
        finally:
            running, state.async_engine = state.async_engine, None
            running.shutdown()

    app = FastAPI(title="fastmode", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.fastmode = state
    install_error_handlers(app)
    app.include_router(openai_api.router)
    app.include_router(anthropic_api.router)
    app.include_router(responses_ws.router)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        s = get_state(request)
        # The engine thread dies only on a bug; report it so a supervisor restarts the server.
        alive = s.async_engine.is_alive
        return JSONResponse({"status": "ok" if alive else "unavailable"}, status_code=200 if alive else 503)

    @app.get("/metrics")
    def metrics(request: Request) -> Response:
        # A plain `def`: FastAPI runs it on a worker thread, so waiting for the
        # engine lock (held for a whole step) does not stall the event loop.
        return Response(get_state(request).metrics.render(), media_type=CONTENT_TYPE)

    return app
