"""Prometheus series of a pooled deployment, labelled by pool, in the ingress's registry.

The server's own series (server/metrics.py) stay as they are, labelled by
served model and tier; these add the pool: what each pool produced and was
charged (metering), requests its replicas failed, retries on another replica,
what is in flight on it, and each replica's engine state as its latest
finished request reported it (`Chunk.stats`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily

from fastmode.engine.async_engine import EngineStats
from fastmode.engine.metering import RequestMetrics


class PoolMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        replicas: Mapping[str, int],
        in_flight: Callable[[], Mapping[tuple[str, str], int]],
    ):
        pt = ["pool", "tier"]
        self.generation_tokens = Counter(
            "fastmode:pool_generation_tokens", "Output tokens produced, by pool", pt, registry=registry
        )
        self.prompt_tokens = Counter(
            "fastmode:pool_prompt_tokens", "Prompt tokens of finished requests, by pool", pt, registry=registry
        )
        self.cost = Counter(
            "fastmode:pool_request_cost_usd", "Metered price of finished requests (USD), by pool", pt, registry=registry
        )
        self.machine = Counter(
            "fastmode:pool_request_machine_seconds", "Machine time charged to finished requests", pt, registry=registry
        )
        self.finished = Counter("fastmode:pool_request_success", "Requests a pool finished", pt, registry=registry)
        self.failed = Counter(
            "fastmode:pool_replica_failures",
            "Requests ended by their replica's failure (the replica died or became unreachable)",
            pt,
            registry=registry,
        )
        self.retried = Counter(
            "fastmode:pool_request_retries",
            "Requests sent again to another replica after theirs failed before any output",
            pt,
            registry=registry,
        )
        self.replicas = dict(replicas)
        self.in_flight = in_flight
        self.latest: dict[tuple[str, str], EngineStats] = {}  # (pool, replica) -> its engine's state
        registry.register(_PoolCollector(self))

    def observe_finished(self, pool: str, m: RequestMetrics) -> None:
        self.generation_tokens.labels(pool, m.tier).inc(m.completion_tokens)
        self.prompt_tokens.labels(pool, m.tier).inc(m.prompt_tokens)
        self.cost.labels(pool, m.tier).inc(m.cost_usd)
        self.machine.labels(pool, m.tier).inc(m.machine_s)
        self.finished.labels(pool, m.tier).inc()

    def forget_replica(self, pool: str, replica: str) -> None:
        """A replica that failed: its last report no longer describes anything running."""
        self.latest.pop((pool, replica), None)


class _PoolCollector:
    def __init__(self, m: PoolMetrics):
        self.m = m

    def collect(self):
        replicas = GaugeMetricFamily("fastmode:pool_replicas", "Replicas a pool is deployed with", labels=["pool"])
        flight = GaugeMetricFamily(
            "fastmode:pool_requests_in_flight", "Requests admitted to a pool and not finished", labels=["pool", "tier"]
        )
        prt = ["pool", "replica", "tier"]
        running = GaugeMetricFamily("fastmode:pool_num_requests_running", "A replica's running requests", labels=prt)
        waiting = GaugeMetricFamily("fastmode:pool_num_requests_waiting", "A replica's waiting requests", labels=prt)
        kv = GaugeMetricFamily(
            "fastmode:pool_kv_cache_usage_perc", "A replica's KV blocks in use (0-1)", labels=["pool", "replica"]
        )
        for pool, n in self.m.replicas.items():
            replicas.add_metric([pool], n)
        for (pool, tier), n in self.m.in_flight().items():
            flight.add_metric([pool, tier], n)
        for (pool, replica), s in list(self.m.latest.items()):
            for tier, n in s.running.items():
                running.add_metric([pool, replica, tier], n)
            for tier, n in s.waiting.items():
                waiting.add_metric([pool, replica, tier], n)
            kv.add_metric([pool, replica], s.kv_usage)
        yield from (replicas, flight, running, waiting, kv)
