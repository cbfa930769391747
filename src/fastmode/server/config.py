"""Server configuration: one frozen dataclass; `fastmode serve` generates its flags from the fields.

Rate limits are per tier and per minute, in three kinds (requests, input tokens,
output tokens) as both vendors count them; None means unlimited. The API key
comes from FASTMODE_API_KEY, a key file (--api-key-file) or the flag (which
`ps` shows to every user of the machine, so the other two are recommended);
`api_key_from_env` is the only place that reads them. Without a key the server
listens on loopback only.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

from fastmode.engine.tiers import Tier

API_KEY_ENV = "FASTMODE_API_KEY"

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def is_loopback(host: str) -> bool:
    """Whether a host name or address (without port or brackets) is this machine's loopback."""
    host = host.strip().lower().rstrip(".")
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key_from_env(flag_value: str | None, key_file: str | None = None) -> str | None:
    """The flag wins, then the key file (its first line), then FASTMODE_API_KEY; empty means
    no authentication. A key file that cannot be read or holds no key is an error."""
    if flag_value:
        return flag_value
    if key_file:
        try:
            with open(key_file, encoding="utf-8") as f:
                key = f.readline().strip()
        except OSError as e:
            raise ValueError(f"cannot read the API key file {key_file}: {e.strerror}") from None
        if not key:
            raise ValueError(f"the API key file {key_file} is empty")
        return key
    return os.environ.get(API_KEY_ENV) or None


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
    api_key: str | None = None  # key clients must send; prefer FASTMODE_API_KEY or --api-key-file (ps shows flags)
    api_key_file: str | None = None  # a file whose first line is the API key
    served_model_name: str | None = None  # the name clients send as `model`; None = the model's own name
    serve_spark: bool = True  # also serve the default model's Spark student (<name>-spark) when its weights are present
    fast_lane_full_factor: float = 2.0  # fast is "full" once fast in flight >= fast_lane_max_batch * this
    max_waiting_requests: int = 256  # engine queue bound: past it new requests are refused (503 / 529)
    flex_queue_fraction: float = 0.5  # flex is refused (429) once the queue is this full, before anyone else
    fast_reserved_fraction: float = 0.25  # share of the queue only fast requests may take
    response_store_size: int = 1024  # finished responses kept for previous_response_id (LRU)
    response_store_mib: float = 256.0  # and at most this much of their tokens and text (LRU)
    max_body_mib: float = 16.0  # request bodies (and WebSocket messages) larger than this are refused (413)
    max_messages: int = 4096  # messages (or input items) per request
    max_tools: int = 512  # tools per request
    max_stop_sequences: int = 64  # stop strings per request
    max_stop_chars: int = 512  # characters per stop string
    max_name_chars: int = 256  # characters of a model, tool or function name
    max_nesting_depth: int = 64  # how deeply a request's JSON may nest
    max_concurrent_tokenizations: int = 4  # prompts tokenized at once, on worker threads
    ws_idle_timeout_s: float = 600.0  # a WebSocket with no response running and no message for this long is closed
    http_header_timeout_s: float = 10.0  # a request's line and headers must arrive within this, else 408 and close
    http_body_timeout_s: float = 30.0  # a request body that pauses this long closes its connection
    http_keep_alive_s: float = 5.0  # an idle connection between two requests is closed after this
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed (CORS and WebSocket); "*" = any
    allowed_hosts: tuple[str, ...] = ()  # Host names accepted besides loopback when no API key is set; "*" = any
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
        if self.api_key is None and not is_loopback(self.host):
            raise ValueError(
                f"without an API key the server listens on loopback only, not {self.host}: "
                f"set {API_KEY_ENV} or --api-key-file to serve other machines"
            )
        if self.fast_lane_full_factor <= 0:
            raise ValueError("fast_lane_full_factor must be > 0")
        if self.max_waiting_requests < 1:
            raise ValueError("max_waiting_requests must be >= 1")
        if not 0 < self.flex_queue_fraction <= 1:
            raise ValueError("flex_queue_fraction must be in (0, 1]")
        if self.response_store_size < 1:
            raise ValueError("response_store_size must be >= 1")
        if not 0 <= self.fast_reserved_fraction < 1:
            raise ValueError("fast_reserved_fraction must be in [0, 1)")
        for name in (
            "response_store_mib",
            "max_body_mib",
            "ws_idle_timeout_s",
            "http_header_timeout_s",
            "http_body_timeout_s",
            "http_keep_alive_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        for name in (
            "max_messages",
            "max_tools",
            "max_stop_sequences",
            "max_stop_chars",
            "max_name_chars",
            "max_nesting_depth",
            "max_concurrent_tokenizations",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for tier in Tier:
            for kind, value in self.tier_limits(tier).as_dict().items():
                if value <= 0:
                    raise ValueError(f"{tier.value} {kind} per minute must be > 0 (omit it for no limit)")

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mib * 2**20)

    def tier_limits(self, tier: Tier) -> TierLimits:
        t = tier.value
        return TierLimits(
            getattr(self, f"{t}_requests_per_min"),
            getattr(self, f"{t}_input_tokens_per_min"),
            getattr(self, f"{t}_output_tokens_per_min"),
        )
