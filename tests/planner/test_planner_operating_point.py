"""Per-user, aggregate and $/Mtok follow their definitions; layouts fit their load."""

from __future__ import annotations

import pytest

from fastmode.planner.catalog import load_hardware, load_model
from fastmode.planner.cost_model import CostModel
from fastmode.planner.operating_point import bus_curve, evaluate, frontier, layout_for_load, power_of_two_batches


def test_definitions(h100, llama8b):
    p = evaluate(CostModel(h100, llama8b), 16, 2048)
    assert p.per_user_tok_s == pytest.approx(1 / p.step_time_s)
    assert p.aggregate_tok_s == pytest.approx(16 * p.per_user_tok_s)
    assert p.usd_per_mtok == pytest.approx(h100.usd_per_hour / (3600 * p.aggregate_tok_s) * 1e6)
    assert p.fits and p.bound == "memory" and not p.price_is_estimate


def test_price_override_and_missing_price(h100, llama8b):
    p = evaluate(CostModel(h100, llama8b), 4, 1024, usd_per_hour_per_device=10.0)
    assert p.usd_per_hour == 10.0
    import dataclasses

    free = evaluate(CostModel(dataclasses.replace(h100, usd_per_hour=None), llama8b), 4, 1024)
    assert free.usd_per_mtok is None


def test_sram_aggregate_counts_microbatches():
    cm = CostModel(load_hardware("wse-3"), load_model("llama-3.1-405b"))
    p = evaluate(cm, 2, 1024)
    assert p.microbatches == cm.pipeline_stages > 1
    assert p.aggregate_tok_s == pytest.approx(2 * p.microbatches * p.per_user_tok_s)


def test_bus_curve_drops_batches_that_do_not_fit(h100, llama8b):
    cm = CostModel(h100, llama8b, tp=1)
    points = bus_curve(cm, power_of_two_batches(1024), 32768)
    assert points and all(p.fits for p in points) and points[-1].batch < 1024
    assert len(bus_curve(cm, power_of_two_batches(1024), 32768, only_fitting=False)) == 11


def test_layout_for_load_picks_fewest_devices(h100):
    m = load_model("llama-3.1-70b")
    assert layout_for_load(h100, m, 1, 1024).num_devices == 2
    assert layout_for_load(h100, m, 64, 32768).num_devices == 16
    assert layout_for_load(h100, m, 1, 1024, tp=8).num_devices == 8
    assert layout_for_load(load_hardware("local"), m, 1, 1024).num_devices == 1  # CPUs stay single


def test_frontier_is_a_speed_price_trade(h100):
    pts = frontier(h100, load_model("llama-3.1-70b"), power_of_two_batches(128), 4096)
    assert len(pts) >= 3
    speeds, prices = [p.per_user_tok_s for p in pts], [p.usd_per_mtok for p in pts]
    assert all(a > b for a, b in zip(speeds, speeds[1:]))  # fastest first...
    assert all(a > b for a, b in zip(prices, prices[1:]))  # ...and every slower point is cheaper
    assert pts[0].devices == 8 and pts[0].batch == 1  # the fastest lane: one user on a full node


def test_power_of_two_batches():
    assert power_of_two_batches(1) == [1]
    assert power_of_two_batches(20) == [1, 2, 4, 8, 16, 20]
