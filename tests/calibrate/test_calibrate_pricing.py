"""Derived tier prices: the fast lane's multiplier comes from step times."""

from __future__ import annotations

import pytest

from fastmode.calibrate.pricing import format_prices, tier_prices
from fastmode.planner.catalog import load_hardware, load_model
from fastmode.planner.cost_model import CostModel


def test_fast_lane_costs_more_per_token_than_a_full_batch():
    cm = CostModel(load_hardware("h100"), load_model("llama-3.1-8b"), tp=1)
    prices = {p.tier: p for p in tier_prices(cm, 2.95, 2048, {"fast": 4, "standard": 64})}
    fast, std = prices["fast"], prices["standard"]
    assert std.multiplier == 1.0
    assert fast.per_user_tok_s > std.per_user_tok_s
    assert fast.multiplier == pytest.approx((fast.step_s / 4) / (std.step_s / 64))
    assert fast.multiplier > 3
    assert fast.usd_per_mtok == pytest.approx(2.95 / 3600 * fast.step_s / 4 * 1e6)
    assert "x std" in format_prices(list(prices.values()), 2.95)


def test_prices_need_a_standard_tier():
    cm = CostModel(load_hardware("h100"), load_model("llama-3.1-8b"), tp=1)
    with pytest.raises(ValueError, match="standard"):
        tier_prices(cm, 1.0, 128, {"fast": 4})
