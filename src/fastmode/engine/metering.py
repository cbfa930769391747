"""Metering: each step's machine time is split among the sequences it served,
by tokens, and turned into a price. No torch (the simulator meters too).

A fast-lane step serves few sequences, so each gets a large share of a short
step; a full standard batch spreads a longer step over many. The fast tier's
price multiplier therefore falls out of measurement instead of being set.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fastmode.engine.scheduler import SchedulerOutput
from fastmode.engine.sequence import Sequence


def attribute_step(out: SchedulerOutput, step_s: float) -> None:
    """Charge `step_s` seconds of machine time to the sequences in `out`."""
    total = out.total_tokens
    if total == 0:
        return
    for s in out.scheduled:
        s.seq.machine_s += step_s * s.num_tokens / total


@dataclass(frozen=True)
class RequestMetrics:
    """What a finished request reports. Times in seconds on the engine clock."""

    tier: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    queue_time_s: float
    ttft_s: float | None
    mean_itl_s: float | None
    e2e_s: float
    machine_s: float
    cost_usd: float
    num_preemptions: int

    def to_dict(self) -> dict:
        return asdict(self)


def request_metrics(seq: Sequence, usd_per_machine_hour: float) -> RequestMetrics:
    end = seq.finished_s if seq.finished_s is not None else seq.last_token_s or seq.arrival_time_s
    started = seq.first_scheduled_s if seq.first_scheduled_s is not None else end
    ttft = None if seq.first_token_s is None else seq.first_token_s - seq.arrival_time_s
    itl = None
    if seq.num_output_tokens > 1 and seq.first_token_s is not None and seq.last_token_s is not None:
        itl = (seq.last_token_s - seq.first_token_s) / (seq.num_output_tokens - 1)
    return RequestMetrics(
        tier=seq.tier.value,
        prompt_tokens=seq.num_prompt_tokens,
        completion_tokens=seq.num_output_tokens,
        cached_tokens=seq.num_cached_tokens,
        queue_time_s=started - seq.arrival_time_s,
        ttft_s=ttft,
        mean_itl_s=itl,
        e2e_s=end - seq.arrival_time_s,
        machine_s=seq.machine_s,
        cost_usd=seq.machine_s * usd_per_machine_hour / 3600.0,
        num_preemptions=seq.num_preemptions,
    )
