"""The ingress deployment: `fastmode serve`'s FastAPI app, with pools in place of engines.

The ingress runs the same app as the single-machine server (server/app.py):
both dialects, SSE, the Responses WebSocket, the rate limits, /metrics. It
tokenizes, checks and admits each request, then sends its token ids to the
pool its tier runs on (`PoolClient`) and streams the outputs back. What changes
from one machine is only what stands behind each served model:

- its engine is an `EngineView`, built from the card a pool replica sends;
- its admission is a `PoolAdmission`: per-pool queue bounds, the fast lane
  sized by the fast pool, auto's fallback to the standard pool;
- its engine thread is a `PoolClient`.

There is one ingress replica: it holds the rate limiter's buckets and the
in-flight counts, so the per-tier limits and the queue bounds hold across all
replicas of all pools. Its work is tokenizing and forwarding, far less than
any engine's.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from fastmode.engine.tiers import Tier
from fastmode.ray.admission import PoolAdmission, PoolCapacity
from fastmode.ray.client import PoolClient
from fastmode.ray.engine_view import EngineView
from fastmode.ray.metrics import PoolMetrics
from fastmode.ray.pools import PoolsSpec, parse_pools
from fastmode.ray.wire import EngineCard
from fastmode.server.app import create_app
from fastmode.server.config import ServerConfig, api_key_from_env
from fastmode.server.served_model import ServedModel

log = logging.getLogger(__name__)

_CARD_TIMEOUT_S = 1800.0  # how long the ingress waits for a pool's first replica to load its model


@dataclass
class PooledModel(ServedModel):
    """A served model whose requests run on pools of replicas (`PoolClient`) instead of a local engine thread."""

    handles: Mapping[str, Any] = field(default_factory=dict)  # pool -> DeploymentHandle
    tier_pools: Mapping[Tier, str] = field(default_factory=dict)
    pool_metrics: PoolMetrics | None = None

    def start(self) -> None:
        self.async_engine = PoolClient(self.name, self.handles, self.tier_pools, self.pool_metrics)  # type: ignore[assignment]


def pooled_app(
    server: ServerConfig,
    spec: PoolsSpec,
    cards: Mapping[str, EngineCard],
    handles: Mapping[str, Any],
) -> FastAPI:
    """The server's app over pools: `cards` and `handles` by pool name."""
    main_pools = [p for p in spec.names if p != "spark"]
    views = {p: EngineView(cards[p]) for p in spec.names}
    for p in main_pools:
        if cards[p].model_name != cards["standard"].model_name:
            raise ValueError(
                f"the {p} pool serves {cards[p].model_name} and the standard pool {cards['standard'].model_name}; "
                "every pool but spark serves the same model"
            )
    extra = {cards["spark"].model_name: views["spark"]} if "spark" in spec.names else {}
    app = create_app(views["standard"], server, extra)  # type: ignore[arg-type]  # EngineView quacks like LLMEngine
    state = app.state.fastmode
    main_name = next(iter(state.models))
    served_pools = {main_name: (main_pools, spec.tier_pools)}
    if extra:
        served_pools[next(iter(extra))] = (["spark"], dict.fromkeys(Tier, "spark"))

    def in_flight() -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for m in state.models.values():
            for t, n in m.admission.in_flight.items():
                key = (m.tier_pools[t], t.value)
                counts[key] = counts.get(key, 0) + n
        return counts

    metrics = PoolMetrics(state.metrics.registry, {p.name: p.replicas for p in spec.pools}, in_flight)
    # create_app built a plain ServedModel per engine; the lifespan starts whatever this dict holds.
    for name, (pools, tier_pools) in served_pools.items():
        capacities = {p: PoolCapacity(cards[p].model_name, cards[p].scheduler_config, spec[p].replicas) for p in pools}
        admission = PoolAdmission(server, capacities, tier_pools, state.limiter, state.metrics, name)
        state.models[name] = PooledModel(
            name,
            views[pools[0]],  # type: ignore[arg-type]
            admission,
            handles={p: handles[p] for p in pools},
            tier_pools=tier_pools,
            pool_metrics=metrics,
        )
    return app


def _blocking(fn: Callable[[], Any]) -> Any:
    """Run `fn` on a thread of its own: Ray refuses blocking handle calls on an event loop,
    and a replica's constructor may run on one."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


# The app the ingress replica serves. Ray Serve builds an ingress's ASGI app by calling a
# function after the deployment's constructor has run; the constructor, which has the pool
# handles, builds the app and leaves it here for that function (one ingress per process).
_APP: FastAPI | None = None


def built_app() -> FastAPI:
    if _APP is None:
        raise RuntimeError("the fastmode ingress constructor did not build its app")
    return _APP


class Ingress:
    """The ingress deployment's class; `deployments.py` wraps it with `serve.ingress(built_app)`."""

    def __init__(self, server: Mapping[str, Any], pools: Mapping[str, Any], handles: Mapping[str, Any]):
        global _APP
        spec = parse_pools(pools)
        # Each pool answers once its first replica has loaded its model.
        cards = {
            p: _blocking(lambda h=handles[p]: h.describe.remote().result(timeout_s=_CARD_TIMEOUT_S)) for p in spec.names
        }
        for p, card in cards.items():
            log.info("pool %s: %d replica(s) of %s", p, spec[p].replicas, card.model_name)
        # The key may come from this process's environment (FASTMODE_API_KEY on a KubeRay pod).
        key = api_key_from_env(server.get("api_key"), server.get("api_key_file"))
        _APP = pooled_app(ServerConfig(**{**server, "api_key": key}), spec, cards, handles)
