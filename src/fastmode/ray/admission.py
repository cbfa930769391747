"""Admission for a model whose tiers run on separate pools of replicas.

The single-machine controller (server/edge/admission.py) decides tiers, fallbacks and
rate limits; this subclass keeps all of that and changes one thing, the queue
bound a request is checked against. Each pool's bound is the sum over its
replicas of what one engine holds (max_num_seqs running plus
max_waiting_requests waiting), and a request counts only against the pool its
tier runs on: a full standard pool does not refuse fast requests bound for the
fast pool. The fast lane's capacity is the fast pool's: its replicas' lanes
added up. So `service_tier=auto` falls back to standard once the fast pool is
saturated, and says so, exactly as one machine does once its lane is full.

No Ray here: the ingress deployment builds it, tests drive it directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from fastmode.engine.scheduler import SchedulerConfig
from fastmode.engine.tiers import Tier
from fastmode.server.config import ServerConfig
from fastmode.server.edge.admission import AdmissionController
from fastmode.server.edge.ratelimit import RateLimiter
from fastmode.server.metrics import ServerMetrics


@dataclass(frozen=True)
class PoolCapacity:
    """A pool as admission sees it: one engine's scheduler config times its replicas.

    Quacks like the engine `AdmissionController` reads (`scheduler_config`, `model_name`)."""

    model_name: str
    replica_config: SchedulerConfig  # one replica's
    replicas: int

    @property
    def scheduler_config(self) -> SchedulerConfig:
        c, n = self.replica_config, self.replicas
        lane = None if c.fast_lane_max_batch is None else c.fast_lane_max_batch * n
        return dataclasses.replace(c, max_num_seqs=c.max_num_seqs * n, fast_lane_max_batch=lane)

    def server_config(self, config: ServerConfig) -> ServerConfig:
        """`config` with the waiting room of all the pool's replicas."""
        return dataclasses.replace(config, max_waiting_requests=config.max_waiting_requests * self.replicas)


class PoolAdmission(AdmissionController):
    def __init__(
        self,
        config: ServerConfig,
        pools: Mapping[str, PoolCapacity],
        tier_pools: Mapping[Tier, str],
        limiter: RateLimiter,
        metrics: ServerMetrics,
        model: str,
    ):
        fast = pools[tier_pools[Tier.FAST]]
        # The base class sizes the fast lane from the pool that serves fast requests.
        super().__init__(fast.server_config(config), fast, limiter, metrics, model)
        self.tier_pools = dict(tier_pools)
        # One plain controller per pool holds that pool's queue bounds (capacity, the share
        # reserved for fast, flex's share); its counts are set from ours before each check.
        self.pools = {
            name: AdmissionController(p.server_config(config), p, limiter, metrics, model) for name, p in pools.items()
        }

    def pool_in_flight(self, pool: str) -> dict[Tier, int]:
        """Requests in flight on `pool`, by tier (admitted and not yet settled)."""
        return {t: (n if self.tier_pools[t] == pool else 0) for t, n in self.in_flight.items()}

    def _check_queue(self, tier: Tier) -> None:
        pool = self.tier_pools[tier]
        bound = self.pools[pool]
        bound.in_flight = self.pool_in_flight(pool)
        bound._check_queue(tier)
