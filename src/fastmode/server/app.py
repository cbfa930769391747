"""The FastAPI application: both dialects, WebSocket mode, metrics, health.

`create_app(engine, config, extra_engines)` wires one or more engines to one
app: the main model (named `served_model_name`, else its own name) and any
others, each served under its own name. Every engine's background thread
(AsyncEngine) starts with the app's lifespan and stops with it. `fastmode
serve` drains first (edge/shutdown.py): new requests are refused, in-flight
ones get up to `drain_timeout_s`, and each one left receives an error, never
silence. Middleware, outermost first: the drain gate, the Host/Origin guard
(edge/origin.py), CORS when configured, the body size limit (edge/limits.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.middleware.cors import CORSMiddleware

from fastmode.engine.llm_engine import LLMEngine
from fastmode.engine.tiers import Tier
from fastmode.server.anthropic import api as anthropic_api
from fastmode.server.config import ServerConfig
from fastmode.server.edge.admission import AdmissionController
from fastmode.server.edge.errors import install_error_handlers
from fastmode.server.edge.limits import BodyLimit
from fastmode.server.edge.origin import OriginGuard
from fastmode.server.edge.ratelimit import RateLimiter
from fastmode.server.edge.shutdown import DrainGate
from fastmode.server.metrics import CONTENT_TYPE, ServerMetrics
from fastmode.server.openai import api as openai_api
from fastmode.server.responses import api as responses_api
from fastmode.server.responses import ws as responses_ws
from fastmode.server.responses.conversation import ResponseStore
from fastmode.server.served_model import ServedModel
from fastmode.server.state import ServerState, get_state

log = logging.getLogger(__name__)


def _named_engines(
    engine: LLMEngine, config: ServerConfig, extra: Iterable[LLMEngine] | Mapping[str, LLMEngine]
) -> dict[str, LLMEngine]:
    """Served name -> engine, the main one first; extra engines keyed by name or named after their model."""
    named = {config.served_model_name or engine.model_name: engine}
    pairs = extra.items() if isinstance(extra, Mapping) else ((e.model_name, e) for e in extra)
    for name, e in pairs:
        if name in named:
            raise ValueError(f"two served models are named {name!r}; give each engine its own name")
        named[name] = e
    return named


def create_app(
    engine: LLMEngine,
    config: ServerConfig = ServerConfig(),
    extra_engines: Iterable[LLMEngine] | Mapping[str, LLMEngine] = (),
) -> FastAPI:
    """An app serving `engine` and any `extra_engines`. The engine threads run while the app's lifespan does."""
    limiter = RateLimiter({t: config.tier_limits(t) for t in Tier})
    models: dict[str, ServedModel] = {}
    metrics = ServerMetrics(lambda: {n: s for n, m in models.items() if (s := m.stats()) is not None})
    for name, e in _named_engines(engine, config, extra_engines).items():
        models[name] = ServedModel(name, e, AdmissionController(config, e, limiter, metrics, name))
    state = ServerState(
        config=config,
        models=models,
        metrics=metrics,
        limiter=limiter,
        responses=ResponseStore(config.response_store_size, int(config.response_store_mib * 2**20)),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        for m in models.values():
            m.start()
            log.info("serving %s (max_model_len %d)", m.name, m.max_model_len)
        try:
            yield
        finally:
            for m in models.values():
                m.stop()

    app = FastAPI(title="fastmode", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.fastmode = state
    install_error_handlers(app)
    # Outermost last: the Host/Origin guard sees a request first, then CORS, then the body limit.
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    if config.allowed_origins:  # CORS is off unless origins are configured
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.allowed_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["*"],
        )
    app.add_middleware(OriginGuard, config=config)
    app.add_middleware(DrainGate, state=state)
    app.include_router(openai_api.router)
    app.include_router(anthropic_api.router)
    app.include_router(responses_ws.router)
    app.include_router(responses_api.router)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        s = get_state(request)
        # An engine thread dies only on a bug; report it so a supervisor restarts the server.
        alive = s.all_alive
        return JSONResponse({"status": "ok" if alive else "unavailable"}, status_code=200 if alive else 503)

    @app.get("/metrics")
    def metrics_page(request: Request) -> Response:
        # Rendering reads the stats each engine thread publishes after its step
        # (AsyncEngine.stats), so it takes no engine lock. A plain `def`: FastAPI
        # runs it on a worker thread, off the event loop.
        return Response(get_state(request).metrics.render(), media_type=CONTENT_TYPE)

    return app
