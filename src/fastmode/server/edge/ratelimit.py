"""Per-tier rate limits: token buckets refilled continuously, one per (tier, kind).

A bucket holds up to `limit` units (one minute's worth) and refills at
limit/60 per second, so a client may burst up to the limit and then proceeds
at the sustained rate. Output tokens are charged at admission as `max_tokens`
(the most the request may produce, as Anthropic estimates OTPM) and the unused
part is refunded when the request ends.

The header functions render the same bucket state in each vendor's dialect.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from fastmode.engine.tiers import Tier
from fastmode.server.config import TierLimits

KINDS = ("requests", "input_tokens", "output_tokens")


class TokenBucket:
    def __init__(self, limit_per_min: float, now_s: float):
        self.limit = float(limit_per_min)
        self.rate_per_s = self.limit / 60.0
        self.level = self.limit
        self._t = now_s

    def _refill(self, now_s: float) -> None:
        self.level = min(self.limit, self.level + max(0.0, now_s - self._t) * self.rate_per_s)
        self._t = now_s

    def wait_s(self, amount: float, now_s: float) -> float:
        """Seconds until `amount` is available (0 = now; inf = never, it exceeds the limit)."""
        self._refill(now_s)
        if amount > self.limit:
            return math.inf
        return max(0.0, (amount - self.level) / self.rate_per_s)

    def take(self, amount: float, now_s: float) -> None:
        self._refill(now_s)
        self.level -= amount

    def give(self, amount: float, now_s: float) -> None:
        self._refill(now_s)
        self.level = min(self.limit, self.level + amount)

    def remaining(self, now_s: float) -> int:
        self._refill(now_s)
        return max(0, int(self.level))

    def reset_s(self, now_s: float) -> float:
        """Seconds until the bucket is full again."""
        self._refill(now_s)
        return max(0.0, (self.limit - self.level) / self.rate_per_s)


@dataclass(frozen=True)
class LimitState:
    kind: str  # requests | input_tokens | output_tokens
    limit: int
    remaining: int
    reset_s: float


@dataclass(frozen=True)
class Refusal:
    kind: str
    retry_after_s: float  # inf when the request alone exceeds the per-minute limit
    needed: float
    limit: float


class RateLimiter:
    """All buckets of all tiers. Not thread-safe: called from the event loop only."""

    def __init__(self, limits: dict[Tier, TierLimits], clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        now = clock()
        self._buckets = {
            tier: {kind: TokenBucket(v, now) for kind, v in tl.as_dict().items()} for tier, tl in limits.items()
        }

    def try_acquire(self, tier: Tier, input_tokens: int, output_tokens: int) -> Refusal | None:
        """Take one request and its tokens from `tier`'s buckets, all or nothing."""
        buckets = self._buckets.get(tier, {})
        now = self.clock()
        wanted = {"requests": 1, "input_tokens": input_tokens, "output_tokens": output_tokens}
        worst = None
        for kind, b in buckets.items():
            w = b.wait_s(wanted[kind], now)
            if w > 0 and (worst is None or w > worst.retry_after_s):
                worst = Refusal(kind, w, wanted[kind], b.limit)
        if worst is not None:
            return worst
        for kind, b in buckets.items():
            b.take(wanted[kind], now)
        return None

    def refund_output(self, tier: Tier, unused_tokens: int) -> None:
        b = self._buckets.get(tier, {}).get("output_tokens")
        if b is not None and unused_tokens > 0:
            b.give(unused_tokens, self.clock())

    def states(self, tier: Tier) -> list[LimitState]:
        now = self.clock()
        return [
            LimitState(kind, int(b.limit), b.remaining(now), b.reset_s(now))
            for kind, b in self._buckets.get(tier, {}).items()
        ]


# -- headers -----------------------------------------------------------------
def _duration(seconds: float) -> str:
    """OpenAI's reset format: '20ms', '1s', '6m0s'."""
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    m, s = divmod(int(math.ceil(seconds)), 60)
    return f"{m}m{s}s" if m else f"{s}s"


def retry_after_header(seconds: float) -> str:
    return str(max(1, math.ceil(seconds))) if math.isfinite(seconds) else "60"


def openai_headers(states: list[LimitState]) -> dict[str, str]:
    """x-ratelimit-*-requests and x-ratelimit-*-tokens; tokens report the more
    constrained of the input and output buckets (OpenAI counts one token pool)."""
    h: dict[str, str] = {}
    by_kind = {s.kind: s for s in states}
    token_states = [s for s in states if s.kind != "requests"]
    picks = {"requests": by_kind.get("requests")}
    if token_states:
        picks["tokens"] = min(token_states, key=lambda s: s.remaining / max(1, s.limit))
    for name, s in picks.items():
        if s is None:
            continue
        h[f"x-ratelimit-limit-{name}"] = str(s.limit)
        h[f"x-ratelimit-remaining-{name}"] = str(s.remaining)
        h[f"x-ratelimit-reset-{name}"] = _duration(s.reset_s)
    return h


def anthropic_headers(tier: Tier, states: list[LimitState]) -> dict[str, str]:
    """anthropic-ratelimit-{kind}-* for standard; fast mode has its own limits,
    reported as anthropic-fast-{kind}-* (kind: requests, input-tokens, output-tokens)."""
    prefix = "anthropic-fast" if tier is Tier.FAST else "anthropic-ratelimit"
    now = datetime.now(timezone.utc)
    h: dict[str, str] = {}
    for s in states:
        kind = s.kind.replace("_", "-")
        reset = (now + timedelta(seconds=s.reset_s)).isoformat(timespec="seconds").replace("+00:00", "Z")
        h[f"{prefix}-{kind}-limit"] = str(s.limit)
        h[f"{prefix}-{kind}-remaining"] = str(s.remaining)
        h[f"{prefix}-{kind}-reset"] = reset
    return h
