"""Simulating at a pace that changes over time (benchmarks/validation/pace.py)."""

from __future__ import annotations

import pytest

from benchmarks.validation.pace import PacedStepTime, simulate_at_pace
from fastmode.engine.scheduler import SchedulerConfig
from fastmode.planner.catalog import load_hardware, load_model
from fastmode.planner.cost_model import CostModel
from fastmode.sim.simulator import SimConfig, simulate
from fastmode.sim.workload import RequestSpec


@pytest.fixture(scope="module")
def h100_8b() -> CostModel:
    return CostModel(load_hardware("h100"), load_model("llama-3.1-8b"), tp=1)


def sched_config() -> SchedulerConfig:
    return SchedulerConfig(num_blocks=4000, fast_lane_max_batch=4, max_model_len=131072)


def test_speed_profile_scales_each_step_by_the_pace_where_it_starts(h100_8b):
    """One request, so every run takes the same steps: with a profile each step's time is the
    plain run's times the factor in effect where the step starts."""
    reqs = [RequestSpec("only", 0.0, 64, 40)]
    cfg = sched_config()
    plain = simulate(reqs, h100_8b, SimConfig(cfg, record_steps=True))
    assert simulate_at_pace(reqs, h100_8b, SimConfig(cfg, record_steps=True), ()).steps == plain.steps
    doubled = simulate_at_pace(reqs, h100_8b, SimConfig(cfg, record_steps=True), ((0.0, 2.0),))
    assert [s[1] for s in doubled.steps] == pytest.approx([2 * s[1] for s in plain.steps])
    assert doubled.makespan_s == pytest.approx(2 * plain.makespan_s)
    switch = plain.steps[len(plain.steps) // 2][0]  # where the plain run's middle step ends
    two = simulate_at_pace(reqs, h100_8b, SimConfig(cfg, record_steps=True), ((0.0, 1.0), (switch, 3.0)))
    assert len(two.steps) == len(plain.steps)
    for (end, dt, *_), (_, plain_dt, *_) in zip(two.steps, plain.steps):
        assert dt == pytest.approx(plain_dt * (3.0 if end - dt >= switch else 1.0))
    assert 1 < two.makespan_s / plain.makespan_s < 3
    for bad in (((1.0, 1.0),), ((0.0, 1.0), (0.0, 2.0)), ((0.0, 0.0),), ((0.0, float("inf")),)):
        with pytest.raises(ValueError, match="speed_profile"):
            PacedStepTime(h100_8b, bad)
