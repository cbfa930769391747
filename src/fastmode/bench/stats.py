"""From request records to the numbers a bench reports: per tier and all together.

Definitions (docs/bench.md has them with examples):
- TTFT   send -> first chunk carrying output text
- TPOT   (e2e - TTFT) / (output_tokens - 1): mean time per output token after the first,
         per request; requests with fewer than 2 output tokens have none
- ITL    gaps between consecutive text-bearing chunks, pooled over the tier's requests
- e2e    send -> end of the stream
- tok/s per request   1 / TPOT: the decode speed one user sees
- output tok/s        output tokens of completed requests / measured window
- goodput             completed requests that met every SLO of their tier:
                      their share of the tier's requests, and per second of window
Latency figures use completed requests only; a failed request counts in
`failed`, in `errors` (by kind: HTTP status, stream_error, timeout,
connection) and against goodput. Percentiles are numpy's linear interpolation.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastmode.bench.client import RequestRecord
from fastmode.bench.load import LevelRun
from fastmode.engine.tiers import Tier

QUANTILES = (50, 90, 99)
ALL = "*"  # SLO key that applies to every tier without its own value
SLO_METRICS = ("ttft_s", "tpot_s", "e2e_s")


def distribution(values: Iterable[float]) -> dict[str, float | None]:
    """p50/p90/p99, mean, min and max of `values`; all None when there are none."""
    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    keys = [f"p{q}" for q in QUANTILES] + ["mean", "min", "max"]
    if not x.size:
        return dict.fromkeys(keys)
    vals = [float(v) for v in np.percentile(x, QUANTILES)] + [float(x.mean()), float(x.min()), float(x.max())]
    return dict(zip(keys, vals))


def parse_slo_value(text: str | float | None) -> dict[str, float]:
    """'0.5' -> {'*': 0.5}; 'fast=0.2,standard=1' -> per tier; None/'' -> no limit."""
    if text is None or str(text).strip() == "":
        return {}
    text = str(text).strip()
    if "=" not in text:
        return {ALL: _positive(text)}
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        tier = name.strip() if name.strip() == ALL else Tier.parse(name.strip()).value
        out[tier] = _positive(value)
    return out


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"SLO value {text!r} is not a number of seconds") from None
    if not v > 0:
        raise ValueError(f"SLO values must be > 0 s, got {text!r}")
    return v


@dataclass(frozen=True)
class SLO:
    """Latency limits per tier; a tier missing from a metric's dict uses its '*' entry, else has no limit."""

    ttft_s: dict[str, float] = field(default_factory=dict)
    tpot_s: dict[str, float] = field(default_factory=dict)
    e2e_s: dict[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, ttft: str | None = None, tpot: str | None = None, e2e: str | None = None) -> SLO:
        return cls(parse_slo_value(ttft), parse_slo_value(tpot), parse_slo_value(e2e))

    def limits(self, tier: str) -> dict[str, float]:
        """The limits that apply to `tier`, by metric name."""
        out = {}
        for metric in SLO_METRICS:
            table = getattr(self, metric)
            value = table.get(tier, table.get(ALL))
            if value is not None:
                out[metric] = value
        return out

    def met(self, rec: RequestRecord) -> bool:
        """A completed request within every limit of its tier.

        A request with no TPOT (under 2 output tokens) cannot miss a TPOT limit;
        one with no text at all is held to its TTFT limit by its e2e time.
        """
        if not rec.ok:
            return False
        measured = {
            "ttft_s": rec.ttft_s if rec.ttft_s is not None else rec.e2e_s,
            "tpot_s": rec.tpot_s,
            "e2e_s": rec.e2e_s,
        }
        return all(measured[m] is None or measured[m] <= limit for m, limit in self.limits(rec.tier).items())


def summarize_records(records: Sequence[RequestRecord], window_s: float, slo: SLO, tier: str = ALL) -> dict[str, Any]:
    """The figures for one group of requests (a tier, or all of them with tier='*')."""
    done = [r for r in records if r.ok]
    good = [r for r in done if slo.met(r)]
    out_tokens = sum(r.output_tokens for r in done)
    prompt_known = [r.prompt_tokens for r in done if r.prompt_tokens is not None]
    n = len(records)
    return {
        "num_requests": n,
        "completed": len(done),
        "failed": n - len(done),
        "errors": dict(sorted(Counter(r.error_kind for r in records if not r.ok).items())),
        "ttft_s": distribution(r.ttft_s for r in done),
        "tpot_s": distribution(r.tpot_s for r in done),
        "itl_s": distribution(g for r in done for g in r.itl_s),
        "e2e_s": distribution(r.e2e_s for r in done),
        "tok_s_per_request": distribution(r.tok_s for r in done),
        "output_tokens": out_tokens,
        "output_tokens_from_usage": all(r.usage_tokens for r in done) if done else None,
        "prompt_tokens": sum(prompt_known) if prompt_known and len(prompt_known) == len(done) else None,
        "output_tok_s": out_tokens / window_s,
        "request_s": len(done) / window_s,
        "goodput": {
            "slo": slo.limits(tier) if tier != ALL else {m: getattr(slo, m) for m in SLO_METRICS if getattr(slo, m)},
            "good": len(good),
            "share": len(good) / n if n else None,
            "request_s": len(good) / window_s,
            "output_tok_s": sum(r.output_tokens for r in good) / window_s,
        },
        "served_tiers": dict(sorted(Counter(r.served_tier for r in done if r.served_tier).items())),
    }


def _tier_order(name: str) -> tuple[int, str]:
    try:
        return (Tier(name).rank, name)
    except ValueError:
        return (len(Tier), name)


def summarize_level(run: LevelRun, slo: SLO) -> dict[str, Any]:
    """One sweep level: its setup, window, per-tier figures and the aggregate."""
    by_tier: dict[str, list[RequestRecord]] = {}
    for r in run.records:
        by_tier.setdefault(r.tier, []).append(r)
    spec = run.spec
    return {
        "label": spec.label,
        "mode": spec.mode,
        "concurrency": int(spec.level) if spec.mode == "closed" else None,
        "rate_req_s": spec.level if spec.mode == "open" else None,
        "window_s": run.window_s,
        "warmup": {"requests": len(run.warmup), "failed": sum(not r.ok for r in run.warmup)},
        "tiers": {t: summarize_records(by_tier[t], run.window_s, slo, t) for t in sorted(by_tier, key=_tier_order)},
        "aggregate": summarize_records(run.records, run.window_s, slo, ALL),
        "schedule_lag_s": distribution(r.start_s - r.scheduled_s for r in run.records if r.scheduled_s is not None)
        if spec.mode == "open"
        else None,
    }


def finite(x: Any) -> Any:
    """JSON-safe: NaN/inf -> None, recursively."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x
