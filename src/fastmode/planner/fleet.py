"""Cheapest fleet that meets per-tier SLOs: replicas, batch cap and speculation per tier.

Each tier gets its own pool of replicas (a dedicated lane); sharing one replica
between tiers with preemption is what the engine does and what the discrete-event
simulator will measure, so this analytic search is an upper bound on cost.

For every batch cap B (and speculation off/on) the search takes, per tier:

1. decode speed at a *full* batch of B at the mean decode context
   (prompt + output/2): conservative, a lane is rarely full;
2. prefill time for one prompt alone; prefills steal that much of the replica's
   time from decode, so per-user speed is multiplied by (1 - lambda_r * t_prefill);
3. slot hold time S = t_prefill + output / per-user speed;
4. queueing: R replicas give c = R * B * microbatches slots; Erlang C gives the
   q-quantile wait for a slot; TTFT = wait + t_prefill;
5. the fewest R with utilisation <= max_utilization, speed >= min_tok_s and
   TTFT <= max_ttft_s; cost = R * devices * $/device-hour.

It then keeps the cheapest (B, speculation) per tier.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fastmode.planner.cost_model import CostModel
from fastmode.planner.operating_point import evaluate, power_of_two_batches
from fastmode.planner.queueing import wait_quantile_s

MAX_REPLICAS = 100_000


@dataclass(frozen=True)
class TierDemand:
    """Traffic and SLO of one tier. Rates in requests/s, lengths in tokens."""

    name: str
    arrival_rate_rps: float
    prompt_tokens: int
    output_tokens: int
    min_tok_s: float = 0.0  # per-user decode speed the tier promises
    max_ttft_s: float = math.inf  # at the search's `ttft_quantile`

    def __post_init__(self) -> None:
        if self.arrival_rate_rps < 0 or self.prompt_tokens < 0 or self.output_tokens < 1:
            raise ValueError(f"tier {self.name}: need rate >= 0, prompt >= 0, output >= 1")
        if self.min_tok_s < 0 or self.max_ttft_s <= 0:
            raise ValueError(f"tier {self.name}: need min_tok_s >= 0 and max_ttft_s > 0")


@dataclass(frozen=True)
class TierPlan:
    tier: str
    feasible: bool
    reason: str = ""
    replicas: int = 0
    batch_cap: int = 0
    speculative: bool = False
    devices: int = 0
    per_user_tok_s: float = 0.0
    ttft_s: float = 0.0  # at the search's quantile
    utilization: float = 0.0
    usd_per_hour: float | None = None
    usd_per_mtok: float | None = None


@dataclass(frozen=True)
class FleetPlan:
    tiers: tuple[TierPlan, ...]
    ttft_quantile: float
    max_utilization: float
    notes: tuple[str, ...] = field(default=())

    @property
    def usd_per_hour(self) -> float | None:
        prices = [t.usd_per_hour for t in self.tiers if t.feasible]
        return None if any(p is None for p in prices) else sum(prices)  # type: ignore[arg-type]

    @property
    def devices(self) -> int:
        return sum(t.devices for t in self.tiers if t.feasible)

    def pools_spec(self) -> dict[str, Any]:
        """The plan as a pools spec that `fastmode serve --ray --pools FILE` deploys as it is
        (docs/scale-out.md): a pool per tier with traffic, its replicas, its batch cap as
        `max_num_seqs` (and as the fast lane's size in the fast pool) and its speculation.
        A standard pool is always present, as `service_tier=auto` falls back to it: one
        replica when the plan has no standard traffic, which `notes` says."""
        pools: dict[str, dict[str, Any]] = {}
        notes = []
        for t in self.tiers:
            if not t.feasible:
                notes.append(f"{t.tier}: no pool, the plan found none that meets its SLO ({t.reason})")
                continue
            if t.replicas == 0:
                continue
            pool: dict[str, Any] = {"replicas": t.replicas, "max_num_seqs": t.batch_cap}
            if t.tier == "fast":
                pool["fast_lane_max_batch"] = t.batch_cap
            pool["speculative_method"] = "ngram" if t.speculative else "off"
            if t.speculative:
                pool["speculative_tiers"] = t.tier
            pools[t.tier] = pool
        if "standard" not in pools:
            pools["standard"] = {"replicas": 1}
            notes.append("standard: one replica added, for auto's fallback; the plan has no standard traffic")
        return {"pools": pools, "notes": notes}

    def to_dict(self) -> dict[str, Any]:
        return {
            "tiers": [asdict(t) for t in self.tiers],
            "usd_per_hour": self.usd_per_hour,
            "devices": self.devices,
            "ttft_quantile": self.ttft_quantile,
            "max_utilization": self.max_utilization,
            "notes": list(self.notes),
        }


def plan_tier(
    cm: CostModel,
    demand: TierDemand,
    spec=None,
    batch_caps: Sequence[int] | None = None,
    max_utilization: float = 0.85,
    ttft_quantile: float = 0.9,
    usd_per_hour_per_device: float | None = None,
) -> TierPlan:
    """Cheapest (replicas, batch cap, speculation) for one tier; see the module docstring."""
    if demand.arrival_rate_rps == 0:
        return TierPlan(demand.name, True, "no traffic")
    caps = list(batch_caps or power_of_two_batches(256))
    price = usd_per_hour_per_device if usd_per_hour_per_device is not None else cm.hardware.usd_per_hour
    t_prefill = cm.prefill_time_s(demand.prompt_tokens) if demand.prompt_tokens else 0.0
    ctx = demand.prompt_tokens + demand.output_tokens // 2
    best: TierPlan | None = None
    fastest_seen = 0.0
    for b in caps:
        if not cm.fits(b, demand.prompt_tokens + demand.output_tokens):
            continue
        for spec_cfg in [None, spec] if spec is not None else [None]:
            point = evaluate(cm, b, ctx, spec_cfg, usd_per_hour_per_device=usd_per_hour_per_device)
            fastest_seen = max(fastest_seen, point.per_user_tok_s)
            if point.per_user_tok_s < demand.min_tok_s:
                continue
            plan = _fewest_replicas(
                cm,
                demand,
                b,
                spec_cfg is not None,
                point.per_user_tok_s,
                t_prefill,
                max_utilization,
                ttft_quantile,
                price,
            )
            if plan is not None and (best is None or _cheaper(plan, best)):
                best = plan
    if best is not None:
        return best
    if fastest_seen < demand.min_tok_s:
        why = f"per-user speed {fastest_seen:.1f} tok/s at best is below the SLO {demand.min_tok_s:g}"
    else:
        why = f"TTFT SLO {demand.max_ttft_s:g} s not met (prefill alone takes {t_prefill:.3f} s)"
    return TierPlan(demand.name, False, why)


def _fewest_replicas(
    cm: CostModel,
    d: TierDemand,
    batch: int,
    speculative: bool,
    speed: float,
    t_prefill: float,
    max_util: float,
    q: float,
    price: float | None,
) -> TierPlan | None:
    slots_per_replica = batch * cm.microbatches_in_flight
    lam = d.arrival_rate_rps
    r = max(1, math.ceil(lam * (t_prefill + d.output_tokens / speed) / (slots_per_replica * max_util)))
    while r <= MAX_REPLICAS:
        prefill_share = lam / r * t_prefill  # fraction of each replica's time spent prefilling
        if prefill_share < max_util:
            user_speed = speed * (1 - prefill_share)
            hold_s = t_prefill + d.output_tokens / user_speed
            servers = r * slots_per_replica
            util = lam * hold_s / servers
            ttft = wait_quantile_s(servers, lam, hold_s, q) + t_prefill
            if user_speed >= d.min_tok_s and util <= max_util and ttft <= d.max_ttft_s:
                devices = r * cm.num_devices
                usd_h = None if price is None else devices * price
                usd_mtok = None if usd_h is None else usd_h / (3600 * lam * d.output_tokens) * 1e6
                return TierPlan(
                    d.name, True, "", r, batch, speculative, devices, user_speed, ttft, util, usd_h, usd_mtok
                )
            if ttft > d.max_ttft_s and wait_quantile_s(servers, lam, hold_s, q) == 0 and util <= max_util:
                return None  # prefill alone breaks the TTFT SLO; more replicas will not help
        r += 1 if r < 64 else max(1, r // 16)  # coarser steps for huge pools keep the search fast
    return None


def _cheaper(a: TierPlan, b: TierPlan) -> bool:
    """Lower cost wins (devices when no price is known); ties go to the faster plan."""
    ka = a.usd_per_hour if a.usd_per_hour is not None else a.devices
    kb = b.usd_per_hour if b.usd_per_hour is not None else b.devices
    return (ka, -a.per_user_tok_s) < (kb, -b.per_user_tok_s)


def recommend_fleet(
    cm: CostModel,
    demands: Sequence[TierDemand],
    spec=None,
    batch_caps: Sequence[int] | None = None,
    max_utilization: float = 0.85,
    ttft_quantile: float = 0.9,
    usd_per_hour_per_device: float | None = None,
) -> FleetPlan:
    """Plan every tier independently (dedicated pools) and collect the result."""
    tiers = tuple(
        plan_tier(cm, d, spec, batch_caps, max_utilization, ttft_quantile, usd_per_hour_per_device) for d in demands
    )
    notes = (
        "each tier is a dedicated pool; step time taken at a full batch (conservative)",
        "queueing: M/M/c over batch slots (Erlang C); exponential service times",
        "prefill of one prompt alone delays that replica's decode (no overlap credit)",
    )
    return FleetPlan(tiers, ttft_quantile, max_utilization, notes)
