"""Bench statistics on hand-made records with known answers."""

from __future__ import annotations

import pytest

from fastmode.bench.client import RequestRecord
from fastmode.bench.load import LevelRun, LoadSpec
from fastmode.bench.stats import SLO, distribution, parse_slo_value, summarize_level, summarize_records


def rec(
    index: int,
    tier: str,
    ttft: float,
    gaps: list[float],
    tokens: int | None = None,
    status: int = 200,
    error_kind: str | None = None,
    start: float = 100.0,
) -> RequestRecord:
    """A request sent at `start` whose text chunks arrive at start+ttft, then after each gap; e2e ends at the last."""
    chunks = [start + ttft]
    for g in gaps:
        chunks.append(chunks[-1] + g)
    r = RequestRecord(
        index,
        tier,
        64,
        start,
        end_s=chunks[-1],
        chunk_s=chunks,
        status=status,
        output_tokens=len(chunks) if tokens is None else tokens,
        usage_tokens=tokens is not None,
    )
    if error_kind:
        r.fail(error_kind, "boom")
        r.chunk_s, r.output_tokens = [], 0
    return r


def test_distribution_percentiles():
    d = distribution(range(1, 101))
    assert d["p50"] == pytest.approx(50.5) and d["p90"] == pytest.approx(90.1) and d["p99"] == pytest.approx(99.01)
    assert d["mean"] == pytest.approx(50.5) and d["min"] == 1 and d["max"] == 100
    assert distribution([]) == dict.fromkeys(["p50", "p90", "p99", "mean", "min", "max"])
    assert distribution([None, 2.0])["p99"] == 2.0


def test_record_metrics():
    r = rec(0, "fast", 0.5, [0.1, 0.3])  # chunks at 0.5, 0.6, 0.9 -> 3 tokens
    assert r.ttft_s == pytest.approx(0.5) and r.e2e_s == pytest.approx(0.9)
    assert r.tpot_s == pytest.approx(0.2)  # (0.9 - 0.5) / (3 - 1)
    assert r.tok_s == pytest.approx(5.0)
    assert r.itl_s == pytest.approx([0.1, 0.3])
    usage = rec(1, "fast", 0.5, [0.4], tokens=5)  # 2 chunks carried 5 tokens (usage says so)
    assert usage.tpot_s == pytest.approx(0.1)
    assert rec(2, "fast", 0.5, []).tpot_s is None  # one token: no TPOT
    bad = rec(3, "fast", 0.5, [0.1], status=404, error_kind="404")
    assert not bad.ok and bad.ttft_s is None and bad.tpot_s is None


def test_slo_parsing():
    assert parse_slo_value(None) == {} and parse_slo_value("0.5") == {"*": 0.5}
    assert parse_slo_value("fast=0.2, standard=1") == {"fast": 0.2, "standard": 1.0}
    slo = SLO.parse(ttft="fast=0.2,*=1", tpot="0.05")
    assert slo.limits("fast") == {"ttft_s": 0.2, "tpot_s": 0.05}
    assert slo.limits("flex") == {"ttft_s": 1.0, "tpot_s": 0.05}
    for bad in ("0", "fast=-1", "x", "turbo=1"):
        with pytest.raises(ValueError):
            parse_slo_value(bad)


def test_goodput_errors_and_throughput():
    records = [
        rec(0, "fast", 0.1, [0.01] * 9),  # TTFT 0.1, TPOT 0.01: good
        rec(1, "fast", 0.3, [0.01] * 9),  # TTFT over fast's 0.2
        rec(2, "fast", 0.1, [0.10] * 9),  # TPOT over 0.05
        rec(3, "fast", 0.1, [], status=429, error_kind="429"),
        rec(4, "standard", 0.3, [0.02] * 9),  # standard's TTFT limit is 1 s: good
        rec(5, "standard", 0.1, [], status=None, error_kind="timeout"),
    ]
    slo = SLO.parse(ttft="fast=0.2,standard=1", tpot="0.05")
    fast = summarize_records(records[:4], window_s=2.0, slo=slo, tier="fast")
    assert (fast["num_requests"], fast["completed"], fast["failed"]) == (4, 3, 1)
    assert fast["errors"] == {"429": 1}
    assert fast["goodput"]["good"] == 1 and fast["goodput"]["share"] == 0.25
    assert fast["goodput"]["request_s"] == 0.5 and fast["goodput"]["output_tok_s"] == 5.0
    assert fast["goodput"]["slo"] == {"ttft_s": 0.2, "tpot_s": 0.05}
    assert fast["output_tokens"] == 30 and fast["output_tok_s"] == 15.0 and fast["request_s"] == 1.5
    assert fast["ttft_s"]["p50"] == pytest.approx(0.1) and fast["ttft_s"]["max"] == pytest.approx(0.3)
    assert fast["tpot_s"]["max"] == pytest.approx(0.1)
    assert fast["itl_s"]["p50"] == pytest.approx(0.01) and fast["itl_s"]["max"] == pytest.approx(0.1)
    assert fast["output_tokens_from_usage"] is False

    run = LevelRun(LoadSpec("closed", 2, num_requests=6), records, t0=100.0, t_end=104.0)
    level = summarize_level(run, slo)
    assert list(level["tiers"]) == ["fast", "standard"] and level["window_s"] == 4.0
    assert level["tiers"]["standard"]["goodput"]["good"] == 1 and level["tiers"]["standard"]["errors"] == {"timeout": 1}
    agg = level["aggregate"]
    assert agg["num_requests"] == 6 and agg["failed"] == 2 and agg["errors"] == {"429": 1, "timeout": 1}
    assert agg["goodput"]["good"] == 2 and agg["goodput"]["share"] == pytest.approx(1 / 3)
    assert agg["output_tok_s"] == pytest.approx(40 / 4.0)
    assert level["concurrency"] == 2 and level["rate_req_s"] is None and level["label"] == "c2"


def test_no_slo_means_every_completed_request_is_good():
    records = [rec(0, "flex", 5.0, [1.0] * 3), rec(1, "flex", 0.1, [], status=500, error_kind="500")]
    s = summarize_records(records, 10.0, SLO(), "flex")
    assert s["goodput"]["good"] == 1 and s["goodput"]["share"] == 0.5 and s["goodput"]["slo"] == {}


def test_load_spec_validation():
    assert LoadSpec("open", 2.5, duration_s=3).label == "r2.5"
    for kwargs in (
        {"mode": "closed", "level": 1.5, "num_requests": 1},
        {"mode": "open", "level": 0, "num_requests": 1},
        {"mode": "closed", "level": 1},
        {"mode": "loop", "level": 1, "num_requests": 1},
    ):
        with pytest.raises(ValueError):
            LoadSpec(**kwargs)
