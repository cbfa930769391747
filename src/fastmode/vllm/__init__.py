"""fastmode's fast lane inside vLLM (docs/vllm.md), an optional extra: `pip install -e '.[vllm]'`.

- `FastLaneScheduler`: a vLLM v1 scheduler with fastmode's tiers and fast lane
  (`--scheduler-cls fastmode.vllm.FastLaneScheduler`, settings in `--additional-config`).
- `ServiceTierMiddleware`: carries OpenAI `service_tier` to it through vLLM's OpenAI server
  (`--middleware fastmode.vllm.ServiceTierMiddleware`).
- `LaneConfig`: the settings.

Names resolve lazily: the policy (lane.py), the version check (compat.py) and the middleware
import neither vLLM nor torch, so they load and are tested without vLLM installed. fastmode's own
server never imports this package.
"""

from __future__ import annotations

__all__ = ["AsyncFastLaneScheduler", "FastLaneScheduler", "LaneConfig", "ServiceTierMiddleware"]


def __getattr__(name: str):
    if name in ("FastLaneScheduler", "AsyncFastLaneScheduler"):
        from fastmode.vllm import scheduler

        return getattr(scheduler, name)
    if name == "ServiceTierMiddleware":
        from fastmode.vllm.middleware import ServiceTierMiddleware

        return ServiceTierMiddleware
    if name == "LaneConfig":
        from fastmode.vllm.lane import LaneConfig

        return LaneConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
