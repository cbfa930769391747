"""Admission: which tier serves a request, or why it is refused, before it reaches the engine.

Order of checks (each refusal is a clear error instead of unbounded latency):
1. fast wanted and the fast lane is full (fast requests in flight >=
   fast_lane_max_batch * fast_lane_full_factor) -> explicit fast: 429;
   `service_tier=auto`: served as standard, and the response says why;
2. the queue is full -> overloaded (503 OpenAI, 529 Anthropic). The bound is
   on every admitted request, running or waiting: max_num_seqs running plus
   max_waiting_requests waiting. The last `fast_reserved_fraction` of the
   waiting room is the fast tier's own: standard and flex are refused before
   it, so a queue full of standard traffic still admits fast requests (up to
   the fast lane's own limit). Flex is refused earlier still, once
   `flex_queue_fraction` of the waiting room is taken (429);
3. the tier's rate limits -> 429 with retry-after (auto falls back again).

Requests in flight are counted here, from admission to `settle()`, whether or
not the engine holds them yet: two requests admitted in the same event-loop
turn, or one still tokenizing or waiting in the engine thread's inbox, count
against the bound. Each served model has its own controller (its
own engine queue and fast lane); the rate limiter is shared, as a key's
per-tier budget does not grow with the number of models.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastmode.engine.llm_engine import LLMEngine
from fastmode.engine.tiers import Tier
from fastmode.server.config import ServerConfig
from fastmode.server.edge.errors import ApiError
from fastmode.server.edge.ratelimit import LimitState, RateLimiter
from fastmode.server.metrics import ServerMetrics

# How long a client refused by a full fast lane should wait: a fast request
# lasts a few seconds at most, so this is a poll interval, not a promise.
_LANE_RETRY_S = 1.0


@dataclass(frozen=True)
class TierChoice:
    """What the client asked for: a tier, and whether it may be served below fast."""

    tier: Tier
    requested: str | None  # as the client spelled it (None: not sent), echoed in responses
    auto: bool = False  # fast if there is room, else standard


@dataclass
class Admission:
    tier: Tier
    requested: str | None
    fallback_reason: str | None
    max_output_tokens: int
    rate_limits: list[LimitState]
    _controller: AdmissionController | None = field(default=None, repr=False)
    _settled: bool = False

    def settle(self, num_output_tokens: int) -> None:
        """The request is over: stop counting it and refund unused output tokens. Idempotent."""
        if self._settled or self._controller is None:
            return
        self._settled = True
        self._controller._release(self, num_output_tokens)


class AdmissionController:
    def __init__(
        self,
        config: ServerConfig,
        engine: LLMEngine,
        limiter: RateLimiter,
        metrics: ServerMetrics,
        model: str | None = None,
    ):
        self.config = config
        self.engine = engine
        self.model = model or engine.model_name  # the served name, for metric labels
        self.limiter = limiter
        self.metrics = metrics
        self.in_flight = {t: 0 for t in Tier}
        sc = engine.scheduler_config
        lane = sc.fast_lane_max_batch or sc.max_num_seqs
        self.fast_capacity = max(1, int(lane * config.fast_lane_full_factor))
        self.max_running = sc.max_num_seqs
        waiting = config.max_waiting_requests
        self.capacity = self.max_running + waiting  # every admitted request, running or waiting
        self.shared_capacity = self.capacity - int(waiting * config.fast_reserved_fraction)  # standard and flex
        self.flex_capacity = min(self.shared_capacity, self.max_running + waiting * config.flex_queue_fraction)

    @property
    def num_in_flight(self) -> int:
        return sum(self.in_flight.values())

    def _check_queue(self, tier: Tier) -> None:
        total = self.num_in_flight
        if tier is Tier.FLEX and total >= self.flex_capacity:
            self._reject(tier, "flex_unavailable")
            raise ApiError(
                "rate_limit",
                "Resource Unavailable: flex capacity is exhausted right now; retry later or use default",
                code="resource_unavailable",
                retry_after_s=_LANE_RETRY_S,
            )
        if total >= (self.capacity if tier is Tier.FAST else self.shared_capacity):
            self._reject(tier, "queue_full")
            waiting = max(0, total - self.max_running)
            raise ApiError(
                "overloaded",
                f"the server is overloaded: {total} requests are in flight ({waiting} waiting); retry later",
                code="server_overloaded",
                retry_after_s=_LANE_RETRY_S,
            )

    def admit(self, choice: TierChoice, input_tokens: int, max_output_tokens: int) -> Admission:
        tier, reason = choice.tier, None
        if tier is Tier.FAST:
            full = self.in_flight[Tier.FAST] >= self.fast_capacity
            if full and not choice.auto:
                self._reject(tier, "fast_lane_full")
                raise ApiError(
                    "rate_limit",
                    f"the fast lane is full ({self.in_flight[Tier.FAST]} fast requests in flight, capacity "
                    f"{self.fast_capacity}); retry later or send the request without fast mode",
                    code="fast_lane_full",
                    retry_after_s=_LANE_RETRY_S,
                )
            if full:
                tier, reason = Tier.STANDARD, "fast lane full"
        self._check_queue(tier)
        if tier is Tier.FAST and choice.auto:
            # auto tries fast's limits first and, refused, is served (and billed) as standard.
            if self.limiter.try_acquire(Tier.FAST, input_tokens, max_output_tokens) is None:
                return self._admitted(Tier.FAST, choice, None, max_output_tokens)
            tier, reason = Tier.STANDARD, "fast rate limit reached"
            self._check_queue(tier)  # standard's share of the queue, not fast's
        if reason is not None:
            self.metrics.fallbacks.labels(self.model, reason).inc()
        refusal = self.limiter.try_acquire(tier, input_tokens, max_output_tokens)
        if refusal is not None:
            self._reject(tier, "rate_limit")
            what = refusal.kind.replace("_", " ")
            if refusal.needed > refusal.limit:
                msg = (
                    f"request too large for the {tier.value} tier: it needs {int(refusal.needed)} {what} "
                    f"but the limit is {int(refusal.limit)} per minute"
                )
            else:
                msg = (
                    f"rate limit reached for the {tier.value} tier: {int(refusal.limit)} {what} per minute; "
                    f"retry in {refusal.retry_after_s:.1f} s"
                )
            raise ApiError(
                "rate_limit",
                msg,
                code="rate_limit_exceeded",
                param=refusal.kind,
                retry_after_s=refusal.retry_after_s,
                rate_limits=(tier, self.limiter.states(tier)),
            )
        return self._admitted(tier, choice, reason, max_output_tokens)

    def _admitted(self, tier: Tier, choice: TierChoice, reason: str | None, max_output_tokens: int) -> Admission:
        self.in_flight[tier] += 1
        return Admission(tier, choice.requested, reason, max_output_tokens, self.limiter.states(tier), self)

    def _reject(self, tier: Tier, reason: str) -> None:
        self.metrics.rejected.labels(self.model, tier.value, reason).inc()

    def _release(self, a: Admission, num_output_tokens: int) -> None:
        self.in_flight[a.tier] -= 1
        self.limiter.refund_output(a.tier, a.max_output_tokens - num_output_tokens)
