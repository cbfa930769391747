"""Server configuration: one frozen dataclass; `fastmode serve` generates its flags from the fields.

Rate limits are per tier and per minute, in three kinds (requests, input tokens,
output tokens) as both vendors count them; None means unlimited. The API key
comes from the flag or FASTMODE_API_KEY, and `api_key_from_env` is the only
place that reads the environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fastmode.engine.tiers import Tier

API_KEY_ENV = "FASTMODE_API_KEY"


def api_key_from_env(flag_value: str | None) -> str | None:
    """The flag wins; otherwise FASTMODE_API_KEY; empty means no authentication."""
    return flag_value or os.environ.get(API_KEY_ENV) or None


@dataclass(frozen=True)
class TierLimits:
    requests_per_min: float | None = None
    input_tokens_per_min: float | None = None
    output_tokens_per_min: float | None = None

    def as_dict(self) -> dict[str, float]:
        """Configured limits only, keyed by kind (requests, input_tokens, output_tokens)."""
        kinds = {
            "requests": self.requests_per_min,
            "input_tokens": self.input_tokens_per_min,
            "output_tokens": self.output_tokens_per_min,
        }
        return {k: v for k, v in kinds.items() if v is not None}


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # key clients must send (else FASTMODE_API_KEY); None = no authentication
    served_model_name: str | None = None  # the name clients send as `model`; None = the model's own name
    serve_spark: bool = True  # also serve the default model's Spark student (<name>-spark) when its weights are present
    fast_lane_full_factor: float = 2.0  # fast is "full" once fast in flight >= fast_lane_max_batch * this
    max_waiting_requests: int = 256  # engine queue bound: past it new requests are refused (503 / 529)
    flex_queue_fraction: float = 0.5  # flex is refused (429) once the queue is this full, before anyone else
    response_store_size: int = 1024  # finished responses kept for previous_response_id (LRU)
    drain_timeout_s: float = 30.0  # on shutdown, how long in-flight requests may finish before being aborted
    fast_requests_per_min: float | None = None  # None = unlimited
    fast_input_tokens_per_min: float | None = None  # None = unlimited
    fast_output_tokens_per_min: float | None = None  # None = unlimited
    standard_requests_per_min: float | None = None  # None = unlimited
    standard_input_tokens_per_min: float | None = None  # None = unlimited
    standard_output_tokens_per_min: float | None = None  # None = unlimited
    flex_requests_per_min: float | None = None  # None = unlimited
    flex_input_tokens_per_min: float | None = None  # None = unlimited
    flex_output_tokens_per_min: float | None = None  # None = unlimited

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.fast_lane_full_factor <= 0:
            raise ValueError("fast_lane_full_factor must be > 0")
        if self.max_waiting_requests < 1:
            raise ValueError("max_waiting_requests must be >= 1")
        if not 0 < self.flex_queue_fraction <= 1:
            raise ValueError("flex_queue_fraction must be in (0, 1]")
        if self.response_store_size < 1:
            raise ValueError("response_store_size must be >= 1")
        for tier in Tier:
            for kind, value in self.tier_limits(tier).as_dict().items():
                if value <= 0:
                    raise ValueError(f"{tier.value} {kind} per minute must be > 0 (omit it for no limit)")

    def tier_limits(self, tier: Tier) -> TierLimits:
        t = tier.value
        return TierLimits(
            getattr(self, f"{t}_requests_per_min"),
            getattr(self, f"{t}_input_tokens_per_min"),
            getattr(self, f"{t}_output_tokens_per_min"),
        )
