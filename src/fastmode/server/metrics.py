"""Prometheus metrics, one private registry per app (tests build several apps).

Every series is labelled by the served model (a server may serve several) and,
where it applies, by tier, so the fast lane's promise is visible per model and
tier. TTFT, queue time and end-to-end come from the engine's clock (the
request's own timings), inter-token latency from when tokens reach the server.
Engine state (running / waiting per tier, KV usage, preemptions, prefix cache,
speculation per tier) is read at scrape time by a custom collector, so it is
never stale.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from fastmode.engine.async_engine import EngineStats
from fastmode.engine.metering import RequestMetrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0)
_ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2, 0.4, 1.0, 2.5)

EngineStatsByModel = Callable[[], Mapping[str, EngineStats]]


class _EngineCollector:
    """Gauges and counters owned by the engines, read when Prometheus scrapes."""

    def __init__(self, stats: EngineStatsByModel):
        self._stats = stats

    def collect(self):
        by_model = self._stats()  # empty while no engine runs (starting or stopping): nothing to report
        if not by_model:
            return
        m, mt = ["model"], ["model", "tier"]
        running = GaugeMetricFamily("fastmode:num_requests_running", "Requests holding KV blocks, by tier", labels=mt)
        waiting = GaugeMetricFamily(
            "fastmode:num_requests_waiting", "Requests queued for admission, by tier", labels=mt
        )
        kv = GaugeMetricFamily("fastmode:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1)", labels=m)
        lane = GaugeMetricFamily("fastmode:fast_lane_active", "1 while fast work caps the batch", labels=m)
        preempt = CounterMetricFamily(
            "fastmode:num_preemptions", "Sequences preempted (KV freed, recomputed later)", labels=m
        )
        queries = CounterMetricFamily(
            "fastmode:prefix_cache_queries", "Full KV blocks looked up in the prefix cache", labels=m
        )
        hits = CounterMetricFamily("fastmode:prefix_cache_hits", "Full KV blocks found in the prefix cache", labels=m)
        drafts = CounterMetricFamily(
            "fastmode:spec_decode_num_drafts", "Verify steps that carried draft tokens", labels=mt
        )
        draft_tokens = CounterMetricFamily("fastmode:spec_decode_num_draft_tokens", "Draft tokens proposed", labels=mt)
        accepted = CounterMetricFamily("fastmode:spec_decode_num_accepted_tokens", "Draft tokens accepted", labels=mt)
        rate = GaugeMetricFamily(
            "fastmode:spec_decode_acceptance_rate", "Accepted / proposed draft tokens since start", labels=mt
        )
        for name, s in by_model.items():
            for tier, n in s.running.items():
                running.add_metric([name, tier], n)
            for tier, n in s.waiting.items():
                waiting.add_metric([name, tier], n)
            kv.add_metric([name], s.kv_usage)
            lane.add_metric([name], int(s.lane_active))
            preempt.add_metric([name], s.num_preemptions)
            queries.add_metric([name], s.prefix_queries)
            hits.add_metric([name], s.prefix_hits)
            for tier, n in s.spec.drafts.items():  # only tiers that have speculated: no rate for 0 / 0
                drafts.add_metric([name, tier], n)
                draft_tokens.add_metric([name, tier], s.spec.draft_tokens.get(tier, 0))
                accepted.add_metric([name, tier], s.spec.accepted_tokens.get(tier, 0))
                r = s.spec.acceptance_rate(tier)
                if r is not None:
                    rate.add_metric([name, tier], r)
        yield from (running, waiting, kv, lane, preempt, queries, hits, drafts, draft_tokens, accepted, rate)


class ServerMetrics:
    """The server's registry. Request-level series are labelled (model, tier, ...)."""

    def __init__(self, engine_stats: EngineStatsByModel):
        r = self.registry = CollectorRegistry()
        by_tier = ["model", "tier"]
        self.ttft = Histogram(
            "fastmode:time_to_first_token_seconds",
            "Arrival to first token",
            by_tier,
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.itl = Histogram(
            "fastmode:inter_token_latency_seconds",
            "Gap between output tokens as the server receives them",
            by_tier,
            buckets=_ITL_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            "fastmode:e2e_request_latency_seconds", "Arrival to finish", by_tier, buckets=_LATENCY_BUCKETS_S, registry=r
        )
        self.queue = Histogram(
            "fastmode:request_queue_time_seconds",
            "Arrival to first scheduled",
            by_tier,
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "fastmode:prompt_tokens", "Prompt tokens of finished requests", by_tier, registry=r
        )
        self.cached_tokens = Counter(
            "fastmode:prompt_tokens_cached", "Prompt tokens served from the prefix cache", by_tier, registry=r
        )
        self.generation_tokens = Counter("fastmode:generation_tokens", "Output tokens produced", by_tier, registry=r)
        self.cost = Counter(
            "fastmode:request_cost_usd", "Metered price of finished requests (USD)", by_tier, registry=r
        )
        self.machine = Counter(
            "fastmode:request_machine_seconds", "Machine time charged to finished requests", by_tier, registry=r
        )
        self.finished = Counter(
            "fastmode:request_success", "Finished requests by finish reason", [*by_tier, "finish_reason"], registry=r
        )
        self.aborted = Counter(
            "fastmode:request_aborted", "Requests ended early (client gone, shutdown)", by_tier, registry=r
        )
        self.rejected = Counter(
            "fastmode:request_rejected", "Requests refused at admission", [*by_tier, "reason"], registry=r
        )
        self.fallbacks = Counter(
            "fastmode:service_tier_fallback",
            "service_tier=auto requests served below fast",
            ["model", "reason"],
            registry=r,
        )
        r.register(_EngineCollector(engine_stats))

    def observe_tokens(self, model: str, tier: str, num_tokens: int, gap_s: float | None) -> None:
        """`num_tokens` arrived `gap_s` after the previous ones (None for the first)."""
        if num_tokens <= 0:
            return
        self.generation_tokens.labels(model, tier).inc(num_tokens)
        if gap_s is not None:
            h = self.itl.labels(model, tier)
            for _ in range(num_tokens):  # a multi-token step (speculation) spreads its gap over its tokens
                h.observe(gap_s / num_tokens)

    def observe_finished(self, model: str, m: RequestMetrics, finish_reason: str) -> None:
        t = m.tier
        if m.ttft_s is not None:
            self.ttft.labels(model, t).observe(m.ttft_s)
        self.e2e.labels(model, t).observe(m.e2e_s)
        self.queue.labels(model, t).observe(m.queue_time_s)
        self.prompt_tokens.labels(model, t).inc(m.prompt_tokens)
        self.cached_tokens.labels(model, t).inc(m.cached_tokens)
        self.cost.labels(model, t).inc(m.cost_usd)
        self.machine.labels(model, t).inc(m.machine_s)
        self.finished.labels(model, t, finish_reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
