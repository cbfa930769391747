"""Per-tier figures from a simulation (or a real replay): latency, speed, price.

Definitions (seconds, tokens; per request unless "aggregate"):
- TTFT: first output token time minus arrival time.
- TPOT: mean time between output tokens, (last - first) / (n - 1).
- per-request tok/s: 1 / TPOT, the decode speed a user sees (Anthropic's OTPS).
- $/Mtok: metered cost of the tier's requests (their share of step time, prompt
  work included) over the tier's output tokens, per million.
- aggregate throughput: all output tokens over the makespan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from fastmode.engine.metering import RequestMetrics
from fastmode.sim.simulator import SimResult

TIER_ORDER = ("fast", "standard", "flex")


@dataclass(frozen=True)
class TierSummary:
    tier: str
    num_requests: int
    output_tokens: int
    ttft_p50_s: float
    ttft_p99_s: float
    ttft_mean_s: float
    tpot_mean_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    tok_s_mean: float  # mean over requests of 1/TPOT
    tok_s_p50: float
    e2e_p50_s: float
    machine_s: float
    usd_per_mtok: float
    num_preemptions: int

    def to_dict(self) -> dict:
        return asdict(self)


def _q(x: np.ndarray, q: float) -> float:
    return float(np.quantile(x, q)) if x.size else float("nan")


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if x.size else float("nan")


def summarize_tier(tier: str, reqs: list[RequestMetrics]) -> TierSummary:
    ttft = np.array([r.ttft_s for r in reqs if r.ttft_s is not None])
    tpot = np.array([r.mean_itl_s for r in reqs if r.mean_itl_s is not None and r.mean_itl_s > 0])
    out_tok = sum(r.completion_tokens for r in reqs)
    cost = sum(r.cost_usd for r in reqs)
    return TierSummary(
        tier=tier,
        num_requests=len(reqs),
        output_tokens=out_tok,
        ttft_p50_s=_q(ttft, 0.5),
        ttft_p99_s=_q(ttft, 0.99),
        ttft_mean_s=_mean(ttft),
        tpot_mean_s=_mean(tpot),
        tpot_p50_s=_q(tpot, 0.5),
        tpot_p99_s=_q(tpot, 0.99),
        tok_s_mean=_mean(1.0 / tpot) if tpot.size else float("nan"),
        tok_s_p50=_q(1.0 / tpot, 0.5) if tpot.size else float("nan"),
        e2e_p50_s=_q(np.array([r.e2e_s for r in reqs]), 0.5),
        machine_s=sum(r.machine_s for r in reqs),
        usd_per_mtok=cost / out_tok * 1e6 if out_tok else float("nan"),
        num_preemptions=sum(r.num_preemptions for r in reqs),
    )


def summarize(requests: list[RequestMetrics]) -> dict[str, TierSummary]:
    """One summary per tier present, in tier order."""
    by_tier: dict[str, list[RequestMetrics]] = {}
    for r in requests:
        by_tier.setdefault(r.tier, []).append(r)
    return {t: summarize_tier(t, by_tier[t]) for t in TIER_ORDER if t in by_tier}


def sim_report(result: SimResult, usd_per_machine_hour: float) -> dict:
    """JSON-ready report of a run: per-tier summaries plus the aggregate."""
    out_tok = sum(r.completion_tokens for r in result.requests)
    span = result.makespan_s
    return {
        "tiers": {t: s.to_dict() for t, s in summarize(result.requests).items()},
        "aggregate": {
            "num_requests": len(result.requests),
            "output_tokens": out_tok,
            "makespan_s": span,
            "throughput_tok_s": out_tok / span if span > 0 else float("nan"),
            "utilization": result.busy_s / span if span > 0 else float("nan"),
            # Machine-hours of the whole run, idle time included, per output token.
            "usd_per_mtok_all_in": usd_per_machine_hour * span / 3600 / out_tok * 1e6 if out_tok else float("nan"),
            "num_steps": result.num_steps,
            "lane_step_share": result.num_lane_steps / result.num_steps if result.num_steps else 0.0,
            "num_preemptions": result.num_preemptions,
            "kv_blocks_free_end": result.num_free_blocks_end,
            "kv_blocks_total": result.num_blocks,
            "sim_wall_s": result.wall_s,
        },
    }


def format_report(report: dict, title: str = "") -> str:
    """A fixed-width table of the per-tier figures, then the aggregate."""
    lines = [title] if title else []
    head = f"{'tier':<9}{'reqs':>7}{'TTFT p50':>10}{'TTFT p99':>10}{'TPOT ms':>9}{'tok/s p50':>10}{'$/Mtok':>10}{'preempt':>8}"
    lines.append(head)
    for t, s in report["tiers"].items():
        lines.append(
            f"{t:<9}{s['num_requests']:>7}{s['ttft_p50_s']:>9.3f}s{s['ttft_p99_s']:>9.3f}s"
            f"{s['tpot_mean_s'] * 1e3:>9.2f}{s['tok_s_p50']:>10.1f}{s['usd_per_mtok']:>10.4f}{s['num_preemptions']:>8}"
        )
    a = report["aggregate"]
    lines.append(
        f"aggregate: {a['throughput_tok_s']:,.0f} output tok/s over {a['makespan_s']:.1f} s simulated, "
        f"utilization {a['utilization']:.0%}, {a['usd_per_mtok_all_in']:.4f} $/Mtok all-in, "
        f"{a['num_steps']:,} steps ({a['lane_step_share']:.0%} in the fast lane), "
        f"{a['num_preemptions']} preemptions; simulated in {a['sim_wall_s']:.1f} s"
    )
    return "\n".join(lines)
