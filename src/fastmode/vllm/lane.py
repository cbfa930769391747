"""The fast lane's policy inside a vLLM v1 scheduler. No torch, no vLLM.

The same policy as fastmode's own scheduler (engine/scheduler.py, docs/fast-lane.md), stated
over the few facts vLLM's scheduler can give it, so that it can be tested and simulated without
vLLM:

- A request's tier comes from what it asked for: OpenAI `service_tier` (carried into vLLM's
  request as `vllm_xargs.service_tier`, see middleware.py), else its vLLM `priority`: at or
  below `fast_priority_at_most` it is fast.
- While any fast request is resident or waiting, at most `lane_max_batch` requests share a step.
  Fast requests take their slots first, slots are kept for fast requests still waiting, and the
  rest rotate among lower tiers, least recently served first. The others are *paused*: they keep
  their KV blocks and sit the step out.
- When a waiting fast request finds every resident slot taken (`max_num_seqs` binding), the
  least important paused resident (flex before standard, later arrival first) is preempted to
  make room; vLLM's own scheduler never preempts to admit.
- Without fast work the step is vLLM's own. (The scheduler orders vLLM's running list by
  importance, tier then priority and arrival, where flex requests or vLLM's priority policy make
  that order matter: vLLM preempts the last of that list first.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastmode.engine.scheduler import SchedulerSettings
from fastmode.engine.tiers import OPENAI_SERVICE_TIERS, Tier

CONFIG_SECTION = "fastmode"  # the key in vLLM's --additional-config that holds these settings


@dataclass(frozen=True)
class LaneConfig:
    """The lane's settings, read from vLLM's `--additional-config '{"fastmode": {...}}'`."""

    # Requests per step while fast work exists; the same default as fastmode's own engine.
    lane_max_batch: int = SchedulerSettings.fast_lane_max_batch or 4
    # A request whose vLLM priority is at or below this is fast (lower is more important in vLLM);
    # None: only `service_tier` makes a request fast.
    fast_priority_at_most: int | None = -1

    def __post_init__(self) -> None:
        if not isinstance(self.lane_max_batch, int) or isinstance(self.lane_max_batch, bool) or self.lane_max_batch < 1:
            raise ValueError(f"fastmode.lane_max_batch must be an integer >= 1, got {self.lane_max_batch!r}")
        p = self.fast_priority_at_most
        if p is not None and (not isinstance(p, int) or isinstance(p, bool)):
            raise ValueError(f"fastmode.fast_priority_at_most must be an integer or null, got {p!r}")

    @classmethod
    def from_additional_config(cls, additional_config: Mapping[str, Any] | None) -> LaneConfig:
        """The settings under `CONFIG_SECTION`; defaults where absent. Unknown keys are an error, so
        that a misspelt setting is never silently ignored."""
        section = (additional_config or {}).get(CONFIG_SECTION) or {}
        if not isinstance(section, Mapping):
            raise ValueError(f'--additional-config "{CONFIG_SECTION}" must be an object, got {section!r}')
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(
                f'unknown --additional-config "{CONFIG_SECTION}" setting(s) {unknown}; known: {sorted(known)}'
            )
        return cls(**section)


def classify(service_tier: str | None, priority: int, config: LaneConfig) -> Tier:
    """The tier a request is served in. An explicit `service_tier` (other than "auto") decides;
    otherwise a vLLM priority at or below `fast_priority_at_most` is fast, anything else standard.
    Raises ValueError for a `service_tier` fastmode does not offer."""
    if service_tier is not None and service_tier != "auto":
        tier = OPENAI_SERVICE_TIERS.get(service_tier)
        if tier is None:
            offered = ", ".join([*OPENAI_SERVICE_TIERS, "auto"])
            raise ValueError(f"service_tier {service_tier!r} is not offered; use one of {offered}")
        return tier
    at_most = config.fast_priority_at_most
    return Tier.FAST if at_most is not None and priority <= at_most else Tier.STANDARD


@dataclass(frozen=True, slots=True)
class Resident:
    """One resident (KV-holding) request as the policy sees it."""

    tier: Tier
    priority: int  # vLLM's; lower is more important. Compared only when the operator chose priority order
    arrival_time_s: float
    last_scheduled_step: int  # the last step it was in; -1 before its first


def importance_key(tier: Tier, priority: int, arrival_time_s: float, by_priority: bool) -> tuple:
    """Smaller is more important: tier, then (if the operator chose vLLM's priority policy) priority,
    then arrival. The waiting queue, the order of the running list and the victim order all use it."""
    return (tier.rank, priority if by_priority else 0, arrival_time_s)


def _importance(r: Resident, by_priority: bool) -> tuple:
    return importance_key(r.tier, r.priority, r.arrival_time_s, by_priority)


@dataclass
class LanePlan:
    """Which residents (indices into the list given to `plan_step`) run this step, which sit it
    out, and which are preempted first. `num_admit` bounds the waiting requests the step may take."""

    lane_active: bool
    step: list[int] = field(default_factory=list)  # in service order
    paused: list[int] = field(default_factory=list)
    evict: list[int] = field(default_factory=list)  # preempt these now (to free resident slots)
    victims: list[int] = field(default_factory=list)  # of `paused`: who gives up KV first, when memory is short
    num_admit: int = 0


def plan_step(
    residents: Sequence[Resident],
    num_fast_waiting: int,
    lane_max_batch: int,
    max_num_seqs: int,
    by_priority: bool = False,
) -> LanePlan:
    """Plan one step. Invariants: `step`, `paused` and `evict` partition the residents; without
    fast work `step` holds every resident and nothing is paused or evicted; with it, `step` plus
    `num_admit` is at most `lane_max_batch`, only lower-tier residents are paused ahead of fast
    ones, and only paused lower-tier residents are evicted or named victims (least important first)."""
    n = len(residents)
    lane_active = num_fast_waiting > 0 or any(r.tier is Tier.FAST for r in residents)
    if not lane_active:
        order = sorted(range(n), key=lambda i: _importance(residents[i], by_priority))
        return LanePlan(False, step=order, num_admit=max(0, max_num_seqs - n))

    num_fast = sum(r.tier is Tier.FAST for r in residents)
    reserve = min(num_fast_waiting, max(0, lane_max_batch - num_fast))  # slots kept for waiting fast requests
    limit_fast, limit_other = lane_max_batch, lane_max_batch - reserve
    # Service order: tier, then least recently served (rotation), then arrival (fastmode's _service_key).
    service = sorted(
        range(n), key=lambda i: (residents[i].tier.rank, residents[i].last_scheduled_step, residents[i].arrival_time_s)
    )
    plan = LanePlan(True)
    for i in service:
        limit = limit_fast if residents[i].tier is Tier.FAST else limit_other
        (plan.step if len(plan.step) < limit else plan.paused).append(i)

    # Least important first: the lowest tier, then the latest (by priority, then arrival).
    lower = [i for i in plan.paused if residents[i].tier is not Tier.FAST]
    lower.sort(key=lambda i: _importance(residents[i], by_priority), reverse=True)
    # A waiting fast request must not wait for a resident slot behind paused lower-tier work.
    num_short = max(0, reserve - max(0, max_num_seqs - n))
    plan.evict = lower[:num_short]
    plan.victims = lower[num_short:]
    evicted = set(plan.evict)
    plan.paused = [i for i in plan.paused if i not in evicted]
    free_slots = max_num_seqs - (n - len(plan.evict))
    plan.num_admit = max(0, min(lane_max_batch - len(plan.step), free_slots))
    return plan
