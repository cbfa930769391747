"""Queueing maths and the fleet search's behaviour."""

from __future__ import annotations

import math

import pytest

from fastmode.planner.cost_model import CostModel
from fastmode.planner.fleet import TierDemand, plan_tier, recommend_fleet
from fastmode.planner.queueing import erlang_c, mean_wait_s, wait_quantile_s
from fastmode.planner.speculative import SpecConfig


def test_erlang_c_known_values():
    assert erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: P(wait) = rho
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert mean_wait_s(1, 0.5, 1.0) == pytest.approx(1.0)  # rho / (mu - lambda)
    assert mean_wait_s(4, 10.0, 1.0) == math.inf
    assert wait_quantile_s(100, 1.0, 1.0, 0.9) == 0.0  # nearly idle: no wait at p90


def test_fast_tier_gets_a_smaller_batch_cap(h100, llama8b):
    cm = CostModel(h100, llama8b)
    fleet = recommend_fleet(
        cm, [TierDemand("fast", 2, 2000, 500, min_tok_s=140), TierDemand("standard", 20, 2000, 500, max_ttft_s=2.0)]
    )
    fast, std = fleet.tiers
    assert fast.feasible and std.feasible
    assert fast.per_user_tok_s >= 140 and std.ttft_s <= 2.0
    assert fast.batch_cap < std.batch_cap
    assert fast.usd_per_mtok > std.usd_per_mtok  # the fast lane costs more per token
    assert fleet.usd_per_hour == pytest.approx(fast.usd_per_hour + std.usd_per_hour)
    assert fleet.devices == fast.devices + std.devices


def test_more_traffic_needs_more_replicas(h100, llama8b):
    cm = CostModel(h100, llama8b)
    small = plan_tier(cm, TierDemand("standard", 5, 1000, 300, max_ttft_s=2.0))
    big = plan_tier(cm, TierDemand("standard", 50, 1000, 300, max_ttft_s=2.0))
    assert big.replicas > small.replicas


def test_speculation_chosen_only_where_it_pays(h100, llama8b):
    cm = CostModel(h100, llama8b)
    spec = SpecConfig(0.8, 4, 0.05)
    fast = plan_tier(cm, TierDemand("fast", 1, 1000, 500, min_tok_s=300), spec)
    assert fast.feasible and fast.speculative  # 300 tok/s is out of reach without it
    bad = SpecConfig(0.1, 4, 0.5)  # a poor draft: speculation only adds cost
    assert not plan_tier(cm, TierDemand("standard", 20, 1000, 300), bad).speculative


def test_unreachable_slo_is_reported_not_hidden(h100, llama8b):
    tier = plan_tier(CostModel(h100, llama8b), TierDemand("fast", 1, 1000, 300, min_tok_s=10_000))
    assert not tier.feasible and "below the SLO" in tier.reason
    ttft = plan_tier(CostModel(h100, llama8b), TierDemand("fast", 1, 100_000, 300, max_ttft_s=0.01))
    assert not ttft.feasible and "TTFT" in ttft.reason


def test_no_traffic_costs_nothing(h100, llama8b):
    tier = plan_tier(CostModel(h100, llama8b), TierDemand("flex", 0, 1000, 300))
    assert tier.feasible and tier.replicas == 0
