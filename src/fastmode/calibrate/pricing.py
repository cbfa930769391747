"""Per-tier prices from step times: the fast lane's price multiplier, derived. No torch.

A tier that runs at batch B shares each step among B users, so one output
token costs step_s(B) / B machine-seconds:

    $/Mtok(B) = usd_per_hour / 3600 * step_s(B) / B * 1e6

The fast tier runs at `fast_lane_max_batch`, the standard tier at a full
standard batch; the ratio of the two is the fast tier's price multiplier.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fastmode.planner.cost_model import CostModel


@dataclass(frozen=True)
class TierPrice:
    tier: str
    batch: int
    context: int  # tokens in each sequence's KV cache
    step_s: float
    per_user_tok_s: float
    aggregate_tok_s: float
    usd_per_mtok: float  # output tokens
    multiplier: float  # usd_per_mtok / the standard tier's

    def to_dict(self) -> dict:
        return asdict(self)


def tier_prices(
    cost_model: CostModel, usd_per_machine_hour: float, context: int, batches: dict[str, int]
) -> list[TierPrice]:
    """Prices for each tier's batch size; `batches` must include 'standard'."""
    if "standard" not in batches:
        raise ValueError("batches needs a 'standard' entry (the price multipliers are relative to it)")
    raw = {}
    for tier, b in batches.items():
        step = cost_model.decode_step_s([context] * b)
        raw[tier] = (b, step, usd_per_machine_hour / 3600 * step / b * 1e6)
    std = raw["standard"][2]
    return [
        TierPrice(tier, b, context, step, 1 / step, b / step, usd, usd / std if std else float("nan"))
        for tier, (b, step, usd) in raw.items()
    ]


def format_prices(prices: list[TierPrice], usd_per_machine_hour: float) -> str:
    lines = [
        f"derived prices at {usd_per_machine_hour:g} $/machine-hour, context {prices[0].context} tokens:",
        f"  {'tier':<9}{'batch':>6}{'step ms':>10}{'tok/s/user':>12}{'tok/s total':>13}{'$/Mtok out':>12}{'x std':>7}",
    ]
    for p in prices:
        lines.append(
            f"  {p.tier:<9}{p.batch:>6}{p.step_s * 1e3:>10.2f}{p.per_user_tok_s:>12.1f}"
            f"{p.aggregate_tok_s:>13.1f}{p.usd_per_mtok:>12.4f}{p.multiplier:>7.2f}"
        )
    return "\n".join(lines)
