"""Token buckets and rate-limit headers, on a fake clock."""

from __future__ import annotations

import math

from fastmode.engine.tiers import Tier
from fastmode.server.config import ServerConfig, TierLimits, api_key_from_env
from fastmode.server.edge.ratelimit import RateLimiter, anthropic_headers, openai_headers


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_bucket_bursts_then_refills_at_the_sustained_rate():
    clock = Clock()
    rl = RateLimiter({Tier.FAST: TierLimits(requests_per_min=3)}, clock)
    assert [rl.try_acquire(Tier.FAST, 10, 10) for _ in range(3)] == [None] * 3
    refusal = rl.try_acquire(Tier.FAST, 10, 10)
    assert refusal.kind == "requests" and math.isclose(refusal.retry_after_s, 20.0)
    clock.t = 20.0
    assert rl.try_acquire(Tier.FAST, 10, 10) is None
    assert rl.try_acquire(Tier.STANDARD, 10**9, 10**9) is None  # no limits configured


def test_output_tokens_are_reserved_then_refunded():
    clock = Clock()
    rl = RateLimiter({Tier.STANDARD: TierLimits(output_tokens_per_min=100)}, clock)
    assert rl.try_acquire(Tier.STANDARD, 5, 80) is None
    assert rl.try_acquire(Tier.STANDARD, 5, 80).kind == "output_tokens"
    rl.refund_output(Tier.STANDARD, 70)  # used only 10
    assert rl.try_acquire(Tier.STANDARD, 5, 80) is None
    too_big = rl.try_acquire(Tier.STANDARD, 5, 1000)
    assert math.isinf(too_big.retry_after_s) and too_big.limit == 100


def test_headers_in_both_dialects():
    clock = Clock()
    rl = RateLimiter({Tier.FAST: TierLimits(60, 1000, 500)}, clock)
    rl.try_acquire(Tier.FAST, 100, 400)
    states = rl.states(Tier.FAST)
    h = openai_headers(states)
    assert h["x-ratelimit-limit-requests"] == "60" and h["x-ratelimit-remaining-requests"] == "59"
    assert h["x-ratelimit-reset-requests"] == "1s"
    assert h["x-ratelimit-limit-tokens"] == "500" and h["x-ratelimit-remaining-tokens"] == "100"  # output is tighter
    assert h["x-ratelimit-reset-tokens"] == "48s"
    a = anthropic_headers(Tier.FAST, states)
    assert a["anthropic-fast-input-tokens-limit"] == "1000" and a["anthropic-fast-output-tokens-remaining"] == "100"
    assert a["anthropic-fast-output-tokens-reset"].endswith("Z")
    assert "anthropic-ratelimit-requests-limit" in anthropic_headers(Tier.STANDARD, states)


def test_config_validation_and_api_key_env(monkeypatch):
    assert ServerConfig(fast_requests_per_min=5).tier_limits(Tier.FAST).as_dict() == {"requests": 5}
    try:
        ServerConfig(standard_output_tokens_per_min=0)
        raise AssertionError("a zero limit must be refused")
    except ValueError as e:
        assert "standard" in str(e)
    monkeypatch.setenv("FASTMODE_API_KEY", "from-env")
    assert api_key_from_env(None) == "from-env" and api_key_from_env("flag") == "flag"
    monkeypatch.setenv("FASTMODE_API_KEY", "")
    assert api_key_from_env(None) is None
